"""Build of the C engine.  SHMCOLL_BUILD_DEBUG=1 builds with -O0 -g and assertions."""
import runpy
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

settings = runpy.run_path(str(Path(__file__).parent / "shmcoll" / "_core" / "settings.py"))
debug = settings["get"]("SHMCOLL_BUILD_DEBUG")

# -fwrapv: integer reductions wrap like numpy's; -fno-math-errno keeps loops vectorisable.
common = ["-std=gnu11", "-fwrapv", "-fno-math-errno", "-Wall", "-Wno-unused-function"]
optimise = ["-O0", "-g", "-UNDEBUG"] if debug else ["-O3", "-DNDEBUG"]

engine = Extension(
    "shmcoll._engine",
    sources=["shmcoll/_engine.pyx", "shmcoll/csrc/sc_comm.c", "shmcoll/csrc/sc_wait.c",
             "shmcoll/csrc/sc_reduce.c", "shmcoll/csrc/sc_ring.c",
             "shmcoll/csrc/sc_direct.c", "shmcoll/csrc/sc_call.c",
             "shmcoll/csrc/sc_rooted.c", "shmcoll/csrc/sc_rhd.c", "shmcoll/csrc/sc_prims.c",
             "shmcoll/csrc/sc_run.c", "shmcoll/csrc/sc_progress.c",
             "shmcoll/csrc/sc_alltoall.c", "shmcoll/csrc/sc_p2p.c",
             "shmcoll/csrc/sc_single_copy.c", "shmcoll/csrc/sc_cma.c",
             "shmcoll/csrc/sc_inline.c"],
    depends=[str(p) for p in Path("shmcoll/csrc").glob("*.h")] + ["shmcoll/_work.pxi"],
    include_dirs=[numpy.get_include(), "shmcoll/csrc"],
    extra_compile_args=common + optimise,
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
)

setup(ext_modules=cythonize([engine], language_level=3,
                            compiler_directives={"embedsignature": True}))
