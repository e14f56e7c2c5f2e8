"""A block's options (planner/cost/block_options.py) at numbers worked by hand, written for the
module's generated mutants (docs/mutation.md): the all-to-all buffer of an expert-parallel
block, the BatchNorms that synchronise batch statistics and the batch they need, on graphs
and dictionaries written here."""

from __future__ import annotations

from dataclasses import replace

import networkx as nx
import pytest
from conftest import make_block

from planner.cost.block_options import (
    batch_norm_channels,
    batch_statistics_floor,
    batch_statistics_shapes,
    block_options,
    dispatch_bytes,
    selective_kept,
)
from planner.training import Training
from planner.vocab import OFFLOAD, TPStyle

BN = "aten.native_batch_norm.default"


@pytest.mark.parametrize(
    "dtype,imbalance,expected",
    [
        # 64 routed rows x micro-batch scale 2 x capacity 1.25 x imbalance 1.5 = 240 rows of 32
        ("bf16", 1.5, 240 * 32 * 2),
        ("fp32", 1.5, 240 * 32 * 4),  # fp32 activations: 4 bytes
        ("fp32", 1.0, 160 * 32 * 4),
    ],
)
def test_an_all_to_all_buffer_is_the_routed_rows_padded_times_width_and_bytes(
    dtype, imbalance, expected
):
    training = Training(8, dtype, "adamw", moe_capacity_factor=1.25, moe_imbalance=imbalance)
    moe = {"routed_rows": 64, "width": 32}
    assert dispatch_bytes(moe, 2, training) == expected


def _bn_graph() -> tuple[nx.DiGraph, list]:
    """Two blocks: block 0 a training-mode BatchNorm over [8, 16, 4, 4] (args[5] True), an
    eval-mode one (False) and a product; block 1 a training-mode BatchNorm1d over [8, 32] and
    one over a [8, 24, 1, 1] pooled map."""
    g = nx.DiGraph()

    def bn(name, shape, training=True):
        args = [{"node": "x"}, None, None, None, None, training, 0.1, 1e-5]
        g.add_node(name, op=BN, args=args, shapes=[shape])

    bn("bn0", [8, 16, 4, 4])
    bn("bn_eval", [8, 64, 4, 4], training=False)
    g.add_node("mm", op="aten.mm.default", args=[None] * 8, shapes=[[8, 16]])
    bn("bn1", [8, 32])
    bn("bn_pooled", [8, 24, 1, 1])
    b0, b1 = make_block(0, "a"), make_block(1, "b")
    b0.nodes, b1.nodes = ["bn0", "bn_eval", "mm"], ["bn1", "bn_pooled"]
    return g, [b0, b1]


def test_only_batch_norms_in_training_mode_synchronise_their_channels():
    g, (b0, b1) = _bn_graph()
    assert batch_norm_channels(g, b0) == (16,)
    assert batch_norm_channels(g, b1) == (32, 24)
    assert batch_statistics_shapes(g) == [[8, 16, 4, 4], [8, 32], [8, 24, 1, 1]]
    g.add_node("bn_flat", op=BN, args=[None] * 5 + [True], shapes=[[8]])
    b1.nodes.append("bn_flat")
    assert batch_norm_channels(g, b1) == (32, 24, 1)  # no channel dimension: one channel
    g.add_node("bn_short", op=BN, args=[None] * 5, shapes=[[8, 16]])  # no training flag
    b1.nodes.append("bn_short")
    assert batch_norm_channels(g, b1) == (32, 24, 1)


def test_one_value_a_channel_needs_two_samples_and_a_map_needs_one():
    g, _ = _bn_graph()
    assert batch_statistics_floor(g) == 2  # [8, 32] and the 1 x 1 map: one value a channel
    g.remove_nodes_from(["bn1", "bn_pooled"])
    assert batch_statistics_floor(g) == 1  # a 4 x 4 map has 16 values a channel a sample
    g.add_node("tall", op=BN, args=[None] * 5 + [True], shapes=[[8, 16, 4, 1]])
    assert batch_statistics_floor(g) == 1  # a 4 x 1 map: 4 values
    g.remove_node("tall")
    g.remove_node("bn0")
    assert batch_statistics_shapes(g) == []
    assert batch_statistics_floor(g) == 1
    # one map of 1 x 1 alone
    g.add_node("p", op=BN, args=[None] * 5 + [True], shapes=[[8, 24, 1, 1]])
    assert batch_statistics_floor(g) == 2


S, H, HEADS = 64, 256, 8  # tests/test_selective_runtime.py's Llama layer
LLAMA = dict(
    size="tiny", layers=2, hidden=H, heads=HEADS, kv_heads=2, ffn=512, seq_len=S, vocab=1000
)


# Traced models and TP variants are kept in the module, not in fixtures: mutmut forks each
# mutant's test run from the session that ran the clean tests, so a child reuses what that
# session computed (neither depends on block_options.py) and a mutant costs milliseconds.
_KEPT: dict = {}


def _kept(key, make):
    if key not in _KEPT:
        _KEPT[key] = make()
    return _KEPT[key]


def _trace(name: str, args: dict):
    from pathlib import Path

    from planner.api import trace

    root = Path(__file__).resolve().parent.parent
    path = str(root / "examples" / name)
    return _kept(name, lambda: trace(path, args, traced_batch_size=1, dtype="bf16"))


def _tp_variants(graph, block, tp: int) -> list:
    from planner.cost.sharding import tp_variants

    return _kept((id(graph), block.index, tp), lambda: tp_variants(graph, block, tp))


@pytest.fixture(scope="module")
def llama():
    return _trace("llama.py", LLAMA)


def test_selective_kept_of_a_tp_variant_is_one_ranks_bytes_under_the_runtimes_policy(llama):
    """test_selective_runtime's per-rank count: the Llama layer's sequence-parallel TP 2
    variant keeps o and down as their reduce-scattered shards and the input as its shard
    (128 a token each), q, k, v, gate and up halved, SDPA's output and fp32 log-sum-exp
    halved: 2 x 64 x (128 + 128 + 32 + 32 + 128 + 128 + 256 + 256 + 128) + 4 x 4 x 64 bytes.
    torchtitan's policy does not price per rank: a variant changes nothing there."""
    from dataclasses import replace

    from planner.cost.block_options import runtime_selective, selective_ops

    layer = llama.blocks[1]
    sp = next(v for v in _tp_variants(llama.graph, layer, 2) if v.name == "tp2-v1-sp")
    runtime = Training(8, "bf16", "adamw")
    kept, recomputed = selective_kept(llama.graph, layer, runtime, sp)
    per_token = 128 + 128 + 32 + 32 + 128 + 128 + 256 + 256 + 128
    assert kept == 2 * S * per_token + 4 * (HEADS // 2) * S
    saved, _ = selective_ops(llama.graph, layer, runtime)
    assert recomputed == runtime_selective(llama.graph, layer, saved, sp)[1]
    # torchtitan's: the whole input, q, v, gate and down (the 1st, 3rd, 5th and 7th weight
    # products), SDPA's output and log-sum-exp, with or without the variant
    titan = replace(runtime, selective_policy="torchtitan-op")
    whole = 2 * S * (256 + 256 + 64 + 256 + 512 + 256) + 4 * HEADS * S
    assert selective_kept(llama.graph, layer, titan)[0] == whole
    assert selective_kept(llama.graph, layer, titan, sp)[0] == whole


# ---------------------------------------------------------------- block_options, priced whole
# Each option of a block is the sum of its terms, each stated by a function of its own and
# tested there (compute.py's roofline, overheads, TP shares and ring attention; collectives'
# times; dispatch_bytes; selective_price): ``_priced`` adds them up as docs/cost_model.md says,
# at settings where every term is non-zero and distinct (TP 2 across two nodes, micro-batch 3,
# overlapped TP, a capacity factor, imbalance), so that a term dropped, doubled, swapped or
# scaled by the wrong micro-batch shows in some field of some option.


def _priced(
    graph, block, variants, mbs, cluster, tp_ranks, training, offload=True, ep=None, cp=None
):
    from planner.cost.block_options import selective_ops
    from planner.cost.compute import (
        NodeTimes,
        block_node_times,
        node_times,
        op_counts,
        overhead_times,
        ring_attention_times,
        tp_exposed,
        tp_shares,
    )
    from planner.hardware.collectives import collective_time
    from planner.trace.blocks import cached_core_nodes, product_share

    scale = mbs / graph.graph["traced_batch_size"] / (len(cp) if cp else 1)
    kernels = dict(
        fp8=training.fp8_linears,
        native=training.native_attention,
        legacy=training.legacy_attention,
        fused=training.fused_elementwise,
    )
    times = block_node_times(graph, block, scale, cluster, training.dtype, None, **kernels)
    more_f, more_b = ring_attention_times(graph, block, scale, cluster, training, cp)
    n_ep = len(ep) if ep else 1
    moe = block.extra.get("moe")
    experts = float(moe["expert_params"]) if moe else 0.0
    a2a = 0.0
    if moe:
        factor = training.moe_capacity_factor * (training.moe_imbalance if n_ep > 1 else 1)
        e_f, e_b, _ = node_times(
            graph, block, scale, cluster, training.dtype, _experts(graph, block), **kernels
        )
        more_f, more_b = more_f + e_f * (factor - 1), more_b + e_b * (factor - 1)
        if n_ep > 1:
            a2a = 2 * collective_time(
                "all_to_all", dispatch_bytes(moe, scale, training), cluster, ep
            )
    core = [n for n in block.nodes if n in cached_core_nodes(graph)]
    compute = NodeTimes(ops={n: (t[0], 0.0, t[2], 0.0) for n, t in times.ops.items()})
    policy = selective_ops(graph, block, training)
    out = []
    for v in variants:
        cf = v.compute_fraction
        o_f, o_b, o_sel = overhead_times(op_counts(graph, block), v.tp_plan, len(tp_ranks), cluster)
        shares = tp_shares(v, times, graph)
        if shares is None:
            mbf = v.memory_bound_fraction
            ops = (times.fwd_compute * cf + times.fwd_memory * mbf,
                   times.bwd_compute * cf + times.bwd_memory * mbf)  # fmt: skip
            gemm = (times.fwd_compute * cf, times.bwd_compute * cf)
            core_f = times.core_fwd * cf
        else:
            ops, gemm = times.sharded(shares), compute.sharded(shares)
            core_f = times.sharded(shares, core)[0]
        fwd = ops[0] + more_f * cf + o_f + a2a
        bwd = ops[1] + more_b * cf + o_b + a2a
        comm = [
            sum(collective_time(k, b * scale, cluster, tp_ranks) for k, b in c)
            for c in (v.comm_fwd, v.comm_bwd)
        ]
        if training.tp_overlap:
            async_share = cluster.profile.async_tp_overlap if training.tp_overlap_async else 1.0
            comm = tp_exposed(*comm, gemm[0] + more_f * cf, gemm[1] + more_b * cf, cluster,
                              async_share)  # fmt: skip
        sel_bytes, sel_f, sel_comm = _selective(
            graph, block, v, policy, training, times, shares, core_f, scale, cluster, tp_ranks
        )
        params = block.params * v.param_fraction - experts * (1 - 1 / n_ep)
        kept = {
            "none": (0.0, v.saved_bytes, 0.0, 0.0),
            "selective": (sel_f + o_sel + sel_comm, sel_bytes, sel_comm, v.saved_bytes - sel_bytes),
            "full": (fwd + comm[0], float(v.input_bytes), comm[0], v.saved_bytes),
        }
        for rc, (extra, act, re_comm, peak) in kept.items():
            if rc != "none" and act >= v.saved_bytes:
                continue
            offloads = OFFLOAD if offload and block.params > 0 else ("none",)
            for off in offloads:
                out.append(
                    dict(
                        variant=v.name,
                        recompute=rc,
                        offload=off,
                        fwd_s=fwd + comm[0],
                        bwd_s=bwd + extra + comm[1],
                        tp_comm_s=comm[0] + comm[1] + re_comm,
                        params=params,
                        param_tensors=len(block.param_names),
                        product_params=params * product_share(graph, block),
                        act_bytes=act * scale,
                        recompute_peak_bytes=peak * scale,
                        transient_bytes=block.transient_bytes * scale * cf,
                        tp_plan=tuple(sorted(v.tp_plan.items())),
                        tp_grad_sums=v.grad_sums,
                        tp_local_attributes=v.local_attributes,
                        ep=n_ep,
                        expert_params=experts / n_ep,
                        ep_comm_s=2 * a2a + (a2a if rc == "full" else 0.0),
                        norm_channels=batch_norm_channels(graph, block),
                        takes_sequence_shard=v.takes_sequence_shard,
                        leaves_sequence_shard=v.leaves_sequence_shard,
                    )  # fmt: skip
                )
    return out


def _experts(graph, block):
    """The ops inside the block's expert modules (a module or one of its children)."""
    mods = block.extra["moe"]["modules"]
    return [
        n
        for n in block.nodes
        if any(graph.nodes[n]["module"] in (m,) or graph.nodes[n]["module"].startswith(m + ".")
               for m in mods)
    ]  # fmt: skip


def _selective(graph, block, v, policy, training, times, shares, core_f, scale, cluster, ranks):
    """(bytes kept, forward re-run, collectives re-run) of selective recompute: Megatron's
    core (the traced selective bytes, the core's forward); torchtitan's (the traced block's
    kept share of the variant's saved bytes); the runtime's (one rank's kept bytes, and the
    gather of a sequence-parallel input it re-enters with)."""
    from planner.cost.block_options import kept_bytes, runtime_selective
    from planner.hardware.collectives import collective_time

    if policy is None:
        return v.saved_selective_bytes, core_f, 0.0
    saved, recomputed = policy
    comm = 0.0
    if training.selective_policy == "runtime-op":
        kept, recomputed = runtime_selective(graph, block, saved, v)
        share = kept / v.saved_bytes if v.saved_bytes else 0.0  # nothing saved: nothing kept
        if TPStyle.SP_BLOCK in v.tp_plan.values() and not v.takes_sequence_shard:
            comm = collective_time("all_gather", v.input_bytes * v.tp * scale, cluster, ranks)
    else:
        share = kept_bytes(graph, block, saved) / block.saved_bytes if block.saved_bytes else 0.0
    if shares is None:
        re_f = sum(times.ops[n][0] + times.ops[n][1] for n in recomputed) * v.compute_fraction
    else:
        re_f = times.sharded(shares, recomputed)[0]
    return v.saved_bytes * min(share, 1.0), re_f, comm


def _same(options, expected):
    from dataclasses import asdict

    got = [asdict(o) for o in options]
    assert [(o["variant"], o["recompute"], o["offload"]) for o in got] == [
        (e["variant"], e["recompute"], e["offload"]) for e in expected
    ]
    for o, e in zip(got, expected):
        for k, want in e.items():
            if isinstance(want, float):
                assert o[k] == pytest.approx(want, rel=1e-12, abs=1e-30), (o["variant"], k)
            else:
                assert o[k] == want, (o["variant"], k)
            assert isinstance(want, str | float) or type(o[k]) is type(want), (k, o[k])


def _two_node_cluster(gpus_per_node: int = 1):
    from conftest import cluster_of

    # the TP pair crosses the NIC; DTensor's per-module and the checkpoint policy's per-op
    # host overheads (0 on the GPU profiles) made non-zero, so that each shows
    overheads = dict(tp_module_overhead=3e-6, tp_gather_overhead=5e-6, selective_op_overhead=2e-7)
    return cluster_of(2 * gpus_per_node, "h100-sxm", gpus_per_node=gpus_per_node, **overheads)


def _variants(graph, block):
    """The layer's TP 2 variants, the sharding ILP's, plus one without per-op states (priced
    by the block's average fractions) and one whose selective and full recompute keep all
    it saves (so neither is offered)."""
    from dataclasses import replace

    vs = _tp_variants(graph, block, 2)
    busiest = max(vs, key=lambda v: len(v.comm_fwd))  # the most collectives
    avg = replace(
        busiest, name="avg", states={}, compute_fraction=0.625, memory_bound_fraction=0.375
    )
    full = replace(vs[0], name="keeps-all", saved_selective_bytes=vs[0].saved_bytes,
                   input_bytes=vs[0].saved_bytes)  # fmt: skip
    # what the record carries over from the variant, set (the ILP's leave them empty here)
    carried = replace(vs[0], name="carried", grad_sums=("m.norm",),
                      local_attributes=("m.num_heads",), takes_sequence_shard=True,
                      leaves_sequence_shard=True)  # fmt: skip
    nothing = replace(vs[0], name="saves-nothing", saved_bytes=0, saved_selective_bytes=0)
    return [*vs, avg, full, carried, nothing]


@pytest.mark.parametrize(
    "settings",
    [
        dict(selective_policy="runtime-op", tp_overlap=True, fp8_linears=True),
        dict(
            selective_policy="torchtitan-op",
            tp_overlap=True,
            tp_overlap_async=True,
            native_attention=True,
        ),  # fmt: skip
        dict(selective_policy="core", fused_elementwise=True, legacy_attention=True),
        dict(selective_policy="runtime-op", dtype="fp32"),
    ],
    ids=["runtime", "torchtitan-async", "core-fused", "fp32"],
)
@pytest.mark.parametrize("per_node", [1, 2], ids=["nic", "nvlink"])
def test_each_option_of_a_tp_layer_adds_up_its_terms(llama, settings, per_node):
    """Across nodes the TP collectives outlast the layer's products; inside one node (NVLink)
    the products hide more of them than async TP's share would, so that share shows."""
    from dataclasses import replace

    training = replace(Training(8, "bf16", "adamw"), **settings)
    g, layer, cl = llama.graph, llama.blocks[1], _two_node_cluster(per_node)
    vs = _variants(g, layer)
    opts = block_options(g, layer, vs, 3, cl, [0, 1], training)
    kept_all = {o.recompute for o in opts if o.variant == "keeps-all"}
    assert "full" not in kept_all and ("selective" in kept_all) != (
        settings["selective_policy"] == "core"
    )
    assert len({o.offload for o in opts}) == 3
    _same(opts, _priced(g, layer, vs, 3, cl, [0, 1], training))
    # no offload where it is not allowed, nor for a block without parameters
    no_off = block_options(g, layer, vs, 3, cl, [0, 1], training, offload_allowed=False)
    _same(no_off, _priced(g, layer, vs, 3, cl, [0, 1], training, offload=False))
    one = replace(layer, params=1)  # one parameter is still something to offload
    _same(block_options(g, one, vs, 3, cl, [0, 1], training),
          _priced(g, one, vs, 3, cl, [0, 1], training))  # fmt: skip
    unsaved = replace(layer, saved_bytes=0)  # a traced block that saved nothing keeps nothing
    _same(block_options(g, unsaved, vs, 3, cl, [0, 1], training),
          _priced(g, unsaved, vs, 3, cl, [0, 1], training))  # fmt: skip
    empty = replace(layer, params=0)
    _same(block_options(g, empty, vs, 3, cl, [0, 1], training),
          _priced(g, empty, vs, 3, cl, [0, 1], training))  # fmt: skip


def test_a_context_parallel_layer_runs_its_share_of_the_tokens_and_the_ring(llama):
    """cp 2 over two nodes: the terms at 3/2 traced samples, and the ring's exposed time."""
    g, layer, cl = llama.graph, llama.blocks[1], _two_node_cluster()
    training = Training(8, "bf16", "adamw", tp_overlap=True)
    vs = _variants(g, layer)[:1]
    opts = block_options(g, layer, vs, 3, cl, [0], training, cp_ranks=[0, 1])
    _same(opts, _priced(g, layer, vs, 3, cl, [0], training, cp=[0, 1]))
    # with TP 2 inside each node (cp across them): the ring's time, on one TP rank's share of
    # the heads, is compute the overlapped TP collectives hide behind
    tp_cl = _two_node_cluster(2)
    every = _variants(g, layer)
    with_tp = block_options(g, layer, every, 3, tp_cl, [0, 1], training, cp_ranks=[0, 2])
    _same(with_tp, _priced(g, layer, every, 3, tp_cl, [0, 1], training, cp=[0, 2]))
    plain = block_options(g, layer, vs, 3, cl, [0], training)
    assert opts[0].act_bytes == pytest.approx(plain[0].act_bytes / 2, rel=1e-12)
    assert opts[0].fwd_s > block_options(g, layer, vs, 1.5, cl, [0], training)[0].fwd_s


@pytest.fixture(scope="module")
def moe():
    traced = _trace("moe.py", {"size": "tiny"})
    return traced, next(b for b in traced.blocks if b.extra.get("moe"))


@pytest.mark.parametrize("kernels", [{}, {"fused_elementwise": True, "fp8_linears": True}])
@pytest.mark.parametrize("ep", [None, [0], [0, 1]], ids=["no-ep", "ep1", "ep2"])
def test_a_moe_blocks_options_pay_the_busiest_expert_rank_and_its_all_to_alls(moe, ep, kernels):
    """Capacity factor 1.25, imbalance 1.5 (only under expert parallelism): the experts'
    compute grows by the factor less one; each pass dispatches and combines (two all-to-alls
    forward, two backward, two more under full recompute); 1/ep of the experts held."""
    traced, blk = moe
    training = Training(8, "bf16", "adamw", moe_capacity_factor=1.25, moe_imbalance=1.5)
    training = replace(training, **kernels)
    cl = _two_node_cluster()
    vs = _tp_variants(traced.graph, blk, 1)
    opts = block_options(traced.graph, blk, vs, 3, cl, [0], training, ep_ranks=ep)
    _same(opts, _priced(traced.graph, blk, vs, 3, cl, [0], training, ep=ep))
    experts = blk.extra["moe"]["expert_params"]
    assert opts[0].expert_params == experts / (len(ep) if ep else 1)
    assert (opts[0].ep_comm_s > 0) == (ep == [0, 1])


# ---------------------------------------------------------------- what selective recompute keeps


def test_each_policy_saves_its_ops_and_reruns_the_rest_up_to_the_last_save(llama):
    """The Llama layer: seven weight products (q k v o gate up down) and SDPA. The runtime's
    policy saves all eight and re-runs every other op before the down projection (its last
    saving op, which keeps its input, not its output: the residual add after it is not re-run);
    torchtitan's saves q, v, gate, down (the 1st, 3rd, 5th, 7th product) and SDPA and re-runs
    the rest; with FP8 linears (``aten._scaled_mm``) neither saves a product."""
    from planner.cost.block_options import selective_ops

    g, layer = llama.graph, llama.blocks[1]
    products = [f"linear{s}" for s in ("", "_1", "_2", "_3", "_4", "_5", "_6")]
    sdpa = "scaled_dot_product_attention"
    rest = [n for n in layer.nodes if n not in (*products, sdpa)]
    runtime = Training(8, "bf16", "adamw")
    saved, rerun = selective_ops(g, layer, runtime)
    assert saved == {*products, sdpa}
    assert rerun == [n for n in rest if n != "add_8"] and rest[-1] == "add_8"
    # one rank of a TP variant without sequence parallelism re-runs the same ops
    from planner.cost.block_options import runtime_selective

    plain = next(v for v in _tp_variants(g, layer, 2) if "sp_block" not in v.tp_plan.values())
    assert runtime_selective(g, layer, saved, plain)[1] == rerun
    # a sequence-parallel one also re-runs o_proj (its reduce-scattered output is kept, not
    # its input); down_proj, the last saving op, keeps its input and is not re-run
    sp = next(v for v in _tp_variants(g, layer, 2) if "sp_block" in v.tp_plan.values())
    assert runtime_selective(g, layer, saved, sp)[1] == [
        n for n in layer.nodes if n in rerun or n == "linear_3"
    ]
    titan = replace(runtime, selective_policy="torchtitan-op")
    saved, rerun = selective_ops(g, layer, titan)
    assert saved == {"linear", "linear_2", "linear_4", "linear_6", sdpa}
    assert rerun == [n for n in layer.nodes if n not in saved]
    for policy in ("runtime-op", "torchtitan-op"):
        fp8 = replace(runtime, selective_policy=policy, fp8_linears=True)
        assert selective_ops(g, layer, fp8)[0] == {sdpa}
    assert selective_ops(g, layer, replace(runtime, selective_policy="core")) is None
    assert selective_kept(g, layer, replace(runtime, selective_policy="core")) is None
    with pytest.raises(ValueError, match="unknown selective recompute policy 'other'"):
        selective_ops(g, layer, replace(runtime, selective_policy="other"))


def _saving_graph(own: bool):
    """a -> b (saves a) -> c (a weight product saving b, and its own output when ``own``) -> d."""
    g = nx.DiGraph()
    g.add_node("a", saved=[])
    g.add_node("b", saved=[("a", [4])])
    g.add_node("c", saved=[("b", [4])] + ([("c", [4])] if own else []), params=["w"])
    g.add_node("d", saved=[])
    block = make_block(0, "x")
    block.nodes = ["a", "b", "c", "d"]
    return g, block


def test_the_recompute_stops_at_the_last_op_that_saves_and_reruns_it_only_if_it_keeps_its_output():
    from planner.cost.block_options import _before_last_save

    g, block = _saving_graph(own=False)
    assert _before_last_save(g, block, ["a", "b", "c", "d"]) == ["a", "b"]
    assert _before_last_save(g, block, ["d", "b"]) == ["b"]
    g, block = _saving_graph(own=True)
    assert _before_last_save(g, block, ["a", "b", "c", "d"]) == ["a", "b", "c"]
    g.nodes["c"]["params"] = []  # still the last: it saves
    assert _before_last_save(g, block, ["c", "d"]) == ["c"]
    g.nodes["c"]["saved"] = []
    g.nodes["c"]["params"] = ["w"]  # a weight's reader is a saving op too
    assert _before_last_save(g, block, ["a", "b", "c"]) == ["a", "b"]
    g.nodes["c"]["params"] = []  # now b is the last, saving only a
    assert _before_last_save(g, block, ["a", "b", "c"]) == ["a"]
    for n in "abcd":
        g.nodes[n]["saved"] = []
    assert _before_last_save(g, block, ["a", "b"]) == []  # nothing saved: nothing reached


def test_a_fused_attentions_kernel_also_returns_its_fp32_log_sum_exp():
    from planner.cost.block_options import kernel_output_bytes

    sdpa = "aten._scaled_dot_product_flash_attention.default"
    assert kernel_output_bytes({"op": sdpa, "out_bytes": 100, "shapes": [[2, 3, 5, 7]]}) == (
        100 + 2 * 3 * 5 * 4
    )
    assert kernel_output_bytes({"op": sdpa, "out_bytes": 100, "shapes": [[5, 7]]}) == 120
    assert kernel_output_bytes({"op": sdpa, "out_bytes": 100, "shapes": [[7]]}) == 100
    assert kernel_output_bytes({"op": sdpa, "out_bytes": 100, "shapes": [None]}) == 100
    assert (
        kernel_output_bytes({"op": "aten.mm.default", "out_bytes": 100, "shapes": [[9, 9]]}) == 100
    )


def test_kept_bytes_are_the_input_and_each_saved_output_a_shard_where_sharded():
    from planner.cost.block_options import kept_bytes

    g = nx.DiGraph()
    g.add_node("p", op="aten.mm.default", out_bytes=64)
    g.add_node("q", op="aten.mm.default", out_bytes=32)
    block = make_block(0, "x")  # input_bytes 4096
    assert kept_bytes(g, block, {"p", "q"}) == 4096 + 96
    assert kept_bytes(g, block, {"p", "q"}, {"p": "S0", "q": "P"}, 4) == 4096 + 16 + 32
    assert kept_bytes(g, block, {"p"}, {"p": "S1"}, 4, 1000.0) == 1016
    assert kept_bytes(g, block, set(), None, 4, 0.0) == 0.0


def test_the_runtimes_recompute_gathers_a_sequence_parallel_input_it_did_not_take_as_a_shard():
    from types import SimpleNamespace

    from planner.cost.block_options import is_sequence_parallel, recompute_collectives

    def variant(style, takes):
        return SimpleNamespace(tp_plan={"m": "colwise", "n": style}, input_bytes=100, tp=4,
                               takes_sequence_shard=takes)  # fmt: skip

    assert recompute_collectives(variant("sp_block", False)) == [("all_gather", 400.0)]
    assert recompute_collectives(variant("sp_block", True)) == []
    assert recompute_collectives(variant("rowwise", False)) == []
    assert is_sequence_parallel(variant("sp_block", True))
    assert not is_sequence_parallel(variant("colwise_sp", False))


def test_a_moe_blocks_expert_ops_are_those_inside_its_expert_modules():
    from planner.cost.block_options import expert_nodes

    g = nx.DiGraph()
    for n, module in [("r", "l.router"), ("e", "l.experts"), ("w", "l.experts.w1"),
                      ("x", "l.experts2"), ("s", "l.shared")]:  # fmt: skip
        g.add_node(n, module=module)
    block = make_block(0, "m")
    block.nodes = ["r", "e", "w", "x", "s"]
    block.extra = {"moe": {"modules": ["l.experts", "l.shared"]}}
    assert expert_nodes(g, block) == ["e", "w", "s"]
    block.extra = {"moe": {"modules": ["l.experts"]}}
    assert expert_nodes(g, block) == ["e", "w"]
    for dense in ({}, {"moe": {}}):  # no experts: no expert ops
        block.extra = dense
        assert expert_nodes(g, block) == []


def test_a_mixtral_layer_split_over_experts_and_the_sequence_adds_both_excesses():
    """Mixtral's layer (SDPA and experts) at ep 2 and cp 2: the ring's exposed time and the
    busiest expert rank's excess both add to the layer's compute (the search does not pair
    the two, but block_options prices what it is given)."""
    traced = _trace("mixtral.py", {"size": "tiny"})
    blk = next(b for b in traced.blocks if b.extra.get("moe"))
    training = Training(8, "bf16", "adamw", moe_capacity_factor=1.25, moe_imbalance=1.5)
    cl = _two_node_cluster()
    vs = _tp_variants(traced.graph, blk, 1)
    opts = block_options(traced.graph, blk, vs, 2, cl, [0], training, ep_ranks=[0, 1],
                         cp_ranks=[0, 1])  # fmt: skip
    _same(opts, _priced(traced.graph, blk, vs, 2, cl, [0], training, ep=[0, 1], cp=[0, 1]))


def test_a_trace_of_two_samples_scales_to_the_micro_batch_as_one_of_one_does(llama):
    """The options of micro-batch 6 from a graph traced at 2 samples equal those of 3 from
    the same graph taken as traced at 1: every term scales by micro-batch / traced."""
    g, layer, cl = llama.graph, llama.blocks[1], _two_node_cluster()
    two = g.copy()
    two.graph["traced_batch_size"] = 2
    training = Training(8, "bf16", "adamw", tp_overlap=True)
    vs = _variants(g, layer)
    assert block_options(two, layer, vs, 6, cl, [0, 1], training) == block_options(
        g, layer, vs, 3, cl, [0, 1], training
    )


def test_megatrons_core_recompute_reruns_the_attention_core_of_a_gpt_layer():
    """The tiny GPT's explicit attention has a core (mask, softmax, dropout between the two
    activation products), which Megatron's selective recompute drops and re-runs: its
    forward, on one TP rank of each variant, is the option's extra backward."""
    gpt = _trace("gpt.py", {"size": "tiny"})
    layer = gpt.blocks[1]
    training = Training(8, "bf16", "adamw", selective_policy="core")
    cl = _two_node_cluster()
    vs = _variants(gpt.graph, layer)
    opts = block_options(gpt.graph, layer, vs, 3, cl, [0, 1], training)
    assert any(o.recompute == "selective" for o in opts)
    _same(opts, _priced(gpt.graph, layer, vs, 3, cl, [0, 1], training))


def test_a_resnet_blocks_options_name_the_channels_its_batch_norms_synchronise():
    """The tiny ResNet's first block: its training-mode BatchNorms' channels, carried on every
    option (the data-parallel replicas synchronise them, ``batchnorm_sync_time``)."""
    resnet = _trace("resnet.py", {"size": "tiny"})
    blk = next(b for b in resnet.blocks if batch_norm_channels(resnet.graph, b))
    training = Training(8, "bf16", "adamw")
    cl = _two_node_cluster()
    vs = _tp_variants(resnet.graph, blk, 1)
    opts = block_options(resnet.graph, blk, vs, 2, cl, [0], training)
    _same(opts, _priced(resnet.graph, blk, vs, 2, cl, [0], training))
    assert opts[0].norm_channels


def test_on_cpus_the_layers_products_are_compute_bound_and_hide_overlapped_collectives(llama):
    """The CPU profile (two hosts): the layer's products are compute-bound there (on an H100
    they are memory-bound at these sizes, so no compute hides a collective), so the share of
    them each variant runs shows in the exposed TP time."""
    from conftest import cluster_of

    g, layer = llama.graph, llama.blocks[1]
    cl = cluster_of(2, "cpu", gpus_per_node=1, async_tp_overlap=0.4)
    vs = _variants(g, layer)
    for async_tp in (False, True):  # async TP hides at most 0.4 of them, however long
        training = Training(8, "fp32", "adamw", tp_overlap=True, tp_overlap_async=async_tp)
        opts = block_options(g, layer, vs, 3, cl, [0, 1], training)
        _same(opts, _priced(g, layer, vs, 3, cl, [0, 1], training))
