"""The heterogeneous search: one pipeline over several device kinds, when it beats every kind
alone.

Outer loop: (pp >= 2, dp, tp, micro-batch, schedule, ZeRO stage), the DP degree and TP degree
the same on every stage (one ``init_device_mesh``), plain 1F1B / GPipe. Each candidate is
priced under every kind (the cost model's own functions, through
``planner.search.problem.stage_problem`` with that kind's cluster), and the mixed-kind MILP
(``mixed_milp``) picks each stage's kind, blocks and options. Candidates go cheapest lower
bound first, the bound being

    step >= (1 + (m - 1) / pp) sum_s L_s min_{k, o} t[k, s, o]

(1F1B / GPipe: sum_j T_j + (m - 1) max_j T_j and max >= mean; every other term is >= 0). The
search starts from the caller's cutoff, the best single-kind step time, so a mixed plan is
returned only when it is faster than every kind alone, and a candidate whose bound is not
below the incumbent is never built.

Pricing a kind's candidate uses one cluster per kind, as many nodes as the largest mesh needs:
ranks fill nodes in order and a stage of g = dp * tp ranks lies inside one node or on whole
nodes (g divides or is a multiple of the node's size, enforced below), so a stage's links are
the same wherever in the pipeline it sits.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from planner.cost.model import (
    Config,
    CostInputs,
    Training,
    num_microbatches,
    sample_share,
    stage_time_parts,
    tied_sync_time,
)
from planner.hardware.cluster import Cluster
from planner.hardware.collectives import p2p_time
from planner.resources.mixed_bound import mixed_split_bound, step_bound
from planner.resources.mixed_milp import MixedProblem, MixedSolution, solve_mixed
from planner.search.bounds import quiet_highs
from planner.search.candidates import Candidate, Pins, divisors
from planner.search.options import price_options
from planner.search.problem import segments, stage_problem
from planner.search.split_bound import SplitBound
from planner.trace.blocks import Block
from planner.trace.graph import pipeline_refusal

# Stop proving improvements smaller than this share of the incumbent (as the homogeneous
# search's SEARCH_REL_TOL): a candidate whose bound is within it is not solved.
REL_TOL = 1e-3


@dataclass(frozen=True)
class Kind:
    """One device kind a mixed job may use: its cluster (profile, GPUs per node) and how many
    of its GPUs the pool holds."""

    name: str
    cluster: Cluster
    gpus: int


@dataclass(frozen=True)
class RunRate:
    """How a placement's GPUs price its step, for a search by another objective than the step
    time: ``per_step_s(gpus)`` is the objective (the run's money, energy, carbon or wall time)
    per second of step time of a placement holding ``gpus[k]`` GPUs of kind k, and
    ``max_step_s(gpus)`` the longest step that placement may take (the deadline and budget;
    inf without them). With a kind's GPUs fixed, the objective is that rate times the step
    time, so the least step time of each GPU count is the least objective of that count."""

    per_step_s: Callable[[list[int]], float]
    max_step_s: Callable[[list[int]], float]


@dataclass
class MixedCandidate:
    """One outer candidate of the mixed search (with each kind's stage count, when the
    search prices GPUs), and its outcome."""

    cand: Candidate
    bound: float  # in the search's objective: step seconds, or the RunRate's units
    # solved | pruned-bound | pruned-memory | cutoff | infeasible | no_solution
    status: str = "pending"
    solution: MixedSolution | None = None
    problem: MixedProblem | None = None
    counts: tuple[int, ...] | None = None  # stages per kind, fixed (RunRate searches)
    value: float = math.inf  # the solved placement's objective


@dataclass
class MixedResult:
    best: MixedCandidate | None
    candidates: list[MixedCandidate]
    inputs: dict[tuple[int, int, int], CostInputs]  # (kind, tp, micro-batch) -> priced options
    kinds: list[Kind]
    solve_time_s: float
    notes: list[str] = field(default_factory=list)

    @property
    def solved(self) -> int:
        return sum(1 for c in self.candidates if c.status == "solved")

    @property
    def proven(self) -> bool:
        """Whether the best is optimal under the cost model (to REL_TOL): its MILP finished,
        and no candidate's MILP stopped at the node limit without settling it."""
        best_ok = self.best is None or (
            self.best.solution is not None and self.best.solution.status == "optimal"
        )
        return best_ok and not any(
            c.status == "no_solution"
            or (c.solution is not None and c.solution.status == "node_limit")
            for c in self.candidates
        )


def hop_times(
    inputs: list[CostInputs], config: Config, links: dict[tuple[int, int], tuple[float, float]]
) -> np.ndarray:
    """(J-1, K, K): the point-to-point hop from stage j to j+1, activations forward and their
    gradient back, as the cost model's stage_time_parts prices it: a kind's own link inside
    one kind, the pool's fabric (bandwidth, latency) between two kinds, and inf where the pool
    has no fabric between them."""
    J, K = config.num_stages, len(inputs)
    hop = np.full((max(J - 1, 0), K, K), np.inf)
    for j in range(J - 1):
        for k, inp in enumerate(inputs):
            hop[j, k, k] = stage_time_parts(inp, [], config, j)[2]
            nbytes = inp.boundary_bytes * sample_share(config) / inp.traced_mbs
            if inp.training.pipeline_sends_shards:
                nbytes /= config.mesh.tp
            for (a, b), (bw, lat) in links.items():
                if a == k:
                    hop[j, a, b] = 2 * p2p_time(nbytes, bw, lat)
    return hop


def mixed_problem(
    inputs: list[CostInputs],
    cand: Candidate,
    kinds: list[Kind],
    links: dict[tuple[int, int], tuple[float, float]],
) -> MixedProblem:
    """The mixed MILP's numbers for one candidate: each kind's StageProblem, the constants a
    stage pays besides its blocks and hop, the hops, and how many stages each kind can hold."""
    per_kind = [stage_problem(inp, cand) for inp in inputs]
    config = Config(cand.mesh, cand.micro_batch_size, cand.schedule, 1, cand.zero, [], [])
    J = cand.pp
    base = np.array(
        [[sum(stage_time_parts(inp, [], config, j)[:2]) for j in range(J)] for inp in inputs]
    )
    width = cand.dp * cand.tp
    hop = hop_times(inputs, config, links)  # inf between kinds with no fabric: forbidden
    return MixedProblem(
        kinds=[k.name for k in kinds],
        per_kind=per_kind,
        base_time=base,
        hop=hop,
        stage_cap=[k.gpus // width for k in kinds],
        const_step=max(tied_sync_time(inp, config) for inp in inputs),
    )


def fits_at_all(mp: MixedProblem) -> bool:
    """A necessary condition for any placement to fit in memory: the blocks' least states and
    activations (each at its least option and kind, activations at the fewest in-flight
    micro-batches of any stage) within the rooms of the pp largest stages the pool can hold
    (each kind's capacity less its least other memory, at most its stage count of them)."""
    fewest = min(mp.per_kind[0].inflight)
    need = 0.0
    for s, length in enumerate(mp.seg_len):
        need += length * min(float(np.min(sp.state[s] + fewest * sp.act[s])) for sp in mp.per_kind)
    rooms = []
    for sp, cap in zip(mp.per_kind, mp.stage_cap, strict=True):
        rooms += [sp.capacity - min(sp.const_mem)] * min(cap, mp.J)
    rooms.sort(reverse=True)
    return len(rooms) >= mp.J and need <= sum(rooms[: mp.J]) * (1 + 1e-9)


def outer_candidates(
    kinds: list[Kind], n_blocks: int, training: Training, tp_degrees: list[int], pins: Pins
) -> list[Candidate]:
    """Every (pp >= 2, dp, tp, micro-batch, schedule, ZeRO) a mixed pipeline may use: at least
    two kinds can each hold a stage, the pool holds pp stages, and a stage lies inside one node
    or on whole nodes of every kind that can hold it."""
    gbs = training.global_batch_size
    out = []
    for tp in tp_degrees:
        for dp in divisors(gbs):
            width = dp * tp
            able = [
                k
                for k in kinds
                if k.gpus >= width
                and (k.cluster.gpus_per_node % width == 0 or width % k.cluster.gpus_per_node == 0)
            ]
            if len(able) < 2:
                continue
            most = sum(k.gpus // width for k in able)
            for pp in range(2, min(n_blocks, most) + 1):
                if pins.pp and pp != pins.pp:
                    continue
                for mbs in divisors(gbs // dp):
                    m = gbs // dp // mbs
                    # With m >= pp, 1F1B holds no more in flight than GPipe at the same time
                    # (inflight_microbatches): GPipe is dominated, left out.
                    for schedule in ("1f1b",) if m >= pp else ("gpipe",):
                        for zero in range(4) if dp > 1 else (0,):
                            if zero == 1:
                                continue  # the runtime has no ZeRO-1 for pipeline stages
                            out.append(Candidate(pp, dp, tp, mbs, schedule, 1, zero))
    return out


def stage_counts(pp: int, caps: list[int]) -> list[tuple[int, ...]]:
    """Every way ``pp`` stages spread over the kinds within their caps, two kinds at least."""
    out: list[tuple[int, ...]] = []

    def extend(prefix: tuple[int, ...], left: int) -> None:
        k = len(prefix)
        if k == len(caps) - 1:
            if left <= caps[k]:
                counts = (*prefix, left)
                if sum(1 for c in counts if c) >= 2:
                    out.append(counts)
            return
        for c in range(min(left, caps[k]) + 1):
            extend((*prefix, c), left - c)

    extend((), pp)
    return out


def search_mixed(
    graph,
    blocks: list[Block],
    training: Training,
    kinds: list[Kind],
    links: dict[tuple[int, int], tuple[float, float]],
    variants: list[Callable[[Block, int], list]],
    cutoff: float = math.inf,
    pins: Pins | None = None,
    progress: Callable[[str], None] | None = None,
    rate: RunRate | None = None,
) -> MixedResult:
    """The fastest mixed pipeline faster than ``cutoff`` (the best single-kind step time), or
    ``best`` None when none is. ``links``: (kind a, kind b) -> (bandwidth B/s, latency s) of
    the fabric, both orders. ``variants``: per kind, the intra-block sharding variants.

    With ``rate``, the least objective instead (``cutoff`` in its units: the best single-kind
    option's): each candidate is split by how many stages each kind runs (``stage_counts``),
    which fixes its GPUs, and so its objective per step-second; the MILP, with those counts
    fixed, finds the least step time of each, within the placement's longest step."""
    start = time.perf_counter()
    quiet_highs()
    pins = pins or Pins(offload="none")
    traced_mbs = int(graph.graph["micro_batch_size"])
    tp_degrees = [t for t in (1, 2, 4, 8) if all(t <= k.cluster.gpus_per_node for k in kinds)]
    # torch's pipelining runs stages as the exported graph: where there is none (a
    # module-level trace) or it drops a backward of the model's own, no pipeline would run
    runnable = not pipeline_refusal(graph)
    cands = outer_candidates(kinds, len(blocks), training, tp_degrees, pins) if runnable else []
    inputs: dict[tuple[int, int, int], CostInputs] = {}
    priced: dict = {}

    def inputs_of(k: int, tp: int, mbs: int) -> CostInputs:
        key = (k, tp, mbs)
        if key not in inputs:
            cl = kinds[k].cluster
            opts = price_options(
                graph, blocks, tp, mbs, cl, training, pins, variants[k], 1, 1, priced
            )
            inputs[key] = CostInputs(blocks, opts, traced_mbs, cl, training, pins.memory_fraction)
        return inputs[key]

    segs = segments(blocks)
    fastest: dict[tuple[int, int], float] = {}

    def block_floor(tp: int, mbs: int) -> float:
        """sum_s L_s min_{k,o} t[k,s,o]: no placement's stages add up to less."""
        if (tp, mbs) not in fastest:
            total = 0.0
            for first, length in segs:
                total += length * min(
                    min(o.time_s for o in inputs_of(k, tp, mbs).options[first])
                    for k in range(len(kinds))
                )
            fastest[tp, mbs] = total
        return fastest[tp, mbs]

    def gpus_of(mc: MixedCandidate) -> list[int]:
        width = mc.cand.dp * mc.cand.tp
        return [c * width for c in mc.counts or ()]

    def rate_of(mc: MixedCandidate) -> float:
        return 1.0 if rate is None else rate.per_step_s(gpus_of(mc))

    found = []
    for c in cands:
        m = num_microbatches(training, c.dp, c.micro_batch_size)
        floor = block_floor(c.tp, c.micro_batch_size) * (1 + (m - 1) / c.pp)
        if rate is None:
            found.append(MixedCandidate(c, floor))
            continue
        caps = [k.gpus // (c.dp * c.tp) for k in kinds]
        for counts in stage_counts(c.pp, caps):
            mc = MixedCandidate(c, 0.0, counts=counts)
            if floor > rate.max_step_s(gpus_of(mc)):
                continue  # no placement of these GPUs meets the deadline or the budget
            mc.bound = floor * rate_of(mc)
            found.append(mc)
    found.sort(
        key=lambda mc: (
            mc.bound,
            mc.cand.pp * mc.cand.dp * mc.cand.tp,
            mc.cand.label(),
            mc.counts or (),
        )
    )
    best: MixedCandidate | None = None
    incumbent = cutoff
    structures: dict = {}
    prepared: dict[int, tuple[MixedProblem, SplitBound | None, float]] = {}  # by id(candidate)
    for mc in found:
        if mc.bound >= incumbent * (1 - REL_TOL):
            mc.status = "pruned-bound"
            continue
        c = mc.cand
        if id(c) not in prepared:
            if progress:
                progress(c.label())
            ins = [inputs_of(k, c.tp, c.micro_batch_size) for k in range(len(kinds))]
            mp = mixed_problem(ins, c, kinds, links)
            split = mixed_split_bound(mp) if fits_at_all(mp) else None
            if split is not None and not split.feasible:
                split = None
            prepared[id(c)] = (mp, split, step_bound(mp, split) if split else math.inf)
        mp, split, least_step = prepared[id(c)]
        if split is None:
            mc.status = "pruned-memory"
            continue
        r = rate_of(mc)
        mc.bound = max(mc.bound, least_step * r)
        if mc.bound >= incumbent * (1 - REL_TOL):
            mc.status = "pruned-bound"
            continue
        longest = math.inf
        if mc.counts is not None:
            # caps adding up to the stages: each kind runs exactly its count
            mp = replace(mp, stage_cap=list(mc.counts))
            assert rate is not None  # stage counts are a RunRate search's
            longest = rate.max_step_s(gpus_of(mc))
        mc.problem = mp
        step_cutoff = min(incumbent * (1 - REL_TOL) / r, longest * (1 + 1e-9))
        sol = solve_mixed(mp, step_cutoff, structures, split=split)
        mc.solution = sol
        if sol.status in ("optimal", "node_limit"):
            mc.status = "solved"
            mc.value = sol.objective * r
            if mc.value < incumbent:
                incumbent, best = mc.value, mc
        else:
            mc.status = sol.status
    return MixedResult(best, found, inputs, kinds, time.perf_counter() - start)
