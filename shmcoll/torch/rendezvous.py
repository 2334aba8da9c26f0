"""Forming a shmcoll communicator from torch's store: the store torch gives a backend
(already prefixed for its group) carries the job's name from rank 0 to the others,
and every rank's host, so that a group spanning machines is refused on every rank
instead of waiting for a segment that cannot appear."""
import datetime
import socket
import uuid

from shmcoll import communicator

_JOB_KEY = "shmcoll/job"
_HOST_KEY = "shmcoll/host/{}"


def seconds(timeout):
    """torch's timeout (a timedelta; None or zero: none) in seconds for shmcoll."""
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    return float("inf") if timeout <= 0 else float(timeout)


def _hosts(store, size):
    keys = [_HOST_KEY.format(r) for r in range(size)]
    if hasattr(store, "multi_get"):     # one round trip instead of `size`
        return [v.decode() for v in store.multi_get(keys)]
    return [store.get(k).decode() for k in keys]


def _refuse_other_hosts(store, rank, size):
    host = socket.gethostname()
    store.set(_HOST_KEY.format(rank), host)
    hosts = _hosts(store, size)
    others = sorted({h for h in hosts if h != host})
    if others:
        ranks = [r for r, h in enumerate(hosts) if h != host]
        raise RuntimeError(
            f"the shmcoll backend joins processes of one machine over shared memory, "
            f"but this group spans hosts {sorted(set(hosts))} (ranks {ranks} are not on "
            f"{host}); use 'gloo' across machines (or 'cpu:shmcoll' in a group of each "
            f"machine's ranks)")


def join(store, rank, size, timeout):
    """The communicator of this group: rank 0 names a new job (unique, so no join
    grace is needed) and publishes the name; every rank joins it."""
    _refuse_other_hosts(store, rank, size)
    if rank == 0:
        instance = uuid.uuid4().hex
        store.set(_JOB_KEY, instance)
    else:
        instance = store.get(_JOB_KEY).decode()
    return communicator.join(rank, size, "torch.distributed", instance, seconds(timeout))
