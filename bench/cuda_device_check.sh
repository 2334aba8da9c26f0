#!/usr/bin/env bash
# The GPU checks in one run, on a machine with a CUDA GPU, CuPy and nvcc: build in place,
# the GPU tests (every schedule against numpy at P = 2, 4, 8 ranks on the GPU, stream
# order, a 64 MiB AllReduce), then the AllReduce sweep beside the copy bandwidth and NCCL.
# posix_ipc must be importable (pip install posix_ipc, or a carried wheel on PYTHONPATH).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 SHMCOLL_TIMEOUT=120
python3 -c "import cupy, posix_ipc; print('cupy', cupy.__version__, cupy.cuda.runtime.getDeviceCount(), 'GPU(s)')"
python3 setup.py -q build_ext --inplace
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 -m pytest tests/test_cuda_kernels.py tests/test_cuda_gpu.py -q -p no:cacheprovider -x
python3 bench/cuda_sweep.py -np 2 -b 8 -e 1G -f 8
python3 bench/cuda_sweep.py -np 4 -b 8 -e 256M -f 16 --no-nccl
python3 bench/cuda_sweep.py -np 8 -b 8 -e 64M -f 16 --no-nccl
