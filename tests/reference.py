"""Pure-numpy reference for every collective, and deterministic per-rank inputs."""
import functools

import numpy as np

from shmcoll.collectives import BY_NAME
from shmcoll.ops import reference_reduce

try:
    import ml_dtypes
    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:
    BFLOAT16 = None

INT_DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
FLOAT_DTYPES = ["float16", "float32", "float64"] + (["bfloat16"] if BFLOAT16 is not None else [])
ALL_DTYPES = INT_DTYPES + FLOAT_DTYPES
FLOAT_OPS = ["sum", "prod", "min", "max", "avg"]
INT_OPS = FLOAT_OPS + ["band", "bor", "bxor"]


def dtype_of(name):
    return BFLOAT16 if name == "bfloat16" else np.dtype(name)


def is_float(name):
    return name in FLOAT_DTYPES


def ops_for(name):
    return FLOAT_OPS if is_float(name) else INT_OPS


def make_input(rank, shape, dtype_name, op, seed=0):
    """Values that every summation order reduces exactly (small integers; +-1, 2 for prod)."""
    rng = np.random.default_rng([seed, rank, len(shape), int(np.prod(shape))])
    count = int(np.prod(shape))
    signed = dtype_name[0] != "u"
    if op == "prod":
        vals = rng.choice([1, 2, -1] if signed else [1, 2, 3], count)
    elif op in ("band", "bor", "bxor"):
        vals = rng.integers(0, 127, count)
    elif is_float(dtype_name):
        vals = rng.integers(-8, 9, count)
    else:
        vals = rng.integers(-120 if signed else 0, 120, count)
    return vals.astype(np.int64).astype(dtype_of(dtype_name)).reshape(shape)


def reduce_ref(xs, op, dtype_name):
    """The reduction of the stacked inputs, computed like the engine defines it."""
    return reference_reduce([np.asarray(x, dtype_of(dtype_name)) for x in xs], op)


def expected_result(case, P, rank):
    """What workers.run_case(comm, *case) must return on `rank` of P."""
    collective, shape, dt, op = case[:4]
    seed = case[6] if len(case) > 6 else 0
    root = case[7] if len(case) > 7 else 0
    op = op or "sum"
    if not BY_NAME[collective].result_on(rank, root):
        return None
    if collective == "broadcast":
        return make_input(root, shape, dt, op, seed)
    if collective == "scatter":
        return make_input(rank, shape, dt, op, seed)
    if collective == "sendrecv":        # from rank - 1
        return make_input((rank - 1) % P, shape, dt, op, seed)
    if collective == "alltoall":        # row `rank` of every rank's (P, *shape) input
        return _every_rank(collective, (P,) + tuple(shape), dt, op, seed, P)[:, rank]
    full = _every_rank(collective, tuple(shape), dt, op, seed, P)
    if collective == "reduce_scatter":
        m = shape[0] // P
        return full[rank * m:(rank + 1) * m]
    return full


@functools.lru_cache(maxsize=8)
def _every_rank(collective, shape, dt, op, seed, P):
    """Every rank's input stacked (AllGather, Gather, AllToAll) or reduced: the same
    for every rank of a case, so made once while the ranks' results are checked one
    by one (at P=8 making it per rank took most of the matrix test's time)."""
    xs = [make_input(r, shape, dt, op, seed) for r in range(P)]
    if collective in ("allgather", "gather", "alltoall"):
        return np.stack(xs)
    return reduce_ref(xs, op, dt)


def bitwise_equal(a, b):
    if a is None or b is None:
        return a is None and b is None
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return a.tobytes() == b.tobytes()


def case_grid(P, dtype_ops, shapes, seed, algos_of=lambda coll: [None],
              roots_of=lambda coll: [0], skip=()):
    """Cases (collective, shape, dtype, op, inplace, algo, seed, root) of every
    collective (and sendrecv, the ring shift) but `skip` x algorithm x root x
    (dtype, op) x shape, in place and not; copy-only collectives with "sum" only,
    reduce_scatter's first dimension whole blocks of P, alltoall's x (P, *shape)."""
    cases = []
    for coll in BY_NAME:
        if coll in skip:
            continue
        for algo in algos_of(coll):
            for root in roots_of(coll):
                for dt, op in dtype_ops:
                    if not BY_NAME[coll].reducing and op != "sum":
                        continue
                    for shape in shapes:
                        if coll == "reduce_scatter":
                            n = shape[0] if shape else 1
                            shape = (P * max(n // P, 1 if n else 0),) + tuple(shape[1:])
                        for inplace in (False, True):
                            cases.append((coll, shape, dt, op, inplace, algo, seed, root))
    return cases


def assert_cases_match(cases, got, P):
    """got[rank][i] is rank's result of cases[i]: each must equal the reference."""
    wrong = [(case, rank) for i, case in enumerate(cases) for rank in range(P)
             if not bitwise_equal(got[rank][i], expected_result(case, P, rank))]
    assert not wrong, f"{len(wrong)} wrong of {len(cases) * P}: {wrong[:5]}"
