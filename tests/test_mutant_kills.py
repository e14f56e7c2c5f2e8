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


# --------------------------------------------------------------------------- make_cluster
# (its surviving mutants: tests of the flags' messages and of the node count's type)


def test_nodes_alone_give_full_nodes_of_the_profile():
    from planner.hardware.cluster import make_cluster

    c, notes = make_cluster(None, "h100-sxm", nodes=2)
    assert (c.profile.name, c.nodes, c.gpus_per_node, c.gpus, notes) == ("h100-sxm", 2, 8, 16, [])


@pytest.mark.parametrize("gpus, nodes", [(16, None), (8, None), (None, 2)])
def test_whole_nodes_are_counted_in_integers(gpus, nodes):
    """plan.json records the node count: 2, never 2.0."""
    from planner.hardware.cluster import cluster_to_dict, make_cluster

    c, notes = make_cluster(gpus, "h100-sxm", nodes=nodes)
    d = cluster_to_dict(c)
    assert type(d["nodes"]) is int and type(d["gpus"]) is int
    assert d["gpus"] == (gpus or 16) and notes == []  # a whole node is no "part of one"


def test_a_partial_node_is_said():
    from planner.hardware.cluster import make_cluster

    c, notes = make_cluster(4, "h100-sxm")
    assert (c.nodes, c.gpus_per_node) == (1, 4)
    assert notes == ["4 GPUs fill part of one 8-GPU node: planning 1 node of 4"]


@pytest.mark.parametrize(
    "gpus, nodes, message",
    [
        (None, None, "say how many GPUs to plan for: --gpus N (or --nodes M)"),
        (2.5, None, "--gpus must be a positive integer, got 2.5"),
        (True, None, "--gpus must be a positive integer, got True"),
        (12, None, "--gpus 12 does not fill nodes of 8 GPUs: use a multiple of 8 (e.g. 8 or 16)"),
        (24, 2, "(e.g. --gpus-per-node 12)"),
        (13, 2, "hold 16 GPUs, not --gpus 13: make them agree (e.g. --gpus 16)"),
    ],
)
def test_cluster_flags_that_disagree_say_what_would_agree(gpus, nodes, message):
    from planner.errors import UserInputError
    from planner.hardware.cluster import make_cluster

    with pytest.raises(UserInputError) as err:
        make_cluster(gpus, "h100-sxm", nodes=nodes)
    assert message in str(err.value)
    if gpus is None:  # the whole line
        assert str(err.value) == message


def test_one_rank_exchanges_nothing_in_an_all_to_all():
    cluster = Cluster(load_profile("h100-sxm"), nodes=2, gpus_per_node=8)
    assert cluster.all_to_all_seconds_per_byte([9]) == 0.0


def test_a_cluster_without_nodes_or_gpus_is_refused_by_name():
    prof = load_profile("h100-sxm")
    for nodes, per_node in ((0, 8), (1, 0)):
        with pytest.raises(ValueError, match="a cluster needs >= 1 node and GPU per node"):
            Cluster(prof, nodes, per_node)
    with pytest.raises(ValueError, match="rank 16 is outside a cluster of 16 GPUs"):
        Cluster(prof, 2, 8).node_of(16)


def test_one_rank_on_each_of_three_nodes_runs_at_one_nic():
    """g = 1 rank per node on k = 3 nodes, n = 3: busbw = B_nic g k (n - 1) / (n (k - 1)) =
    B_nic (Cluster.link); at 2 nodes (k - 1 = 1) a slip between n (k - 1) and n / (k - 1)
    would not show, at 3 it is 4 times off."""
    cluster = Cluster(load_profile("h100-sxm"), nodes=3, gpus_per_node=8)
    p = cluster.profile
    bw, latency = cluster.link([0, 8, 16])
    assert bw == pytest.approx(p.inter_node_bandwidth * p.collective_efficiency, rel=1e-12)
    assert latency == p.inter_node_latency
