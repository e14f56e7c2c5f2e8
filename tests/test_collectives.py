"""The alpha-beta ring times equal the nccl-tests formulas, written out independently here:
busbw = algbw * factor with algbw = S / t, so t = S * factor / B, plus one alpha per ring step."""

from __future__ import annotations

import pytest

from planner.hardware.cluster import Cluster
from planner.hardware.collectives import (
    all_gather_time,
    all_reduce_time,
    all_to_all_time,
    collective_time,
    p2p_time,
    reduce_scatter_time,
)
from planner.hardware.profiles import load_profile

B = 360e9  # bytes/s
ALPHA = 5e-6  # s
CASES = [(n, s) for n in (2, 4, 8, 64) for s in (1.0, 4096.0, 1e9)]


@pytest.mark.parametrize("n, s", CASES)
def test_all_reduce(n, s):
    busbw_factor = 2 * (n - 1) / n
    algbw = B / busbw_factor
    expected = s / algbw + 2 * (n - 1) * ALPHA
    assert all_reduce_time(s, n, B, ALPHA) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("fn", [all_gather_time, reduce_scatter_time, all_to_all_time])
@pytest.mark.parametrize("n, s", CASES)
def test_gather_scatter_all_to_all(fn, n, s):
    expected = s * (n - 1) / (B * n) + (n - 1) * ALPHA
    assert fn(s, n, B, ALPHA) == pytest.approx(expected, rel=1e-12)


def test_p2p():
    assert p2p_time(1e9, B, ALPHA) == pytest.approx(1e9 / B + ALPHA)
    assert p2p_time(0, B, ALPHA) == 0.0


@pytest.mark.parametrize(
    "fn", [all_reduce_time, all_gather_time, reduce_scatter_time, all_to_all_time]
)
def test_nothing_to_move(fn):
    assert fn(1e9, 1, B, ALPHA) == 0.0
    assert fn(1e9, 0, B, ALPHA) == 0.0
    assert fn(0, 8, B, ALPHA) == 0.0


def test_all_reduce_is_reduce_scatter_plus_all_gather():
    assert all_reduce_time(1e9, 8, B, ALPHA) == pytest.approx(
        reduce_scatter_time(1e9, 8, B, ALPHA) + all_gather_time(1e9, 8, B, ALPHA)
    )


def test_collective_time_uses_the_group_link():
    cluster = Cluster(load_profile("h100-sxm"), nodes=2, gpus_per_node=8)
    p = cluster.profile
    intra = collective_time("all_reduce", 1e9, cluster, [0, 1, 2, 3])
    bw = p.intra_node_bandwidth * p.collective_efficiency
    assert intra == pytest.approx(all_reduce_time(1e9, 4, bw, p.intra_node_latency))
    cross = collective_time("all_reduce", 1e9, cluster, [0, 1, 8, 9])
    # 2 ranks on each of 2 nodes, each with its own NIC: busbw = B_nic (n - 1)/(k - 1)
    bw = 3 * p.inter_node_bandwidth * p.collective_efficiency
    assert cross == pytest.approx(all_reduce_time(1e9, 4, bw, p.inter_node_latency))
    assert cross > intra
    assert collective_time("all_gather", 1e9, cluster, [5]) == 0.0
    with pytest.raises(ValueError, match="all_reduce"):
        collective_time("allreduce", 1e9, cluster, [0, 1])


def test_all_to_all_across_nodes_goes_through_each_ranks_nic():
    """An all-to-all of S bytes per rank over 2 nodes x 8 GPUs: each rank sends 8/16 of S to
    the other node through its own NIC and 7/16 over NVLink at the same time, so the NIC sets
    the time; a ring all-gather of the same bytes spreads the crossing over the node's 8 NICs,
    which is why the ring's bus bandwidth does not apply (per-NIC: 8 times slower here)."""
    cluster = Cluster(load_profile("h100-sxm"), nodes=2, gpus_per_node=8)
    p = cluster.profile
    nic = p.inter_node_bandwidth * p.collective_efficiency
    nvl = p.intra_node_bandwidth * p.collective_efficiency
    s = 1e9
    want = max(s * 8 / 16 / nic, s * 7 / 16 / nvl) + 15 * p.inter_node_latency
    got = collective_time("all_to_all", s, cluster, list(range(16)))
    assert got == pytest.approx(want + p.collective_sync)
    ring = all_to_all_time(s, 16, *cluster.link(list(range(16))))
    assert got > 4 * ring
    # inside one node the ring formula holds
    inside = collective_time("all_to_all", s, cluster, list(range(8)))
    assert inside == pytest.approx(
        all_to_all_time(s, 8, nvl, p.intra_node_latency) + p.collective_sync
    )
