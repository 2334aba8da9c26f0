"""ProcessGroupShmcoll: torch.distributed's ProcessGroup over a shmcoll Communicator.

Each torch call becomes one shmcoll collective on numpy views of the tensors' own
memory (no copy for contiguous tensors); a call with ``async_op`` (and every call
from C++, as DDP's gradient buckets) runs as a shmcoll nonblocking call and returns a
shmcoll.torch.work.TorchWork.  Where torch's layout is not the engine's (a list of
tensors, a non-contiguous tensor) the data goes through one contiguous buffer and
is copied once into place when the call completes.

torch call                       shmcoll
-------------------------------  -------------------------------------------------
all_reduce / reduce / broadcast  allreduce / reduce / broadcast
all_gather(_into_tensor)         allgather
reduce_scatter(_tensor)          reduce_scatter
gather / scatter / barrier       gather / scatter / barrier
all_to_all_single                alltoall (even split), alltoallv (split sizes)
all_to_all (lists)               alltoallv over the tensors packed end to end
send / recv (isend, irecv)       send / recv, nonblocking (batch_isend_irecv: the
                                 messages' progress thread runs them together)
coalesced variants               one call per dtype (allreduce), else one per tensor

Reduce ops: SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR, AVG (the sum divided by the
group's size; floor division on integers) and PREMUL_SUM (each input scaled by its
factor first).  On bool tensors SUM is a logical or and PRODUCT a logical and, as in
NCCL.  recv from any source and monitored_barrier are refused with a RuntimeError
naming the call.
A call's ``timeout`` option is not used: the group's timeout (init_process_group's)
bounds every wait.
"""
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (AllgatherOptions, AllreduceCoalescedOptions,
                                        AllreduceOptions, AllToAllOptions, BarrierOptions,
                                        BroadcastOptions, GatherOptions, ReduceOptions,
                                        ReduceScatterOptions, ScatterOptions)

from shmcoll import arrays
from shmcoll.torch import devices, rendezvous
from shmcoll.torch.work import Completions, TorchWork

BACKEND = "shmcoll"

_RED = dist.ReduceOp.RedOpType
_OPS = {_RED.SUM: "sum", _RED.PRODUCT: "prod", _RED.MIN: "min", _RED.MAX: "max",
        _RED.BAND: "band", _RED.BOR: "bor", _RED.BXOR: "bxor", _RED.AVG: "avg",
        _RED.PREMUL_SUM: "sum"}
_BOOL_OPS = {"sum": "bor", "prod": "band"}      # NCCL's meaning on bool
# The same by the enum's value: hashing or comparing the enum itself goes through
# pybind11 (0.6 and 0.4 us a call, where the whole blocking call is a few).
_OPS_BY_VALUE = {kind.value: op for kind, op in _OPS.items()}
_PREMUL_SUM = _RED.PREMUL_SUM.value


def register():
    """Make "shmcoll" a torch.distributed backend for CPU tensors (idempotent)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])


def _create(store, rank, size, timeout):
    """torch's backend constructor: called on every rank of a new group."""
    return ProcessGroupShmcoll(store, rank, size, timeout)


_BFLOAT16 = torch.bfloat16


def _np(t):
    """A tensor's memory as the numpy array the engine takes: its numpy() view where
    it has one (the per-call cost of small messages), else shmcoll.arrays' (bfloat16,
    autograd, conjugate bits)."""
    if t.dtype is not _BFLOAT16:
        try:
            return t.numpy()
        except (RuntimeError, TypeError):
            pass
    return arrays.as_numpy(t)


def _dense(t):
    """(t's memory if contiguous, else a contiguous copy; whether it is a copy)."""
    if t.is_contiguous():
        return t, False
    return t.contiguous(), True


class ProcessGroupShmcoll(dist.ProcessGroup):
    """A torch.distributed process group of CPU tensors over one shmcoll Communicator
    (shmcoll.torch: how to create one; this module's doc: what each call does)."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._rank, self._size = rank, size     # (asking the C++ side costs a call)
        self._store, self._timeout = store, timeout
        self.comm = rendezvous.join(store, rank, size, timeout)
        # the futures of collectives [0] and of sends and receives [1], set apart
        self._completions = tuple(Completions(f"rank {rank} of {size}, {kind}")
                                  for kind in ("collectives", "messages"))
        self._others = {}           # device type -> the backend its tensors go to
        self._coalesced = None      # TorchWorks issued between _start/_end_coalescing

    # -- names torch asks for ------------------------------------------------
    def getBackendName(self):
        return BACKEND

    def name(self):
        return BACKEND

    # torch keeps a group's name and description in its C++ backends, which this
    # group has none of: they are kept here.
    def _set_group_name(self, name):
        self._group_name = name

    @property
    def group_name(self):
        return getattr(self, "_group_name", None)

    def _set_group_desc(self, desc):
        self._group_desc = desc

    @property
    def group_desc(self):
        return getattr(self, "_group_desc", None)

    # -- helpers -------------------------------------------------------------
    def _issue(self, name, opts, outputs, start, finish=None):
        """Run `start(async_op)` (the shmcoll calls; a list of Works when async) and
        then `finish`: blocking when torch asked for a blocking call, else as a
        nonblocking one whose TorchWork completes it."""
        if getattr(opts, "asyncOp", True):
            work = TorchWork(self, name, outputs, start(True), finish)
        else:
            start(False)
            work = TorchWork(self, name, outputs, (), finish)
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    def _one(self, name, tensors):
        if len(tensors) != 1:
            raise RuntimeError(f"shmcoll backend: {name} takes one tensor per process, "
                               f"got {len(tensors)}")
        return tensors[0]

    def _elsewhere(self, name, t):
        """The backend serving t's device when t is not a CPU tensor, else None."""
        if t.is_cpu:    # (t.device.type builds a device: 0.3 us)
            return None
        backend = self._others.get(t.device.type)
        if backend is None:
            backend = devices.backend_for(self, t.device, name)
            self._others[t.device.type] = backend
        return backend

    def _same(self, name, tensors, like):
        for t in tensors:
            if t.dtype != like.dtype or t.shape != like.shape:
                raise RuntimeError(
                    f"shmcoll backend: {name} needs tensors of one dtype and shape: got "
                    f"{t.dtype} {tuple(t.shape)} beside {like.dtype} {tuple(like.shape)}")
            if t.device != like.device:
                raise RuntimeError(f"shmcoll backend: {name} needs tensors on one device: "
                                   f"got {t.device} beside {like.device}")

    def _op(self, name, reduce_op, dtype):
        """(shmcoll op name, factor or None) for torch's ReduceOp on `dtype`."""
        kind = getattr(getattr(reduce_op, "op", reduce_op), "value", None)
        op = _OPS_BY_VALUE.get(kind)
        if op is None:
            raise RuntimeError(f"shmcoll backend: {name} does not support {reduce_op}")
        if dtype is torch.bool:
            op = _BOOL_OPS.get(op, op)
        factor = getattr(reduce_op, "factor", None) if kind == _PREMUL_SUM else None
        return op, factor

    # -- collectives ---------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        opts = AllreduceOptions() if opts is None else opts
        t = self._one("all_reduce", tensors)
        other = self._elsewhere("all_reduce", t)
        if other is not None:
            return other.allreduce(tensors, opts)
        op, factor = self._op("all_reduce", opts.reduceOp, t.dtype)
        dst, copied = _dense(t)
        out = _np(dst)
        x = out if factor is None else _np((t * factor).contiguous())

        def start(async_op):
            return [self.comm.allreduce(x, out=out, op=op, async_op=async_op)]
        return self._issue("all_reduce", opts, tensors, start,
                           (lambda: t.copy_(dst)) if copied else None)

    def allreduce_coalesced(self, tensors, opts=None):
        """One allreduce per dtype over the tensors packed end to end."""
        opts = AllreduceCoalescedOptions() if opts is None else opts
        if not tensors:
            return TorchWork(self, "all_reduce_coalesced", tensors)
        if any(t.device.type != "cpu" for t in tensors):
            return self._elsewhere("all_reduce_coalesced", tensors[0]).allreduce_coalesced(
                tensors, opts)
        groups = {}
        for t in tensors:
            groups.setdefault(t.dtype, []).append(t)
        packs = []
        for dtype, group in groups.items():
            op, factor = self._op("all_reduce_coalesced", opts.reduceOp, dtype)
            flat = torch.cat([g.reshape(-1) for g in group])
            if factor is not None:
                flat.mul_(factor)
            packs.append((group, flat, op))

        def start(async_op):
            return [self.comm.allreduce(_np(flat), out=_np(flat), op=op, async_op=async_op)
                    for _, flat, op in packs]

        def finish():
            for group, flat, _ in packs:
                at = 0
                for g in group:
                    g.copy_(flat[at:at + g.numel()].view(g.shape))
                    at += g.numel()
        return self._issue("all_reduce_coalesced", opts, tensors, start, finish)

    def broadcast(self, tensors, opts=None):
        opts = BroadcastOptions() if opts is None else opts
        t = self._one("broadcast", tensors)
        other = self._elsewhere("broadcast", t)
        if other is not None:
            return other.broadcast(tensors, opts)
        root = opts.rootRank
        buf, copied = _dense(t)
        x = _np(buf)

        def start(async_op):
            return [self.comm.broadcast(x, root=root, async_op=async_op)]
        return self._issue("broadcast", opts, tensors, start,
                           (lambda: t.copy_(buf)) if copied else None)

    def reduce(self, tensors, opts=None):
        opts = ReduceOptions() if opts is None else opts
        t = self._one("reduce", tensors)
        other = self._elsewhere("reduce", t)
        if other is not None:
            return other.reduce(tensors, opts)
        op, factor = self._op("reduce", opts.reduceOp, t.dtype)
        root = opts.rootRank
        dst, copied = _dense(t)
        src = dst if factor is None else (t * factor).contiguous()
        x = _np(src)
        out = _np(dst) if self._rank == root else None

        def start(async_op):
            return [self.comm.reduce(x, out=out, op=op, root=root, async_op=async_op)]
        finish = (lambda: t.copy_(dst)) if copied and out is not None else None
        return self._issue("reduce", opts, tensors, start, finish)

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = AllgatherOptions() if opts is None else opts
        t = self._one("all_gather", input_tensors)
        outs = self._one("all_gather", output_tensors)
        other = self._elsewhere("all_gather", t)
        if other is not None:
            return other.allgather(output_tensors, input_tensors, opts)
        self._check_count("all_gather", outs)
        self._same("all_gather", outs, t)
        src = t.contiguous()
        stacked = torch.empty((self._size,) + tuple(t.shape), dtype=t.dtype)
        x, out = _np(src), _np(stacked)

        def start(async_op):
            return [self.comm.allgather(x, out=out, async_op=async_op)]

        def finish():
            for r, o in enumerate(outs):
                o.copy_(stacked[r])
        return self._issue("all_gather", opts, output_tensors, start, finish)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        opts = AllgatherOptions() if opts is None else opts
        works = [self.allgather([outs], [t], _async(AllgatherOptions))
                 for outs, t in zip(output_lists, input_tensors)]
        return self._joined("all_gather_coalesced", opts, output_lists, works)

    def all_gather_single(self, output, input, opts=None):
        """all_gather_into_tensor: `output` holds size() copies of input's numel, in rank
        order (stacked or concatenated: the same memory)."""
        opts = AllgatherOptions() if opts is None else opts
        other = self._elsewhere("all_gather_into_tensor", input)
        if other is not None:
            return other._allgather_base(output, input, opts)
        if output.numel() != self._size * input.numel() or output.dtype != input.dtype:
            raise RuntimeError(
                f"shmcoll backend: all_gather_into_tensor needs an output of {self._size} x "
                f"{input.numel()} elements of {input.dtype}, got {output.numel()} of "
                f"{output.dtype}")
        dst, copied = _dense(output)
        x = _np(input.contiguous().reshape(-1))
        out = _np(dst.view(self._size, -1))

        def start(async_op):
            return [self.comm.allgather(x, out=out, async_op=async_op)]
        return self._issue("all_gather_into_tensor", opts, [output], start,
                           (lambda: output.copy_(dst)) if copied else None)

    _allgather_base = all_gather_single        # (its name before torch 2.13)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        opts = AllgatherOptions() if opts is None else opts
        works = [self.all_gather_single(o, i, _async(AllgatherOptions))
                 for o, i in zip(outputs, inputs)]
        return self._joined("all_gather_into_tensor_coalesced", opts, outputs, works)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        opts = ReduceScatterOptions() if opts is None else opts
        out_t = self._one("reduce_scatter", output_tensors)
        ins = self._one("reduce_scatter", input_lists)
        other = self._elsewhere("reduce_scatter", out_t)
        if other is not None:
            return other.reduce_scatter(output_tensors, input_lists, opts)
        self._check_count("reduce_scatter", ins)
        self._same("reduce_scatter", ins, out_t)
        op, factor = self._op("reduce_scatter", opts.reduceOp, out_t.dtype)
        stacked = torch.stack([i.reshape(-1) for i in ins])
        if factor is not None:
            stacked.mul_(factor)
        return self._reduce_scatter("reduce_scatter", opts, out_t, stacked, op)

    def reduce_scatter_single(self, output, input, opts=None):
        """reduce_scatter_tensor: rank r gets the reduction of block r of `input`
        (size() blocks of output's numel, in rank order)."""
        opts = ReduceScatterOptions() if opts is None else opts
        other = self._elsewhere("reduce_scatter_tensor", input)
        if other is not None:
            return other._reduce_scatter_base(output, input, opts)
        if input.numel() != self._size * output.numel() or output.dtype != input.dtype:
            raise RuntimeError(
                f"shmcoll backend: reduce_scatter_tensor needs an input of {self._size} x "
                f"{output.numel()} elements of {output.dtype}, got {input.numel()} of "
                f"{input.dtype}")
        op, factor = self._op("reduce_scatter_tensor", opts.reduceOp, input.dtype)
        blocks = input.contiguous().view(self._size, -1)
        if factor is not None:
            blocks = blocks * factor
        return self._reduce_scatter("reduce_scatter_tensor", opts, output, blocks, op)

    _reduce_scatter_base = reduce_scatter_single   # (its name before torch 2.13)

    def _reduce_scatter(self, name, opts, output, blocks, op):
        dst, copied = _dense(output)
        x, out = _np(blocks), _np(dst.view(1, -1))

        def start(async_op):
            return [self.comm.reduce_scatter(x, out=out, op=op, async_op=async_op)]
        return self._issue(name, opts, [output], start,
                           (lambda: output.copy_(dst)) if copied else None)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = ReduceScatterOptions() if opts is None else opts
        each = ReduceScatterOptions()
        each.reduceOp, each.asyncOp = opts.reduceOp, True
        works = [self.reduce_scatter_single(o, i, each) for o, i in zip(outputs, inputs)]
        return self._joined("reduce_scatter_tensor_coalesced", opts, outputs, works)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def gather(self, output_lists, input_tensors, opts=None):
        opts = GatherOptions() if opts is None else opts
        t = self._one("gather", input_tensors)
        other = self._elsewhere("gather", t)
        if other is not None:
            return other.gather(output_lists, input_tensors, opts)
        root = opts.rootRank
        outs = None
        if self._rank == root:
            outs = self._one("gather", output_lists)
            self._check_count("gather", outs)
            self._same("gather", outs, t)
        elif output_lists and any(output_lists):
            raise RuntimeError("shmcoll backend: gather takes output tensors only on the root")
        x = _np(t.contiguous())
        stacked = torch.empty((self._size,) + tuple(t.shape), dtype=t.dtype) \
            if outs is not None else None
        out = None if stacked is None else _np(stacked)

        def start(async_op):
            return [self.comm.gather(x, out=out, root=root, async_op=async_op)]

        def finish():
            for r, o in enumerate(outs):
                o.copy_(stacked[r])
        return self._issue("gather", opts, output_lists, start,
                           finish if outs is not None else None)

    def scatter(self, output_tensors, input_lists, opts=None):
        opts = ScatterOptions() if opts is None else opts
        out_t = self._one("scatter", output_tensors)
        other = self._elsewhere("scatter", out_t)
        if other is not None:
            return other.scatter(output_tensors, input_lists, opts)
        root = opts.rootRank
        x = None
        if self._rank == root:
            ins = self._one("scatter", input_lists)
            self._check_count("scatter", ins)
            self._same("scatter", ins, out_t)
            x = _np(torch.stack([i.reshape(-1) for i in ins]))
        elif input_lists and any(input_lists):
            raise RuntimeError("shmcoll backend: scatter takes input tensors only on the root")
        dst, copied = _dense(out_t)
        out = _np(dst.view(-1))

        def start(async_op):
            return [self.comm.scatter(x, out=out, root=root, async_op=async_op)]
        return self._issue("scatter", opts, output_tensors, start,
                           (lambda: out_t.copy_(dst)) if copied else None)

    def barrier(self, opts=None):
        opts = BarrierOptions() if opts is None else opts

        def start(async_op):
            work = self.comm.barrier(async_op=async_op)
            return [work] if async_op else None
        return self._issue("barrier", opts, [], start)

    # -- all-to-all and point-to-point -----------------------------------------
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes,
                          opts=None):
        """Rows of input's first dimension go to each rank: equal blocks (alltoall)
        without split sizes, else input_split_sizes rows to rank q and
        output_split_sizes rows from it (alltoallv)."""
        opts = AllToAllOptions() if opts is None else opts
        other = self._elsewhere("all_to_all_single", input)
        if other is not None:
            return other.alltoall_base(output, input, output_split_sizes, input_split_sizes,
                                       opts)
        if output.dtype != input.dtype:
            raise RuntimeError(f"shmcoll backend: all_to_all_single needs one dtype, got "
                               f"{input.dtype} and {output.dtype}")
        dst, copied = _dense(output)
        src = input.contiguous()
        if not output_split_sizes and not input_split_sizes:
            if input.numel() % self._size or output.numel() != input.numel():
                raise RuntimeError(
                    f"shmcoll backend: all_to_all_single without split sizes needs input "
                    f"and output of one size divisible by {self._size}, got "
                    f"{input.numel()} and {output.numel()} elements")
            x, out = _np(src.view(self._size, -1)), _np(dst.view(self._size, -1))

            def start(async_op):
                return [self.comm.alltoall(x, out=out, async_op=async_op)]
        else:
            sends = list(input_split_sizes) or self._even(input, "input")
            receives = list(output_split_sizes) or self._even(output, "output")
            x, out = _np(src), _np(dst)

            def start(async_op):
                return [self.comm.alltoallv(x, sends, receives, out=out, async_op=async_op)]
        return self._issue("all_to_all_single", opts, [output], start,
                           (lambda: output.copy_(dst)) if copied else None)

    alltoall_base = all_to_all_single          # (its name before torch 2.13)

    def _even(self, t, what):
        if t.dim() == 0 or t.shape[0] % self._size:
            raise RuntimeError(f"shmcoll backend: all_to_all_single: the {what} rows "
                               f"({tuple(t.shape)}) do not split evenly over {self._size}")
        return [t.shape[0] // self._size] * self._size

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """all_to_all on lists: input_tensors[q] to rank q, output_tensors[q] from it
        (sizes may differ by pair): one alltoallv over the tensors packed end to end."""
        opts = AllToAllOptions() if opts is None else opts
        self._check_count("all_to_all", input_tensors)
        self._check_count("all_to_all", output_tensors)
        other = self._elsewhere("all_to_all", input_tensors[0])
        if other is not None:
            return other.alltoall(output_tensors, input_tensors, opts)
        dtype = input_tensors[0].dtype
        if any(t.dtype != dtype for t in list(input_tensors) + list(output_tensors)):
            raise RuntimeError("shmcoll backend: all_to_all needs tensors of one dtype")
        flat = torch.cat([t.reshape(-1) for t in input_tensors])
        received = torch.empty(sum(t.numel() for t in output_tensors), dtype=dtype)
        sends = [t.numel() for t in input_tensors]
        receives = [t.numel() for t in output_tensors]
        x, out = _np(flat), _np(received)

        def start(async_op):
            return [self.comm.alltoallv(x, sends, receives, out=out, async_op=async_op)]

        def finish():
            at = 0
            for t in output_tensors:
                t.copy_(received[at:at + t.numel()].view(t.shape))
                at += t.numel()
        return self._issue("all_to_all", opts, output_tensors, start, finish)

    def send(self, tensors, dst, tag=0):
        t = self._one("send", tensors)
        other = self._elsewhere("send", t)
        if other is not None:
            return other.send(tensors, dst, tag)
        x = _np(t.contiguous())
        return self._issue("send", None, [], lambda async_op: [
            self.comm.send(x, dst, tag, async_op=True)])

    def recv(self, tensors, src, tag=0):
        t = self._one("recv", tensors)
        other = self._elsewhere("recv", t)
        if other is not None:
            return other.recv(tensors, src, tag)
        dst, copied = _dense(t)
        out = _np(dst)
        return self._issue("recv", None, tensors, lambda async_op: [
            self.comm.recv(out, src, tag, async_op=True)],
            (lambda: t.copy_(dst)) if copied else None)

    # -- not provided ---------------------------------------------------------
    def _unsupported(self, name):
        raise RuntimeError(f"shmcoll backend does not support {name} (use a 'gloo' group "
                           f"for it: dist.new_group(backend='gloo'))")

    def recv_anysource(self, *args, **kwargs):
        self._unsupported("recv (from any source)")

    def monitored_barrier(self, *args, **kwargs):
        self._unsupported("monitored_barrier")

    # -- coalescing ----------------------------------------------------------
    def _check_count(self, name, tensors):
        if len(tensors) != self._size:
            raise RuntimeError(f"shmcoll backend: {name} needs {self._size} tensors "
                               f"(one per rank), got {len(tensors)}")

    def _joined(self, name, opts, outputs, works):
        """One TorchWork for the TorchWorks of a coalesced call."""
        joined = TorchWork(self, name, outputs, works)
        if not getattr(opts, "asyncOp", True):
            joined.wait()
        return joined

    def _start_coalescing(self, device=None):
        self._coalesced = []

    def _end_coalescing(self, device=None):
        works, self._coalesced = self._coalesced or [], None
        return TorchWork(self, "coalesced", [], works)

    # -- lifecycle -----------------------------------------------------------
    def shutdown(self):
        """Leave the group once its calls completed (destroy_process_group)."""
        for completions in self._completions:
            completions.stop()
        self.comm.close()

    def abort(self):
        """Leave at once: the other ranks' waits for this one end with an error."""
        for completions in self._completions:
            completions.stop()
        self.comm._fail()

    def __repr__(self):
        return f"<shmcoll.torch.ProcessGroupShmcoll rank {self.rank()} of {self._size}>"


def _async(options_type):
    opts = options_type()
    opts.asyncOp = True
    return opts
