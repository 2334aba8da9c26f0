"""Uneven blocks (allgatherv, gatherv, scatterv, reduce_scatter with counts) and
Python objects, composed from the engine's collectives.

Every rank learns every block's shape first (one allgather of a small header, so
ranks that disagree all raise the same MismatchError), then the data moves in one
collective of blocks padded to the longest: rank r's block travels in rows
[0, counts[r]) of its slot.  The padding costs bandwidth when blocks differ a lot
(the collective moves P x the longest block instead of the sum); the result is
compacted once into a fresh array in rank order.

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


# -- uneven blocks ---------------------------------------------------------------------
def _shape_header(x):
    if x.ndim == 0:
        raise ValueError("an uneven block needs at least one dimension (its rows)")
    if x.ndim - 1 > _MAX_DIMS:
        raise ValueError(f"uneven blocks have at most {_MAX_DIMS + 1} dimensions, got {x.ndim}")
    head = np.full(2 + _MAX_DIMS, -1, np.int64)
    head[0], head[1] = x.shape[0], x.ndim
    head[2:1 + x.ndim] = x.shape[1:]
    return head


def _agreed_rows(comm, x, what):
    """Every rank's row count; the other dimensions must agree on every rank."""
    heads = comm.allgather(_shape_header(x))
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
    return np.concatenate([stacked[r, :n] for r, n in enumerate(counts)])


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
    layout = None
    if comm.rank == root:
        x = np.asarray(x)
        counts = _counts(counts, comm.world_size, "scatterv")
        if x.ndim == 0 or x.shape[0] != sum(counts):
            raise ValueError(f"scatterv: x has {x.shape[0] if x.ndim else 0} rows, counts "
                             f"sum to {sum(counts)}")
        layout = (counts, x.shape[1:], x.dtype.str if x.dtype.fields is None else x.dtype)
    counts, tail, dtype = broadcast_object(comm, layout, root)
    rows = max(counts)
    if comm.rank == root:
        starts = np.cumsum([0] + counts)
        blocks = np.stack([_padded(x[starts[r]:starts[r + 1]], rows)
                           for r in range(comm.world_size)])
        mine = comm.scatter(blocks, root=root)
    else:
        mine = comm.scatter(None, out=np.empty((rows,) + tuple(tail), np.dtype(dtype)),
                            root=root)
    return mine[:counts[comm.rank]].copy()


def reduce_scatter_counts(comm, x, counts, op, algo):
    """Rank r gets the reduction of rows [sum(counts[:r]), sum(counts[:r+1])) of x
    (the same counts and x's shape on every rank)."""
    counts = _counts(counts, comm.world_size, "reduce_scatter")
    x = np.asarray(x)
    if x.ndim == 0 or x.shape[0] != sum(counts):
        raise ValueError(f"reduce_scatter: x has {x.shape[0] if x.ndim else 0} rows, counts "
                         f"sum to {sum(counts)}")
    seen = comm.allgather(np.array(counts, np.int64))
    differ = [r for r in range(comm.world_size) if list(seen[r]) != list(seen[0])]
    if differ:
        raise MismatchError("reduce_scatter: ranks pass different counts: "
                            + ", ".join(f"rank {r} {list(seen[r])}"
                                        for r in range(comm.world_size)),
                            "counts", (0, differ[0]))
    rows = max(counts)
    starts = np.cumsum([0] + counts)
    blocks = np.concatenate([_padded(x[starts[r]:starts[r + 1]], rows)
                             for r in range(comm.world_size)])
    mine = comm.reduce_scatter(blocks, op=op, algo=algo)
    return mine[:counts[comm.rank]].copy()


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
    if comm.rank == root:
        frames, head = _dumps(obj)
    else:
        head = np.zeros(_HEADER, np.int64)
    comm.broadcast(head, root=root)
    payload = _pack(frames, int(head[0])) if comm.rank == root else \
        np.empty(int(head[0]), np.uint8)
    comm.broadcast(payload, root=root)
    return obj if comm.rank == root else _loads(payload, head)


def allgather_object(comm, obj):
    """Every rank's object, in rank order, on every rank."""
    frames, head = _dumps(obj)
    heads = comm.allgather(head)
    size = int(heads[:, 0].max())
    stacked = comm.allgather(_pack(frames, size))
    return [obj if r == comm.rank else _loads(stacked[r], heads[r])
            for r in range(comm.world_size)]


def gather_object(comm, obj, root):
    """The list of every rank's object on `root`, None elsewhere."""
    frames, head = _dumps(obj)
    heads = comm.allgather(head)        # (every rank needs the largest size)
    stacked = comm.gather(_pack(frames, int(heads[:, 0].max())), root=root)
    if stacked is None:
        return None
    return [obj if r == root else _loads(stacked[r], heads[r]) for r in range(comm.world_size)]


def scatter_object(comm, objs, root):
    """objs[r] of the root's list on rank r (objs only matters on the root)."""
    if comm.rank == root:
        objs = list(objs)
        if len(objs) != comm.world_size:
            raise ValueError(f"scatter_object: the root needs {comm.world_size} objects, got "
                             f"{len(objs)}")
        dumped = [_dumps(o) for o in objs]
        size = max(int(h[0]) for _, h in dumped)
        heads = np.stack([h for _, h in dumped])
        heads[:, 2] = size
        head = comm.scatter(heads, root=root)
        payload = comm.scatter(np.stack([_pack(f, size) for f, _ in dumped]), root=root)
        return objs[root]
    head = comm.scatter(None, out=np.empty(_HEADER, np.int64), root=root)
    payload = comm.scatter(None, out=np.empty(int(head[2]), np.uint8), root=root)
    return _loads(payload, head)
