"""What shmcoll.mpi.Communicator's cost model knows: the cluster it runs on.

Inside a node the link is the shared-memory engine's own model (its calibration,
or the reference one): a step costs α + o and a byte crossing a rank's port 2β,
as the engine copies every byte in and out.  Between nodes the link is given
(SHMCOLL_INTER_LINK) or measured once at creation by an MPI ping-pong between the
first two nodes' leaders: the latency is half the round trip of 8 bytes, the
bandwidth what a 1 MiB message adds to it.  Every rank takes rank 0's figures, so
every rank prices the same cluster and picks the same schedule without a message.
"""
import time

import numpy as np

from shmcoll._core.settings import get
from shmcoll.simulator.cluster import Cluster, Link, parse_link
from shmcoll.tuning.algorithms.terms import model_for_collective

PING_BYTES = 8
STREAM_BYTES = 1 << 20
PING_ROUNDS = 30
STREAM_ROUNDS = 5


def intra_link(node_model):
    """The node's shared-memory engine as a link, and its γ."""
    m = model_for_collective(node_model, "allreduce")
    return Link(1.0 / (2 * m.beta), m.alpha + m.overhead, "shared memory"), m.gamma


def ping_pong(mpi, a, b, nbytes, rounds):
    """Best half round trip (seconds) of nbytes between MPI ranks a and b; 0 elsewhere."""
    me = mpi.Get_rank()
    if me not in (a, b):
        return 0.0
    buf = np.zeros(max(nbytes, 1), np.uint8)
    other = b if me == a else a
    best = float("inf")
    for _ in range(rounds + 1):         # (the first round opens the connection)
        start = time.perf_counter()
        if me == a:
            mpi.Send(buf, other, tag=7)
            mpi.Recv(buf, other, tag=7)
        else:
            mpi.Recv(buf, other, tag=7)
            mpi.Send(buf, other, tag=7)
        best = min(best, (time.perf_counter() - start) / 2)
    return best


def measure_inter_link(mpi, first_leaders):
    """The link between two nodes, measured between MPI ranks first_leaders[0], [1]."""
    a, b = first_leaders
    latency = ping_pong(mpi, a, b, PING_BYTES, PING_ROUNDS)
    stream = ping_pong(mpi, a, b, STREAM_BYTES, STREAM_ROUNDS)
    bandwidth = STREAM_BYTES / max(stream - latency, 1e-9)
    return Link(bandwidth, latency, "MPI (measured)")


def inter_link(mpi, first_leaders, given=None):
    """The link between nodes: `given`, SHMCOLL_INTER_LINK, or measured (rank 0's)."""
    text = given if given is not None else get("SHMCOLL_INTER_LINK")
    if text:
        link = text if isinstance(text, Link) else parse_link(text)
        return Link(link.bandwidth, link.latency, link.name or "MPI (given)")
    return mpi.bcast(measure_inter_link(mpi, first_leaders), root=0)


def cluster(mpi, nodes, per_node, node_model, inter):
    """The Cluster every rank prices: rank 0's node model, the inter-node link."""
    intra, gamma = mpi.bcast(intra_link(node_model) if mpi.Get_rank() == 0 else None, root=0)
    return Cluster(nodes, per_node, intra, inter, nics=1, gamma=gamma)
