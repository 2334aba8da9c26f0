"""One collective at one size on this rank: buffers, deterministic inputs, the call,
and a check of its result against numpy, block by block."""
import numpy as np

from shmcoll.collectives import BY_NAME
from shmcoll.ops import reference_reduce
from shmcoll.tools.harness.calls import bind, in_place

CHECK_BLOCK = 1 << 20   # elements compared at a time: the check needs O(P x block) memory


def rank_input(rank, count, dtype, start=0):
    """Elements [start, start+count) of a rank's input: varied small integers, exactly
    representable in every dtype, so that sums check exactly."""
    i = np.arange(start, start + count, dtype=np.int64)
    return ((i * 7 + rank * 3) % 11 + 1).astype(dtype)


def fill_input(x, rank):
    """x[...] = rank_input(rank, x.size), a block at a time (no full-size temporaries)."""
    flat = x.reshape(-1)
    for s in range(0, flat.size, CHECK_BLOCK):
        n = min(CHECK_BLOCK, flat.size - s)
        flat[s:s + n] = rank_input(rank, n, x.dtype, s)


def reduced_block(world, start, count, dtype, op):
    """Elements [start, start+count) of the reduction of every rank's input."""
    return reference_reduce([rank_input(r, count, dtype, start) for r in range(world)], op)


def count_wrong(got, want):
    """Elements of `got` that differ from `want` (floats: beyond a rounding's worth)."""
    if np.dtype(want.dtype).kind in "iu":
        return int(np.count_nonzero(got != want))
    rtol = 1e-2 if got.dtype.itemsize == 2 else 1e-5
    return int(np.count_nonzero(~np.isclose(got.astype(np.float64), want.astype(np.float64),
                                            rtol=rtol, equal_nan=True)))


class Case:
    """One collective at one size on this rank (nbytes as in shmcoll.collectives;
    blocked collectives round down to whole blocks).  symmetric: x and out are
    symmetric allocations (Communicator.empty; collective, like the case itself)."""

    def __init__(self, comm, collective, nbytes, dtype, op, algo, root=0, device=False,
                 symmetric=False):
        self.comm, self.collective, self.op, self.algo = comm, collective, op, algo
        self.device = device
        P, itemsize = comm.world_size, np.dtype(dtype).itemsize
        count = nbytes // itemsize
        if BY_NAME[collective].blocked:
            count -= count % P
        self.count, self.dtype, self.root = count, np.dtype(dtype), root
        block = count // P
        shapes = {   # (x, out) on this rank
            "allreduce": ((count,), (count,)), "reduce": ((count,), (count,)),
            "broadcast": ((count,), None), "reduce_scatter": ((count,), (block,)),
            "allgather": ((block,), (P, block)), "gather": ((block,), (P, block)),
            "scatter": ((P, block), (block,)), "alltoall": ((P, block), (P, block)),
            "sendrecv": ((count,), (count,)),
        }[collective]
        empty = comm.empty if symmetric else np.empty
        self.host_x = empty(shapes[0], dtype)
        self.host_out = empty(shapes[1], dtype) if shapes[1] else None
        self.fill()

    def fill(self):
        """This rank's inputs: rank_input(r) (broadcast: the root's; scatter: row q is
        rank q's block)."""
        r, x = self.comm.rank, self.host_x
        if self.collective == "scatter":
            for q in range(self.comm.world_size):
                fill_input(x[q], q)
        elif self.collective == "broadcast":
            fill_input(x, self.root) if r == self.root else x.fill(0)
        else:
            fill_input(x, r)
        self.x, self.out = self.host_x, self.host_out
        if self.device:         # device copies of the inputs (perf --device cuda)
            from shmcoll.cuda import array_converters
            to_device, self.to_host = array_converters()
            self.x = to_device(self.host_x)
            self.out = None if self.host_out is None else to_device(self.host_out)

    @property
    def nbytes(self):
        return self.count * self.dtype.itemsize

    def call(self, inplace):
        """The collective as a closure (harness.calls.bind), in place or not."""
        x, out = self.x, self.out
        if inplace:
            x, out = in_place(self.comm, self.collective, x, out, self.root)
        return bind(self.comm, self.collective, x, out, self.op, self.root, self.algo)

    def _expected(self):
        """(block list, expect(start, n)) over this rank's flattened result, or None
        where this rank gets no result."""
        P, r, m = self.comm.world_size, self.comm.rank, self.count // self.comm.world_size
        coll = self.collective
        if not BY_NAME[coll].result_on(r, self.root):
            return None
        if coll == "sendrecv":      # rank r-1's input
            blocks = [(s, min(CHECK_BLOCK, self.count - s)) for s in range(0, self.count, CHECK_BLOCK)]
            return blocks, lambda start, n: rank_input((r - 1) % P, n, self.dtype, start)
        if coll == "alltoall":      # row q: rank q's input at row r
            expect = lambda start, n: rank_input(start // m, n, self.dtype, r * m + start % m)
            blocks = [(q * m + s, min(CHECK_BLOCK, m - s)) for q in range(P) for s in range(0, m, CHECK_BLOCK)]
            return blocks, expect
        if coll in ("allgather", "gather"):
            expect = lambda start, n: rank_input(start // m, n, self.dtype, start % m)
            blocks = [(q * m + s, min(CHECK_BLOCK, m - s)) for q in range(P) for s in range(0, m, CHECK_BLOCK)]
            return blocks, expect
        size = m if coll in ("reduce_scatter", "scatter") else self.count
        blocks = [(s, min(CHECK_BLOCK, size - s)) for s in range(0, size, CHECK_BLOCK)]
        if coll == "broadcast":
            return blocks, lambda start, n: rank_input(self.root, n, self.dtype, start)
        if coll == "scatter":
            return blocks, lambda start, n: rank_input(r, n, self.dtype, start)
        lo = r * m if coll == "reduce_scatter" else 0
        return blocks, lambda start, n: reduced_block(P, lo + start, n, self.dtype, self.op)

    def check(self, inplace):
        """Run once on fresh inputs and count wrong elements against numpy, block by
        block so that checking a 1 GiB message needs no more than a few MiB."""
        self.fill()
        got = self.call(inplace)()
        expected = self._expected()
        wrong = 0
        if expected is not None:
            got = (self.to_host(got) if self.device else got).reshape(-1)
            blocks, expect = expected
            wrong = sum(count_wrong(got[s:s + n], expect(s, n)) for s, n in blocks)
        self.fill()
        return wrong
