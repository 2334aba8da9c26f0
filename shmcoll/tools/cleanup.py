"""`shmcoll cleanup`: removes this user's /dev/shm entries of jobs with no live process (a job unlinks
    its entry once every rank attached, so only jobs that died before that leave one)."""
import argparse

from shmcoll._core import segment

HELP = "remove shared-memory entries left by dead jobs of this user"


def main(argv):
    p = argparse.ArgumentParser(prog="shmcoll cleanup", description=__doc__)
    p.add_argument("-n", "--dry-run", action="store_true", help="list, do not remove")
    opts = p.parse_args(argv)
    stale = segment.stale_entries()
    for name in stale:
        if not opts.dry_run and not segment.remove_stale(name):
            continue
        print(f"{'stale' if opts.dry_run else 'removed'} /dev/shm{name}")
    print(f"# {len(stale)} stale entr{'y' if len(stale) == 1 else 'ies'}"
          f"{' (dry run)' if opts.dry_run else ' removed'}; live jobs untouched")
    return 0
