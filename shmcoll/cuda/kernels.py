"""The device kernels' source (kernels.cu) and the template instantiations each
(dtype, op) needs; CuPy compiles them with NVRTC at first use."""
import os

SOURCE_PATH = os.path.join(os.path.dirname(__file__), "kernels.cu")

C_TYPES = {
    "float16": "half_bits", "bfloat16": "bf16_bits", "float32": "float", "float64": "double",
    "int8": "signed char", "uint8": "unsigned char", "int16": "short",
    "uint16": "unsigned short", "int32": "int", "uint32": "unsigned int",
    "int64": "long long", "uint64": "unsigned long long",
}
ACC_BYTES = {"float16": 4, "bfloat16": 4}           # widened partial sums
C_OPS = {"sum": "Sum", "prod": "Prod", "min": "Min", "max": "Max", "avg": "Avg",
         "band": "BAnd", "bor": "BOr", "bxor": "BXor"}
BITWISE = ("band", "bor", "bxor")
FLOATS = ("float16", "bfloat16", "float32", "float64")
SYNC = "sc_sync"


def source():
    with open(SOURCE_PATH) as f:
        return f.read()


def supports(dtype_name, op):
    return dtype_name in C_TYPES and op in C_OPS and not (op in BITWISE and dtype_name in FLOATS)


def reduce_name(dtype_name, op):
    return f"reduce_table<{C_TYPES[dtype_name]}, {C_OPS[op]}>"


def combine_name(dtype_name, op, partial_is_acc, last):
    flags = f"{'true' if partial_is_acc else 'false'}, {'true' if last else 'false'}"
    return f"ring_combine<{C_TYPES[dtype_name]}, {C_OPS[op]}, {flags}>"


def names_for(dtype_name, op):
    """Every kernel a (dtype, op) uses."""
    return [reduce_name(dtype_name, op)] + [combine_name(dtype_name, op, a, last)
                                            for a in (False, True) for last in (False, True)]


def all_names():
    return [n for d in C_TYPES for op in C_OPS if supports(d, op) for n in names_for(d, op)]
