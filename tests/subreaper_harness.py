"""Plays a subreaper (systemd --user, tini, a container's init): starts a launcher and
SIGKILLs it while its ranks are still starting, before they could ask to die with it.
The orphans are re-parented to this process, not to init; they must exit on their own.
Prints one JSON object: how many children the launcher had, how many outlived it."""
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def children(pid):
    kids = set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.update(int(k) for k in f.read().split())
    except OSError:
        pass
    return kids


def main():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(json.dumps({"skip": "cannot become a subreaper"}))
        return
    launcher = subprocess.Popen([sys.executable, "launcher_victim.py"], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(children(launcher.pid)) < 3 and time.monotonic() < deadline:   # 2 ranks + tracker
        time.sleep(0.001)
    orphans = children(launcher.pid)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 30
    alive = set(orphans)
    while alive and time.monotonic() < deadline:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        alive = children(os.getpid()) & orphans
        time.sleep(0.05)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    print(json.dumps({"orphans": len(orphans), "survivors": len(alive)}))


if __name__ == "__main__":
    main()
