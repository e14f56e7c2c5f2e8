"""Tests written for mutants mutmut generated that the suite let survive (docs/mutation.md lists
each survivor and the test here that kills it). Each states a number from a formula written
out here, at an input where the surviving change would alter it."""

from __future__ import annotations

import pytest

from planner.hardware.cluster import Cluster
from planner.hardware.collectives import collective_time, p2p_time, ring_factors
from planner.hardware.profiles import load_profile

B = 360e9  # bytes/s
ALPHA = 5e-6  # s


@pytest.mark.parametrize("nbytes", [0.5, 1.0, 2.0])
def test_a_send_of_a_byte_or_less_still_pays_its_latency(nbytes):
    """p2p_time's guard is "nothing to move" (S <= 0), not "little to move": S/B + alpha for
    any S > 0 (killed: ``if nbytes <= 1: return 0.0``)."""
    assert p2p_time(nbytes, B, ALPHA) == pytest.approx(nbytes / B + ALPHA, rel=1e-12)


def test_an_all_to_all_of_one_byte_across_nodes_goes_through_each_ranks_nic():
    """2 nodes x 8 H100s, 1 byte per rank: 8/16 of it crosses each rank's own NIC while 7/16
    crosses NVLink, as for a gigabyte (tests/test_collectives.py); the NIC path is taken for
    any S > 0 (killed: ``nbytes > 1`` sending a byte by the ring formula)."""
    cluster = Cluster(load_profile("h100-sxm"), nodes=2, gpus_per_node=8)
    p = cluster.profile
    nic = p.inter_node_bandwidth * p.collective_efficiency
    nvl = p.intra_node_bandwidth * p.collective_efficiency
    want = max(8 / 16 / nic, 7 / 16 / nvl) + 15 * p.inter_node_latency + p.collective_sync
    assert collective_time("all_to_all", 1.0, cluster, list(range(16))) == pytest.approx(
        want, rel=1e-12
    )


def test_an_unknown_collective_kind_is_named_in_the_error():
    """ring_factors says which kind it does not know (killed: ``ValueError(None)``)."""
    with pytest.raises(ValueError, match="unknown collective 'allreduce'"):
        ring_factors("allreduce", 4)
