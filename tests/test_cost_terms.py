"""Every term of the cost model against a step time and a memory written out by hand.

A device profile of round numbers (no overheads unless a test sets them) and synthetic blocks
whose options state their times, parameters and activations directly; each expectation below
is the arithmetic of the term as the literature states it (ZeRO's collectives, Narayanan et
al.'s pipeline, FSDP2's offload, Megatron's send/receive buffers), spelled out in the test and
never computed by the cost model's helpers.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import networkx as nx
import pytest
from conftest import make_block, make_option
from torch import nn

from planner.cost.compute import compute_time, fusion_shares, node_times
from planner.cost.data_parallel import DPRates, dp_block_terms, dp_copy_bytes, dp_rates
from planner.cost.optimizer import optimizer_time
from planner.cost.records import Config, CostInputs
from planner.cost.step import evaluate
from planner.hardware.cluster import Cluster
from planner.hardware.profiles import DeviceProfile
from planner.schema.mesh import Mesh
from planner.trace.blocks import Block
from planner.training import Training

PEAK32 = 1e12 * 0.5  # achievable fp32 FLOP/s
PEAK16 = 4e12 * 0.5
BW = 1e11 * 0.5  # achievable memory bandwidth
NVLINK, NVLINK_LAT = 1e10, 1e-5
NIC, NIC_LAT = 1e9, 1e-4
HOST_LINK, HOST_BW = 2e10, 5e10 * 0.5
RESERVED = 1e9


def Training16(*args, **kwargs) -> Training:  # noqa: N802 - reads as the class it builds
    """The hand references below count Megatron's and DeepSpeed's states: 16-bit gradients in
    buffers kept all step (``Training.persistent_grad_buffers``), one pipeline send and receive
    buffer; the runtime's fp32 gradients and per-micro-batch buffers have their own tests."""
    kwargs.setdefault("microbatch_recv_buffers", False)
    return Training(*args, persistent_grad_buffers=True, **kwargs)


BF16 = Training16(8, "bf16", "adamw")  # weights 2, gradients 2, fp32 master + Adam 12 bytes


def round_profile(**overrides) -> DeviceProfile:
    base = dict(
        name="round",
        description="round numbers for hand-written references",
        peak_flops={"fp32": 1e12, "tf32": 1e12, "bf16": 4e12, "fp16": 4e12},
        matmul_efficiency=0.5,
        elementwise_efficiency=0.5,
        matmul_half_inner_dim=0.0,
        op_overhead=0.0,
        backward_op_overhead=0.0,
        selective_op_overhead=0.0,
        optimizer_op_overhead=0.0,
        dtensor_op_overhead=0.0,
        tp_module_overhead=0.0,
        tp_gather_overhead=0.0,
        fsdp_unit_overhead=0.0,
        memory_bytes=80e9,
        memory_bandwidth=1e11,
        reserved_bytes=RESERVED,
        gpus_per_node=4,
        host_memory_bytes=400e9,
        host_bandwidth=HOST_LINK,
        host_memory_bandwidth=5e10,
        intra_node_bandwidth=NVLINK,
        intra_node_latency=NVLINK_LAT,
        inter_node_bandwidth=NIC,
        inter_node_latency=NIC_LAT,
        collective_efficiency=1.0,
        collective_sync=0.0,
        comm_overlap=0.5,
    )
    base.update(overrides)
    return DeviceProfile(**base)


def cluster(gpus: int = 4, per_node: int = 4, **overrides) -> Cluster:
    return Cluster(round_profile(gpus_per_node=per_node, **overrides), gpus // per_node, per_node)


def ring(kind: str, nbytes: float, n: int, bw: float = NVLINK, lat: float = NVLINK_LAT) -> float:
    """nccl-tests' ring times, written out: all-reduce twice the (n-1)/n pass."""
    if n == 1:
        return 0.0
    passes = 2 if kind == "all_reduce" else 1
    return passes * ((n - 1) / n * nbytes / bw + (n - 1) * lat)


def inputs(blocks, options, cl, training=BF16, traced_mbs=1) -> CostInputs:
    return CostInputs(blocks, [[o] for o in options], traced_mbs, cl, training)


def silent_blocks(n: int, params: int = 0) -> list[Block]:
    """Blocks with no pipeline boundary and no logits: only their options' numbers count."""
    return [make_block(i, "L", params=params, boundary=0, out=0) for i in range(n)]


# --------------------------------------------------------------------------- roofline


def test_roofline_takes_the_larger_of_compute_and_memory_time():
    cl = cluster()
    assert compute_time(1e9, 4e8, cl, "fp32") == pytest.approx(max(1e9 / PEAK32, 4e8 / BW))
    assert compute_time(8e9, 4e8, cl, "fp32") == pytest.approx(8e9 / PEAK32)
    assert compute_time(8e9, 4e8, cl, "bf16") == pytest.approx(4e8 / BW)
    assert compute_time(1e9, 1e8, cl, "fp32", slowdown=3.0) == pytest.approx(3e9 / PEAK32)


def one_linear_graph(flops: float, act_bytes: float, weight_elems: int) -> nx.DiGraph:
    """A traced graph of one linear op: its forward reads act_bytes of activations (in and out)
    and the fp32 weight; backward twice the forward's bytes, two products' FLOPs."""
    g = nx.DiGraph()
    fwd_bytes = act_bytes + 4 * weight_elems
    g.add_node(
        "lin",
        op="aten.linear.default",
        module="m",
        order=0,
        shapes=[[1]],
        dtypes=["float32"],
        out_bytes=0,
        fwd_flops=flops,
        bwd_flops=2 * flops,
        fwd_bytes=fwd_bytes,
        bwd_bytes=2 * fwd_bytes,
        params=["w"],
        args=[],
        requires_grad=True,
        saved=[],
    )
    g.graph.update(param_shapes={"w": [weight_elems]}, param_dtype_bytes={"w": 4}, param_owner={})
    return g


@pytest.mark.parametrize("scale", [1.0, 3.0])
def test_weight_bytes_do_not_grow_with_the_micro_batch(scale):
    """A memory-bound linear: its activations scale with the micro-batch, its weight read (and
    in backward, the weight read plus the weight-gradient write) does not."""
    act, w = 1e8, 10**7  # 1e8 activation bytes, 4e7 weight bytes
    g = one_linear_graph(1e9, act, w)
    blk = make_block(0, "L")
    blk.nodes = ["lin"]
    fwd, bwd, _ = node_times(g, blk, scale, cluster(), "fp32")
    assert fwd == pytest.approx(max(scale * 1e9 / PEAK32, (scale * act + 4 * w) / BW))
    assert bwd == pytest.approx(max(scale * 2e9 / PEAK32, (2 * scale * act + 8 * w) / BW))
    assert fwd == pytest.approx((scale * act + 4 * w) / BW)  # memory-bound indeed


def test_a_fused_element_wise_chain_reads_its_input_once_and_writes_its_output_once():
    """x -> mm -> a = add(mm, 1) -> b = mul(a, a) -> c = exp(b) -> mm2: unfused, add reads 4e6
    and writes 4e6 bytes, mul reads 4e6 and writes 4e6, exp reads 4e6 and writes 4e6 (24e6);
    fused, the chain reads mm's output once and writes c once (8e6): each op keeps 1/3 of its
    traffic, and the chain runs in 8e6 / BW."""
    g = nx.DiGraph()
    base = dict(module="m", shapes=[[1]], dtypes=["bfloat16"], fwd_flops=0, bwd_flops=0)
    base |= dict(params=[], args=[], requires_grad=True, saved=[])
    for i, (name, op) in enumerate(
        [("mm", "aten.mm.default"), ("a", "aten.add.Tensor"), ("b", "aten.mul.Tensor"),
         ("c", "aten.exp.default"), ("mm2", "aten.mm.default")]
    ):  # fmt: skip
        g.add_node(name, op=op, order=i, out_bytes=4e6, fwd_bytes=8e6, bwd_bytes=16e6, **base)
    for u, v in [("mm", "a"), ("a", "b"), ("b", "c"), ("c", "mm2")]:
        g.add_edge(u, v, bytes=4e6)
    g.graph.update(param_shapes={}, param_dtype_bytes={}, param_owner={})
    blk = make_block(0, "L")
    blk.nodes = ["mm", "a", "b", "c", "mm2"]
    assert fusion_shares(g, blk) == {n: pytest.approx(1 / 3) for n in "abc"}
    chain = replace(blk, nodes=["a", "b", "c"])
    fwd, bwd, _ = node_times(g, chain, 1.0, cluster(), "bf16", fused=True)
    assert fwd == pytest.approx(8e6 / BW)
    assert bwd == pytest.approx(3 * 16e6 / 3 / BW)
    fwd_eager, _, _ = node_times(g, chain, 1.0, cluster(), "bf16")
    assert fwd_eager == pytest.approx(24e6 / BW)


# --------------------------------------------------------------------------- pipelines


def run(
    blocks, options, mesh, stage_of, schedule="1f1b", v=1, zero=0, mbs=1, training=BF16, cl=None
):
    cl = cl or cluster(mesh.size, min(mesh.size, 4))
    inp = inputs(blocks, options, cl, training)
    config = Config(mesh, mbs, schedule, v, zero, stage_of, [0] * len(blocks))
    return evaluate(inp, config)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_unequal_stages_run_at_the_slowest_stage(schedule):
    """Stages of 3, 5 and 2 ms, 4 micro-batches: the first micro-batch crosses every stage
    (10 ms), the other three leave at the slowest stage's pace (3 x 5 ms)."""
    per_block = [1e-3, 2e-3, 2.5e-3, 2.5e-3, 2e-3]  # stages: [0,1], [2,3], [4]
    blocks = silent_blocks(5)
    opts = [make_option(t, 0.0, 1e6) for t in per_block]
    cost = run(blocks, opts, Mesh(3, 1, 1), [0, 0, 1, 1, 2], schedule, training=Training16(4))
    assert cost.pipeline_s == pytest.approx(10e-3 + 3 * 5e-3)
    assert cost.bubble_s == pytest.approx(10e-3 - 5e-3)
    assert cost.step_time_s == pytest.approx(25e-3)
    # activations: GPipe holds all 4 micro-batches on every stage, 1F1B p - j of them
    held = [4, 4, 4] if schedule == "gpipe" else [3, 2, 1]
    per_stage = [2, 2, 1]
    for j in range(3):
        assert cost.rank_memory[j]["activations"] == pytest.approx(1e6 * per_stage[j] * held[j])


def test_interleaved_pipeline_pays_the_busiest_rank_and_the_slowest_chunk():
    """p = 2 ranks, v = 2 chunks each: chunks 0 and 2 on rank 0 (1 + 3 ms), 1 and 3 on rank 1
    (2 + 1 ms); m = 4: 4 x 4 ms of the busiest rank plus (p - 1) x the slowest chunk, 3 ms."""
    times = [1e-3, 2e-3, 3e-3, 1e-3]
    blocks = silent_blocks(4)
    opts = [make_option(t, 0.0, 1e6) for t in times]
    cost = run(
        blocks, opts, Mesh(2, 1, 1), [0, 1, 2, 3], "interleaved_1f1b", v=2, training=Training16(4)
    )
    assert cost.pipeline_s == pytest.approx(4 * 4e-3 + 1 * 3e-3)
    # torch's interleaved warm-up: rank r holds (v-1)p + 2(p-r-1) + 1 chunk-micro-batches,
    # each one chunk's activations (1e6 here), not each of its v chunks' (2 x that was priced)
    assert cost.rank_memory[0]["activations"] == pytest.approx(1e6 * (2 + 2 + 1))
    assert cost.rank_memory[1]["activations"] == pytest.approx(1e6 * (2 + 0 + 1))


@pytest.mark.parametrize("per_node", [2, 1])
def test_point_to_point_sends_and_their_buffers(per_node):
    """Two stages, activations of 3e6 bytes per sample crossing the cut, micro-batch 2: each
    micro-batch sends 6e6 bytes forward and receives as much gradient back, over NVLink within
    a node or the NIC across nodes; every rank keeps a send and a receive buffer."""
    blocks = [make_block(i, "L", params=0, boundary=3 * 10**6, out=0) for i in range(2)]
    opts = [make_option(1e-3, 0.0, 0.0) for _ in blocks]
    bw, lat = (NVLINK, NVLINK_LAT) if per_node == 2 else (NIC, NIC_LAT)
    cl = cluster(2, per_node)
    m = 3
    cost = run(blocks, opts, Mesh(2, 1, 1), [0, 1], mbs=2, training=Training16(2 * m), cl=cl)
    hop = 2 * (6e6 / bw + lat)
    assert cost.stages[0].p2p_s == pytest.approx(hop)
    assert cost.stages[1].p2p_s == 0.0
    t0, t1 = 1e-3 + hop, 1e-3
    assert cost.pipeline_s == pytest.approx(t0 + t1 + (m - 1) * max(t0, t1))
    for r in range(2):
        assert cost.rank_memory[r]["other"] == pytest.approx(RESERVED + 2 * 6e6, rel=1e-12)


@pytest.mark.parametrize("schedule,v", [("1f1b", 1), ("gpipe", 1), ("interleaved_1f1b", 2)])
def test_torch_pipelining_keeps_a_receive_buffer_per_micro_batch(schedule, v):
    """meshplan's runtime (torch.distributed.pipelining) keeps, on each stage, a receive
    buffer per micro-batch for the activation (not the first stage) and for the gradient of
    its output (not the last), and each output until its backward. Two ranks, m = 4
    micro-batches of 2 samples, b = 6e6 bytes per micro-batch across each cut. 1F1B: rank 0
    holds h = 2 micro-batches, rank 1 holds 1; GPipe holds all 4 on both; interleaved (v = 2,
    four virtual stages, rank 0 chunks 0 and 2, rank 1 chunks 1 and 3) holds 5 and 3
    chunk-micro-batches per rank, h = 2.5 and 1.5 per chunk."""
    n = 2 * v
    blocks = [make_block(i, "L", params=0, boundary=3 * 10**6, out=0) for i in range(n)]
    opts = [make_option(1e-3, 0.0, 0.0) for _ in blocks]
    m, b = 4, 6e6
    training = Training(2 * m, "bf16", "adamw")
    cost = run(blocks, opts, Mesh(2, 1, 1), list(range(n)), mbs=2, training=training,
               cl=cluster(2, 2), schedule=schedule, v=v)  # fmt: skip
    held = {"1f1b": (2, 1), "gpipe": (4, 4), "interleaved_1f1b": (2.5, 1.5)}[schedule]

    def want(stage: int, h: float) -> float:
        first, last = stage == 0, stage == n - 1
        return (0 if first else (m - h + 1) * b) + (0 if last else (m + h) * b)

    for r in range(2):
        buffers = sum(want(s, held[r]) for s in range(r, n, 2))
        assert cost.rank_memory[r]["other"] == pytest.approx(RESERVED + buffers, rel=1e-12)


def test_the_loss_and_its_logits_live_on_the_last_stage():
    """Last block's bf16 output of 5e6 bytes per sample: fp32 logits 4 / 2 x 5e6 bytes per
    sample, three copies at the loss's backward peak (log-softmax's saved output, the
    gradient it receives, the gradient it writes), on the last stage only; the loss reads and
    writes the logits three times in forward and in backward (3 + 3 passes over one fp32
    copy), at the element-wise rate."""
    blocks = [make_block(0, "L", params=0, boundary=0, out=0)]
    blocks.append(make_block(1, "L", params=0, boundary=0, out=5 * 10**6))
    opts = [make_option(1e-3, 0.0, 0.0) for _ in blocks]
    mbs = 2
    cost = run(blocks, opts, Mesh(2, 1, 1), [0, 1], mbs=mbs, training=Training16(mbs))
    fp32_logits = 4 / 2 * 5e6 * mbs
    extra = cost.rank_memory[1]["other"] - cost.rank_memory[0]["other"]
    assert extra == pytest.approx(3 * fp32_logits)
    loss = 6 * fp32_logits / BW
    assert cost.stages[1].compute_s == pytest.approx(1e-3 + loss)
    assert cost.stages[0].compute_s == pytest.approx(1e-3)


@pytest.mark.parametrize("vocab_parallel", [False, True])
def test_a_vocab_parallel_loss_keeps_a_tp_share_of_the_logits(vocab_parallel):
    """One stage, TP 4: gathered logits (meshplan's runtime) put all three fp32 copies on
    every rank, 3 x 4 / 2 x 5e6 bytes per sample; a vocab-parallel loss (Megatron, torchtitan's
    loss_parallel) a quarter of them, and its three passes each way over one fp32 copy read
    and write a quarter of the logits too (the last stage's time)."""
    blocks = [make_block(0, "L", params=0, boundary=0, out=0)]
    blocks.append(make_block(1, "L", params=0, boundary=0, out=5 * 10**6))
    opts = [make_option(1e-3, 0.0, 0.0) for _ in blocks]
    tr = Training16(1, vocab_parallel_loss=vocab_parallel)
    cost = run(blocks, opts, Mesh(1, 1, 4), [0, 0], training=tr)
    logits = 3 * 4 / 2 * 5e6 / (4 if vocab_parallel else 1)
    assert cost.rank_memory[0]["other"] == pytest.approx(RESERVED + logits)
    loss = 6 * (4 / 2 * 5e6 / (4 if vocab_parallel else 1)) / BW
    assert cost.stages[0].compute_s == pytest.approx(2e-3 + loss)


def test_bf16_optimizer_keeps_whole_fp32_gradients_beside_the_16_bit_ones():
    """DeepSpeed's BF16_Optimizer under its ZeRO-1: 1e8 parameters on 4 DP ranks hold bf16
    weights 2e8 bytes, bf16 gradients 2e8 plus fp32 gradients 4e8 (whole, not sharded), and
    the fp32 master weights and Adam moments 12e8 / 4."""
    tr = Training16(4, fp32_grad_accumulation=True)
    blocks = [make_block(0, "L", params=10**8, boundary=0, out=0)]
    cost = run(blocks, [make_option(1e-3, 1e8, 0.0)], Mesh(1, 4, 1), [0], zero=1, training=tr)
    mem = cost.rank_memory[0]
    assert mem["params"] == pytest.approx(2e8)
    assert mem["grads"] == pytest.approx(2e8 + 4e8)
    assert mem["optimizer"] == pytest.approx(12e8 / 4)


def test_deepspeed_fp16_step_casts_the_gradient_shard_to_fp32():
    """DeepSpeed's fp16 ZeRO-1 step (stage_1_and_2.py: the rank's gradient partition cast to
    fp32 before Adam): 1e8 parameters on 4 DP ranks hold fp16 weights 2e8 bytes, fp16
    gradients 2e8 plus the fp32 partition 4e8 / 4; ZeRO-0 (FP16_Optimizer) the whole 4e8."""
    blocks = [make_block(0, "L", params=10**8, boundary=0, out=0)]
    tr = Training16(4, "fp16", fp32_grad_partition=True)
    for zero, fp32 in ((1, 4e8 / 4), (0, 4e8)):
        cost = run(
            blocks, [make_option(1e-3, 1e8, 0.0)], Mesh(1, 4, 1), [0], zero=zero, training=tr
        )
        assert cost.rank_memory[0]["grads"] == pytest.approx(2e8 + fp32)


def test_reduction_bucket_sits_on_every_rank_beside_the_activation_peak():
    """DeepSpeed's reduction bucket (``Training.reduce_bucket_bytes``, 1e9 bytes) adds itself,
    once, to every pipeline rank's memory whatever its blocks, as the CUDA context does: two
    stages of 1e8 parameters each, with and without it, differ by exactly 1e9 on each rank."""
    blocks = [make_block(i, "L", params=10**8, boundary=0, out=0) for i in range(2)]
    opts = [make_option(1e-3, 1e8, 1e8) for _ in blocks]
    totals = []
    for bucket in (0.0, 1e9):
        tr = Training16(4, "fp16", reduce_bucket_bytes=bucket)
        cost = run(blocks, opts, Mesh(2, 1, 1), [0, 1], training=tr)
        totals.append([m["total"] for m in cost.rank_memory])
    assert [b - a for a, b in zip(*totals)] == pytest.approx([1e9, 1e9])


@pytest.mark.parametrize("shards, overlap", [(False, False), (True, False), (True, True)])
def test_pipeline_sends_of_sequence_shards_and_their_overlap(shards, overlap):
    """Two stages on one node, TP 2, a boundary of 4e6 bytes per sample, 3 ms of compute per
    micro-batch per stage. Whole activations: one hop each way, 2 x (4e6 / NVLINK + latency).
    Sequence shards (Megatron-Core under sequence parallel): 2e6 bytes a hop. Overlapped with
    the stage's compute (comm_overlap 0.5 of 3 ms): the hops' 0.4 ms hide entirely."""
    blocks = [make_block(i, "L", params=0, boundary=4 * 10**6, out=0) for i in range(2)]
    opts = [make_option(3e-3, 0.0, 0.0) for _ in blocks]
    tr = Training16(2, pipeline_sends_shards=shards, p2p_overlap=overlap)
    cost = run(blocks, opts, Mesh(2, 1, 2), [0, 1], training=tr, cl=cluster(4, 4))
    hop = (2e6 if shards else 4e6) / NVLINK + NVLINK_LAT
    expected = 0.0 if overlap else 2 * hop
    assert cost.stages[0].p2p_s == pytest.approx(expected)
    assert cost.stages[1].p2p_s == 0.0


# --------------------------------------------------------------------------- data parallel


def dp_case(zero: int, m: int = 2, pp: int = 1, scale: float = 1.0, copies: str = "torch"):
    """Two blocks of 1e8 and 3e8 parameters (times ``scale``), 3 ms per micro-batch each (1
    forward, 2 backward), on 4 data-parallel ranks in one node; bf16 AdamW; ``copies``: the
    wrapper (``Training.dp_copies``)."""
    params = [int(10**8 * scale), int(3 * 10**8 * scale)]
    blocks = [make_block(i, "L", params=p, boundary=0, out=0) for i, p in enumerate(params)]
    opts = [make_option(3e-3, float(p), 0.0) for p in params]
    cost = run(
        blocks,
        opts,
        Mesh(pp, 4, 1),
        [0, pp - 1],
        zero=zero,
        training=Training16(4 * m, dp_copies=copies),
        cl=cluster(4 * pp, 4 * pp),
    )
    return cost, params


@pytest.mark.parametrize("scale", [1.0, 1e-3])
def test_zero0_all_reduce_hides_behind_half_the_backward(scale):
    cost, params = dp_case(0, scale=scale)
    ar = ring("all_reduce", 2 * sum(params), 4)
    assert cost.stages[0].dp_comm_s == pytest.approx(ar)
    assert cost.dp_exposed_s == pytest.approx(max(0.0, ar - 0.5 * 2 * 2e-3))


@pytest.mark.parametrize("scale", [1.0, 1e-3])
def test_zero1_broadcasts_updated_shards_after_the_step(scale):
    """The all-reduce hides behind backward (wholly, for the small model); the broadcast of
    the updated shards comes after the step, with nothing to hide behind."""
    cost, params = dp_case(1, scale=scale)
    ar = ring("all_reduce", 2 * sum(params), 4)
    ag = ring("all_gather", 2 * sum(params), 4)
    assert cost.stages[0].dp_comm_s == pytest.approx(ar + ag)
    assert cost.dp_exposed_s == pytest.approx(max(0.0, ar - 0.5 * 4e-3) + ag)
    assert (ar < 0.5 * 4e-3) == (scale < 1)


def test_a_reduction_after_the_backward_hides_behind_nothing():
    """DeepSpeed reduces gradients after the last backward (``Training.dp_overlap`` off): the
    ZeRO-1 all-reduce and the broadcast of the updated shards are both exposed."""
    params = [10**8, 3 * 10**8]
    blocks = [make_block(i, "L", params=p, boundary=0, out=0) for i, p in enumerate(params)]
    opts = [make_option(3e-3, float(p), 0.0) for p in params]
    tr = Training16(8, dp_overlap=False)
    cost = run(blocks, opts, Mesh(1, 4, 1), [0, 0], zero=1, training=tr, cl=cluster(4, 4))
    ar = ring("all_reduce", 2 * sum(params), 4)
    ag = ring("all_gather", 2 * sum(params), 4)
    assert cost.dp_exposed_s == pytest.approx(ar + ag)


@pytest.mark.parametrize("scale", [1.0, 1e-3])
@pytest.mark.parametrize("copies, gathers", [("none", 1), ("torch", 3)])
def test_zero2_reduce_scatters_every_micro_batch(scale, copies, gathers):
    """ZeRO-2 keeps weights from forward to backward and reduce-scatters each micro-batch; it
    gathers them once a step where the framework keeps whole 16-bit weights (DeepSpeed,
    Megatron: ``dp_copies`` "none"), every micro-batch under FSDP2, which reshards after each
    backward (meshplan's runtime)."""
    m = 3
    cost, params = dp_case(2, m, scale=scale, copies=copies)
    rs = sum(ring("reduce_scatter", 2 * p, 4) for p in params)
    ag = sum(ring("all_gather", 2 * p, 4) for p in params)
    assert cost.stages[0].dp_comm_s == pytest.approx(m * rs + gathers * ag)
    fwd, bwd = 2 * 1e-3, 2 * 2e-3
    assert cost.dp_exposed_s == pytest.approx(
        m * max(0.0, rs - 0.5 * bwd) + gathers * max(0.0, ag - 0.5 * fwd)
    )


@pytest.mark.parametrize("scale", [1.0, 1e-3])
def test_zero3_gathers_weights_for_forward_and_again_for_backward(scale):
    m = 3
    cost, params = dp_case(3, m, scale=scale)
    rs = sum(ring("reduce_scatter", 2 * p, 4) for p in params)
    ag = sum(ring("all_gather", 2 * p, 4) for p in params)
    assert cost.stages[0].dp_comm_s == pytest.approx(m * (2 * ag + rs))
    assert cost.dp_exposed_s == pytest.approx(m * max(0.0, 2 * ag + rs - 0.5 * 6e-3))
    # memory: 16 bytes per parameter over 4 ranks, plus the gathered bf16 weights of the
    # current and the prefetched block (the larger block, twice)
    mem = cost.rank_memory[0]
    assert mem["params"] + mem["grads"] + mem["optimizer"] == pytest.approx(16 * sum(params) / 4)
    assert mem["other"] == pytest.approx(RESERVED + 2 * 2 * max(params), rel=1e-12)


def test_data_parallel_groups_across_nodes_use_the_network():
    """dp 4 over two nodes of 2: the ring runs at the network's latency, and at the bus
    bandwidth both ranks' NICs give a node: B_nic (n - 1)/(k - 1) = 3 B_nic (Cluster.link)."""
    params = [10**8]
    blocks = [make_block(0, "L", params=params[0], boundary=0, out=0)]
    opts = [make_option(3e-3, float(params[0]), 0.0)]
    cost = run(blocks, opts, Mesh(1, 4, 1), [0], cl=cluster(4, 2), training=Training16(4))
    bus = min(3 * NIC, NVLINK)
    assert cost.stages[0].dp_comm_s == pytest.approx(ring("all_reduce", 2e8, 4, bus, NIC_LAT))


def test_expert_gradients_reduce_over_their_replicas_only():
    """ep 2 in dp 4: 1e8 of a block's 3e8 parameters are this rank's experts, whose gradient
    is reduced over the dp / ep = 2 ranks holding the same experts; the rest over all 4."""
    blk = [make_block(0, "L", params=3 * 10**8, boundary=0, out=0)]
    opt = replace(make_option(3e-3, 3e8, 0.0), ep=2, expert_params=1e8)
    cost = run(blk, [opt], Mesh(1, 4, 1, ep=2), [0], training=Training16(4))
    dense = 2 * 2e8 * 2 * 3 / 4 / NVLINK  # all-reduce of the dense gradients over 4 ranks
    experts = 2 * 1e8 * 2 * 1 / 2 / NVLINK  # over 2
    assert cost.stages[0].dp_comm_s == pytest.approx(dense + experts + 2 * 3 * NVLINK_LAT)


# --------------------------------------------------------------------------- optimizer, offload


@pytest.mark.parametrize("zero,tensors_stepped,shard", [(0, 6, 1), (1, 6 / 4, 4), (3, 6, 4)])
def test_optimizer_step_reads_and_writes_every_state_once(zero, tensors_stepped, shard):
    """AdamW in mixed precision per local parameter: reads the bf16 weight and gradient and
    the 12 bytes of fp32 master weight and moments, writes the weight (2) and the 12 bytes
    back: 30 bytes; plus 8 eager ops per parameter tensor it steps (ZeRO-1 steps 1/dp of them,
    FSDP's DTensor parameters pay the DTensor rate)."""
    params = 4e8
    blk = [make_block(0, "L", params=int(params), boundary=0, out=0)]
    opt = replace(make_option(3e-3, params, 0.0), param_tensors=6)
    cl = cluster(4, 4, optimizer_op_overhead=1e-5, dtensor_op_overhead=7e-5)
    inp = inputs(blk, [opt], cl, Training16(4))
    t = optimizer_time(inp, [opt], Config(Mesh(1, 4, 1), 1, "1f1b", 1, zero, [0], [0]))
    per_op = 7e-5 if zero >= 2 else 1e-5
    assert t == pytest.approx(params / shard * 30 / BW + tensors_stepped * 8 * per_op)


def test_offloaded_states_step_on_the_host():
    """The host steps its shard with torch's per-op AdamW (the runtime leaves CPU tensors to
    torch's default step): 20 fp32 accesses, 80 bytes per parameter, however fused the
    device's step would be."""
    params = 4e8
    blk = [make_block(0, "L", params=int(params), boundary=0, out=0)]
    opt = make_option(3e-3, params, 0.0, offload="optimizer+params")
    inp = inputs(blk, [opt], cluster(), Training16(4))
    t = optimizer_time(inp, [opt], Config(Mesh(1, 4, 1), 1, "1f1b", 1, 3, [0], [0]))
    assert t == pytest.approx(params / 4 * 80 / HOST_BW)


@pytest.mark.parametrize("optimizer,accesses", [("adamw", 20), ("sgd", 8)])
def test_a_per_op_optimizer_step_passes_over_whole_tensors(optimizer, accesses):
    """torch's foreach or tensor-by-tensor step (a CPU rank's) reads and writes whole fp32
    tensors once per op: AdamW's 8 ops touch 20 fp32 values per parameter (80 bytes; one H200
    stepped a 1.5B Llama in 34.3 ms, 3.5 TB/s at that count), SGD with momentum's 3 ops 8."""
    params = 4e8
    blk = [make_block(0, "L", params=int(params), boundary=0, out=0)]
    opt = make_option(3e-3, params, 0.0)
    tr = Training(1, "fp32", optimizer, fused_optimizer=False)  # one micro-batch: no accumulation
    t = optimizer_time(
        inputs(blk, [opt], cluster(), tr), [opt], Config(Mesh(1, 1, 1), 1, "1f1b", 1, 0, [0], [0])
    )
    assert t == pytest.approx(params * accesses * 4 / BW)


@pytest.mark.parametrize("m", [1, 3])
def test_offload_traffic_per_step(m):
    """FSDP2 offload (ZeRO-3, dp 4): each micro-batch copies the rank's weight shard up for
    forward and again for backward and its gradient shard down; ZeRO-Offload (optimizer
    states only, ZeRO-1) moves the gradient shard down and the updated weight shard up once."""
    params = 4e8
    shard = params / 4
    blk = [make_block(0, "L", params=int(params), boundary=0, out=0)]
    for offload, zero, want in (
        # the fp32 weights FSDP2 keeps travel (4 bytes each way up), the gradient at its width
        ("optimizer+params", 3, m * shard * (4 + 4 + 2) / HOST_LINK),
        ("optimizer", 1, shard * (2 + 2) / HOST_LINK),
    ):
        opt = make_option(3e-3, params, 0.0, offload=offload)
        cost = run(blk, [opt], Mesh(1, 4, 1), [0], zero=zero, training=Training16(4 * m))
        assert cost.offload_s == pytest.approx(want)
        assert cost.step_time_s == pytest.approx(
            cost.pipeline_s + cost.dp_exposed_s + cost.optimizer_s + want
        )


def test_host_memory_per_gpu_bounds_offload():
    """400 GB of host memory shared by 4 GPUs: 100 GB each; 16-byte states of 28e9 parameters
    over 4 ranks (112 GB per rank) do not fit, 24e9 (96 GB) do (device memory left ample)."""
    for params, fits in ((28e9, False), (24e9, True)):
        blk = [make_block(0, "L", params=int(params), boundary=0, out=0)]
        opt = make_option(3e-3, params, 0.0, offload="optimizer+params")
        cl = cluster(memory_bytes=1e15)
        cost = run(blk, [opt], Mesh(1, 4, 1), [0], zero=3, training=Training16(4), cl=cl)
        assert cost.host_bytes_per_gpu == pytest.approx(16 * params / 4)
        assert cost.feasible == fits


def test_mfu_counts_model_flops_over_every_device():
    blocks = silent_blocks(2)
    opts = [make_option(1e-3, 0.0, 0.0) for _ in blocks]
    cost = run(blocks, opts, Mesh(1, 4, 1), [0, 0], training=Training16(8, "bf16"))
    flops = 2 * (10**9 + 2 * 10**9) * 8  # per sample, times the global batch
    assert cost.model_flops_per_step == pytest.approx(flops)
    assert cost.mfu == pytest.approx(flops / (cost.step_time_s * 4 * 4e12))


# --------------------------------------------------------------------------- block options


def traced_layer(path: str, args: dict, index: int = 1):
    from planner.api import trace

    traced = trace(path, {"size": "tiny", **args}, traced_batch_size=1, dtype="fp32")
    return traced.graph, traced.blocks[index]


def roofline_sum(graph, nodes, key_flops: str, key_bytes: str) -> float:
    """Per-op roofline, summed. Backward of an op that needs a gradient reads the output's
    gradient and what the op saved and writes the input's gradient: twice the forward's
    bytes (``key_bytes`` "bwd_bytes"); an op without a gradient has no backward."""

    def nbytes(d: dict) -> float:
        if key_bytes == "fwd_bytes":
            return d["fwd_bytes"]
        return 2 * d["fwd_bytes"] if d["requires_grad"] else 0.0

    return sum(max(graph.nodes[n][key_flops] / PEAK32, nbytes(graph.nodes[n]) / BW) for n in nodes)


FP32 = Training16(8, "fp32")


def options_by_recompute(graph, block, tp: int, training=FP32, **kw):
    from planner.api import variants_for
    from planner.cost.block_options import block_options

    cl = cluster(4, 4)
    variants = variants_for(graph, cl, "sharded" if tp > 1 else "auto")(block, tp)
    opts = block_options(graph, block, variants[:1], 1, cl, list(range(tp)), training, **kw)
    return {o.recompute: o for o in opts if o.offload == "none"}


def attention_core(graph, block) -> list[str]:
    """Korthikanti's attention core, found the way the paper draws it: the score product QK^T
    and the ops on the scores up to the product with V (scale, mask, softmax, dropout); what
    only builds the mask from a buffer is not activation work."""
    from planner.trace.opcost import MATMUL_OPS, VIEW_OPS

    attn = sorted(
        (n for n in block.nodes if ".attn" in graph.nodes[n]["module"]),
        key=lambda n: graph.nodes[n]["order"],
    )
    products = [
        i
        for i, n in enumerate(attn)
        if graph.nodes[n]["op"] in MATMUL_OPS and not graph.nodes[n]["params"]
    ]
    first, second = products[0], products[1]
    return [
        n
        for n in attn[first:second]
        if graph.nodes[n]["op"] not in VIEW_OPS and graph.nodes[n]["requires_grad"]
    ]


def test_recompute_options_of_a_gpt_layer_cost_what_they_re_run():
    """No recompute: the ops' roofline forward and backward. Full recompute runs the forward
    again in backward and keeps only the layer input (s x b x h fp32); Megatron's selective
    (the "core" policy) re-runs the attention core and keeps everything else."""
    graph, layer = traced_layer("examples/gpt.py", {"dropout": 0.1})
    by = options_by_recompute(graph, layer, 1, replace(FP32, selective_policy="core"))
    none, sel, full = by["none"], by["selective"], by["full"]
    fwd = roofline_sum(graph, layer.nodes, "fwd_flops", "fwd_bytes")
    bwd = roofline_sum(graph, layer.nodes, "bwd_flops", "bwd_bytes")
    assert none.fwd_s == pytest.approx(fwd, rel=1e-12)
    assert none.bwd_s == pytest.approx(bwd, rel=1e-12)
    assert full.bwd_s == pytest.approx(bwd + fwd, rel=1e-12)
    s, b, h = 32, 1, 64
    assert full.act_bytes == s * b * h * 4
    assert full.recompute_peak_bytes == none.act_bytes
    core = attention_core(graph, layer)
    assert {graph.nodes[n]["op"].split(".")[1] for n in core} >= {"softmax", "dropout"}
    assert sel.bwd_s == pytest.approx(bwd + roofline_sum(graph, core, "fwd_flops", "fwd_bytes"))
    core_saved = sum(
        nbytes for n in layer.nodes for src, nbytes in graph.nodes[n]["saved"] if src in core
    )
    assert sel.act_bytes == none.act_bytes - core_saved
    assert sel.recompute_peak_bytes == core_saved


def test_full_recompute_repeats_the_forward_tensor_parallel_all_reduces():
    """Megatron's layer at TP 2 (the HF Llama layer): two all-reduces of the s x b x h
    activations in forward and two in backward (Narayanan et al.); full recompute runs the
    forward pair once more."""
    graph, layer = traced_layer("examples/llama.py", {})
    by = options_by_recompute(graph, layer, 2)
    one = ring("all_reduce", 32 * 64 * 4, 2)
    assert by["none"].tp_comm_s == pytest.approx(4 * one)
    assert by["full"].tp_comm_s == pytest.approx(6 * one)
    assert by["full"].bwd_s - by["none"].bwd_s == pytest.approx(by["none"].fwd_s)


def test_capacity_factor_pads_only_the_experts_rows():
    """Switch Transformer's capacity factor: each expert computes capacity x its share of the
    routed rows, so the expert ops (and nothing else) cost 1.25 times as much."""
    graph, layer = traced_layer("examples/moe.py", {}, index=1)
    plain = options_by_recompute(graph, layer, 1)["none"]
    padded = options_by_recompute(graph, layer, 1, Training16(8, "fp32", moe_capacity_factor=1.25))[
        "none"
    ]
    inside = f"{layer.modules[0]}.moe.experts"
    experts = [n for n in layer.nodes if graph.nodes[n]["module"].startswith(inside)]
    assert any("grouped_mm" in graph.nodes[n]["op"] for n in experts)
    e_fwd = roofline_sum(graph, experts, "fwd_flops", "fwd_bytes")
    e_bwd = roofline_sum(graph, experts, "bwd_flops", "bwd_bytes")
    assert padded.fwd_s - plain.fwd_s == pytest.approx(0.25 * e_fwd, rel=1e-9)
    assert padded.bwd_s - plain.bwd_s == pytest.approx(0.25 * e_bwd, rel=1e-9)


def test_zero1_keeps_expert_optimizer_states_whole():
    """ZeRO-1 with expert parallelism, as the runtime runs it: the dense parameters' optimizer
    states shard over the 4 data-parallel ranks, this rank's experts (1e8 of its 3e8
    parameters) keep theirs whole, and only the dense shards are broadcast after the step."""
    blk = [make_block(0, "L", params=3 * 10**8, boundary=0, out=0)]
    opt = replace(make_option(3e-3, 3e8, 0.0), ep=2, expert_params=1e8)
    cost = run(blk, [opt], Mesh(1, 4, 1, ep=2), [0], zero=1, training=Training16(4))
    mem = cost.rank_memory[0]
    assert mem["params"] == pytest.approx(2 * 3e8) and mem["grads"] == pytest.approx(2 * 3e8)
    assert mem["optimizer"] == pytest.approx(12 * 2e8 / 4 + 12 * 1e8)
    dense_ar = 2 * 2e8 * 2 * 3 / 4 / NVLINK
    expert_ar = 2 * 1e8 * 2 * 1 / 2 / NVLINK
    broadcast = ring("all_gather", 2 * 2e8, 4)
    assert cost.stages[0].dp_comm_s == pytest.approx(
        dense_ar + expert_ar + 2 * 3 * NVLINK_LAT + broadcast
    )
    assert cost.optimizer_s == pytest.approx((2e8 / 4 + 1e8) * 30 / BW)


def test_tensor_parallel_shrinks_compute_and_memory_bound_work_by_their_own_shares():
    """Under TP each op's roofline time shrinks by its own share: 1/t for an op computing a
    shard of its output (a split product, an element-wise op on a shard) or a partial product,
    whole for a replicated norm or residual add. A block's average fractions would scale the
    norms' time by the sharded products' share (its bytes are mostly theirs)."""
    from planner.api import variants_for
    from planner.cost.block_options import block_options

    graph, layer = traced_layer("examples/llama.py", {})
    cl = cluster(4, 4)
    v = variants_for(graph, cl, "sharded")(layer, 2)[0]
    assert v.memory_bound_fraction > v.compute_fraction  # the norms stay whole
    opt = [
        o for o in block_options(graph, layer, [v], 1, cl, [0, 1], FP32) if o.recompute == "none"
    ][0]
    want = sum(ring(kind, nbytes, 2) for kind, nbytes in v.comm_fwd)
    whole = 0.0
    for n in layer.nodes:
        d = graph.nodes[n]
        t = max(d["fwd_flops"] / PEAK32, d["fwd_bytes"] / BW)
        state = v.states.get(n, "R")
        assert state or t == 0.0
        sharded = state.startswith("S") or (state == "P" and d["fwd_flops"] > 0)
        want += t / 2 if sharded else t
        whole += 0.0 if sharded else t
    assert whole > 0  # the replicated norms and adds, each at its full time
    assert opt.fwd_s == pytest.approx(want, rel=1e-9)


# --------------------------------------------------------------------------- tied weights


def tied_case(pp: int, dp: int, zero: int, m: int = 2, tied: bool = True):
    """Three blocks; the first owns a 1e8-element embedding that the last reads again (an
    output projection tied to it; ``tied=False``: the same model without the tie), 2 ms per
    micro-batch each; bf16 AdamW, one node."""
    blocks = [make_block(i, "L", params=0, boundary=0, out=0) for i in range(3)]
    blocks[0] = replace(blocks[0], params=10**8, param_names=["wte.weight"])
    if tied:
        blocks[2] = replace(blocks[2], tied={"wte.weight": 10**8})
    opts = [make_option(2e-3, p, 0.0) for p in (1e8, 0.0, 0.0)]
    stage_of = [0, pp - 1, pp - 1] if pp > 1 else [0, 0, 0]
    n = pp * dp
    return run(
        blocks, opts, Mesh(pp, dp, 1), stage_of, zero=zero, training=Training16(dp * m),
        cl=cluster(n, n),
    )  # fmt: skip


@pytest.mark.parametrize("zero,m", [(0, 2), (3, 1), (3, 2)])
def test_a_tied_copy_lives_and_trains_on_the_last_stage(zero, m):
    """Two stages, two replicas: the last stage keeps a full copy of the tied embedding with
    its gradient and optimizer states (sharded by ZeRO like its owner's; a ZeRO-3 pipeline
    with several micro-batches keeps weights and gradients whole until the step), and after
    the pipeline drains the copy's gradient is reduced over its replicas (nothing hides it)
    and summed with the first stage's by an all-reduce between the two stages (Megatron's
    embedding group)."""
    base = tied_case(2, 2, zero, m)
    n, dp = 1e8, 2
    if zero == 0:
        states = n * (2 + 2 + 12)
        sync = ring("all_reduce", n * 2, dp) + ring("all_reduce", n * 2, 2)
    else:
        states = n * (2 + 2 + 12) / dp if m == 1 else n * (2 + 2 + 12 / dp)
        sync = ring("reduce_scatter", n * 2, dp) + ring("all_reduce", n * 2 / dp, 2)
    untied = tied_case(2, 2, zero, m, tied=False)
    assert base.rank_memory[1]["other"] - untied.rank_memory[1]["other"] == pytest.approx(states)
    assert base.rank_memory[0]["other"] == pytest.approx(untied.rank_memory[0]["other"])
    assert base.step_time_s - untied.step_time_s == pytest.approx(sync, rel=1e-9)


@pytest.mark.parametrize("zero", [0, 2, 3])
def test_one_stage_holds_a_tied_weight_once(zero):
    """Without a pipeline both uses are on every rank: one tensor, no copy, no sync; under
    ZeRO-3 the modules sharing it form one FSDP unit with the root, so the weight stays
    gathered through forward and backward: (1 - 1/dp) of its bf16 bytes more."""
    tied, untied = tied_case(1, 4, zero), tied_case(1, 4, zero, tied=False)
    extra = 1e8 * 2 * (1 - 1 / 4) if zero == 3 else 0.0
    assert tied.rank_memory[0]["other"] - untied.rank_memory[0]["other"] == pytest.approx(extra)
    assert tied.step_time_s == pytest.approx(untied.step_time_s, rel=1e-12)


def test_megatrons_fused_qkv_layout_lets_tp_split_the_attention_core_by_heads():
    """benchmarks/published_gpt.py lays its fused Q/K/V projection out per head, as Megatron
    does: a column shard of the projection is whole heads, so the sharding ILP's TP variant
    runs the materialised scores and their softmax on 1/t of the heads (S), not replicated."""
    from planner.api import trace, variants_for

    args = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 128}
    traced = trace("benchmarks/published_gpt.py", {**args, "attention": "fused", "tied": False},
                   traced_batch_size=1, dtype="fp32")  # fmt: skip
    graph, layer = traced.graph, traced.blocks[1]
    v = variants_for(graph, cluster(4, 4), "sharded")(layer, 2)[0]
    core = [n for n in layer.nodes if graph.nodes[n]["op"] in ("aten.softmax.int",)]
    assert core and all(v.states[n].startswith("S") for n in core)


def test_grouped_query_attention_in_megatrons_layout_is_attention_over_shared_heads():
    """published_gpt.py's grouped-query attention (Nemotron-4's: 8 query heads over 2 key/value
    groups, laid out per group [q q q q k v] as Megatron's fused projection is) computes what
    multi-head attention computes with each group's key and value repeated for its queries;
    TP splits it by groups, so attention runs on 1/t of the query heads (S)."""
    import importlib.util

    import torch
    import torch.nn.functional as F

    from planner.api import trace, variants_for

    path = Path(__file__).resolve().parents[1] / "benchmarks/published_gpt.py"
    spec = importlib.util.spec_from_file_location("published_gpt_gqa", path)
    gpt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpt)
    torch.manual_seed(0)
    attn = gpt.Attention(64, 8, "flash", 2)
    x = torch.randn(2, 16, 64)
    w = attn.qkv(x).view(2, 16, 2, 6, 8)  # (b, s, group, 4 q + k + v, head_dim)
    q = w[:, :, :, :4].reshape(2, 16, 8, 8).transpose(1, 2)
    k = w[:, :, :, 4].transpose(1, 2).repeat_interleave(4, dim=1)
    v = w[:, :, :, 5].transpose(1, 2).repeat_interleave(4, dim=1)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = attn.proj(y.transpose(1, 2).reshape(2, 16, 64))
    assert torch.allclose(attn(x), expected, atol=1e-6)

    args = {"layers": 2, "hidden": 64, "heads": 8, "kv_heads": 2, "seq_len": 32, "vocab": 128}
    traced = trace(str(path), {**args, "tied": False}, traced_batch_size=1, dtype="fp32")
    graph, layer = traced.graph, traced.blocks[1]
    v2 = variants_for(graph, cluster(4, 4), "sharded")(layer, 2)[0]
    core = [n for n in layer.nodes if "scaled_dot_product" in graph.nodes[n]["op"]]
    assert core and all(v2.states[n].startswith("S") for n in core)


# --------------------------------------------------------------------------- torch's states
# meshplan's runtime (Training's default): .grad in the fp32 parameter's dtype, allocated by
# backward and freed by zero_grad(set_to_none=True); foreach AdamW's temporary at the step.


def test_the_runtime_reduces_fp32_gradients():
    """MixedPrecisionPolicy(reduce_dtype=float32): the ZeRO-0 all-reduce moves 4 bytes per
    parameter, twice what a 16-bit gradient buffer moves."""
    params = [10**8, 3 * 10**8]
    blocks = [make_block(i, "L", params=p, boundary=0, out=0) for i, p in enumerate(params)]
    opts = [make_option(3e-3, float(p), 0.0) for p in params]
    for tr, width in ((Training(8), 4), (Training16(8), 2)):
        cost = run(blocks, opts, Mesh(1, 4, 1), [0, 0], training=tr, cl=cluster(4, 4))
        assert cost.stages[0].dp_comm_s == pytest.approx(ring("all_reduce", width * 4e8, 4))


def _one_block(act: float, ws: float, m: int, out: int = 0, fused: bool = True):
    """1e8 parameters, bf16 AdamW, one device; ``out`` logits elements per sample."""
    blocks = [make_block(0, "L", params=10**8, boundary=0, out=out)]
    opt = replace(make_option(1e-3, 1e8, act), transient_bytes=ws)
    tr = Training(m, fused_optimizer=fused)
    return run(blocks, [opt], Mesh(1, 1, 1), [0], training=tr)


@pytest.mark.parametrize("m", [1, 2])
def test_activations_peak_before_backward_allocates_gradients(m):
    """Large activations (2e10 bytes): the peak is the end of the forward, with the bf16
    weights (2e8) and the fp32 weights and moments (12e8), and the fp32 gradients (4e8) only
    when an earlier micro-batch accumulated into them."""
    mem = _one_block(act=2e10, ws=0.0, m=m).rank_memory[0]
    assert mem["params"] == pytest.approx(2e8)
    assert mem["optimizer"] == pytest.approx(12e8)
    assert mem["grads"] == pytest.approx(4e8 if m > 1 else 0.0)
    assert mem["activations"] == pytest.approx(2e10)
    assert mem["total"] == pytest.approx(RESERVED + 2e8 + 12e8 + (4e8 if m > 1 else 0) + 2e10)


def test_the_optimizer_step_peaks_when_activations_are_small():
    """Activations of 1e8: the step holds the fp32 weights and moments (12e8), the fp32
    gradients (4e8) and foreach AdamW's fp32 temporary (4e8), the bf16 copies freed: 20e8,
    above the end of the forward's 2e8 + 12e8 + 1e8. torch's fused step (the runtime's on
    GPUs) allocates no temporary: 16e8, still above the forward's 15e8."""
    mem = _one_block(act=1e8, ws=0.0, m=1, fused=False).rank_memory[0]
    assert mem["total"] == pytest.approx(RESERVED + 20e8)
    assert (mem["params"], mem["grads"], mem["optimizer"]) == pytest.approx((0, 4e8, 12e8))
    assert mem["activations"] == 0 and mem["other"] == pytest.approx(RESERVED + 4e8)
    fused = _one_block(act=1e8, ws=0.0, m=1).rank_memory[0]
    assert fused["total"] == pytest.approx(RESERVED + 16e8)
    assert fused["other"] == pytest.approx(RESERVED)


@pytest.mark.parametrize("ws", [1e8, 9e9])
def test_the_loss_and_the_largest_op_share_one_slot(ws):
    """The loss's three fp32 copies of 5e8 bytes of bf16 logits (3 x 4 / 2 x 5e8 = 3e9 bytes)
    exist between the
    loss's forward and the last block's backward, when no block op's working memory does: the
    peak holds the larger of the two, not both."""
    mem = _one_block(act=2e10, ws=ws, m=1, out=5 * 10**8).rank_memory[0]
    assert mem["other"] == pytest.approx(RESERVED + max(ws, 3 * 4 / 2 * 5e8))


# --------------------------------------------------------------------------- batch statistics


@pytest.mark.parametrize("device", ["gpu", "cpu"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_synchronized_batch_statistics_cost_collectives_per_micro_batch(device, recompute):
    """Two BatchNorms of 64 and 256 channels under DP 4, 3 micro-batches. On GPUs
    nn.SyncBatchNorm gathers each rank's mean, inverse std and count (2C + 1 fp32) in forward
    and all-reduces two sums (2C) in backward; on CPU ranks the runtime all-reduces C + 1 and
    C numbers in forward and both again for their gradients. Full recompute runs the forward
    (and its collectives) twice. Nothing hides them: every micro-batch waits."""
    m, chans = 3, (64, 256)
    blk = [make_block(0, "L", params=0, boundary=0, out=0)]
    opt = replace(make_option(3e-3, 0.0, 0.0, recompute=recompute), norm_channels=chans)
    cl = cluster(4, 4, device=device)
    want = 0.0
    for c in chans:
        if device == "gpu":
            fwd, bwd = ring("all_gather", 4 * (2 * c + 1) * 4, 4), ring("all_reduce", 2 * c * 4, 4)
        else:
            fwd = ring("all_reduce", (c + 1) * 4, 4) + ring("all_reduce", c * 4, 4)
            bwd = fwd
        want += (2 if recompute == "full" else 1) * fwd + bwd
    cost = run(blk, [opt], Mesh(1, 4, 1), [0], training=Training16(4 * m), cl=cl)
    plain = run(blk, [replace(opt, norm_channels=())], Mesh(1, 4, 1), [0],
                training=Training16(4 * m), cl=cl)  # fmt: skip
    assert cost.step_time_s - plain.step_time_s == pytest.approx(m * want)
    one = run(
        blk, [opt], Mesh(1, 1, 1), [0], training=Training16(m), cl=cluster(1, 1, device=device)
    )
    none = run(blk, [replace(opt, norm_channels=())], Mesh(1, 1, 1), [0], training=Training16(m),
               cl=cluster(1, 1, device=device))  # fmt: skip
    assert one.step_time_s == pytest.approx(none.step_time_s)  # one replica: nothing to sync


def test_the_trace_finds_the_batch_norms_that_use_batch_statistics():
    """examples/resnet.py: the stem's and first bottleneck's four BatchNorms in block 0, one in
    each shortcut; a model in eval mode normalises with running statistics (none to sync)."""
    from planner.api import trace
    from planner.cost.block_options import batch_norm_channels
    from planner.modelfile import load_model_file

    root = Path(__file__).resolve().parent.parent
    mf = load_model_file(str(root / "examples" / "resnet.py"), {})
    traced = trace(mf, traced_batch_size=1, dtype="fp32")
    found = [batch_norm_channels(traced.graph, b) for b in traced.blocks]
    assert [len(f) for f in found] == [4, 0, 1, 3, 0, 1, 0]
    model = mf.build()
    widths = [m.num_features for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert sorted(c for f in found for c in f) == sorted(widths)


# The data-parallel wrapper's copies (cost.data_parallel.dp_copy_bytes), by hand per parameter; w is
# the gathered width (2 when cast to bf16, 4 in fp32), f = 1 / replicas.
@pytest.mark.parametrize(
    "zero, tp, dp, m, casts, per_param",
    [
        # replicate at one replica, cast: cast 6 + copy-in 4 + copy-out 4 + the collective's
        # copy 4; the reduce 2 + 4 into the fp32 buffer, 8 out, 8 the collective's copy
        (0, 1, 1, 1, True, 18 + 22),
        # ZeRO-3 over 4, two micro-batches: two gathers of 6/4 + 4/4 + 4, and the reduce
        # (2 + 4 + 8/4) every micro-batch (FSDP keeps its gradient sync on)
        (3, 1, 4, 2, True, 2 * 6.5 + 8),
        (2, 1, 4, 1, True, 6.5 + 8),  # ZeRO-2 gathers once a micro-batch
        (2, 1, 4, 2, True, 6.5 + 8),  # ... and reduces each
        # replicate at one replica over four micro-batches, sync off but for the last: the
        # gathers each time, the reduce once, and the accumulation: the first gradient cast to
        # an fp32 accumulator (2 + 4), three added into it (2 + 4 + 4), the reduce reading
        # the accumulator (4 - 2 more)
        (0, 1, 1, 4, True, 18 + (22 + 6 + 3 * 10 + 2) / 4),
        # replicate in fp32 over 2, two micro-batches: gradients accumulate in place (4 + 4 + 4)
        (0, 2, 2, 2, False, (8 / 2 + 8) + (4 + 4 + 8 / 2 + 12) / 2),
        (1, 1, 4, 2, True, 12 + 16 / 2),  # DDP under autocast: two casts; buckets in and out
        (0, 1, 1, 1, False, 0),  # the CPU runtime at one replica wraps nothing
        (0, 2, 1, 1, False, 0),  # ... nor under TP
        (0, 2, 2, 1, False, (8 / 2 + 8) + (4 + 4 + 8 / 2)),  # replicate in fp32 over 2
    ],
)
def test_the_data_parallel_wrappers_copies(zero, tp, dp, m, casts, per_param):
    tr = Training(dp * 2 * m, device_casts=casts)
    config = Config(Mesh(pp=1, dp=dp, tp=tp), 2, "1f1b", 1, zero, [0], [0])
    o = make_option(1e-3, 1e6, 0.0)
    assert dp_copy_bytes(o, config, tr) == pytest.approx(per_param * 1e6)
    assert dp_copy_bytes(o, config, replace(tr, dp_copies="none")) == 0


def test_a_deferring_zero2_pipeline_gathers_once_per_step():
    """ZeRO-2 under PP 2 with two micro-batches: the stage keeps its weights unsharded from the
    first forward to the step's end, so one gather's copies (6/4 + 4/4 + 4) a step, beside the
    reduce and the fp32 accumulation once a step."""
    tr = Training(4 * 2 * 2)
    config = Config(Mesh(pp=2, dp=4, tp=1), 2, "1f1b", 1, 2, [0, 1], [0, 0])
    o = make_option(1e-3, 1e6, 0.0)
    assert dp_copy_bytes(o, config, tr) == pytest.approx((6.5 / 2 + (8 + 6 + 10 + 2) / 2) * 1e6)


def test_a_deferring_pipeline_pays_the_accumulation_once_per_step():
    """ZeRO-3 under PP 2 with two micro-batches: torch's pipelining turns the FSDP stage's
    sync off until the last backward, so the reduce comes once a step and the unreduced
    gradients accumulate in fp32 (2 + 4 the first, 2 + 4 + 4 the second, 4 - 2 at the reduce)."""
    tr = Training(4 * 2 * 2)
    config = Config(Mesh(pp=2, dp=4, tp=1), 2, "1f1b", 1, 3, [0, 1], [0, 0])
    o = make_option(1e-3, 1e6, 0.0)
    assert dp_copy_bytes(o, config, tr) == pytest.approx((2 * 6.5 + (8 + 6 + 10 + 2) / 2) * 1e6)


@pytest.mark.parametrize("regather, gathers", [(True, 3), (False, 1)])
def test_zero2_gathers_each_micro_batch_under_fsdp2(regather, gathers):
    """FSDP2 reshards ZeRO-2's weights after every backward, so each of m micro-batches
    gathers them again; frameworks that keep whole 16-bit weights gather once a step."""
    rates = DPRates(
        replicas=4, zero=2, m=3, deferred=False, regather=regather, overlap=0.0, unit=0.0,
        all_reduce=(0.0, 0.0), reduce_scatter=(1e-9, 0.0), all_gather=(2e-9, 0.0),
    )  # fmt: skip
    o = make_option(1e-3, 1e6, 0.0)
    p = o.comm_params(4)
    a, b, t = dp_block_terms(o, rates)
    assert t == pytest.approx(3 * 1e-9 * p + gathers * 2e-9 * p)
    assert b == pytest.approx(gathers * 2e-9 * p)
    training = Training(12)
    assert dp_rates_regather(training) is True
    assert dp_rates_regather(replace(training, dp_copies="none")) is False


def dp_rates_regather(training: Training) -> bool:
    config = Config(Mesh(pp=1, dp=4, tp=1), 1, "1f1b", 1, 2, [0], [0])
    blocks = [make_block(0, "L", params=10**6, boundary=0, out=0)]
    inp = CostInputs(blocks, [[make_option(1e-3, 1e6, 0.0)]], 1, cluster(4), training)
    return dp_rates(inp, config).regather


def test_the_wrappers_copies_run_at_the_element_wise_rate_in_the_stage():
    """A block's stage time per micro-batch is its ops' time plus the copies at the profile's
    element-wise bandwidth (BW here): 40 bytes per parameter under replicate at one replica."""
    blocks = [make_block(0, "L", params=10**8, boundary=0, out=0)]
    opt = make_option(1e-3, 1e8, 0.0)
    cost = run(blocks, [opt], Mesh(1, 1, 1), [0], training=Training(1))
    assert cost.stages[0].compute_s == pytest.approx(1e-3 + 40 * 1e8 / BW)
    fp32 = run(blocks, [opt], Mesh(1, 1, 1), [0], training=Training(1, device_casts=False))
    assert fp32.stages[0].compute_s == pytest.approx(1e-3)
