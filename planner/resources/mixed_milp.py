"""The mixed-kind stage MILP: which device kind runs each pipeline stage, and which blocks and
options each stage runs, exactly minimizing the heterogeneous step time of one outer candidate.

The homogeneous MILP (planner.search.stage_milp) prices every stage with one profile. Here the
stage's kind is a decision: each kind k has its own numbers for the same candidate (its
StageProblem: the cost model's per-option time, memory, DP and optimizer terms under k's
profile), and the hop from stage j to j+1 costs k's own link when both are of kind k and the
pool's fabric when they differ. One pipeline, one (pp, dp, tp), one micro-batch count m: the
DP degree is homogeneous within a stage and the same on every stage, so the runtime's
(pp, dp, tp) device mesh runs the plan unchanged. Plain 1F1B / GPipe (v = 1: stage j is pp
rank j).

Sets: stages j = 0..J-1, kinds k, segments s with L_s blocks, options o of (k, s) (kinds may
have different option lists: the intra-block ILP's variants depend on the profile).

Variables:
    y[j,k]     in {0,1}   stage j runs on kind k
    n[j,k,s,o] in Z+      blocks of segment s on stage j with option o of kind k
    a[j,s]     in {0,1}   stage j holds some block of segment s
    w[j,k,l]   in {0,1}   stage j is of kind k and stage j+1 of kind l (j < J-1)
    h[j,k]     in {0,1}   stage j is of kind k and holds parameters
    u[j,k,s,o] in {0,1}   stage j runs some block of (s, o) of kind k (for the max terms)
    T_j, Tmax, E_j^1, E_j^2, E, X_j, Z_j, Opt, Off >= 0

Constraints (names in the code):
    kind:      sum_k y[j,k] = 1
    avail:     sum_j y[j,k] <= floor(G_k / (dp tp))       (G_k: GPUs of kind k in the pool;
               caps that add up to J fix each kind's stage count, as the cost-objective
               search sets them: every stage has a kind)
    link:      n[j,k,s,o] <= L_s allow[k,s,o] y[j,k]
    place, nonempty, has, order_a, order_b: as stage_milp, on cnt[j,s] = sum_{k,o} n[j,k,s,o]
    pair:      w[j,k,l] >= y[j,k] + y[j+1,l] - 1;  sum_{k,l} w[j,k,l] = 1  (so w is the product)
               w[j,k,l] <= linked[k,l]   (no hop between kinds the pool joins by no fabric)
    time:      T_j = sum n t[k,s,o] + sum_k y[j,k] c[k,j] + sum_{k,l} w[j,k,l] hop[j,k,l]
               Tmax >= T_j
    dp:        h[j,k] >= a[j,s] + y[j,k] - 1 (s with parameters);  h[j,k] <= y[j,k]
               E_j^i >= sum n d^i[k,s,o] + sum_k h[j,k] d^i_once[k];  E >= E_j^1 + E_j^2
    memory:    sum n (state + inflight_j act)[k,s,o] + X_j + Z_j <= sum_k y[j,k] (cap_k - r[k,j])
               X_j >= ws[k,s,o] u;  Z_j >= gather[k,s,o] u;  L_s u >= n
    host:      sum n host[k,s,o] <= sum_k y[j,k] hostcap_k
    optimizer: Opt >= sum n opt[k,s,o];  Off >= sum n off[k,s,o]   (per stage)
Objective (= mixed_cost.step_time):
    sum_j T_j + (m - 1) Tmax + E + Opt + Off + K
    (K: the tied weights' gradient sum, priced at the slowest kind's: an upper bound when the
    first and last stages differ, the same whatever the placement)

c[k,j] is what stage j pays per micro-batch besides its blocks and its outgoing hop (the loss
on the last stage); r[k,j] the rank's memory besides its blocks (reserved, p2p buffers, loss).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import cvxpy as cp
import numpy as np

from planner.search.split_bound import SplitBound
from planner.search.stage_data import GIB, StageProblem
from planner.search.stage_milp import MIP_REL_GAP, undominated

NODE_LIMIT = 5_000  # a work limit (never the clock): the same plan on any machine


@dataclass
class MixedProblem:
    """One outer candidate's numbers under every kind, and the hops between kinds."""

    kinds: list[str]
    per_kind: list[StageProblem]  # same pp, m, segments; v = 1
    base_time: np.ndarray  # (K, J) per micro-batch besides blocks and the outgoing hop
    hop: np.ndarray  # (J-1, K, K): hop j -> j+1, activations forward and gradients back;
    # inf where no fabric joins the two kinds (the pair is then forbidden)
    stage_cap: list[int]  # per kind: how many stages of dp*tp GPUs the pool holds
    const_step: float = 0.0

    @property
    def J(self) -> int:
        return self.per_kind[0].pp

    @property
    def m(self) -> int:
        return self.per_kind[0].m

    @property
    def seg_len(self) -> list[int]:
        return self.per_kind[0].seg_len


@dataclass
class MixedSolution:
    status: str  # optimal | node_limit | infeasible | cutoff | no_solution
    objective: float
    kinds: list[int]  # kind index per stage
    counts: list[list[list[int]]]  # [stage][segment][option of that stage's kind]
    solve_time_s: float = 0.0
    nodes: int = 0


class _Structure:
    """One cvxpy problem per shape (stages, kinds, option counts), re-solved with new parameter
    values, as stage_milp does, so the outer loop pays canonicalisation once per shape."""

    def __init__(self, J: int, seg_len: list[int], n_opts: list[list[int]], has_params) -> None:
        K, S = len(n_opts), len(seg_len)
        widths = [sum(row) for row in n_opts]
        C = sum(widths)
        self.J, self.K, self.S, self.C = J, K, S, C
        self.kcols = np.cumsum([0, *widths])
        self.scols = [np.cumsum([0, *row]) for row in n_opts]
        seg_of = np.concatenate([np.repeat(np.arange(S), row) for row in n_opts])
        kind_of = np.repeat(np.arange(K), widths)
        L = np.asarray(seg_len, dtype=float)
        Lcol = L[seg_of]
        Gs = np.zeros((C, S))
        Gs[np.arange(C), seg_of] = 1.0
        Gk = np.zeros((C, K))
        Gk[np.arange(C), kind_of] = 1.0
        low = np.tril(np.ones((J, J)))
        par = cp.Parameter
        self.time, self.host = par(C), par(C)
        self.optim, self.offl = par(C), par(C)
        self.ws, self.gather = par((J, C), nonneg=True), par((J, C), nonneg=True)
        self.limit = par((J, C), nonneg=True)  # L_s allow[k,s,o], per row
        self.memco, self.k1, self.k2 = par((J, C)), par((J, C)), par((J, C))
        self.stepco = par((J, C), nonneg=True)  # the optimizer step's states, GiB
        self.loss = par(J, nonneg=True)  # the loss's peak on the last stage, GiB
        self.k1h, self.k2h = par((J, K)), par((J, K))
        self.base = par((J, K))
        self.room = par((J, K))  # capacity less the rank's other memory, GiB
        self.hostcap = par((J, K))
        self.stage_cap = par(K, nonneg=True)
        self.c_t = par(nonneg=True)
        self.const_step = par(nonneg=True)
        # mixed_bound's T*, S*, P*: cuts every placement satisfies
        self.tmax_floor, self.sum_floor = par(nonneg=True), par(nonneg=True)
        self.weighted_floor = par(nonneg=True)
        n = cp.Variable((J, C), integer=True)
        y = cp.Variable((J, K), boolean=True)
        a = cp.Variable((J, S), boolean=True)
        h = cp.Variable((J, K), boolean=True)
        u = cp.Variable((J, C), boolean=True)
        T = cp.Variable(J, nonneg=True)
        tmax, E = cp.Variable(nonneg=True), cp.Variable(nonneg=True)
        e1, e2 = cp.Variable(J, nonneg=True), cp.Variable(J, nonneg=True)
        X, Z = cp.Variable(J, nonneg=True), cp.Variable(J, nonneg=True)
        opt, off = cp.Variable(nonneg=True), cp.Variable(nonneg=True)
        onesC = np.ones((1, C))
        cnt = n @ Gs
        cum = low @ cnt
        cons = [
            n >= 0,
            cp.sum(y, axis=1) == 1,  # kind
            cp.sum(y, axis=0) <= self.stage_cap,  # avail
            n <= cp.multiply(y @ Gk.T, self.limit),  # link
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
        if J > 1:
            self.hop = par((J - 1, K * K), nonneg=True)
            w = cp.Variable((J - 1, K * K), boolean=True)
            A = np.kron(np.eye(K), np.ones((1, K)))  # y[j,k] -> columns (k, *)
            B = np.kron(np.ones((1, K)), np.eye(K))  # y[j+1,l] -> columns (*, l)
            self.linked = par((J - 1, K * K), nonneg=True)  # 1 where a fabric joins k and l
            cons += [w >= y[:-1] @ A + y[1:] @ B - 1, cp.sum(w, axis=1) == 1]  # pair
            cons.append(w <= self.linked)  # no hop between kinds without a fabric
            hops = cp.sum(cp.multiply(w, self.hop), axis=1)
            T_expr = T_expr + cp.hstack([hops, np.zeros(1)])
        cons += [T == T_expr, tmax >= T]  # time
        cons += [tmax >= self.tmax_floor, cp.sum(T) >= self.sum_floor]  # split
        cons.append(self.c_t * tmax + opt + off >= self.weighted_floor)
        for s in range(S):
            if has_params[s]:
                cons.append(h >= a[:, s : s + 1] @ np.ones((1, K)) + y - 1)
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
        objective = cp.sum(T) + self.c_t * tmax + E + opt + off + self.const_step
        self.n, self.y = n, y
        self.problem = cp.Problem(cp.Minimize(objective), cons)

    def load(self, mp: MixedProblem, keep: list[list[list[int]]], split: SplitBound) -> None:
        J, K = self.J, self.K
        self.tmax_floor.value = split.max_stage
        self.sum_floor.value = split.sum_stages
        self.weighted_floor.value = split.weighted_max
        cat = np.concatenate
        ks = mp.per_kind

        def col(field: str) -> np.ndarray:
            return cat([cat(getattr(sp, field)) for sp in ks])

        allow = cat(
            [
                cat([np.isin(np.arange(len(t)), keep[k][s]) for s, t in enumerate(sp.time)])
                for k, sp in enumerate(ks)
            ]
        ).astype(float)
        seg_len = np.asarray(mp.seg_len, dtype=float)
        lcol = cat([cat([np.full(len(t), seg_len[s]) for s, t in enumerate(sp.time)]) for sp in ks])
        self.limit.value = np.tile(lcol * allow, (J, 1))
        self.time.value = col("time")
        self.host.value = col("host") / GIB
        self.optim.value = col("optim")
        self.offl.value = col("offl")
        self.ws.value = np.tile(col("ws") / GIB, (J, 1))
        self.gather.value = np.tile(col("gather") / GIB, (J, 1))
        state, act = col("state"), col("act")
        inflight = np.asarray(ks[0].inflight, dtype=float)[:, None]
        self.memco.value = (state[None, :] + inflight * act[None, :]) / GIB
        steps = [
            cat(sp.step) if sp.step is not None else np.zeros(sum(map(len, sp.time))) for sp in ks
        ]
        self.stepco.value = np.tile(cat(steps) / GIB, (J, 1))
        self.loss.value = np.asarray(ks[0].loss_mem, dtype=float) / GIB
        self.k1.value = np.tile(col("dp_first"), (J, 1))
        self.k2.value = np.tile(col("dp_second"), (J, 1))
        self.k1h.value = np.tile([sp.dp_once[0] for sp in ks], (J, 1))
        self.k2h.value = np.tile([sp.dp_once[1] for sp in ks], (J, 1))
        self.base.value = np.asarray(mp.base_time, dtype=float).T
        self.room.value = np.stack(
            [(sp.capacity - np.asarray(sp.const_mem, dtype=float)) / GIB for sp in ks], axis=1
        )
        self.hostcap.value = np.tile([sp.host_capacity / GIB for sp in ks], (J, 1))
        self.stage_cap.value = np.asarray(mp.stage_cap, dtype=float)
        self.c_t.value = mp.m - 1.0
        self.const_step.value = mp.const_step
        if J > 1:
            hop = np.asarray(mp.hop, dtype=float).reshape(J - 1, K * K)
            self.linked.value = np.isfinite(hop).astype(float)
            self.hop.value = np.where(np.isfinite(hop), hop, 0.0)

    def read(self) -> tuple[list[int], list[list[list[int]]]]:
        y = np.rint(np.asarray(self.y.value)).astype(int)
        n = np.rint(np.asarray(self.n.value)).astype(int)
        kinds = [int(np.argmax(y[j])) for j in range(self.J)]
        counts = []
        for j, k in enumerate(kinds):
            row = n[j, self.kcols[k] : self.kcols[k + 1]]
            sc = self.scols[k]
            counts.append([row[sc[s] : sc[s + 1]].tolist() for s in range(self.S)])
        return kinds, counts


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
    if any(sp.v != 1 for sp in mp.per_kind):
        raise ValueError("the mixed-kind MILP covers plain 1F1B / GPipe pipelines (v = 1)")
    keep = [undominated(sp) for sp in mp.per_kind]
    n_opts = [[len(t) for t in sp.time] for sp in mp.per_kind]
    has_params = tuple(mp.per_kind[0].has_params)
    key = ("mixed", mp.J, tuple(mp.seg_len), tuple(map(tuple, n_opts)), has_params)
    structures = {} if structures is None else structures
    st = structures.get(key)
    if st is None:
        st = structures[key] = _Structure(mp.J, mp.seg_len, n_opts, has_params)
    st.load(mp, keep, split or SplitBound(0.0, 0.0, 0.0))
    has_cutoff = cutoff is not None and np.isfinite(cutoff)
    opts = {
        "mip_max_nodes": int(node_limit),
        "mip_rel_gap": MIP_REL_GAP,
        "mip_abs_gap": 1e-12,
        "time_limit": float("inf"),
        "objective_bound": float(cutoff) if has_cutoff else float("inf"),
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
    value = float(st.problem.value)
    if has_cutoff and value >= cutoff:  # proven only when HiGHS finished
        status = "cutoff" if status == "optimal" else "no_solution"
        return MixedSolution(status, float("inf"), [], [], elapsed, nodes)
    kinds, counts = st.read()
    status = "optimal" if status == "optimal" else "node_limit"
    return MixedSolution(status, value, kinds, counts, elapsed, nodes)
