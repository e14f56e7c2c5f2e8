"""Tests written for the mutants mutmut generated in planner/cost/compute.py that the cost
model's tests let survive (docs/mutation.md lists each survivor and the test here that kills
it). Each states a share, a time or a count from a formula written out here, at an input
where the surviving change would alter it: element-wise chains whose fused traffic is counted
by hand from their edges (a block input beside them, a chain that moves nothing, a chain
that ends the model, a view also read by a product), and the loss priced from its three fp32
copies of the logits on a profile with per-op dispatch costs."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import networkx as nx
import pytest
from conftest import cluster_of, make_block

from planner.cost.compute import (
    NodeTimes,
    OpCounts,
    block_node_times,
    fusion_shares,
    inner_dim_slowdowns,
    loss_time,
    misaligned,
    node_times,
    op_counts,
    op_rate,
    overhead_times,
    ring_attention_times,
    tp_shares,
)
from planner.cost.records import Config, CostInputs
from planner.hardware.cluster import Cluster
from planner.hardware.collectives import p2p_time
from planner.hardware.profiles import load_profile
from planner.schema.mesh import Mesh
from planner.training import Training

# --------------------------------------------------------------------------- fusion_shares

OPS = {
    "input": "input",
    "view": "aten.view.default",
    "mm": "aten.mm.default",
    "add": "aten.add.Tensor",
    "mul": "aten.mul.Tensor",
    "exp": "aten.exp.default",
}


def _graph(nodes: list[tuple[str, str, float, float]], edges: list[tuple[str, str, float]]):
    """A traced graph: nodes (name, kind, forward bytes, output bytes) in execution order,
    edges (producer, consumer, bytes)."""
    g = nx.DiGraph()
    for i, (name, kind, fwd, out) in enumerate(nodes):
        g.add_node(name, op=OPS[kind], order=i, fwd_bytes=fwd, out_bytes=out, args=[], params=[])
    for u, v, b in edges:
        g.add_edge(u, v, bytes=b)
    return g


def _block(names: list[str]):
    blk = make_block(0, "L")
    blk.nodes = list(names)
    return blk


def test_a_blocks_input_is_read_by_the_chain_after_it_not_fused_into_it():
    """x (the block's input placeholder) -> add -> mul -> mm, 4e6-byte tensors: unfused, add
    and mul each read 4e6 and write 4e6 (16e6); fused, the chain reads x once and writes
    mul's output once (8e6): each keeps 1/2. The placeholder is no kernel (killed: ``input``
    taken into the chain, ``ATTENTION_OPS & {"input"}``, ``"XXinputXX"``, ``"INPUT"``,
    which makes x's read internal: 1/4, and gives x a share)."""
    g = _graph(
        [("x", "input", 0, 4e6), ("a", "add", 8e6, 4e6), ("b", "mul", 8e6, 4e6),
         ("mm", "mm", 8e6, 4e6)],
        [("x", "a", 4e6), ("a", "b", 4e6), ("b", "mm", 4e6)],
    )  # fmt: skip
    assert fusion_shares(g, _block(["x", "a", "b", "mm"])) == {
        "a": pytest.approx(0.5),
        "b": pytest.approx(0.5),
    }


def _three_chains(unit: float):
    """In execution order: a view v that moves nothing (a chain of 0 bytes), mm, the chain
    a -> b, mm2, the chain c -> d -> e that ends the model (e has no consumer). Tensors of
    ``unit`` bytes; each element-wise op reads one and writes one (2 units)."""
    u = unit
    return _graph(
        [("x", "input", 0, u), ("v", "view", 0, u), ("mm", "mm", 2 * u, u),
         ("a", "add", 2 * u, u), ("b", "mul", 2 * u, u), ("mm2", "mm", 2 * u, u),
         ("c", "exp", 2 * u, u), ("d", "add", 2 * u, u), ("e", "mul", 2 * u, u)],
        [("x", "v", u), ("v", "mm", u), ("mm", "a", u), ("a", "b", u), ("b", "mm2", u),
         ("mm2", "c", u), ("c", "d", u), ("d", "e", u)],
    )  # fmt: skip


@pytest.mark.parametrize("unit", [4e6, 0.25])
def test_each_chain_of_a_block_keeps_its_own_share_whatever_comes_before_it(unit):
    """Three chains (``_three_chains``): {v} moves nothing and keeps no share; {a, b} reads
    mm's output once and writes b's once: 2 of its 4 units, 1/2 each; {c, d, e} reads mm2's
    output once and writes e's once, the model's output (read by no op, counted by its
    ``out_bytes``): 2 of 6 units, 1/3 each. The shares are ratios of bytes, the same at
    any size: at a quarter-byte unit the chain {a, b} moves one byte in all (killed: the
    loop stopping at the seen b, or at the empty {v} (``break``); dividing by {v}'s 0
    bytes (``unfused < 0``); skipping a chain of one byte (``<= 1``); e's write left out,
    subtracted, or taken for the whole (``=``, ``-=``, its key misspelt))."""
    g = _three_chains(unit)
    blk = _block(["x", "v", "mm", "a", "b", "mm2", "c", "d", "e"])
    assert fusion_shares(g, blk) == {
        "a": pytest.approx(2 / 4),
        "b": pytest.approx(2 / 4),
        "c": pytest.approx(2 / 6),
        "d": pytest.approx(2 / 6),
        "e": pytest.approx(2 / 6),
    }


def test_a_chain_whose_view_a_product_also_reads_keeps_its_whole_traffic():
    """mm -> v (a view of its 4e6-byte output) -> add -> mm2, and v also read by mm3: unfused,
    the chain moves add's 8e6 (the view moves nothing); fused, it reads mm's output once,
    hands v's tensor to mm3 and add's to mm2: 12e6, more than unfused. The share is capped at
    1: fusing never adds traffic (killed: ``min(2.0, ...)``, 1.5)."""
    g = _graph(
        [("mm", "mm", 8e6, 4e6), ("v", "view", 0, 4e6), ("a", "add", 8e6, 4e6),
         ("mm2", "mm", 8e6, 4e6), ("mm3", "mm", 8e6, 4e6)],
        [("mm", "v", 4e6), ("v", "a", 4e6), ("a", "mm2", 4e6), ("v", "mm3", 4e6)],
    )  # fmt: skip
    assert fusion_shares(g, _block(["mm", "v", "a", "mm2", "mm3"])) == {"v": 1.0, "a": 1.0}


def test_the_times_of_some_ops_of_a_block_are_theirs_alone():
    """node_times over ``nodes`` sums those ops only: the add of a block holding a matrix
    product and an add reads 4e6 and writes 4e6 bytes, memory-bound, 8e6 / (bandwidth x
    element-wise efficiency), 16e6 of the same in backward (killed: ``nodes`` not passed on,
    pricing the whole block)."""
    g = _graph([("mm", "mm", 8e6, 4e6), ("a", "add", 8e6, 4e6)], [("mm", "a", 4e6)])
    for name, flops in (("mm", 1e12), ("a", 0.0)):
        g.nodes[name].update(fwd_flops=flops, bwd_flops=2 * flops, bwd_bytes=16e6)
    g.graph.update(param_shapes={}, param_dtype_bytes={}, param_owner={})
    cl = cluster_of(1, "h100-sxm")
    bw = cl.profile.memory_bandwidth * cl.profile.elementwise_efficiency
    fwd, bwd, _ = node_times(g, _block(["mm", "a"]), 1.0, cl, "bf16", ["a"])
    assert (fwd, bwd) == (pytest.approx(8e6 / bw), pytest.approx(16e6 / bw))


def test_each_ops_time_goes_to_the_slot_of_what_bounds_it():
    """On the CPU profile (a short-K slowdown of K / (K + 1.9)): a product of 1e9 FLOPs over
    K = 2, reading 1e3 bytes, is compute-bound at 1e9 x (2 + 1.9)/2 / (fp32 peak x GEMM
    efficiency); an add of 1e3 FLOPs reading 1e8 bytes is memory-bound at 1e8 / (bandwidth x
    element-wise efficiency). Each time lands in its own slot, which TP shrinks by its own
    share; each slot sums its ops (killed: the bound taken as None, the FLOPs times the peak,
    the slowdown dividing; ``=`` for ``+=`` in the compute sums; the selective core's
    forward summed over the ops outside it, or with ``=``, ``-=``, ``fc - fm``)."""
    g = _graph(
        [("mm", "mm", 1e3, 1e3), ("a", "add", 1e8, 1e3), ("mm2", "mm", 1e3, 1e3)],
        [("mm", "a", 1e3), ("a", "mm2", 1e3)],
    )
    for n in ("mm", "mm2"):  # backward: the same product again
        inner = [2, 64, 64, False]
        g.nodes[n].update(fwd_flops=1e9, bwd_flops=1e9, bwd_bytes=1e3, mm_inner=inner)
    g.nodes["a"].update(fwd_flops=1e3, bwd_flops=0.0, bwd_bytes=0.0)
    g.graph.update(param_shapes={}, param_dtype_bytes={}, param_owner={})
    cl = cluster_of(1, "cpu")
    p = cl.profile
    assert p.matmul_half_inner_dim == 1.9
    t = block_node_times(g, _block(["mm", "a", "mm2"]), 1.0, cl, "fp32")
    gemm = 1e9 * (2 + 1.9) / 2 / (p.peak_flops["fp32"] * p.matmul_efficiency)
    mem = 1e8 / (p.memory_bandwidth * p.elementwise_efficiency)
    # backward's two GEMMs reduce over N = M = 64: (64 + 1.9)/64
    bgemm = 1e9 * (64 + 1.9) / 64 / (p.peak_flops["fp32"] * p.matmul_efficiency)
    assert t.ops["mm"] == (pytest.approx(gemm, rel=1e-12), 0.0, pytest.approx(bgemm), 0.0)
    assert t.ops["a"] == (0.0, pytest.approx(mem, rel=1e-12), 0.0, 0.0)
    assert (t.fwd_compute, t.fwd_memory) == (pytest.approx(2 * gemm), pytest.approx(mem))
    assert (t.bwd_compute, t.bwd_memory) == (pytest.approx(2 * bgemm), 0.0)
    # no weights: mm and the add lie between two products of activations (mm, mm2), the
    # selective core whose forward selective recompute runs again
    assert t.core_fwd == pytest.approx(gemm + mem, rel=1e-12)


def test_views_and_inputs_dispatch_no_kernel():
    """A block of an input, a view, an add with a gradient and a product without one: two
    eager ops forward, one backward (killed: views counted, ``is_view(None)``)."""
    g = _graph(
        [("x", "input", 0, 8), ("v", "view", 0, 8), ("a", "add", 16, 8), ("mm", "mm", 16, 8)],
        [("x", "v", 8), ("v", "a", 8), ("a", "mm", 8)],
    )
    for n in ("x", "v", "a"):
        g.nodes[n]["requires_grad"] = True
    assert op_counts(g, _block(["x", "v", "a", "mm"])) == OpCounts(2, 1)


def test_a_tp_steps_module_overheads_add_to_its_ops_dispatch():
    """CPU profile, TP 2, three sharded modules of which one is gathered: per step 2 x
    tp_module_overhead + 1 x tp_gather_overhead, a third in forward and two thirds in
    backward, on top of 10 forward and 6 backward ops' dispatch; selective recompute's 10 x
    its per-op cost (killed: the gathered ones counted as the others, ``=`` for ``+=``)."""
    cl = cluster_of(2, "cpu", tp_gather_overhead=1e-3)
    p = cl.profile
    assert p.op_overhead > 0 and p.tp_module_overhead > 0
    plan = {"a.q": "colwise", "m.fc1": "colwise_gather", "m.fc2": "rowwise"}
    per_step = 2 * p.tp_module_overhead + 1e-3
    assert overhead_times(OpCounts(10, 6), plan, 2, cl) == (
        pytest.approx(10 * p.op_overhead + per_step / 3, rel=1e-12),
        pytest.approx(6 * p.backward_op_overhead + per_step * 2 / 3, rel=1e-12),
        pytest.approx(10 * p.selective_op_overhead, rel=1e-12),
    )


# --------------------------------------------------------------------------- TP shares

# forward compute, forward memory, backward compute, backward memory: powers of two, so that
# every sum and product below has one value only
TIMES = NodeTimes(ops={"mm": (1.0, 2.0, 4.0, 8.0), "norm": (16.0, 32.0, 64.0, 128.0)})


def test_a_variants_ops_shrink_by_their_own_shares():
    """(forward, backward) = sum over ops of (compute + memory) x share, an op without a
    share whole, an op without times nothing: mm at 1/4 and norm whole give (3/4 + 48,
    12/4 + 192); over ``nodes`` mm and an unpriced op, only mm's (killed: any change to
    the sums, the default share of 1, or the zero times of an unpriced op)."""
    assert TIMES.sharded({"mm": 0.25}) == (3 / 4 + 48, 12 / 4 + 192)
    assert TIMES.sharded({"mm": 0.25, "norm": 0.5}, ["mm", "unpriced"]) == (3 / 4, 12 / 4)
    assert TIMES.sharded({}) == (3 + 48, 12 + 192)


def _tp_graph():
    g = nx.DiGraph()
    for name, op, flops in (
        ("mm", "aten.mm.default", 1e9),
        ("norm", "aten.native_layer_norm.default", 0.0),
    ):
        g.add_node(name, op=op, fwd_flops=flops, shapes=[[8, 8]], dtypes=["float32"], args=[])
    return g


@pytest.mark.parametrize("cost", [(1.0, 0, 0, 0), (0, 1.0, 0, 0), (0, 0, 1.0, 0), (0, 0, 0, 1.0)])
def test_each_op_of_a_tp_variant_takes_its_states_share_unless_a_priced_op_has_none(cost):
    """Over TP 4: a product computing a shard of its output (``S1``) takes 1/4, a replicated
    norm the whole, an op that costs nothing needs no state; a variant that leaves a priced op
    (cost in any one of its four times) without a state, has no TP degree, or a degree of 1
    gives no per-op shares (None: the block's average fractions apply) (killed: the cost test
    ``>= 0`` or with a term's sign flipped, the degree's default or bound moved)."""
    g = _tp_graph()
    states = {"mm": "S1", "norm": "R"}
    times = NodeTimes(ops={**TIMES.ops, "assert": (0.0, 0.0, 0.0, 0.0)})
    variant = SimpleNamespace(states=states, tp=4)
    assert tp_shares(variant, times, g) == {"mm": 0.25, "norm": 1.0}
    g.add_node("relu", op="aten.relu.default", fwd_flops=0.0, shapes=[[8, 8]], dtypes=["float32"])
    priced = NodeTimes(ops={**times.ops, "relu": cost})
    assert tp_shares(variant, priced, g) is None
    assert tp_shares(SimpleNamespace(states=states), times, g) is None
    assert tp_shares(SimpleNamespace(states=states, tp=1), times, g) is None
    assert tp_shares(SimpleNamespace(states=states, tp=2), times, g) == {"mm": 0.5, "norm": 1.0}
    assert tp_shares(SimpleNamespace(states={}, tp=4), times, g) is None
    assert tp_shares(SimpleNamespace(tp=4), times, g) is None  # a variant naming no states


# --------------------------------------------------------------------------- op_rate

SDPA = "aten.scaled_dot_product_attention.default"
Q, K, V = ({"node": n} for n in "qkv")


@pytest.mark.parametrize(
    "args, work",
    [
        ([Q, K, V, {"is_causal": True}], 0.5),  # by keyword
        ([Q, K, V, None, 0.0, True], 0.5),  # by position: (q, k, v, mask, dropout, causal)
        ([Q, K, V, None, 0.0, True, {"scale": 0.125}], 0.5),  # by position, other keywords
        ([Q, K, V, None, 0.0, False, {"is_causal": True}], 0.5),  # the keyword wins
        ([Q, K, V, None, 0.0], 1.0),  # a mask and dropout, no causal flag
        ([Q, K, V], 1.0),
        ([], 1.0),
    ],
)
def test_a_fused_attentions_causal_flag_is_read_by_keyword_or_by_position(args, work):
    """scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, ...):
    the traced call holds ``is_causal`` in its keyword dict (its last argument, not a node
    reference) or as its sixth positional argument; a causal kernel does half the work, and
    backward 2.5 / 2 of that (killed: the positional flag ignored, read from the seventh
    argument, read from a five-argument call, taken only from a dict; the last argument
    taken as the keywords whatever it is, or the test's ``and`` loosened to ``or``)."""
    c = Cluster(load_profile("h100-sxm"), 1, 8)
    rate, work_f, work_b = op_rate({"op": SDPA, "args": args}, c, "bf16")
    assert (rate, work_f, work_b) == (
        989e12 * c.profile.attention_efficiency,
        work,
        work * 2.5 / 2,
    )


def test_a_product_of_aligned_activations_is_aligned_whatever_its_scaling_flag():
    """``mm_inner`` is (K, N, M, whether M scales with the micro-batch): only the three
    dimensions are checked against Tensor Cores' 8-element alignment; the flag (True, 1 as
    an integer) is no dimension (killed: ``inner[:4]``, reading True as a dimension of 1)."""
    node = {"op": "aten.bmm.default", "mm_inner": [64, 128, 256, True]}
    assert not misaligned(node)
    assert misaligned({**node, "mm_inner": [64, 100, 256, True]})
    a100 = Cluster(load_profile("a100-80g"), 1, 8)
    p = a100.profile
    assert p.misaligned_matmul_efficiency > 0
    assert op_rate(node, a100, "fp16") == (312e12 * p.matmul_efficiency, 1.0, 1.0)


# --------------------------------------------------------------------------- ring attention


def _ring_graph(flops: float):
    """Two fused attentions of a block: a1 causal (by keyword) over activations q, k, v of
    1e7 bytes each; a2 non-causal, its value a weight and an attention mask after it (both
    on every rank: only its key travels the ring). Each reads 4e6 and does ``flops``."""
    g = nx.DiGraph()
    ref = {n: {"node": n} for n in ("q", "k", "v", "q2", "k2", "mask")}
    attn = dict(fwd_flops=flops, bwd_flops=2 * flops, fwd_bytes=4e6, bwd_bytes=8e6)
    nodes = [(n, "aten.mm.default", {}) for n in ("q", "k", "v", "q2", "k2", "mask")]
    nodes += [
        ("a1", SDPA, dict(attn, args=[ref["q"], ref["k"], ref["v"], {"is_causal": True}])),
        ("a2", SDPA, dict(attn, args=[ref["q2"], ref["k2"], {"param": "w"}, ref["mask"]])),
    ]
    for i, (name, op, extra) in enumerate(nodes):
        base = dict(fwd_flops=0.0, bwd_flops=0.0, fwd_bytes=0.0, bwd_bytes=0.0, args=[])
        g.add_node(name, op=op, order=i, params=[], **{**base, **extra})
    for u, v in (("q", "a1"), ("k", "a1"), ("v", "a1"), ("q2", "a2"), ("k2", "a2"), ("mask", "a2")):
        g.add_edge(u, v, bytes=1e7)
    g.graph.update(param_shapes={"w": [10]}, param_dtype_bytes={"w": 2}, param_owner={})
    return g


@pytest.mark.parametrize("kernel", ["flash", "native", "legacy"])
def test_ring_attention_passes_each_attentions_activation_keys_and_values(kernel):
    """Context parallelism over 2 ranks of an H100 node, the overlap at 0.25, micro-batch
    scale 1/2: a1 passes its key and value chunk (2 x 1e7 x 1/2 bytes) cp - 1 = 1 time
    forward, twice the bytes backward; a2 its key only. Each hides behind a quarter of its
    own attention time, at its kernel's rate (FlashAttention-2's, the chip's own, an old build's:
    x 0.5 for causal a1, backward x 2.5/2), and the causal a1 adds (cp - 1)/cp of its
    attention for the last rank's extra chunks (killed: the mask or the weight read as keys
    and values; the kernel flags not passed; ``fwd =`` keeping a2's only; the hidden share
    added, or divided by the attention time; the causal work factor dividing)."""
    profile = load_profile("h100-sxm")
    cl = Cluster(replace(profile, comm_overlap=0.25), 1, 8)
    p = cl.profile
    eff = {
        "flash": p.attention_efficiency,
        "native": p.native_attention_efficiency,
        "legacy": p.legacy_attention_efficiency,
    }[kernel]
    assert len({p.attention_efficiency, p.native_attention_efficiency, eff}) >= 2
    training = Training(
        8, "bf16", "adamw", native_attention=kernel == "native", legacy_attention=kernel == "legacy"
    )
    flops = 5e9
    g = _ring_graph(flops)
    blk = _block(["q", "k", "v", "q2", "k2", "mask", "a1", "a2"])
    bw, lat = cl.link([0, 1])
    rate = 989e12 * eff
    mem = p.memory_bandwidth * p.elementwise_efficiency
    fwd = bwd = 0.0
    for kv, work in ((2 * 1e7 / 2, 0.5), (1e7 / 2, 1.0)):
        attn_f = max(flops * work / 2 / rate, 4e6 / 2 / mem)
        attn_b = max(2 * flops * work * 2.5 / 2 / 2 / rate, 8e6 / 2 / mem)
        exposed_f = p2p_time(kv, bw, lat) - 0.25 * attn_f
        exposed_b = p2p_time(2 * kv, bw, lat) - 0.25 * attn_b
        assert exposed_f > 0 and exposed_b > 0  # the ring is longer than what hides it
        assert attn_f > 4e6 / 2 / mem  # compute-bound: the kernel's rate shows
        fwd += exposed_f + (attn_f / 2 if work == 0.5 else 0.0)
        bwd += exposed_b + (attn_b / 2 if work == 0.5 else 0.0)
    got = ring_attention_times(g, blk, 0.5, cl, training, [0, 1])
    assert got == (pytest.approx(fwd, rel=1e-12), pytest.approx(bwd, rel=1e-12))


def test_a_weight_product_runs_at_the_fp8_rate_only_when_asked_and_at_full_work():
    """H100: a linear with a weight at the bf16 GEMM rate by default, at 1979e12 x the FP8
    efficiency with FP8 linears, both with work factors (1, 1); block_node_times the same by
    default, and the flash-attention rate for a fused attention (killed: ``fp8``, ``native``
    or ``legacy`` on by default; the FP8 work factors 2.0; ``fp8`` not passed on)."""
    c = Cluster(load_profile("h100-sxm"), 1, 8)
    p = c.profile
    linear = {"op": "aten.linear.default", "params": ["w"], "mm_inner": None}
    assert op_rate(linear, c, "bf16") == (989e12 * p.matmul_efficiency, 1.0, 1.0)
    assert op_rate(linear, c, "bf16", True) == (1979e12 * p.fp8_matmul_efficiency, 1.0, 1.0)
    g = _graph([("lin", "mm", 1e3, 1e3), ("att", "mm", 1e3, 1e3)], [("lin", "att", 1e3)])
    g.nodes["lin"].update(op=linear["op"], params=["w"], fwd_flops=1e12, bwd_flops=0.0, bwd_bytes=0)
    g.nodes["att"].update(op=SDPA, args=[{"is_causal": False}], fwd_flops=1e12, bwd_flops=0.0)
    g.nodes["att"]["bwd_bytes"] = 0
    g.graph.update(param_shapes={"w": [4]}, param_dtype_bytes={"w": 2}, param_owner={})
    blk = _block(["lin", "att"])
    t = block_node_times(g, blk, 1.0, c, "bf16")
    assert t.ops["lin"][0] == pytest.approx(1e12 / (989e12 * p.matmul_efficiency))
    assert t.ops["att"][0] == pytest.approx(1e12 / (989e12 * p.attention_efficiency))
    fp8 = block_node_times(g, blk, 1.0, c, "bf16", fp8=True)
    assert fp8.ops["lin"][0] == pytest.approx(1e12 / (1979e12 * p.fp8_matmul_efficiency))


def test_a_half_inner_dimension_of_one_still_slows_a_short_gemm():
    """K / (K + half) at half = 1: a GEMM over K = 2 takes 3/2 the time forward, backward
    the mean of (4 + 1)/4 and (8 + 1)/8 (killed: no slowdown for half <= 1)."""
    assert inner_dim_slowdowns([2, 4, 8, False], 1.0, 1.0) == (1.5, (5 / 4 + 9 / 8) / 2)


# --------------------------------------------------------------------------- loss_time


@pytest.mark.parametrize("vocab_parallel, shards", [(False, 1), (True, 2)])
def test_the_loss_reads_its_micro_batchs_logits_twice_and_pays_eight_dispatches(
    vocab_parallel, shards
):
    """The last block's bf16 logits of 3e5 bytes per traced set of 2 samples: three fp32
    copies are 3 x 4 x 3e5 / 2 = 1.8e6 bytes for 2 samples, 3.6e6 for a micro-batch of 4,
    split over 2 TP ranks under a vocab-parallel loss; read and written (2x) at the CPU's
    element-wise bandwidth, plus 4 ops each paying the forward and the backward dispatch
    cost (killed: ``* traced_mbs``; the backward cost subtracted; the dispatch subtracted)."""
    cl = cluster_of(2, "cpu")
    p = cl.profile
    training = Training(8, "bf16", "sgd", vocab_parallel_loss=vocab_parallel)
    blocks = [make_block(0, "L", out=3 * 10**5)]
    inp = CostInputs(blocks, [[]], 2, cl, training)
    config = Config(Mesh(pp=1, dp=1, tp=2), 4, "1f1b", 1, 0, [0], [0])
    nbytes = 3 * 4 * 3e5 / 2 * (4 / 2) / shards
    want = 2 * nbytes / (p.memory_bandwidth * p.elementwise_efficiency)
    want += 4 * (p.op_overhead + p.backward_op_overhead)
    assert p.op_overhead > 0 and p.backward_op_overhead > 0
    assert loss_time(inp, config) == pytest.approx(want, rel=1e-12)
