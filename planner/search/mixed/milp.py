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
               g_v = t_v + 16 r_v a code of (TP, DP) (every stage holding a block of a tied
               group's segments has one TP and one DP degree: the runtime sums a tied
               weight's gradient between matching shards)
    time:      T_j = sum_v T_jv,  T_jv = sum n t[v,s,o] + y[j,v] c[v,j] + sum_u w[j,v,u] hop[j,v,u]
               Q >= sum_v (m_v - 1) T_jv   (= (m_j - 1) T_j: one variant's part is nonzero)
    dp:        h[j,v] >= a[j,s] + y[j,v] - 1 (s with parameters);  h[j,v] <= y[j,v]
               E_j^i >= sum n d^i[v,s,o] + sum_v h[j,v] d^i_once[v];  E >= E_j^1 + E_j^2
    memory:    sum n (state + inflight_j act)[v,s,o] + X_j + Z_j <= sum_v y[j,v] (cap_v - r[v,j])
               X_j >= ws[v,s,o] u;  Z_j >= gather[v,s,o] u;  L_s u >= n
    host:      sum n host[v,s,o] <= sum_v y[j,v] hostcap_v
    optimizer: Opt >= sum n opt[v,s,o];  Off >= sum n off[v,s,o]   (per stage)
    split:     Q >= (m_min - 1) T*;  sum_j T_j >= S*;  Q + Opt + Off >= P*  (mixed_bound's
               cuts, which every placement meets: m_min the fewest micro-batches per replica)
Objective (= mixed_cost.step_time):
    sum_j T_j + Q + E + Opt + Off + K
    (K: the tied weights' gradient sum, priced at the slowest variant's: an upper bound when
    the first and last stages differ, the same whatever the placement)

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
import warnings
from dataclasses import dataclass, field

import cvxpy as cp
import numpy as np

from planner.search.milp.data import GIB, StageProblem
from planner.search.milp.solve import MIP_REL_GAP, undominated
from planner.search.milp.split_bound import SplitBound

NODE_LIMIT = 5_000  # a work limit (never the clock): the same plan on any machine


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


class _Structure:
    """One cvxpy problem per shape (stages, variants, option counts, tied groups), re-solved
    with new parameter values, as stage_milp does, so the outer loop pays canonicalisation once
    per shape."""

    def __init__(
        self,
        J: int,
        seg_len: list[int],
        n_opts: list[list[int]],
        has_params,
        variants: tuple[tuple[int, int, int], ...],
        n_kinds: int,
        groups: tuple[tuple[int, ...], ...],
    ) -> None:
        """The cvxpy model of the module docstring for one cell shape. Long because the cvxpy
        model's constraint families are written in the module docstring's order, each
        beside its name, and built once per cell shape."""
        V, S, K = len(n_opts), len(seg_len), n_kinds
        widths = [sum(row) for row in n_opts]
        C = sum(widths)
        self.J, self.V, self.S, self.C = J, V, S, C
        self.vcols = np.cumsum([0, *widths])
        self.scols = [np.cumsum([0, *row]) for row in n_opts]
        seg_of = np.concatenate([np.repeat(np.arange(S), row) for row in n_opts])
        variant_of = np.repeat(np.arange(V), widths)
        L = np.asarray(seg_len, dtype=float)
        Lcol = L[seg_of]
        Gs = np.zeros((C, S))
        Gs[np.arange(C), seg_of] = 1.0
        Gv = np.zeros((C, V))
        Gv[np.arange(C), variant_of] = 1.0
        codes = np.array([t + 16 * r for _, t, r in variants], dtype=float)  # (TP, DP)
        units_of = np.zeros((V, K))  # y[j,v] -> units of kind k_v
        for v, (k, t, r) in enumerate(variants):
            units_of[v, k] = t * r
        self.degrees = sorted({t for _, t, _ in variants})
        degree_of = np.array([[float(t == d) for d in self.degrees] for _, t, _ in variants])
        self.mults = sorted({r for _, _, r in variants})
        mult_of = np.array([[float(r == d) for d in self.mults] for _, _, r in variants])
        low = np.tril(np.ones((J, J)))
        par = cp.Parameter
        self.time, self.host = par(C), par(C)
        self.time_q = par(C)  # time (m_v - 1), v the column's variant
        self.optim, self.offl = par(C), par(C)
        self.ws, self.gather = par((J, C), nonneg=True), par((J, C), nonneg=True)
        self.limit = par((J, C), nonneg=True)  # L_s allow[v,s,o], per row
        self.memco, self.k1, self.k2 = par((J, C)), par((J, C)), par((J, C))
        self.stepco = par((J, C), nonneg=True)  # the optimizer step's states, GiB
        self.loss = par(J, nonneg=True)  # the loss's peak on the last stage, GiB
        self.k1h, self.k2h = par((J, V)), par((J, V))
        self.base, self.base_q = par((J, V)), par((J, V))
        self.room = par((J, V))  # capacity less the rank's other memory, GiB
        self.hostcap = par((J, V))
        self.units_hi, self.units_lo = par(K, nonneg=True), par(K, nonneg=True)
        self.need = par(len(self.degrees), nonneg=True)
        self.need_r = par(len(self.mults), nonneg=True)
        self.const_step = par(nonneg=True)
        # mixed_bound's T*, S*, P* (the first as (m_min - 1) T*): cuts every placement meets
        self.q_floor, self.sum_floor = par(nonneg=True), par(nonneg=True)
        self.weighted_floor = par(nonneg=True)
        n = cp.Variable((J, C), integer=True)
        y = cp.Variable((J, V), boolean=True)
        a = cp.Variable((J, S), boolean=True)
        h = cp.Variable((J, V), boolean=True)
        u = cp.Variable((J, C), boolean=True)
        T = cp.Variable(J, nonneg=True)
        Q, E = cp.Variable(nonneg=True), cp.Variable(nonneg=True)
        e1, e2 = cp.Variable(J, nonneg=True), cp.Variable(J, nonneg=True)
        X, Z = cp.Variable(J, nonneg=True), cp.Variable(J, nonneg=True)
        opt, off = cp.Variable(nonneg=True), cp.Variable(nonneg=True)
        onesC = np.ones((1, C))
        cnt = n @ Gs
        cum = low @ cnt
        units = cp.sum(y, axis=0) @ units_of
        cons = [
            n >= 0,
            cp.sum(y, axis=1) == 1,  # variant
            cp.sum(y, axis=0) @ degree_of >= self.need,  # needs
            cp.sum(y, axis=0) @ mult_of >= self.need_r,
            units <= self.units_hi,  # units
            units >= self.units_lo,
            n <= cp.multiply(y @ Gv.T, self.limit),  # link
            cp.sum(n, axis=0) @ Gs == L,  # place
            cp.sum(n, axis=1) >= 1,  # nonempty
            a <= cnt,
            cnt <= cp.multiply(a, np.tile(L, (J, 1))),  # has
        ]
        if S > 1:
            cons.append(cum[:, : S - 1] >= cp.multiply(a[:, 1:], np.tile(L[: S - 1], (J, 1))))
            if J > 1:
                cons.append(
                    cum[: J - 1, 1:] <= cp.multiply(1 - a[1:, : S - 1], np.tile(L[1:], (J - 1, 1)))
                )  # order_a / order_b
        T_expr = n @ self.time + cp.sum(cp.multiply(y, self.base), axis=1)
        Q_expr = n @ self.time_q + cp.sum(cp.multiply(y, self.base_q), axis=1)
        if J > 1:
            self.hop = par((J - 1, V * V), nonneg=True)
            self.hop_q = par((J - 1, V * V), nonneg=True)  # hop (m_v - 1), v the sender
            self.linked = par((J - 1, V * V), nonneg=True)  # 1 where the pair may meet
            w = cp.Variable((J - 1, V * V), nonneg=True)
            rows = np.kron(np.eye(V), np.ones((V, 1)))  # column (v, u) -> v
            cols = np.kron(np.ones((V, 1)), np.eye(V))  # column (v, u) -> u
            cons += [w @ rows == y[:-1], w @ cols == y[1:], w <= self.linked]  # pair
            T_expr = T_expr + cp.hstack([cp.sum(cp.multiply(w, self.hop), axis=1), np.zeros(1)])
            Q_expr = Q_expr + cp.hstack([cp.sum(cp.multiply(w, self.hop_q), axis=1), np.zeros(1)])
        spread = float(codes.max() - codes.min())
        if groups and spread > 0:
            degree = y @ codes  # stage j's (TP, DP) code
            P = cp.Variable(len(groups))
            for g, segs in enumerate(groups):
                for s in segs:
                    slack = spread * (1 - a[:, s])
                    cons += [degree - P[g] <= slack, P[g] - degree <= slack]  # tied
        cons += [T == T_expr, Q >= Q_expr]  # time

        cons += [Q >= self.q_floor, cp.sum(T) >= self.sum_floor]  # split
        cons.append(Q + opt + off >= self.weighted_floor)
        for s in range(S):
            if has_params[s]:
                cons.append(h >= a[:, s : s + 1] @ np.ones((1, V)) + y - 1)
        cons.append(h <= y)
        k1 = cp.sum(cp.multiply(n, self.k1), axis=1) + cp.sum(cp.multiply(h, self.k1h), axis=1)
        k2 = cp.sum(cp.multiply(n, self.k2), axis=1) + cp.sum(cp.multiply(h, self.k2h), axis=1)
        cons += [e1 >= k1, e2 >= k2, E >= e1 + e2]  # dp
        cons += [
            cp.multiply(u, np.tile(Lcol, (J, 1))) >= n,
            cp.reshape(X, (J, 1), order="C") @ onesC >= cp.multiply(u, self.ws),
            X >= self.loss,  # the loss and the largest op share the working set's slot
            cp.reshape(Z, (J, 1), order="C") @ onesC >= cp.multiply(u, self.gather),
            cp.sum(cp.multiply(n, self.memco), axis=1) + X + Z
            <= cp.sum(cp.multiply(y, self.room), axis=1),  # memory
            cp.sum(cp.multiply(n, self.stepco), axis=1)
            <= cp.sum(cp.multiply(y, self.room), axis=1),  # memory during the optimizer step
            n @ self.host <= cp.sum(cp.multiply(y, self.hostcap), axis=1),  # host
            opt >= n @ self.optim,
            off >= n @ self.offl,
        ]
        objective = cp.sum(T) + Q + E + opt + off + self.const_step
        self.n, self.y = n, y
        self.problem = cp.Problem(cp.Minimize(objective), cons)

    def load(
        self, mp: MixedProblem, keep: list[list[list[int]]], split: SplitBound, unit: float
    ) -> None:
        """The parameters of ``mp``, every time in units of ``unit`` seconds (``time_unit``)."""
        J, V = self.J, self.V
        self.q_floor.value = (mp.m_min - 1.0) * split.max_stage / unit
        self.sum_floor.value = split.sum_stages / unit
        self.weighted_floor.value = split.weighted_max / unit
        cat = np.concatenate
        sps = mp.per_variant

        def col(field: str) -> np.ndarray:
            return cat([cat(getattr(sp, field)) for sp in sps])

        allow = cat(
            [
                cat([np.isin(np.arange(len(t)), keep[v][s]) for s, t in enumerate(sp.time)])
                for v, sp in enumerate(sps)
            ]
        ).astype(float)
        seg_len = np.asarray(mp.seg_len, dtype=float)
        lcol = cat(
            [cat([np.full(len(t), seg_len[s]) for s, t in enumerate(sp.time)]) for sp in sps]
        )
        self.limit.value = np.tile(lcol * allow, (J, 1))
        self.time.value = col("time") / unit
        scale = np.array([mp.m_of(v) - 1.0 for v in range(V)])  # m_v - 1
        widths = [sum(map(len, sp.time)) for sp in sps]
        self.time_q.value = self.time.value * np.repeat(scale, widths)
        self.host.value = col("host") / GIB
        self.optim.value = col("optim") / unit
        self.offl.value = col("offl") / unit
        self.ws.value = np.tile(col("ws") / GIB, (J, 1))
        self.gather.value = np.tile(col("gather") / GIB, (J, 1))
        state, act = col("state"), col("act")
        inflight = np.repeat(np.array([sp.inflight for sp in sps], dtype=float).T, widths, axis=1)
        self.memco.value = (state[None, :] + inflight * act[None, :]) / GIB
        steps = [cat(sp.step) if sp.step is not None else np.zeros(w) for sp, w in zip(sps, widths)]
        self.stepco.value = np.tile(cat(steps) / GIB, (J, 1))
        self.loss.value = np.asarray(sps[0].loss_mem, dtype=float) / GIB
        self.k1.value = np.tile(col("dp_first"), (J, 1)) / unit
        self.k2.value = np.tile(col("dp_second"), (J, 1)) / unit
        self.k1h.value = np.tile([sp.dp_once[0] / unit for sp in sps], (J, 1))
        self.k2h.value = np.tile([sp.dp_once[1] / unit for sp in sps], (J, 1))
        self.base.value = np.asarray(mp.base_time, dtype=float).T / unit
        self.base_q.value = self.base.value * scale[None, :]
        self.room.value = np.stack(
            [(sp.capacity - np.asarray(sp.const_mem, dtype=float)) / GIB for sp in sps], axis=1
        )
        self.hostcap.value = np.tile([sp.host_capacity / GIB for sp in sps], (J, 1))
        self.units_hi.value = np.asarray(mp.units, dtype=float)
        self.units_lo.value = np.asarray(mp.low, dtype=float)
        self.need.value = np.array([float(d in mp.needs) for d in self.degrees])
        self.need_r.value = np.array([float(d in mp.dp_needs) for d in self.mults])
        self.const_step.value = mp.const_step / unit
        if J > 1:
            hop = np.asarray(mp.hop, dtype=float).reshape(J - 1, V * V)
            self.linked.value = np.isfinite(hop).astype(float)
            self.hop.value = np.where(np.isfinite(hop), hop, 0.0) / unit
            self.hop_q.value = self.hop.value * np.repeat(scale, V)[None, :]

    def read(self) -> tuple[list[int], list[list[list[int]]]]:
        y = np.rint(np.asarray(self.y.value)).astype(int)
        n = np.rint(np.asarray(self.n.value)).astype(int)
        variants = [int(np.argmax(y[j])) for j in range(self.J)]
        counts = []
        for j, v in enumerate(variants):
            row = n[j, self.vcols[v] : self.vcols[v + 1]]
            sc = self.scols[v]
            counts.append([row[sc[s] : sc[s + 1]].tolist() for s in range(self.S)])
        return variants, counts


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
    structures: dict | None = None,
    node_limit: int = NODE_LIMIT,
    split: SplitBound | None = None,
) -> MixedSolution:
    """Solve one candidate's mixed MILP; ``cutoff``: only placements faster than it matter
    (the best plan so far, a single kind's included), and HiGHS prunes with it. ``split``:
    mixed_bound's cuts, when the caller computed them (else none: all zero)."""
    if any(sp.v != 1 for sp in mp.per_variant):
        raise ValueError("the mixed-kind MILP covers plain 1F1B / GPipe pipelines (v = 1)")
    if split is not None and not split.feasible:  # no split fits: nothing to solve
        return MixedSolution("infeasible", float("inf"), [], [])
    keep = [undominated(sp) for sp in mp.per_variant]
    n_opts = [[len(t) for t in sp.time] for sp in mp.per_variant]
    has_params = tuple(mp.per_variant[0].has_params)
    variants = tuple(map(tuple, mp.variants))
    groups = tuple(tied_groups(mp.tied, len(mp.seg_len)))
    key = (
        "mixed",
        mp.J,
        tuple(mp.seg_len),
        tuple(map(tuple, n_opts)),
        has_params,
        variants,
        len(mp.kinds),
        groups,
    )
    structures = {} if structures is None else structures
    st = structures.get(key)
    if st is None:
        st = structures[key] = _Structure(
            mp.J, mp.seg_len, n_opts, has_params, variants, len(mp.kinds), groups
        )
    unit = time_unit(mp, split)
    st.load(mp, keep, split or SplitBound(0.0, 0.0, 0.0), unit)
    has_cutoff = cutoff is not None and np.isfinite(cutoff)
    opts = {
        "mip_max_nodes": int(node_limit),
        "mip_rel_gap": MIP_REL_GAP,
        "mip_abs_gap": 1e-12,
        "time_limit": float("inf"),
        "objective_bound": float(cutoff) / unit if has_cutoff else float("inf"),
    }
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            st.problem.solve(solver=cp.HIGHS, **opts)
    except cp.error.SolverError:
        return MixedSolution("error", float("inf"), [], [], time.perf_counter() - start)
    elapsed = time.perf_counter() - start
    info = st.problem.solver_stats.extra_stats
    nodes = int(getattr(info, "mip_node_count", 0))
    feasible = int(getattr(info, "primal_solution_status", 0)) == 2
    status = st.problem.status
    none = "cutoff" if has_cutoff else "infeasible"
    if status in ("infeasible", "infeasible_inaccurate") or not feasible:
        done = status in ("infeasible", "infeasible_inaccurate", "optimal")
        return MixedSolution(none if done else "no_solution", float("inf"), [], [], elapsed, nodes)
    value = float(st.problem.value) * unit
    if has_cutoff and value >= cutoff:  # proven only when HiGHS finished
        status = "cutoff" if status == "optimal" else "no_solution"
        return MixedSolution(status, float("inf"), [], [], elapsed, nodes)
    chosen, counts = st.read()
    status = "optimal" if status == "optimal" else "node_limit"
    kinds = [mp.kind_of(v) for v in chosen]
    tps = [mp.tp_of(v) for v in chosen]
    dps = [mp.dp_of(v) for v in chosen]
    return MixedSolution(status, value, chosen, counts, elapsed, nodes, kinds, tps, dps)
