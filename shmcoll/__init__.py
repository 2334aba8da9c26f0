"""shmcoll: collective operations between processes of one machine over shared memory.

    import numpy as np, shmcoll

    def work(comm):
        x = np.arange(10, dtype=np.float32) * (comm.rank + 1)
        return float(comm.allreduce(x).sum())

    if __name__ == "__main__":
        print(shmcoll.launch(work, nprocs=4))
"""
from shmcoll.communicator import ANY_TAG, Communicator, init
from shmcoll.errors import (ClosedError, CommunicatorBrokenError, ConcurrentCallError,
                            DeviceError, JobAbortedError, JoinRefusedError, LaunchError,
                            MismatchError, OutOfMemoryError, PeerLostError, SegmentError,
                            SharedMemoryFullError, ShmcollError, TimeoutError)
from shmcoll.launch import launch
from shmcoll.ops import ReduceOp
from shmcoll.work import Work, wait_all

__version__ = "0.1.0"

__all__ = [
    "launch", "init", "Communicator", "ANY_TAG", "ReduceOp", "Work", "wait_all", "ShmcollError", "TimeoutError",
    "PeerLostError", "MismatchError", "JobAbortedError", "CommunicatorBrokenError", "ClosedError",
    "SegmentError", "LaunchError", "DeviceError", "ConcurrentCallError", "JoinRefusedError",
    "SharedMemoryFullError", "OutOfMemoryError", "__version__",
]
