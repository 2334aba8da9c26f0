"""The device schedules: copies, reductions and flag waits through the ranks' CUDA
IPC buffers (shmcoll.cuda.buffers), enqueued on the caller's current stream.
For each piece of at most `half` bytes (SHMCOLL_CUDA_BUFFER_BYTES):

  direct (one-shot)  copy x to half[me]; barrier; out = half[0] (+) ... (+) half[P-1]
  direct (two-shot)  copy x to in[me]; barrier; aux[me] = block me of that sum;
                     barrier; out block q = aux[q] block q; barrier
  ring               ReduceScatter: P-1 steps, each reads the left neighbour's
                     partial block and adds its own; barrier; AllGather: P-1 steps
                     passing finished blocks rightwards; barrier
  broadcast          star: every rank copies half[root]; chain: root -> root+1 -> ...
                     in 8 sub-pieces, each rank forwarding what its left has
  reduce, gather, scatter, direct ReduceScatter and AllGather: one phase, as one-shot

Reductions run in rank order on every rank (every rank gets the same bits) and in
float32 for float16/bfloat16.

Reuse.  A one-phase piece (write my half, barrier, read the peers' halves) needs
one barrier, not two: consecutive one-phase pieces alternate between the two halves
of the buffer, and the barrier of piece k+1 is passed only once every rank has
finished reading piece k-1's half (each rank's stream reaches the barrier after its
reads).  A schedule of several phases uses both halves, so it first waits for
the last one-phase piece's readers (_settle), and ends with a barrier.
"""
from shmcoll.cuda import kernels
from shmcoll.cuda.buffers import BARRIER, READY, PeerBuffers

CHAIN_PIECES = 8


def block_range(count, parts, b):
    """Elements [off, off+len) of block b when count is cut into `parts` blocks, the
    first count % parts one element longer (the engine's split)."""
    base, extra = divmod(count, parts)
    return b * base + min(b, extra), base + (1 if b < extra else 0)


def pieces(total, cap, align):
    """(offset, length) pieces of `total` bytes, each at most `cap` and a multiple of
    `align` (the item size)."""
    cap = max(align, cap // align * align)
    return [(off, min(cap, total - off)) for off in range(0, total, cap)] or [(0, 0)]


class Schedules:
    """This rank's side of the device schedules: its buffers, its per-pair sequence
    numbers, and one method per schedule."""

    def __init__(self, engine, backend, half, timeout):
        self.engine, self.backend, self.half, self.timeout = engine, backend, half, timeout
        self.rank, self.world = engine.rank, engine.world_size
        self.buffers = None
        # Ranks meet on the host (stream synchronised, then the engine's barrier) instead
        # of spinning kernels: processes sharing one GPU are time-sliced, and a kernel
        # waiting for another process's kernel would hold the GPU that one needs.
        self.host_sync = False
        # Sequence numbers: barriers (the same for every pair), and ready signals per
        # peer, sent and awaited; every rank runs the same schedule, so they agree.
        self._barriers = 0
        self._ready_sent = [0] * self.world
        self._ready_seen = [0] * self.world
        self._half_index = 0        # the half the next one-phase piece writes
        self._unsettled = False     # peers may still read the last one-phase half

    def ensure_buffers(self, sync="auto"):
        if self.buffers is None:
            self.buffers = PeerBuffers(self.engine, self.backend, self.half)
            self.host_sync = sync == "host" or (sync == "auto" and self.buffers.one_device)

    # -- synchronisation ------------------------------------------------------------
    def _barrier(self, stream):
        if self.host_sync:
            self.backend.synchronize(stream)
            self.engine.barrier()
            return
        self._barriers += 1
        self.backend.sync(self.buffers.flag_table, self.rank, self.world, BARRIER, -1,
                          self._barriers, self._barriers, self.timeout, stream)

    def _signal(self, peer, stream):
        """Tell `peer` our data is ready.  Host sync: nothing; the matching _wait is a
        barrier (every ring step is a step of all ranks)."""
        if self.host_sync:
            return
        self._ready_sent[peer] += 1
        self.backend.sync(self.buffers.flag_table, self.rank, self.world, READY, peer,
                          self._ready_sent[peer], 0, self.timeout, stream)

    def _wait(self, peer, stream):
        if self.host_sync:
            self._barrier(stream)
            return
        self._ready_seen[peer] += 1
        self.backend.sync(self.buffers.flag_table, self.rank, self.world, READY, peer,
                          0, self._ready_seen[peer], self.timeout, stream)

    def _one_phase(self):
        """Byte offset, in every rank's buffer, of the half this one-phase piece uses."""
        offset = self._half_index * self.half
        self._half_index ^= 1
        self._unsettled = True
        return offset

    def _settle(self, stream):
        """Before a schedule that writes both halves: every reader of the last
        one-phase piece has finished."""
        if self._unsettled:
            self._barrier(stream)
            self._unsettled = False

    # -- schedules ------------------------------------------------------------------
    def one_shot(self, out, x, dtype, op, stream):
        b, be, isz = self.buffers, self.backend, dtype.itemsize
        for off, n in pieces(x.nbytes, self.half, isz):
            h = self._one_phase()
            be.copy(b.in_ptr(self.rank) + h, x.ptr + off, n, stream)
            self._barrier(stream)
            be.reduce(out.ptr + off, b.data_table, self.world, h, n // isz, dtype, op,
                      self.world, stream)

    def two_shot(self, out, x, dtype, op, stream):
        b, be, isz, P = self.buffers, self.backend, dtype.itemsize, self.world
        self._settle(stream)
        for off, n in pieces(x.nbytes, self.half, isz):
            count = n // isz
            be.copy(b.in_ptr(self.rank), x.ptr + off, n, stream)
            self._barrier(stream)
            lo, ln = block_range(count, P, self.rank)
            be.reduce(b.aux_ptr(self.rank) + lo * isz, b.data_table, P, lo * isz, ln, dtype, op,
                      P, stream)
            self._barrier(stream)
            for q in range(P):
                lo, ln = block_range(count, P, q)
                be.copy(out.ptr + off + lo * isz, b.aux_ptr(q) + lo * isz, ln * isz, stream)
            self._barrier(stream)

    def _ring_reduce_scatter(self, blocks, final, dtype, op, stream):
        """Ring steps over the blocks staged in in[me] (blocks[b] = (byte offset,
        count)); the reduced block `me` goes to `final`.  Step k's partial lives in
        aux slot k (accumulation type), read once by the right neighbour."""
        b, be, P, me = self.buffers, self.backend, self.world, self.rank
        isz = dtype.itemsize
        acc = kernels.ACC_BYTES.get(dtype.name, isz)
        slot = max(c for _, c in blocks) * acc
        left, right = (me - 1) % P, (me + 1) % P
        self._signal(right, stream)
        for k in range(2, P + 1):
            blk = (me - k) % P
            boff, count = blocks[blk]
            self._wait(left, stream)
            partial_is_acc = k > 2
            src = b.aux_ptr(left) + (k - 1) * slot if partial_is_acc else b.in_ptr(left) + boff
            last = k == P
            dst = final if last else b.aux_ptr(me) + k * slot
            be.combine(dst, src, b.in_ptr(me) + boff, count, dtype, op, partial_is_acc, last,
                       P, stream)
            if not last:
                self._signal(right, stream)

    def _ring_allgather(self, blocks, isz, stream):
        """Every rank's block `me` of in[] travels rightwards until all hold all."""
        b, be, P, me = self.buffers, self.backend, self.world, self.rank
        left, right = (me - 1) % P, (me + 1) % P
        self._signal(right, stream)
        for k in range(1, P):
            boff, count = blocks[(me - k) % P]
            self._wait(left, stream)
            be.copy(b.in_ptr(me) + boff, b.in_ptr(left) + boff, count * isz, stream)
            if k < P - 1:
                self._signal(right, stream)

    def ring_allreduce(self, out, x, dtype, op, stream):
        b, be, isz, P = self.buffers, self.backend, dtype.itemsize, self.world
        acc = kernels.ACC_BYTES.get(dtype.name, isz)
        cap = max(1, self.half // (acc * P)) * P * isz      # P aux slots of a block fit
        self._settle(stream)
        for off, n in pieces(x.nbytes, cap, isz):
            count = n // isz
            blocks = [(lo * isz, ln) for lo, ln in (block_range(count, P, q) for q in range(P))]
            be.copy(b.in_ptr(self.rank), x.ptr + off, n, stream)
            self._ring_reduce_scatter(blocks, b.in_ptr(self.rank) + blocks[self.rank][0],
                                      dtype, op, stream)
            self._barrier(stream)       # nobody still reads a block we are about to replace
            self._ring_allgather(blocks, isz, stream)
            be.copy(out.ptr + off, b.in_ptr(self.rank), n, stream)
            self._barrier(stream)

    def _block_pieces(self, block_bytes, isz, per_rank_slots=1, acc=None):
        acc = acc or isz
        cap = self.half // max(1, per_rank_slots) // max(1, acc // isz)
        return pieces(block_bytes, cap, isz)

    def reduce_scatter_direct(self, out, x, dtype, op, stream):
        b, be, isz, P = self.buffers, self.backend, dtype.itemsize, self.world
        block = x.nbytes // P
        for off, n in self._block_pieces(block, isz, P):
            h = self._one_phase()
            be.copy2d(b.in_ptr(self.rank) + h, n, x.ptr + off, block, n, P, stream)
            self._barrier(stream)
            be.reduce(out.ptr + off, b.data_table, P, h + self.rank * n, n // isz, dtype, op, P,
                      stream)

    def reduce_scatter_ring(self, out, x, dtype, op, stream):
        b, be, isz, P = self.buffers, self.backend, dtype.itemsize, self.world
        block = x.nbytes // P
        acc = kernels.ACC_BYTES.get(dtype.name, isz)
        self._settle(stream)
        for off, n in self._block_pieces(block, isz, P, acc):
            be.copy2d(b.in_ptr(self.rank), n, x.ptr + off, block, n, P, stream)
            blocks = [(q * n, n // isz) for q in range(P)]
            self._ring_reduce_scatter(blocks, out.ptr + off, dtype, op, stream)
            self._barrier(stream)

    def allgather_direct(self, out, x, dtype, stream):
        b, be, P = self.buffers, self.backend, self.world
        for off, n in self._block_pieces(x.nbytes, dtype.itemsize):
            h = self._one_phase()
            be.copy(b.in_ptr(self.rank) + h, x.ptr + off, n, stream)
            self._barrier(stream)
            for q in range(P):
                be.copy(out.ptr + q * x.nbytes + off, b.in_ptr(q) + h, n, stream)

    def allgather_ring(self, out, x, dtype, stream):
        b, be, isz, P = self.buffers, self.backend, dtype.itemsize, self.world
        self._settle(stream)
        for off, n in self._block_pieces(x.nbytes, isz, P):
            be.copy(b.in_ptr(self.rank) + self.rank * n, x.ptr + off, n, stream)
            self._ring_allgather([(q * n, n // isz) for q in range(P)], isz, stream)
            be.copy2d(out.ptr + off, x.nbytes, b.in_ptr(self.rank), n, n, P, stream)
            self._barrier(stream)

    def broadcast_star(self, x, root, stream):
        b, be = self.buffers, self.backend
        for off, n in pieces(x.nbytes, self.half, x.dtype.itemsize):
            h = self._one_phase()
            if self.rank == root:
                be.copy(b.in_ptr(root) + h, x.ptr + off, n, stream)
            self._barrier(stream)
            if self.rank != root:
                be.copy(x.ptr + off, b.in_ptr(root) + h, n, stream)

    def broadcast_chain(self, x, root, stream):
        if self.host_sync:      # a chain's ranks wait unequally: no all-rank steps
            return self.broadcast_star(x, root, stream)
        b, be, P, me = self.buffers, self.backend, self.world, self.rank
        left, right = (me - 1) % P, (me + 1) % P
        position = (me - root) % P
        self._settle(stream)
        isz = x.dtype.itemsize
        for off, n in pieces(x.nbytes, self.half, isz):
            for s_off, s_n in pieces(n, -(-n // CHAIN_PIECES), isz):
                if position == 0:
                    be.copy(b.in_ptr(me) + s_off, x.ptr + off + s_off, s_n, stream)
                else:
                    self._wait(left, stream)
                    dst = x.ptr + off + s_off if position == P - 1 else b.in_ptr(me) + s_off
                    be.copy(dst, b.in_ptr(left) + s_off, s_n, stream)
                if position < P - 1:
                    self._signal(right, stream)
            if 0 < position < P - 1:
                be.copy(x.ptr + off, b.in_ptr(me), n, stream)
            self._barrier(stream)

    def reduce_star(self, out, x, dtype, op, root, stream):
        b, be, isz = self.buffers, self.backend, dtype.itemsize
        for off, n in pieces(x.nbytes, self.half, isz):
            h = self._one_phase()
            be.copy(b.in_ptr(self.rank) + h, x.ptr + off, n, stream)
            self._barrier(stream)
            if self.rank == root:
                be.reduce(out.ptr + off, b.data_table, self.world, h, n // isz, dtype, op,
                          self.world, stream)

    def gather_star(self, out, x, root, stream):
        b, be = self.buffers, self.backend
        for off, n in pieces(x.nbytes, self.half, x.dtype.itemsize):
            h = self._one_phase()
            be.copy(b.in_ptr(self.rank) + h, x.ptr + off, n, stream)
            self._barrier(stream)
            if self.rank == root:
                for q in range(self.world):
                    be.copy(out.ptr + q * x.nbytes + off, b.in_ptr(q) + h, n, stream)

    def scatter_star(self, out, x_ptr, root, stream):
        b, be, P = self.buffers, self.backend, self.world
        block = out.nbytes
        for off, n in self._block_pieces(block, out.dtype.itemsize, P):
            h = self._one_phase()
            if self.rank == root:
                be.copy2d(b.in_ptr(root) + h, n, x_ptr + off, block, n, P, stream)
            self._barrier(stream)
            be.copy(out.ptr + off, b.in_ptr(root) + h + self.rank * n, n, stream)
