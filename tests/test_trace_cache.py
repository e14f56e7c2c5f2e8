"""The caches a re-plan reads: the compact trace entry gives back the graph the tracer made (every
op's attributes, the edges in their order) and the blocks ``make_blocks`` finds on it; the sharding
ILP's solutions, kept beside it, make the same plan without solving any ILP again."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.api import plan, trace
from planner.cost import sharding
from planner.cost.variant_cache import load_variants, variants_path
from planner.schema import dumps
from planner.trace.blocks import make_blocks
from planner.trace.cache import load_trace

ROOT = Path(__file__).resolve().parent.parent
MODELS = [  # a transformer, a mixture of experts with a tied head, an MLP
    ("gpt.py", {"size": "tiny"}),
    ("moe.py", {"size": "tiny"}),
    ("mlp.py", {"size": "small"}),
]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))


@pytest.mark.parametrize("model, args", MODELS)
def test_entry_gives_back_the_traced_graph_and_its_blocks(model, args):
    fresh = trace(ROOT / "examples" / model, args)
    assert not fresh.from_cache
    graph, blocks = load_trace(fresh.cache_key)
    assert list(graph.nodes(data=True)) == list(fresh.graph.nodes(data=True))
    assert list(graph.edges(data=True)) == list(fresh.graph.edges(data=True))
    # predecessors in the order networkx's node-link form read them back (as before)
    for n in graph:
        assert sorted(graph.predecessors(n)) == sorted(fresh.graph.predecessors(n))
    assert graph.graph == fresh.graph.graph
    assert blocks == fresh.blocks == make_blocks(graph)
    again = trace(ROOT / "examples" / model, args)
    assert again.from_cache and again.blocks == fresh.blocks


def test_a_corrupt_entry_is_traced_again(tmp_path):
    fresh = trace(ROOT / "examples" / "gpt.py")
    path = tmp_path / "traces" / f"{fresh.cache_key}.json"
    path.write_text(path.read_text()[:1000])
    assert load_trace(fresh.cache_key) is None
    again = trace(ROOT / "examples" / "gpt.py")
    assert not again.from_cache and again.blocks == fresh.blocks
    assert load_trace(fresh.cache_key) is not None  # and written anew


def test_replan_reads_the_sharding_solutions_and_solves_none(monkeypatch):
    args = dict(model_args={"size": "tiny"}, global_batch_size=16)
    first = plan(ROOT / "examples" / "gpt.py", 8, **args).plan
    kept = load_variants(trace(ROOT / "examples" / "gpt.py", {"size": "tiny"}).cache_key)
    assert kept and any(key[1] > 1 for key in kept)  # sharded degrees were solved and kept
    assert variants_path(trace(ROOT / "examples" / "gpt.py", {"size": "tiny"}).cache_key).exists()

    def no_ilp(*a, **k):
        raise AssertionError("a re-plan must read the sharding ILP's solutions")

    monkeypatch.setattr(sharding, "sharding_milp", no_ilp)
    second = plan(ROOT / "examples" / "gpt.py", 8, **args).plan
    first.solver.solve_time_s = second.solver.solve_time_s = 0.0
    assert dumps(second) == dumps(first)
