"""The cost model: per-block option costs and the step time and memory of a configuration.

This is the function the solver optimizes and the one a user calls to score a configuration by
hand. Everything is derived from the traced blocks (FLOPs, bytes, measured saved activations)
and the cluster's profile; the published formulas are test oracles, never inputs.

Units: seconds and bytes, per device. A block's traced numbers are for ``traced_mbs`` samples;
FLOPs, bytes and activations scale linearly with the micro-batch size.

What overlaps with what (stated once, used everywhere):
- tensor-parallel collectives sit on the critical path of every micro-batch (not overlapped);
- pipeline point-to-point sends are counted per micro-batch on the sending stage (hidden behind
  the stage's compute only where the framework overlaps them: ``Training.p2p_overlap``);
- the data-parallel gradient reduction overlaps with the backward of the last micro-batch; only
  the part longer than that backward is exposed. ZeRO-3's parameter all-gathers overlap with the
  micro-batch's forward and backward compute (prefetch); the excess is exposed;
- the optimizer step and offload transfers are not overlapped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from planner.cost.sharding import node_share
from planner.hardware.cluster import Cluster
from planner.hardware.collectives import collective_time, p2p_time
from planner.schema.mesh import Mesh
from planner.trace.blocks import Block, cached_core_nodes, product_share
from planner.trace.graph import param_bytes_of
from planner.vocab import HALF_DTYPES, OFFLOAD, RECOMPUTE, Offload, Recompute, base_style

# Bytes per parameter: (weights, gradients, optimizer states). Mixed precision keeps fp32
# master weights in the optimizer states (ZeRO paper's K = 12 for Adam); SGD keeps momentum.
STATE_BYTES = {
    ("adamw", True): (2, 2, 12),
    ("adamw", False): (4, 4, 8),
    ("sgd", True): (2, 2, 8),
    ("sgd", False): (4, 4, 4),
}
# Eager ops per parameter tensor in torch's single-tensor optimizer steps: AdamW's step count,
# decay, two moment updates, square root, bias-corrected denominator and update; SGD's momentum
# update and parameter update (plus the in-place decay both apply).
OPTIMIZER_OPS = {"adamw": 8, "sgd": 3}
FP32_BYTES = 4
LOSS_OPS = 4  # upcast, log-softmax, gather, mean
# fp32 tensor accesses per parameter of torch's per-op optimizer steps (the foreach and the
# tensor-by-tensor paths run the same in-place ops, each a pass over whole tensors): AdamW's
# decoupled decay (read and write the weight: 2), first moment lerp (3), second moment scale
# (2) and addcmul (3), square root into a temporary (2), bias correction (2), epsilon (2) and
# the addcdiv update (4); SGD's momentum scale (2) and add (3) and the update (3). Measured on
# one H200 (benchmarks/gpu_accuracy.py probe, 2026-11-26): the foreach AdamW step of a 1.5B
# Llama took 34.3 ms, 80 bytes per parameter at 3.5 TB/s, and torch's fused step 15.0 ms;
# the same model's AdamW on its 16-core host (FSDP2's CPU offload) 1.79 s, 80 bytes per
# parameter at 67 GB/s.
UNFUSED_STEP_ACCESSES = {"adamw": 20, "sgd": 8}


@dataclass(frozen=True)
class Training:
    global_batch_size: int
    dtype: str = "bf16"
    optimizer: str = "adamw"
    # Mixture-of-experts: the expert capacity factor (rows padded per expert, as in Switch
    # Transformer; 1.0 = dropless with exactly the routed rows) and the load imbalance under
    # expert parallelism (the busiest rank's routed rows over the mean; 1.0 = balanced).
    moe_capacity_factor: float = 1.0
    moe_imbalance: float = 1.0
    # FP8 linears (Transformer Engine, torchao Float8Linear): products with a weight run at the
    # profile's FP8 rate; attention, norms and the optimizer stay in ``dtype``.
    fp8_linears: bool = False
    # TP collectives overlapped with the GEMMs next to them (``tp_exposed``); off by default:
    # the runtime's DTensor TP runs them between the products.
    tp_overlap: bool = False
    # The overlap is torch's async TP (torch.compile's micro-pipelined all-gather/reduce-scatter
    # matmuls over symmetric memory, torchtitan's enable_async_tensor_parallel), which hides at
    # most the profile's ``async_tp_overlap`` share of the collectives; off: the decomposed
    # overlap of Megatron-Core/Transformer Engine (--tp-comm-overlap), bounded by compute only.
    tp_overlap_async: bool = False
    # The loss over logits left sharded over the TP ranks' vocabulary (Megatron's
    # vocab-parallel cross-entropy, torchtitan's loss_parallel): each rank holds 1/tp of the
    # logits (``loss_shards``). Off by default: meshplan's runtime gathers the head's output
    # (``colwise_gather``) and every TP rank computes the loss over all of it.
    vocab_parallel_loss: bool = False
    # DeepSpeed's BF16_Optimizer (BLOOM's bf16 runs): besides the 16-bit gradients backward
    # writes, every gradient is accumulated into an fp32 buffer of the rank's whole (not
    # ZeRO-sharded) parameters (``state_memory``). Off for torch's optimizers (the runtime's).
    fp32_grad_accumulation: bool = False
    # DeepSpeed's fp16 optimizers (BLOOM's fp16 runs): the step casts the rank's gradient
    # partition to fp32 before Adam reads it (ZeRO 1/2, deepspeed/runtime/zero/
    # stage_1_and_2.py ``step``: ``single_grad_partition = ... .to(fp32)``; ZeRO-0's
    # FP16_Optimizer the same for all its gradients): 4 bytes per parameter of the shard the
    # optimizer steps (``state_memory``). Off for torch's optimizers (the runtime's).
    fp32_grad_partition: bool = False
    # A gradient-reduction buffer the data-parallel wrapper allocates beside the model's own
    # memory (``fixed_memory``), in bytes: DeepSpeed's ZeRO-1/2 contiguous bucket of
    # reduce_bucket_size 16-bit elements (5e8 by default; stage_1_and_2.py reduce_gradients
    # allocates it under the pipeline engine, its backward prologue without one), and its
    # stage-0 buffered all-reduce, which flattens up to 5e8 gradient elements at a time
    # (engine.py buffered_allreduce_fallback, MEMORY_OPT_ALLREDUCE_SIZE). Allocated after the
    # last backward, when the activations' blocks sit cached, it gets a segment of its own (the
    # caching allocator's best fit serves the next step's activations from their own blocks),
    # so the reserved peak holds it on top of the activation peak, as it holds the fp16 step's
    # fp32 partition. 0: meshplan's runtime (torch's DDP and FSDP2 reduce from their own
    # gradient buffers, priced by ``dp_copy_bytes``).
    reduce_bucket_bytes: float = 0.0
    # What selective recompute keeps (``selective_kept``): "core" drops the attention core
    # between two activation products (Korthikanti et al.'s selective recompute, the planner's
    # option); "torchtitan-op" keeps the block's input and the outputs of its attention kernels
    # and of every other weight product (torchtitan's op-level SAC), recomputing the rest.
    selective_policy: str = "core"
    # Attention runs the chip's own fused kernel (Transformer Engine's cuDNN attention on
    # Hopper, as NVIDIA's Megatron recipes do) at the profile's native_attention_efficiency;
    # off: the FlashAttention-2-class kernel torch's SDPA runs (attention_efficiency).
    native_attention: bool = False
    # Attention runs a flash-attention build older than the chip (llm-foundry's 2023 MPT runs on
    # H100, before FlashAttention had Hopper kernels) at the profile's
    # legacy_attention_efficiency where it gives one.
    legacy_attention: bool = False
    # Element-wise chains between products run as one fused kernel each (Transformer Engine /
    # Megatron-Core fusions, torch.compile): ``fusion_shares``. Off: eager torch, one kernel
    # per op (meshplan's runtime).
    fused_elementwise: bool = False
    # Pipeline sends of a sequence-parallel model carry each TP rank's sequence shard, 1/tp of
    # the activation (Megatron-Core's get_tensor_shapes: seq_length // tp under
    # sequence_parallel); off: the whole activation (what the planner assumes of its runtime).
    pipeline_sends_shards: bool = False
    # Pipeline sends and receives overlap the neighbouring chunks' compute (Megatron's
    # overlap_p2p_comm, on by default for its interleaved schedule: megatron/training/
    # arguments.py, --no-overlap-p2p-communication); off: they sit between the chunks.
    p2p_overlap: bool = False
    # The data-parallel gradient reduction overlaps the backward (torch DDP's and FSDP's
    # bucketed hooks, Megatron's --overlap-grad-reduce); off: it runs after the last backward,
    # as DeepSpeed runs it (ZeRO's ``overlap_comm`` defaults to false, and its PipelineEngine's
    # TrainSchedule issues ReduceGrads only after the pipeline's last backward).
    dp_overlap: bool = True
    # The device's optimizer step runs as one fused kernel per group of tensors (torch's
    # ``fused=True``, which meshplan's runtime uses for parameters on a GPU; Megatron's and
    # DeepSpeed's fused Adam): each weight, gradient and state read once and written once, and
    # no temporary. Off: torch's per-op step (foreach or tensor by tensor: the runtime on CPU
    # ranks), one pass over whole tensors per op (``UNFUSED_STEP_ACCESSES``). A step on the host
    # (offload) is always per-op: the runtime leaves CPU tensors to torch's default.
    fused_optimizer: bool = True
    # Each weight-gradient GEMM accumulates into the rank's whole gradient buffer as it writes
    # (Megatron's gradient_accumulation_fusion: on in Megatron-LM unless
    # --no-gradient-accumulation-fusion, megatron/training/arguments.py, and in NVIDIA's NeMo
    # and Megatron-Bridge recipes), so accumulating a micro-batch's gradient of a product's
    # weight costs no pass of its own; lookups' and norms' gradients are still added. Off:
    # torch's AccumulateGrad adds every gradient after the first (``optimizer_time``).
    fused_grad_accumulation: bool = False
    # Gradient buffers allocated once and kept (Megatron's and DeepSpeed's contiguous grad
    # buffers, stepped by fused in-place optimizers): gradients occupy memory all step long, at
    # ``STATE_BYTES``' gradient width. Off: torch's eager loop, meshplan's runtime: backward
    # allocates each .grad in its fp32 parameter's dtype (FSDP2's sharded parameter, DDP's
    # module; MixedPrecisionPolicy reduces in fp32), ``zero_grad(set_to_none=True)`` frees them,
    # and torch's foreach AdamW allocates a temporary per parameter during the step
    # (``rank_memory``'s two phases; measured on an H200, benchmarks/gpu_accuracy.py).
    persistent_grad_buffers: bool = False
    # A pipeline stage's receive buffers, one per micro-batch each way (torch.distributed.
    # pipelining, meshplan's runtime: every stage allocates, for each of the step's m
    # micro-batches, a buffer for the activation it receives and one for the gradient of its
    # output, and keeps them across steps; each output stays in the stage's cache until its
    # backward). Off: one send and one receive buffer (Megatron-Core frees each output once it
    # is sent, deallocate_output_tensor; DeepSpeed's pipeline engine keeps only its TP
    # partition). See ``pipeline_buffer_bytes``.
    microbatch_recv_buffers: bool = True
    # How the data-parallel wrapper moves weights and gradients through device memory beyond
    # the model's own kernels (``dp_copy_bytes``): "torch", meshplan's runtime (FSDP2's
    # fully_shard and replicate units, DDP); "none", frameworks whose 16-bit weights are the
    # compute copies and whose gradients land in their reduce buffers (Megatron's and
    # DeepSpeed's contiguous buffers).
    dp_copies: str = "torch"
    # The runtime casts the fp32 parameters to the 16-bit compute dtype on the device before
    # each use (FSDP2's MixedPrecisionPolicy, autocast under DDP): GPU ranks; the CPU runtime
    # computes in fp32 and casts nothing.
    device_casts: bool = True

    @property
    def mixed(self) -> bool:
        return self.dtype in HALF_DTYPES

    @property
    def state_bytes(self) -> tuple[int, int, int]:
        """(weights, gradients, optimizer states) bytes per parameter: torch's gradients are
        the fp32 parameters' (4), a persistent buffer's those of ``STATE_BYTES``."""
        wb, gb, ob = STATE_BYTES[(self.optimizer, self.mixed)]
        return wb, gb if self.persistent_grad_buffers else FP32_BYTES, ob

    @property
    def fused_step(self) -> bool:
        """Whether the device's optimizer step is one fused kernel (persistent gradient buffers
        are stepped by the frameworks' fused optimizers)."""
        return self.fused_optimizer or self.persistent_grad_buffers

    @property
    def step_temp_bytes(self) -> int:
        """Device bytes per stepped parameter that the optimizer step allocates and frees:
        torch's per-op AdamW one fp32 temporary per parameter (its denominator; an H200 held
        4.0 bytes per parameter more during a Llama-1B's and a Llama-3B's foreach step than
        after it, 2026-11-26); torch's SGD updates in place; fused steps none."""
        if self.fused_step or self.optimizer != "adamw":
            return 0
        return FP32_BYTES


@dataclass(frozen=True)
class BlockOption:
    """One way to run one block on one device, for one micro-batch of a given size."""

    variant: str
    recompute: str
    offload: str
    fwd_s: float  # forward compute + forward TP collectives
    bwd_s: float  # backward compute (+ recompute) + backward TP collectives
    tp_comm_s: float  # the TP collectives inside fwd_s + bwd_s (for the breakdown)
    params: float  # parameters held per device after TP sharding (before ZeRO)
    act_bytes: float  # saved activations per in-flight micro-batch
    recompute_peak_bytes: float  # transient during backward: one block's recomputed activations
    transient_bytes: float  # working memory of the block's largest op
    tp_plan: tuple[tuple[str, str], ...] = ()
    tp_grad_sums: tuple[str, ...] = ()  # see sharding.TPVariant.grad_sums
    param_tensors: int = 0  # parameter tensors the block owns (the optimizer steps each)
    product_params: float = 0.0  # of ``params``: products' weights (``product_share``)
    # Expert parallelism: ``expert_params`` is the share of ``params`` that is this device's
    # experts (1/ep of them); ``ep_comm_s`` the token all-to-alls inside fwd_s + bwd_s.
    ep: int = 1
    expert_params: float = 0.0
    ep_comm_s: float = 0.0
    # Channels of each BatchNorm the block normalises with batch statistics: synchronized
    # over the data-parallel replicas, they cost collectives per micro-batch
    # (``batchnorm_sync_time``).
    norm_channels: tuple[int, ...] = ()

    @property
    def time_s(self) -> float:
        return self.fwd_s + self.bwd_s

    @property
    def zero_params(self) -> float:
        """What ZeRO divides by dp: experts shard over the dp/ep replicas of each expert, so
        ZeRO's share of them is (expert_params * ep) / dp, the same as without EP."""
        return self.params + self.expert_params * (self.ep - 1)

    @property
    def dense_params(self) -> float:
        """Parameters held per device that are not expert-parallel experts."""
        return self.params - self.expert_params

    def comm_params(self, dp: int) -> float:
        """Parameters whose gradients (or ZeRO-3 weights) a dp-wide ring moves, as the
        equivalent count: experts reduce over their dp/ep replicas only, a ring of
        (n - 1)/n per byte with n = dp/ep instead of dp (none when ep = dp)."""
        if self.ep <= 1 or self.expert_params == 0 or dp <= 1:
            return self.params
        n = dp // self.ep
        ratio = ((n - 1) / n) / ((dp - 1) / dp)
        return self.params - self.expert_params + self.expert_params * ratio


@dataclass
class Config:
    """One point of the search space; ``choice[i]`` indexes block i's option list."""

    mesh: Mesh
    micro_batch_size: int
    schedule: str
    virtual_stages: int
    zero_stage: int
    stage_of: list[int]  # block index -> virtual stage (0 .. pp*v - 1), non-decreasing
    choice: list[int]

    @property
    def num_stages(self) -> int:
        return self.mesh.pp * self.virtual_stages


@dataclass
class StageCost:
    index: int
    pp_rank: int
    blocks: list[int]
    compute_s: float  # fwd + bwd (+ recompute) compute per micro-batch
    tp_comm_s: float  # per micro-batch
    p2p_s: float  # per micro-batch
    time_s: float  # total per micro-batch
    fwd_s: float  # forward share of time_s (compute, TP collectives, activation send)
    bwd_s: float  # backward share of time_s (incl. recompute and gradient send); the two add
    # up to time_s, the stage's loss and wrapper copies split between them (_forward_backward)
    dp_comm_s: float  # per step, total
    dp_exposed_s: float
    optimizer_s: float
    offload_s: float
    inflight: int  # micro-batches (interleaved: chunk-micro-batches) the rank holds at its peak
    held: float = 0.0  # micro-batches' worth of this stage's activations held (chunk_held)
    sync_s: float = 0.0  # per micro-batch, of compute_s: BatchNorm statistics and DP copies
    memory: dict[str, float] = field(default_factory=dict)


@dataclass
class StepCost:
    step_time_s: float
    pipeline_s: float
    bubble_s: float
    dp_exposed_s: float
    optimizer_s: float
    offload_s: float
    stages: list[StageCost]
    rank_memory: list[dict[str, float]]  # per pp rank (sum over its virtual stages)
    peak_memory_bytes: float
    capacity_bytes: float
    model_flops_per_step: float
    mfu: float
    samples_per_s: float
    feasible: bool
    host_bytes_per_gpu: float = 0.0
    sync_s: float = 0.0  # of pipeline_s: the busiest rank's StageCost.sync_s over the step


# --------------------------------------------------------------------------- per block


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


def block_options(
    graph,
    block: Block,
    variants: list,
    micro_batch_size: int,
    cluster: Cluster,
    tp_ranks: list[int],
    training: Training,
    offload_allowed: bool = True,
    ep_ranks: list[int] | None = None,
    cp_ranks: list[int] | None = None,
) -> list[BlockOption]:
    """Every (TP variant x recompute x offload) option of a block, priced. ``ep_ranks``: the
    expert-parallel group a mixture-of-experts block's experts are spread over; ``cp_ranks``:
    the context-parallel group each sample's sequence is split over (every token-local op and
    every query's attention run on 1/cp of the tokens, plus the ring of key/value chunks).

    Long because every option of a block shares the same per-op sums; computing them once here keeps
    each option a few lines.
    """
    traced_mbs = graph.graph["micro_batch_size"]
    cp = len(cp_ranks) if cp_ranks else 1
    scale = micro_batch_size / traced_mbs / cp
    kernels = {
        "fp8": training.fp8_linears,
        "native": training.native_attention,
        "legacy": training.legacy_attention,
        "fused": training.fused_elementwise,
    }
    times = block_node_times(graph, block, scale, cluster, training.dtype, None, **kernels)
    # compute-bound time outside the per-op sums (ring attention, the busiest expert rank's
    # excess), shrinking with the block's compute fraction
    ring_f, ring_b = ring_attention_times(graph, block, scale, cluster, training, cp_ranks)
    more_f, more_b = ring_f, ring_b
    counts = op_counts(graph, block)
    ep = len(ep_ranks) if ep_ranks else 1
    moe = block.extra.get("moe")
    expert_total = float(moe["expert_params"]) if moe else 0.0
    a2a_f = a2a_b = 0.0
    if moe:
        # The busiest expert rank computes ``factor`` times the mean routed rows.
        factor = training.moe_capacity_factor * (training.moe_imbalance if ep > 1 else 1.0)
        experts = expert_nodes(graph, block)
        e_fwd, e_bwd, _ = node_times(
            graph, block, scale, cluster, training.dtype, experts, **kernels
        )
        more_f += e_fwd * (factor - 1)
        more_b += e_bwd * (factor - 1)
        # dispatch + combine in forward, their gradients in backward
        buffer = dispatch_bytes(moe, scale, training) if ep > 1 else 0.0
        one = collective_time("all_to_all", buffer, cluster, ep_ranks or [0])
        a2a_f = a2a_b = 2 * one
    policy = selective_kept(graph, block, training)
    norms = batch_norm_channels(graph, block)
    products = product_share(graph, block)
    core = [n for n in block.nodes if n in cached_core_nodes(graph)]
    compute_only = NodeTimes(ops={n: (fc, 0.0, bc, 0.0) for n, (fc, _, bc, _) in times.ops.items()})
    options: list[BlockOption] = []
    for v in variants:
        cf = v.compute_fraction
        ovh_f, ovh_b, ovh_sel = overhead_times(counts, v.tp_plan, len(tp_ranks), cluster)
        shares = tp_shares(v, times, graph)
        if shares is None:  # the block's average fractions
            mbf = v.memory_bound_fraction
            ops_f = times.fwd_compute * cf + times.fwd_memory * mbf
            ops_b = times.bwd_compute * cf + times.bwd_memory * mbf
            gemm_f, gemm_b = times.fwd_compute * cf, times.bwd_compute * cf
            core_f = times.core_fwd * cf
        else:
            ops_f, ops_b = times.sharded(shares)
            gemm_f, gemm_b = compute_only.sharded(shares)
            core_f = times.sharded(shares, core)[0]
        fwd = ops_f + more_f * cf + ovh_f + a2a_f
        bwd = ops_b + more_b * cf + ovh_b + a2a_b
        comm_f = sum(collective_time(k, b * scale, cluster, tp_ranks) for k, b in v.comm_fwd)
        comm_b = sum(collective_time(k, b * scale, cluster, tp_ranks) for k, b in v.comm_bwd)
        if training.tp_overlap:
            comm_f, comm_b = tp_exposed(
                comm_f, comm_b, gemm_f + more_f * cf, gemm_b + more_b * cf, cluster,
                cluster.profile.async_tp_overlap if training.tp_overlap_async else 1.0,
            )  # fmt: skip
        # Experts are not split by TP (a grouped product has no sharding rule), but by EP.
        params = block.params * v.param_fraction - expert_total * (1 - 1 / ep)
        sel_bytes, sel_fwd = v.saved_selective_bytes, core_f
        if policy is not None:
            # The traced block's kept share, applied to the variant's saved bytes (exact
            # without TP; with TP it assumes the kept tensors shard as the saved ones do).
            kept_bytes, recomputed = policy
            share = kept_bytes / block.saved_bytes if block.saved_bytes else 0.0
            re_f = (
                sum(times.ops[n][0] + times.ops[n][1] for n in recomputed if n in times.ops) * cf
                if shares is None
                else times.sharded(shares, recomputed)[0]
            )
            sel_bytes, sel_fwd = v.saved_bytes * min(share, 1.0), re_f
        for rc in RECOMPUTE:
            if rc == "selective" and sel_bytes >= v.saved_bytes:
                continue  # nothing to drop: identical to "none"
            if rc == "full" and v.input_bytes >= v.saved_bytes:
                continue
            extra = {"none": 0.0, "selective": sel_fwd + ovh_sel, "full": fwd + comm_f}[rc]
            ep_comm = a2a_f + a2a_b + (a2a_f if rc == "full" else 0.0)
            act = {"none": v.saved_bytes, "selective": sel_bytes, "full": v.input_bytes}[rc]
            recompute_peak = {
                "none": 0.0,
                "selective": v.saved_bytes - sel_bytes,
                "full": v.saved_bytes,
            }[rc]
            for off in OFFLOAD if (offload_allowed and block.params > 0) else ("none",):
                options.append(
                    BlockOption(
                        variant=v.name,
                        recompute=rc,
                        offload=off,
                        fwd_s=fwd + comm_f,
                        bwd_s=bwd + extra + comm_b,
                        tp_comm_s=comm_f + comm_b + (comm_f if rc == "full" else 0.0),
                        params=params,
                        param_tensors=len(block.param_names),
                        product_params=params * products,
                        act_bytes=act * scale,
                        recompute_peak_bytes=recompute_peak * scale,
                        transient_bytes=block.transient_bytes * scale * cf,
                        tp_plan=tuple(sorted(v.tp_plan.items())),
                        tp_grad_sums=v.grad_sums,
                        ep=ep,
                        expert_params=expert_total / ep,
                        ep_comm_s=ep_comm,
                        norm_channels=norms,
                    )
                )
    return options


def _batch_statistics_input(d: dict) -> list[int] | None:
    """The input shape of a BatchNorm op that normalises with the batch's statistics (training
    mode; eval-mode and frozen ones use running statistics), else None."""
    from planner.trace.opcost import BATCH_NORM_OPS

    args = d.get("args") or []
    if d["op"] in BATCH_NORM_OPS and len(args) > 5 and args[5] is True and d.get("shapes"):
        return list(d["shapes"][0])
    return None


def batch_norm_channels(graph, block: Block) -> tuple[int, ...]:
    """Channels (dimension 1 of the input) of each BatchNorm of ``block`` that normalises with
    the batch's statistics (eval-mode and frozen ones synchronize nothing)."""
    shapes = [_batch_statistics_input(graph.nodes[n]) for n in block.nodes]
    return tuple(int(s[1]) if len(s) > 1 else 1 for s in shapes if s is not None)


def batch_statistics_shapes(graph) -> list[list[int]]:
    """Input shapes of the model's BatchNorms that normalise with the batch's statistics."""
    shapes = (_batch_statistics_input(d) for _, d in graph.nodes(data=True))
    return [s for s in shapes if s is not None]


def batch_statistics_floor(graph) -> int:
    """Samples the statistics of every training-mode BatchNorm must span together: 2 where one
    normalises a single value per channel per sample (a [batch, features] input, or one left
    1 x 1 by pooling), since one value has no variance and torch refuses it; else 1. A
    synchronized BatchNorm spans the data-parallel replicas' micro-batches together."""
    shapes = batch_statistics_shapes(graph)
    return 2 if any(math.prod(shape[2:]) == 1 for shape in shapes) else 1


def batchnorm_sync_time(inp: CostInputs, o: BlockOption, config: Config, pp_rank: int = 0):
    """Per micro-batch, the collectives that synchronize a block's batch statistics over the
    data-parallel replicas (plan field ``batchnorm`` = synchronized, runtime.batchnorm). Small
    and latency-bound, and nothing hides them: the forward waits for the statistics.

    On GPUs torch's ``nn.SyncBatchNorm``: an all-gather of each rank's mean, inverse standard
    deviation and count (2C + 1 fp32 numbers) in forward, an all-reduce of two sums (2C) in
    backward. On CPU ranks the runtime's ``GroupBatchNorm``: all-reduces of the sums and count
    (C + 1) and of the squared deviations (C) in forward, and their gradients' all-reduces in
    backward. A fully recomputed block runs its forward, and these, twice."""
    mesh = config.mesh
    if mesh.replicas == 1 or not o.norm_channels:
        return 0.0
    ranks = mesh.dp_group(pp_rank)
    cl, n = inp.cluster, len(ranks)
    forwards = 2 if o.recompute == Recompute.FULL else 1
    t = 0.0
    for c in o.norm_channels:
        if cl.profile.device == "gpu":
            fwd = collective_time("all_gather", n * (2 * c + 1) * FP32_BYTES, cl, ranks)
            bwd = collective_time("all_reduce", 2 * c * FP32_BYTES, cl, ranks)
        else:
            fwd = collective_time("all_reduce", (c + 1) * FP32_BYTES, cl, ranks)
            fwd += collective_time("all_reduce", c * FP32_BYTES, cl, ranks)
            bwd = fwd
        t += forwards * fwd + bwd
    return t


def dp_copy_bytes(o: BlockOption, config: Config, training: Training) -> float:
    """Device-memory bytes per micro-batch that the runtime's data-parallel wrapper reads and
    writes for block option ``o``, outside the model's kernels and the collectives
    (runtime/parallelize.py's mapping; ``Training.dp_copies``). Per parameter, w bytes each in
    the gathered dtype (2 when cast to 16 bits, else 4), f = 1 / replicas:

    - FSDP2 units (ZeRO 2/3; ZeRO-0's replicate under TP, PP or GPU mixed precision), per
      all-gather (two per micro-batch under ZeRO-3, which reshards after forward, else one):
      the cast of the fp32 shard (4 + w) f, the copy into the all-gather's input 2w f, the
      copy out to the parameters 2w, and at one replica the collective's own copy 2w. Per
      step, the gradients' reduce: the unsharded gradients into the fp32 reduce buffer
      (w + 4), the reduced shard into the sharded gradient 8 f, and at one replica the
      collective's copy, 8 (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:
      foreach_all_gather, foreach_all_gather_copy_out, foreach_reduce).
    - DDP (ZeRO-1; ZeRO-0 otherwise with replicas): under autocast the forward's cast of each
      weight (4 + 2) and the backward's cast of its gradient back (2 + 4); per step with
      replicas, the gradients copied into the buckets and back, 16.

    The per-step parts are spread over the step's micro-batches; where FSDP reduces every
    micro-batch (ZeRO 2/3 outside a deferring pipeline) each pays them, and where gradients
    accumulate unreduced (replicate, a deferring pipeline) the accumulation's casts and adds
    are paid too (FSDPParam.to_accumulated_grad_if_needed, accumulate_unsharded_grad_if_needed).
    Measured on one H200
    (benchmarks/gpu_accuracy.py probe, FSDP's own ranges, 2026-11-26): a Llama-3.2-1B under
    replicate, 17.9 ms a step for the 15.6 ms these bytes take at the profile's element-wise
    rate; under ZeRO-3 (two all-gathers) 34 ms for 22.6 ms."""
    if training.dp_copies == "none" or o.params <= 0:
        return 0.0
    mesh, zero = config.mesh, config.zero_stage
    casts = training.device_casts and training.mixed
    dp = mesh.replicas
    m = num_microbatches(training, mesh.dp, config.micro_batch_size)
    if dp == 1 and zero <= 1 and not casts:
        return 0.0  # one replica, nothing cast: the runtime wraps nothing
    fsdp = zero >= 2 or (zero == 0 and (mesh.tp > 1 or mesh.pp > 1 or casts))
    if fsdp:
        w = 2 if casts else FP32_BYTES
        f = 1.0 / dp
        alone = dp == 1
        gather = ((FP32_BYTES + w) if casts else 0.0) * f + 2 * w * f + 2 * w + 2 * w * alone
        reduce = w + FP32_BYTES + 2 * FP32_BYTES * f + 2 * FP32_BYTES * alone
        deferred = deferred_reduce(config, training)
        # ZeRO-3 gathers for forward and again for backward; ZeRO-2 once a micro-batch, or
        # once a step in a deferring pipeline, whose stage never reshards between
        # micro-batches (as dp_block_terms counts its all-gathers)
        gathers = 2 if zero == 3 else (1 / m if deferred else 1)
        if m > 1 and (zero == 0 or deferred):
            # gradients accumulate unreduced until the last micro-batch's backward (replicate
            # with its sync off, a deferring pipeline): FSDP2 casts the first 16-bit gradient
            # to an fp32 accumulator (w + 4) and adds each later one into it (4 + w + 4);
            # the reduce then reads the accumulator (4) where it read the gradient (w). On an
            # H100's Llama-1B at four micro-batches, FSDP::post_backward_accumulate: 36.5 ms.
            first = w + FP32_BYTES if w != FP32_BYTES else 0.0
            acc = first + (m - 1) * (w + 2 * FP32_BYTES) + (FP32_BYTES - w)
            per_param = gathers * gather + (reduce + acc) / m
        elif m > 1 and zero >= 2:
            # FSDP reduce-scatters every micro-batch's gradients (runtime.parallelize.
            # gradient_sync leaves its sync on), so each pays the reduce's copies
            per_param = gathers * gather + reduce
        else:
            per_param = gathers * gather + reduce / m
    else:
        cast = (FP32_BYTES + 2) * 2 if casts else 0.0
        per_param = cast + (4 * FP32_BYTES if dp > 1 else 0.0) / m
    return per_param * o.params


def dp_copy_time(inp: CostInputs, o: BlockOption, config: Config) -> float:
    """``dp_copy_bytes`` at the profile's element-wise share of memory bandwidth."""
    p = inp.cluster.profile
    return dp_copy_bytes(o, config, inp.training) / (p.memory_bandwidth * p.elementwise_efficiency)


def block_extra_time(inp: CostInputs, o: BlockOption, config: Config, pp_rank: int = 0) -> float:
    """Per micro-batch, what a block costs beside its own ops (``BlockOption.time_s``): the
    batch-statistics synchronization and the data-parallel wrapper's copies. One definition
    for the cost model's stages and the stage MILP's time column."""
    return batchnorm_sync_time(inp, o, config, pp_rank) + dp_copy_time(inp, o, config)


def selective_kept(graph, block: Block, training: Training) -> tuple[float, list[str]] | None:
    """(bytes kept for backward per traced micro-batch, ops recomputed) under
    ``Training.selective_policy``, or None for the planner's own "core" policy (the traced
    ``saved_selective_bytes`` and the core's forward).

    "torchtitan-op" is torchtitan's per-op selective activation checkpointing
    (torchtitan/models/llama3/parallelize_llama.py, ``_apply_ac_to_transformer_block`` at
    commit b5bcd76, the version of its published benchmarks): a torch selective-checkpoint
    policy that must-saves the outputs of the ops in its save list (``aten.mm``, the flash and
    memory-efficient attention kernels, reduce-scatter, ``aten.max``) except every second
    ``aten.mm`` of the block, and recomputes everything else; the checkpoint keeps the block's
    input to re-run it. A flash attention kernel's outputs are its result and its fp32
    log-sum-exp per head and query. FP8 linears call ``aten._scaled_mm``, which the list does
    not name, so with them no product is saved."""
    from planner.trace.opcost import ATTENTION_OPS, MATMUL_OPS

    if training.selective_policy == "core":
        return None
    if training.selective_policy != "torchtitan-op":
        raise ValueError(f"unknown selective recompute policy {training.selective_policy!r}")
    kept = float(block.input_bytes)
    recomputed: list[str] = []
    products = 0
    for n in block.nodes:
        d = graph.nodes[n]
        if d["op"] in ATTENTION_OPS:
            shape = d["shapes"][0] or []
            lse = math.prod(shape[:-1]) * FP32_BYTES if len(shape) >= 2 else 0
            kept += d["out_bytes"] + lse
            continue
        if d["op"] in MATMUL_OPS and d.get("params") and not training.fp8_linears:
            products += 1
            if products % 2 == 1:
                kept += d["out_bytes"]
                continue
        recomputed.append(n)
    return kept, recomputed


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


def expert_nodes(graph, block: Block) -> list[str]:
    """The block's ops that run inside its expert modules (their compute scales with the
    routed rows each expert rank receives)."""
    from planner.trace.blocks import in_modules

    mods = block.extra.get("moe", {}).get("modules", [])
    return [n for n in block.nodes if in_modules(graph.nodes[n]["module"], mods)]


def dispatch_bytes(moe: dict, scale: float, training: Training) -> float:
    """One rank's buffer of one expert-parallel all-to-all (a dispatch or a combine, in one
    pass): its routed rows (tokens x top-k, times the capacity factor and, under expert
    parallelism, the imbalance) x width x activation bytes. The ring formula sends
    (ep - 1)/ep of it to other ranks: Switch Transformer Sec. 5.4's E * C * d per direction,
    C the per-expert capacity."""
    act = 2 if training.mixed else 4
    rows = moe["routed_rows"] * scale * training.moe_capacity_factor * training.moe_imbalance
    return rows * moe["width"] * act


# --------------------------------------------------------------------------- memory


def option_states(
    o: BlockOption, zero: int, dp: int, training: Training, deferred: bool = False
) -> dict[str, float]:
    """``state_memory`` of one block option. Expert parameters shard over their dp / ep
    replicas under ZeRO 2/3 (FSDP units of their own over those ranks); under ZeRO-1 they keep
    whole optimizer states beside the dense parameters' sharded ones, as the runtime runs it
    (torch's ZeroRedundancyOptimizer cannot hold their DTensors). ``deferred`` (see
    ``deferred_reduce``): weights and gradients stay whole, as ZeRO-1's."""
    if zero == 1 and o.expert_params:
        dense = state_memory(o.dense_params, 1, dp, o.offload, training)
        experts = state_memory(o.expert_params, 0, 1, o.offload, training)
        return {k: dense[k] + experts[k] for k in dense}
    return state_memory(o.params, 1 if deferred else zero, dp, o.offload, training, o.zero_params)


def deferred_reduce(config: Config, training: Training) -> bool:
    """Whether a ZeRO-2/3 pipeline stage reduces its gradients once per step. torch's
    pipelining runs an FSDP stage's backward without gradient sync and without resharding
    until the last micro-batch (PipelineStage.backward_maybe_with_nosync), then reduce-scatters
    once: with several micro-batches the stage holds its weights unsharded and accumulates
    unsharded gradients all step long, and pays one reduce-scatter, not one per micro-batch."""
    m = num_microbatches(training, config.mesh.dp, config.micro_batch_size)
    return config.mesh.pp > 1 and config.zero_stage >= 2 and m > 1


def state_memory(
    params: float,
    zero: int,
    dp: int,
    offload: str,
    training: Training,
    sharded: float | None = None,
) -> dict[str, float]:
    """Weights, gradients and optimizer states per device (ZeRO paper, Sec. 5), after offload.

    ZeRO-1 shards optimizer states over DP, ZeRO-2 also gradients, ZeRO-3 also weights.
    Offload "optimizer" moves optimizer states to host memory (ZeRO-Offload); "optimizer+params"
    also keeps the weights and gradients there between uses (FSDP2 CPUOffloadPolicy).
    ``sharded``: what ZeRO divides by dp when it differs from ``params`` (expert parallelism)."""
    wb, gb, ob = training.state_bytes
    z = params if sharded is None else sharded
    w = z * wb / dp if zero >= 3 else params * wb
    g = z * gb / dp if zero >= 2 else params * gb
    if training.fp32_grad_accumulation:
        g += params * FP32_BYTES  # BF16_Optimizer's whole fp32 gradient buffer
    if training.fp32_grad_partition:
        g += (z / dp if zero >= 1 else params) * FP32_BYTES  # the fp16 step's fp32 cast
    o = z * ob / dp if zero >= 1 else params * ob
    temp = (z / dp if zero >= 1 else params) * training.step_temp_bytes
    host = 0.0
    if offload in (Offload.OPTIMIZER, Offload.PARAMS):
        host += o
        o = temp = 0.0  # the step runs on the host
    if offload == "optimizer+params":
        host += w + g
        w = g = 0.0
    return {"params": w, "grads": g, "optimizer": o, "host": host, "step_temp": temp}


def forward_state_bytes(sm: dict[str, float], grads_held: bool) -> float:
    """What ``state_memory``'s states occupy while activations peak (the end of the forward,
    the loss's backward): weights and optimizer states, and gradients only where they are
    held then (``grads_held``)."""
    return sm["params"] + sm["optimizer"] + (sm["grads"] if grads_held else 0.0)


def step_state_parts(sm: dict[str, float], training: Training) -> dict[str, float]:
    """What ``state_memory``'s states occupy during the optimizer step, by category: optimizer
    states, gradients, the step's temporaries (as "other"), and the weights unless they are
    16-bit compute copies (FSDP2 frees those after backward; fp32 weights are the parameters
    themselves)."""
    return {
        "params": 0.0 if training.mixed else sm["params"],
        "grads": sm["grads"],
        "optimizer": sm["optimizer"],
        "other": sm["step_temp"],
    }


def step_state_bytes(sm: dict[str, float], training: Training) -> float:
    """``step_state_parts`` in all."""
    return sum(step_state_parts(sm, training).values())


def grads_held(config: Config, training: Training) -> bool:
    """Whether gradients occupy memory while activations peak: always with persistent buffers;
    with torch's lazily allocated ones only when earlier micro-batches accumulated into them
    (the first micro-batch's loss backward, where a single micro-batch peaks, comes before any
    gradient exists)."""
    m = num_microbatches(training, config.mesh.dp, config.micro_batch_size)
    return training.persistent_grad_buffers or m > 1


def offload_allowed(offload: str, zero: int) -> bool:
    """Weights live on the host only when ZeRO-3 shards them (FSDP2's CPUOffloadPolicy):
    otherwise every rank would fetch the full weights for every micro-batch."""
    return offload != "optimizer+params" or zero >= 3


def num_microbatches(training: Training, dp: int, micro_batch_size: int) -> int:
    """Micro-batches per step on each data-parallel replica."""
    return training.global_batch_size // (dp * micro_batch_size)


def inflight_microbatches(schedule: str, m: int, pp: int, v: int, pp_rank: int) -> int:
    """Micro-batches whose activations a stage holds at its peak.

    GPipe: all m. 1F1B: min(m, pp - rank). Interleaved 1F1B with v chunks per rank (counted in
    chunk-micro-batches, each holding one chunk's activations): torch's warm-up of
    (v - 1) * pp + 2 * (pp - rank - 1) steps plus the one in flight, at most m * v."""
    if schedule == "gpipe" or pp == 1:
        return m if schedule == "gpipe" else min(m, pp - pp_rank)
    if schedule == "1f1b":
        return min(m, pp - pp_rank)
    return min(m * v, (v - 1) * pp + 2 * (pp - pp_rank - 1) + 1)


def chunk_held(schedule: str, m: int, pp: int, v: int, pp_rank: int) -> float:
    """Micro-batches' worth of one stage's activations its rank holds at its peak. One chunk
    per rank: ``inflight_microbatches``. Interleaved, that count is of chunk-micro-batches over
    all v chunks of the rank (torch's warm-up runs each chunk for its micro-batches in turn:
    with p = 2, v = 2, m = 4 rank 0 peaks holding chunk 0 for three micro-batches and chunk 1
    for two), so each chunk holds count / v of them, exact for equal chunks; counting the
    whole count on every chunk priced v times the activations, where Korthikanti et al.'s
    first stage holds L layers' worth times 1 + (p - 1) / (p v)."""
    count = inflight_microbatches(schedule, m, pp, v, pp_rank)
    return count / v if schedule == "interleaved_1f1b" and pp > 1 else float(count)


# --------------------------------------------------------------------------- the step


@dataclass
class CostInputs:
    """What every configuration of one (micro-batch, TP degree) is priced from."""

    blocks: list[Block]
    options: list[list[BlockOption]]  # per block
    traced_mbs: int
    cluster: Cluster
    training: Training
    memory_fraction: float = 1.0
    # sums every candidate sharing these options asks for (the search's bounds), kept here
    memo: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def boundary_bytes(self) -> float:
        """Activation bytes crossing a pipeline cut, per traced micro-batch (the largest cut:
        transformer cuts are all equal; elsewhere this is the conservative choice)."""
        return float(max((b.boundary_bytes for b in self.blocks[:-1]), default=0))

    @cached_property
    def tied(self) -> list[TiedCopy]:
        """Weights a block owns that a later block reads too (``tied_copies``)."""
        return tied_copies(self.blocks)

    @property
    def loss_bytes(self) -> float:
        """The loss's peak memory on the last stage, per traced sample-set, unsharded: three
        fp32 copies of the logits. Cross-entropy over the upcast logits saves log-softmax's
        output for backward; backward then holds that output, the dense gradient
        nll_loss's backward hands it, and the gradient log-softmax's backward writes, all at
        once (torch's tools/autograd/derivatives.yaml: ``_log_softmax`` backward is
        ``_log_softmax_backward_data(grad, result, ...)``, a new tensor)."""
        last = self.blocks[-1]
        dtype_bytes = 2 if self.training.mixed else 4
        return 3 * 4 * last.output_bytes / dtype_bytes


def sample_share(config: Config) -> float:
    """Samples' worth of activations one rank holds per micro-batch: a context-parallel rank
    holds 1/cp of each sample's sequence."""
    return config.micro_batch_size / config.mesh.cp


def stage_sync_time(inp: CostInputs, opts: list[BlockOption], config: Config, s: int) -> float:
    """Per micro-batch, the blocks' ``block_extra_time`` on virtual stage s: part of its
    compute in ``stage_time_parts``, kept apart as ``StageCost.sync_s``."""
    return sum(block_extra_time(inp, o, config, s % config.mesh.pp) for o in opts)


def hop_time(nbytes: float, t: int, t_next: int, bw: float, lat: float, shards: bool) -> float:
    """A pipeline boundary's activations forward and their gradient back, ``nbytes`` the whole
    activation per micro-batch, between stages of TP degrees ``t`` and ``t_next``. One
    degree: each TP rank sends to its peer (1/t of it when the runtime sends shards). Two
    degrees (a heterogeneous plan's ``Mesh.stage_tp``): every receiving rank takes a whole
    copy from one sending rank, so a sender with more receivers than senders sends several
    in turn (``Mesh.neighbours``)."""
    if t == t_next:
        per = nbytes / t if shards else nbytes
        return 2 * p2p_time(per, bw, lat)
    forward = p2p_time(nbytes * max(1, t_next // t), bw, lat)
    return forward + p2p_time(nbytes * max(1, t // t_next), bw, lat)


def stage_time_parts(
    inp: CostInputs,
    opts: list[BlockOption],
    config: Config,
    s: int,
    sync: float | None = None,
) -> tuple[float, float, float]:
    """(compute, TP communication, point-to-point) per micro-batch for virtual stage s.
    ``sync``: the stage's ``stage_sync_time`` where the caller has it already.

    Point-to-point: the activation to the next stage and its gradient back; overlapped with
    compute (``Training.p2p_overlap``), only the part longer than the profile's
    ``comm_overlap`` share of the stage's compute stays exposed."""
    mesh = config.mesh
    n_stages = config.num_stages
    compute = sum(o.time_s - o.tp_comm_s for o in opts)
    compute += stage_sync_time(inp, opts, config, s) if sync is None else sync
    tp_comm = sum(o.tp_comm_s for o in opts)
    p2p = 0.0
    if s == n_stages - 1:
        compute += loss_time(inp, config)
    if n_stages > 1:
        r, p = s % mesh.pp, mesh.pp
        nbytes = inp.boundary_bytes * sample_share(config) / inp.traced_mbs
        if s < n_stages - 1:  # activations to the next stage, gradients back from it
            bw, lat = inp.cluster.link([mesh.rank(r, 0, 0), mesh.rank((s + 1) % p, 0, 0)])
            shards = inp.training.pipeline_sends_shards
            p2p += hop_time(nbytes, mesh.tp, mesh.tp, bw, lat, shards)
        if inp.training.p2p_overlap:
            p2p = max(0.0, p2p - inp.cluster.profile.comm_overlap * compute)
    return compute, tp_comm, p2p


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


@dataclass(frozen=True)
class DPRates:
    """What a candidate's data-parallel collectives cost, as affine functions of the
    parameters they move: (seconds per parameter, seconds per call). Exact under the ring
    model, where a collective's time is affine in its bytes."""

    replicas: int
    zero: int
    m: int  # micro-batches per step
    deferred: bool  # see deferred_reduce
    # ZeRO-2's weights gathered again each micro-batch: FSDP2 reshards after every backward
    # (``Training.dp_copies`` "torch"; torch's profiler on 2 gloo ranks counts 3 FSDP::all_gather
    # per unit over 3 micro-batches with reshard_after_forward=False); DeepSpeed's and
    # Megatron's keep whole 16-bit weights
    regather: bool
    overlap: float  # the share of forward/backward time communication hides behind
    unit: float  # FSDP host overhead per unit and micro-batch
    all_reduce: tuple[float, float]
    reduce_scatter: tuple[float, float]
    all_gather: tuple[float, float]


def _affine(kind: str, cluster: Cluster, ranks: list[int], bytes_per_param: float):
    """A collective's time as (seconds per parameter, latency), read off two sizes."""
    x = 1e9
    t1 = collective_time(kind, x * bytes_per_param, cluster, ranks)
    t2 = collective_time(kind, 2 * x * bytes_per_param, cluster, ranks)
    slope = (t2 - t1) / x
    return slope, t1 - slope * x


def dp_rates(inp: CostInputs, config: Config, pp_rank: int = 0) -> DPRates:
    tr, mesh = inp.training, config.mesh
    wb, gb, _ = tr.state_bytes
    ranks = mesh.dp_group(pp_rank)
    return DPRates(
        replicas=mesh.replicas,
        zero=config.zero_stage,
        m=num_microbatches(tr, mesh.dp, config.micro_batch_size),
        deferred=deferred_reduce(config, tr),
        regather=tr.dp_copies == "torch",
        overlap=inp.cluster.profile.comm_overlap if tr.dp_overlap else 0.0,
        unit=inp.cluster.profile.fsdp_unit_overhead,
        all_reduce=_affine("all_reduce", inp.cluster, ranks, gb),
        reduce_scatter=_affine("reduce_scatter", inp.cluster, ranks, gb),
        all_gather=_affine("all_gather", inp.cluster, ranks, wb),
    )


def dp_block_terms(o: BlockOption, r: DPRates) -> tuple[float, float, float]:
    """One block's share of its stage's data-parallel communication, linear in its options.

    A stage's exposed communication is max(0, A) + max(0, B), its total T, where A, B and T
    sum these per-block terms (a, b, t) and once per stage that holds parameters the
    ``dp_stage_terms`` (the latency of a bucketed ZeRO-0/1 collective). What each ZeRO stage
    does, as the runtime runs it (overlap h = the profile's comm_overlap):

    - ZeRO-0 (DDP): one all-reduce of the gradients, hidden behind h of the last backward.
    - ZeRO-1: the same, then a broadcast of the updated dense shards nothing hides.
    - ZeRO-2 (FSDP, weights kept from forward to backward): a reduce-scatter per micro-batch
      behind its backward, and an all-gather behind the forward, once per step where the
      framework keeps whole weights between micro-batches, once per micro-batch under
      FSDP2, which reshards after each backward (``DPRates.regather``); in a deferring
      pipeline one reduce-scatter after the last backward.
    - ZeRO-3: all-gathers for forward and again for backward and a reduce-scatter, per
      micro-batch, behind both; in a deferring pipeline the reduce-scatter once per step.
    FSDP units (ZeRO 2/3) each pay their collective's latency and host overhead."""
    if r.replicas == 1:
        return 0.0, 0.0, 0.0
    p = o.comm_params(r.replicas)
    fwd, bwd = r.overlap * o.fwd_s, r.overlap * o.bwd_s
    ar, rs, ag = r.all_reduce, r.reduce_scatter, r.all_gather
    if r.zero == 0:
        return ar[0] * p - bwd, 0.0, ar[0] * p
    if r.zero == 1:
        return ar[0] * p - bwd, ag[0] * o.dense_params, ar[0] * p + ag[0] * o.dense_params
    owns = 1.0 if o.params > 0 else 0.0
    rs_t = (rs[0] * p + rs[1]) * owns
    ag_t = (ag[0] * p + ag[1]) * owns
    unit = r.unit * owns
    m = r.m
    if r.deferred and r.zero == 2:
        return rs_t + m * unit, ag_t - fwd, rs_t + m * unit + ag_t
    if r.deferred:
        return m * (2 * ag_t + unit - fwd - bwd), rs_t, m * (2 * ag_t + unit) + rs_t
    if r.zero == 2:
        g = m if r.regather else 1
        return m * (rs_t + unit - bwd), g * (ag_t - fwd), m * (rs_t + unit) + g * ag_t
    return m * (2 * ag_t + rs_t + unit - fwd - bwd), 0.0, m * (2 * ag_t + rs_t + unit)


def dp_stage_terms(r: DPRates) -> tuple[float, float, float]:
    """(a, b, t) paid once by a stage that holds parameters: the latency of ZeRO-0/1's
    bucketed collectives (ZeRO 2/3 pay one per unit, in ``dp_block_terms``)."""
    if r.replicas == 1 or r.zero >= 2:
        return 0.0, 0.0, 0.0
    ar, ag = r.all_reduce[1], r.all_gather[1]
    return (ar, 0.0, ar) if r.zero == 0 else (ar, ag, ar + ag)


def dp_comm(inp: CostInputs, opts: list[BlockOption], config: Config, pp_rank: int):
    """(total, exposed) data-parallel communication per step for one stage's blocks."""
    r = dp_rates(inp, config, pp_rank)
    if r.replicas == 1 or not any(o.comm_params(r.replicas) > 0 for o in opts):
        return 0.0, 0.0
    terms = [dp_block_terms(o, r) for o in opts]
    a0, b0, t0 = dp_stage_terms(r)
    a = sum(x for x, _, _ in terms) + a0
    b = sum(y for _, y, _ in terms) + b0
    return sum(t for _, _, t in terms) + t0, max(0.0, a) + max(0.0, b)


def optimizer_time(inp: CostInputs, opts: list[BlockOption], config: Config) -> float:
    """The optimizer step: memory-bound over the local shard, on the device or, offloaded, on
    the host (reads weights, gradients and states, writes weights and states); and the
    gradient accumulation of the step's micro-batches before it. torch adds each micro-batch's
    gradient after the first into ``.grad`` (AccumulateGrad's in-place add: reads both, writes
    one), m - 1 passes over the gradients a rank accumulates: sharded under ZeRO 2/3 (FSDP adds
    each reduce-scattered shard), whole under ZeRO 0/1 (DDP's no_sync) and in a pipeline that
    defers the reduce (``deferred_reduce``); on the host when offloaded with the weights.
    Under ``Training.fused_grad_accumulation`` the whole-gradient passes skip products' weights."""
    wb, gb, ob = inp.training.state_bytes
    p = inp.cluster.profile
    mesh = config.mesh
    dp = mesh.replicas if config.zero_stage >= 1 else 1
    local = [(_stepped_params(o, config.zero_stage, dp), o.offload) for o in opts]
    device = sum(n for n, off in local if off == "none")
    host = sum(n for n, off in local if off != "none")
    unfused = UNFUSED_STEP_ACCESSES[inp.training.optimizer] * FP32_BYTES
    per_param = 2 * wb + gb + 2 * ob if inp.training.fused_step else unfused
    m = num_microbatches(inp.training, mesh.dp, config.micro_batch_size)
    acc_device = acc_host = 0.0
    if m > 1:
        sharded = config.zero_stage >= 2 and not deferred_reduce(config, inp.training)
        for o in opts:
            n = o.zero_params / mesh.replicas if sharded and mesh.replicas > 1 else o.params
            if inp.training.fused_grad_accumulation and not sharded:
                n -= o.product_params  # the weight-gradient GEMMs accumulated them
            if o.offload == "optimizer+params":
                acc_host += n
            else:
                acc_device += n
    per_acc = (m - 1) * 3 * gb
    # The same achievable share of bandwidth applies to a memory-bound step on either side.
    memory = (device * per_param + acc_device * per_acc) / (
        p.memory_bandwidth * p.elementwise_efficiency
    ) + (host * unfused + acc_host * per_acc) / (p.host_memory_bandwidth * p.elementwise_efficiency)
    # Per-tensor dispatch: torch's optimizers step each parameter tensor with a few eager ops
    # (the multi-tensor path is CUDA-only). ZeRO-1 steps 1/dp of the tensors; TP, FSDP2
    # (ZeRO 2/3) and pipelined ZeRO-0 (replicate) parameters are DTensors, and so are their
    # optimizer ops (the runtime's mapping, runtime/parallelize.py); one replica keeps plain
    # parameters (GPU mixed precision keeps replicate, but GPU profiles price no dispatch).
    tensors = sum(o.param_tensors for o in opts)
    if config.zero_stage == 1:
        tensors /= config.mesh.replicas
    replicated = config.zero_stage == 0 and mesh.pp > 1 and mesh.replicas > 1
    dtensors = mesh.tp > 1 or config.zero_stage >= 2 or replicated
    per_op = p.dtensor_op_overhead if dtensors else p.optimizer_op_overhead
    return memory + tensors * OPTIMIZER_OPS[inp.training.optimizer] * per_op


def _stepped_params(o: BlockOption, zero: int, dp: int) -> float:
    """Parameters whose optimizer step a rank runs: its ZeRO shard (experts over their
    replicas), or under ZeRO-1 the dense shard and its whole experts."""
    if dp <= 1:
        return o.params
    if zero == 1:
        return o.dense_params / dp + o.expert_params
    return o.zero_params / dp


def offload_time(inp: CostInputs, opts: list[BlockOption], config: Config, m: int) -> float:
    """Host<->device traffic per step. "optimizer" (ZeRO-Offload): gradients down and updated
    weights up once per step. "optimizer+params" (FSDP2's CPUOffloadPolicy): the weight shards
    live on the host, are copied up for every micro-batch's forward and again for its backward,
    and each micro-batch's reduce-scattered gradient shard is copied down; the optimizer
    updates them where they live, so nothing goes up after the step. The weights that travel
    are the fp32 parameters FSDP2 keeps (cast to the compute dtype on the device): an H200
    moved 12 GB up for a 1.5B Llama's forward and backward (0.23 s at 52 GB/s), not 6."""
    wb, gb, _ = inp.training.state_bytes
    bw = inp.cluster.profile.host_bandwidth
    dp = config.mesh.replicas if config.zero_stage >= 1 else 1
    t = 0.0
    for o in opts:
        shard = o.zero_params / dp if dp > 1 else o.params
        if o.offload == "optimizer":
            t += shard * (gb + wb) / bw
        elif o.offload == "optimizer+params":
            t += shard * m * (2 * FP32_BYTES + gb) / bw
    return t


def gathered_weight_bytes(o: BlockOption, zero: int, training: Training) -> float:
    """ZeRO-3's (and offload's) gathered weights of a block while it runs, and of the next
    block prefetched beside it: two blocks' worth of whole weights."""
    if zero >= 3 or o.offload == Offload.PARAMS:
        return 2 * o.params * training.state_bytes[0]
    return 0.0


@dataclass(frozen=True)
class TiedCopy:
    """A parameter one block owns and a later block also reads (an output projection that is
    the token embedding)."""

    name: str
    numel: int
    owner: int  # block index
    user: int

    def spans_model(self, blocks: int) -> bool:
        """Owned by the first block and read by the last: with a pipeline they are always on
        the first and the last pipeline rank."""
        return self.owner == 0 and self.user == blocks - 1


def tied_copies(blocks: list[Block]) -> list[TiedCopy]:
    owner = {name: b.index for b in blocks for name in b.param_names}
    return [
        TiedCopy(name, numel, owner.get(name, 0), b.index)
        for b in blocks
        for name, numel in b.tied.items()
    ]


def tied_memory(inp: CostInputs, config: Config, last: bool) -> float:
    """Device bytes tied weights add beyond their owner block's states, as the runtime runs
    them. One stage: under ZeRO-3 the modules that share the weight form one FSDP unit with the
    root, so the weight stays gathered from the first use in forward to the last in backward.
    A pipeline: the stage that reads a weight another stage owns keeps a full copy with its
    gradient and optimizer states (Megatron's embedding group), kept equal by
    ``tied_sync_time``'s all-reduce. A tie between the first and the last block puts that copy
    on the last rank; for any other tie the copy is counted on every rank (an upper bound:
    where it lands depends on the split)."""
    copies = inp.tied
    if not copies:
        return 0.0
    tr, mesh = inp.training, config.mesh
    total = 0.0
    for c in copies:
        if config.num_stages == 1:
            if config.zero_stage >= 3:
                # under TP the weight may be split along its vocabulary in every variant of
                # its owner (cost.sharding.vocab_parallel_tied): the share of the owner's
                # parameters its most sharded option holds, the same whichever option the
                # solver picks (the stage MILP prices this before choosing)
                held = min(o.params for o in inp.options[c.owner])
                share = min(1.0, held / max(inp.blocks[c.owner].params, 1))
                total += c.numel * share * tr.state_bytes[0] * (1 - 1 / mesh.replicas)
        elif last or not c.spans_model(len(inp.blocks)):
            zero = 1 if deferred_reduce(config, tr) else config.zero_stage
            sm = state_memory(c.numel, zero, mesh.replicas, Offload.NONE, tr)
            total += sm["params"] + sm["grads"] + sm["optimizer"]
    return total


def tied_sync_time(inp: CostInputs, config: Config) -> float:
    """Per step, with a pipeline: each tied copy's gradient is reduced over its stage's data
    parallel ranks (a collective nothing overlaps: it runs after the pipeline drains), then
    summed with the owner stage's by an all-reduce between the two pipeline ranks, so every
    copy takes the one-process update."""
    mesh = config.mesh
    if mesh.pp == 1:
        return 0.0
    gb = inp.training.state_bytes[1]
    zero, n = config.zero_stage, mesh.replicas
    pair = [mesh.rank(0, 0, 0), mesh.rank(mesh.pp - 1, 0, 0)]
    total = 0.0
    for c in inp.tied:
        nbytes = c.numel * gb
        if n > 1:
            kind = "reduce_scatter" if zero >= 2 else "all_reduce"
            total += collective_time(kind, nbytes, inp.cluster, mesh.dp_group(mesh.pp - 1))
        total += collective_time(
            "all_reduce", nbytes / n if zero >= 2 else nbytes, inp.cluster, pair
        )
    return total


def other_memory(inp: CostInputs, opts: list[BlockOption], config: Config, pp_rank: int) -> float:
    """Memory that is not a model state or saved activation, while activations peak:
    ``fixed_memory``, ZeRO-3's gathered weights of the current and the prefetched block, and
    the working set: the largest op's working memory (or one block's recomputed activations
    during backward), or on the last stage the loss's fp32 logits and their gradients, which
    exist only between the loss's forward and the last block's backward, when no block op runs
    (an H200 peaked at the loss's backward with no op's working memory beside it, 2026-11-26)."""
    working = max((o.transient_bytes + o.recompute_peak_bytes for o in opts), default=0.0)
    gathered = max(
        (gathered_weight_bytes(o, config.zero_stage, inp.training) for o in opts), default=0
    )
    loss = loss_memory(inp, config, pp_rank == last_rank(config))
    return fixed_memory(inp, config, pp_rank) + gathered + max(working, loss)


def fixed_memory(inp: CostInputs, config: Config, pp_rank: int) -> float:
    """What pipeline rank ``pp_rank`` holds whatever its blocks: the profile's reserved bytes
    (the CUDA context), the pipeline's buffers (``pipeline_buffer_bytes``), the data-parallel
    reduction's buffer (``Training.reduce_bucket_bytes``), and tied weights' copies
    (``tied_memory``)."""
    total = inp.cluster.profile.reserved_bytes + pipeline_buffer_bytes(inp, config, pp_rank)
    total += inp.training.reduce_bucket_bytes
    return total + tied_memory(inp, config, pp_rank == last_rank(config))


def last_rank(config: Config) -> int:
    """The pipeline rank holding the last (virtual) stage: the loss's and the head's."""
    return (config.num_stages - 1) % config.mesh.pp


def pipeline_buffer_bytes(inp: CostInputs, config: Config, pp_rank: int) -> float:
    """Bytes of pipeline buffers on ``pp_rank``, b the activation crossing a cut per
    micro-batch. Under ``Training.microbatch_recv_buffers`` (torch's pipelining, measured on
    gloo: after a step of m = 8, stage 0 kept 8 output-gradient buffers, stage 1 kept 8
    activation buffers, and stage 0's cache held each output until its backward), per virtual
    stage holding ``chunk_held`` micro-batches h: the activation buffers of the micro-batches
    not in flight, (m - h) b (the h in flight are the first block's saved input, already
    counted), and the input gradient being sent back, b, on every stage but the first; m
    output-gradient buffers and h kept outputs, (m + h) b, on every stage but the last.
    Otherwise one send and one receive buffer, 2 b."""
    n, mesh, tr = config.num_stages, config.mesh, inp.training
    if n == 1:
        return 0.0
    b = inp.boundary_bytes * sample_share(config) / inp.traced_mbs
    if tr.pipeline_sends_shards:
        b /= mesh.tp
    if not tr.microbatch_recv_buffers:
        return 2 * b
    m = num_microbatches(tr, mesh.dp, config.micro_batch_size)
    held = chunk_held(config.schedule, m, mesh.pp, config.virtual_stages, pp_rank)
    total = 0.0
    for s in range(pp_rank, n, mesh.pp):
        if s > 0:
            total += (m - held + 1) * b
        if s < n - 1:
            total += (m + held) * b
    return total


def loss_memory(inp: CostInputs, config: Config, last: bool) -> float:
    """The loss's peak on the last stage (``CostInputs.loss_bytes``), 0 elsewhere."""
    if not last:
        return 0.0
    scale = sample_share(config) / inp.traced_mbs
    return inp.loss_bytes * scale / loss_shards(inp.training, config)


def reserved_peak(peak_bytes: float, profile) -> float:
    """The caching allocator's view of a predicted peak (what nvidia-smi and torch's
    max_memory_reserved report): the profile's reserved bytes, and the allocated rest times
    1 + ``allocator_overhead`` (its fragmentation and cached blocks, measured)."""
    context = profile.reserved_bytes
    return context + max(0.0, peak_bytes - context) * (1 + profile.allocator_overhead)


def loss_shards(training: Training, config: Config) -> int:
    """How many ranks the loss's logits are split over: the TP degree under a vocab-parallel
    loss (``Training.vocab_parallel_loss``), else one (every rank holds them all)."""
    return config.mesh.tp if training.vocab_parallel_loss else 1


def evaluate(inp: CostInputs, config: Config) -> StepCost:
    """Step time and per-device memory of ``config`` under the cost model.

    Step = pipeline + exposed DP communication + optimizer step + offload traffic (the last
    three: the slowest pipeline rank's) + tied weights' gradient sum; see ``pipeline_time`` and
    ``rank_memory``."""
    mesh, training = config.mesh, inp.training
    p = mesh.pp
    stages = stage_costs(inp, config)
    m = num_microbatches(training, mesh.dp, config.micro_batch_size)
    pipeline, bubble = pipeline_time(stages, config, m)
    memory, host = rank_memory(inp, config, stages)
    profile = inp.cluster.profile
    capacity = profile.memory_bytes * inp.memory_fraction
    peak = max(mm["total"] for mm in memory)
    dp_exposed = max(st.dp_exposed_s for st in stages)
    opt_s = max(sum(st.optimizer_s for st in stages[r::p]) for r in range(p))
    off_s = max(sum(st.offload_s for st in stages[r::p]) for r in range(p))
    step = pipeline + dp_exposed + opt_s + off_s + tied_sync_time(inp, config)
    flops = sum(b.fwd_flops + b.bwd_flops for b in inp.blocks) * (
        training.global_batch_size / inp.traced_mbs
    )
    peak_flops = profile.peak_flops[training.dtype]
    host_capacity = profile.host_memory_bytes / max(profile.gpus_per_node, 1)
    return StepCost(
        step_time_s=step,
        pipeline_s=pipeline,
        bubble_s=bubble,
        dp_exposed_s=dp_exposed,
        optimizer_s=opt_s,
        offload_s=off_s,
        stages=stages,
        rank_memory=memory,
        peak_memory_bytes=peak,
        capacity_bytes=capacity,
        model_flops_per_step=flops,
        mfu=flops / (step * mesh.size * peak_flops) if step > 0 else 0.0,
        samples_per_s=training.global_batch_size / step if step > 0 else 0.0,
        feasible=peak <= capacity
        and host <= host_capacity
        and all(
            offload_allowed(inp.options[i][k].offload, config.zero_stage)
            for i, k in enumerate(config.choice)
        ),
        host_bytes_per_gpu=host,
        sync_s=m * max(sum(st.sync_s for st in stages[r::p]) for r in range(p)),
    )


def stage_costs(inp: CostInputs, config: Config) -> list[StageCost]:
    """Every (virtual) stage's times per micro-batch and per step."""
    mesh = config.mesh
    p, v = mesh.pp, config.virtual_stages
    m = num_microbatches(inp.training, mesh.dp, config.micro_batch_size)
    n_stages = p * v
    stage_blocks: list[list[int]] = [[] for _ in range(n_stages)]
    for i, s in enumerate(config.stage_of):
        stage_blocks[s].append(i)
    stages: list[StageCost] = []
    for s in range(n_stages):
        r = s % p
        opts = [inp.options[i][config.choice[i]] for i in stage_blocks[s]]
        sync = stage_sync_time(inp, opts, config, s)
        compute, tp_comm, p2p = stage_time_parts(inp, opts, config, s, sync)
        dp_total, dp_exposed = dp_comm(inp, opts, config, r)
        fwd, bwd = _forward_backward(opts, compute + tp_comm + p2p, p2p)
        stages.append(
            StageCost(
                index=s,
                pp_rank=r,
                blocks=stage_blocks[s],
                compute_s=compute,
                tp_comm_s=tp_comm,
                p2p_s=p2p,
                time_s=compute + tp_comm + p2p,
                fwd_s=fwd,
                bwd_s=bwd,
                dp_comm_s=dp_total,
                dp_exposed_s=dp_exposed,
                optimizer_s=optimizer_time(inp, opts, config),
                offload_s=offload_time(inp, opts, config, m),
                inflight=inflight_microbatches(config.schedule, m, p, v, r),
                held=chunk_held(config.schedule, m, p, v, r),
                sync_s=sync,
            )
        )
    return stages


def _forward_backward(opts: list[BlockOption], time_s: float, p2p: float) -> tuple[float, float]:
    """A stage's micro-batch time ``time_s`` split into forward and backward, as the schedule
    figures draw them: the blocks' own forward and backward, half the point-to-point each, and
    what the stage adds beside its blocks (the loss, the data-parallel wrapper's copies,
    BatchNorm's synchronization) in the blocks' forward : backward proportion."""
    f, b = sum(o.fwd_s for o in opts), sum(o.bwd_s for o in opts)
    rest = time_s - f - b - p2p
    share = f / (f + b) if f + b > 0 else 0.5
    return f + p2p / 2 + rest * share, b + p2p / 2 + rest * (1 - share)


def pipeline_time(stages: list[StageCost], config: Config, m: int) -> tuple[float, float]:
    """(pipeline, bubble) of one step. p ranks, m micro-batches, per-stage time T_j per
    micro-batch: GPipe / 1F1B: sum_j T_j + (m - 1) * max_j T_j. Interleaved with v chunks per
    rank: m * max_r R_r + (p - 1) * max_c T_c, where R_r sums rank r's chunks; with equal
    chunks the bubble is 1/v of the 1F1B bubble (Narayanan et al. 2021)."""
    p = config.mesh.pp
    T = [st.time_s for st in stages]
    if config.virtual_stages == 1:
        return sum(T) + (m - 1) * max(T), sum(T) - max(T)
    R = [sum(T[c] for c in range(r, len(T), p)) for r in range(p)]
    return m * max(R) + (p - 1) * max(T), (p - 1) * max(T)


def rank_memory(
    inp: CostInputs, config: Config, stages: list[StageCost]
) -> tuple[list[dict[str, float]], float]:
    """Per pipeline rank, device bytes by category (states, in-flight activations, other) and
    their total, at the larger of a step's two peaks; and the most host bytes any rank keeps
    (offloaded states). The activation peak: weights, optimizer states, gradients where held
    (``grads_held``), in-flight activations and ``other_memory``. The optimizer step's: states
    and the step's temporaries (``step_state_bytes``) beside the reserved bytes and tied
    copies, the activations freed; it is the larger where activations are small beside the
    states (a Llama-3B with full recompute on an H200)."""
    mesh, training = config.mesh, inp.training
    p = mesh.pp
    deferred = deferred_reduce(config, training)
    held = grads_held(config, training)
    memory: list[dict[str, float]] = []
    host = 0.0
    for r in range(p):
        mem = {"params": 0.0, "grads": 0.0, "optimizer": 0.0, "activations": 0.0}
        step = {"params": 0.0, "grads": 0.0, "optimizer": 0.0, "activations": 0.0, "other": 0.0}
        rank_opts: list[BlockOption] = []
        rank_host = 0.0
        for st in stages[r::p]:
            for i in st.blocks:
                o = inp.options[i][config.choice[i]]
                rank_opts.append(o)
                sm = option_states(o, config.zero_stage, mesh.replicas, training, deferred)
                mem["params"] += sm["params"]
                mem["optimizer"] += sm["optimizer"]
                mem["grads"] += sm["grads"] if held else 0.0
                for k, v in step_state_parts(sm, training).items():
                    step[k] += v
                rank_host += sm["host"]
                mem["activations"] += o.act_bytes * st.held
        mem["other"] = other_memory(inp, rank_opts, config, r)
        mem["total"] = sum(mem.values())
        step["other"] += fixed_memory(inp, config, r)
        step["total"] = sum(step.values())
        # the larger phase's parts: the optimizer step's put its temporaries under "other"
        memory.append(step if step["total"] > mem["total"] else mem)
        host = max(host, rank_host)
    return memory, host
