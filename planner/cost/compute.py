"""Compute time: each op's roofline time from its traced FLOPs and bytes at the profile's
achievable rates (matrix products, fused attention, element-wise chains, misaligned products),
the per-op dispatch overhead of eager torch, tensor-parallel collectives and how much of them
overlaps, ring attention under context parallelism, and the loss."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.cost.records import Config, CostInputs, loss_shards, sample_share
from planner.cost.sharding import node_share
from planner.hardware.cluster import Cluster
from planner.hardware.collectives import p2p_time
from planner.trace.blocks import Block, cached_core_nodes
from planner.trace.graph import param_bytes_of
from planner.training import Training
from planner.vocab import HALF_DTYPES, base_style

OPTIMIZER_OPS = {"adamw": 8, "sgd": 3}
LOSS_OPS = 4  # upcast, log-softmax, gather, mean


def compute_time(
    flops: float,
    nbytes: float,
    cluster: Cluster,
    dtype: str,
    slowdown: float = 1.0,
    rate: float | None = None,
) -> float:
    """Roofline: the larger of FLOPs over achievable peak (``slowdown`` times slower for a GEMM
    with a short inner dimension) and bytes over achievable bandwidth. ``rate``: the op class's
    achievable FLOP/s when it is not the dtype's GEMM rate (``op_rate``)."""
    p = cluster.profile
    bw = p.memory_bandwidth * p.elementwise_efficiency
    return max(flops * slowdown / achievable_peak(cluster, dtype, rate), nbytes / bw)


def achievable_peak(cluster: Cluster, dtype: str, rate: float | None = None) -> float:
    """FLOP/s a product reaches: ``rate`` when its op class has its own (``op_rate``), else the
    dtype's peak times the profile's GEMM efficiency."""
    p = cluster.profile
    return p.peak_flops[dtype] * p.matmul_efficiency if rate is None else rate


# FlashAttention's backward recomputes the scores (S = QK^T) before dS, dQ, dK, dV: five
# products to the forward's two, 2.5x the forward's FLOPs where the trace counts the model's 2x
# (Dao 2023, FlashAttention-2 Sec. 3.1.2 / its benchmark's FLOP count).
FLASH_BACKWARD = 2.5 / 2.0


def op_rate(
    node: dict,
    cluster: Cluster,
    dtype: str,
    fp8: bool = False,
    native: bool = False,
    legacy: bool = False,
):
    """(achievable FLOP/s, forward FLOP factor, backward FLOP factor) of one op's products.

    - A fused attention kernel (scaled_dot_product_attention) runs at the profile's
      ``attention_efficiency`` of the 16-bit peak, quoted, as FlashAttention's benchmarks quote
      it, on the work it does: a causal kernel skips the masked half of the score tiles, and
      backward recomputes the scores (``FLASH_BACKWARD``). A profile without the figure prices
      attention as any product of the dtype (the CPU's, whose kernels are measured as such).
      ``native``: the chip's own fused attention kernel (``Training.native_attention``) at the
      profile's ``native_attention_efficiency`` where it gives one; ``legacy``: a flash-attention
      build older than the chip (``Training.legacy_attention``) at its
      ``legacy_attention_efficiency``.
    - With FP8 linears, a product with a weight runs at the profile's FP8 rate.
    - A 16-bit product of two activations with a dimension off Tensor Cores' 8-element
      alignment (``misaligned``) at the profile's ``misaligned_matmul_efficiency`` where it
      gives one.
    - Every other product at the dtype's peak times ``matmul_efficiency``."""
    from planner.trace.opcost import ATTENTION_OPS

    p = cluster.profile
    if node["op"] in ATTENTION_OPS and p.attention_efficiency > 0:
        work = 0.5 if _causal(node) else 1.0
        eff = p.attention_efficiency
        if native and p.native_attention_efficiency > 0:
            eff = p.native_attention_efficiency
        elif legacy and p.legacy_attention_efficiency > 0:
            eff = p.legacy_attention_efficiency
        return p.peak_flops[dtype] * eff, work, work * FLASH_BACKWARD
    if fp8 and node.get("params") and p.peak_flops.get("fp8", 0.0) > 0:
        return p.peak_flops["fp8"] * p.fp8_matmul_efficiency, 1.0, 1.0
    if p.misaligned_matmul_efficiency > 0 and dtype in HALF_DTYPES and misaligned(node):
        return p.peak_flops[dtype] * p.misaligned_matmul_efficiency, 1.0, 1.0
    return p.peak_flops[dtype] * p.matmul_efficiency, 1.0, 1.0


# Tensor Cores' aligned GEMM path needs every dimension of a 16-bit product to be a multiple of
# 16 bytes, 8 elements (NVIDIA, Matrix Multiplication Background User's Guide, 2.2 "Tensor Core
# Requirements"; cuBLAS >= 11 runs other shapes on a slower unaligned path).
TENSOR_CORE_ALIGN = 8


def misaligned(node: dict) -> bool:
    """Whether a product of two activations (a per-head attention product: no weight) has a
    dimension (its traced K, N or M) that is not a multiple of ``TENSOR_CORE_ALIGN`` elements,
    as BLOOM's trials with head dims 108, 150 and 450 ran them. Products with a weight keep the
    GEMM rate: the published rows hold no unaligned linear layer to price one from."""
    inner = node.get("mm_inner")
    if not inner or node.get("params"):
        return False
    return any(int(x) % TENSOR_CORE_ALIGN for x in inner[:3])


def inner_dim_slowdowns(inner: list | None, scale: float, half: float) -> tuple[float, float]:
    """(forward, backward) time factors of a matrix product whose GEMMs reduce over short inner
    dimensions: a GEMM over K runs at K / (K + half) of the asymptotic rate (``half`` is the
    profile's ``matmul_half_inner_dim``, fitted by plan calibrate). Backward runs two GEMMs of
    the forward's size, over N and over M (M grows with the micro-batch for a weight)."""
    if not inner or half <= 0:
        return 1.0, 1.0
    k, n, m, scaled = inner
    m = m * scale if scaled else m
    f = (k + half) / k
    b = ((n + half) / n + (m + half) / m) / 2
    return f, b


@dataclass
class NodeTimes:
    """A block's per-op roofline times, summed, split by what bounds each op: compute (its
    FLOPs over the achievable peak) or memory (its bytes over the achievable bandwidth).
    Tensor parallelism shrinks the two by different shares (``TPVariant.compute_fraction``
    and ``memory_bound_fraction``): replicated norms and residual adds do not shrink."""

    fwd_compute: float = 0.0
    fwd_memory: float = 0.0
    bwd_compute: float = 0.0
    bwd_memory: float = 0.0
    core_fwd: float = 0.0  # forward of the selective core (what selective recompute re-runs)
    # per op: (forward compute, forward memory, backward compute, backward memory), for
    # ``tp_shares``: each op shrinks under TP by its own share, not the block's average
    ops: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)

    @property
    def fwd(self) -> float:
        return self.fwd_compute + self.fwd_memory

    @property
    def bwd(self) -> float:
        return self.bwd_compute + self.bwd_memory

    def sharded(self, shares: dict[str, float], nodes=None) -> tuple[float, float]:
        """(forward, backward) of ``nodes`` (default: every op) with each op's time times its
        share (``tp_shares``)."""
        f = b = 0.0
        for n in self.ops if nodes is None else nodes:
            fc, fm, bc, bm = self.ops.get(n, (0.0, 0.0, 0.0, 0.0))
            s = shares.get(n, 1.0)
            f += (fc + fm) * s
            b += (bc + bm) * s
        return f, b


def tp_shares(variant, times: NodeTimes, graph) -> dict[str, float] | None:
    """Each op's share of its unsharded time on one device of the variant's TP group, as the
    sharding ILP prices it (``cost.sharding.op_share``: 1/t for a shard of the output or a
    partial product, the whole for a replicated norm or an element-wise op on a partial sum,
    the table gradient's rows for a vocabulary-parallel lookup). None when the variant does not
    name its ops' states (then the block's average fractions apply)."""
    states = getattr(variant, "states", None)
    t = getattr(variant, "tp", 1)
    if not states or t <= 1:
        return None
    out: dict[str, float] = {}
    for n, (fc, fm, bc, bm) in times.ops.items():
        s = states.get(n)
        if s is None:
            if fc + fm + bc + bm > 0:
                return None
            continue  # an op that costs nothing (a metadata assertion)
        out[n] = node_share(graph, n, s, t)
    return out


def _roofline_parts(
    flops: float,
    nbytes: float,
    cluster: Cluster,
    dtype: str,
    slowdown: float,
    rate: float | None = None,
) -> tuple[float, float]:
    """(compute-bound, memory-bound) time of one op: the roofline time in its bound's slot."""
    t = compute_time(flops, nbytes, cluster, dtype, slowdown, rate)
    compute_bound = flops * slowdown / achievable_peak(cluster, dtype, rate) >= t
    return (t, 0.0) if compute_bound and flops > 0 else (0.0, t)


def block_node_times(
    graph,
    block: Block,
    scale: float,
    cluster: Cluster,
    dtype: str,
    nodes=None,
    fp8=False,
    native=False,
    fused=False,
    legacy=False,
) -> NodeTimes:
    """Per-op roofline of a block's ops (or of ``nodes``), for ``scale`` traced micro-batches.

    An op's traced bytes include the weights it reads; those do not grow with the micro-batch
    (only activations do), so they are kept out of the scaling. Backward reads the weights and
    writes their gradients: twice the weight bytes, also fixed. Each op's products run at
    its class's rate (``op_rate``: GEMMs, fused attention, the chip's own attention kernel when
    ``native``, an older flash-attention build when ``legacy``, FP8 linears when ``fp8``).
    ``fused``: element-wise chains run as one kernel each (``fusion_shares``)."""
    core = cached_core_nodes(graph)
    pbytes = param_bytes_of(graph)
    half = cluster.profile.matmul_half_inner_dim
    shares = fusion_shares(graph, block) if fused else {}
    out = NodeTimes()
    for n in block.nodes if nodes is None else nodes:
        d = graph.nodes[n]
        weights = min(sum(pbytes.get(p, 0) for p in d.get("params", ())), d["fwd_bytes"])
        act_f = (d["fwd_bytes"] - weights) * shares.get(n, 1.0)
        slow_f, slow_b = inner_dim_slowdowns(d.get("mm_inner"), scale, half)
        rate, work_f, work_b = op_rate(d, cluster, dtype, fp8, native, legacy)
        fc, fm = _roofline_parts(
            d["fwd_flops"] * work_f * scale, act_f * scale + weights, cluster, dtype, slow_f, rate
        )
        bw_w = min(2 * weights, d["bwd_bytes"])
        act_b = (d["bwd_bytes"] - bw_w) * shares.get(n, 1.0)
        bc, bm = _roofline_parts(
            d["bwd_flops"] * work_b * scale, act_b * scale + bw_w, cluster, dtype, slow_b, rate
        )
        out.fwd_compute += fc
        out.fwd_memory += fm
        out.bwd_compute += bc
        out.bwd_memory += bm
        out.ops[n] = (fc, fm, bc, bm)
        if n in core:
            out.core_fwd += fc + fm
    return out


def fusion_shares(graph, block: Block) -> dict[str, float]:
    """Per element-wise op of ``block``, the share of its traced activation traffic left when
    every chain of element-wise ops between two products runs as one kernel, as Transformer
    Engine's and Megatron-Core's fused kernels (normalization with the next linear, SwiGLU,
    rotary embedding, bias-dropout-add) and torch.compile's Inductor (which fuses point-wise
    ops and reductions into generated kernels) run them.

    A chain is a connected group of the block's ops that are neither products nor attention
    kernels (views included: they move nothing). Fused, it reads each tensor entering it
    from outside once and writes each tensor that leaves it (read outside it, or the block's
    output) once; unfused, every op reads its inputs and writes its output. Each op of the
    chain keeps the chain's ratio of the two; backward traffic shrinks in the same ratio."""
    from planner.trace.opcost import ATTENTION_OPS, MATMUL_OPS

    members = {
        n for n in block.nodes if graph.nodes[n]["op"] not in MATMUL_OPS | ATTENTION_OPS | {"input"}
    }
    shares: dict[str, float] = {}
    seen: set[str] = set()
    for start in sorted(members, key=lambda n: graph.nodes[n]["order"]):
        if start in seen:
            continue
        group, stack = {start}, [start]
        while stack:
            u = stack.pop()
            for v in list(graph.predecessors(u)) + list(graph.successors(u)):
                if v in members and v not in group:
                    group.add(v)
                    stack.append(v)
        seen |= group
        unfused = sum(graph.nodes[n]["fwd_bytes"] for n in group)
        if unfused <= 0:
            continue
        reads = {u: graph.edges[u, v]["bytes"] for v in group for u in graph.predecessors(v)}
        fused_bytes = sum(b for u, b in reads.items() if u not in group)
        for u in group:
            outside = [graph.edges[u, v]["bytes"] for v in graph.successors(u) if v not in group]
            if outside:  # a view's edge carries the bytes of the tensor it shows
                fused_bytes += max(outside)
            elif not any(True for _ in graph.successors(u)):
                fused_bytes += graph.nodes[u]["out_bytes"]
        ratio = min(1.0, fused_bytes / unfused)
        shares.update({n: ratio for n in group})
    return shares


def node_times(
    graph, block: Block, scale: float, cluster: Cluster, dtype: str, nodes=None, **kernels: bool
):
    """(forward, backward, forward of the selective core): ``block_node_times`` summed
    (``kernels``: its ``fp8``, ``native`` and ``fused`` flags)."""
    t = block_node_times(graph, block, scale, cluster, dtype, nodes, **kernels)
    return t.fwd, t.bwd, t.core_fwd


@dataclass(frozen=True)
class OpCounts:
    """Eager ops of a block (views excluded: they cost no kernel), for the per-op overheads:
    forward ops, and backward ops (those with a gradient)."""

    fwd: int
    bwd: int


def op_counts(graph, block: Block) -> OpCounts:
    from planner.trace.opcost import is_view

    fwd = bwd = 0
    for n in block.nodes:
        d = graph.nodes[n]
        if d["op"] == "input" or is_view(d["op"]):
            continue
        fwd += 1
        bwd += 1 if d.get("requires_grad") else 0
    return OpCounts(fwd, bwd)


def overhead_times(counts: OpCounts, tp_plan: dict, tp: int, cluster: Cluster):
    """(forward, backward, selective-recompute) host overhead of a block's ops. Each module TP
    shards adds ``tp_module_overhead_s`` (DTensor wrapping and dispatch of the linear and its
    backward, measured by plan calibrate), or ``tp_gather_overhead_s`` when its output is
    gathered (a further redistribute), a third in forward and two thirds in backward, as its
    ops split. Selective recompute's checkpoint policy sees every op in forward and in the
    recompute: ``selective_op_overhead_s`` per op."""
    p = cluster.profile
    fwd = counts.fwd * p.op_overhead
    bwd = counts.bwd * p.backward_op_overhead
    if tp > 1 and tp_plan:
        gathered = sum(1 for style in tp_plan.values() if base_style(style) == "colwise_gather")
        per_step = (len(tp_plan) - gathered) * p.tp_module_overhead + gathered * (
            p.tp_gather_overhead
        )
        fwd += per_step / 3
        bwd += per_step * 2 / 3
    return fwd, bwd, counts.fwd * p.selective_op_overhead


def tp_exposed(
    comm_f: float,
    comm_b: float,
    gemm_f: float,
    gemm_b: float,
    cluster: Cluster,
    share: float = 1.0,
) -> tuple[float, float]:
    """The TP collectives' time left on the critical path when they overlap the block's own
    products (``Training.tp_overlap``: Megatron-Core's --tp-comm-overlap, torch's async TP):
    each all-gather or reduce-scatter is split into chunks that run beside the GEMM consuming
    or producing them (Wang et al. 2023, "Overlap communication with dependent computation via
    decomposition"), so up to the profile's ``comm_overlap`` share of the block's compute-bound
    time hides it; the excess stays exposed. ``share``: the most of the collectives the
    implementation hides however long the GEMMs (``Training.tp_overlap_async``)."""
    hide = cluster.profile.comm_overlap
    keep = 1.0 - share
    return (
        max(keep * comm_f, comm_f - hide * gemm_f),
        max(keep * comm_b, comm_b - hide * gemm_b),
    )


def ring_attention_times(
    graph, block: Block, scale: float, cluster: Cluster, training: Training, cp_ranks
) -> tuple[float, float]:
    """Exposed (forward, backward) time of context parallelism's ring attention in a block.

    Each of the cp - 1 ring steps passes this rank's key and value chunk (1/cp of the sequence,
    ``scale`` already holds the 1/cp) to the next rank; backward passes keys, values and their
    gradients, twice the bytes. Ring steps overlap the attention kernels on the chunks already
    received, up to the profile's ``comm_overlap`` share of the attention's time.

    Causal attention without load balancing (the runtime's, see runtime/context_parallel.py):
    rank r attends its chunk to chunks 0..r, so the last rank does (2cp - 1)/cp times the mean
    attention work, and every rank waits for it: the attention time grows by (cp - 1)/cp."""
    from planner.trace.opcost import ATTENTION_OPS

    cp = len(cp_ranks) if cp_ranks else 1
    if cp <= 1:
        return 0.0, 0.0
    bw, lat = cluster.link(cp_ranks)
    hide = cluster.profile.comm_overlap
    fwd = bwd = 0.0
    for n in block.nodes:
        d = graph.nodes[n]
        if d["op"] not in ATTENTION_OPS:
            continue
        refs = [a["node"] for a in d["args"][1:3] if isinstance(a, dict) and "node" in a]
        kv = sum(graph.edges[r, n]["bytes"] for r in refs) * scale
        ring_f = (cp - 1) * p2p_time(kv, bw, lat)
        ring_b = (cp - 1) * p2p_time(2 * kv, bw, lat)
        attn_f, attn_b, _ = node_times(
            graph, block, scale, cluster, training.dtype, [n],
            native=training.native_attention, legacy=training.legacy_attention,
        )  # fmt: skip
        fwd += max(0.0, ring_f - hide * attn_f)
        bwd += max(0.0, ring_b - hide * attn_b)
        if _causal(d):
            fwd += attn_f * (cp - 1) / cp
            bwd += attn_b * (cp - 1) / cp
    return fwd, bwd


def _causal(node: dict) -> bool:
    args = node.get("args") or []
    kwargs = args[-1] if args and isinstance(args[-1], dict) and "node" not in args[-1] else {}
    positional = args[5] if len(args) > 5 and not isinstance(args[5], dict) else None
    return bool(kwargs.get("is_causal", positional))


def loss_time(inp: CostInputs, config: Config) -> float:
    """The loss on the last stage, per micro-batch: cross-entropy over fp32 logits is
    memory-bound, log-softmax and its gradient reading and writing the logits about three times
    each way (``loss_bytes`` is three fp32 copies of the logits). Under a vocab-parallel loss
    each TP rank reads and writes only its share of the logits (``loss_shards``), as it holds
    only that share (``loss_memory``)."""
    shards = loss_shards(inp.training, config)
    nbytes = inp.loss_bytes * sample_share(config) / inp.traced_mbs / shards
    p = inp.cluster.profile
    ops = LOSS_OPS * (p.op_overhead + p.backward_op_overhead)
    return 2 * nbytes / (p.memory_bandwidth * p.elementwise_efficiency) + ops
