"""The device kernels compile: with nvcc where it exists, else with NVRTC where its
library can be found (the pip wheel nvidia-cuda-nvrtc-cu12 is enough, no GPU needed);
skipped otherwise.  Every template instantiation the GPU path can ask for is built."""
import ctypes
import ctypes.util
import glob
import os
import shutil
import subprocess

import pytest

from shmcoll.cuda import kernels

ARCH = "compute_90"


def _nvrtc_library():
    try:
        import nvidia.cuda_nvrtc as pkg
        found = glob.glob(os.path.join(list(pkg.__path__)[0], "lib", "libnvrtc.so*"))
        if found:
            return sorted(found)[0]
    except ImportError:
        pass
    return ctypes.util.find_library("nvrtc")



def test_kernels_compile_with_nvcc(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    src = tmp_path / "k.cu"
    src.write_text(kernels.source() + "\n" + "\n".join(
        f"template __global__ void {n.split('<')[0]}<{n.split('<', 1)[1]}(" + _params(n) + ");"
        for n in kernels.all_names()))
    res = subprocess.run([nvcc, "-c", "-std=c++14", f"-arch={ARCH}", str(src), "-o",
                          str(tmp_path / "k.o")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def _params(name):
    if name.startswith("reduce_table"):
        t = name.split("<", 1)[1].split(",")[0]
        return f"{t} *, const char *const *, int, u64, u64, int"
    t = name.split("<", 1)[1].split(",")[0]
    return f"void *, const void *, const {t} *, u64, int"


def test_kernels_compile_with_nvrtc():
    path = _nvrtc_library()
    if not path:
        pytest.skip("NVRTC not found (pip install nvidia-cuda-nvrtc-cu12 to run this check)")
    lib = ctypes.CDLL(path)
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), kernels.source().encode(), b"kernels.cu",
                                  0, None, None) == 0
    for name in kernels.all_names():
        assert lib.nvrtcAddNameExpression(prog, name.encode()) == 0
    opts = [f"--gpu-architecture={ARCH}".encode(), b"--std=c++14"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    ptx_size = ctypes.c_size_t()
    lib.nvrtcGetPTXSize(prog, ctypes.byref(ptx_size))
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    assert rc == 0, log.value.decode()
    assert ptx_size.value > 0
