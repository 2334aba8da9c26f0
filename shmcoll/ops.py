"""Reduction operators and the dtypes they apply to."""
import enum


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
    def code(self):
        return _CODES[self]

    @classmethod
    def from_code(cls, code):
        return _MEMBERS[code]


_MEMBERS = list(ReduceOp)
_CODES = {member: i for i, member in enumerate(_MEMBERS)}

# Lookup table for the hot path: members and their string values both hash alike.
OP_CODES = {member.value: i for i, member in enumerate(_MEMBERS)}


def op_code(op):
    """Return the engine code of ``op`` (a ReduceOp or its name), or raise ValueError."""
    try:
        return OP_CODES[op]
    except (KeyError, TypeError):
        pass
    if isinstance(op, str) and op.lower() in OP_CODES:
        return OP_CODES[op.lower()]
    names = ", ".join(repr(m.value) for m in ReduceOp)
    raise ValueError(f"unknown reduction op {op!r}; expected one of {names}")
