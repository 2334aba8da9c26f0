"""Reduction operators, the dtypes they apply to, and their reference semantics."""
import enum
from typing import Iterable, Union

import numpy as np
from numpy.typing import DTypeLike


class ReduceOp(str, enum.Enum):
    """Reduction operators; plain strings ("sum", ...) are accepted everywhere too.

    ``AVG`` on floating dtypes is the sum divided by the world size (computed in
    float32 for float16/bfloat16).  On integer dtypes it is the floor division of
    the sum by the world size, with the sum wrapping like numpy integer
    arithmetic: ``np.sum(xs, axis=0, dtype=x.dtype) // world_size``.
    ``BAND``/``BOR``/``BXOR`` are defined for integer dtypes only.
    """

    # Order is the C engine's sc_op enum.
    SUM = "sum"
    PROD = "prod"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"

    @property
    def code(self) -> int:
        return _CODES[self]

    @classmethod
    def from_code(cls, code: int) -> "ReduceOp":
        return _MEMBERS[code]


_MEMBERS = list(ReduceOp)
_CODES = {member: i for i, member in enumerate(_MEMBERS)}

# Lookup table for the hot path: members and their string values both hash alike.
OP_CODES = {member.value: i for i, member in enumerate(_MEMBERS)}


def op_code(op: Union[str, ReduceOp]) -> int:
    """Return the engine code of ``op`` (a ReduceOp or its name), or raise ValueError."""
    try:
        return OP_CODES[op]
    except (KeyError, TypeError):
        pass
    if isinstance(op, str) and op.lower() in OP_CODES:
        return OP_CODES[op.lower()]
    names = ", ".join(repr(m.value) for m in ReduceOp)
    raise ValueError(f"unknown reduction op {op!r}; expected one of {names}")


# -- the reference semantics, in numpy ------------------------------------------------
# What every path computes (the C engine, the CUDA kernels), written once: perf checks
# results against it, the host stand-in of the GPU path computes with it, tests too.

UFUNCS = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum,
          "max": np.maximum, "band": np.bitwise_and, "bor": np.bitwise_or,
          "bxor": np.bitwise_xor}


def accumulator_dtype(dtype: DTypeLike) -> np.dtype:
    """The type partial results are kept in: float32 for 2-byte floats (float16,
    bfloat16), so that a reduction rounds once; the dtype itself otherwise."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype.kind in "fV" and dtype.itemsize == 2 else dtype


def finish(acc: np.ndarray, op: str, world: int) -> np.ndarray:
    """The last step of `op` on an accumulated result: AVG divides by the world size
    (floor division on integers)."""
    if op != "avg":
        return acc
    if acc.dtype.kind == "c":   # each part divided (complex division rounds otherwise)
        parts = np.ascontiguousarray(acc).reshape(-1).view(acc.real.dtype)
        return (parts / parts.dtype.type(world)).view(acc.dtype).reshape(acc.shape)
    return acc // world if acc.dtype.kind in "iu" else acc / acc.dtype.type(world)


@np.errstate(over="ignore", invalid="ignore")
def reference_reduce(arrays: Iterable[np.ndarray], op: Union[str, ReduceOp]) -> np.ndarray:
    """The reduction of `arrays` (one per rank, in rank order) as shmcoll defines it:
    accumulated in accumulator_dtype, integers wrapping like numpy's, then finished
    and rounded once to the arrays' dtype."""
    arrays = list(arrays)
    dtype = arrays[0].dtype
    acc_t = accumulator_dtype(dtype)
    op = ReduceOp(op).value         # a member or its name; raises for anything else
    stack = np.stack([np.asarray(a).astype(acc_t) for a in arrays])
    acc = np.asarray(UFUNCS[op].reduce(stack, axis=0, dtype=acc_t))
    return np.asarray(finish(acc, op, len(arrays))).astype(dtype)
