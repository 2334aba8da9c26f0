"""Tensors a shmcoll group does not move itself: those on other devices (CUDA...).

torch gives a Python process group every tensor, whatever backends the init string
named ("cpu:shmcoll,cuda:nccl"), and stops creating backends at the first Python
group.  So the group creates the backend named for a device itself, at the first
tensor on that device (every rank reaches that call together, as collectives are
called in one order), from the same store, rank, size and timeout, and hands it
those tensors.  A device the init string did not name is refused, naming the fix.
"""
import torch.distributed as dist

def named_backends(config):
    """{device type: backend name} of an init string ("cpu:shmcoll,cuda:nccl"); a
    single name ("shmcoll") names none for other devices."""
    named = {}
    for part in str(config).split(","):
        device, sep, backend = part.strip().partition(":")
        if sep:
            named[device.strip()] = backend.strip().lower()
    return named


def _construct(name, store, rank, size, timeout):
    if name == "nccl":
        from torch.distributed import ProcessGroupNCCL
        opts = ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return ProcessGroupNCCL(store, rank, size, opts)
    if name == "gloo":
        from torch.distributed import ProcessGroupGloo
        return ProcessGroupGloo(store, rank, size, timeout)
    plugin = dist.Backend._plugins.get(name.upper())
    if plugin is not None and not plugin.extended_api:
        return plugin.creator_fn(store, rank, size, timeout)
    raise RuntimeError(f"shmcoll backend: cannot create the backend {name!r}")


def backend_for(group, device, what, construct=None):
    """The backend the init string of `group` names for `device` (created now), or a
    RuntimeError naming the call `what` and how to name one."""
    try:
        config = dist.get_backend_config(group)
    except (RuntimeError, ValueError, KeyError):     # a group torch does not know
        config = ""
    name = named_backends(config).get(device.type)
    if name is None or name == "shmcoll":
        raise RuntimeError(
            f"shmcoll backend: {what} got a tensor on {device}; shmcoll moves CPU tensors. "
            f"Name a backend for {device.type} tensors when creating the group, e.g. "
            f"init_process_group('cpu:shmcoll,{device.type}:nccl')")
    store = dist.PrefixStore(f"{device.type}/", group._store)
    return (construct or _construct)(name, store, group.rank(), group.size(), group._timeout)
