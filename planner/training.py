"""Training settings, defined once: the record every path reads (the dense planner, resource
pools, recommendation models, the cost model) and the one constructor that builds it from a
model file's ``TRAINING`` and the command line's flags and validates it.

Why one home: the global batch, dtype, optimizer and learning rate were read from the model file,
overridden by flags, validated and turned into the cost model's record in four places, and each
path re-derived them; a flag now takes one hop (``training_from``) into ``Training``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planner.errors import UserInputError
from planner.vocab import DTYPES, HALF_DTYPES, OPTIMIZERS, DType, Optimizer, SelectivePolicy

DEFAULT_LR = 3e-4
# What a model file's TRAINING may leave out.
TRAINING_DEFAULTS: dict[str, Any] = {
    "global_batch_size": 8,
    "optimizer": Optimizer.ADAMW.value,
    "dtype": DType.BF16.value,
    "lr": DEFAULT_LR,
}
FP32_BYTES = 4
# Bytes per parameter: (weights, gradients, optimizer states). Mixed precision keeps fp32
# master weights in the optimizer states (ZeRO paper's K = 12 for Adam); SGD keeps momentum.
STATE_BYTES = {
    ("adamw", True): (2, 2, 12),
    ("adamw", False): (4, 4, 8),
    ("sgd", True): (2, 2, 8),
    ("sgd", False): (4, 4, 4),
}


@dataclass(frozen=True)
class Training:
    global_batch_size: int
    dtype: str = DType.BF16.value
    optimizer: str = Optimizer.ADAMW.value
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
    # What selective recompute keeps (``selective_kept``): "runtime-op" keeps the block's
    # input and the outputs of every matrix product and attention kernel, recomputing the rest
    # (meshplan's runtime, planner.checkpoint_policy); "core" drops the attention core between
    # two activation products (Korthikanti et al.'s selective recompute, Megatron's);
    # "torchtitan-op" keeps the block's input and the outputs of its attention kernels and of
    # every other weight product (torchtitan's op-level SAC), recomputing the rest.
    selective_policy: str = SelectivePolicy.RUNTIME_OP
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
    # ... those buffers allocated when their receive is posted and dropped after their
    # micro-batch's backward (runtime.pipeline_buffers, meshplan's runtime: ``on_devices``),
    # so a stage holds its in-flight outputs and one buffer each way. Off: torch's own stage
    # (torchtitan's runs). See ``pipeline_buffer_bytes``.
    released_recv_buffers: bool = False
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
    # The learning rate the runtime trains with (recorded in the plan; no cost depends on it).
    lr: float = DEFAULT_LR
    # Gradients reduced, and accumulated unreduced between micro-batches, in the 16-bit
    # compute dtype (FSDP2's MixedPrecisionPolicy(reduce_dtype=param_dtype): the unsharded
    # 16-bit gradient is kept as it is, not upcast to an fp32 accumulator, and reduce-scattered
    # as it is; the reduced shard is still cast to the fp32 parameter's dtype). Off: fp32
    # (reduce_dtype=float32, the runtime's default and Meta's Llama 3 setting). See
    # ``reduce_bytes``; the plan records it as ``reduce_dtype``.
    half_grad_reduce: bool = False

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
    def reduce_dtype(self) -> str:
        """The dtype word gradients are reduced in: the training dtype under
        ``half_grad_reduce``, else fp32."""
        return self.dtype if self.half_grad_reduce and self.mixed else DType.FP32.value

    @property
    def reduce_bytes(self) -> int:
        """Bytes per gradient element that the data-parallel reduction moves and that an
        unsharded gradient accumulated over micro-batches holds (``deferred_reduce``): 2 under
        ``half_grad_reduce``, else the gradients' own width (``state_bytes``)."""
        return 2 if self.reduce_dtype != DType.FP32.value else self.state_bytes[1]

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


def training_from(
    file_training: Mapping[str, Any],
    source: str,
    *,
    global_batch_size: int | None = None,
    dtype: str | None = None,
    optimizer: str | None = None,
    lr: float | None = None,
    reduce_dtype: str | None = None,
) -> Training:
    """``Training`` from a model file's ``TRAINING`` (``source`` names the file in errors) with
    the command line's values over it, validated: each problem one line naming the key.
    ``reduce_dtype`` (TRAINING's "reduce_dtype"): fp32, or the training dtype itself
    (``Training.half_grad_reduce``)."""
    cfg = {**TRAINING_DEFAULTS, **file_training}
    for key, value in (
        ("global_batch_size", global_batch_size),
        ("dtype", dtype),
        ("optimizer", optimizer),
        ("lr", lr),
        ("reduce_dtype", reduce_dtype),
    ):
        if value is not None:
            cfg[key] = value
    if cfg["dtype"] not in DTYPES:
        raise UserInputError(
            f"{source}: TRAINING dtype {cfg['dtype']!r} is not one of {', '.join(DTYPES)}"
        )
    if cfg["optimizer"] not in OPTIMIZERS:
        raise UserInputError(
            f"{source}: TRAINING optimizer {cfg['optimizer']!r} is not one of "
            f"{', '.join(OPTIMIZERS)}"
        )
    gbs = cfg["global_batch_size"]
    if isinstance(gbs, bool) or not isinstance(gbs, int) or gbs <= 0:
        raise UserInputError(f"{source}: global_batch_size must be a positive integer")
    rate = cfg["lr"]
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise UserInputError(f"{source}: TRAINING lr must be a positive number, got {rate!r}")
    reduce = cfg.get("reduce_dtype", DType.FP32.value)
    if reduce not in (DType.FP32.value, cfg["dtype"]):
        raise UserInputError(
            f"{source}: reduce_dtype {reduce!r} must be fp32 or the training dtype "
            f"{cfg['dtype']!r} (gradients are reduced in fp32 or in the compute dtype)"
        )
    return Training(
        gbs,
        DType(cfg["dtype"]).value,
        Optimizer(cfg["optimizer"]).value,
        moe_factor(cfg, "moe_capacity_factor"),
        moe_factor(cfg, "moe_imbalance"),
        lr=float(rate),
        half_grad_reduce=reduce != DType.FP32.value,
    )


def moe_factor(cfg: Mapping[str, Any], key: str) -> float:
    """TRAINING's mixture-of-experts factors: numbers >= 1 (1.0 when absent)."""
    value = cfg.get(key, 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1:
        raise UserInputError(
            f"TRAINING[{key!r}] must be a number >= 1 (1.0 = dropless and balanced), got {value!r}"
        )
    return float(value)


def on_devices(training: Training, gpu: bool) -> Training:
    """``training`` as meshplan's runtime trains on these ranks: on GPUs it steps with torch's
    fused kernel (``fused_optimizer``) and casts parameters to the 16-bit compute dtype on the
    device (``device_casts``); on CPU ranks neither; on both its pipeline stages free their
    receive buffers once consumed (``released_recv_buffers``)."""
    return dataclasses.replace(
        training, fused_optimizer=gpu, device_casts=gpu, released_recv_buffers=True
    )


def replica_counts(global_batch_size: int, dp: int, micro_batch_size: int) -> tuple[int, int]:
    """(samples, micro-batches) each of ``dp`` data-parallel replicas runs a step: the counts a
    plan stores per stage, so that the runtime reads them."""
    local = global_batch_size // dp
    return local, local // micro_batch_size


def num_microbatches(training: Training, dp: int, micro_batch_size: int) -> int:
    """Micro-batches per step on each data-parallel replica."""
    return replica_counts(training.global_batch_size, dp, micro_batch_size)[1]
