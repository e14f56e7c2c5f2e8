"""The stage MILP: place runs of identical blocks on pipeline stages and pick each block's
option, exactly minimizing the cost model's step time for one outer candidate.

Blocks are compressed into *segments*, maximal runs of consecutive blocks of one class
(a GPT is three: embeddings, L layers, head). Blocks of a segment are interchangeable, so only
counts matter.

Sets: stages j = 0..J-1 (J = pp * v, stage j on pp rank j mod pp), segments s with L_s blocks,
options o of segment s's class.

Variables:
    n[j,s,o] in Z+      blocks of segment s on stage j running option o
    a[j,s]   in {0,1}   stage j holds some block of segment s
    u[r,s,o] in {0,1}   rank r runs some block of segment s with option o (for the max terms)
    h[j]     in {0,1}   stage j holds parameters (a collective's latency is paid once)
    T_j, Tmax, Rmax, E_j^1, E_j^2, E, X_r, Z_r, Opt, Off >= 0

Constraints (names in the code):
    place:       sum_{j,o} n[j,s,o] = L_s
    nonempty:    sum_{s,o} n[j,s,o] >= 1
    has_lo/hi:   a[j,s] <= sum_o n[j,s,o] <= L_s a[j,s]
    order_a:     C[j,s] >= L_s a[j,s+1]          (C = blocks of s placed on stages <= j)
    order_b:     C[j-1,s+1] <= L_{s+1} (1 - a[j,s])
                 (with both, every stage holds a contiguous range of blocks, in model order)
    time:        T_j = sum n[j,s,o] t[s,o] + c_j;  Tmax >= T_j;  Rmax >= sum_{j = r mod p} T_j
    dp:          E_j >= dp_comm_j - overlap_j  (per the ZeRO stage; see costmodel.dp_comm)
    memory:      sum_{j = r} sum n (state + inflight_j act) + X_r + Z_r + const_r <= capacity
                 X_r >= ws[s,o] u[r,s,o];  Z_r >= gather[s,o] u[r,s,o];  L_s u >= sum_{j=r} n
    host:        sum_{j = r} sum n host[s,o] <= host capacity per GPU
    split:       Tmax >= T*;  sum_j T_j >= S*;  (m - 1) Tmax + Opt + Off >= P* (v = 1)
                 (split_bound's exact dynamic program over integer splits: cuts every
                 placement satisfies, which lift the relaxation of deep pipelines to within
                 about 1% of their optimum, where the plain relaxation sat 5-10% below)
Objective (= costmodel.evaluate's step time):
    v = 1: sum_j T_j + (m - 1) Tmax;   v > 1: m Rmax + (p - 1) Tmax;   + E + Opt + Off + K
    (K: what a step pays whatever the placement, the tied weights' gradient sum)
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import cvxpy as cp
import numpy as np

from planner.search.split_bound import SplitBound, split_bound
from planner.search.stage_data import GIB, StageProblem

__all__ = ["StageSolution", "solve_stage_milp", "undominated"]

MIP_REL_GAP = 1e-4


@dataclass
class StageSolution:
    status: str
    objective: float
    counts: list[list[list[int]]]  # [stage][segment][option]
    solve_time_s: float
    dual_bound: float = float("nan")  # HiGHS's proven lower bound
    nodes: int = 0  # branch-and-bound nodes HiGHS explored (the work spent)


class _Structure:
    """One cvxpy problem per MILP shape, re-solved with new parameter values (DPP), so the
    hundreds of outer candidates of one model pay cvxpy's canonicalisation once per shape.

    Written with a few matrix variables (n is stages x all options of all segments) rather than
    one variable per (stage, segment): cvxpy's canonicalisation cost grows with the number of
    expressions, not with their size, so a new shape costs tens of milliseconds."""

    def __init__(self, J: int, P: int, seg_len: list[int], n_opts: list[int], has_params) -> None:
        S, K = len(seg_len), sum(n_opts)
        self.J, self.P, self.S, self.K = J, P, S, K
        self.cols = np.cumsum([0, *n_opts])
        seg_of = np.repeat(np.arange(S), n_opts)
        L = np.asarray(seg_len, dtype=float)
        Lcol = L[seg_of]
        G = np.zeros((K, S))
        G[np.arange(K), seg_of] = 1.0
        M = np.zeros((P, J))
        M[np.arange(J) % P, np.arange(J)] = 1.0
        low = np.tril(np.ones((J, J)))
        par = cp.Parameter
        self.time, self.host = par(K), par(K)
        self.ws, self.gather = par(K, nonneg=True), par(K, nonneg=True)
        self.optim, self.offl = par(K), par(K)
        self.allow = par(K, nonneg=True)
        self.memco, self.k1, self.k2 = par((J, K)), par((J, K)), par((J, K))
        self.k1h, self.k2h = par(), par()
        self.const_time = par(J)
        self.const_mem = par(P)
        self.capacity, self.host_capacity = par(), par()
        self.const_step = par(nonneg=True)
        # split_bound's T*, S* and P* (v = 1; else 0): cuts no placement violates
        self.tmax_floor, self.sum_floor = par(nonneg=True), par(nonneg=True)
        self.weighted_floor = par(nonneg=True)
        self.c_sum, self.c_t, self.c_r = par(nonneg=True), par(nonneg=True), par(nonneg=True)
        n = cp.Variable((J, K), integer=True)
        a = cp.Variable((J, S), boolean=True)
        h = cp.Variable(J, boolean=True)
        u = cp.Variable((P, K), boolean=True)
        T = cp.Variable(J, nonneg=True)
        tmax, rmax, E = (cp.Variable(nonneg=True) for _ in range(3))
        e1, e2 = cp.Variable(J, nonneg=True), cp.Variable(J, nonneg=True)
        X, Z = cp.Variable(P, nonneg=True), cp.Variable(P, nonneg=True)
        opt, off = cp.Variable(nonneg=True), cp.Variable(nonneg=True)
        onesJ, onesP, onesK = np.ones((J, 1)), np.ones((P, 1)), np.ones((1, K))
        cnt = n @ G  # (J, S) blocks of each segment per stage
        C = low @ cnt  # blocks of each segment on stages <= j
        cons = [
            n >= 0,
            cp.sum(n, axis=0) @ G == L,  # place
            cp.sum(n, axis=1) >= 1,  # nonempty
            a <= cnt,
            cnt <= cp.multiply(a, np.tile(L, (J, 1))),  # has
            n <= onesJ @ cp.reshape(cp.multiply(Lcol, self.allow), (1, K), order="C"),
        ]
        for s in range(S):
            if has_params[s]:
                cons.append(h >= a[:, s])
        if S > 1:
            cons.append(C[:, : S - 1] >= cp.multiply(a[:, 1:], np.tile(L[: S - 1], (J, 1))))
            if J > 1:
                cons.append(
                    C[: J - 1, 1:] <= cp.multiply(1 - a[1:, : S - 1], np.tile(L[1:], (J - 1, 1)))
                )  # order_a / order_b: contiguous ranges in model order
        cons += [T == n @ self.time + self.const_time, tmax >= T]  # time
        cons += [tmax >= self.tmax_floor, cp.sum(T) >= self.sum_floor]  # split
        cons.append(self.c_t * tmax + opt + off >= self.weighted_floor)
        k1 = cp.sum(cp.multiply(n, self.k1), axis=1) + self.k1h * h
        k2 = cp.sum(cp.multiply(n, self.k2), axis=1) + self.k2h * h
        cons += [e1 >= k1, e2 >= k2, E >= e1 + e2]  # dp
        on_rank = M @ n  # (P, K)
        cons += [rmax >= M @ T, cp.multiply(u, np.tile(Lcol, (P, 1))) >= on_rank]
        ws_rows = onesP @ cp.reshape(self.ws, (1, K), order="C")
        gather_rows = onesP @ cp.reshape(self.gather, (1, K), order="C")
        cons += [
            cp.reshape(X, (P, 1), order="C") @ onesK >= cp.multiply(u, ws_rows),
            cp.reshape(Z, (P, 1), order="C") @ onesK >= cp.multiply(u, gather_rows),
        ]
        mem = M @ cp.sum(cp.multiply(n, self.memco), axis=1)
        cons += [
            mem + X + Z + self.const_mem <= self.capacity,  # memory
            on_rank @ self.host <= self.host_capacity,  # host
            opt >= on_rank @ self.optim,
            off >= on_rank @ self.offl,
        ]
        pipeline = self.c_sum * cp.sum(T) + self.c_t * tmax + self.c_r * rmax
        self.n = n
        self.problem = cp.Problem(cp.Minimize(pipeline + E + opt + off + self.const_step), cons)

    def load(self, sp: StageProblem, keep: list[list[int]], split: SplitBound) -> None:
        J, S = self.J, self.S
        self.tmax_floor.value = split.max_stage
        self.sum_floor.value = split.sum_stages
        self.weighted_floor.value = split.weighted_max if sp.v == 1 else 0.0
        cat = np.concatenate
        allow = [np.zeros(len(sp.time[s])) for s in range(S)]
        for s in range(S):
            allow[s][keep[s]] = 1.0
        self.allow.value = cat(allow)
        self.time.value = cat(sp.time)
        self.host.value = cat(sp.host) / GIB
        self.ws.value = cat(sp.ws) / GIB
        self.gather.value = cat(sp.gather) / GIB
        self.optim.value = cat(sp.optim)
        self.offl.value = cat(sp.offl)
        state, act = cat(sp.state), cat(sp.act)
        inflight = np.asarray(sp.inflight, dtype=float)[:, None]
        self.memco.value = (state[None, :] + inflight * act[None, :]) / GIB
        self.k1.value = np.tile(cat(sp.dp_first), (J, 1))
        self.k2.value = np.tile(cat(sp.dp_second), (J, 1))
        self.k1h.value, self.k2h.value = sp.dp_once
        self.const_time.value = np.asarray(sp.const_time, dtype=float)
        self.const_mem.value = np.asarray(sp.const_mem, dtype=float) / GIB
        self.capacity.value = sp.capacity / GIB
        self.const_step.value = sp.const_step
        self.host_capacity.value = sp.host_capacity / GIB
        if sp.v == 1:
            self.c_sum.value, self.c_t.value, self.c_r.value = 1.0, sp.m - 1.0, 0.0
        else:
            self.c_sum.value, self.c_t.value, self.c_r.value = 0.0, sp.pp - 1.0, float(sp.m)

    def counts(self) -> list[list[list[int]]]:
        values = np.rint(np.asarray(self.n.value)).astype(int)
        return [
            [values[j, self.cols[s] : self.cols[s + 1]].tolist() for s in range(self.S)]
            for j in range(self.J)
        ]


def undominated(sp: StageProblem) -> list[list[int]]:
    """Per segment, the options no other option beats on every coefficient the MILP reads
    (time, memory rows, working set, gathered buffer, host bytes, optimizer and offload time,
    and the exposed-DP coefficients, which fall as backward time grows). Dropping the rest is
    exact: swapping a dominated option for its dominator never worsens a constraint or the
    objective. Identical options keep the first."""
    keep = []
    for s in range(len(sp.seg_len)):
        rows = np.stack(
            [sp.time[s], sp.state[s], sp.host[s], sp.act[s], sp.ws[s], sp.gather[s]]
            + [sp.optim[s], sp.offl[s], sp.dp_first[s], sp.dp_second[s]],
            axis=1,
        )
        tol = 1e-12 * (np.abs(rows).max(axis=0) + 1e-300)
        allowed = np.ones(len(rows), bool) if sp.allowed is None else sp.allowed[s]
        rows = np.where(allowed[:, None], rows, np.inf)
        ids = []
        for o in range(len(rows)):
            if not allowed[o]:
                continue
            le = np.all(rows <= rows[o] + tol, axis=1)
            lt = np.any(rows < rows[o] - tol, axis=1)
            same = np.all(np.abs(rows - rows[o]) <= tol, axis=1)
            dominated = np.any(le & lt) or np.any(same[:o])
            if not dominated:
                ids.append(o)
        keep.append(ids)
    return keep


# Work limits, so that the same inputs give the same plan on any machine, however busy: HiGHS
# is deterministic for given options, and a node count does not depend on the clock.
DEFAULT_NODE_LIMIT = 20_000


def solve_stage_milp(
    sp: StageProblem,
    node_limit: int = DEFAULT_NODE_LIMIT,
    cutoff: float | None = None,
    structures: dict | None = None,
    split: SplitBound | None = None,
) -> StageSolution:
    """Solve one candidate's MILP exactly, or until HiGHS has explored ``node_limit``
    branch-and-bound nodes (a work limit: no wall clock is read, so the result is the same on
    any machine).

    ``cutoff``: only solutions with objective below it matter (the incumbent's step time);
    HiGHS then prunes with it, and "cutoff" means "nothing here beats the cutoff".
    ``structures``: compiled problems by MILP shape, kept by the caller across candidates.
    ``split``: the candidate's split_bound, when the caller computed it already."""
    keep = undominated(sp)
    J = sp.pp * sp.v
    n_opts = [len(t) for t in sp.time]
    key = (J, sp.pp, tuple(sp.seg_len), tuple(n_opts), tuple(sp.has_params))
    structures = {} if structures is None else structures
    st = structures.get(key)
    if st is None:
        st = structures[key] = _Structure(J, sp.pp, sp.seg_len, n_opts, sp.has_params)
    if any(not ids for ids in keep):
        return StageSolution("infeasible", float("inf"), [], 0.0)
    split = split_bound(sp) if split is None else split
    if not split.feasible:
        return StageSolution("infeasible", float("inf"), [], 0.0)
    st.load(sp, keep, split)
    opts: dict = {
        "mip_max_nodes": int(node_limit),
        "mip_rel_gap": MIP_REL_GAP,
        "mip_abs_gap": 1e-12,
        "time_limit": float("inf"),  # an option left from an earlier solve must not apply
    }
    has_cutoff = cutoff is not None and np.isfinite(cutoff)
    # Always set the bound: an option left from an earlier solve must not prune this one.
    opts["objective_bound"] = float(cutoff) if has_cutoff else float("inf")
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # node-limited solves warn; we report the gap
            st.problem.solve(solver=cp.HIGHS, **opts)
    except cp.error.SolverError:
        return StageSolution("error", float("inf"), [], time.perf_counter() - start)
    elapsed = time.perf_counter() - start
    info = st.problem.solver_stats.extra_stats  # highspy's HighsInfo
    bound = float(getattr(info, "mip_dual_bound", np.nan))
    nodes = int(getattr(info, "mip_node_count", 0))
    feasible = int(getattr(info, "primal_solution_status", 0)) == 2  # kSolutionStatusFeasible
    status = st.problem.status
    cut = "cutoff" if has_cutoff else "infeasible"
    proven_cut = has_cutoff and np.isfinite(bound) and bound >= cutoff
    if status in ("infeasible", "infeasible_inaccurate"):
        return StageSolution(cut, float("inf"), [], elapsed, nodes=nodes)
    if status == "optimal" and feasible:
        status = "optimal"
    elif proven_cut:  # the node limit stopped it, but its bound already clears the cutoff
        return StageSolution("cutoff", float("inf"), [], elapsed, dual_bound=bound, nodes=nodes)
    elif feasible:
        status = "node_limit"
    elif status == "optimal":  # finished without a placement under the cutoff
        return StageSolution(cut, float("inf"), [], elapsed, nodes=nodes)
    else:
        return StageSolution("no_solution", float("inf"), [], elapsed, bound, nodes)
    value = float(st.problem.value)
    if has_cutoff and value >= cutoff:
        # HiGHS may stop at the cutoff holding a feasible placement above it, which need not
        # be this candidate's optimum. Solved to the end, that proves nothing here beats the
        # incumbent; stopped by the node limit, it proves only the dual bound.
        if status == "optimal":
            return StageSolution("cutoff", float("inf"), [], elapsed, dual_bound=bound, nodes=nodes)
        return StageSolution("no_solution", float("inf"), [], elapsed, bound, nodes)
    if status == "optimal" and not np.isfinite(bound):
        bound = value
    return StageSolution(status, value, st.counts(), elapsed, dual_bound=bound, nodes=nodes)
