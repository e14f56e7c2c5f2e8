"""Models no one here wrote (transformers GPT-2 and OPT at tiny size): what the planner
records and decides for their tied weights and their attention code, checked against the
models themselves. The runtime oracle (test_runtime_oracle.py) trains them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from planner import api
from planner.api import plan, trace
from planner.cost.eager_probe import EagerShardProbe
from planner.modelfile import load_model_file
from planner.search import Pins

MODELS = Path(__file__).resolve().parent / "models"
ROOT = MODELS.parent.parent


@pytest.fixture(scope="module", params=["gpt2", "opt"])
def tied_model(request):
    mf = load_model_file(MODELS / f"{request.param}.py", {"size": "tiny"})
    return request.param, mf, trace(mf, dtype="fp32", use_cache=False)


def test_the_tracer_records_the_tied_output_projection(tied_model):
    """The output projection reads the token embedding: the first block owns it, the last
    block lists it as tied with its element count, and the model's parameters are counted
    once (as torch counts them)."""
    _, mf, traced = tied_model
    model = mf.build()
    embedding = model.get_input_embeddings().weight
    owners = [b for b in traced.blocks if b.tied]
    assert len(owners) == 1 and owners[0] is traced.blocks[-1]
    ((name, numel),) = owners[0].tied.items()
    assert numel == embedding.numel()
    assert name in traced.blocks[0].param_names
    assert traced.params == sum(p.numel() for p in model.parameters())


def test_tensor_parallel_splits_a_tied_weight_along_its_vocabulary_in_every_use(tied_model):
    """At TP 2 both uses of the tied weight split it along its first dimension (a row-parallel
    lookup, a column-parallel head: Megatron's vocab-parallel pair), in every variant of both
    blocks, so the runtime keeps one tensor whichever the solver picks; with a pipeline (the
    last stage's traced head has no module to carry a style) neither use gets a style."""
    name, mf, traced = tied_model
    model = mf.build()
    tied_modules = {
        n.rpartition(".")[0]
        for n, p in model.named_parameters(remove_duplicate=False)
        if p is model.get_input_embeddings().weight
    }
    assert len(tied_modules) == 2
    result = plan(
        mf, 2, profile="cpu", dtype="fp32", use_cache=False,
        pins=Pins(tp=2, dp=1, pp=1, tp_variant="sharded"),
    )  # fmt: skip
    styles = {fqn: s for b in result.plan.blocks for fqn, s in b.tp_plan.items()}
    assert {styles.get(m, "").split("_")[0] for m in tied_modules} == {"rowwise", "colwise"}
    graph = traced.graph
    variants = api.variants_for(graph, result.cluster)
    for block in (b for b in traced.blocks if set(b.modules) & tied_modules):
        for v in variants(block, 2):
            assert set(v.tp_plan) & tied_modules, (block.modules, v.name)
        for v in variants(block, 2, True):
            assert not set(v.tp_plan) & tied_modules, (block.modules, v.name)
    piped = plan(
        mf, 4, profile="cpu", dtype="fp32", use_cache=False,
        pins=Pins(tp=2, dp=1, pp=2, tp_variant="sharded"),
    )  # fmt: skip
    assert not {fqn for b in piped.plan.blocks for fqn in b.tp_plan} & tied_modules


def _megatron_attention(layer: str, out: str) -> dict[str, str]:
    """Column-parallel q, k and v projections and a row-parallel output projection."""
    attn = {f"{layer}.self_attn.{p}": "colwise" for p in ("q_proj", "k_proj", "v_proj")}
    attn[f"{layer}.self_attn.{out}"] = "rowwise"
    return attn


def test_the_eager_probe_rejects_a_view_that_fixes_the_head_count():
    """OPT writes view(bsz, -1, num_heads, head_dim): a column-parallel q_proj shard would be
    read as half the sequence. The probe says so; Llama's view(..., -1, head_dim) passes."""
    opt = load_model_file(MODELS / "opt.py", {"size": "tiny"})
    probe = EagerShardProbe(opt, "fp32", {})
    layer = "model.decoder.layers.0"
    attn = _megatron_attention(layer, "out_proj")
    why = probe.reject("opt-layer", layer, attn, 2)
    assert why is not None and "view(batch, -1, heads, head_dim)" in why
    assert probe.unsafe_outputs("opt-layer", layer, attn, 2) == {"self_attn.q_proj"}
    # the attribute the view reads the count from, set to its local value, reads it right
    assert probe.local_attributes("opt-layer", layer, attn, 2) == [f"{layer}.self_attn.num_heads"]
    assert (
        probe.reject("opt-mlp", layer, {f"{layer}.fc1": "colwise", f"{layer}.fc2": "rowwise"}, 2)
        is None
    )
    llama = load_model_file(MODELS.parent.parent / "examples" / "llama.py", {"size": "tiny"})
    lprobe = EagerShardProbe(llama, "fp32", {})
    attn = "model.layers.0.self_attn"
    styles = {f"{attn}.{p}": "colwise" for p in ("q_proj", "k_proj", "v_proj")}
    assert (
        lprobe.reject("llama", "model.layers.0", {**styles, f"{attn}.o_proj": "rowwise"}, 2) is None
    )


def test_the_eager_probe_cannot_tell_where_the_whole_block_fails_too():
    """Qwen2-MoE's grouped experts call torch's grouped product, whose meta kernel takes bf16
    only: in fp32 the block fails on the meta device whole, before any shard is involved. The
    probe cannot tell then, which is no reason to refuse the shards (it refused Megatron's
    attention split of every fp32 transformers MoE layer, blaming the shards)."""
    mf = load_model_file(MODELS / "qwen2_moe.py", {"size": "tiny"})
    probe = EagerShardProbe(mf, "fp32", {})
    layer = "model.layers.0"
    assert probe.reject("qwen2-moe-layer", layer, _megatron_attention(layer, "o_proj"), 2) is None


def test_the_eager_probe_reaches_blocks_behind_data_checks_and_blames_the_shard():
    """StableLM's forward makes position ids, which transformers' mask code inspects with
    .all() (a meta tensor has no data; a fake one reads as tracing), then views q with the
    module's own head count, which a column-parallel shard fails: the probe reaches the layer
    under fake tensors and blames q_proj. Its q views by num_heads and its k and v by
    num_key_value_heads: with both set to their local counts the layer reads its shards
    right, so the planner splits it by heads on plain local tensors."""
    mf = load_model_file(MODELS / "stablelm.py", {"size": "tiny"})
    probe = EagerShardProbe(mf, "fp32", {})
    layer = "model.layers.0"
    attn = _megatron_attention(layer, "o_proj")
    why = probe.reject("stablelm-layer", layer, attn, 2)
    assert why is not None and "fails on local shards" in why
    assert probe.unsafe_outputs("stablelm-layer", layer, attn, 2) == {"self_attn.q_proj"}
    result = plan(
        mf, 2, profile="cpu", dtype="fp32", use_cache=False,
        pins=Pins(tp=2, dp=1, pp=1, tp_variant="sharded"),
    )  # fmt: skip
    attn = f"{layer}.self_attn"
    assert probe.local_attributes(
        "stablelm-layer", layer, _megatron_attention(layer, "o_proj"), 2
    ) == [
        f"{attn}.num_heads",
        f"{attn}.num_key_value_heads",
    ]
    layers = [b for b in result.plan.blocks if ".self_attn." in "".join(b.tp_plan)]
    assert layers
    for b in layers:
        attn = f"{b.name}.self_attn"
        assert b.tp_local_attributes == [f"{attn}.num_heads", f"{attn}.num_key_value_heads"]
        assert b.tp_plan[f"{attn}.q_proj"] == "colwise"


def test_opt_attention_is_split_by_heads_with_its_local_head_count():
    """With the probe, OPT's pinned TP plan runs its attention split by heads on plain local
    shards (Megatron's split), each rank's ``self_attn.num_heads`` set to its own count, instead
    of handing the code a shard it misreads or keeping it on DTensors."""
    mf = load_model_file(MODELS / "opt.py", {"size": "tiny"})
    result = plan(
        mf, 2, profile="cpu", dtype="fp32", use_cache=False,
        pins=Pins(tp=2, dp=1, pp=1, tp_variant="sharded"),
    )  # fmt: skip
    layers = [b for b in result.plan.blocks if b.block_class == "OPTDecoderLayer"]
    assert len(layers) == 2
    for b in layers:
        assert b.tp_local_attributes == [f"{b.name}.self_attn.num_heads"]
        for fqn, style in b.tp_plan.items():
            if fqn.endswith(("q_proj", "k_proj", "v_proj", "fc1")):
                assert style == "colwise", (fqn, style)


def test_a_module_with_its_own_forward_is_never_styled():
    """OPT's learned positional embedding subclasses nn.Embedding with a forward of its own
    (attention mask and keywords): torch's ParallelStyles would convert the wrong argument."""
    mf = load_model_file(MODELS / "opt.py", {"size": "tiny"})
    traced = trace(mf, dtype="fp32", use_cache=False)
    shardable = set(traced.graph.graph["tp_modules"])
    model = mf.build()
    positions = "model.decoder.embed_positions"
    assert isinstance(model.get_submodule(positions), torch.nn.Embedding)
    assert positions not in shardable and "model.decoder.layers.0.fc1" in shardable


def test_conv1d_projections_are_sharded_with_their_weight_layout():
    """GPT-2's projections are transformers' Conv1D (weight [in, out], addmm): the tracer
    lists them as shardable and a pinned TP plan splits the MLP's first weight along dim 1
    and its second along dim 0 (the in_out styles), not as replicas."""
    mf = load_model_file(MODELS / "gpt2.py", {"size": "tiny"})
    result = plan(
        mf, 2, profile="cpu", dtype="fp32", use_cache=False,
        pins=Pins(tp=2, dp=1, pp=1, tp_variant="sharded"),
    )  # fmt: skip
    layer = next(b for b in result.plan.blocks if b.name == "transformer.h.0")
    assert layer.tp_plan["transformer.h.0.mlp.c_fc"] == "colwise_in_out"
    assert layer.tp_plan["transformer.h.0.mlp.c_proj"] == "rowwise_in_out"
    assert "transformer.h.0.attn.c_attn" in set(result.traced.graph.graph["tp_modules"])


def test_a_cast_check_does_not_make_attention_scores_a_block_output():
    """torch.export follows a dtype cast with a tensorless _assert_tensor_metadata node. OPT's
    eager attention upcasts its softmax: that check must not make the [b, heads, s, s] scores
    a block output, which the sharding ILP would all-gather (priced 1 GiB per micro-batch at
    Megatron's 22B shape)."""
    from planner.cost.sharding import build_problem

    mf = load_model_file(
        ROOT / "benchmarks" / "models" / "hf_shapes.py",
        {"kind": "opt", "attn": "eager", "layers": 2, "hidden": 64, "heads": 4},
    )
    traced = trace(mf, dtype="bf16", use_cache=False)
    layer = next(b for b in traced.blocks if b.name.endswith("layers.1"))
    graph = traced.graph
    asserts = [n for n in layer.nodes if "assert_tensor_metadata" in graph.nodes[n]["op"]]
    assert asserts, "the trace has no cast check: this test no longer tests anything"
    prob = build_problem(graph, layer, 2)
    assert [tuple(prob.ops[prob.index[n]].shape) for n in prob.outputs] == [(1, 2048, 64)]


@pytest.fixture(scope="module")
def gpt2_korthikanti_layer():
    mf = load_model_file(
        ROOT / "benchmarks" / "models" / "hf_shapes.py",
        {"kind": "gpt2", "layers": 2, "hidden": 2048, "heads": 16},
    )
    traced = trace(mf, dtype="bf16", use_cache=False)
    return traced, next(b for b in traced.blocks if b.name.endswith("h.1"))


@pytest.mark.parametrize("t", [2, 4])
def test_gpt2_fused_qkv_is_sharded_by_heads_megatron_style(gpt2_korthikanti_layer, t):
    """At Korthikanti's layer shape (hidden 2048, 16 heads, sequence 2048), GPT-2's layer is
    Megatron's: c_attn column-parallel by its q | k | v blocks, attention split by heads,
    c_proj and the MLP's second weight row-parallel, one all-reduce each way per half-layer
    (Shoeybi et al. 2019) and 1/t of the layer's matrix products on each rank."""
    from planner.cost.sharding import tp_variants

    traced, layer = gpt2_korthikanti_layer
    best = next(v for v in tp_variants(traced.graph, layer, t) if v.name != "replicated")
    p = "transformer.h.1."
    assert best.tp_plan == {
        p + "attn.c_attn": "colwise_dtensor_in_out:3",
        p + "attn.c_proj": "rowwise_in_out",
        p + "mlp.c_fc": "colwise_in_out",
        p + "mlp.c_proj": "rowwise_in_out",
    }
    sdpa = [n for n in layer.nodes if "scaled_dot_product" in traced.graph.nodes[n]["op"]]
    assert [best.states[n] for n in sdpa] == ["S1"]
    assert [k for k, _ in best.comm_fwd] == ["all_reduce"] * 2
    assert best.compute_fraction == pytest.approx(1 / t, rel=0.05)


def _tp2_plan(zoo_file: str, args: dict):
    """A zoo model planned sharded over 2 CPU ranks (micro-batch 4)."""
    mf = load_model_file(ROOT / "tests" / "zoo" / zoo_file, args)
    return plan(
        mf, 2, profile="cpu", dtype="fp32", use_cache=False,
        pins=Pins(tp=2, dp=1, pp=1, micro_batch_size=4, tp_variant="sharded"),
    )  # fmt: skip


def test_per_head_norm_weights_are_summed_over_the_tp_group():
    """Qwen3 normalises q and k per head with one weight shared by all heads: with the heads
    split over TP, each rank computes its heads' share of that weight's gradient. The plan
    lists the norms for the runtime to sum (the zoo's qwen3 cells train it like one process);
    the layer's other replicated weights (the layer norms before the split) are whole on
    every rank and not listed."""
    result = _tp2_plan("zoo.py", {"family": "qwen3", "size": "tiny"})
    layer = next(b for b in result.plan.blocks if b.name == "model.layers.1")
    assert layer.tp_plan["model.layers.1.self_attn.q_proj"] == "colwise"
    assert layer.tp_grad_sums == [
        "model.layers.1.self_attn.k_norm",
        "model.layers.1.self_attn.q_norm",
    ]


def test_a_linear_subclass_with_its_own_forward_stays_whole():
    """Llama 4's router is an nn.Linear whose forward goes on to top-k and scatter its scores:
    under torch's styles that code would run on the sharded DTensor product and fail (scatter
    has no sharding rule; the run crashed in every worker). The trace leaves it out of the
    modules TP may shard, and the layer's shared expert still shards."""
    result = _tp2_plan("sweep.py", {"family": "llama4"})
    assert "model.layers.1.feed_forward.router" not in result.traced.graph.graph["tp_modules"]
    assert (
        "model.layers.1.feed_forward.shared_expert.up_proj"
        in (result.traced.graph.graph["tp_modules"])
    )
    layer = next(b for b in result.plan.blocks if b.name == "model.layers.1")
    assert "model.layers.1.feed_forward.router" not in layer.tp_plan
    assert layer.tp_plan["model.layers.1.feed_forward.shared_expert.up_proj"] == "colwise"


def test_a_linear_subclass_whose_forward_is_a_plain_product_still_shards():
    """Falcon's FalconLinear has its own forward, ``x @ self.weight.T`` (+ bias): the trace
    shows nothing but the product there, so it shards as an nn.Linear would."""
    mf = load_model_file(ROOT / "tests" / "zoo" / "zoo.py", {"family": "falcon"})
    traced = trace(mf, traced_batch_size=1, dtype="fp32", use_cache=False)
    assert {
        "transformer.h.0.mlp.dense_h_to_4h",
        "transformer.h.0.mlp.dense_4h_to_h",
        "transformer.h.0.self_attention.dense",
    } <= set(traced.graph.graph["tp_modules"])


def test_a_parameter_read_where_the_runtime_gathered_is_not_summed():
    """Apertus' xIELU activation scales the up projection's output by softplus(alpha). The
    sharding ILP once kept that output sharded through the activation and gathered after it,
    summing alpha's partial gradients, while the runtime gathered the projection's output
    (``colwise_gather``) and computed the activation whole: each rank's alpha gradient was
    already whole, and summing it trained alpha at twice the rate. The ILP now gathers only at
    a column-parallel module's output (``gathers_midway``): here the MLP stays replicated, so
    alpha's gradient is whole on every rank and not summed. The per-head q and k norms, read
    on the head shards, are still summed."""
    result = _tp2_plan("sweep.py", {"family": "apertus"})
    layer = next(b for b in result.plan.blocks if b.name == "model.layers.1")
    assert "model.layers.1.mlp.up_proj" not in layer.tp_plan
    assert layer.tp_grad_sums == [
        "model.layers.1.self_attn.k_norm",
        "model.layers.1.self_attn.q_norm",
    ]


def test_attention_with_complex_rotary_embeddings_shards_by_heads():
    """Llama 4 (like Meta's reference Llama) rotates q and k as complex numbers:
    view_as_complex, a complex product, view_as_real. Those views keep every dimension but
    the (real, imaginary) pair, so the heads' split passes through them and the layer has a
    head-sharded variant (it had none: the attention ran whole on every rank). That variant,
    put into a plan by hand, trained 5 SGD steps exactly like one process (losses and every
    tensor within the oracle's tolerance, checked when this was written)."""
    from planner.cost.sharding import tp_variants

    mf = load_model_file(ROOT / "tests" / "zoo" / "sweep.py", {"family": "llama4"})
    traced = trace(mf, traced_batch_size=4, dtype="fp32", use_cache=False)
    layer = next(b for b in traced.blocks if b.name == "model.layers.0")
    p = "model.layers.0.self_attn."
    heads = [
        v.tp_plan
        for v in tp_variants(traced.graph, layer, 2)
        if v.tp_plan.get(p + "q_proj") == "colwise" and v.tp_plan.get(p + "o_proj") == "rowwise"
    ]
    assert heads and all(h.get(p + "k_proj") == "colwise" for h in heads)


def test_minicpm3_latent_attention_is_planned_split_by_heads():
    """MiniCPM3's MLA with a low-rank query: the fastest layout at TP 2 computes the query's
    down-projection split and gathers it before the up-projection, whose output the heads
    split. A column-parallel output's region ends where a consumer gathers it: followed on
    into the up-projection's region, which a row-parallel projection closes, it looked both
    gathered and partial, the layout was rejected as unrunnable and --tp 2 had no variant."""
    result = _tp2_plan("sweep.py", {"family": "minicpm3", "size": "tiny"})
    layer = next(b for b in result.plan.blocks if b.name == "model.layers.1")
    p = "model.layers.1.self_attn."
    assert layer.tp_plan[p + "kv_b_proj"] == "colwise_dtensor"
    assert layer.tp_plan[p + "o_proj"] == "rowwise"
