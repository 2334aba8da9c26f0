"""`shmcoll run`: start N processes of a program as the ranks of one job, as mpirun or
torchrun would.

    shmcoll run -np 4 train.py --epochs 3          # a Python script
    shmcoll run -np 4 -m mypackage.train           # a module
    shmcoll run -np 2 --tag-output ./a.out         # any executable

Each rank gets SHMCOLL_RANK, SHMCOLL_WORLD_SIZE, SHMCOLL_JOB and SHMCOLL_JOB_INSTANCE
(so shmcoll.init() joins without arguments), the conventional RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (so torch scripts run under
it: dist.init_process_group("shmcoll") reads them), and its share of the CPUs for
BLAS/OpenMP thread pools (launch.thread_environment; --threads sets it).  The ranks'
standard input is /dev/null.

The first rank to fail (a non-zero status, a signal) ends the job: the others get
SIGTERM, then SIGKILL after a grace period, and the command exits with that rank's
status (128 + the signal's number for a signal), naming it.  SIGINT and SIGTERM sent
to the command are passed on to every rank (a second one kills them); --timeout ends
the job after so many seconds with status 124.  The ranks die with the command (Linux's
parent-death signal), and shared-memory entries of ranks that died while joining
are removed on the way out.
"""
import argparse
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid

HELP = "start N ranks of a program (script, -m module, executable), as mpirun/torchrun"

_GRACE_S = 3.0
EXIT_TIMEOUT = 124


def _parser():
    p = argparse.ArgumentParser(
        prog="shmcoll run", description=__doc__.split("\n\n")[0],
        usage="shmcoll run -np N [--bind core|llc|numa] [--threads K] [--tag-output] "
              "[--timeout S] [--job NAME] (PROGRAM | -m MODULE) [ARGS...]")
    p.add_argument("-np", "-n", dest="nprocs", type=int, required=True,
                   help="number of ranks")
    p.add_argument("--bind", choices=["core", "llc", "numa"],
                   help="pin rank r to its CPUs in topology order (launch(bind=) does too)")
    p.add_argument("--threads", type=int,
                   help="each rank's OMP/OPENBLAS/MKL_NUM_THREADS (default: CPUs // N "
                        "unless set)")
    p.add_argument("--tag-output", action="store_true",
                   help="prefix every line of output with [rank]")
    p.add_argument("--timeout", type=float, help="end the job after this many seconds")
    p.add_argument("--job", help="the job's name (default: unique to this run)")
    return p


def split_argv(argv):
    """(the launcher's options, the program's command line): the program starts at the
    first word that is not an option or an option's value, or at -m MODULE."""
    takes_value = {"-np", "-n", "--bind", "--threads", "--timeout", "--job"}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "-m":
            return argv[:i], argv[i:]
        if word == "--":
            return argv[:i], argv[i + 1:]
        if not word.startswith("-"):
            break
        i += 2 if word in takes_value else 1
    return argv[:i], argv[i:]


def program_command(words):
    """The command line of a rank: Python for a script or a module, else the program."""
    if not words:
        raise SystemExit("shmcoll run: no program given (a script, -m MODULE or an "
                         "executable)")
    if words[0] == "-m":
        if len(words) < 2:
            raise SystemExit("shmcoll run: -m needs a module name")
        return [sys.executable] + words
    program = words[0]
    if program.endswith(".py"):
        if not os.path.isfile(program):
            raise SystemExit(f"shmcoll run: {program}: no such file")
        return [sys.executable] + words
    found = shutil.which(program)
    if found is None:
        raise SystemExit(f"shmcoll run: {program}: not found (neither a .py script nor an "
                         f"executable on PATH)")
    return [found] + words[1:]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_environments(nprocs, job, instance, threads=None, tag_output=False):
    """The environment of each rank."""
    from shmcoll.launch import thread_environment
    base = dict(os.environ, **thread_environment(nprocs, threads))
    base.update(SHMCOLL_WORLD_SIZE=str(nprocs), SHMCOLL_JOB=job,
                SHMCOLL_JOB_INSTANCE=instance, WORLD_SIZE=str(nprocs),
                LOCAL_WORLD_SIZE=str(nprocs), MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(_free_port()))
    if tag_output:
        base["PYTHONUNBUFFERED"] = "1"      # lines as they are written, not at exit
    return [dict(base, SHMCOLL_RANK=str(r), RANK=str(r), LOCAL_RANK=str(r))
            for r in range(nprocs)]


def _child_setup(cpus):
    """In the child before exec: its own process group (a terminal's Ctrl-C reaches the
    command, which passes it on once), death with the command, its CPUs."""
    def setup():
        os.setpgid(0, 0)
        try:
            import ctypes
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)      # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
    return setup


def describe(status):
    """A rank's return code in words, and the command's exit status for it."""
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"was killed by {name}", 128 - status
    return f"exited with status {status}", status


class _Tagger:
    """Copies the ranks' pipes to this process's stdout/stderr, each line prefixed."""

    def __init__(self, selector):
        self.selector, self.partial = selector, {}

    def watch(self, rank, pipe, out):
        os.set_blocking(pipe.fileno(), False)
        self.selector.register(pipe, selectors.EVENT_READ, ("pipe", rank, out))
        self.partial[pipe] = b""

    def read(self, pipe, rank, out):
        try:
            data = os.read(pipe.fileno(), 65536)
        except BlockingIOError:
            return
        text = self.partial[pipe] + data
        lines = text.split(b"\n")
        self.partial[pipe] = lines.pop() if data else b""
        if not data and lines and lines[-1] == b"":
            lines.pop()
        for line in lines:
            out.buffer.write(b"[%d] " % rank + line + b"\n")
        out.flush()
        if not data:
            self.selector.unregister(pipe)
            pipe.close()


class Job:
    """The ranks of one run: started at once, watched through pidfds (exits) and, with
    --tag-output, their pipes; signalled by process group."""

    def __init__(self, commands, envs, places, tag_output):
        self.selector = selectors.DefaultSelector()
        self.tagger = _Tagger(self.selector) if tag_output else None
        self.procs, self.pidfds, self.ended = [], {}, []
        self.signalled = None
        pipe = subprocess.PIPE if tag_output else None
        for rank, (cmd, env) in enumerate(zip(commands, envs)):
            p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=pipe,
                                 stderr=pipe, preexec_fn=_child_setup(places[rank]))
            self.procs.append(p)
            if tag_output:
                self.tagger.watch(rank, p.stdout, sys.stdout)
                self.tagger.watch(rank, p.stderr, sys.stderr)
            if hasattr(os, "pidfd_open"):
                try:
                    fd = os.pidfd_open(p.pid)
                except OSError:
                    continue
                self.pidfds[rank] = fd
                self.selector.register(fd, selectors.EVENT_READ, ("exit", rank, None))

    def signal_all(self, signum):
        for p in self.procs:
            if p.returncode is None:
                try:
                    os.killpg(p.pid, signum)
                except (ProcessLookupError, PermissionError):
                    pass

    def _poll_once(self, timeout):
        """Wait up to `timeout` for output or an exit; copy output; note the ranks that
        ended, in the order they were seen to."""
        for key, _ in self.selector.select(timeout):
            kind, rank, out = key.data
            if kind == "pipe":
                self.tagger.read(key.fileobj, rank, out)
            else:
                self.selector.unregister(key.fileobj)
                os.close(key.fileobj)
                self._reap(rank)
        for rank in range(len(self.procs)):
            self._reap(rank)

    def _reap(self, rank):
        p = self.procs[rank]
        if p.returncode is None and p.poll() is not None:
            self.ended.append(rank)

    def run(self, deadline):
        """Wait for every rank; returns (exit status, message or None)."""
        first, stop_at, timed_out, all_ended = None, None, False, None
        while True:
            now = time.monotonic()
            if all(p.returncode is not None for p in self.procs):
                all_ended = all_ended or now
                # (output still buffered is copied; a pipe kept open by a process the
                # rank left behind is not waited for long)
                if not self._pipes_open() or now - all_ended > 1.0:
                    break
            if deadline is not None and now >= deadline and not timed_out:
                timed_out, stop_at = True, now + _GRACE_S
                self.signal_all(signal.SIGTERM)
            if stop_at is not None and now >= stop_at:
                self.signal_all(signal.SIGKILL)
                stop_at = float("inf")
            self._poll_once(0.5 if self.pidfds else 0.05)
            if first is None:
                failed = [r for r in self.ended if self.procs[r].returncode != 0]
                if failed:
                    first = (failed[0], self.procs[failed[0]].returncode)
                    if self.signalled is None and not timed_out:
                        self.signal_all(signal.SIGTERM)
                        stop_at = time.monotonic() + _GRACE_S
            if self.signalled is not None and stop_at is None:
                stop_at = time.monotonic() + _GRACE_S
        return self._outcome(first, timed_out)

    def _pipes_open(self):
        return self.tagger is not None and bool(self.tagger.partial) and any(
            not pipe.closed for pipe in self.tagger.partial)

    def _outcome(self, first, timed_out):
        if timed_out:
            return EXIT_TIMEOUT, "the job timed out; its ranks were stopped"
        if self.signalled is not None:
            name = signal.Signals(self.signalled).name
            return 128 + self.signalled, f"{name} passed on to every rank"
        if first is None:
            return 0, None
        rank, status = first
        words, code = describe(status)
        return code, f"rank {rank} {words}; the other ranks were stopped"


def main(argv):
    own, program = split_argv(list(argv))
    opts = _parser().parse_args(own)
    if opts.nprocs < 1:
        raise SystemExit(f"shmcoll run: -np must be >= 1, got {opts.nprocs}")
    command = program_command(program)
    places = [None] * opts.nprocs
    if opts.bind is not None:
        from shmcoll._core import topology
        places = topology.placement(topology.discover(), opts.nprocs, opts.bind)
    instance = uuid.uuid4().hex
    job = opts.job or f"run-{instance[:12]}"
    envs = rank_environments(opts.nprocs, job, instance, opts.threads, opts.tag_output)
    deadline = None if opts.timeout is None else time.monotonic() + opts.timeout
    job_run = None

    def forward(signum, frame):
        if job_run is None:
            raise KeyboardInterrupt
        if job_run.signalled is not None:
            job_run.signal_all(signal.SIGKILL)      # a second one: no more waiting
        job_run.signalled = signum
        job_run.signal_all(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        job_run = Job([command] * opts.nprocs, envs, places, opts.tag_output)
        status, message = job_run.run(deadline)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if job_run is not None:
            job_run.signal_all(signal.SIGKILL)
            for p in job_run.procs:
                p.wait()
        _remove_leftovers(job, instance)
    if message:
        print(f"shmcoll run: {message}", file=sys.stderr)
    return status


def _remove_leftovers(job, instance):
    """The job's shared-memory entry when a rank died before every rank joined, and
    any other entry whose job has no live process left."""
    from shmcoll._core import segment
    name, _ = segment.job_identity(job, instance)
    segment.unlink(name)
    for stale in segment.stale_entries():
        segment.remove_stale(stale)
