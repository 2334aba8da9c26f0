"""Uneven blocks (allgatherv, gatherv, scatterv, reduce_scatter with counts,
alltoallv) and Python objects, composed from the engine's collectives.

Every rank learns every block's shape first (one allgather of a small header), so
ranks that disagree all raise the same MismatchError, and an argument one rank
refuses (or an object it cannot pickle) is an error on every rank, not a wait for a
call that rank will not make.  Then the data moves in one collective of blocks
padded to the longest: rank r's block travels in rows
[0, counts[r]) of its slot.  The padding costs bandwidth when blocks differ a lot
(the collective moves P x the longest block instead of the sum); the result is
compacted once into a fresh array in rank order.  alltoallv pads nothing: after the
header exchange its engine call moves each pair's rows as they are.

Objects are pickled with protocol 5: numpy arrays and other contiguous buffers go
out of band, copied once into the payload on the sender and unpickled as views of
the receive buffer (no second copy).  Unpickling runs code the peers sent: the
ranks of one job are one user's processes and trust each other, as with mpi4py.
"""
import pickle

import numpy as np

from shmcoll.errors import MismatchError

_MAX_DIMS = 8           # an uneven block's dimensions after the first
_MAX_FRAMES = 61        # out-of-band buffers per object header (more go in band)
_HEADER = 3 + _MAX_FRAMES   # [total bytes, frames, largest total, frame lengths...]
_REFUSED = -1           # a header's first field: this rank refused its own argument


def _refuse_together(bad, what, error):
    """After a header exchange: when ranks `bad` refused their argument, every rank
    raises (those ranks their own `error`, the others a ValueError naming them), so
    no rank is left waiting for a call the others will not make."""
    if bad:
        if error is not None:
            raise error
        raise ValueError(f"{what}: rank(s) {bad} refused their argument, so no rank ran the "
                         f"call")


# -- uneven blocks ---------------------------------------------------------------------
def _shape_header(x, what):
    """(x's shape as a header, None), or (a refusal header, the error)."""
    head = np.full(2 + _MAX_DIMS, -1, np.int64)
    if x.ndim == 0:
        return head, ValueError(f"{what}: a block needs at least one dimension (its rows)")
    if x.ndim - 1 > _MAX_DIMS:
        return head, ValueError(f"{what}: blocks have at most {_MAX_DIMS + 1} dimensions, "
                                f"got {x.ndim}")
    head[0], head[1] = x.shape[0], x.ndim
    head[2:1 + x.ndim] = x.shape[1:]
    return head, None


def _agreed_rows(comm, x, what):
    """Every rank's row count; the other dimensions must agree on every rank."""
    head, error = _shape_header(x, what)
    heads = comm.allgather(head)
    _refuse_together([r for r in range(len(heads)) if heads[r, 0] == _REFUSED], what, error)
    differ = [r for r in range(len(heads)) if list(heads[r, 1:]) != list(heads[0, 1:])]
    if differ:
        shapes = [tuple(int(v) for v in h[2:1 + int(h[1])]) for h in heads]
        raise MismatchError(f"{what}: ranks' blocks differ after the first dimension: "
                            + ", ".join(f"rank {r} (rows, *{s})" for r, s in enumerate(shapes)),
                            "shape", (0, differ[0]))
    return [int(h[0]) for h in heads]


def _padded(x, rows):
    if x.shape[0] == rows:
        return np.ascontiguousarray(x)
    block = np.zeros((rows,) + x.shape[1:], x.dtype)
    block[:x.shape[0]] = x
    return block


def _compact(stacked, counts):
    # (dtype: numpy's concatenate and stack would turn a byte-swapped dtype native)
    return np.concatenate([stacked[r, :n] for r, n in enumerate(counts)], dtype=stacked.dtype)


def allgatherv(comm, x):
    """Every rank gets the concatenation, in rank order, of every rank's x (first
    dimensions may differ)."""
    x = np.asarray(x)
    counts = _agreed_rows(comm, x, "allgatherv")
    stacked = comm.allgather(_padded(x, max(counts)))
    return _compact(stacked, counts)


def gatherv(comm, x, root):
    """The concatenation on `root`, None elsewhere."""
    x = np.asarray(x)
    counts = _agreed_rows(comm, x, "gatherv")
    stacked = comm.gather(_padded(x, max(counts)), root=root)
    return None if stacked is None else _compact(stacked, counts)


def _counts(counts, world, what):
    try:
        counts = [int(c) for c in counts]
    except (TypeError, ValueError):
        raise TypeError(f"{what}: counts must be {world} row counts, got {counts!r}") from None
    if len(counts) != world or any(c < 0 for c in counts):
        raise ValueError(f"{what}: counts must be {world} non-negative row counts, got "
                         f"{counts}")
    return counts


def scatterv(comm, x, counts, root):
    """Rank r gets rows [sum(counts[:r]), sum(counts[:r+1])) of the root's x (x and
    counts only matter on the root)."""
    layout, error = None, None
    if comm.rank == root:
        try:
            x = np.asarray(x)
            counts = _counts(counts, comm.world_size, "scatterv")
            _check_rows(x, counts, "scatterv")
            layout = (counts, x.shape[1:], x.dtype.str if x.dtype.fields is None else x.dtype)
        except (TypeError, ValueError) as e:
            error = e
    layout = broadcast_object(comm, layout, root)
    _refuse_together([root] if layout is None else [], "scatterv", error)
    counts, tail, dtype = layout
    rows = max(counts)
    if comm.rank == root:
        starts = np.cumsum([0] + counts)
        blocks = np.stack([_padded(x[starts[r]:starts[r + 1]], rows)
                           for r in range(comm.world_size)], dtype=x.dtype)
        mine = comm.scatter(blocks, root=root)
    else:
        mine = comm.scatter(None, out=np.empty((rows,) + tuple(tail), np.dtype(dtype)),
                            root=root)
    return mine[:counts[comm.rank]].copy()


def _check_rows(x, counts, what):
    if x.ndim == 0 or x.shape[0] != sum(counts):
        raise ValueError(f"{what}: x has {x.shape[0] if x.ndim else 0} rows, counts sum to "
                         f"{sum(counts)}")


def reduce_scatter_counts(comm, x, counts, op, algo):
    """Rank r gets the reduction of rows [sum(counts[:r]), sum(counts[:r+1])) of x
    (the same counts and x's shape on every rank)."""
    P, error = comm.world_size, None
    x = np.asarray(x)
    try:
        counts = _counts(counts, P, "reduce_scatter")
        _check_rows(x, counts, "reduce_scatter")
        mine = np.array(counts, np.int64)
    except (TypeError, ValueError) as e:
        mine, error = np.full(P, _REFUSED, np.int64), e
    seen = comm.allgather(mine)
    _refuse_together([r for r in range(P) if seen[r, 0] == _REFUSED], "reduce_scatter", error)
    differ = [r for r in range(comm.world_size) if list(seen[r]) != list(seen[0])]
    if differ:
        raise MismatchError("reduce_scatter: ranks pass different counts: "
                            + ", ".join(f"rank {r} {list(seen[r])}"
                                        for r in range(comm.world_size)),
                            "counts", (0, differ[0]))
    rows = max(counts)
    starts = np.cumsum([0] + counts)
    blocks = np.concatenate([_padded(x[starts[r]:starts[r + 1]], rows)
                             for r in range(comm.world_size)], dtype=x.dtype)
    mine = comm.reduce_scatter(blocks, op=op, algo=algo)
    return mine[:counts[comm.rank]].copy()


def alltoallv(comm, x, counts, recv_counts=None, out=None, async_op=False):
    """Rank r sends rows [sum(counts[:q]), sum(counts[:q+1])) of x to rank q, and gets
    the rows every rank sent it, concatenated in rank order.  One allgather of a
    header (x's row shape, the counts and any recv_counts) lets every rank check every
    other's before data moves."""
    P, error, what = comm.world_size, None, "alltoallv"
    x = np.asarray(x)
    head, error = _shape_header(x, what)
    given = np.full(P, -1, np.int64)
    sends = np.zeros(P, np.int64)
    if error is None:
        try:
            sends[:] = _counts(counts, P, what)
            _check_rows(x, list(sends), what)
            if recv_counts is not None:
                given[:] = _counts(recv_counts, P, what + " recv_counts")
        except (TypeError, ValueError) as e:
            head[0], error = _REFUSED, e
    heads = comm.allgather(np.concatenate([head, sends, given]))
    _refuse_together([r for r in range(P) if heads[r, 0] == _REFUSED], what, error)
    tails = heads[:, 1:2 + _MAX_DIMS]
    differ = [r for r in range(P) if list(tails[r]) != list(tails[0])]
    if differ:
        shapes = [tuple(int(v) for v in h[2:1 + int(h[1])]) for h in heads]
        raise MismatchError(f"{what}: ranks' rows differ in shape: "
                            + ", ".join(f"rank {r} (rows, *{s})" for r, s in enumerate(shapes)),
                            "shape", (0, differ[0]))
    matrix = heads[:, 2 + _MAX_DIMS:2 + _MAX_DIMS + P]     # [sender, receiver] rows
    wrong = [(r, q) for r in range(P) for q in range(P)
             if heads[r, 2 + _MAX_DIMS + P + q] not in (-1, matrix[q, r])]
    if wrong:
        r, q = wrong[0]
        raise MismatchError(f"{what}: rank {r} expects {heads[r, 2 + _MAX_DIMS + P + q]} rows "
                            f"from rank {q}, which sends it {matrix[q, r]}", "count", (r, q))
    receives = matrix[:, comm.rank]
    row_bytes = x.itemsize * int(np.prod(x.shape[1:], dtype=np.int64))
    shape = (int(receives.sum()),) + x.shape[1:]
    if out is None:
        out = np.empty(shape, x.dtype)
    elif out.shape != shape or out.dtype != x.dtype:
        raise ValueError(f"{what}: out has shape {out.shape} and dtype {out.dtype}, the rows "
                         f"received need {shape} and {x.dtype}")
    starts = np.concatenate([[0], np.cumsum(sends)[:-1]])
    rstarts = np.concatenate([[0], np.cumsum(receives)[:-1]])
    layout = np.concatenate([starts, sends, rstarts, receives]).astype(np.uint64) * row_bytes
    return comm._engine.alltoallv(np.ascontiguousarray(x), out, layout, row_bytes, async_op)


# -- objects -----------------------------------------------------------------------------
def _dumps(obj):
    """(frames, header): the pickle and its out-of-band buffers; the header says their
    lengths (frames beyond _MAX_FRAMES stay in band)."""
    buffers = []

    def out_of_band(buf):
        if len(buffers) >= _MAX_FRAMES - 1:
            return True                     # in band
        try:
            buffers.append(buf.raw())       # (contiguous buffers only)
        except BufferError:
            return True
        return False
    main = pickle.dumps(obj, protocol=5, buffer_callback=out_of_band)
    frames = [memoryview(main).cast("B")] + [b.cast("B") for b in buffers]
    head = np.zeros(_HEADER, np.int64)
    head[0], head[1] = sum(f.nbytes for f in frames), len(frames)
    head[3:3 + len(frames)] = [f.nbytes for f in frames]
    return frames, head


def _try_dumps(obj, what):
    """_dumps(obj) and None, or a refusal header and the error (obj cannot be pickled)."""
    try:
        return _dumps(obj) + (None,)
    except Exception as e:  # noqa: BLE001 - any pickling failure: refused on every rank
        head = np.full(_HEADER, _REFUSED, np.int64)
        return [], head, TypeError(f"{what}: the object cannot be pickled: {e}")


def _refused_ranks(heads):
    return [r for r in range(len(heads)) if heads[r, 0] == _REFUSED]


def _pack(frames, size):
    payload = np.empty(size, np.uint8)
    at = 0
    for f in frames:
        payload[at:at + f.nbytes] = np.frombuffer(f, np.uint8)
        at += f.nbytes
    return payload


def _loads(payload, head):
    lengths = [int(n) for n in head[3:3 + int(head[1])]]
    view, frames, at = memoryview(payload), [], 0
    for n in lengths:
        frames.append(view[at:at + n])
        at += n
    return pickle.loads(frames[0], buffers=frames[1:])


def broadcast_object(comm, obj, root):
    """The root's object on every rank (the root gets its own object back)."""
    frames, head, error = _try_dumps(obj, "broadcast_object") if comm.rank == root else \
        ([], np.zeros(_HEADER, np.int64), None)
    comm.broadcast(head, root=root)
    _refuse_together([root] if head[0] == _REFUSED else [], "broadcast_object", error)
    payload = _pack(frames, int(head[0])) if comm.rank == root else \
        np.empty(int(head[0]), np.uint8)
    comm.broadcast(payload, root=root)
    return obj if comm.rank == root else _loads(payload, head)


def allgather_object(comm, obj):
    """Every rank's object, in rank order, on every rank."""
    frames, head, error = _try_dumps(obj, "allgather_object")
    heads = comm.allgather(head)
    _refuse_together(_refused_ranks(heads), "allgather_object", error)
    size = int(heads[:, 0].max())
    stacked = comm.allgather(_pack(frames, size))
    return [obj if r == comm.rank else _loads(stacked[r], heads[r])
            for r in range(comm.world_size)]


def gather_object(comm, obj, root):
    """The list of every rank's object on `root`, None elsewhere."""
    frames, head, error = _try_dumps(obj, "gather_object")
    heads = comm.allgather(head)        # (every rank needs the largest size)
    _refuse_together(_refused_ranks(heads), "gather_object", error)
    stacked = comm.gather(_pack(frames, int(heads[:, 0].max())), root=root)
    if stacked is None:
        return None
    return [obj if r == root else _loads(stacked[r], heads[r]) for r in range(comm.world_size)]


def scatter_object(comm, objs, root):
    """objs[r] of the root's list on rank r (objs only matters on the root)."""
    P = comm.world_size
    if comm.rank != root:
        head = comm.scatter(None, out=np.empty(_HEADER, np.int64), root=root)
        _refuse_together([root] if head[0] == _REFUSED else [], "scatter_object", None)
        payload = comm.scatter(None, out=np.empty(int(head[2]), np.uint8), root=root)
        return _loads(payload, head)
    objs = list(objs) if objs is not None else []
    error = None if len(objs) == P else ValueError(
        f"scatter_object: the root needs {P} objects, got {len(objs)}")
    dumped = [_try_dumps(o, "scatter_object") for o in objs] if error is None else []
    error = error or next((e for _, _, e in dumped if e is not None), None)
    if error is not None:
        comm.scatter(np.full((P, _HEADER), _REFUSED, np.int64), root=root)
        raise error
    size = max(int(h[0]) for _, h, _ in dumped)
    heads = np.stack([h for _, h, _ in dumped])
    heads[:, 2] = size
    comm.scatter(heads, root=root)
    comm.scatter(np.stack([_pack(f, size) for f, _, _ in dumped]), root=root)
    return objs[root]
