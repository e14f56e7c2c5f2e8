"""Long sequences: the trace keeps what training runs (fused causal attention, no s x s mask),
context parallelism is priced against its closed form (1/cp of every token's work plus a ring
of key/value chunks), and the solver splits sequences when nothing else fits."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from planner.api import plan, trace, variants_for
from planner.cost.block_options import block_options
from planner.cost.compute import node_times
from planner.errors import UserInputError
from planner.hardware.cluster import Cluster, make_cluster
from planner.hardware.collectives import p2p_time
from planner.modelfile import load_model_file
from planner.search import Pins
from planner.search.candidates import attention_sequence
from planner.trace.opcost import ATTENTION_OPS
from planner.training import Training

ROOT = Path(__file__).resolve().parent.parent
LLAMA = ROOT / "examples" / "llama.py"
GPT = ROOT / "examples" / "gpt.py"
BF16 = Training(8, "bf16", "adamw")


def _llama(seq: int):
    args = {"size": "tiny", "seq_len": seq}
    return trace(load_model_file(LLAMA, args), traced_batch_size=1, dtype="bf16")


def test_traced_llama_runs_causal_attention_without_a_mask():
    """transformers builds an s x s boolean mask while exporting; training passes none."""
    traced = _llama(64)
    g = traced.graph
    attention = [n for n in g.nodes if g.nodes[n]["op"] in ATTENTION_OPS]
    assert len(attention) == 2
    for n in attention:
        assert g.nodes[n]["args"][-1].get("is_causal") is True
        assert g.nodes[n]["args"][-1].get("attn_mask") is None
    square = [
        n
        for n in g.nodes
        if g.nodes[n]["dtypes"][:1] == ["bool"]
        and (g.nodes[n]["shapes"][0] or [0])[-2:] == [64, 64]
    ]
    assert square == []


def test_fused_attention_saves_no_quadratic_activations():
    """FlashAttention keeps q, k, v, the output and the log-sum-exp: a layer's saved bytes grow
    linearly with the sequence (the math path would add a s^2 term and quadruple)."""
    short, long = _llama(256), _llama(512)
    ratio = long.blocks[1].saved_bytes / short.blocks[1].saved_bytes
    assert ratio == pytest.approx(2.0, rel=0.02)


def test_attention_sequence_only_for_fused_attention():
    assert attention_sequence(_llama(64).graph) == 64
    gpt = trace(load_model_file(GPT, {"size": "tiny"}), traced_batch_size=1, dtype="bf16")
    assert attention_sequence(gpt.graph) == 0  # explicit softmax(QK^T)V: no ring to run


@pytest.mark.parametrize("cp", [2, 4])
def test_context_parallel_option_is_the_closed_form(cp):
    """Per rank: the work and saved activations of 1/cp of the tokens (exactly a micro-batch
    cp times smaller), plus, for the attention op, cp - 1 ring steps of this rank's key and
    value chunk forward and twice the bytes backward (their gradients travel too);
    comm_overlap 0 leaves all of it exposed; and the causal imbalance of unbalanced chunks."""
    traced = _llama(256)
    layer = traced.blocks[1]
    base, _ = make_cluster(8, "h100-sxm", None, None)
    cluster = Cluster(replace(base.profile, comm_overlap=0.0), base.nodes, base.gpus_per_node)
    variants = variants_for(traced.graph, cluster, "auto")(layer, 1)
    ranks = list(range(cp))
    split = block_options(traced.graph, layer, variants, 2, cluster, [0], BF16, cp_ranks=ranks)
    fewer = block_options(traced.graph, layer, variants, 2 / cp, cluster, [0], BF16)
    g = traced.graph
    (attn,) = [n for n in layer.nodes if g.nodes[n]["op"] in ATTENTION_OPS]
    kv = 0
    for a in g.nodes[attn]["args"][1:3]:
        b_, h, s_, d = g.nodes[a["node"]]["shapes"][0]
        kv += b_ * h * s_ * d * 2  # bf16 keys and values of the traced micro-batch of 1
    chunk = kv * 2 / cp  # micro-batch 2, this rank's 1/cp of the sequence
    bw, lat = cluster.link(ranks)
    ring_f = (cp - 1) * p2p_time(chunk, bw, lat)
    ring_b = (cp - 1) * p2p_time(2 * chunk, bw, lat)
    assert ring_f > 0
    # causal, no load balancing: the last rank attends (2cp - 1)/cp of the mean, everyone waits
    attn_f, attn_b, _ = node_times(g, layer, 2 / cp, cluster, "bf16", [attn])
    ring_f += attn_f * (cp - 1) / cp
    ring_b += attn_b * (cp - 1) / cp
    for o_split, o_fewer in zip(split, fewer):
        assert o_split.act_bytes == pytest.approx(o_fewer.act_bytes)
        assert o_split.params == o_fewer.params
        # full recompute runs the forward, and its ring, once more in backward
        extra = ring_f * (2 if o_split.recompute == "full" else 1) + ring_b
        assert o_split.time_s == pytest.approx(o_fewer.time_s + extra, rel=1e-9)


def test_solver_splits_128k_token_llama3_8b_over_8_gpus():
    """Llama-3-8B at 131,072 tokens per sequence on 8 H100s: without context parallelism the
    activations fit no plan (even with full recompute and TP 8); with it they do."""
    args = {"size": "llama3-8b", "seq_len": 131072}
    best = plan(LLAMA, 8, model_args=args, profile="h100-sxm").plan
    assert best.mesh.cp > 1
    assert best.predicted.peak_memory_bytes <= best.predicted.capacity_bytes
    from planner.errors import InfeasibleError

    with pytest.raises(InfeasibleError):
        plan(LLAMA, 8, model_args=args, profile="h100-sxm", pins=Pins(cp=1))


def test_cp_on_explicit_attention_is_refused():
    with pytest.raises(UserInputError, match="fused attention"):
        plan(GPT, 8, model_args={"size": "tiny"}, profile="cpu", pins=Pins(cp=2))
