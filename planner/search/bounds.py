"""Lower bounds that prune candidates without a MILP: the per-block fastest-option bound and
the LP relaxation of the stage MILP (both provably at or below the MILP's optimum).
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np

from planner.cost.model import (
    CostInputs,
    num_microbatches,
    offload_allowed,
    option_states,
)
from planner.search.candidates import Candidate
from planner.search.split_bound import SplitBound
from planner.search.stage_data import GIB, StageProblem


def _min_device_bytes(inp: CostInputs, zero: int, dp: int) -> float:
    """Sum over blocks of the least device memory (states + one micro-batch's activations) any
    allowed option needs; memoized on ``inp`` since hundreds of candidates share (zero, dp)."""
    memo = inp.memo.setdefault("min_device_bytes", {})
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
    memo = inp.memo
    if "least_time" not in memo:  # the same for every candidate sharing these options
        memo["least_time"] = sum(min(o.time_s for o in opts) for opts in inp.options)
    total = memo["least_time"]
    if v == 1:
        time_bound = total * (1 + (m - 1) / p)
    else:
        time_bound = m * total / p + (p - 1) * total / (p * v)
    replicas = cand.mesh.replicas
    mem_bound = _min_device_bytes(inp, cand.zero, replicas) / p + inp.cluster.profile.reserved_bytes
    return time_bound, mem_bound


def relaxed_bound(sp: StageProblem, bound: float, split: SplitBound | None = None) -> float:
    """A stronger step-time bound, or inf when no placement can fit at all: the LP relaxation
    of the stage MILP (fractional block counts per stage and option, per-rank memory with each
    stage's in-flight micro-batches, the pipeline objective) without the ordering constraints,
    the working-set terms and the DP exposure, which are all >= 0. Granularity cuts add what
    integrality forces: a segment of L blocks over J stages (p ranks) puts ceil(L / J)
    (ceil(L / p)) of them on one stage (rank). Every MILP solution is feasible here, so the LP
    optimum is a valid lower bound, and costs milliseconds. With ``split`` (split_bound's
    exact dynamic program over integer splits), T_max starts at T* and the result is at least
    S* + P*.

    Long because the LP's rows are assembled in one place, block by block, where their indices can
    be checked against each other.
    """
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
    split = SplitBound(0.0, 0.0, 0.0) if split is None else split
    if not split.feasible:
        return math.inf
    lower[itmax] = max(_granular(sp, sp.time, J) + hop, split.max_stage)
    lower[irmax] = _granular(sp, sp.time, p) + v * hop
    lower[iopt] = _granular(sp, sp.optim, p)
    lower[ioff] = _granular(sp, sp.offl, p)
    status, value = _solve_lp(c, a_ub, b_ub, a_eq, b_eq, lower, upper)
    if status == "infeasible":
        return math.inf
    if status != "optimal":
        return bound
    return max(bound, value + sp.const_step, split.step_bound(sp))


def quiet_highs():
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
    h = quiet_highs()
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
