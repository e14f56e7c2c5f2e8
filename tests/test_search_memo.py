"""What one planning run keeps and reuses (issue 52's warm path) must be what it would compute
again: each block's TP variants bound once per (block, TP degree, pipelined), and priced options
shared by blocks whose variants are equal, checked against fresh computations with no memo."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.api import trace, variants_for
from planner.hardware.cluster import make_cluster
from planner.search.candidates import Pins
from planner.search.options import price_options
from planner.training import training_from

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny():
    traced = trace(ROOT / "examples/gpt.py", {"size": "tiny"})
    cluster, _ = make_cluster(8, "h100-sxm")
    return traced, cluster


def two_of_one_class(blocks):
    """The first two blocks that share a class (the transformer layers of the tiny GPT)."""
    seen = {}
    for b in blocks:
        if b.cls in seen:
            return seen[b.cls], b
        seen[b.cls] = b
    raise AssertionError("the tiny GPT has no repeated block")


def test_variants_bound_once_per_block_equal_fresh_ones(tiny):
    traced, cluster = tiny
    first, second = two_of_one_class(traced.blocks)
    kept = variants_for(traced.graph, cluster, "auto", {})
    for block in (first, second):
        for tp in (1, 2, 4):
            for pipelined in (False, True):
                fresh = variants_for(traced.graph, cluster, "auto")(block, tp, pipelined)
                assert kept(block, tp, pipelined) == fresh
                assert kept(block, tp, pipelined) == fresh  # the kept copy, asked again
    # the key tells the two blocks of one class apart: each is bound to its own module names
    a, b = kept(first, 2), kept(second, 2)
    sharded_a = [v for v in a if v.tp_plan]
    sharded_b = [v for v in b if v.tp_plan]
    assert sharded_a and sharded_b
    assert set(sharded_a[0].tp_plan).isdisjoint(sharded_b[0].tp_plan)
    # a caller changing the list it got does not change what the next caller gets
    kept(first, 2).clear()
    assert kept(first, 2) == a


def test_priced_options_kept_equal_fresh_ones(tiny):
    traced, cluster = tiny
    training = training_from({}, "gpt.py", global_batch_size=8)
    variants_of = variants_for(traced.graph, cluster, "auto", {})
    memo: dict = {}
    for tp in (1, 2):
        for mbs in (1, 2):
            for pipelined in (False, True):
                args = (traced.graph, traced.blocks, tp, mbs, cluster, training, Pins())
                kept = price_options(*args, variants_of, memo=memo, pipelined=pipelined)
                fresh = price_options(*args, variants_for(traced.graph, cluster, "auto"),
                                      pipelined=pipelined)  # fmt: skip
                assert kept == fresh
    # keyed by the variants' value: a class whose variants are the same pipelined or not is
    # priced once for both, so fewer entries than (class, tp, mbs, pipelined) combinations
    classes = len({b.cls for b in traced.blocks})
    assert len(memo) < classes * 2 * 2 * 2
