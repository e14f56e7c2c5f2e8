"""The block-deduplicated trace (planner/trace/repeats.py) against the full trace of the same
model: the same op graph node for node (names, every attribute, edges in order, the graph's
facts) and so the same blocks (op counts, FLOPs, bytes, saved bytes per block). The full trace
is the reference: ``MESHPLAN_FULL_TRACE=1`` forces it."""

from __future__ import annotations

import pytest

from planner.modelfile import load_model_file
from planner.trace import export
from planner.trace.blocks import make_blocks
from planner.trace.repeats import FULL_TRACE_ENV, Repeat

PATTERN = "tests/models/layer_pattern.py"
ZOO = "tests/zoo/zoo.py"


def both(path: str, args: dict, monkeypatch) -> tuple:
    """(full trace, deduplicated trace, the repeats the second wrote out)."""
    written = []
    expand = export.expand

    def counted(graph, r):
        written.append(r)
        return expand(graph, r)

    monkeypatch.setattr(export, "expand", counted)
    monkeypatch.setenv(FULL_TRACE_ENV, "1")
    full = export.trace_model(load_model_file(path, args), 1, "bf16")
    assert not written
    monkeypatch.setenv(FULL_TRACE_ENV, "0")
    dedup = export.trace_model(load_model_file(path, args), 1, "bf16")
    return full, dedup, written


def assert_same_trace(full, dedup) -> None:
    a, b = full.graph, dedup.graph
    assert list(a.nodes) == list(b.nodes)
    for n in a.nodes:
        assert a.nodes[n] == b.nodes[n], n
    assert list(a.edges(data=True)) == list(b.edges(data=True))
    assert a.graph == b.graph
    assert (full.method, full.note) == (dedup.method, dedup.note)
    blocks_a, blocks_b = make_blocks(a), make_blocks(b)
    assert [x.to_dict() for x in blocks_a] == [x.to_dict() for x in blocks_b]


@pytest.mark.parametrize(
    "pattern,layers,start,period",
    [
        ("plain", 8, 1, 1),  # layer 0 reads the embedding, the rest the layer before
        ("every3", 15, 3, 3),  # a gate on layers 2, 5, 8, 11, 14: periods of three from 3
        ("one_off", 12, 7, 1),  # layer 5 differs by its index, 6 reads it: traced to 9
    ],
)
def test_repeated_layers_trace_once_and_equal_the_full_trace(
    pattern, layers, start, period, monkeypatch
):
    full, dedup, written = both(PATTERN, {"layers": layers, "pattern": pattern}, monkeypatch)
    assert [(r.path, r.count, r.start, r.period) for r in written] == [
        ("layers", layers, start, period)
    ]
    assert_same_trace(full, dedup)
    # what makes the classes: 2 in "plain" (layer 0 reads another producer but computes
    # the same: one class), the gated layers their own class in "every3"
    classes = {b.cls for b in make_blocks(dedup.graph) if b.member}
    assert len(classes) == {"plain": 1, "every3": 2, "one_off": 2}[pattern]


def test_code_between_layers_traces_in_full(monkeypatch):
    """A residual from two layers back added in the loop, outside any layer: no cut."""
    full, dedup, written = both(PATTERN, {"layers": 8, "pattern": "skip"}, monkeypatch)
    assert written == []
    assert_same_trace(full, dedup)


def test_transformers_llama_equals_its_full_trace(monkeypatch):
    full, dedup, written = both("examples/llama.py", {"size": "tiny", "layers": 6}, monkeypatch)
    assert [(r.path, r.kept) for r in written] == [("model.layers", 4)]
    assert_same_trace(full, dedup)


# The zoo's families (tests/zoo/zoo.py) at a depth that leaves layers to write: decoder-only
# (GPT-2, OPT, Llama, Mistral, Gemma, Phi, GPT-NeoX, Falcon, Mixtral's MoE), encoders (BERT,
# RoBERTa, ViT), encoder-decoders (T5 with its position bias made by the first layer, BART,
# torch.nn.Transformer).
FAMILIES = [
    ("gpt2", 6), ("opt", 6), ("bert", 6), ("roberta", 6), ("t5", 8), ("bart", 6), ("vit", 6),
    ("llama", 6), ("mistral", 6), ("gemma", 6), ("phi", 6), ("gpt_neox", 6), ("falcon", 6),
    ("mixtral", 6), ("nn_transformer", 6),
]  # fmt: skip


@pytest.mark.zoo
@pytest.mark.parametrize("family,layers", FAMILIES)
def test_zoo_family_equals_its_full_trace(family, layers, monkeypatch):
    full, dedup, written = both(ZOO, {"family": family, "layers": layers}, monkeypatch)
    assert written, "no repeated layers found"
    assert_same_trace(full, dedup)


# transformers models whose layers differ by their index: Gemma 3's sliding-window and full
# attention alternating (two masks made outside the layers), Qwen3-MoE with experts in every
# second layer (dense MLPs between)
PATTERNED = [
    ("tests/models/gemma3.py", {"layers": 10}, (2, 2)),
    ("tests/models/qwen3_moe.py", {"layers": 10, "sparse_step": 2}, (2, 2)),
]


@pytest.mark.zoo
@pytest.mark.parametrize("path,args,start_period", PATTERNED)
def test_layers_differing_by_index_equal_the_full_trace(path, args, start_period, monkeypatch):
    full, dedup, written = both(path, args, monkeypatch)
    assert [(r.start, r.period) for r in written] == [start_period]
    assert_same_trace(full, dedup)


def test_the_eager_probe_captures_on_the_cut_model_and_in_full_past_it():
    """The probe of tensor-parallel variants captures each module's inputs in one meta
    forward: with the trace's repeats cut (the traced members and what follows them), and in
    full once a member past those is probed; its verdicts are those of the uncut capture.
    OPT's attention (a view fixing the head count) is rejected, its MLP is not."""
    from planner.api import trace
    from planner.cost.eager_probe import EagerShardProbe

    mf = load_model_file("tests/models/opt.py", {"size": "tiny", "layers": 8})
    traced = trace(mf, use_cache=False)
    assert [(r["path"], Repeat(**r).kept) for r in traced.repeats] == [("model.decoder.layers", 4)]
    cut_probe = EagerShardProbe(mf, "fp32", None, traced.repeats)
    full_probe = EagerShardProbe(mf, "fp32", None)
    for layer in ("model.decoder.layers.1", "model.decoder.layers.6"):
        attn = {f"{layer}.self_attn.{p}": "colwise" for p in ("q_proj", "k_proj", "v_proj")}
        attn[f"{layer}.self_attn.out_proj"] = "rowwise"
        mlp = {f"{layer}.fc1": "colwise", f"{layer}.fc2": "rowwise"}
        for cls, plan in ((f"attn{layer}", attn), (f"mlp{layer}", mlp)):
            got = cut_probe.reject(cls, layer, plan, 2)
            assert got == full_probe.reject(cls, layer, plan, 2)
            assert (got is not None) == cls.startswith("attn"), got
        # the cut capture reached layer 1; layer 6 had the full forward run for it
        assert cut_probe._repeats == ([] if layer.endswith("6") else traced.repeats)


def test_a_cached_trace_keeps_its_repeats_so_the_probe_captures_on_the_cut_model(
    tmp_path, monkeypatch
):
    """A re-plan reads the trace from the cache; its eager probe must still cut the repeated
    layers to the traced members. Without the repeats kept in the entry it ran the full
    model's meta forward (every one of a 70B's 80 layers, twice where plain meta fails)."""
    from planner.api import trace
    from planner.cost.eager_probe import EagerShardProbe

    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    mf = load_model_file("tests/models/opt.py", {"size": "tiny", "layers": 8})
    first = trace(mf)
    again = trace(mf)
    assert not first.from_cache and again.from_cache
    assert again.repeats == first.repeats != []
    probe = EagerShardProbe(mf, "fp32", None, again.repeats)
    layer = "model.decoder.layers.1"
    mlp = {f"{layer}.fc1": "colwise", f"{layer}.fc2": "rowwise"}
    assert probe.reject(f"mlp{layer}", layer, mlp, 2) is None
    # the forward that captured the inputs ran the cut model: layers past the kept ones
    # (4 of 8) were never reached
    assert f"{layer}.fc1" in probe._inputs
    assert "model.decoder.layers.6.fc1" not in probe._inputs
