"""The cost model against the published formulas it must reproduce (written here from the
papers, not from our code)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from conftest import cluster_of, make_block, make_option

from planner.cost.memory import state_memory, step_state_bytes
from planner.cost.pipeline import inflight_microbatches
from planner.cost.records import Config, CostInputs
from planner.cost.step import evaluate
from planner.hardware.cluster import Cluster
from planner.hardware.collectives import collective_time
from planner.schema.mesh import Mesh
from planner.training import Training

# The ZeRO paper counts DeepSpeed's states: 16-bit gradients in buffers kept all step.
ADAM_MIXED = Training(64, "bf16", "adamw", persistent_grad_buffers=True)
# meshplan's runtime: torch's .grad in the fp32 parameter's dtype, allocated by backward,
# stepped by torch's foreach AdamW (its step on CPU ranks; on GPUs it was until 2026-11-26).
ADAM_TORCH = Training(64, "bf16", "adamw", fused_optimizer=False)


@pytest.mark.parametrize("n", [1, 4, 16, 64, 1024])
def test_zero_model_states_match_the_zero_paper(n):
    psi = 7.5e9
    expected = {
        0: (2 + 2 + 12) * psi,
        1: 4 * psi + 12 * psi / n,
        2: 2 * psi + 14 * psi / n,
        3: 16 * psi / n,
    }
    for zero, want in expected.items():
        got = state_memory(psi, zero, n, "none", ADAM_MIXED)
        assert got["params"] + got["grads"] + got["optimizer"] == pytest.approx(want, rel=1e-12)
        assert got["step_temp"] == 0  # fused optimizers step in place


@pytest.mark.parametrize("n", [1, 8])
def test_torch_states_are_fp32_gradients_and_a_foreach_temporary(n):
    """What an H200 held for a Llama-1B (1.498e9 parameters, bf16, AdamW, one GPU) between
    the phases of a step (benchmarks/gpu_accuracy.py probe, 2026-11-26): 17.98e9 bytes between
    steps (fp32 weights and two moments, 12 per parameter), 6.0e9 more after backward (fp32
    gradients, 4) and 6.0e9 more again at the optimizer step's peak (one fp32 temporary)."""
    psi = 1.498e9
    for zero in (0, 1, 2, 3):
        got = state_memory(psi, zero, n, "none", ADAM_TORCH)
        shard = psi / n if zero >= 1 else psi
        assert got["optimizer"] == pytest.approx(12 * shard)
        assert got["grads"] == pytest.approx(4 * (psi / n if zero >= 2 else psi))
        assert got["step_temp"] == pytest.approx(4 * shard)
        fused = state_memory(psi, zero, n, "none", Training(64, "bf16", "adamw"))
        assert fused["step_temp"] == 0  # torch's fused step, the runtime's on GPUs
    one = state_memory(psi, 0, 1, "none", ADAM_TORCH)
    assert one["optimizer"] == pytest.approx(17.98e9, rel=2e-3)
    assert one["optimizer"] + one["grads"] == pytest.approx(17.98e9 + 6.0e9, rel=2e-3)
    assert step_state_bytes(one, ADAM_TORCH) == pytest.approx(17.98e9 + 12.0e9, rel=2e-3)


@pytest.mark.parametrize(
    "n,os_gb,osg_gb,osgp_gb",
    [(64, 31.4, 16.6, 1.88), (1024, 30.1, 15.1, 0.12)],
)
def test_zero_table_1_reproduced_to_printed_precision(n, os_gb, osg_gb, osgp_gb):
    """ZeRO paper Table 1, 7.5B parameters, K = 12, GB = 1e9 bytes."""
    psi = 7.5e9

    def gb(zero):
        s = state_memory(psi, zero, n, "none", ADAM_MIXED)
        return (s["params"] + s["grads"] + s["optimizer"]) / 1e9

    assert round(gb(1), 1) == os_gb
    assert round(gb(2), 1) == osg_gb
    assert round(gb(3), 2) == osgp_gb


def test_offload_moves_optimizer_states_to_host():
    s = state_memory(1e9, 0, 1, "optimizer", ADAM_MIXED)
    assert s["optimizer"] == 0 and s["host"] == 12e9 and s["params"] == 2e9
    s = state_memory(1e9, 3, 4, "optimizer+params", ADAM_MIXED)
    assert s["params"] == s["grads"] == s["optimizer"] == 0
    assert s["host"] == pytest.approx(16e9 / 4)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_collectives_follow_nccl_bus_bandwidth_formulas(n):
    cl = cluster_of(8)
    bw = cl.profile.intra_node_bandwidth * cl.profile.collective_efficiency
    lat = cl.profile.intra_node_latency
    size = 3.0e9
    ranks = list(range(n))
    assert collective_time("all_reduce", size, cl, ranks) == pytest.approx(
        size * 2 * (n - 1) / (n * bw) + 2 * (n - 1) * lat
    )
    for kind in ("all_gather", "reduce_scatter", "all_to_all"):
        assert collective_time(kind, size, cl, ranks) == pytest.approx(
            size * (n - 1) / (n * bw) + (n - 1) * lat
        )


@pytest.mark.parametrize("n", [2, 8])
def test_each_collective_call_pays_the_in_situ_sync_once(n):
    """collective_sync_s is a per-call cost (ranks arriving apart, a sleeping waiter woken),
    independent of the ring's step count and of the bytes; nothing moved costs nothing."""
    base = cluster_of(8)
    cl = Cluster(replace(base.profile, collective_sync=1.5e-3), base.nodes, base.gpus_per_node)
    ranks = list(range(n))
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        for size in (4e3, 3e9):
            extra = collective_time(kind, size, cl, ranks) - collective_time(
                kind, size, base, ranks
            )
            assert extra == pytest.approx(1.5e-3)
        assert collective_time(kind, 0.0, cl, ranks) == 0.0
        assert collective_time(kind, 1e6, cl, [0]) == 0.0


def test_cross_node_group_is_slower():
    cl = cluster_of(16)
    inside = collective_time("all_reduce", 1e9, cl, [0, 1, 2, 3])
    across = collective_time("all_reduce", 1e9, cl, [0, 1, 8, 9])
    assert across > inside


def _pipeline_inputs(p: int, per_stage_time: float, blocks_per_stage: int = 2):
    n = p * blocks_per_stage
    blocks = [make_block(i, "layer", params=0, boundary=0, out=0) for i in range(n)]  # no loss
    opts = [[make_option(per_stage_time / blocks_per_stage, 0.0, 1e6)] for _ in range(n)]
    cl = cluster_of(p)
    return CostInputs(blocks, opts, 1, cl, Training(64, "bf16", "adamw")), n


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16)])
def test_1f1b_step_time_is_sum_plus_m_minus_1_max(p, m):
    t = 0.01
    inp, n = _pipeline_inputs(p, t)
    inp.training = Training(m, "bf16", "adamw")
    stage_of = [i // 2 for i in range(n)]
    cost = evaluate(inp, Config(Mesh(p, 1, 1), 1, "1f1b", 1, 0, stage_of, [0] * n))
    assert cost.pipeline_s == pytest.approx(p * t + (m - 1) * t)
    assert cost.bubble_s / (m * t) == pytest.approx((p - 1) / m)


@pytest.mark.parametrize("v", [2, 4])
def test_interleaved_bubble_is_one_over_v(v):
    p, m, t = 4, 8, 0.01
    n = p * v * 2
    inp, _ = _pipeline_inputs(p, t / v, blocks_per_stage=2)
    inp.blocks = [make_block(i, "layer", params=0, boundary=0, out=0) for i in range(n)]  # no loss
    inp.options = [[make_option(t / v / 2, 0.0, 1e6)] for _ in range(n)]
    inp.training = Training(m, "bf16", "adamw")
    stage_of = [i // 2 for i in range(n)]
    inter = evaluate(inp, Config(Mesh(p, 1, 1), 1, "interleaved_1f1b", v, 0, stage_of, [0] * n))
    # 1F1B bubble (p-1)/m of the ideal m*t; interleaved: 1/v of it
    assert inter.bubble_s / (m * t) == pytest.approx((p - 1) / (v * m))
    assert inter.pipeline_s == pytest.approx(m * t + (p - 1) * t / v)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 2), (8, 3)])
def test_1f1b_stage_j_holds_min_m_p_minus_j_microbatches(p, m):
    act = 1e6
    inp, n = _pipeline_inputs(p, 0.01)
    inp.training = Training(m, "bf16", "adamw")
    stage_of = [i // 2 for i in range(n)]
    cost = evaluate(inp, Config(Mesh(p, 1, 1), 1, "1f1b", 1, 0, stage_of, [0] * n))
    for j in range(p):
        assert inflight_microbatches("1f1b", m, p, 1, j) == min(m, p - j)
        assert cost.rank_memory[j]["activations"] == pytest.approx(2 * act * min(m, p - j))


def test_gpipe_holds_every_microbatch():
    assert inflight_microbatches("gpipe", 8, 4, 1, 0) == 8
    assert inflight_microbatches("gpipe", 8, 4, 1, 3) == 8


def test_interleaved_first_rank_matches_korthikanti_factor():
    """Korthikanti: the first stage holds L layers' worth times (1 + (p-1)/(p v))."""
    p, v, m = 4, 2, 16
    chunks = inflight_microbatches("interleaved_1f1b", m, p, v, 0)
    layers_per_chunk = 1 / (p * v)  # as a fraction of L
    assert chunks * layers_per_chunk == pytest.approx(1 + (p - 1) / (p * v))


def test_full_and_selective_recompute_options_from_a_traced_gpt(tmp_path, monkeypatch):
    """Full recompute keeps only the layer input, 2sbh; Megatron's selective ("core") keeps
    sbh*34 (Korthikanti); meshplan's runtime's ("runtime-op") keeps the layer input and every
    product's output: 2sbh each for the input, q, k, v, the scores times V and the output
    projection, 8sbh for the MLP's first product, 2sbh for its second and the scores QK^T,
    2as^2b: sbh(22 + 2as/h), 54 sbh here, exactly."""
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    from planner.api import trace
    from planner.cost.block_options import block_options
    from planner.cost.sharding import tp_variants

    s, h, a, b = 2048, 2048, 16, 1
    traced = trace(
        "examples/gpt.py",
        {
            "size": "tiny",
            "layers": 2,
            "hidden": h,
            "heads": a,
            "seq_len": s,
            "vocab": 512,
            "dropout": 0.1,
        },
        traced_batch_size=b,
        dtype="bf16",
    )
    layer = traced.blocks[1]
    cl = cluster_of(8)
    variants = tp_variants(traced.graph, layer, 1)
    core = replace(ADAM_MIXED, selective_policy="core")
    opts = block_options(traced.graph, layer, variants, b, cl, [0], core)
    by = {o.recompute: o for o in opts if o.offload == "none"}
    assert by["full"].act_bytes == pytest.approx(2 * s * b * h, rel=0.05)
    assert by["selective"].act_bytes == pytest.approx(34 * s * b * h, rel=0.05)
    assert by["none"].act_bytes == pytest.approx(s * b * h * (34 + 5 * a * s / h), rel=0.05)
    # recompute costs time: full re-runs the forward, selective only the attention core
    assert by["none"].time_s < by["selective"].time_s < by["full"].time_s
    runtime = block_options(traced.graph, layer, variants, b, cl, [0], ADAM_MIXED)
    op = {o.recompute: o for o in runtime if o.offload == "none"}["selective"]
    assert ADAM_MIXED.selective_policy == "runtime-op"
    assert op.act_bytes == s * b * h * (22 + 2 * a * s / h)
    # the products are kept, only the element-wise work is re-run
    assert by["none"].time_s < op.time_s < by["full"].time_s


@pytest.mark.parametrize("fp8", [False, True])
def test_torchtitan_op_sac_keeps_inputs_attention_and_every_other_product(
    tmp_path, monkeypatch, fp8
):
    """torchtitan's op-level SAC on a Llama layer (h 256, 8 heads, 2 kv heads of 32, ffn
    512, 64 tokens, bf16): the layer input (h), the outputs of the 1st, 3rd, 5th and 7th weight
    products (wq h, wv 64, w1 ffn, w2 h) and the attention kernel's output (h) with its fp32
    log-sum-exp per head, 2 x (256 + 256 + 64 + 512 + 256 + 256) + 4 x 8 = 3232 bytes per
    token. FP8 linears call aten._scaled_mm, which the policy does not save: 2 x 512 + 32."""
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    from planner.api import trace
    from planner.cost.block_options import block_options, selective_kept
    from planner.cost.sharding import tp_variants

    args = dict(size="tiny", layers=2, hidden=256, heads=8, kv_heads=2, ffn=512, seq_len=64)
    traced = trace("examples/llama.py", {**args, "vocab": 1000}, traced_batch_size=1, dtype="bf16")
    layer = traced.blocks[1]
    tr = Training(8, "bf16", "adamw", fp8_linears=fp8, selective_policy="torchtitan-op")
    kept, recomputed = selective_kept(traced.graph, layer, tr)
    per_token = 2 * 512 + 32 if fp8 else 3232
    assert kept == 64 * per_token
    assert len(recomputed) < len(layer.nodes)
    opts = block_options(
        traced.graph, layer, tp_variants(traced.graph, layer, 1), 2, cluster_of(8), [0], tr
    )
    by = {o.recompute: o for o in opts if o.offload == "none"}
    assert by["selective"].act_bytes == pytest.approx(2 * 64 * per_token)
    assert by["none"].time_s < by["selective"].time_s < by["full"].time_s


def test_short_inner_dimensions_slow_a_gemm_down():
    """rate = R * K / (K + half): a K=96 linear forward at half=32 takes 4/3 of its K->inf time;
    backward averages its two GEMMs (over N, and over the M tokens, which scale with the
    micro-batch for a weight's gradient)."""
    from planner.cost.compute import inner_dim_slowdowns

    assert inner_dim_slowdowns([96, 64, 512, True], 1.0, 32.0) == pytest.approx(
        (128 / 96, ((64 + 32) / 64 + (512 + 32) / 512) / 2)
    )
    f, b = inner_dim_slowdowns([96, 64, 512, True], 2.0, 32.0)  # twice the tokens
    assert b == pytest.approx(((64 + 32) / 64 + (1024 + 32) / 1024) / 2)
    assert inner_dim_slowdowns([96, 64, 512, False], 2.0, 32.0)[1] == pytest.approx(
        ((64 + 32) / 64 + (512 + 32) / 512) / 2
    )
    assert inner_dim_slowdowns([96, 64, 512, True], 1.0, 0.0) == (1.0, 1.0)
    assert inner_dim_slowdowns(None, 1.0, 32.0) == (1.0, 1.0)


@pytest.mark.parametrize("zero", [2, 3])
def test_zero_pipeline_stages_reduce_once_and_hold_whole_gradients(zero):
    """torch's pipelining runs FSDP stages without gradient sync or resharding until the last
    micro-batch: with m > 1 a ZeRO-2/3 stage keeps whole weights and gradients (ZeRO-1's
    memory) and pays one reduce-scatter per step; with one micro-batch, or without a pipeline,
    the states shard as the ZeRO paper says and every micro-batch reduce-scatters."""
    psi = 4e8
    n = 4
    blocks = [make_block(i, "layer", params=int(psi)) for i in range(n)]
    opts = [[make_option(0.01, psi, 1e6)] for _ in range(n)]
    dp, cl = 4, cluster_of(8)
    tr = Training(16 * dp, "bf16", "adamw")  # m = 16 at micro-batch 1
    wb, gb, ob = tr.state_bytes
    stage_of = [0, 0, 1, 1]

    def run(pp: int, m: int, persistent: bool = False):
        training = Training(m * dp, "bf16", "adamw", persistent_grad_buffers=persistent)
        inp = CostInputs(blocks, opts, 1, cl, training)
        config = Config(
            Mesh(pp, dp, 1), 1, "1f1b", 1, zero, stage_of if pp > 1 else [0] * n, [0] * n
        )
        return evaluate(inp, config)

    whole, single, flat = run(2, 16), run(2, 1), run(1, 16)
    assert whole.rank_memory[0]["grads"] == pytest.approx(2 * psi * gb)
    assert whole.rank_memory[0]["params"] == pytest.approx(2 * psi * wb)
    assert whole.rank_memory[0]["optimizer"] == pytest.approx(2 * psi * ob / dp)
    # one micro-batch: its activations peak before backward allocates any gradient
    assert single.rank_memory[0]["grads"] == 0
    persistent = run(2, 1, persistent=True)
    gb16 = Training(dp, "bf16", "adamw", persistent_grad_buffers=True).state_bytes[1]
    assert persistent.rank_memory[0]["grads"] == pytest.approx(2 * psi * gb16 / dp)
    assert flat.rank_memory[0]["grads"] == pytest.approx(n * psi * gb / dp)
    rs = collective_time("reduce_scatter", psi * gb, cl, list(range(dp)))
    ag = collective_time("all_gather", psi * wb, cl, list(range(dp)))
    per_block = {2: rs + ag, 3: 16 * 2 * ag + rs}[zero]  # fsdp_unit_overhead is 0 on a GPU
    assert whole.stages[0].dp_comm_s == pytest.approx(2 * per_block)
    # without a pipeline FSDP2 reduces every micro-batch, and reshards after each backward,
    # so ZeRO-2 gathers again each micro-batch too
    assert flat.stages[0].dp_comm_s == pytest.approx(
        n * {2: 16 * (rs + ag), 3: 16 * (2 * ag + rs)}[zero]
    )


@pytest.mark.parametrize(
    "zero,pp,half", [(0, 1, False), (2, 1, False), (2, 2, False), (3, 1, False), (2, 2, True),
                     (2, 1, True), (0, 1, True)],
)  # fmt: skip
def test_gradient_accumulation_adds_m_minus_1_passes_over_the_accumulated_gradients(zero, pp, half):
    """torch adds every micro-batch's gradient after the first into .grad (read both, write
    one): (m - 1) * 3 * gradient bytes at the element-wise rate, over whole gradients under
    ZeRO 0/1 or a deferring pipeline, over the dp shard under ZeRO 2/3 otherwise. A deferring
    pipeline with bf16 reduction accumulates FSDP2's unsharded gradients in bf16 (2 bytes);
    the others add into the fp32 ``.grad`` (4) whatever the reduce dtype."""
    from planner.cost.optimizer import optimizer_time

    psi, dp = 4e8, 4
    cl = cluster_of(8)
    prof = cl.profile
    opts = [make_option(0.01, psi, 1e6)]

    def opt_time(m: int) -> float:
        tr = Training(m * dp, "bf16", "adamw", half_grad_reduce=half)
        inp = CostInputs([make_block(0, "layer", params=int(psi))], [opts], 1, cl, tr)
        return optimizer_time(inp, opts, Config(Mesh(pp, dp, 1), 1, "1f1b", 1, zero, [0], [0]))

    gb = 2 if half and zero >= 2 and pp > 1 else 4
    whole = zero < 2 or pp > 1
    accumulated = psi if whole else psi / dp
    rate = prof.memory_bandwidth * prof.elementwise_efficiency
    assert opt_time(8) - opt_time(1) == pytest.approx(7 * 3 * accumulated * gb / rate)


@pytest.mark.parametrize("zero", [1, 3])
def test_fused_weight_gradient_accumulation_adds_only_the_other_gradients(zero):
    """Megatron's gradient_accumulation_fusion: each weight-gradient GEMM accumulates into the
    whole gradient buffer as it writes, so of the (m - 1) passes only the gradients of weights
    no product reads (here a quarter: an embedding table, norms) remain; FSDP's sharded
    accumulation adds each reduce-scattered shard after the GEMM, fused or not."""
    from planner.cost.optimizer import optimizer_time

    psi, dp, m = 4e8, 4, 8
    cl = cluster_of(8)
    prof = cl.profile
    opt = replace(make_option(0.01, psi, 1e6), product_params=0.75 * psi)

    def accumulation(fused: bool) -> float:
        times = []
        for mb in (m, 1):
            tr = Training(mb * dp, "bf16", "adamw", fused_grad_accumulation=fused)
            inp = CostInputs([make_block(0, "layer", params=int(psi))], [[opt]], 1, cl, tr)
            config = Config(Mesh(1, dp, 1), 1, "1f1b", 1, zero, [0], [0])
            times.append(optimizer_time(inp, [opt], config))
        return times[0] - times[1]

    gb = Training(dp, "bf16", "adamw").state_bytes[1]
    rate = prof.memory_bandwidth * prof.elementwise_efficiency
    accumulated = 0.25 * psi if zero < 2 else psi / dp
    assert accumulation(True) == pytest.approx((m - 1) * 3 * accumulated * gb / rate)
    assert accumulation(False) == pytest.approx(
        (m - 1) * 3 * (psi if zero < 2 else psi / dp) * gb / rate
    )


def test_the_products_weights_are_what_a_weight_gradient_gemm_writes():
    """A Llama block's linear weights are products' weights; its norm weights, and the
    embedding table a lookup reads, are not; the head is (a linear)."""
    from planner.api import trace
    from planner.cost.block_options import block_options
    from planner.cost.sharding import tp_variants
    from planner.trace.blocks import product_params

    traced = trace("examples/llama.py", {"size": "tiny", "layers": 2}, 1, "bf16")
    first, layer, last = traced.blocks[0], traced.blocks[1], traced.blocks[-1]
    assert product_params(traced.graph, first.nodes) == set()
    found = product_params(traced.graph, layer.nodes)
    assert found == {p for p in layer.param_names if not p.endswith("norm.weight")}
    assert len(found) == 7  # q, k, v, o, gate, up, down
    assert product_params(traced.graph, last.nodes) == {"lm_head.weight"}
    option = block_options(
        traced.graph, layer, tp_variants(traced.graph, layer, 1), 1, cluster_of(1), [0],
        Training(8), offload_allowed=False,
    )[0]  # fmt: skip
    norms = sum(
        math.prod(traced.graph.graph["param_shapes"][p])
        for p in layer.param_names
        if p.endswith("norm.weight")
    )
    assert option.product_params == pytest.approx(layer.params - norms)
    # Perceiver's decoder multiplies by its embedding table through a transpose (a view): the
    # table is a product's weight though no product reads it directly
    perceiver = trace("tests/models/perceiver.py", {}, 1, "fp32").graph
    table = "m.perceiver.input_preprocessor.embeddings.weight"
    assert not any(
        table in d["params"] and d["op"].startswith("aten.matmul")
        for _, d in perceiver.nodes(data=True)
    )
    assert table in product_params(perceiver, list(perceiver.nodes))


def test_a_gathered_tp_module_pays_the_gather_overhead():
    """tp_module_overhead_s per column/row-parallel module, tp_gather_overhead_s per
    column-parallel module whose output is gathered; a third forward, two thirds backward."""
    from planner.cost.compute import OpCounts, overhead_times

    cl = cluster_of(8, tp_module_overhead=3e-4, tp_gather_overhead=9e-4, op_overhead=0.0)
    cl = Cluster(replace(cl.profile, backward_op_overhead=0.0), cl.nodes, cl.gpus_per_node)
    plan = {
        "a.q": "colwise_gather",
        "a.k": "colwise_gather",
        "m.fc1": "colwise",
        "m.fc2": "rowwise",
    }
    fwd, bwd, _ = overhead_times(OpCounts(10, 10), plan, 2, cl)
    per_step = 2 * 3e-4 + 2 * 9e-4
    assert fwd == pytest.approx(per_step / 3) and bwd == pytest.approx(per_step * 2 / 3)
    assert overhead_times(OpCounts(10, 10), plan, 1, cl)[:2] == (0.0, 0.0)
