"""Pipeline terms: the micro-batches in flight per schedule and rank, what a stage holds
of its chunks, the point-to-point hop between stages, a stage's time per micro-batch and the
pipeline's step time with its bubble (``pipeline_time``)."""

from __future__ import annotations

import math

from planner.cost.compute import loss_time
from planner.cost.data_parallel import stage_sync_time
from planner.cost.records import BlockOption, Config, CostInputs, StageCost, sample_share
from planner.hardware.collectives import p2p_time
from planner.vocab import Schedule


def inflight_microbatches(schedule: str, m: int, pp: int, v: int, pp_rank: int) -> int:
    """Micro-batches whose activations a stage holds at its peak.

    GPipe: all m. 1F1B: min(m, pp - rank). Interleaved 1F1B with v chunks per rank (counted in
    chunk-micro-batches, each holding one chunk's activations): torch's warm-up of
    (v - 1) * pp + 2 * (pp - rank - 1) steps plus the one in flight, at most m * v."""
    if schedule == Schedule.GPIPE or pp == 1:
        return m if schedule == Schedule.GPIPE else min(m, pp - pp_rank)
    if schedule == Schedule.ONE_F_ONE_B:
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
    return count / v if schedule == Schedule.INTERLEAVED and pp > 1 else float(count)


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
    # the busiest sender, TP rank 0, sends to every receiving rank u with u mod t == 0
    forward = p2p_time(nbytes * math.ceil(t_next / t), bw, lat)
    return forward + p2p_time(nbytes * math.ceil(t / t_next), bw, lat)


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


def forward_backward_split(
    opts: list[BlockOption], time_s: float, p2p: float
) -> tuple[float, float]:
    """A stage's micro-batch time ``time_s`` split into forward and backward, as the schedule
    figures draw them: the blocks' own forward and backward, half the point-to-point each, and
    what the stage adds beside its blocks (the loss, the data-parallel wrapper's copies,
    BatchNorm's synchronization) in the blocks' forward : backward proportion."""
    f, b = sum(o.fwd_s for o in opts), sum(o.bwd_s for o in opts)
    rest = time_s - f - b - p2p
    share = f / (f + b) if f + b > 0 else 0.5
    return f + p2p / 2 + rest * share, b + p2p / 2 + rest * (1 - share)


def one_chunk_pipeline(times: list[float], microbatches: list[int]) -> float:
    """The step of a pipeline with one chunk per rank (GPipe / 1F1B) whose stage j takes
    ``times[j]`` a micro-batch over ``microbatches[j]`` micro-batches per replica:
    sum_j T_j + max_j (m_j - 1) T_j (every stage passes each micro-batch once; the busiest
    one runs the rest back to back). Stages of one mesh share m; a mixed pool's stages of
    their own DP degree each have theirs."""
    return sum(times) + max((m - 1) * t for m, t in zip(microbatches, times, strict=True))


def one_chunk_floor(m: int, pp: int) -> float:
    """The least ratio of a one-chunk pipeline's step to the sum of its stages' times per
    micro-batch: 1 + (m - 1) / p, since the busiest of p stages holds at least 1/p of it."""
    return 1 + (m - 1) / pp


def pipeline_time(stages: list[StageCost], config: Config, m: int) -> tuple[float, float]:
    """(pipeline, bubble) of one step. p ranks, m micro-batches, per-stage time T_j per
    micro-batch: GPipe / 1F1B: sum_j T_j + (m - 1) * max_j T_j. Interleaved with v chunks per
    rank: m * max_r R_r + (p - 1) * max_c T_c, where R_r sums rank r's chunks; with equal
    chunks the bubble is 1/v of the 1F1B bubble (Narayanan et al. 2021)."""
    p = config.mesh.pp
    T = [st.time_s for st in stages]
    if config.virtual_stages == 1:
        return one_chunk_pipeline(T, [m] * len(T)), sum(T) - max(T)
    R = [sum(T[c] for c in range(r, len(T), p)) for r in range(p)]
    return m * max(R) + (p - 1) * max(T), (p - 1) * max(T)
