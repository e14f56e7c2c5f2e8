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
    T_j, Tmax, Rmax, F_j, S_j, E, X_r, Z_r, Opt, Off >= 0  (F, S: dp_first, dp_second)

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
                 X_r >= ws[s,o] u[r,s,o];  X_r >= loss_r;  Z_r >= gather[s,o] u[r,s,o];
                 L_s u >= sum_{j=r} n  (the loss and the largest op never coexist: X_r is
                 the larger of the two)
    step:        sum_{j = r} sum n step[s,o] + const_r <= capacity  (the optimizer step's
                 peak, where torch's lazily allocated gradients and foreach temporaries
                 outgrow the activations' states; absent with persistent buffers)
    host:        sum_{j = r} sum n host[s,o] <= host capacity per GPU
    split:       Tmax >= T*;  sum_j T_j >= S*;  (m - 1) Tmax + Opt + Off >= P* (v = 1),
                 m Rmax + Opt + Off >= P* (v > 1)
                 (split_bound's exact dynamic program over integer splits: cuts every
                 placement satisfies, which lift the relaxation of deep pipelines to within
                 about 1% of their optimum, where the plain relaxation sat 5-10% below)
Objective (= costmodel.evaluate's step time):
    v = 1: sum_j T_j + (m - 1) Tmax;   v > 1: m Rmax + (p - 1) Tmax;   + E + Opt + Off + K
    (K: what a step pays whatever the placement, the tied weights' gradient sum)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from planner.highs import pass_model, quiet_highs
from planner.search.milp.data import StageProblem
from planner.search.milp.dominance import undominated
from planner.search.milp.rows import StageModel, stage_model
from planner.search.milp.runs import HighsRun, RunStore, run_key
from planner.search.milp.split_bound import SplitBound, split_bound

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


# Work limits, so that the same inputs give the same plan on any machine, however busy: HiGHS
# is deterministic for given options, and a node count does not depend on the clock.
DEFAULT_NODE_LIMIT = 20_000


def solve_stage_milp(
    sp: StageProblem,
    node_limit: int = DEFAULT_NODE_LIMIT,
    cutoff: float | None = None,
    split: SplitBound | None = None,
    runs: RunStore | None = None,
) -> StageSolution:
    """Solve one candidate's MILP exactly, or until HiGHS has explored ``node_limit``
    branch-and-bound nodes (a work limit: no wall clock is read, so the result is the same on
    any machine).

    ``cutoff``: only solutions with objective below it matter (the incumbent's step time);
    HiGHS then prunes with it, and "cutoff" means "nothing here beats the cutoff".
    ``split``: the candidate's split_bound, when the caller computed it already.
    ``runs``: HiGHS runs kept from earlier plans (milp.runs), read instead of solving again."""
    keep = undominated(sp)
    if any(not ids for ids in keep):
        return StageSolution("infeasible", float("inf"), [], 0.0)
    split = split_bound(sp) if split is None else split
    if not split.feasible:
        return StageSolution("infeasible", float("inf"), [], 0.0)
    model = stage_model(sp, keep, split)
    has_cutoff = cutoff is not None and np.isfinite(cutoff)
    start = time.perf_counter()
    run = _run(model, node_limit, cutoff if has_cutoff else None, runs)
    elapsed = time.perf_counter() - start
    bound, nodes, feasible = run.dual_bound, run.nodes, run.primal_feasible
    cut = "cutoff" if has_cutoff else "infeasible"
    proven_cut = has_cutoff and np.isfinite(bound) and bound >= cutoff
    optimal = run.model_status == "optimal"
    if run.model_status == "infeasible":
        return StageSolution(cut, float("inf"), [], elapsed, nodes=nodes)
    if optimal and feasible:
        kind = "optimal"
    elif proven_cut:  # the node limit stopped it, but its bound already clears the cutoff
        return StageSolution("cutoff", float("inf"), [], elapsed, dual_bound=bound, nodes=nodes)
    elif feasible:
        kind = "node_limit"
    elif optimal:  # finished without a placement under the cutoff
        return StageSolution(cut, float("inf"), [], elapsed, nodes=nodes)
    else:
        return StageSolution("no_solution", float("inf"), [], elapsed, bound, nodes)
    x = np.asarray(run.x, dtype=float)
    value = float(model.cost @ x) + model.offset
    if has_cutoff and value >= cutoff:
        # HiGHS may stop at the cutoff holding a feasible placement above it, which need not
        # be this candidate's optimum. Solved to the end, that proves nothing here beats the
        # incumbent; stopped by the node limit, it proves only the dual bound.
        if kind == "optimal":
            return StageSolution("cutoff", float("inf"), [], elapsed, dual_bound=bound, nodes=nodes)
        return StageSolution("no_solution", float("inf"), [], elapsed, bound, nodes)
    if kind == "optimal" and not np.isfinite(bound):
        bound = value
    return StageSolution(kind, value, model.counts(x), elapsed, dual_bound=bound, nodes=nodes)


def _run(model: StageModel, node_limit: int, cutoff: float | None, runs: RunStore | None):
    """HiGHS on ``model``: read from ``runs`` when this very input was solved before, else
    solved (and kept there)."""
    key = None
    if runs is not None:
        options = {"nodes": int(node_limit), "gap": MIP_REL_GAP, "abs_gap": 1e-12}
        options["cutoff"] = None if cutoff is None else float(cutoff)
        arrays = [model.cost, model.pattern.indptr, model.pattern.indices]
        arrays += [model.pattern.data(model.values), model.row_lower, model.row_upper]
        arrays += [model.col_lower, model.col_upper, model.integer, np.array([model.offset])]
        key = run_key(arrays, options)
        found = runs.load(key)
        if found is not None:
            return found
    import highspy

    h = _highs(model, node_limit, cutoff)
    h.run()
    info = h.getInfo()
    status = h.getModelStatus()
    kinds = {
        highspy.HighsModelStatus.kOptimal: "optimal",
        highspy.HighsModelStatus.kInfeasible: "infeasible",
    }
    feasible = int(info.primal_solution_status) == 2  # kSolutionStatusFeasible
    run = HighsRun(
        model_status=kinds.get(status, "other"),
        dual_bound=float(info.mip_dual_bound),
        nodes=int(info.mip_node_count),
        primal_feasible=feasible,
        x=[float(v) for v in h.getSolution().col_value] if feasible else [],
    )
    if key is not None:
        runs.save(key, run)
    return run


def _highs(model: StageModel, node_limit: int, cutoff: float | None):
    """A silent HiGHS instance holding ``model``, limited to ``node_limit`` nodes (work, not
    time) and, with ``cutoff``, told that only objectives below it matter."""
    h = quiet_highs()
    for name, value in (
        ("mip_max_nodes", int(node_limit)),
        ("mip_rel_gap", MIP_REL_GAP),
        ("mip_abs_gap", 1e-12),
    ):
        h.setOptionValue(name, value)
    if cutoff is not None:
        h.setOptionValue("objective_bound", float(cutoff))
    pass_model(
        h,
        model.cost,
        model.pattern,
        model.values,
        model.row_lower,
        model.row_upper,
        model.col_lower,
        model.col_upper,
        model.integer,
        model.offset,
    )
    return h
