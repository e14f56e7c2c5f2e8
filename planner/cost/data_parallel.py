"""Data-parallel terms: the gradient reduction and ZeRO's gathers per block and per stage
(``dp_rates``, ``dp_block_terms``, ``dp_stage_terms``: the stage MILP reads the same
coefficients), the copies the data-parallel wrapper makes, BatchNorm synchronisation and the
tied weights' gradient sum."""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.records import BlockOption, Config, CostInputs, deferred_reduce
from planner.hardware.cluster import Cluster
from planner.hardware.collectives import collective_time
from planner.schema.mesh import Mesh
from planner.training import FP32_BYTES, Training, num_microbatches
from planner.vocab import Recompute


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


def stage_sync_time(inp: CostInputs, opts: list[BlockOption], config: Config, s: int) -> float:
    """Per micro-batch, the blocks' ``block_extra_time`` on virtual stage s: part of its
    compute in ``stage_time_parts``, kept apart as ``StageCost.sync_s``."""
    return sum(block_extra_time(inp, o, config, s % config.mesh.pp) for o in opts)


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
    # FSDP2 and replicate reduce in the plan's reduce_dtype; ZeRO-1's DDP in the fp32 grads'
    wb, gb = tr.state_bytes[0], tr.reduce_bytes if config.zero_stage != 1 else tr.state_bytes[1]
    all_reduce, reduce_scatter, all_gather = _dp_collectives(inp, mesh, pp_rank, wb, gb)
    return DPRates(
        replicas=mesh.replicas,
        zero=config.zero_stage,
        m=num_microbatches(tr, mesh.dp, config.micro_batch_size),
        deferred=deferred_reduce(config, tr),
        regather=tr.dp_copies == "torch",
        overlap=inp.cluster.profile.comm_overlap if tr.dp_overlap else 0.0,
        unit=inp.cluster.profile.fsdp_unit_overhead,
        all_reduce=all_reduce,
        reduce_scatter=reduce_scatter,
        all_gather=all_gather,
    )


def _dp_collectives(inp: CostInputs, mesh: Mesh, pp_rank: int, wb: float, gb: float) -> tuple:
    """The (slope, latency) of the all-reduce, reduce-scatter (``gb`` bytes per parameter) and
    all-gather (``wb``) over pipeline rank ``pp_rank``'s data-parallel group, kept on ``inp``:
    every configuration evaluated on one mesh asks again per stage (Llama-3-405B on 16,384
    GPUs: 4,263 asks of groups of up to 2,048 ranks, each pricing six collectives, a fifth of
    that plan's search). A pure function of its key, so keeping it changes no number."""
    memo = inp.memo.setdefault("dp_collectives", {})
    key = (inp.cluster, mesh, pp_rank, wb, gb)
    if key not in memo:
        ranks = mesh.dp_group(pp_rank)
        memo[key] = (
            _affine("all_reduce", inp.cluster, ranks, gb),
            _affine("reduce_scatter", inp.cluster, ranks, gb),
            _affine("all_gather", inp.cluster, ranks, wb),
        )
    return memo[key]


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
