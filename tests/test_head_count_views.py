"""Attention whose code views by a fixed head count (transformers' OPT:
``view(bsz, -1, self.num_heads, head_dim)``) is planned and priced as Megatron's split by heads:
at the shapes of Narayanan et al. 2021 (GPT 22B, 175B, 530B, 1T) on A100-80GB at TP 8, an OPT
layer costs what a GPT layer of the same shape (benchmarks/published_gpt.py, fused Q/K/V laid
out per head as Megatron's) costs: time per micro-batch (forward and backward), saved
activations and weights per device each within 10%. The runtime oracle
(test_runtime_oracle.py, opt-tied-tp2, stablelm-headcount-view-tp2) trains such plans as one
process does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.api import plan, trace, variants_for
from planner.cost.eager_probe import EagerShardProbe
from planner.hardware.cluster import Cluster
from planner.hardware.profiles import load_profile
from planner.modelfile import load_model_file
from planner.search import Pins
from planner.search.options import price_options
from planner.training import Training

ROOT = Path(__file__).resolve().parent.parent
GPT = ROOT / "benchmarks" / "published_gpt.py"
OPT_TINY = ROOT / "tests" / "models" / "opt.py"
SEQ, TP, VOCAB = 2048, 8, 512
# hidden, heads, ffn: Narayanan et al. 2021 Table 1 (also Korthikanti et al. 2022 Table 3)
SHAPES = {
    "22b": (6144, 64, 24576),
    "175b": (12288, 96, 49152),
    "530b": (20480, 128, 81920),
    "1t": (25600, 160, 102400),
}


def opt_config(folder: Path, hidden: int, heads: int, ffn: int) -> Path:
    """A two-layer transformers OPT of the shape, as a config directory ``plan`` reads."""
    config = {
        "model_type": "opt", "architectures": ["OPTForCausalLM"], "vocab_size": VOCAB,
        "hidden_size": hidden, "num_hidden_layers": 2, "ffn_dim": ffn,
        "num_attention_heads": heads, "max_position_embeddings": SEQ,
        "word_embed_proj_dim": hidden, "do_layer_norm_before": True, "dropout": 0.0,
        "attention_dropout": 0.0, "activation_function": "relu", "enable_bias": True,
        "use_cache": False, "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2,
    }  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def layer_option(mf, variant: str = "no-sequence"):
    """The fastest TP 8 option of the model's first transformer layer (no recompute; no
    sequence parallelism, or with ``variant`` "sequence" only its sequence-parallel one),
    priced by the cost model on A100-80GB with the eager probe."""
    traced = trace(mf, traced_batch_size=1, dtype="bf16", use_cache=False)
    (layer,) = [b for b in traced.blocks if any(m.endswith("layers.0") for m in b.modules)]
    cluster = Cluster(load_profile("a100-80g"), 1, 8)
    probe = EagerShardProbe(mf, "bf16")
    variants_of = variants_for(traced.graph, cluster, variant, {}, probe)
    pins = Pins(tp=TP, recompute="none", offload="none", tp_variant=variant)
    training = Training(8, "bf16", "adamw")
    (options,) = price_options(traced.graph, [layer], TP, 1, cluster, training, pins, variants_of)
    return min((o for o in options if o.variant != "replicated"), key=lambda o: o.time_s)


@pytest.mark.parametrize(
    "shape",
    # the larger shapes trace and probe the same code at larger sizes: behind `long`
    [s if s == "22b" else pytest.param(s, marks=pytest.mark.long) for s in SHAPES],
)
def test_an_opt_layer_costs_what_a_megatron_gpt_layer_costs_at_tp8(shape, tmp_path):
    hidden, heads, ffn = SHAPES[shape]
    opt = layer_option(load_model_file(opt_config(tmp_path / "opt", hidden, heads, ffn)))
    gpt_args = dict(
        layers=2, hidden=hidden, heads=heads, ffn=ffn, seq_len=SEQ, vocab=VOCAB,
        attention="flash", tied=False,
    )  # fmt: skip
    gpt = layer_option(load_model_file(GPT, gpt_args))
    # split by heads on plain local tensors: every projection column- or row-parallel, the
    # view's head count set to the local one on each rank
    styles = {fqn.rpartition(".")[2]: s for fqn, s in opt.tp_plan}
    assert styles == {
        "q_proj": "colwise", "k_proj": "colwise", "v_proj": "colwise", "out_proj": "rowwise",
        "fc1": "colwise", "fc2": "rowwise",
    }  # fmt: skip
    assert [a.rpartition("layers.0.")[2] for a in opt.tp_local_attributes] == [
        "self_attn.num_heads"
    ]
    assert opt.time_s == pytest.approx(gpt.time_s, rel=0.10)
    # the GPT's saved activations less what its GeLU keeps that OPT's ReLU does not (its
    # input, the ffn-wide product output, 1/t of it; ReLU's backward reads its output, which
    # fc2 keeps anyway)
    assert opt.act_bytes == pytest.approx(gpt.act_bytes - SEQ * ffn * 2 / TP, rel=1e-3)
    assert opt.params == pytest.approx(gpt.params, rel=0.10)


@pytest.mark.parametrize(
    "shape", ["22b", *(pytest.param(s, marks=pytest.mark.long) for s in SHAPES if s != "22b")]
)
def test_an_opt_layer_runs_sequence_parallel_as_megatron_at_tp8(shape, tmp_path):
    """OPT's MLP runs on its tokens flattened (``reshape(-1, hidden)``); sequence parallelism
    shards that region along the flattened dim (the "_tokens" styles) and is priced as
    Megatron's: the collectives of the GPT's sequence-parallel layer (two all-reduces become
    reduce-scatter + all-gather pairs, the layer output gathered on the way out; in backward
    the inputs of the attention and the MLP gathered again), the same time and
    weights within 10%, and the saved activations of the GPT's less its GeLU's input."""
    hidden, heads, ffn = SHAPES[shape]
    mf = load_model_file(opt_config(tmp_path / "opt", hidden, heads, ffn))
    opt, opt_tp = layer_option(mf, "sequence"), layer_option(mf)
    gpt_args = dict(
        layers=2, hidden=hidden, heads=heads, ffn=ffn, seq_len=SEQ, vocab=VOCAB,
        attention="flash", tied=False,
    )  # fmt: skip
    gpt = layer_option(load_model_file(GPT, gpt_args), "sequence")
    styles = {fqn.rpartition(".")[2]: s for fqn, s in opt.tp_plan}
    assert styles == {
        "0": "sp_block", "self_attn_layer_norm": "sequence", "self_attn": "sp_gather",
        "q_proj": "colwise", "k_proj": "colwise", "v_proj": "colwise", "out_proj": "rowwise_sp",
        "final_layer_norm": "sequence_tokens", "fc1": "colwise_sp_tokens",
        "fc2": "rowwise_sp_tokens",
    }  # fmt: skip
    assert [a.rpartition("layers.0.")[2] for a in opt.tp_local_attributes] == [
        "self_attn.num_heads"
    ]
    # the GPT's collectives, checked one by one in test_sharding.py's sequence-parallel test
    # (fc1, a Linear of the layer's own, gathers its input in a hook of its own and again in
    # backward, as the GPT's MLP module does for its fc1)
    assert opt.tp_comm_s == pytest.approx(gpt.tp_comm_s, rel=1e-9)
    assert opt.time_s == pytest.approx(gpt.time_s, rel=0.10)
    assert opt.params == pytest.approx(gpt.params, rel=0.10)
    # the GPT's saved activations less what its GeLU keeps that OPT's ReLU does not (its
    # input, the ffn-wide product output, 1/t of it; ReLU's backward reads its output, which
    # fc2 keeps anyway)
    assert opt.act_bytes == pytest.approx(gpt.act_bytes - SEQ * ffn * 2 / TP, rel=1e-3)
    # Korthikanti's TP to TP+SP step: the replicated region's 10 sbh (norm inputs, dropout
    # masks, residual adds; 2 sbh less without dropout here) and the kept inputs of the
    # column-parallel products (4 sbh) go to 1/t
    assert opt.act_bytes < opt_tp.act_bytes * 0.75


def test_a_pipelined_opt_layer_is_offered_sequence_parallelism():
    """OPT's decoder calls each layer with the stream and, by keyword, the mask and the
    positions. A pipeline stage calls the eager layer as the model did, from the call
    signature its export keeps (``runtime.block_calls``), so the layer is sequence-parallel
    there as unpipelined (oracle cases opt-sp-tp2 and, long, opt-sp-pp2xtp2); before, the
    stage ran it as traced code of fixed shapes and the planner offered no such variant."""
    from planner.trace.blocks import runs_eagerly_in_stage

    mf = load_model_file(OPT_TINY, {"size": "tiny"})
    traced = trace(mf, traced_batch_size=2, dtype="fp32")
    assert runs_eagerly_in_stage(traced.graph, traced.blocks[1])
    for pp in (2, 1):
        pins = Pins(pp=pp, tp=2, dp=1, tp_variant="sequence")
        got = plan(mf, 2 * pp, profile="cpu", pins=pins, compare_baselines=False).plan
        styles = {s for b in got.blocks for s in b.tp_plan.values()}
        assert {"sp_block", "colwise_sp_tokens", "rowwise_sp_tokens"} <= styles, pp
