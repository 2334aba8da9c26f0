"""A cluster for the simulator: nodes × devices, two levels of links, a rank order.

Inside a node every device has one port into the node's fabric (NVLink through a
switch, or PCIe), `intra.bandwidth` per direction; between nodes a flow leaves
through one of the node's `nics` network cards (device d uses card d mod nics) and
enters through one of the other node's, `inter.bandwidth` per direction per card.
Every flow crossing a port or card in the same step shares its bandwidth; a step's
latency is that of the slowest level it crosses.
"""
import re
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Link:
    bandwidth: float        # bytes per second, each direction
    latency: float          # seconds per step that crosses it
    name: str = ""

    def describe(self):
        label = f"{self.name} " if self.name else ""
        return f"{label}{self.bandwidth / 1e9:g} GB/s, {self.latency * 1e6:g} us"


# The seed's links.  Bandwidths are its figures (per direction here); latencies are
# round figures for one step through the link and its software, to be overridden
# with BW:LAT when the machine's own are known.
PRESETS = {
    "nvlink4": Link(600e9, 1e-6, "NVLink 4.0"),
    "pcie5": Link(64e9, 2e-6, "PCIe Gen5"),
    "ib-ndr": Link(50e9, 5e-6, "InfiniBand NDR"),
}

_BANDWIDTH_UNITS = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_TIME_UNITS = {"s": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_link(text):
    """'nvlink4', 'ib-ndr', 'pcie5', or BANDWIDTH[:LATENCY] such as '50GB/s:5us' or
    '1G:1us' (decimal units: G = 1e9 bytes per second)."""
    if text in PRESETS:
        return PRESETS[text]
    bw_text, _, lat_text = str(text).partition(":")
    bw = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([KMGT]?)(?:B/s|B)?\s*", bw_text, re.I)
    lat = re.fullmatch(r"\s*([0-9.eE+-]+)\s*(s|ms|us|µs|ns)?\s*", lat_text or "0")
    try:
        link = Link(float(bw.group(1)) * _BANDWIDTH_UNITS[bw.group(2).upper()],
                    float(lat.group(1)) * _TIME_UNITS[lat.group(2) or "s"])
    except (AttributeError, ValueError):
        link = None
    if link is None or link.bandwidth <= 0 or link.latency < 0:
        raise ValueError(f"invalid link {text!r}: use {', '.join(PRESETS)} or "
                         f"BANDWIDTH[:LATENCY] such as 50GB/s:5us")
    return link


ORDERS = ("node-aware", "interleaved")


@dataclass(frozen=True)
class Cluster:
    nodes: int
    per_node: int
    intra: Link
    inter: Link = PRESETS["ib-ndr"]
    nics: int = 1           # network cards per node
    gamma: float = 0.0      # seconds per byte reduced (0: reduction is free)

    def __post_init__(self):
        if self.nodes < 1 or self.per_node < 1 or self.nics < 1:
            raise ValueError("a cluster needs >= 1 node, device per node and NIC")
        if self.gamma < 0:
            raise ValueError("gamma must be >= 0")

    @property
    def world(self):
        return self.nodes * self.per_node

    def describe(self):
        text = f"{self.nodes} node{'s' if self.nodes > 1 else ''} x {self.per_node} devices " \
               f"= {self.world} ranks; inside a node {self.intra.describe()}"
        if self.nodes > 1:
            text += f"; between nodes {self.inter.describe()}, {self.nics} NIC" \
                    f"{'s' if self.nics > 1 else ''} per node"
        return text

    def placement(self, order="node-aware"):
        """The device of each rank.  node-aware: ranks of one node consecutive (rank r
        on node r // per_node); interleaved: consecutive ranks on different nodes (rank
        r on node r mod nodes); or an explicit sequence of device numbers."""
        ranks = np.arange(self.world)
        if order == "node-aware":
            return ranks
        if order == "interleaved":
            return (ranks % self.nodes) * self.per_node + ranks // self.nodes
        devices = np.asarray(order, dtype=np.int64)
        if sorted(devices.tolist()) != ranks.tolist():
            raise ValueError(f"a rank order must list each of the {self.world} devices once")
        return devices

    # Resources: device ports out / in, then NICs out / in; one bandwidth each.
    def resource_bandwidths(self):
        ports = np.full(2 * self.world, self.intra.bandwidth)
        nics = np.full(2 * self.nodes * self.nics, self.inter.bandwidth)
        return np.concatenate([ports, nics])

    def resource_name(self, index):
        w, cards = self.world, self.nodes * self.nics
        if index < 2 * w:
            device, way = index % w, ("out", "in")[index // w]
            return f"node{device // self.per_node}/dev{device % self.per_node} {way} " \
                   f"({self.intra.name or 'intra'})"
        index -= 2 * w
        card, way = index % cards, ("out", "in")[index // cards]
        return f"node{card // self.nics} NIC{card % self.nics} {way} ({self.inter.name or 'inter'})"

    def flow_resources(self, src_dev, dst_dev):
        """(first resource, second resource, crosses nodes) of each flow."""
        src_node, dst_node = src_dev // self.per_node, dst_dev // self.per_node
        crosses = src_node != dst_node
        w, cards = self.world, self.nodes * self.nics
        nic_out = 2 * w + src_node * self.nics + (src_dev % self.per_node) % self.nics
        nic_in = 2 * w + cards + dst_node * self.nics + (dst_dev % self.per_node) % self.nics
        first = np.where(crosses, nic_out, src_dev)
        second = np.where(crosses, nic_in, w + dst_dev)
        return first, second, crosses
