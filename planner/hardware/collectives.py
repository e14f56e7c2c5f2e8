"""Collective and point-to-point times under the alpha-beta ring model.

With n ranks, S bytes (the full, gathered buffer), bus bandwidth B and per-step latency alpha,
the bandwidth terms are the ideal times of nccl-tests doc/PERFORMANCE.md (busbw = algbw x factor,
shared/reference/hardware.md nccl_bus_bandwidth_factors) and each of a ring's steps pays alpha:

    all-reduce                    2 (n-1)/n * S/B + 2 (n-1) alpha
    all-gather, reduce-scatter      (n-1)/n * S/B +   (n-1) alpha
    all-to-all                      (n-1)/n * S/B +   (n-1) alpha   (in a node; across nodes
                                  the rank's own NIC: Cluster.all_to_all_seconds_per_byte)
    point-to-point                          S/B +         alpha

Every function returns 0.0 when there is nothing to move (n <= 1 or no bytes).

``collective_time`` adds the profile's ``collective_sync_s`` once per call: what a blocking
collective issued between compute phases costs beyond its ring (the ranks arrive apart and the
one that waited must be woken), measured in situ by plan calibrate. Point-to-point transfers do
not pay it: a pipeline's receiver waits out its bubble, which the schedule already prices.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planner.hardware.cluster import Cluster


def ring_factors(kind: str, n: int) -> tuple[float, float]:
    """(bandwidth factor c, latency steps d) of ``kind`` over ``n`` ranks: t = c * S/B + d
    alpha. The one statement of the ring model; everything that prices or fits a collective
    (these functions, the sharding ILP, the calibration fit) reads it from here."""
    if kind == "all_reduce":
        return 2 * (n - 1) / n, 2 * (n - 1)
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n, n - 1
    if kind == "p2p":
        return 1.0, 1.0
    raise ValueError(f"unknown collective {kind!r}")


def _ring_time(kind: str, nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    if n <= 1 or nbytes <= 0:
        return 0.0
    c, d = ring_factors(kind, n)
    return c * nbytes / bandwidth + d * latency


def all_reduce_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Ring all-reduce of an S-byte buffer: a reduce-scatter then an all-gather."""
    return _ring_time("all_reduce", nbytes, n, bandwidth, latency)


def all_gather_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Ring all-gather into an S-byte result (S/n bytes from each rank)."""
    return _ring_time("all_gather", nbytes, n, bandwidth, latency)


def reduce_scatter_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Ring reduce-scatter of an S-byte input (S/n bytes kept by each rank)."""
    return _ring_time("reduce_scatter", nbytes, n, bandwidth, latency)


def all_to_all_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """All-to-all of S bytes per rank (S/n to each peer, its own share stays)."""
    return _ring_time("all_to_all", nbytes, n, bandwidth, latency)


def p2p_time(nbytes: float, bandwidth: float, latency: float) -> float:
    """One send/receive of S bytes: S/B + alpha."""
    if nbytes <= 0:
        return 0.0
    c, d = ring_factors("p2p", 2)
    return c * nbytes / bandwidth + d * latency


KINDS: dict[str, Callable[[float, int, float, float], float]] = {
    "all_reduce": all_reduce_time,
    "all_gather": all_gather_time,
    "reduce_scatter": reduce_scatter_time,
    "all_to_all": all_to_all_time,
}


def collective_time(kind: str, nbytes: float, cluster: Cluster, ranks: Sequence[int]) -> float:
    """Time of one ``kind`` collective of ``nbytes`` over ``ranks``, at the bandwidth and latency
    of the slowest link the group uses (``Cluster.link``)."""
    try:
        formula = KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown collective {kind!r}; expected one of {sorted(KINDS)}") from None
    bandwidth, latency = cluster.link(ranks)
    if kind == "all_to_all" and len(ranks) > 1 and nbytes > 0:
        # each rank's own NIC, not the ring's bus bandwidth (Cluster.all_to_all_seconds_per_byte)
        t = nbytes * cluster.all_to_all_seconds_per_byte(ranks)
        t += ring_factors(kind, len(ranks))[1] * latency
    else:
        t = formula(nbytes, len(ranks), bandwidth, latency)
    return t + cluster.profile.collective_sync if t > 0 else 0.0
