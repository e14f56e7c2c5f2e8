"""The heterogeneous search: one pipeline over several device kinds, when it beats every kind
alone, each stage with its own TP and DP degree.

Outer loop: (pp >= 2, dp, micro-batch, schedule, ZeRO stage), dp the least DP degree of any
stage, plain 1F1B / GPipe. A stage takes a variant v = (kind k, TP degree t, DP multiple r):
t one of 1, 2, 4, 8 up to the kind's node, r a power of two (the stage's dp r replicas take
the step's n micro-batches in turns, m_v = n / (dp r) each), its dp r t GPUs within the kind's
and inside one node or on whole nodes (``stage_variants``). Each variant is priced by the cost
model's own functions (``planner.search.milp.candidate.stage_problem`` with the kind's cluster at TP
t and DP dp r), and the mixed MILP (``mixed_milp``) picks each stage's variant, blocks and
options; the plan's mesh is (pp, max dp r, max t) with ``stage_tp`` and ``stage_dp`` the
stages' degrees where they differ. The runtime runs stages of different DP degrees under
GPipe only, so only GPipe candidates take r > 1.

The placements of one outer candidate are parted into cells by their stages' least and
largest TP degree (lo, hi) and largest DP multiple top: a cell's MILP has the variants of
degrees lo .. hi and multiples 1 .. top, and needs a stage at each of lo, hi, 1 and top
(``MixedProblem.needs``, ``dp_needs``), so every placement lies in one cell (one with no stage
at multiple 1 is a cell of a larger dp). A cell is a ``Candidate`` whose ``tp`` is hi, with lo
and top beside it (``MixedCandidate.tp_low``, ``dp_top``). The cells of one degree (every
stage the same TP and DP: the search before per-stage degrees) go first, then those of
several; each set is drained least bound first and every cell in it settled: solved, or
pruned by a bound no placement of it beats, never left for lack of time or work. The result is
the cost model's optimum (to REL_TOL) over the cells searched, unless a MILP stops at its node
limit (``MixedResult.proven``). The cells of several degrees are the large ones (up to 12
variants a stage per DP multiple, looser bounds); by default they are searched on pools of at
most STAGE_DEGREE_KINDS kinds and STAGE_DEGREE_GPUS GPUs by time with no rate, else left whole
and a note says so (``search_mixed``'s ``stage_degrees``).

Cells go cheapest lower bound first (a heap), F_v[s] being variant v's fastest option time on
segment s (a micro-batch's, the same at any DP degree), m the micro-batches per replica at dp
and top the cell's largest DP multiple (stage j's replicas run m_j = m / r_j >= m / top each):

    step >= F (1 + (m / top - 1) / pp),          F = sum_s L_s min_v F_v[s]
    step >= (m - top) W / (sum_k s_k U_k) + F,   W = sum_s L_s min_v s_{k_v} t_v F_v[s]

The first is 1F1B / GPipe's sum_j T_j + max_j (m_j - 1) T_j with max >= mean. The second holds
for any weights s_k >= 0 (here 1 / kind k's own least rank-seconds, so the kinds' speeds
weigh in): step >= sum_i T_i + (m_j - 1) T_j on every stage j, so with w_j = s_{k_j} t_j r_j,
(sum_j w_j) step >= sum_j s t_j (m - r_j) T_j + (sum_j w_j) F >= (m - top) W + (sum_j w_j) F,
and sum_j w_j = sum_k s_k U_k with U_k the units (sum of t r) of kind k's stages, at most its
GPUs over dp. Every other term is >= 0. A cell first reached is then priced by
mixed_bound.fastest_floor (the split recurrences on the fastest options alone, within the
units), then built (StageProblems, mixed_bound's split bound), then given
mixed_bound.pipeline_floor, and solved, each time back into the heap at its tighter bound. The
search starts from the caller's cutoff, the best single-kind step time, so a mixed plan is
returned only when it is faster than every kind alone, and a cell whose bound is not below the
incumbent is never built.

By another objective (``RunRate``: money, energy, carbon, or wall time under a deadline or
budget) the objective is rate(g) step, g the GPUs per kind, g_k = dp U_k. The search divides
each cell's units into boxes lo <= U <= hi, split in halves (a kind's units, the box with
the fewer kinds used first) until the rate and the longest step allowed are the same over the
box: the MILP then finds the box's least step under ``lo <= U <= hi`` (``MixedProblem.units``
and ``units_low``), which gives the box's least objective. A box is bounded by

    objective >= max(dp ((m - top) W_rho + F pp min_v rho_{k_v} t_v r_v), rate(dp lo) step_lb(hi))

with rho_k ``RunRate.per_gpu`` (the rate grows at least rho_k per GPU of kind k: the same
argument with weights rho) and step_lb the bounds above at U = hi (the built cell's too); it
rests on the rate being nondecreasing, and the longest step nonincreasing, in every kind's
GPUs. The optimum over the boxes is so the optimum over all placements, as each placement's
units lie in exactly one leaf box.

Pricing a variant uses one cluster per kind, as many nodes as that variant's pipeline would
need laid out alone (ranks fill nodes in order); a stage of g = dp r t ranks lies inside one node
or on whole nodes, so its links are the same wherever it sits.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from planner.cost.data_parallel import tied_sync_time
from planner.cost.pipeline import hop_time, one_chunk_floor, stage_time_parts
from planner.cost.records import Config, CostInputs, sample_share
from planner.hardware.cluster import Cluster
from planner.search.bound_memo import BoundMemo
from planner.search.bounds import quiet_highs
from planner.search.candidates import Candidate, Pins, divisors
from planner.search.milp.candidate import segments, stage_problem
from planner.search.milp.data import StageProblem
from planner.search.milp.split_bound import SplitBound
from planner.search.mixed.bound import (
    Costs,
    fastest_floor,
    mixed_split_bound,
    pipeline_floor,
    step_bound,
    variant_costs,
)
from planner.search.mixed.cost import step_time
from planner.search.mixed.milp import (
    NODE_LIMIT,
    MixedProblem,
    MixedSolution,
    solve_mixed,
    variant_triples,
)
from planner.search.options import price_options
from planner.trace.blocks import Block
from planner.trace.graph import pipeline_refusal
from planner.training import Training, num_microbatches
from planner.vocab import Schedule

# Stop proving improvements smaller than this share of the incumbent (as the homogeneous
# search's SEARCH_REL_TOL): a candidate whose bound is within it is not solved.
REL_TOL = 1e-3
TP_DEGREES = (1, 2, 4, 8)
# search_mixed's stage_degrees None: the cells whose stages take two TP degrees or more are
# searched on pools of at most this many kinds and GPUs. Their MILPs are large (a variant per
# kind and degree) and their bounds loose, and the work grows fastest with the kinds: Llama-3-8B
# on the 2-core machine, every cell settled, took 23 s over 8 A100 + 8 H100 (the plan 0.65% faster
# than one degree for all stages), 50 s over profiles/pools/onprem.toml (32 A100 + 16 H100, 2.4%
# faster), more than 10 minutes over 16 A100 + 16 H100 + 16 H200, and 759 s over the 3 x 256
# pool (the same plan). By another objective, or under a deadline or budget, each cell is split
# further into boxes of GPUs per kind (RunRate), which multiplies the work: the onprem pool under
# a deadline no option meets ran past 5 minutes with them, 25.6 s without; so that search keeps
# one degree by default. A rule on the request, never the clock: the same plan on any machine.
STAGE_DEGREE_KINDS, STAGE_DEGREE_GPUS = 2, 64
# The largest DP multiple a stage may take over the least DP degree of its pipeline: stages'
# DP degrees within this factor of each other, enough to balance kinds of a generation apart;
# each doubling adds a variant per kind and TP degree and a cell per (dp, lo, hi).
STAGE_DP_RATIO = 4
# search_mixed's stage_degrees None: stages of their own DP degree are searched on pools within
# the rule above of at most this many GPUs. Each DP multiple adds a variant per kind and TP
# degree, and the cells' fastest-option floors and split bounds (a units recurrence each)
# are the work: Llama-3-8B over 8 A100 + 8 H100 took 73 s with them against 23 s without (the
# same plan), GPT 1.3B over the same kinds 101 s against 8 s (tests/test_mixed_pool.py), and
# profiles/pools/onprem.toml (48 GPUs) ran past 400 s unfinished (the Llama runs while the
# 2-core machine ran other work too).
STAGE_DP_GPUS = 8

Variant = tuple[int, int, int]  # (kind index, TP degree, DP multiple)
Links = dict[tuple[int, int], tuple[float, float]]


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
    time, so the least step time of each GPU count is the least objective of that count.

    The search's bounds rest on ``per_step_s`` nondecreasing and ``max_step_s`` nonincreasing
    in every kind's GPUs (more GPUs never cost less per second), and on
    ``per_step_s(g) >= sum_k per_gpu[k] g[k]`` (``per_gpu`` empty: all 0, a valid but
    toothless bound)."""

    per_step_s: Callable[[list[int]], float]
    max_step_s: Callable[[list[int]], float]
    per_gpu: tuple[float, ...] = ()


@dataclass
class MixedCandidate:
    """One cell of the mixed search: an outer candidate and its stages' least and largest TP
    degree (with a box of TP units per kind, when the search prices GPUs), and its outcome."""

    cand: Candidate  # its tp: the cell's largest TP degree
    bound: float  # in the search's objective: step seconds, or the RunRate's units
    # solved | pruned-bound | pruned-memory | cutoff | infeasible | no_solution | split
    # | inexact (the MILP's value of its placement is not the placement's step time)
    status: str = "pending"
    solution: MixedSolution | None = None
    problem: MixedProblem | None = None
    units: tuple[int, ...] | None = None  # TP units per kind at most (RunRate searches)
    units_low: tuple[int, ...] | None = None  # and at least
    value: float = math.inf  # the solved placement's objective
    tp_low: int | None = None  # the cell's least TP degree (None: cand.tp, one degree)
    dp_top: int = 1  # the cell's largest DP multiple: its stages' DP degrees dp .. dp dp_top

    @property
    def degrees(self) -> tuple[int, int]:
        """The cell: (least, largest) TP degree of its placements' stages."""
        return (self.tp_low or self.cand.tp, self.cand.tp)

    @property
    def dp_needs(self) -> list[int]:
        """The DP multiples some stage of the cell takes: 1 and its largest."""
        return [1, self.dp_top]

    @property
    def several(self) -> bool:
        """Whether the cell's stages differ in TP or DP degree."""
        lo, hi = self.degrees
        return lo != hi or self.dp_top > 1

    def label(self) -> str:
        """The cell's candidate label, with the range of its stages' DP and TP degrees."""
        lo, hi = self.degrees
        c = self.cand
        dp = f"{c.dp}..{c.dp * self.dp_top}" if self.dp_top > 1 else None
        return c.label(dp=dp, tp=f"{lo}..{hi}" if lo != hi else None)

    def gpus(self, units: tuple[int, ...] | None = None) -> list[int]:
        """GPUs per kind at ``units`` (default: the box's least)."""
        return [u * self.cand.dp for u in (units or self.units_low or ())]


@dataclass
class MixedResult:
    best: MixedCandidate | None
    candidates: list[MixedCandidate]
    inputs: dict[tuple[int, int, int], CostInputs]  # (kind, tp, micro-batch) -> priced options
    kinds: list[Kind]
    solve_time_s: float
    notes: list[str] = field(default_factory=list)
    skipped: bool = False  # stages' own TP or DP degrees left out (search_mixed's stage_degrees)

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
            or (c.solution is not None and c.solution.status in ("node_limit", "inexact"))
            for c in self.candidates
        )


def stage_variants(
    kinds: list[Kind], dp: int, degrees: list[int], mults: Sequence[int] = (1,)
) -> list[Variant]:
    """The (kind, TP degree t, DP multiple r) a stage of a ``dp``-replica candidate may take:
    the degree within the kind's node, its dp r t GPUs within the kind's, and inside one node
    or on whole nodes."""
    out = []
    for k, kind in enumerate(kinds):
        gpn = kind.cluster.gpus_per_node
        for r in mults:
            for t in degrees:
                width = dp * r * t
                aligned = gpn % width == 0 or width % gpn == 0
                if t <= gpn and width <= kind.gpus and aligned:
                    out.append((k, t, r))
    return out


def unit_caps(kinds: list[Kind], dp: int, variants: list[Variant], pp: int) -> list[int]:
    """Per kind, the most units (sum of stage widths t r) a ``pp``-stage pipeline can give it:
    its GPUs over dp, and no more than pp stages of its widest variant."""
    caps = []
    for k, kind in enumerate(kinds):
        widths = [t * r for kk, t, r in variants if kk == k]
        caps.append(min(kind.gpus // dp, pp * max(widths)) if widths else 0)
    return caps


def cell_variants(variants: list[Variant], lo: int, hi: int, most: int = 1) -> list[Variant]:
    """The variants of a cell: TP degrees lo .. hi, DP multiples up to ``most``."""
    return [(k, t, r) for k, t, r in variants if lo <= t <= hi and r <= most]


def dp_multiples(most: int) -> list[int]:
    """The DP multiples of a cell whose largest is ``most``: 1, 2, 4 .. most."""
    return [1 << i for i in range(most.bit_length())]


def outer_candidates(
    kinds: list[Kind],
    n_blocks: int,
    training: Training,
    degrees: list[int],
    pins: Pins,
    stage_dp: bool = True,
) -> list[tuple[Candidate, int, int]]:
    """Every (pp >= 2, dp, micro-batch, schedule, ZeRO) a mixed pipeline may use, as cells
    (candidate, least degree lo, largest DP multiple r), the candidate's tp the largest degree
    hi and its dp the least DP degree: the placements whose stages' degrees run from lo to hi
    and whose DP degrees from dp to dp r, each taken at least once (so the cells part the
    placements). A cell has variants of two kinds at least, and the pool holds pp stages (each
    kind's GPUs over its narrowest stage in the cell). Stages of different DP degrees run
    GPipe only (the runtime's one schedule for them), so a cell of r > 1 is GPipe; without
    ``stage_dp``, or with ``pins.dp`` (every stage that DP degree), every cell has r = 1."""
    gbs = training.global_batch_size
    mults = dp_multiples(STAGE_DP_RATIO) if stage_dp and not pins.dp else [1]
    out = []
    for dp in divisors(gbs):
        if pins.dp and dp != pins.dp:
            continue
        allowed = stage_variants(kinds, dp, degrees, mults)
        tps = sorted({t for _, t, _ in allowed})
        for lo, hi in itertools.combinations_with_replacement(tps, 2):
            for top in sorted({r for _, _, r in allowed}):
                variants = cell_variants(allowed, lo, hi, top)
                able = sorted({k for k, _, _ in variants})
                if len(able) < 2 or all(r != top for _, _, r in variants):
                    continue
                room = sum(
                    kinds[k].gpus // (dp * min(t * r for kk, t, r in variants if kk == k))
                    for k in able
                )
                for pp in range(2, min(n_blocks, room) + 1):
                    if pins.pp and pp != pins.pp:
                        continue
                    for mbs in divisors(gbs // dp):
                        m = gbs // dp // mbs
                        if m % top:
                            continue  # each replica of a stage at DP dp top takes m / top
                        # With m >= pp, 1F1B holds no more in flight than GPipe at the same
                        # time (inflight_microbatches): GPipe is dominated, left out.
                        one = Schedule.ONE_F_ONE_B if m >= pp and top == 1 else Schedule.GPIPE
                        for zero in range(4) if dp * top > 1 else (0,):
                            if zero == 1:
                                continue  # the runtime has no ZeRO-1 for pipeline stages
                            out.append((Candidate(pp, dp, hi, mbs, one, 1, zero), lo, top))
    return out


def wide_kinds(kinds: list[Kind], cells: list[tuple[Candidate, int, int]]) -> list[Kind]:
    """The kinds with clusters as large as any variant's pipeline laid out alone needs (pp
    stages of dp r t ranks, t and r at most the cell's largest): the cost model prices a
    variant's stage j at ranks j dp r t onward."""
    span = max((c.pp * c.dp * top * c.tp for c, _, top in cells), default=0)
    out = []
    for kind in kinds:
        cl = kind.cluster
        nodes = max(cl.nodes, -(-span // cl.gpus_per_node))
        out.append(replace(kind, cluster=Cluster(cl.profile, nodes, cl.gpus_per_node)))
    return out


def hop_times(
    inputs: list[CostInputs], configs: list[Config], variants: list[Variant], links: Links
) -> np.ndarray:
    """(J-1, V, V): the hop from stage j of variant v to stage j+1 of variant u, priced as
    stage_time_parts prices a homogeneous pipeline's: on the sender's kind's own link between
    its stages j and j+1 inside one kind, on the pool's fabric (bandwidth, latency) between two
    kinds, inf where the pool has no fabric between them. A fabric joins its kinds both ways
    (``links`` may name it in either order): a pipeline may hand over from either kind to the
    other, and the MILP searches both orders."""
    J, V = configs[0].num_stages, len(variants)
    hop = np.full((max(J - 1, 0), V, V), np.inf)
    for j in range(J - 1):
        for a, (ka, ta, _) in enumerate(variants):
            inp, mesh = inputs[a], configs[a].mesh
            nbytes = inp.boundary_bytes * sample_share(configs[a]) / inp.traced_mbs
            own = inp.cluster.link([mesh.rank(j, 0, 0), mesh.rank(j + 1, 0, 0)])
            for b, (kb, tb, _) in enumerate(variants):
                link = own if ka == kb else links.get((ka, kb), links.get((kb, ka)))
                if link is not None:
                    shards = inp.training.pipeline_sends_shards
                    hop[j, a, b] = hop_time(nbytes, ta, tb, *link, shards)
    return hop


def tied_segments(inp: CostInputs) -> list[tuple[int, int]]:
    """(segment of the owner, segment of the reader) of every tied weight."""
    seg_of = {}
    for s, (first, length) in enumerate(segments(inp.blocks)):
        seg_of.update({i: s for i in range(first, first + length)})
    return sorted({(seg_of[c.owner], seg_of[c.user]) for c in inp.tied})


@dataclass
class VariantParts:
    """One variant's numbers for one candidate: what ``mixed_problem`` puts together."""

    problem: StageProblem
    config: Config  # the candidate at the variant's degree, no blocks placed
    base_time: list[float]  # per stage: compute and TP communication besides its blocks
    tied_sync: float


def variant_parts(inp: CostInputs, cand: Candidate, t: int, r: int = 1) -> VariantParts:
    """``inp``: the variant's kind's options at degree ``t``; ``r`` its DP multiple (the
    candidate's dp r replicas, each taking its share of the step's micro-batches)."""
    c = replace(cand, tp=t, dp=cand.dp * r)
    config = Config(c.mesh, c.micro_batch_size, c.schedule, 1, c.zero, [], [])
    base = [sum(stage_time_parts(inp, [], config, j)[:2]) for j in range(c.pp)]
    return VariantParts(stage_problem(inp, c), config, base, tied_sync_time(inp, config))


def mixed_problem(
    inputs: list[CostInputs],
    cand: Candidate,
    variants: list[Variant],
    kinds: list[Kind],
    links: Links,
    needs: list[int] | None = None,
    parts: list[VariantParts] | None = None,
    hop: np.ndarray | None = None,
    dp_needs: list[int] | None = None,
) -> MixedProblem:
    """The mixed MILP's numbers for one candidate: each variant's StageProblem (``inputs``:
    its kind's options at its degree), the constants a stage pays besides its blocks and hop,
    the hops, how many units each kind's GPUs hold, and the TP degrees and DP multiples some
    stage must take. ``variants``: (kind, TP, DP multiple), or (kind, TP) for multiple 1.
    ``parts`` and ``hop``: each variant's, and the hops, where the caller has them."""
    variants = variant_triples(variants)
    if parts is None:
        parts = [variant_parts(inp, cand, t, r) for inp, (_, t, r) in zip(inputs, variants)]
    if hop is None:
        hop = hop_times(inputs, [p.config for p in parts], variants, links)
    return MixedProblem(
        kinds=[k.name for k in kinds],
        variants=list(variants),
        per_variant=[p.problem for p in parts],
        base_time=np.array([p.base_time for p in parts]),
        hop=hop,  # inf: no fabric, forbidden
        units=unit_caps(kinds, cand.dp, variants, cand.pp),
        const_step=max(p.tied_sync for p in parts),
        tied=tied_segments(inputs[0]),
        needs=sorted(set(needs or [])),
        dp_needs=sorted(set(dp_needs or [])),
    )


def fits_at_all(mp: MixedProblem) -> bool:
    """A necessary condition for any placement to fit in memory: the blocks' least states and
    activations (each at its least option and variant, activations at the fewest in-flight
    micro-batches of any stage) within the rooms of the pp largest stages the pool can hold
    (per kind, its largest room, as many times as its narrowest variant fits its units)."""
    fewest = min(min(sp.inflight) for sp in mp.per_variant)
    need = 0.0
    for s, length in enumerate(mp.seg_len):
        least = min(float(np.min(sp.state[s] + fewest * sp.act[s])) for sp in mp.per_variant)
        need += length * least
    rooms = []
    for k, units in enumerate(mp.units):
        mine = [v for v in range(len(mp.variants)) if mp.kind_of(v) == k]
        if mine:
            room = max(mp.per_variant[v].capacity - min(mp.per_variant[v].const_mem) for v in mine)
            rooms += [room] * min(units // min(mp.width(v) for v in mine), mp.J)
    rooms.sort(reverse=True)
    return len(rooms) >= mp.J and need <= sum(rooms[: mp.J]) * (1 + 1e-9)


@dataclass(frozen=True)
class Floors:
    """A cell's bounds from its variants' fastest options alone (the module docstring's F,
    W with weights s_k, and W_rho with weights rho_k), every placement's; ``split`` the
    fastest-option recurrences' (mixed_bound.fastest_floor), once the search computed it."""

    m: int  # micro-batches per replica at the cell's least DP degree
    pp: int
    dp: int
    fastest: float  # F
    rank_s: float  # W: sum_s L_s min_v s_{k_v} t_v F_v[s]
    speed: tuple[float, ...]  # s_k
    priced_rank_s: float  # W_rho
    least_rho_t: float  # min_v rho_{k_v} t_v r_v
    split: float | None = None
    top: int = 1  # the cell's largest DP multiple r

    def step(self, units_hi: list[int]) -> float:
        """No placement whose kinds' units are at most ``units_hi`` steps faster."""
        pipeline = self.fastest * one_chunk_floor(self.m // self.top, self.pp)
        weight = sum(s * u for s, u in zip(self.speed, units_hi, strict=True))
        busy = (self.m - self.top) * self.rank_s
        fluid = busy / weight + self.fastest if weight > 0 else math.inf
        return max(pipeline, fluid, self.split or 0.0)

    def priced(self) -> float:
        """No placement's objective is lower: dp ((m - top) W_rho + F pp min_v rho t r)."""
        return self.dp * (
            (self.m - self.top) * self.priced_rank_s + self.fastest * self.pp * self.least_rho_t
        )


def floors_of(
    fastest: list[np.ndarray],
    seg_len: list[int],
    variants: list[Variant],
    n_kinds: int,
    cand: Candidate,
    m: int,
    per_gpu: tuple[float, ...],
) -> Floors:
    """Floors from each variant's fastest option time per segment (``fastest[v][s]``)."""
    L = np.asarray(seg_len, dtype=float)
    tf = np.array([t * f for (_, t, _), f in zip(variants, fastest, strict=True)])  # (V, S)
    speed = []
    for k in range(n_kinds):
        rows = [v for v, (kk, _, _) in enumerate(variants) if kk == k]
        own = float(L @ tf[rows].min(axis=0)) if rows else 0.0
        speed.append(1.0 / own if own > 0 else 0.0)
    kinds = [k for k, _, _ in variants]
    weights = np.array([speed[k] for k in kinds])[:, None]
    rho = np.array([per_gpu[k] if per_gpu else 0.0 for k in kinds])
    return Floors(
        m=m,
        pp=cand.pp,
        dp=cand.dp,
        fastest=float(L @ np.min(fastest, axis=0)),
        rank_s=float(L @ (weights * tf).min(axis=0)),
        speed=tuple(speed),
        priced_rank_s=float(L @ (rho[:, None] * tf).min(axis=0)),
        least_rho_t=float(min(p * t * r for p, (_, t, r) in zip(rho, variants, strict=True))),
        top=max(r for _, _, r in variants),
    )


def unit_counts(variants: list[Variant], kind: int, cap: int, pp: int) -> list[int]:
    """Per unit total u <= cap of ``kind``, a bit mask of the stage counts whose widths t r
    (the kind's variants') can add up to u: bit n set when n stages can."""
    degrees = sorted({t * r for k, t, r in variants if k == kind})
    masks = [0] * (cap + 1)
    masks[0] = 1
    for n in range(1, pp + 1):  # masks of exactly n stages, grown one stage at a time
        reach = [0] * (cap + 1)
        for u in range(cap + 1):
            if masks[u] >> (n - 1) & 1:
                for t in degrees:
                    if u + t <= cap:
                        reach[u + t] |= 1 << n
        for u, bit in enumerate(reach):
            masks[u] |= bit
    return masks


def box_feasible(masks: list[list[int]], lo: tuple[int, ...], hi: tuple[int, ...], pp: int) -> bool:
    """Whether some units in [lo, hi] are made by stage counts adding up to pp."""
    reach = 1
    for mask, a, b in zip(masks, lo, hi, strict=True):
        counts = 0
        for u in range(a, b + 1):
            counts |= mask[u]
        step = 0
        for n in range(pp + 1):
            if counts >> n & 1:
                step |= reach << n
        reach = step & ((1 << (pp + 1)) - 1)
    return bool(reach >> pp & 1)


def split_box(lo: tuple[int, ...], hi: tuple[int, ...]) -> list[tuple[tuple[int, ...], ...]]:
    """Halve a box of TP units: first a kind that may be unused (0 or >= 1), until two kinds
    are used for sure; then the widest kind's range."""
    used = sum(1 for a in lo if a > 0)
    open_ = [k for k, (a, b) in enumerate(zip(lo, hi)) if a == 0 < b]
    if used < 2 and open_:
        k, mid = open_[0], 0
    else:
        k = max(range(len(lo)), key=lambda i: (hi[i] - lo[i], -i))
        mid = (lo[k] + hi[k]) // 2
    return [
        (lo, hi[:k] + (mid,) + hi[k + 1 :]),
        (lo[:k] + (mid + 1,) + lo[k + 1 :], hi),
    ]


class _Prices:
    """Each variant's priced options (per kind, TP degree and micro-batch), cached."""

    def __init__(
        self, graph, blocks, training, kinds, variants_of, pins, kept: BoundMemo | None = None
    ) -> None:
        """``kept``: a bound_memo.BoundMemo of options priced by earlier plans (a pool's own
        kinds'), or None."""
        self.graph, self.blocks, self.training = graph, blocks, training
        self.kinds, self.variants_of, self.pins = kinds, variants_of, pins
        self.kept = kept
        self.traced_mbs = int(graph.graph["traced_batch_size"])
        self.inputs: dict[tuple[int, int, int], CostInputs] = {}
        self.priced: dict = {}
        self.segs = segments(blocks)
        self.least: dict[tuple[Variant, int], np.ndarray] = {}

    def of(self, k: int, tp: int, mbs: int) -> CostInputs:
        key = (k, tp, mbs)
        if key not in self.inputs:
            cl = self.kinds[k].cluster
            # a stage of a pipeline: tied weights stay replicated under TP (variants_for)
            opts = price_options(
                self.graph, self.blocks, tp, mbs, cl, self.training, self.pins,
                self.variants_of[k], 1, 1, self.priced, tp > 1, kept=self.kept,
            )  # fmt: skip
            self.inputs[key] = CostInputs(
                self.blocks, opts, self.traced_mbs, cl, self.training, self.pins.memory_fraction
            )
        return self.inputs[key]

    def fastest(self, variants: list[Variant], mbs: int) -> list[np.ndarray]:
        """Per variant, per segment: the least time of any option."""
        for k, t, _ in variants:  # a micro-batch's time is the same at any DP degree
            if ((k, t), mbs) not in self.least:
                opts = self.of(k, t, mbs).options
                times = [min(o.time_s for o in opts[f]) for f, _ in self.segs]
                self.least[(k, t), mbs] = np.array(times)
        return [self.least[(k, t), mbs] for k, t, _ in variants]


class _Base:
    """What the cells of one (pp, dp, micro-batch, schedule, ZeRO) share, made as the search
    first needs it: each variant's numbers and split-bound costs, and the hops between every
    two variants the DP degree allows."""

    def __init__(
        self, cand: Candidate, variants: list[Variant], prices: _Prices, links, parts: dict
    ) -> None:
        """``parts``: each (candidate, variant)'s VariantParts so far, shared by the bases of
        one candidate with different largest DP multiples."""
        self.cand, self.variants, self.prices = cand, variants, prices
        self.inputs = [prices.of(k, t, cand.micro_batch_size) for k, t, _ in variants]
        self.parts = []
        for inp, v in zip(self.inputs, variants):
            key = (cand.pp, cand.dp, cand.micro_batch_size, cand.schedule, cand.zero, v)
            if key not in parts:
                parts[key] = variant_parts(inp, cand, v[1], v[2])
            self.parts.append(parts[key])
        configs = [p.config for p in self.parts]
        self.hop = hop_times(self.inputs, configs, variants, links)
        self.whole: MixedProblem | None = None  # every variant: the split bound's costs
        self.priced: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}

    def problem(
        self, cell: list[Variant], needs: list[int], dp_needs: list[int], kinds: list[Kind]
    ) -> MixedProblem:
        """The cell's MixedProblem: the variants ``cell``, the TP degrees ``needs`` and DP
        multiples ``dp_needs`` taken."""
        idx = [self.variants.index(v) for v in cell]
        c = replace(self.cand, tp=max(t for _, t, _ in cell))
        return mixed_problem(
            [self.inputs[i] for i in idx], c, cell, kinds, {}, needs,
            parts=[self.parts[i] for i in idx], hop=self.hop[:, idx][:, :, idx],
            dp_needs=dp_needs,
        )  # fmt: skip

    def costs(self, mp: MixedProblem) -> Costs:
        """Per stage, per variant of a cell's problem, mixed_bound's (tau, psi), priced once
        for all cells (each variant's constant with its cheapest hop to any variant)."""
        if self.whole is None:
            self.whole = mixed_problem(
                self.inputs, self.cand, self.variants, [], {}, parts=self.parts, hop=self.hop
            )
        idx = [self.variants.index(v) for v in mp.variants]
        for i in idx:
            if i not in self.priced:
                self.priced[i] = variant_costs(self.whole, i)
        taus = [[self.priced[i][0][j] for i in idx] for j in range(mp.J)]
        psis = [[self.priced[i][1][j] for i in idx] for j in range(mp.J)]
        return taus, psis


# How far the MILP's value of its placement may stray from that placement's step time (HiGHS's
# feasibility tolerances, relative once the MILP counts time in units of the step's size):
# beyond it the MILP does not price what the plan reports, and its answer certifies nothing.
MILP_AGREES = 1e-7


def exact_objective(mp: MixedProblem, sol: MixedSolution) -> MixedSolution:
    """``sol`` with its objective the step time of its placement (``mixed.cost.step_time``, the
    number the plan reports) and the MILP's own value beside it; its status "inexact" (neither
    a plan nor a certificate) where the two differ by more than MILP_AGREES."""
    exact = step_time(mp, sol.variants, sol.counts)
    agrees = math.isclose(exact, sol.objective, rel_tol=MILP_AGREES)
    status = sol.status if agrees else "inexact"
    return replace(sol, status=status, objective=exact, milp_objective=sol.objective)


def search_mixed(
    graph,
    blocks: list[Block],
    training: Training,
    kinds: list[Kind],
    links: Links,
    variants: list[Callable[[Block, int], list]],
    cutoff: float = math.inf,
    pins: Pins | None = None,
    progress: Callable[[str], None] | None = None,
    rate: RunRate | None = None,
    stage_degrees: bool | None = None,
    kept: BoundMemo | None = None,
) -> MixedResult:
    """The fastest mixed pipeline faster than ``cutoff`` (the best single-kind step time), or
    ``best`` None when none is. ``links``: (kind a, kind b) -> (bandwidth B/s, latency s) of
    the fabric, both orders. ``variants``: per kind, the intra-block sharding variants.
    ``pins.tp`` and ``pins.dp`` restrict every stage to that TP and DP degree; ``pins.pp`` the
    pipeline's depth.
    ``kept``: a bound_memo.BoundMemo whose priced options are taken (those of the pool's own
    plans: bound_memo.priced_key) and added to, or None.
    ``stage_degrees``: whether stages may take TP and DP degrees of their own (True), share
    one of each (False), or take their own on small pools searched by time (None: TP degrees
    within STAGE_DEGREE_KINDS and STAGE_DEGREE_GPUS, DP degrees within STAGE_DP_GPUS too, no
    ``rate``).

    With ``rate``, the least objective instead (``cutoff`` in its units: the best single-kind
    option's), over pipelines using two kinds at least: each cell's TP units per kind are
    divided into boxes (the module docstring), and the MILP, with the units within a box over
    which the rate is one, finds that box's least step time within its longest step."""
    start = time.perf_counter()
    quiet_highs()
    pins = pins or Pins(offload="none")
    degrees = [pins.tp] if pins.tp else list(TP_DEGREES)
    # torch's pipelining runs stages as the exported graph: where there is none (a
    # module-level trace) or it drops a backward of the model's own, no pipeline would run
    runnable = not pipeline_refusal(graph)
    gpus = sum(k.gpus for k in kinds)
    small = len(kinds) <= STAGE_DEGREE_KINDS and gpus <= STAGE_DEGREE_GPUS and rate is None
    several = small if stage_degrees is None else stage_degrees
    own_dp = small and gpus <= STAGE_DP_GPUS if stage_degrees is None else stage_degrees
    cells = (
        outer_candidates(kinds, len(blocks), training, degrees, pins, own_dp) if runnable else []
    )
    wide = wide_kinds(kinds, cells)
    prices = _Prices(graph, blocks, training, wide, variants, pins, kept)
    search = _Search(prices, kinds, links, degrees, training, rate, cutoff, progress)
    search.run(cells, several)
    # by the default rule: a pool where some stage could have had two replicas or more
    dp_left = not own_dp and not pins.dp and max(k.gpus for k in kinds) >= 2
    skipped = stage_degrees is None and (search.skipped or dp_left)
    notes = []
    if skipped:
        this = f"{len(kinds)} kinds, {gpus} GPUs" + (", priced by a rate" if rate else "")
        left = "DP degree" if several else "TP and DP degree"
        notes.append(
            f"a pipeline across kinds gives its stages one {left} here: stages of their own TP "
            f"degree are searched by default on pools of at most {STAGE_DEGREE_KINDS} kinds and "
            f"{STAGE_DEGREE_GPUS} GPUs, of their own DP degree on at most {STAGE_DP_GPUS} GPUs, "
            f"by time with no deadline or budget (this one: {this}); "
            "--stage-degrees on searches them (minutes on large pools)"
        )
    elapsed = time.perf_counter() - start
    return MixedResult(search.best, search.entries, prices.inputs, kinds, elapsed, notes, skipped)


@dataclass
class _Built:
    """A cell's MILP numbers and bounds, made when the search first reaches it."""

    problem: MixedProblem | None  # None: nothing fits (pruned-memory)
    split: SplitBound | None
    least: float  # mixed_bound.step_bound: no placement steps faster
    masks: list[list[int]]  # per kind: unit_counts
    costs: Costs | None = None  # the split bound's, for pipeline_floor
    piped: bool = False  # least holds pipeline_floor (computed only where S* + P* is not enough)


class _Search:
    """The heap of cells (and, by a RunRate, their boxes of TP units), least bound first,
    pruned against the incumbent."""

    def __init__(self, prices, kinds, links, degrees, training, rate, cutoff, progress) -> None:
        self.prices, self.kinds, self.links = prices, kinds, links
        self.degrees, self.training, self.rate = degrees, training, rate
        self.incumbent, self.progress = cutoff, progress
        self.best: MixedCandidate | None = None
        self.entries: list[MixedCandidate] = []
        self.heap: list = []
        self.bases: dict[tuple, _Base] = {}
        self.built: dict[tuple, _Built] = {}
        self.floors: dict[tuple, Floors] = {}
        self.roots: dict[tuple, tuple[Floors, tuple[int, ...]]] = {}
        self.skipped = False  # cells of several degrees left whole (run's stage_degrees)
        self.fastest: dict[tuple, tuple[float, float]] = {}  # fastest_floor's, by cell
        self.parts: dict = {}  # (candidate, variant) -> VariantParts, for every base
        self.tick = itertools.count()

    @staticmethod
    def key(mc: MixedCandidate) -> tuple:
        c = mc.cand
        return (c.pp, c.dp, c.micro_batch_size, c.schedule, c.zero, mc.dp_top, *mc.degrees)

    @staticmethod
    def shared(mc: MixedCandidate) -> tuple:
        """What a cell's floors depend on: not its ZeRO stage nor its schedule."""
        c = mc.cand
        return (c.pp, c.dp, c.micro_batch_size, mc.dp_top, *mc.degrees)

    def allowed(self, mc: MixedCandidate) -> list[Variant]:
        """The variants of the cell's candidate with DP multiples up to the cell's largest."""
        return stage_variants(self.kinds, mc.cand.dp, self.degrees, dp_multiples(mc.dp_top))

    def variants(self, mc: MixedCandidate) -> list[Variant]:
        return cell_variants(self.allowed(mc), *mc.degrees, mc.dp_top)

    def push(self, mc: MixedCandidate, again: bool = False) -> None:
        """Into the heap at its bound (``again``: an entry already listed, re-bounded)."""
        if not again:
            self.entries.append(mc)
        c = mc.cand
        order = (mc.bound, c.pp * c.dp * c.tp, mc.label(), mc.units_low or (), mc.units or ())
        heapq.heappush(self.heap, (order, next(self.tick), mc))

    def run(self, cells: list[tuple[Candidate, int, int]], stage_degrees: bool) -> None:
        """The cells of one degree first, then (``stage_degrees``) those of several, each
        set drained least bound first until its heap empties: each cell is solved or pruned
        by a bound no placement of it beats. A cell's bound only rises as it is refined,
        built and piped, each time back into the heap, so the cell popped is the least
        bounded of those left. One-degree cells' bounds are the tighter (no change of
        degree, whose hops the bounds price at the cheapest), so they set the incumbent that
        prunes most of the rest."""
        made = [MixedCandidate(c, 0.0, tp_low=lo, dp_top=top) for c, lo, top in cells]
        self.drain([self.root(mc) for mc in made if not mc.several])
        several = [mc for mc in made if mc.several]
        if not stage_degrees:
            self.skipped = bool(several)
            return
        self.drain([self.root(mc) for mc in several])

    def drain(self, cells: list[MixedCandidate]) -> None:
        for mc in cells:
            self.push(mc)
        while self.heap:
            _, _, mc = heapq.heappop(self.heap)
            if mc.bound >= self.incumbent * (1 - REL_TOL):
                mc.status = "pruned-bound"
                continue
            self.visit(mc)

    def root(self, mc: MixedCandidate) -> MixedCandidate:
        """The cell whole: all its units (a RunRate search's root box), at its floor."""
        c, shared = mc.cand, self.shared(mc)
        if shared not in self.roots:
            vs = self.variants(mc)
            m = num_microbatches(self.training, c.dp, c.micro_batch_size)
            per_gpu = self.rate.per_gpu if self.rate else ()
            fastest = self.prices.fastest(vs, c.micro_batch_size)
            seg_len = [n for _, n in self.prices.segs]
            fl = floors_of(fastest, seg_len, vs, len(self.kinds), c, m, per_gpu)
            self.roots[shared] = fl, tuple(unit_caps(self.kinds, c.dp, vs, c.pp))
        fl, caps = self.roots[shared]
        self.floors[self.key(mc)] = fl
        if self.rate is None:
            mc.bound = fl.step(list(caps))
        else:
            mc.units, mc.units_low, mc.bound = caps, tuple(0 for _ in caps), fl.priced()
        return mc

    def build(self, mc: MixedCandidate) -> _Built:
        key = self.key(mc)
        if key not in self.built:
            if self.progress:
                self.progress(mc.label())
            c = mc.cand
            base_key = key[:6]
            if base_key not in self.bases:
                allowed = self.allowed(mc)
                self.bases[base_key] = _Base(c, allowed, self.prices, self.links, self.parts)
            base = self.bases[base_key]
            mp = base.problem(self.variants(mc), list(mc.degrees), mc.dp_needs, self.kinds)
            costs = base.costs(mp) if fits_at_all(mp) else None
            split = mixed_split_bound(mp, costs) if costs else None
            if split is not None and not split.feasible:
                split = None
            least = step_bound(mp, split) if split else math.inf
            masks = [unit_counts(mp.variants, k, cap, c.pp) for k, cap in enumerate(mp.units)]
            self.built[key] = _Built(mp if split else None, split, least, masks, costs)
        return self.built[key]

    def pipe(self, built: _Built) -> bool:
        """Whether the cell's least step gained mixed_bound.pipeline_floor just now."""
        if built.piped:
            return False
        assert built.problem is not None and built.split is not None
        mp = built.problem
        floor = pipeline_floor(mp, built.split, built.costs)
        built.least = max(built.least, step_bound(built.problem, built.split, floor))
        built.piped, built.costs = True, None
        return True

    def rate_at(self, gpus: list[int]) -> float:
        """The rate of ``gpus``; 0 for none (rates are >= 0)."""
        assert self.rate is not None
        return self.rate.per_step_s(gpus) if any(gpus) else 0.0

    def limit_at(self, gpus: list[int]) -> float:
        """The longest step ``gpus`` may take; inf for none (it only shrinks with GPUs)."""
        assert self.rate is not None
        return self.rate.max_step_s(gpus) if any(gpus) else math.inf

    def box_bound(self, mc: MixedCandidate, built: _Built) -> float:
        """The module docstring's bound of a box (of the whole cell without a rate)."""
        assert built.problem is not None
        fl = self.floors[self.key(mc)]
        step = max(built.least, fl.step(list(mc.units or built.problem.units)))
        if self.rate is None:
            return step
        return max(fl.priced(), self.rate_at(mc.gpus()) * step)

    def refine(self, mc: MixedCandidate) -> bool:
        """Whether the cell's floors gained mixed_bound.fastest_floor just now (and the
        entry went back into the heap at its bound, if that rose)."""
        key = self.key(mc)
        fl = self.floors[key]
        if fl.split is not None:
            return False
        c, shared = mc.cand, self.shared(mc)
        caps = list(self.roots[shared][1])
        if shared not in self.fastest:
            vs = self.variants(mc)
            fastest = self.prices.fastest(vs, c.micro_batch_size)
            seg_len = [n for _, n in self.prices.segs]
            scale = [fl.m // r - 1.0 for _, _, r in vs]
            self.fastest[shared] = fastest_floor(
                fastest, seg_len, vs, caps, c.pp, scale, mc.degrees, mc.dp_needs
            )
        least_sum, busiest = self.fastest[shared]
        fl = replace(fl, split=least_sum + busiest)
        self.floors[key] = fl
        step = fl.step(list(mc.units or caps))
        bound = step if self.rate is None else max(fl.priced(), self.rate_at(mc.gpus()) * step)
        mc.bound = max(mc.bound, bound)
        self.push(mc, again=True)
        return True

    def visit(self, mc: MixedCandidate) -> None:
        """Build the cell; back into the heap at a tighter bound, else split or solve it."""
        if self.refine(mc):
            return
        built = self.build(mc)
        if built.problem is None:
            mc.status = "pruned-memory"
            return
        bound = self.box_bound(mc, built)
        if bound <= mc.bound * (1 + 1e-12) and self.pipe(built):
            bound = self.box_bound(mc, built)
        if bound > mc.bound * (1 + 1e-12):
            # MILPs go least built bound first, so the incumbent they set prunes the rest
            mc.bound = bound
            self.push(mc, again=True)
            return
        if self.rate is not None and not self.uniform(mc):
            mc.status = "split"
            for lo, hi in split_box(mc.units_low, mc.units):
                two_kinds = sum(1 for b in hi if b > 0) >= 2
                if two_kinds and box_feasible(built.masks, lo, hi, mc.cand.pp):
                    child = replace(mc, units=hi, units_low=lo, status="pending")
                    child.bound = max(mc.bound, self.box_bound(child, built))
                    if self.within_limit(child, built.least):
                        self.push(child)
            return
        self.solve(mc, built)

    def uniform(self, mc: MixedCandidate) -> bool:
        """Whether the box uses two kinds for sure and its rate and longest step are one."""
        assert self.rate is not None and mc.units is not None
        if sum(1 for a in mc.units_low if a > 0) < 2:
            return False
        lo, hi = mc.gpus(), mc.gpus(mc.units)
        same_rate = self.rate_at(lo) == self.rate_at(hi)
        return same_rate and self.limit_at(lo) == self.limit_at(hi)

    def within_limit(self, mc: MixedCandidate, least: float) -> bool:
        """Whether some placement of the box may meet its longest step (the least step of
        the box's largest units against the longest step its fewest GPUs allow)."""
        assert self.rate is not None and mc.units is not None
        step = max(least, self.floors[self.key(mc)].step(list(mc.units)))
        return step <= self.limit_at(mc.gpus()) * (1 + 1e-9)

    def solve(self, mc: MixedCandidate, built: _Built) -> None:
        mp = built.problem
        assert mp is not None
        r, longest = 1.0, math.inf
        if self.rate is not None:
            mp = replace(mp, units=list(mc.units), units_low=list(mc.units_low))
            r, longest = self.rate_at(mc.gpus()), self.limit_at(mc.gpus())
        mc.problem = mp
        step_cutoff = min(self.incumbent * (1 - REL_TOL) / r, longest * (1 + 1e-9))
        sol = solve_mixed(mp, step_cutoff, NODE_LIMIT, built.split)
        if sol.status in ("optimal", "node_limit"):
            sol = exact_objective(mp, sol)
        mc.solution = sol
        if sol.status not in ("optimal", "node_limit"):
            mc.status = sol.status
            return
        mc.status = "solved"
        mc.value = sol.objective * r
        if mc.value < self.incumbent:
            self.incumbent, self.best = mc.value, mc
