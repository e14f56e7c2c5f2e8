"""The outer search: mesh shapes, micro-batch sizes, schedules and ZeRO stages, pruned by lower
bounds, each survivor solved exactly by the stage MILP.

Candidates are solved in order of their lower bound; once the best solved step time is no
larger than a candidate's bound, that candidate (and every later one) cannot win and is pruned
without building a MILP. The bound is valid because the pipeline time is at least
sum_j T_j (1 + (m-1)/p) for 1F1B (max_j T_j >= mean) and m sum T / p + (p-1) sum T / (p v) for the
interleaved schedule, and sum_j T_j is at least the sum over blocks of their fastest option.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from planner.blocks import Block
from planner.cluster import Cluster
from planner.collectives import collective_time
from planner.costmodel import (
    OFFLOAD,
    RECOMPUTE,
    BlockOption,
    Config,
    CostInputs,
    Mesh,
    StepCost,
    Training,
    block_options,
    deferred_reduce,
    evaluate,
    inflight_microbatches,
    num_microbatches,
    offload_allowed,
    offload_time,
    optimizer_time,
    option_states,
)
from planner.errors import UserInputError
from planner.stage_milp import GIB, StageProblem, solve_stage_milp

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
INTERLEAVE = (2, 4)


@dataclass
class Pins:
    """What the user fixed; None / "auto" leaves it to the solver."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    ep: int | None = None
    cp: int | None = None
    zero: int | None = None
    micro_batch_size: int | None = None
    schedule: str | None = None
    virtual_stages: int | None = None
    recompute: str = "auto"
    offload: str = "auto"
    memory_fraction: float = 1.0
    tp_variant: str = "auto"  # "sharded": every block that can be TP-sharded is


MILP_TIME_LIMIT_S = 2.0
# First pass: each MILP gets this long; those it stops are solved again with the full limit
# afterwards, best bound first, while the whole search has spent less than SECOND_PASS_UNTIL_S.
FIRST_PASS_LIMIT_S = 0.4
SECOND_PASS_UNTIL_S = 4.0
# The search stops proving improvements smaller than this share of the best step time: a
# candidate whose lower bound is within it of the best plan is not solved, and MILPs run with
# the best time less this share as their cutoff. The plan's solver.gap then says at most this
# much (a cost model is not that accurate; proving the last 0.1% took most of the time).
SEARCH_REL_TOL = 1e-3
# What --offload auto may choose: FSDP2's CPUOffloadPolicy moves parameters, gradients and
# optimizer states together; optimizer-only offload (ZeRO-Offload) is priced when pinned, and
# the runtime says it cannot apply it.
AUTO_OFFLOAD = ("none", "optimizer+params")
SEED_CANDIDATES = 8


@dataclass
class Candidate:
    pp: int
    dp: int
    tp: int
    micro_batch_size: int
    schedule: str
    virtual_stages: int
    zero: int
    ep: int = 1
    cp: int = 1
    bound: float = 0.0
    status: str = "pending"  # solved | infeasible | pruned-bound | pruned-memory | dominated
    reason: str = ""
    config: Config | None = None
    cost: StepCost | None = None
    milp_objective: float = math.inf
    solve_time_s: float = 0.0
    min_memory: float = 0.0  # lower bound of peak memory (for infeasibility messages)
    gap: float = 0.0  # relative MILP gap when a time limit stopped the solve

    @property
    def mesh_key(self) -> tuple[int, int, int]:
        return (self.pp, self.dp, self.tp)

    @property
    def key(self) -> tuple[int, int, int, int]:
        """What its block options are priced for: (TP degree, micro-batch, EP and CP degrees)."""
        return (self.tp, self.micro_batch_size, self.ep, self.cp)

    @property
    def mesh(self) -> Mesh:
        return Mesh(self.pp, self.dp, self.tp, self.ep, self.cp)

    def label(self) -> str:
        sched = self.schedule if self.pp > 1 else "no pipeline"
        if self.schedule == "interleaved_1f1b" and self.pp > 1:
            sched = f"interleaved 1F1B x{self.virtual_stages}"
        ep = f" ep{self.ep}" if self.ep > 1 else ""
        cp = f" cp{self.cp}" if self.cp > 1 else ""
        return (
            f"pp{self.pp} dp{self.dp}{ep}{cp} tp{self.tp}, micro-batch {self.micro_batch_size}, "
            f"{sched}, ZeRO-{self.zero}"
        )


@dataclass
class SearchResult:
    best: Candidate | None
    candidates: list[Candidate]
    inputs: dict[tuple[int, int, int, int], CostInputs]  # Candidate.key -> priced options
    solve_time_s: float
    total: int = 0
    solved: int = 0
    notes: list[str] = field(default_factory=list)
    gap: float = 0.0  # how far the best plan may be from the optimum (0: proven optimal)


# --------------------------------------------------------------------------- enumeration


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def expert_counts(blocks: list[Block]) -> list[int]:
    """The expert count of every mixture-of-experts layer (none for a dense model)."""
    return sorted({b.extra["moe"]["num_experts"] for b in blocks if b.extra.get("moe")})


def ep_degrees(blocks: list[Block], dp: int, pins: Pins) -> list[int]:
    """Expert-parallel degrees for a data-parallel degree: divisors of dp that divide every
    mixture-of-experts layer's expert count (1 alone for a model without experts)."""
    counts = expert_counts(blocks)
    if not counts:
        return [1]
    found = [e for e in divisors(dp) if all(c % e == 0 for c in counts)]
    if pins.ep:
        found = [e for e in found if e == pins.ep]
    return found


def cp_degrees(sequence: int, room: int, pins: Pins) -> list[int]:
    """Context-parallel degrees: divisors of the devices left after TP and PP that split the
    sequence into 2 * cp equal chunks (causal load balancing gives each rank two); 1 alone for
    a model whose attention is not one fused attention op per layer (``sequence`` 0)."""
    found = [c for c in divisors(room) if c == 1 or (sequence and sequence % (2 * c) == 0)]
    if pins.cp:
        found = [c for c in found if c == pins.cp]
    return found


def _cp_dominated(gbs: int, dp: int, cp: int, mbs: int, pins: Pins) -> bool:
    """Whether data parallelism does the same work with no ring: dp * cp replicas of
    micro-batch mbs / cp give each rank the same tokens, the same micro-batch count, the same
    activations and the same gradient reduction, without the key/value ring, so the cost
    model prices that candidate no slower. Then the context-parallel one is left out (unless
    the user pinned what makes the two differ)."""
    if pins.cp or pins.dp or pins.micro_batch_size:
        return False
    return mbs % cp == 0 and gbs % (dp * cp) == 0


def enumerate_candidates(
    gpus: int,
    n_blocks: int,
    training: Training,
    pins: Pins,
    tp_degrees: list[int],
    blocks: list[Block] | None = None,
    sequence: int = 0,
) -> list[Candidate]:
    gbs = training.global_batch_size
    moe = bool(expert_counts(blocks or []))
    meshes = [
        (tp, pp, cp)
        for tp in tp_degrees
        for pp in divisors(gpus // tp)
        # experts spread over dp ranks, which context parallelism would regroup
        for cp in ([1] if moe else cp_degrees(sequence, gpus // (tp * pp), pins))
    ]
    out: list[Candidate] = []
    for tp, pp, cp in meshes:
        if (pins.tp and tp != pins.tp) or pp > n_blocks or (pins.pp and pp != pins.pp):
            continue
        dp = gpus // (tp * pp * cp)
        if (pins.dp and dp != pins.dp) or gbs % dp:
            continue
        per_replica = gbs // dp
        for mbs in divisors(per_replica):
            if pins.micro_batch_size and mbs != pins.micro_batch_size:
                continue
            if cp > 1 and _cp_dominated(gbs, dp, cp, mbs, pins):
                continue
            m = per_replica // mbs
            for schedule, v in _schedules(pp, m, n_blocks, pins):
                for zero in range(4) if dp * cp > 1 else (0,):
                    if pins.zero is not None and zero != pins.zero:
                        continue
                    if zero == 1 and (tp > 1 or pp > 1) and pins.zero != 1:
                        continue  # the runtime has no ZeRO-1 for DTensors or pipeline stages
                    for ep in ep_degrees(blocks or [], dp, pins):
                        out.append(Candidate(pp, dp, tp, mbs, schedule, v, zero, ep, cp))
    return out


def _schedules(pp: int, m: int, n_blocks: int, pins: Pins) -> list[tuple[str, int]]:
    if pp == 1:
        if pins.schedule and pins.schedule != "1f1b":
            return [(pins.schedule, 1)] if pins.schedule == "gpipe" else []
        return [("1f1b", 1)]
    # torch's Schedule1F1B needs at least as many micro-batches as stages; with fewer, 1F1B
    # has no steady state and runs as GPipe does (same time and in-flight activations).
    found = [("gpipe", 1)] + ([("1f1b", 1)] if m >= pp else [])
    for v in INTERLEAVE:
        if pp * v <= n_blocks and m % pp == 0:
            found.append(("interleaved_1f1b", v))
    if pins.schedule:
        found = [(s, v) for s, v in found if s == pins.schedule]
    if pins.virtual_stages:
        found = [(s, v) for s, v in found if v == pins.virtual_stages]
    return found


# --------------------------------------------------------------------------- options


def price_options(
    graph,
    blocks: list[Block],
    tp: int,
    mbs: int,
    cluster: Cluster,
    training: Training,
    pins: Pins,
    variants_of: Callable[[Block, int], list],
    ep: int = 1,
    cp: int = 1,
) -> list[list[BlockOption]]:
    """Options per block (shared by blocks of one class), filtered by the user's pins."""
    tp_ranks = list(range(tp))
    ep_ranks = Mesh(1, ep, tp, ep).ep_group(0)
    cp_ranks = Mesh(1, 1, tp, 1, cp).cp_group(0)
    by_class: dict[str, list[BlockOption]] = {}
    result = []
    # Priced options are memoized on the graph: the baselines search the same space again.
    memo = graph.graph.setdefault("_priced_options", {})
    for blk in blocks:
        if blk.cls not in by_class:
            key = (blk.cls, tp, mbs, ep, cp, id(variants_of), id(cluster), training)
            if key not in memo:  # the value holds what the ids name, so no id is reused
                memo[key] = (
                    (variants_of, cluster),
                    block_options(
                        graph,
                        blk,
                        variants_of(blk, tp),
                        mbs,
                        cluster,
                        tp_ranks,
                        training,
                        ep_ranks=ep_ranks,
                        cp_ranks=cp_ranks,
                    ),
                )
            by_class[blk.cls] = _filter(memo[key][1], pins)
        result.append(by_class[blk.cls])
    return result


def _filter(opts: list[BlockOption], pins: Pins) -> list[BlockOption]:
    keep = opts
    if pins.recompute != "auto":
        wanted = [o for o in keep if o.recompute == pins.recompute]
        keep = wanted or [o for o in keep if o.recompute == "none"]
    if pins.offload != "auto":
        wanted = [o for o in keep if o.offload == pins.offload]
        keep = wanted or [o for o in keep if o.offload == "none"]
    else:  # optimizer-only offload has no torch.distributed implementation to run it with
        keep = [o for o in keep if o.offload in AUTO_OFFLOAD]
    return keep


# --------------------------------------------------------------------------- one candidate


def segments(blocks: list[Block]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive blocks of one class: (first index, length)."""
    runs: list[tuple[int, int]] = []
    for i, b in enumerate(blocks):
        if runs and blocks[runs[-1][0]].cls == b.cls:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def _affine(kind: str, cluster: Cluster, ranks: list[int], bytes_per_param: float):
    """A collective's time as (seconds per parameter, latency): exact for the ring model."""
    x = 1e9
    t1 = collective_time(kind, x * bytes_per_param, cluster, ranks)
    t2 = collective_time(kind, 2 * x * bytes_per_param, cluster, ranks)
    slope = (t2 - t1) / x
    return slope, t1 - slope * x


def stage_problem(inp: CostInputs, cand: Candidate) -> StageProblem:
    """The MILP's numbers for one candidate, each computed by the cost model's own functions."""
    mesh = cand.mesh
    tr = inp.training
    m = num_microbatches(tr, cand.dp, cand.micro_batch_size)
    p, v = cand.pp, cand.virtual_stages
    J = p * v
    config = Config(mesh, cand.micro_batch_size, cand.schedule, v, cand.zero, [], [])
    deferred = deferred_reduce(config, tr)
    segs = segments(inp.blocks)
    cols: dict[str, list[np.ndarray]] = {k: [] for k in StageProblem.__annotations__}
    for first, _ in segs:
        opts = inp.options[first]
        sm = [option_states(o, cand.zero, mesh.replicas, tr, deferred) for o in opts]
        wb = tr.state_bytes[0]
        cols["time"].append(np.array([o.time_s for o in opts]))
        cols["fwd"].append(np.array([o.fwd_s for o in opts]))
        cols["bwd"].append(np.array([o.bwd_s for o in opts]))
        cols["state"].append(np.array([x["params"] + x["grads"] + x["optimizer"] for x in sm]))
        cols["host"].append(np.array([x["host"] for x in sm]))
        cols["act"].append(np.array([o.act_bytes for o in opts]))
        cols["ws"].append(np.array([o.transient_bytes + o.recompute_peak_bytes for o in opts]))
        cols["gather"].append(
            np.array(
                [
                    2 * o.params * wb if (cand.zero >= 3 or o.offload == "optimizer+params") else 0
                    for o in opts
                ]
            )
        )
        cols["optim"].append(np.array([optimizer_time(inp, [o], config) for o in opts]))
        cols["offl"].append(np.array([offload_time(inp, [o], config, m) for o in opts]))
        cols["pbytes"].append(np.array([o.comm_params(mesh.replicas) for o in opts]))
        cols["dense"].append(np.array([o.dense_params for o in opts]))
    from planner.costmodel import other_memory, stage_time_parts

    # What a stage costs per micro-batch besides its blocks: its point-to-point hops, and on
    # the last stage the loss (stage_time_parts of no blocks).
    const_time = [sum(stage_time_parts(inp, [], config, j)) for j in range(J)]
    last_rank = (J - 1) % p
    const_mem = [other_memory(inp, [], config, r, last=(r == last_rank)) for r in range(p)]
    wb, gb, _ = tr.state_bytes
    dp_ranks = mesh.dp_group(0)
    profile = inp.cluster.profile
    return StageProblem(
        pp=p,
        v=v,
        m=m,
        seg_len=[n for _, n in segs],
        time=cols["time"],
        fwd=cols["fwd"],
        bwd=cols["bwd"],
        state=cols["state"],
        host=cols["host"],
        act=cols["act"],
        ws=cols["ws"],
        gather=cols["gather"],
        optim=cols["optim"],
        offl=cols["offl"],
        pbytes=cols["pbytes"],
        dense=cols["dense"],
        allowed=[
            np.array([offload_allowed(o.offload, cand.zero) for o in inp.options[first]])
            for first, _ in segs
        ],
        has_params=[inp.blocks[first].params > 0 for first, _ in segs],
        const_time=const_time,
        inflight=[inflight_microbatches(cand.schedule, m, p, v, j % p) for j in range(J)],
        const_mem=const_mem,
        capacity=profile.memory_bytes * inp.memory_fraction,
        host_capacity=profile.host_memory_bytes / max(profile.gpus_per_node, 1),
        zero=cand.zero,
        deferred=deferred,
        dp_ar=_affine("all_reduce", inp.cluster, dp_ranks, gb),
        dp_rs=_affine("reduce_scatter", inp.cluster, dp_ranks, gb),
        dp_ag=_affine("all_gather", inp.cluster, dp_ranks, wb),
        comm_overlap=profile.comm_overlap,
        fsdp_unit_overhead=profile.fsdp_unit_overhead,
        dp=mesh.replicas,
    )


def config_from_counts(inp: CostInputs, cand: Candidate, counts) -> Config:
    segs = segments(inp.blocks)
    stage_of = [0] * len(inp.blocks)
    choice = [0] * len(inp.blocks)
    next_block = [first for first, _ in segs]
    for j, per_seg in enumerate(counts):
        for s, per_opt in enumerate(per_seg):
            for o, k in enumerate(per_opt):
                for _ in range(k):
                    i = next_block[s]
                    stage_of[i], choice[i] = j, o
                    next_block[s] += 1
    mesh = cand.mesh
    return Config(
        mesh, cand.micro_batch_size, cand.schedule, cand.virtual_stages, cand.zero, stage_of, choice
    )


def _min_device_bytes(inp: CostInputs, zero: int, dp: int) -> float:
    """Sum over blocks of the least device memory (states + one micro-batch's activations) any
    allowed option needs; memoized on ``inp`` since hundreds of candidates share (zero, dp)."""
    memo = inp.__dict__.setdefault("_min_device_bytes", {})
    if (zero, dp) not in memo:
        per_list: dict[int, float] = {}
        total = 0.0
        for opts in inp.options:
            if id(opts) not in per_list:
                per_list[id(opts)] = min(
                    (
                        sum(
                            v_
                            for k, v_ in option_states(o, zero, dp, inp.training).items()
                            if k != "host"
                        )
                        + o.act_bytes
                        for o in opts
                        if offload_allowed(o.offload, zero)
                    ),
                    default=math.inf,
                )
            total += per_list[id(opts)]
        memo[(zero, dp)] = total
    return memo[(zero, dp)]


def lower_bounds(inp: CostInputs, cand: Candidate) -> tuple[float, float]:
    """(step-time bound, peak-memory bound) without building a MILP."""
    m = num_microbatches(inp.training, cand.dp, cand.micro_batch_size)
    p, v = cand.pp, cand.virtual_stages
    total = sum(min(o.time_s for o in opts) for opts in inp.options)
    if v == 1:
        time_bound = total * (1 + (m - 1) / p)
    else:
        time_bound = m * total / p + (p - 1) * total / (p * v)
    replicas = cand.mesh.replicas
    mem_bound = _min_device_bytes(inp, cand.zero, replicas) / p + inp.cluster.profile.reserved_bytes
    return time_bound, mem_bound


def relaxed_bound(sp: StageProblem, bound: float) -> float:
    """A stronger step-time bound, or inf when no placement can fit at all: the LP relaxation
    of the stage MILP (fractional block counts per stage and option, per-rank memory with each
    stage's in-flight micro-batches, the pipeline objective) without the ordering constraints,
    the working-set terms and the DP exposure, which are all >= 0. Granularity cuts add what
    integrality forces: a segment of L blocks over J stages (p ranks) puts ceil(L / J)
    (ceil(L / p)) of them on one stage (rank). Every MILP solution is feasible here, so the LP
    optimum is a valid lower bound, and costs milliseconds."""
    from scipy.sparse import coo_matrix

    p, v, m = sp.pp, sp.v, sp.m
    J = p * v
    cat = np.concatenate
    time_k, optim_k, offl_k = cat(sp.time), cat(sp.optim), cat(sp.offl)
    state_k, act_k, host_k = cat(sp.state) / GIB, cat(sp.act) / GIB, cat(sp.host) / GIB
    K = len(time_k)
    seg_of = np.repeat(np.arange(len(sp.seg_len)), [len(t) for t in sp.time])
    allowed = np.ones(K, bool) if sp.allowed is None else cat(sp.allowed).astype(bool)
    nv = J * K  # n[j, k] at j * K + k, then T_j, tmax, rmax, opt, off
    iT, itmax, irmax, iopt, ioff = nv, nv + J, nv + J + 1, nv + J + 2, nv + J + 3
    nx = nv + J + 4
    js = np.arange(J)
    rank_of = js % p
    ncol = js[:, None] * K + np.arange(K)[None, :]  # (J, K) column of n[j, k]
    hop = min(sp.const_time) if sp.const_time else 0.0
    inflight = np.asarray(sp.inflight, dtype=float)[:, None]
    # Row blocks: [0, J) T_j <= tmax; [J, 2J) nonempty; then per rank r: rmax, memory, host,
    # optimizer, offload at 2J + 5r + (0..4).
    base = 2 * J + 5 * rank_of  # (J,) first rank row of each stage's rank
    parts = [
        (js, iT + js, np.ones(J)),
        (js, np.full(J, itmax), -np.ones(J)),
        (np.repeat(J + js, K), ncol.ravel(), -np.ones(J * K)),
        (base, iT + js, np.ones(J)),
        (2 * J + 5 * np.arange(p), np.full(p, irmax), -np.ones(p)),
        (np.repeat(base + 1, K), ncol.ravel(), (state_k[None, :] + inflight * act_k).ravel()),
        (np.repeat(base + 2, K), ncol.ravel(), np.tile(host_k, J)),
        (np.repeat(base + 3, K), ncol.ravel(), np.tile(optim_k, J)),
        (2 * J + 5 * np.arange(p) + 3, np.full(p, iopt), -np.ones(p)),
        (np.repeat(base + 4, K), ncol.ravel(), np.tile(offl_k, J)),
        (2 * J + 5 * np.arange(p) + 4, np.full(p, ioff), -np.ones(p)),
    ]
    n_rows = 2 * J + 5 * p
    b_ub = np.zeros(n_rows)
    b_ub[J : 2 * J] = -1.0
    ranks = np.arange(p)
    b_ub[2 * J + 5 * ranks + 1] = (sp.capacity - np.asarray(sp.const_mem, dtype=float)) / GIB
    b_ub[2 * J + 5 * ranks + 2] = sp.host_capacity / GIB
    a_ub = coo_matrix(
        (
            np.concatenate([v_ for _, _, v_ in parts]),
            (np.concatenate([r for r, _, _ in parts]), np.concatenate([c_ for _, c_, _ in parts])),
        ),
        shape=(n_rows, nx),
    ).tocsr()
    # Equalities: each segment placed once; T_j = n_j . time + const_j.
    S = len(sp.seg_len)
    eq = [
        (np.repeat(seg_of[None, :], J, axis=0).ravel(), ncol.ravel(), np.ones(J * K)),
        (np.repeat(S + js, K), ncol.ravel(), np.tile(-time_k, J)),
        (S + js, iT + js, np.ones(J)),
    ]
    a_eq = coo_matrix(
        (
            np.concatenate([v_ for _, _, v_ in eq]),
            (np.concatenate([r for r, _, _ in eq]), np.concatenate([c_ for _, c_, _ in eq])),
        ),
        shape=(S + J, nx),
    ).tocsr()
    b_eq = np.concatenate(
        [np.asarray(sp.seg_len, dtype=float), np.asarray(sp.const_time, dtype=float)]
    )
    c = np.zeros(nx)
    if v == 1:
        c[iT : iT + J] = 1.0
        c[itmax] = m - 1.0
    else:
        c[irmax] = float(m)
        c[itmax] = p - 1.0
    c[iopt] = c[ioff] = 1.0
    lower = np.zeros(nx)
    upper = np.full(nx, np.inf)
    upper[:nv] = np.where(np.tile(allowed, J), np.inf, 0.0)
    lower[itmax] = _granular(sp, sp.time, J) + hop
    lower[irmax] = _granular(sp, sp.time, p) + v * hop
    lower[iopt] = _granular(sp, sp.optim, p)
    lower[ioff] = _granular(sp, sp.offl, p)
    status, value = _solve_lp(c, a_ub, b_ub, a_eq, b_eq, lower, upper)
    if status == "infeasible":
        return math.inf
    if status != "optimal":
        return bound
    return max(bound, value)


def _quiet_highs():
    """A silent highspy.Highs. HiGHS prints its banner from C++ to the process's stdout when
    the first instance is built, before any option can turn output off, and that line would
    land in the middle of ``plan``'s output: the first construction runs with fd 1 muted."""
    import highspy

    if not _HIGHS_BANNER_DONE:
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)
                h = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        _HIGHS_BANNER_DONE.append(True)
    else:
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    return h


_HIGHS_BANNER_DONE: list[bool] = []


def _solve_lp(c, a_ub, b_ub, a_eq, b_eq, lower, upper) -> tuple[str, float]:
    """min c.x s.t. a_ub x <= b_ub, a_eq x = b_eq, lower <= x <= upper, straight through
    highspy: scipy's linprog wrapper costs as much as the solve on these small LPs, and the
    search runs hundreds of them."""
    import highspy
    from scipy.sparse import vstack

    a = vstack([a_ub, a_eq]).tocsc()
    h = _quiet_highs()
    h.setOptionValue("presolve", "off")  # a third faster on these small LPs, same optimum
    inf = highspy.kHighsInf
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = a.shape[1], a.shape[0]
    lp.col_cost_ = np.asarray(c, dtype=float)
    lp.col_lower_ = np.asarray(lower, dtype=float)
    lp.col_upper_ = np.where(np.isinf(upper), inf, upper).astype(float)
    lp.row_lower_ = np.concatenate([np.full(len(b_ub), -inf), np.asarray(b_eq, dtype=float)])
    lp.row_upper_ = np.concatenate([np.asarray(b_ub, dtype=float), np.asarray(b_eq, dtype=float)])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = a.indptr
    lp.a_matrix_.index_ = a.indices
    lp.a_matrix_.value_ = a.data
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = a.shape[1], a.shape[0]
    h.passModel(lp)
    h.run()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kOptimal:
        return "optimal", float(h.getInfo().objective_function_value)
    if status == highspy.HighsModelStatus.kInfeasible:
        return "infeasible", math.inf
    return "other", math.nan


def _least(sp: StageProblem, per: list[np.ndarray], s: int) -> float:
    allowed = per[s] if sp.allowed is None else per[s][sp.allowed[s]]
    return float(allowed.min()) if len(allowed) else math.inf


def _granular(sp: StageProblem, per: list[np.ndarray], parts: int) -> float:
    """max over segments of ceil(L_s / parts) times the segment's least per-block value."""
    return max((-(-length // parts)) * _least(sp, per, s) for s, length in enumerate(sp.seg_len))


def solve_candidate(
    inp: CostInputs, cand: Candidate, cutoff: float | None = None, time_limit_s: float = 60.0
) -> None:
    sp = stage_problem(inp, cand)
    start = time.perf_counter()
    sol = solve_stage_milp(sp, time_limit_s=time_limit_s, cutoff=cutoff)
    cand.solve_time_s = time.perf_counter() - start
    if sol.status == "cutoff":
        cand.status = "pruned-bound"
        cand.reason = f"its MILP proves no placement beats the best plan's {cutoff:.4g} s"
        return
    if sol.status == "no_solution":
        cand.status = "unresolved"
        if math.isfinite(sol.dual_bound):
            cand.bound = max(cand.bound, sol.dual_bound)
        cand.reason = f"no placement found within the {time_limit_s:g} s MILP time limit"
        return
    if sol.status not in ("optimal", "time_limit"):
        cand.status = "infeasible"
        cand.reason = "does not fit in memory with any placement and options"
        return
    cand.config = config_from_counts(inp, cand, sol.counts)
    cand.cost = evaluate(inp, cand.config)
    cand.milp_objective = sol.objective
    cand.status = "solved"
    if sol.status == "time_limit" and math.isfinite(sol.dual_bound):
        # The incumbent's auxiliary variables (max terms) may be loose at a time limit: the
        # cost model's own evaluation of its placement is the true step time.
        t = cand.cost.step_time_s
        cand.gap = max(0.0, (t - sol.dual_bound) / t) if t > 0 else 0.0
        cand.bound = max(cand.bound, sol.dual_bound)


# --------------------------------------------------------------------------- the search


def search(
    graph,
    blocks: list[Block],
    cluster: Cluster,
    training: Training,
    pins: Pins,
    variants_of: Callable[[Block, int], list],
    progress: Callable[..., None] | None = None,
    time_limit_s: float = MILP_TIME_LIMIT_S,
) -> SearchResult:
    """``search_space`` without context parallelism first, then, when nothing fits, with it
    (or with it at once when ``--cp`` pins a degree).

    Context parallelism is for sequences whose activations do not fit: elsewhere the cost
    model prices a context-parallel plan like data parallelism over a fraction of a sample
    (each rank the same tokens, activations and gradient reduction, plus the key/value ring),
    an equivalence real kernels break at small per-rank token counts; and the larger space
    costs seconds of solving at scale."""
    if pins.cp is None and attention_sequence(graph):
        first = search_space(
            graph,
            blocks,
            cluster,
            training,
            replace(pins, cp=1),
            variants_of,
            progress,
            time_limit_s,
        )
        if first.best is not None:
            return first
    return search_space(graph, blocks, cluster, training, pins, variants_of, progress, time_limit_s)


def search_space(
    graph,
    blocks: list[Block],
    cluster: Cluster,
    training: Training,
    pins: Pins,
    variants_of: Callable[[Block, int], list],
    progress: Callable[..., None] | None = None,
    time_limit_s: float = MILP_TIME_LIMIT_S,
) -> SearchResult:
    """Every candidate, cheapest bound first; each is pruned by its bounds or solved exactly.
    A MILP that hits ``time_limit_s`` keeps its best placement and its proven bound, and the
    result's ``gap`` says how far from optimal the returned plan can be (0 = proven optimal)."""
    start = time.perf_counter()
    _quiet_highs()  # before cvxpy builds its first HiGHS instance
    gpus = cluster.gpus
    tp_degrees = [t for t in divisors(gpus) if _tp_useful(graph, blocks, t, variants_of)]
    _check_ep_pin(blocks, pins)
    sequence = attention_sequence(graph)
    if pins.cp and pins.cp > 1 and not sequence:
        raise UserInputError(
            f"--cp {pins.cp}: context parallelism splits attention computed by fused attention "
            "ops (scaled_dot_product_attention); this model computes its attention with plain "
            "matrix products and softmax: drop --cp"
        )
    cands = enumerate_candidates(gpus, len(blocks), training, pins, tp_degrees, blocks, sequence)
    if not cands:
        raise UserInputError(_no_candidate_message(gpus, training, pins, tp_degrees))
    traced_mbs = int(graph.graph["micro_batch_size"])
    inputs: dict[tuple[int, int, int, int], CostInputs] = {}
    for c in cands:
        key = c.key
        if key not in inputs:
            if progress:
                progress("price", len(inputs), len({d.key for d in cands}))
            opts = price_options(
                graph,
                blocks,
                c.tp,
                c.micro_batch_size,
                cluster,
                training,
                pins,
                variants_of,
                c.ep,
                c.cp,
            )
            inputs[key] = CostInputs(
                blocks, opts, traced_mbs, cluster, training, pins.memory_fraction
            )
        c.bound, c.min_memory = lower_bounds(inputs[key], c)
    capacity = cluster.profile.memory_bytes * pins.memory_fraction
    for c in cands:
        m = num_microbatches(training, c.dp, c.micro_batch_size)
        if c.schedule == "gpipe" and not pins.schedule and c.pp > 1 and m >= c.pp:
            c.status, c.reason = "dominated", "GPipe: same time as 1F1B, more memory"
        elif c.min_memory > capacity:
            c.status, c.reason = "pruned-memory", "model states alone exceed memory"
    order = sorted(
        (c for c in cands if c.status == "pending"),
        key=lambda c: (c.bound, c.pp, c.tp, -c.micro_batch_size, c.zero, c.virtual_stages, c.ep),
    )
    # Seed the incumbent with the cheapest MILPs first (no pipeline: one stage, milliseconds),
    # so the many-stage MILPs that follow meet a tight cutoff. Order never changes the optimum.
    seeds = [c for c in order if c.pp * c.virtual_stages == 1][:SEED_CANDIDATES]
    order = seeds + [c for c in order if c not in seeds]
    best: Candidate | None = None
    done = 0
    band: list[float] = []  # bounds of what the tolerance left unproven

    def solve(c: Candidate, limit: float) -> None:
        """The candidate's MILP under the best plan's cutoff less the tolerance."""
        cutoff = best.cost.step_time_s * (1 - SEARCH_REL_TOL) if best is not None else None
        solve_candidate(inputs[c.key], c, cutoff=cutoff, time_limit_s=limit)
        if c.status == "pruned-bound":  # no placement under the cutoff; one within it may be
            band.append(max(c.bound, cutoff))

    for i, c in enumerate(order):
        if progress:
            progress("solve", done, len(cands), pruned=len(cands) - len(order) + i - done)
        if best is not None and _beaten(c, best, band):
            _prune_by_bound(c, best)
            continue
        inp = inputs[c.key]
        c.bound = relaxed_bound(stage_problem(inp, c), c.bound)
        if c.bound == math.inf:
            c.status = "pruned-memory"
            c.reason = "even split fractionally over the ranks, the model does not fit in memory"
            continue
        if best is not None and _beaten(c, best, band):
            _prune_by_bound(c, best)
            continue
        solve(c, min(time_limit_s, FIRST_PASS_LIMIT_S))
        done += 1
        if c.status == "solved" and c.tp > 1 and not pins.tp and _tp_unused(inputs, c):
            c.status = "dominated"
            c.reason = f"TP degree {c.tp} shards no block: {c.tp} devices repeat the same work"
        if c.status == "solved":
            if c.cost.feasible and (best is None or _better(c, best)):
                best = c
    # Second pass: the MILPs the first pass stopped, again with the full limit, most promising
    # first, while time allows; what stays open is in the gap.
    stopped = sorted(
        (c for c in cands if c.status == "unresolved" or (c.status == "solved" and c.gap > 0)),
        key=lambda c: c.bound,
    )
    for c in stopped:
        if time.perf_counter() - start > SECOND_PASS_UNTIL_S or time_limit_s <= FIRST_PASS_LIMIT_S:
            break
        if c is best:  # the incumbent keeps its placement; its proven bound is in the gap
            continue
        if best is not None and _beaten(c, best, band):
            if c.status == "unresolved":
                _prune_by_bound(c, best)
            continue
        solve(c, time_limit_s)
        if c.status == "solved" and c.cost.feasible and (best is None or _better(c, best)):
            best = c
    if best is not None:
        prefer_simpler(inputs[best.key], best)
    elapsed = time.perf_counter() - start
    gap = 0.0
    if best is not None:
        t = best.cost.step_time_s
        open_bounds = band + [
            c.bound
            for c in cands
            if c.status == "unresolved" or (c.status == "solved" and c.gap > 0)
        ]
        if open_bounds and min(open_bounds) < t:
            gap = (t - min(open_bounds)) / t
    return SearchResult(
        best=best,
        candidates=cands,
        inputs=inputs,
        solve_time_s=elapsed,
        total=len(cands),
        solved=done,
        gap=gap,
    )


def prefer_simpler(inp: CostInputs, cand: Candidate) -> None:
    """On ties, run blocks without recompute or offload: for each (stage, option) group of
    blocks, switch them to the same TP variant with less recompute and offload when the cost
    model says the step is no slower and it still fits. The step time never grows, so an
    optimal plan stays optimal; it only stops recomputing when recomputing gains nothing."""
    rank = {"none": 0, "selective": 1, "full": 2, "optimizer": 1, "optimizer+params": 2}
    cfg = cand.config
    groups = sorted({(cfg.stage_of[i], k) for i, k in enumerate(cfg.choice)})
    for stage, k in groups:
        members = [i for i, kk in enumerate(cfg.choice) if kk == k and cfg.stage_of[i] == stage]
        opts = inp.options[members[0]]
        cur = opts[k]
        simpler = sorted(
            (
                j
                for j, o in enumerate(opts)
                if o.variant == cur.variant
                and rank[o.recompute] + rank[o.offload] < rank[cur.recompute] + rank[cur.offload]
                and offload_allowed(o.offload, cfg.zero_stage)
            ),
            key=lambda j: (rank[opts[j].recompute] + rank[opts[j].offload], j),
        )
        for j in simpler:
            choice = list(cfg.choice)
            for i in members:
                choice[i] = j
            trial = Config(
                cfg.mesh,
                cfg.micro_batch_size,
                cfg.schedule,
                cfg.virtual_stages,
                cfg.zero_stage,
                cfg.stage_of,
                choice,
            )
            cost = evaluate(inp, trial)
            if cost.feasible and cost.step_time_s <= cand.cost.step_time_s:
                cand.config, cand.cost, cfg = trial, cost, trial
                break


def _tp_unused(inputs: dict, c: Candidate) -> bool:
    """Every block runs its replicated variant: the TP group computes the same thing tp times,
    which the cost model prices as free of communication, so it can look fast on tiny models."""
    opts = inputs[c.key].options
    return all(opts[i][k].variant == "replicated" for i, k in enumerate(c.config.choice))


def _better(a: Candidate, b: Candidate) -> bool:
    """Strictly faster, ties broken deterministically (less memory, then simpler mesh)."""
    ka = (a.cost.step_time_s, a.cost.peak_memory_bytes, a.pp, a.tp, a.zero, a.ep, a.cp)
    kb = (b.cost.step_time_s, b.cost.peak_memory_bytes, b.pp, b.tp, b.zero, b.ep, b.cp)
    return ka < kb


def _tp_useful(graph, blocks: list[Block], tp: int, variants_of) -> bool:
    if tp == 1:
        return True
    for blk in {b.cls: b for b in blocks}.values():
        if any(v.name != "replicated" for v in variants_of(blk, tp)):
            return True
    return False


def _beaten(c: Candidate, best: Candidate, band: list[float]) -> bool:
    """Whether ``c``'s lower bound leaves it no room to beat ``best`` by more than the search
    tolerance; a bound inside the tolerance goes to ``band`` (the reported gap)."""
    t = best.cost.step_time_s
    if c.bound >= t:
        return True
    if c.bound >= t * (1 - SEARCH_REL_TOL):
        band.append(c.bound)
        return True
    return False


def _prune_by_bound(c: Candidate, best: Candidate) -> None:
    c.status = "pruned-bound"
    c.reason = (
        f"lower bound {c.bound:.4g} s is no better than the best plan's "
        f"{best.cost.step_time_s:.4g} s"
    )


def attention_sequence(graph) -> int:
    """The sequence length context parallelism would split: that of the model's fused attention
    ops, when every attention is one (a matrix product of two activations elsewhere would see
    only a chunk of the sequence), else 0."""
    from planner.blocks import cached_core_nodes
    from planner.opcost import ATTENTION_OPS, MATMUL_OPS

    lengths = {
        graph.nodes[n]["shapes"][0][-2]
        for n in graph.nodes
        if graph.nodes[n]["op"] in ATTENTION_OPS and graph.nodes[n].get("shapes")
    }
    if len(lengths) != 1:
        return 0
    if any(graph.nodes[n]["op"] in MATMUL_OPS for n in cached_core_nodes(graph)):
        return 0
    return int(lengths.pop())


def _check_ep_pin(blocks: list[Block], pins: Pins) -> None:
    if not pins.ep or pins.ep == 1:
        return
    counts = expert_counts(blocks)
    if not counts:
        raise UserInputError(
            f"--ep {pins.ep}: the model has no mixture-of-experts layer (no module whose "
            "parameters are stacked per expert) to spread: drop --ep"
        )
    if any(c % pins.ep for c in counts):
        raise UserInputError(
            f"--ep {pins.ep} does not divide the expert count ({', '.join(map(str, counts))}): "
            "choose a divisor of it"
        )


def _no_candidate_message(gpus: int, training: Training, pins: Pins, tps: list[int]) -> str:
    if pins.tp and pins.tp not in tps:
        return (
            f"--tp {pins.tp} cannot shard this model on {gpus} GPUs: it must divide the GPU "
            f"count and the dimensions it shards; possible degrees: {', '.join(map(str, tps))}"
        )
    if pins.dp and training.global_batch_size % pins.dp:
        return (
            f"the global batch {training.global_batch_size} is not divisible by --dp {pins.dp}: "
            "choose a global batch that is a multiple of the data-parallel degree"
        )
    if pins.ep and pins.ep > 1 and (gpus % pins.ep or (pins.dp and pins.dp % pins.ep)):
        return (
            f"--ep {pins.ep} must divide the data-parallel degree (experts are spread over "
            "data-parallel ranks): pin a --dp that it divides, or a smaller --ep"
        )
    fixed = [(k, v) for k, v in (("pp", pins.pp), ("dp", pins.dp), ("tp", pins.tp)) if v]
    product = math.prod(v for _, v in fixed)
    if gpus % product or (len(fixed) == 3 and product != gpus):
        shown = " x ".join(f"--{k} {v}" for k, v in fixed)
        return f"{shown} = {product} devices, which does not fit --gpus {gpus}: make them agree"
    if pins.micro_batch_size and pins.dp:
        per_replica = training.global_batch_size // pins.dp
        if per_replica % pins.micro_batch_size:
            return (
                f"--micro-batch-size {pins.micro_batch_size} does not divide the per-replica "
                f"batch {per_replica} (global {training.global_batch_size} / --dp {pins.dp})"
            )
    return (
        f"no parallel layout of {gpus} GPUs matches the pinned flags and a global batch of "
        f"{training.global_batch_size}: relax --tp/--pp/--dp/--micro-batch-size or change "
        "--global-batch-size"
    )


__all__ = ["OFFLOAD", "RECOMPUTE", "Candidate", "Pins", "SearchResult", "search"]
