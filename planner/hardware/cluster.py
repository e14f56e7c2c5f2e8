"""The cluster: how many devices, how they are grouped into nodes, and the links between them.

Ranks fill nodes in order (rank // gpus_per_node), as torchrun assigns them, so a group of
consecutive ranks inside one node talks over NVLink and any group that crosses a node boundary
is limited by the per-GPU network link.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planner.errors import UserInputError
from planner.hardware.profiles import DeviceProfile, default_profile_name, load_profile


@dataclass(frozen=True)
class Cluster:
    """``nodes`` identical nodes of ``gpus_per_node`` devices described by ``profile``."""

    profile: DeviceProfile
    nodes: int
    gpus_per_node: int

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError(f"a cluster needs >= 1 node and GPU per node, got {self}")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        """The node that holds global ``rank``."""
        if not 0 <= rank < self.gpus:
            raise ValueError(f"rank {rank} is outside a cluster of {self.gpus} GPUs")
        return rank // self.gpus_per_node

    def ranks_per_node(self, ranks: Sequence[int]) -> Counter[int]:
        """How many of ``ranks`` each node holds (``node_of`` of each, counted). Counted in C:
        a data-parallel group of Llama-3-405B on 16,384 GPUs holds thousands of ranks and
        every priced collective asks (4.6 million ``node_of`` calls were a third of that
        plan's time)."""
        if ranks and not (0 <= min(ranks) and max(ranks) < self.gpus):
            self.node_of(next(r for r in ranks if not 0 <= r < self.gpus))  # raises, naming it
        return Counter(r // self.gpus_per_node for r in ranks)

    def _spread(self, ranks: Sequence[int]) -> tuple[int, int, int]:
        """(nodes, fewest, most of ``ranks`` on one of them), kept per group: pricing asks
        for the same few groups thousands of times (Llama-3-405B on 16,384 GPUs: 11,000 links
        of data-parallel groups of up to 16,384 ranks, a tenth of the plan's CPU counting
        them), and hashing a group is ten times cheaper than counting it."""
        return _spread(self, tuple(ranks))

    def spans_nodes(self, ranks: Sequence[int]) -> bool:
        """Whether a group over ``ranks`` has to cross the inter-node network."""
        return len({self.node_of(r) for r in ranks}) > 1

    def link(self, ranks: Sequence[int]) -> tuple[float, float]:
        """(bus bandwidth in B/s, latency in s) a collective over ``ranks`` runs at.

        Inside a node: the per-GPU NVLink rate. Across k nodes: every GPU has its own NIC
        (DGX/HGX: one per GPU), and NCCL runs one ring per NIC, so each node's g ranks of the
        group move a collective's inter-node share over g NICs at once. A ring all-gather of
        S bytes over n ranks must bring (k - 1)/k S into every node: it takes
        (k - 1)/k S / (g B_nic), which is the ring formula (n - 1)/n S / busbw with
        busbw = B_nic g k (n - 1) / (n (k - 1)) = B_nic (n - 1)/(k - 1) for n = g k
        (nccl-tests PERFORMANCE.md; hardware.md nccl_bus_bandwidth_factors note: "per-GPU NIC
        rate ~= busbw (k - 1)/(n - 1)", which 4 x 8 B200 reproduce: 36.5 GB/s NIC -> 377 GB/s
        busbw). One rank per node (g = 1) gives B_nic; the result is capped by NVLink, which
        the ring also crosses. The node with the fewest of the group's ranks sets g. Either
        rate is scaled by the share of link bandwidth ring collectives reach (hardware.md
        measured_collective_bandwidth).
        """
        p = self.profile
        k, g, _ = self._spread(ranks)
        if k > 1:
            n = len(ranks)
            bus = p.inter_node_bandwidth * g * k * (n - 1) / (n * (k - 1))
            bus = min(bus, p.intra_node_bandwidth)
            return bus * p.collective_efficiency, p.inter_node_latency
        return p.intra_node_bandwidth * p.collective_efficiency, p.intra_node_latency

    def all_to_all_seconds_per_byte(self, ranks: Sequence[int]) -> float:
        """Seconds per byte each rank holds (and, the exchange being symmetric, receives) in an
        all-to-all over ``ranks``.

        Not the ring formula over ``link``'s bus bandwidth: a ring all-gather brings only each
        node's (k - 1)/k share across the network and spreads it over the node's g NICs, but
        an all-to-all sends every rank's share bound for other nodes, (n - g)/n of its bytes,
        through that rank's own NIC, while its (g - 1)/n share for its node's ranks crosses
        NVLink at the same time. Across nodes the NIC is the bottleneck, about g times slower
        per byte than the ring bus bandwidth (64 H100s: 50 GB/s per NIC against a 360 GB/s
        bus). The rank on the node with the fewest of the group's ranks sends the most across;
        the one on the fullest node, the most over NVLink."""
        n = len(ranks)
        if n <= 1:
            return 0.0
        p = self.profile
        k, least, most = self._spread(ranks)
        intra = (most - 1) / n / (p.intra_node_bandwidth * p.collective_efficiency)
        if k == 1:
            return intra
        inter = (n - least) / n / (p.inter_node_bandwidth * p.collective_efficiency)
        return max(intra, inter)


@functools.lru_cache(maxsize=64)
def _spread(cluster: Cluster, ranks: tuple[int, ...]) -> tuple[int, int, int]:
    per_node = cluster.ranks_per_node(ranks)
    return len(per_node), min(per_node.values(), default=0), max(per_node.values(), default=0)


def make_cluster(
    gpus: int | None,
    profile: str | None = None,
    gpus_per_node: int | None = None,
    nodes: int | None = None,
) -> tuple[Cluster, list[str]]:
    """Build the cluster from the command-line flags; the notes tell the user what was chosen.

    ``--gpus N`` alone gives ceil(N / gpus_per_node) full nodes, or one partial node when N is
    below a node's size; ``--nodes M`` alone gives M full nodes; both must agree.
    """
    for flag, value in (("--gpus", gpus), ("--nodes", nodes), ("--gpus-per-node", gpus_per_node)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value <= 0
        ):
            raise UserInputError(f"{flag} must be a positive integer, got {value}")
    if gpus is None and nodes is None:
        raise UserInputError("say how many GPUs to plan for: --gpus N (or --nodes M)")
    notes: list[str] = []
    if profile is None:
        profile, reason = default_profile_name()
        notes.append(f"profile {profile}: {reason}")
    prof = load_profile(profile)
    per_node = gpus_per_node or prof.gpus_per_node
    if nodes is not None:
        if gpus is None:
            gpus = nodes * per_node
        elif nodes * per_node != gpus:
            hint = (
                f"--gpus-per-node {gpus // nodes}"
                if gpus % nodes == 0
                else f"--gpus {nodes * per_node}"
            )
            raise UserInputError(
                f"--nodes {nodes} with {per_node} GPUs per node hold {nodes * per_node} GPUs, "
                f"not --gpus {gpus}: make them agree (e.g. {hint})"
            )
        return Cluster(prof, nodes, per_node), notes
    assert gpus is not None
    if gpus < per_node:
        notes.append(f"{gpus} GPUs fill part of one {per_node}-GPU node: planning 1 node of {gpus}")
        return Cluster(prof, 1, gpus), notes
    if gpus % per_node:
        lower, upper = gpus // per_node * per_node, (gpus // per_node + 1) * per_node
        raise UserInputError(
            f"--gpus {gpus} does not fill nodes of {per_node} GPUs: use a multiple of {per_node} "
            f"(e.g. {lower} or {upper}), or set --gpus-per-node"
        )
    return Cluster(prof, gpus // per_node, per_node), notes


def cluster_to_dict(c: Cluster) -> dict[str, Any]:
    """The cluster as recorded in plan.json."""
    return {
        "profile": c.profile.name,
        "nodes": c.nodes,
        "gpus_per_node": c.gpus_per_node,
        "gpus": c.gpus,
    }
