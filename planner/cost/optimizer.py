"""The optimizer step and offload: the device's (fused or per-op) and the host's step time
(``optimizer_time``), which parameters a rank steps, and the host<->device transfers offload
adds (``offload_time``)."""

from __future__ import annotations

from planner.cost.records import BlockOption, Config, CostInputs, deferred_reduce
from planner.training import FP32_BYTES, num_microbatches
from planner.vocab import Offload

# Eager ops per parameter tensor in torch's single-tensor optimizer steps: AdamW's step count,
# decay, two moment updates, square root, bias-corrected denominator and update; SGD's momentum
# update and parameter update (plus the in-place decay both apply).
OPTIMIZER_OPS = {"adamw": 8, "sgd": 3}


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


def offload_allowed(offload: str, zero: int) -> bool:
    """Weights live on the host only when ZeRO-3 shards them (FSDP2's CPUOffloadPolicy):
    otherwise every rank would fetch the full weights for every micro-batch."""
    return offload != Offload.PARAMS or zero >= 3


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
    device = sum(n for n, off in local if off == Offload.NONE)
    host = sum(n for n, off in local if off != Offload.NONE)
    unfused = UNFUSED_STEP_ACCESSES[inp.training.optimizer] * FP32_BYTES
    per_param = 2 * wb + gb + 2 * ob if inp.training.fused_step else unfused
    m = num_microbatches(inp.training, mesh.dp, config.micro_batch_size)
    acc_device = acc_host = 0.0
    deferred = deferred_reduce(config, inp.training)  # never with one micro-batch
    if m > 1:
        sharded = config.zero_stage >= 2 and not deferred
        for o in opts:
            n = o.zero_params / mesh.replicas if sharded and mesh.replicas > 1 else o.params
            if inp.training.fused_grad_accumulation and not sharded:
                n -= o.product_params  # the weight-gradient GEMMs accumulated them
            if o.offload == Offload.PARAMS:
                acc_host += n
            else:
                acc_device += n
    # A deferring pipeline accumulates FSDP2's unsharded gradients in the reduce dtype (what
    # memory holds them at: ``state_memory(accumulated=True)``); the others add into ``.grad``.
    acc_bytes = inp.training.reduce_bytes if deferred else gb
    per_acc = (m - 1) * 3 * acc_bytes
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
    weights up once per step. ``Offload.PARAMS`` (FSDP2's CPUOffloadPolicy): the weight shards
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
        if o.offload == Offload.OPTIMIZER:
            t += shard * (gb + wb) / bw
        elif o.offload == Offload.PARAMS:
            t += shard * m * (2 * FP32_BYTES + gb) / bw
    return t
