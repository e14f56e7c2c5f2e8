"""What each training engine holds in memory and overlaps where meshplan's runtime does
something else, as the cost model's ``Training`` fields: defined once, read by the exports'
pricing (``planner.export.pricing``: the plan as the engine will run it) and by the published
benchmark (``benchmarks/published.py``: each published row under its framework).

The engines, as their defaults run an exported plan:

- ``torchtitan`` (0.3): FSDP2 and torch's pipelining, as meshplan's runtime; its selective
  recompute is the per-op policy (``selective_ac_option = "op"``, its train configs' default,
  ``cost.block_options.selective_kept``'s "torchtitan-op"); its ``loss_parallel`` (on unless
  disabled) keeps the logits sharded over TP.
- ``megatron`` (Megatron-Core): contiguous gradient buffers stepped by a fused Adam; 16-bit
  weights that are the compute copies (no wrapper copies); one send and one receive buffer per
  pipeline rank (``deallocate_output_tensor``); vocab-parallel cross-entropy; Transformer
  Engine's fused element-wise kernels, and its cuDNN attention on Hopper (``--attention-backend
  auto``); sequence-shard pipeline sends under sequence parallelism (``get_tensor_shapes``);
  the interleaved schedule overlapping its sends (``overlap_p2p_comm``); weight-gradient GEMMs
  accumulating into the buffer (``gradient_accumulation_fusion``).
- ``deepspeed``: contiguous gradient buffers, ZeRO's reduction bucket and fp16's fp32
  gradient partition (``deepspeed_buffers``); its reduction overlaps the backward only where
  ``overlap_comm`` is on (``deepspeed_overlaps_reduction``); its AutoTP runs no sequence
  parallelism (the export's ``AsRun`` says so).
- ``accelerate`` (FSDP 2): torch's FSDP2 and DDP, as meshplan's runtime.
"""

from __future__ import annotations

import dataclasses

from planner.training import Training
from planner.vocab import DType, SelectivePolicy

# The profiles of Hopper boards, where Transformer Engine's attention is cuDNN's fused kernel.
HOPPER_PROFILES = ("h100-sxm", "h100-hbm2e", "h200")

# DeepSpeed's default gradient-reduction bucket, in elements: ZeRO's reduce_bucket_size
# (deepspeed/runtime/zero/constants.py, ZERO_OPTIMIZATION_REDUCE_BUCKET_SIZE_DEFAULT) and the
# stage-0 buffered all-reduce's MEMORY_OPT_ALLREDUCE_SIZE (deepspeed/runtime/engine.py), both
# 500,000,000 since v0.3 and in the v0.5/v0.6 releases BLOOM's Megatron-DeepSpeed ran on.
DEEPSPEED_BUCKET_ELEMENTS = 5e8
# The DP wrapper's weight and gradient copies (``Training.dp_copies``): torch's FSDP2/DDP
# ("torch", meshplan's runtime), or 16-bit weights that are the compute copies and gradients
# landing in the reduce buffers ("none").
TORCH_COPIES, NO_COPIES = "torch", "none"


def deepspeed_buffers(zero: int, dtype: str, bf16_optimizer: bool, rank_params: float):
    """(fp32 gradient partition, reduction buffer bytes) of DeepSpeed
    (``Training.fp32_grad_partition``, ``Training.reduce_bucket_bytes``), as read in the
    DeepSpeed BLOOM's runs used (8eef742f0, February 2022) and its v0.5-0.7 releases.

    - fp16 under ZeRO 0-2: the step casts the gradients it steps to fp32.
    - ZeRO 1/2 with contiguous gradients (the default since v0.4): a bucket of
      reduce_bucket_size elements of the 16-bit dtype, whatever the rank holds
      (``torch.empty`` in stage_1_and_2.py).
    - fp16 at stage 0 (FP16_Optimizer): the buffered all-reduce flattens the module's
      gradients into buckets of the default's elements, at most the rank's gradients.
    - BF16_Optimizer (stage 0 with fp32 gradient accumulation): it reduces its flat fp32
      buffers themselves (a single tensor flattens to a view), so no bucket.
    ZeRO-3's prefetch and reduce buffers are not priced here."""
    if zero >= 3:
        return False, 0.0
    fp32_partition = dtype == DType.FP16
    if zero >= 1:
        return fp32_partition, DEEPSPEED_BUCKET_ELEMENTS * 2
    if bf16_optimizer:
        return fp32_partition, 0.0
    return fp32_partition, min(DEEPSPEED_BUCKET_ELEMENTS, rank_params) * 2


def deepspeed_overlaps_reduction(zero: int, pp: int) -> bool:
    """Whether DeepSpeed (0.19) reduces gradients during the backward as meshplan's export
    configures it: ZeRO's ``overlap_comm`` (on by default at stage 3 only,
    ``DeepSpeedZeroConfig.overlap_comm_valid``; the export turns it on at stages 1 and 2);
    never at stage 0 (the engine all-reduces after the backward) nor under a pipeline, whose
    TrainSchedule issues ReduceGrads after the step's last backward
    (deepspeed/runtime/pipe/schedule.py)."""
    return zero >= 1 and pp == 1


def megatron_sends_shards(pp: int, sequence_parallel: bool) -> bool:
    """Megatron-Core sends each TP rank's sequence shard between stages under sequence
    parallelism (get_tensor_shapes: seq_length // tp)."""
    return pp > 1 and sequence_parallel


def megatron_fuses_grad_accumulation(microbatches: int) -> bool:
    """Megatron's weight-gradient GEMMs accumulate into the gradient buffer
    (gradient_accumulation_fusion, on unless --no-gradient-accumulation-fusion), which matters
    only with several micro-batches."""
    return microbatches > 1


def native_attention_on(profile: str) -> bool:
    """Transformer Engine's attention is the chip's own fused kernel on Hopper."""
    return profile in HOPPER_PROFILES


def engine_training(
    base: Training,
    engine: str,
    *,
    tp: int,
    pp: int,
    virtual_stages: int,
    zero: int,
    microbatches: int,
    sequence_parallel: bool,
    profile: str,
    rank_params: float,
) -> Training:
    """``base`` (meshplan's runtime's settings for the plan) as ``engine`` runs it: the fields
    the module docstring names, per engine; ``rank_params`` the parameters a rank holds after
    TP and PP (DeepSpeed's stage-0 bucket is at most them)."""
    if engine == "megatron":
        return dataclasses.replace(
            base,
            vocab_parallel_loss=tp > 1,
            selective_policy=SelectivePolicy.CORE,
            native_attention=native_attention_on(profile),
            fused_elementwise=True,
            pipeline_sends_shards=megatron_sends_shards(pp, sequence_parallel),
            p2p_overlap=virtual_stages > 1,
            fused_grad_accumulation=megatron_fuses_grad_accumulation(microbatches),
            dp_overlap=True,  # the export writes --overlap-grad-reduce
            dp_copies=NO_COPIES,
            persistent_grad_buffers=True,
            microbatch_recv_buffers=False,
        )
    if engine == "deepspeed":
        partition, bucket = deepspeed_buffers(zero, base.dtype, False, rank_params)
        return dataclasses.replace(
            base,
            selective_policy=SelectivePolicy.CORE,
            fp32_grad_partition=partition,
            reduce_bucket_bytes=bucket,
            dp_overlap=deepspeed_overlaps_reduction(zero, pp),
            dp_copies=NO_COPIES,
            persistent_grad_buffers=True,
            microbatch_recv_buffers=False,
        )
    if engine == "torchtitan":
        return dataclasses.replace(
            base,
            vocab_parallel_loss=tp > 1,
            selective_policy=SelectivePolicy.TORCHTITAN_OP,
        )
    if engine == "accelerate":
        return base
    raise ValueError(f"no semantics for engine {engine!r}")
