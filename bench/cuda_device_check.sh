#!/usr/bin/env bash
# The GPU checks in one run, on a machine with a CUDA GPU, CuPy and nvcc: build in place,
# the GPU tests (every schedule against numpy at P = 2, 4, 8 ranks on the GPU, stream
# order, a 64 MiB AllReduce), then the AllReduce sweep beside the copy bandwidth and NCCL.
# posix_ipc must be importable (pip install posix_ipc, or a carried wheel on PYTHONPATH).
# Each step has its own time limit and a failing step does not stop the next: one run
# gives every answer.  LOG (default: stdout only) also receives everything.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 SHMCOLL_TIMEOUT=120
step() {
    local limit=$1; shift
    echo "### $* (limit ${limit}s)"
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@"
    echo "### exit $? after $((SECONDS - t0))s: $*"
}
nvidia-smi -L || true
python3 -c "import cupy, posix_ipc; print('cupy', cupy.__version__, cupy.cuda.runtime.getDeviceCount(), 'GPU(s)')"
step 120 python3 setup.py -q build_ext --inplace
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
step 60 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider
step 200 python3 -m pytest tests/test_cuda_gpu.py -q -p no:cacheprovider -x -v
step 80 python3 bench/cuda_sweep.py -np 2 -b 8 -e 1G -f 8
step 50 python3 bench/cuda_sweep.py -np 4 -b 8 -e 256M -f 16 --no-nccl
step 50 python3 bench/cuda_sweep.py -np 8 -b 8 -e 64M -f 16 --no-nccl
