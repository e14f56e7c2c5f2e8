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

from planner.api import trace, variants_for
from planner.cost.eager_probe import EagerShardProbe
from planner.hardware.cluster import Cluster
from planner.hardware.profiles import load_profile
from planner.modelfile import load_model_file
from planner.search import Pins
from planner.search.options import price_options
from planner.training import Training

ROOT = Path(__file__).resolve().parent.parent
GPT = ROOT / "benchmarks" / "published_gpt.py"
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


def layer_option(mf):
    """The fastest TP 8 option of the model's first transformer layer (no recompute, no
    sequence parallelism), priced by the cost model on A100-80GB with the eager probe."""
    traced = trace(mf, traced_batch_size=1, dtype="bf16", use_cache=False)
    (layer,) = [b for b in traced.blocks if any(m.endswith("layers.0") for m in b.modules)]
    cluster = Cluster(load_profile("a100-80g"), 1, 8)
    probe = EagerShardProbe(mf, "bf16")
    variants_of = variants_for(traced.graph, cluster, "no-sequence", {}, probe)
    pins = Pins(tp=TP, recompute="none", offload="none", tp_variant="no-sequence")
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
    assert opt.act_bytes == pytest.approx(gpt.act_bytes, rel=0.10)
    assert opt.params == pytest.approx(gpt.params, rel=0.10)
