"""planner/trace/cache.py by hand, for its generated mutants (benchmarks/generated_mutants.py):
where the cache lives, the key worked out from its parts with hashlib, an entry's layout read back
as JSON, a round trip node for node and edge for edge, and each kind of bad entry read as absent.
Every test points MESHPLAN_CACHE at a folder of its own, so no test reads an entry another wrote
(the session's shared trace cache is never used)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from pathlib import Path

import pytest
from conftest import make_block

import planner
from planner.trace import cache
from planner.trace.cache import (
    TRACE_CODE,
    TRACE_FORMAT,
    cache_dir,
    code_hash,
    load_trace,
    save_trace,
    trace_code_hash,
    trace_key,
)
from planner.trace.graph import OpGraph


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_cache_lives_where_meshplan_cache_says_else_under_the_users_cache(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.setenv("MESHPLAN_CACHE", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "meshplan"
    monkeypatch.delenv("MESHPLAN_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "meshplan"


def test_the_code_hash_is_the_sha256_of_the_tracers_files():
    here = Path(planner.__file__).resolve().parent
    digest = hashlib.sha256()
    for name in TRACE_CODE:
        digest.update((here / name).read_bytes())
    assert trace_code_hash() == digest.hexdigest()[:16]
    assert (
        code_hash(("vocab.py",))
        == hashlib.sha256((here / "vocab.py").read_bytes()).hexdigest()[:16]
    )
    assert "trace/export.py" in TRACE_CODE and "modelfile.py" in TRACE_CODE


def _key_by_hand(sha: str, args: dict, batch: int, dtype: str) -> str:
    versions = {
        "torch": importlib.metadata.version("torch"),
        "format": TRACE_FORMAT,
        "code": trace_code_hash(),
        "transformers": importlib.metadata.version("transformers"),
    }
    payload = json.dumps([sha, args, batch, dtype, versions], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def test_the_key_hashes_the_file_its_arguments_batch_dtype_and_versions():
    args = {"size": "tiny", "layers": 2, "path": Path("/x")}  # a Path written by str()
    key = trace_key("ab" * 32, args, 2, "bf16")
    assert key == _key_by_hand("ab" * 32, args, 2, "bf16")
    assert len(key) == 32
    others = {
        trace_key("cd" * 32, args, 2, "bf16"),
        trace_key("ab" * 32, {**args, "layers": 3}, 2, "bf16"),
        trace_key("ab" * 32, args, 1, "bf16"),
        trace_key("ab" * 32, args, 2, "fp32"),
    }
    assert key not in others and len(others) == 4


def test_without_transformers_installed_the_key_leaves_its_version_out(monkeypatch):
    real = importlib.metadata.version

    def version(name: str) -> str:
        if name == "transformers":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(cache.importlib.metadata, "version", version)
    versions = {"torch": real("torch"), "format": TRACE_FORMAT, "code": trace_code_hash()}
    payload = json.dumps(["s", {}, 1, "bf16", versions], sort_keys=True, default=str)
    assert trace_key("s", {}, 1, "bf16") == hashlib.sha256(payload.encode()).hexdigest()[:32]


def _graph() -> OpGraph:
    """Three ops; b lacks the attribute only a has (``extra``); two edges."""
    g = OpGraph()
    g.graph.update(file="m.py", params=12, modules={"": "Net"})
    g.add_node("x", op="input", order=0, shapes=[[1, 2]], extra=None)
    g.add_node("a", op="aten.mm.default", order=1, shapes=[[1, 3]], extra={"k": [1, 2]})
    g.add_node("b", op="aten.relu.default", order=2, shapes=[[1, 3]], extra=7)
    g.add_edge("x", "a", bytes=8)
    g.add_edge("a", "b", bytes=12)
    g.add_edge("x", "b", bytes=5)
    return g


def test_an_entry_is_one_compact_document_of_rows_and_positions(own_cache):
    g = _graph()
    blocks = [make_block(0, "L"), make_block(1, "M")]
    save_trace("k1", g, blocks)
    path = own_cache / "traces" / "k1.json"
    text = path.read_text()
    entry = json.loads(text)
    assert text == json.dumps(entry, separators=(",", ":"))
    assert entry == {
        "format": TRACE_FORMAT,
        "graph": {"file": "m.py", "params": 12, "modules": {"": "Net"}},
        "names": ["x", "a", "b"],
        "fields": ["extra", "op", "order", "shapes"],
        "nodes": [
            [None, "input", 0, [[1, 2]]],
            [{"k": [1, 2]}, "aten.mm.default", 1, [[1, 3]]],
            [7, "aten.relu.default", 2, [[1, 3]]],
        ],
        "edges": [[0, 1, 8], [0, 2, 5], [1, 2, 12]],
        "blocks": [b.to_dict() for b in blocks],
    }


def test_an_entry_reads_back_node_for_node_and_edge_for_edge():
    g = _graph()
    blocks = [make_block(0, "L"), make_block(1, "M")]
    save_trace("k2", g, blocks)
    loaded = load_trace("k2")
    assert loaded is not None
    graph, back = loaded
    assert isinstance(graph, OpGraph)
    assert list(graph.nodes(data=True)) == list(g.nodes(data=True))
    assert list(graph.edges(data=True)) == list(g.edges(data=True))
    assert graph.graph == g.graph
    assert back == blocks
    assert load_trace("k3") is None  # another key
    save_trace("k3", g, [])  # a second entry in the folder the first made
    assert load_trace("k3") is not None and load_trace("k3")[1] == []


@pytest.mark.parametrize(
    "change",
    [
        lambda e: e.update(format=TRACE_FORMAT - 1),
        lambda e: e.pop("format"),
        lambda e: e.pop("names"),
        lambda e: e.pop("edges"),
        lambda e: e["edges"].append([0, 7, 1]),  # a position past the names
        lambda e: e["blocks"][0].update(nonsense=1),  # not a Block's field
        lambda e: e["blocks"][0].pop("index"),
        lambda e: e.update(nodes=5),
    ],
)
def test_a_bad_entry_reads_as_absent(change, own_cache):
    save_trace("k", _graph(), [make_block(0, "L")])
    path = own_cache / "traces" / "k.json"
    entry = json.loads(path.read_text())
    change(entry)
    path.write_text(json.dumps(entry))
    assert load_trace("k") is None


def test_a_file_that_is_not_json_or_not_there_reads_as_absent(own_cache):
    (own_cache / "traces").mkdir(parents=True)
    (own_cache / "traces" / "k.json").write_text("{not json")
    assert load_trace("k") is None
    assert load_trace("missing") is None
    (own_cache / "traces" / "d.json").mkdir()  # unreadable as a file
    assert load_trace("d") is None


def test_an_entry_that_cannot_be_written_is_skipped(tmp_path, monkeypatch, own_cache):
    save_trace("k", _graph(), [])
    before = (own_cache / "traces" / "k.json").read_text()
    bad = _graph()
    bad.nodes["a"]["shapes"] = {1, 2}  # a set: not JSON
    save_trace("k", bad, [])  # TypeError: the old entry stays
    assert (own_cache / "traces" / "k.json").read_text() == before
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("MESHPLAN_CACHE", str(blocker))  # its traces folder cannot be made
    save_trace("k", _graph(), [])
    assert blocker.read_text() == ""


MODEL = """
import torch
from torch import nn

TRAINING = {"global_batch_size": 2, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}


def build_model():
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def make_batch(batch_size, step=0):
    g = torch.Generator().manual_seed(step)
    return torch.randn(batch_size, 4, generator=g), torch.randint(0, 2, (batch_size,), generator=g)
"""


def test_a_traced_model_is_read_back_from_its_own_cache(tmp_path, own_cache):
    """Traced once into this test's cache, then read back: the same graph and blocks."""
    from planner.api import trace

    path = tmp_path / "mlp.py"
    path.write_text(MODEL)
    first = trace(path, traced_batch_size=1, dtype="fp32")
    assert not first.from_cache
    assert [p.name for p in (own_cache / "traces").iterdir()] == [f"{first.cache_key}.json"]
    again = trace(path, traced_batch_size=1, dtype="fp32")
    assert again.from_cache and again.cache_key == first.cache_key
    assert list(again.graph.nodes(data=True)) == list(first.graph.nodes(data=True))
    assert list(again.graph.edges(data=True)) == list(first.graph.edges(data=True))
    assert again.graph.graph == first.graph.graph
    assert again.blocks == first.blocks
