"""Memory: model states per option under each ZeRO stage (``option_states``,
``state_memory``), what a rank holds in forward and during the step, gathered weights, tied
copies, pipeline buffers, the loss, the allocator's reserve, and each rank's memory by
category (``rank_memory``)."""

from __future__ import annotations

from planner.cost.pipeline import chunk_held
from planner.cost.records import (
    BlockOption,
    Config,
    CostInputs,
    StageCost,
    deferred_reduce,
    grads_held,
    last_rank,
    loss_shards,
    sample_share,
)
from planner.training import FP32_BYTES, Training, num_microbatches
from planner.vocab import Offload


def option_states(
    o: BlockOption, zero: int, dp: int, training: Training, deferred: bool = False
) -> dict[str, float]:
    """``state_memory`` of one block option. Expert parameters shard over their dp / ep
    replicas under ZeRO 2/3 (FSDP units of their own over those ranks); under ZeRO-1 they keep
    whole optimizer states beside the dense parameters' sharded ones, as the runtime runs it
    (torch's ZeroRedundancyOptimizer cannot hold their DTensors). ``deferred`` (see
    ``deferred_reduce``): weights and gradients stay whole, as ZeRO-1's, the gradients
    accumulated unreduced at ``Training.reduce_bytes``."""
    if zero == 1 and o.expert_params:
        dense = state_memory(o.dense_params, 1, dp, o.offload, training)
        experts = state_memory(o.expert_params, 0, 1, o.offload, training)
        return {k: dense[k] + experts[k] for k in dense}
    return state_memory(
        o.params, 1 if deferred else zero, dp, o.offload, training, o.zero_params, deferred
    )


def state_memory(
    params: float,
    zero: int,
    dp: int,
    offload: str,
    training: Training,
    sharded: float | None = None,
    accumulated: bool = False,
) -> dict[str, float]:
    """Weights, gradients and optimizer states per device (ZeRO paper, Sec. 5), after offload.

    ZeRO-1 shards optimizer states over DP, ZeRO-2 also gradients, ZeRO-3 also weights.
    ``Offload.OPTIMIZER`` moves optimizer states to host memory (ZeRO-Offload); ``Offload.PARAMS``
    also keeps the weights and gradients there between uses (FSDP2 CPUOffloadPolicy).
    ``sharded``: what ZeRO divides by dp when it differs from ``params`` (expert parallelism).
    ``accumulated``: the whole gradients are FSDP2's unsharded accumulation over a deferring
    pipeline's micro-batches (``deferred_reduce``), held at ``Training.reduce_bytes``."""
    wb, gb, ob = training.state_bytes
    if accumulated:
        gb = training.reduce_bytes
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
    if offload == Offload.PARAMS:
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


def gathered_weight_bytes(o: BlockOption, zero: int, training: Training) -> float:
    """ZeRO-3's (and offload's) gathered weights of a block while it runs, and of the next
    block prefetched beside it: two blocks' worth of whole weights."""
    if zero >= 3 or o.offload == Offload.PARAMS:
        return 2 * o.params * training.state_bytes[0]
    return 0.0


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
            deferred = deferred_reduce(config, tr)
            zero = 1 if deferred else config.zero_stage
            sm = state_memory(c.numel, zero, mesh.replicas, Offload.NONE, tr, None, deferred)
            total += sm["params"] + sm["grads"] + sm["optimizer"]
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


def pipeline_buffer_bytes(inp: CostInputs, config: Config, pp_rank: int) -> float:
    """Bytes of pipeline buffers on ``pp_rank``: ``held_boundaries`` of each of its virtual
    stages times b, the activation crossing a cut per micro-batch (1/tp of it where the
    pipeline sends sequence shards). Without ``Training.microbatch_recv_buffers``, one send
    and one receive buffer, 2 b."""
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
        total += held_boundaries(m, held, s > 0, s < n - 1, tr.released_recv_buffers) * b
    return total


def held_boundaries(m: int, held: float, receives: bool, sends: bool, released: bool) -> float:
    """Micro-batch activations (or their gradients) a pipeline stage's buffers hold beyond the
    received inputs of its ``held`` in-flight micro-batches (its first block's saved input,
    priced with the activations), m micro-batches a step. torch's stage
    (``released`` False; measured on gloo: after a step of m = 8, stage 0 kept 8
    output-gradient buffers, stage 1 kept 8 activation buffers, and stage 0's cache held each
    output until its backward): a receiving stage the activation buffers of the micro-batches
    not in flight and the input gradient being sent back, m - held + 1; a sending stage m
    output-gradient buffers and its held outputs, m + held. Released
    (runtime.pipeline_buffers, counted on gloo by tests/test_pipeline_buffers.py): the input
    gradient being sent, 1; the held outputs and the one output gradient being received,
    held + 1."""
    if released:
        return (1 if receives else 0) + (held + 1 if sends else 0)
    return (m - held + 1 if receives else 0) + (m + held if sends else 0)


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
