"""The mixed-kind stage MILP: which variant, a device kind, a TP degree and a DP degree, runs
each pipeline stage, and which blocks and options each stage runs, exactly minimizing the
heterogeneous step time of one outer candidate.

The homogeneous MILP (planner.search.milp.solve) prices every stage with one profile, one TP
and one DP degree. Here they are a stage's decision: each variant v = (kind k_v, TP degree t_v,
DP multiple r_v) has its own numbers for the same candidate (its StageProblem: the cost model's
per-option time, memory, DP and optimizer terms under k_v's profile at TP t_v and DP dp r_v,
with its own micro-batches per replica m_v = n / (dp r_v), n the step's), and the hop from
stage j to j+1 costs what the two stages' variants make it (``mixed.hop_times``: a kind's own
link inside one kind, the pool's fabric between two, whole activations copied to every TP rank
where the degrees differ). One pipeline and micro-batch size; stage j holds dp r_j t_j ranks
(``Mesh.stage_tp``, ``stage_dp``), its replicas taking the step's micro-batches in turns.
Plain 1F1B / GPipe (v = 1: stage j is pp rank j); the runtime runs DP degrees that differ under
GPipe only, so the search gives r_v > 1 only to GPipe candidates.

Variables:
    y[j,v]     in {0,1}   stage j runs variant v
    n[j,v,s,o] in Z+      blocks of segment s on stage j with option o of variant v
    a[j,s]     in {0,1}   stage j holds some block of segment s
    w[j,v,u]   >= 0       stage j is of variant v and stage j+1 of variant u (j < J-1)
    h[j,v]     in {0,1}   stage j is of variant v and holds parameters
    u[j,v,s,o] in {0,1}   stage j runs some block of (s, o) of variant v (for the max terms)
    P_g                   the (TP, DP) code of tied group g's stages
    T_j, Q, E_j^1, E_j^2, E, X_j, Z_j, Opt, Off >= 0

Constraints (names in the code):
    variant:   sum_v y[j,v] = 1
    needs:     sum_j sum_{v: t_v = d} y[j,v] >= 1  for each degree d some stage must take,
               and likewise for each DP multiple in dp_needs (the search's cell of
               placements whose least and largest degrees and multiples are given)
    units:     lo_k <= sum_j sum_{v of kind k} t_v r_v y[j,v] <= hi_k
               (units: a kind's GPUs over dp. The time search has lo = 0, hi = G_k // dp,
               G_k the pool's GPUs of kind k; the rate search fixes lo = hi, or a range over
               which its rate does not change)
    link:      n[j,v,s,o] <= L_s allow[v,s,o] y[j,v]
    place, nonempty, has, order_a, order_b: as stage_milp, on cnt[j,s] = sum_{v,o} n[j,v,s,o]
    pair:      sum_u w[j,v,u] = y[j,v];  sum_v w[j,v,u] = y[j+1,u]  (with y binary, w is the
               product y[j,v] y[j+1,u]);  w[j,v,u] <= linked[v,u]  (no hop between kinds the
               pool joins by no fabric)
    tied:      |sum_v g_v y[j,v] - P_g| <= (g_max - g_min) (1 - a[j,s])  for s in group g,
               g_v = t_v + B r_v a code of (TP, DP), B = max(16, 1 + max t_v) (every stage
               holding a block of a tied group's segments has one TP and one DP degree: the
               runtime sums a tied weight's gradient between matching shards)
    time:      T_j = sum_v T_jv,  T_jv = sum n t[v,s,o] + y[j,v] c[v,j] + sum_u w[j,v,u] hop[j,v,u]
               Q >= sum_v (m_v - 1) T_jv   (= (m_j - 1) T_j: one variant's part is nonzero)
    dp:        h[j,v] >= a[j,s] + y[j,v] - 1 (s with parameters);  h[j,v] <= y[j,v]
               E_j^i >= sum n d^i[v,s,o] + sum_v h[j,v] d^i_once[v];  E >= E_j^1 + E_j^2
    memory:    sum n (state + inflight_j act)[v,s,o] + X_j + Z_j <= sum_v y[j,v] (cap_v - r[v,j])
               X_j >= ws[v,s,o] u;  X_j >= sum_v y[j,v] loss[v,j];  Z_j >= gather[v,s,o] u;
               L_s u >= n   (loss[v,j]: the loss's peak on stage j under v, which shares the
               working set's slot; a vocab-parallel loss's shrinks with v's TP degree)
    host:      sum n host[v,s,o] <= sum_v y[j,v] hostcap_v
    optimizer: Opt >= sum n opt[v,s,o];  Off >= sum n off[v,s,o]   (per stage)
    split:     Q >= (m_min - 1) T*;  sum_j T_j >= S*;  Q + Opt + Off >= P*  (mixed_bound's
               cuts, which every placement meets: m_min the fewest micro-batches per replica)
Objective (= mixed_cost.step_time):
    sum_j T_j + Q + E + Opt + Off + K
    (K: the tied weights' gradient sum, priced at the slowest variant's: an upper bound when
    the first and last stages differ, the same whatever the placement)

The model is HiGHS rows assembled with numpy, as the homogeneous MILP's
(``planner.search.milp.rows``: its ``Rows`` blocks, its ``cumulative`` order terms), over the
columns of ``MixedLayout``; one family of rows per line above, in this order.

Every time is in units of ``time_unit`` (a lower bound of the step's sum of stage times):
HiGHS's feasibility tolerances are absolute, and in seconds a step of tens of microseconds
sat within them. The search then prices the placement returned by ``cost.step_time``, the
number its plan reports, and takes it only where the two agree (``search.exact_objective``).

c[v,j] is what stage j pays per micro-batch besides its blocks and its outgoing hop (the loss
on the last stage); r[v,j] the rank's memory besides its blocks (reserved, p2p buffers, loss).
A tied group is a set of segments joined by tied weights (``MixedProblem.tied``): exact for the
usual tie of an embedding and a head that are segments of their own, stricter (every block of
a repeated segment) otherwise.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from planner.highs import Pattern, pass_model, quiet_highs
from planner.search.milp.columns import Columns
from planner.search.milp.data import GIB, StageProblem
from planner.search.milp.rows import Rows, cumulative
from planner.search.milp.solve import MIP_REL_GAP, undominated
from planner.search.milp.split_bound import SplitBound

NODE_LIMIT = 5_000  # a work limit (never the clock): the same plan on any machine
# HiGHS's row tolerances, in the MILP's units of time (a lower bound of the step, time_unit):
# at its defaults (1e-6 for a MILP) the solver may count a step that much of a unit short
FEASIBILITY_TOLERANCE = 1e-9


def variant_triples(variants) -> list[tuple[int, int, int]]:
    """Variants as (kind, TP degree, DP multiple): a (kind, TP) pair has multiple 1."""
    return [tuple(v) if len(v) == 3 else (*v, 1) for v in variants]


@dataclass
class MixedProblem:
    """One outer candidate's numbers under every variant (device kind, TP degree, DP multiple),
    the hops between variants, and what the pool lets each kind's stages add up to."""

    kinds: list[str]
    # (kind index, TP degree, DP multiple) of each variant; a (kind, TP) pair has multiple 1
    variants: list[tuple[int, ...]]
    per_variant: list[StageProblem]  # same pp, segments; v = 1; m its own (n / (dp r))
    base_time: np.ndarray  # (V, J) per micro-batch besides blocks and the outgoing hop
    hop: np.ndarray  # (J-1, V, V): hop j -> j+1, activations forward and gradients back;
    # inf where no fabric joins the two kinds (the pair is then forbidden)
    units: list[int]  # per kind: the most its stages' t r may add up to (GPUs // dp)
    const_step: float = 0.0
    units_low: list[int] | None = None  # per kind: the least they may add up to (None: 0)
    tied: list[tuple[int, int]] = field(default_factory=list)  # segments a weight ties
    needs: list[int] = field(default_factory=list)  # TP degrees some stage must take
    dp_needs: list[int] = field(default_factory=list)  # DP multiples some stage must take

    def __post_init__(self) -> None:
        self.variants = variant_triples(self.variants)

    @property
    def J(self) -> int:
        return self.per_variant[0].pp

    @property
    def seg_len(self) -> list[int]:
        return self.per_variant[0].seg_len

    @property
    def low(self) -> list[int]:
        return list(self.units_low) if self.units_low is not None else [0] * len(self.kinds)

    def kind_of(self, v: int) -> int:
        return self.variants[v][0]

    def tp_of(self, v: int) -> int:
        return self.variants[v][1]

    def dp_of(self, v: int) -> int:
        """Variant v's DP multiple r_v: its stage has dp r_v replicas."""
        return self.variants[v][2]

    def width(self, v: int) -> int:
        """Variant v's units: t_v r_v, its stage's GPUs over dp."""
        return self.variants[v][1] * self.variants[v][2]

    def m_of(self, v: int) -> int:
        """Variant v's micro-batches per replica."""
        return self.per_variant[v].m

    @property
    def m_min(self) -> int:
        """The fewest micro-batches per replica of any variant."""
        return min(sp.m for sp in self.per_variant)


@dataclass
class MixedSolution:
    status: str  # optimal | node_limit | infeasible | cutoff | no_solution
    objective: float
    variants: list[int]  # variant index per stage
    counts: list[list[list[int]]]  # [stage][segment][option of that stage's variant]
    solve_time_s: float = 0.0
    nodes: int = 0
    kinds: list[int] = field(default_factory=list)  # kind index per stage
    tps: list[int] = field(default_factory=list)  # TP degree per stage
    dps: list[int] = field(default_factory=list)  # DP multiple per stage
    # the MILP's own value of its placement, where the search set ``objective`` to the
    # placement's step time (search.exact_objective); nan until then
    milp_objective: float = math.nan


def tied_groups(tied: list[tuple[int, int]], n_segments: int) -> list[tuple[int, ...]]:
    """The segments tied weights join, as groups (a union of the pairs): every stage holding
    a block of one group must run one TP degree."""
    parent = list(range(n_segments))

    def root(s: int) -> int:
        while parent[s] != s:
            s = parent[s]
        return s

    for a, b in tied:
        parent[root(a)] = root(b)
    members: dict[int, list[int]] = {}
    for a, b in tied:
        for s in (a, b):
            group = members.setdefault(root(s), [])
            if s not in group:
                group.append(s)
    return [tuple(sorted(g)) for g in members.values()]


@dataclass(frozen=True)
class MixedLayout(Columns):
    """Where each variable's columns start: n (J x C, stage-major, C = every option of every
    segment of every variant), y (J x V), a (J x S), h (J x V), u (J x C), w ((J-1) x V x V),
    P (one per tied group), T (J), Q, E, dp_first (J), dp_second (J), X (J), Z (J), Opt, Off.
    ``n``, ``J`` and ``K`` (= C) are what rows.cumulative reads of a layout."""

    J: int
    V: int
    S: int
    K: int
    G: int

    def blocks(self) -> tuple[tuple[str, int], ...]:
        J, V, S, K, G = self.J, self.V, self.S, self.K, self.G
        return (
            ("n", J * K), ("y", J * V), ("a", J * S), ("h", J * V), ("u", J * K),
            ("w", max(J - 1, 0) * V * V), ("P", G), ("T", J), ("Q", 1), ("E", 1),
            ("dp_first", J), ("dp_second", J), ("X", J), ("Z", J), ("opt", 1), ("off", 1),
        )  # fmt: skip


@dataclass
class MixedModel:
    """One cell's MILP as HiGHS takes it (``planner.highs.pass_model``'s arguments), every
    time in units of ``unit`` seconds."""

    layout: MixedLayout
    vcols: np.ndarray  # first column of each variant's options within C
    scols: list[np.ndarray]  # per variant, first column of each segment's options
    cost: np.ndarray
    offset: float
    pattern: Pattern
    values: np.ndarray
    row_lower: np.ndarray
    row_upper: np.ndarray
    col_lower: np.ndarray
    col_upper: np.ndarray
    integer: np.ndarray

    def read(self, x: np.ndarray) -> tuple[list[int], list[list[list[int]]]]:
        """Each stage's variant, and its blocks per segment and option of that variant."""
        lay = self.layout
        y = np.rint(x[lay.y : lay.a]).astype(int).reshape(lay.J, lay.V)
        n = np.rint(x[lay.n : lay.y]).astype(int).reshape(lay.J, lay.K)
        variants = [int(np.argmax(y[j])) for j in range(lay.J)]
        counts = []
        for j, v in enumerate(variants):
            row = n[j, self.vcols[v] : self.vcols[v + 1]]
            sc = self.scols[v]
            counts.append([row[sc[s] : sc[s + 1]].tolist() for s in range(lay.S)])
        return variants, counts


@dataclass
class _Grid:
    """A cell's MILP shape and the column of every (stage, option) and (stage, variant) as
    numpy grids, which each family of rows indexes: jj, cc (J x C) and jv, vv (J x V) the
    stage and option or variant of each entry, ncol, ucol, ycol, hcol their columns of n, u,
    y, h, acol (J x S) those of a, cell the (stage, option) row of J x C families."""

    mp: MixedProblem
    unit: float
    lay: MixedLayout
    n_opts: list[list[int]]
    widths: list[int]
    seg_of: np.ndarray
    var_of: np.ndarray
    L: np.ndarray
    Lcol: np.ndarray
    js: np.ndarray
    jj: np.ndarray
    cc: np.ndarray
    jv: np.ndarray
    vv: np.ndarray
    cell: np.ndarray
    ncol: np.ndarray
    ucol: np.ndarray
    ycol: np.ndarray
    hcol: np.ndarray
    acol: np.ndarray

    def col(self, name: str) -> np.ndarray:
        """A StageProblem field over every option of every variant (C entries)."""
        return np.concatenate([np.concatenate(getattr(sp, name)) for sp in self.mp.per_variant])


def _grid(mp: MixedProblem, unit: float) -> _Grid:
    cat = np.concatenate
    n_opts = [[len(t) for t in sp.time] for sp in mp.per_variant]
    widths = [sum(row) for row in n_opts]
    J, V, S = mp.J, len(mp.variants), len(mp.seg_len)
    lay = MixedLayout(J, V, S, sum(widths), len(tied_groups(mp.tied, S)))
    C = lay.K
    seg_of = cat([np.repeat(np.arange(S), row) for row in n_opts])
    L = np.asarray(mp.seg_len, dtype=float)
    js = np.arange(J)
    jj, cc = np.meshgrid(js, np.arange(C), indexing="ij")
    jv, vv = np.meshgrid(js, np.arange(V), indexing="ij")
    return _Grid(
        mp, unit, lay, n_opts, widths, seg_of, np.repeat(np.arange(V), widths), L, L[seg_of],
        js, jj, cc, jv, vv, jj * C + cc, lay.n + jj * C + cc, lay.u + jj * C + cc,
        lay.y + jv * V + vv, lay.h + jv * V + vv, lay.a + js[:, None] * S + np.arange(S)[None, :],
    )  # fmt: skip


def _placement_rows(rows: Rows, g: _Grid, keep: list[list[list[int]]]) -> np.ndarray:
    """variant, needs, units, link, place, nonempty, has, order_a, order_b; returns each
    option column's most blocks (0 for an option outside ``keep``)."""
    inf, cat = np.inf, np.concatenate
    mp, sps, variants, lay = g.mp, g.mp.per_variant, g.mp.variants, g.lay
    J, V, S, C = lay.J, lay.V, lay.S, lay.K
    seg_of, var_of, L, Lcol = g.seg_of, g.var_of, g.L, g.Lcol
    js, jj, cc, jv, vv, cell = g.js, g.jj, g.cc, g.jv, g.vv, g.cell
    ncol, ycol, acol = g.ncol, g.ycol, g.acol
    ss = np.arange(S)
    # variant: one per stage
    rows.add(np.ones(J), 1.0, (jv, ycol, 1.0))
    # needs: some stage at each needed TP degree and DP multiple
    for of, needed in ((1, mp.needs), (2, mp.dp_needs)):
        for d in sorted({x[of] for x in variants}):
            mine = np.array([float(x[of] == d) for x in variants])
            rows.add([float(d in needed)], inf, (0, ycol, mine[vv]))
    # units: lo_k <= sum_j sum_{v of k} t_v r_v y[j, v] <= hi_k
    kind = np.array([mp.kind_of(v) for v in range(V)])
    width = np.array([mp.width(v) for v in range(V)], dtype=float)
    rows.add(np.asarray(mp.low, float), np.asarray(mp.units, float), (kind[vv], ycol, width[vv]))
    # link: n[j, c] <= L_s allow[c] y[j, v(c)]
    allow = cat(
        [
            cat([np.isin(np.arange(len(t)), keep[v][s]) for s, t in enumerate(sp.time)])
            for v, sp in enumerate(sps)
        ]
    ).astype(float)
    limit = Lcol * allow
    cell = jj * C + cc
    rows.add(
        np.full(J * C, -inf), 0.0, (cell, ncol, 1.0), (cell, lay.y + jj * V + var_of[cc], -limit)
    )
    # place, nonempty, has, order_a, order_b: as the stage MILP's, on cnt[j, s]
    rows.add(L, L, (seg_of[cc], ncol, 1.0))
    rows.add(np.ones(J), inf, (jj, ncol, 1.0))
    js_cell = jj * S + seg_of[cc]
    grid = js[:, None] * S + ss
    rows.add(np.full(J * S, -inf), 0.0, (js_cell, ncol, -1.0), (grid, acol, 1.0))
    rows.add(np.full(J * S, -inf), 0.0, (js_cell, ncol, 1.0), (grid, acol, -L))
    if S > 1:
        r, c, a_rows = cumulative(lay, seg_of, J, S, 0)
        rows.add(np.zeros(J * (S - 1)), inf, (r, c, 1.0), (a_rows, acol[:, 1:], -L[: S - 1]))
        if J > 1:
            r, c, a_rows = cumulative(lay, seg_of, J - 1, S, 1)
            upper = np.tile(L[1:], J - 1)
            rows.add(
                np.full(len(upper), -inf), upper, (r, c, 1.0), (a_rows, acol[1:, : S - 1], L[1:])
            )
    return limit


def _time_rows(rows: Rows, g: _Grid, split: SplitBound) -> np.ndarray:
    """time, pair, tied and split; returns the upper bounds of w (0 where no fabric joins
    the pair)."""
    inf = np.inf
    mp, variants, lay, unit = g.mp, g.mp.variants, g.lay, g.unit
    J, V, S = lay.J, lay.V, lay.S
    js, jj, cc, jv, vv, var_of = g.js, g.jj, g.cc, g.jv, g.vv, g.var_of
    ncol, ycol, acol, col = g.ncol, g.ycol, g.acol, g.col
    q = np.array([mp.m_of(v) - 1.0 for v in range(V)])  # m_v - 1
    time_c = col("time") / unit
    base = np.asarray(mp.base_time, dtype=float).T / unit  # (J, V)
    groups = tied_groups(mp.tied, S)
    # time: T_j = n_j . t + y_j . base_j + w_j . hop_j;  Q >= the same, each term (m_v - 1)
    # times over, v the stage's (the sender's for the hop)
    t_terms = [(js, lay.T + js, 1.0), (jj, ncol, -time_c[cc]), (jv, ycol, -base)]
    q_terms = [
        (js, lay.Q, 1.0),
        (jj, ncol, -(time_c * q[var_of])[cc]),
        (jv, ycol, -base * q[None, :]),
    ]
    w_upper = np.zeros(0)
    if J > 1:
        hop = np.asarray(mp.hop, dtype=float).reshape(J - 1, V * V)
        w_upper = np.isfinite(hop).astype(float).ravel()
        hop = np.where(np.isfinite(hop), hop, 0.0) / unit
        jw, pw = np.meshgrid(js[:-1], np.arange(V * V), indexing="ij")
        wcol = lay.w + jw * V * V + pw
        t_terms.append((jw, wcol, -hop))
        q_terms.append((jw, wcol, -hop * np.repeat(q, V)[None, :]))
        # pair: sum_u w[j, v, u] = y[j, v];  sum_v w[j, v, u] = y[j+1, u]
        sender, receiver = pw // V, pw % V
        pairs = (J - 1) * V
        rows.add(
            np.zeros(pairs),
            0.0,
            (jw * V + sender, wcol, 1.0),
            (jv[:-1] * V + vv[:-1], ycol[:-1], -1.0),
        )
        rows.add(
            np.zeros(pairs),
            0.0,
            (jw * V + receiver, wcol, 1.0),
            (jv[:-1] * V + vv[:-1], ycol[1:], -1.0),
        )
    rows.add(np.zeros(J), 0.0, *t_terms)
    rows.add(np.zeros(J), inf, *q_terms)
    # tied: |sum_v g_v y[j, v] - P_g| <= spread (1 - a[j, s]) for s in group g
    # a code per (TP, DP): the DP multiple's base above every TP degree, or two pairs would
    # share a code (16 + 16 * 2 = 32 + 16 * 1) on nodes of more than 16 GPUs
    base = max(16, 1 + max(t for _, t, _ in variants))
    codes = np.array([t + base * r for _, t, r in variants], dtype=float)
    spread = float(codes.max() - codes.min())
    if groups and spread > 0:
        for g, segs in enumerate(groups):
            for s in segs:
                for sign in (1.0, -1.0):
                    rows.add(
                        np.full(J, -inf),
                        spread,
                        (jv, ycol, sign * codes[vv]),
                        (js, lay.P + g, -sign),
                        (js, acol[:, s], spread),
                    )
    # split: sum_j T_j >= S*;  Q + Opt + Off >= P*  (Q >= (m_min - 1) T* as Q's lower bound)
    weighted = split.weighted_max if math.isfinite(split.weighted_max) else 0.0
    rows.add([split.sum_stages / unit], inf, (np.zeros(J, int), lay.T + js, 1.0))
    rows.add([weighted / unit], inf, (np.zeros(3, int), [lay.Q, lay.opt, lay.off], 1.0))
    return w_upper


def _resource_rows(rows: Rows, g: _Grid) -> None:
    """dp, memory, host and optimizer."""
    inf, cat = np.inf, np.concatenate
    sps, lay, unit, widths = g.mp.per_variant, g.lay, g.unit, g.widths
    J, V, S, C = lay.J, lay.V, lay.S, lay.K
    js, jj, cc, jv, vv, cell, Lcol = g.js, g.jj, g.cc, g.jv, g.vv, g.cell, g.Lcol
    ncol, ucol, ycol, hcol, acol, col = g.ncol, g.ucol, g.ycol, g.hcol, g.acol, g.col
    # dp: h[j, v] >= a[j, s] + y[j, v] - 1 (s with parameters);  h <= y
    for s in range(S):
        if sps[0].has_params[s]:
            rows.add(
                np.full(J * V, -inf),
                1.0,
                (jv * V + vv, acol[:, s : s + 1], 1.0),
                (jv * V + vv, ycol, 1.0),
                (jv * V + vv, hcol, -1.0),
            )
    rows.add(np.full(J * V, -inf), 0.0, (jv * V + vv, hcol, 1.0), (jv * V + vv, ycol, -1.0))
    # e^i_j >= n_j . d^i + h_j . d^i_once;  E >= e^1_j + e^2_j
    for ecol, name, i in ((lay.dp_first, "dp_first", 0), (lay.dp_second, "dp_second", 1)):
        once = np.array([sp.dp_once[i] for sp in sps]) / unit
        rows.add(
            np.zeros(J),
            inf,
            (js, ecol + js, 1.0),
            (jj, ncol, -(col(name) / unit)[cc]),
            (jv, hcol, -once[vv]),
        )
    rows.add(
        np.zeros(J),
        inf,
        (js, lay.E, 1.0),
        (js, lay.dp_first + js, -1.0),
        (js, lay.dp_second + js, -1.0),
    )
    # memory: L_s u >= n;  X_j >= ws u;  X_j >= loss of y_j;  Z_j >= gather u;
    # blocks + X + Z <= room of y_j
    rows.add(np.zeros(J * C), inf, (cell, ucol, Lcol[cc]), (cell, ncol, -1.0))
    loss = np.array([sp.loss_mem for sp in sps], dtype=float).T / GIB  # (J, V)
    rows.add(np.zeros(J), inf, (js, lay.X + js, 1.0), (jv, ycol, -loss))
    for xcol, name in ((lay.X, "ws"), (lay.Z, "gather")):
        rows.add(np.zeros(J * C), inf, (cell, xcol + jj, 1.0), (cell, ucol, -(col(name) / GIB)[cc]))
    inflight = np.repeat(np.array([sp.inflight for sp in sps], dtype=float).T, widths, axis=1)
    memco = (col("state")[None, :] + inflight * col("act")[None, :]) / GIB
    room = np.stack(
        [(sp.capacity - np.asarray(sp.const_mem, dtype=float)) / GIB for sp in sps], axis=1
    )  # (J, V)
    rows.add(
        np.full(J, -inf),
        0.0,
        (jj, ncol, memco),
        (js, lay.X + js, 1.0),
        (js, lay.Z + js, 1.0),
        (jv, ycol, -room),
    )
    steps = [cat(sp.step) if sp.step is not None else np.zeros(w) for sp, w in zip(sps, widths)]
    rows.add(np.full(J, -inf), 0.0, (jj, ncol, (cat(steps) / GIB)[cc]), (jv, ycol, -room))
    hostcap = np.array([sp.host_capacity / GIB for sp in sps])
    rows.add(np.full(J, -inf), 0.0, (jj, ncol, (col("host") / GIB)[cc]), (jv, ycol, -hostcap[vv]))
    # optimizer: Opt >= n_j . opt;  Off >= n_j . off
    for ocol, name in ((lay.opt, "optim"), (lay.off, "offl")):
        rows.add(np.zeros(J), inf, (js, ocol, 1.0), (jj, ncol, -(col(name) / unit)[cc]))


def mixed_model(
    mp: MixedProblem, keep: list[list[list[int]]], split: SplitBound, unit: float
) -> MixedModel:
    """The MILP of the module docstring for ``mp``, options outside ``keep`` fixed to 0,
    mixed_bound's cuts from ``split``, times in units of ``unit`` seconds: its rows
    assembled family by family in the docstring's order (rows.Rows), one numpy block each."""
    inf, cat = np.inf, np.concatenate
    g = _grid(mp, unit)
    lay, J = g.lay, mp.J
    rows = Rows()
    limit = _placement_rows(rows, g, keep)
    w_upper = _time_rows(rows, g, split)
    _resource_rows(rows, g)
    pattern = Pattern.of(cat(rows.rows), cat(rows.cols), (rows.count, lay.columns))
    col_lower = np.zeros(lay.columns)
    col_upper = np.full(lay.columns, inf)
    col_upper[lay.n : lay.y] = np.tile(limit, J)
    col_upper[lay.y : lay.w] = 1.0  # y, a, h, u binary
    col_upper[lay.w : lay.P] = w_upper
    col_lower[lay.P : lay.T] = -inf
    col_lower[lay.Q] = (mp.m_min - 1.0) * split.max_stage / unit
    integer = np.zeros(lay.columns, bool)
    integer[lay.n : lay.w] = True
    cost = np.zeros(lay.columns)
    cost[lay.T : lay.T + J] = 1.0
    cost[[lay.Q, lay.E, lay.opt, lay.off]] = 1.0
    vcols = np.cumsum([0, *g.widths])
    scols = [np.cumsum([0, *row]) for row in g.n_opts]
    return MixedModel(
        lay, vcols, scols, cost, mp.const_step / unit, pattern, cat(rows.vals),
        cat(rows.lower), cat(rows.upper), col_lower, col_upper, integer,
    )  # fmt: skip


def time_unit(mp: MixedProblem, split: SplitBound | None) -> float:
    """The MILP's unit of time, in seconds: a lower bound of every placement's sum of stage
    times (mixed_bound's S* when the caller computed it, else every block at its fastest
    option of any variant), so that the step is a few units. HiGHS's feasibility tolerances
    are absolute (1e-6 on a MILP's rows): priced in seconds, a step of 3e-5 s left the solver
    free to count its optimizer term 1e-6 s short, a 3% error its certificate did not see."""
    floor = split.sum_stages if split is not None else 0.0
    if not (math.isfinite(floor) and floor > 0):
        floor = sum(
            length * min(float(np.min(sp.time[s])) for sp in mp.per_variant)
            for s, length in enumerate(mp.seg_len)
        )
    return floor if math.isfinite(floor) and floor > 0 else 1.0


def solve_mixed(
    mp: MixedProblem,
    cutoff: float | None = None,
    node_limit: int = NODE_LIMIT,
    split: SplitBound | None = None,
) -> MixedSolution:
    """Solve one candidate's mixed MILP; ``cutoff``: only placements faster than it matter
    (the best plan so far, a single kind's included), and HiGHS prunes with it. ``split``:
    mixed_bound's cuts, when the caller computed them (else none: all zero). The statuses
    are solve_stage_milp's."""
    import highspy

    if any(sp.v != 1 for sp in mp.per_variant):
        raise ValueError("the mixed-kind MILP covers plain 1F1B / GPipe pipelines (v = 1)")
    if split is not None and not split.feasible:  # no split fits: nothing to solve
        return MixedSolution("infeasible", float("inf"), [], [])
    keep = [undominated(sp) for sp in mp.per_variant]
    unit = time_unit(mp, split)
    model = mixed_model(mp, keep, split or SplitBound(0.0, 0.0, 0.0), unit)
    has_cutoff = cutoff is not None and np.isfinite(cutoff)
    h = quiet_highs()
    for name, value in (
        ("mip_max_nodes", int(node_limit)),
        ("mip_rel_gap", MIP_REL_GAP),
        ("mip_abs_gap", 1e-12),
        ("mip_feasibility_tolerance", FEASIBILITY_TOLERANCE),
        ("primal_feasibility_tolerance", FEASIBILITY_TOLERANCE),
    ):
        h.setOptionValue(name, value)
    if has_cutoff:
        h.setOptionValue("objective_bound", float(cutoff) / unit)
    pass_model(
        h, model.cost, model.pattern, model.values, model.row_lower, model.row_upper,
        model.col_lower, model.col_upper, model.integer, model.offset,
    )  # fmt: skip
    start = time.perf_counter()
    h.run()
    elapsed = time.perf_counter() - start
    info = h.getInfo()
    nodes = int(info.mip_node_count)
    feasible = int(info.primal_solution_status) == 2  # kSolutionStatusFeasible
    status = h.getModelStatus()
    optimal = status == highspy.HighsModelStatus.kOptimal
    none = "cutoff" if has_cutoff else "infeasible"
    if status == highspy.HighsModelStatus.kInfeasible or not feasible:
        done = optimal or status == highspy.HighsModelStatus.kInfeasible
        return MixedSolution(none if done else "no_solution", float("inf"), [], [], elapsed, nodes)
    x = np.asarray(h.getSolution().col_value)
    value = (float(model.cost @ x) + model.offset) * unit
    if has_cutoff and value >= cutoff:  # proven only when HiGHS finished
        kind = "cutoff" if optimal else "no_solution"
        return MixedSolution(kind, float("inf"), [], [], elapsed, nodes)
    chosen, counts = model.read(x)
    kind = "optimal" if optimal else "node_limit"
    kinds = [mp.kind_of(v) for v in chosen]
    tps = [mp.tp_of(v) for v in chosen]
    dps = [mp.dp_of(v) for v in chosen]
    return MixedSolution(kind, value, chosen, counts, elapsed, nodes, kinds, tps, dps)
