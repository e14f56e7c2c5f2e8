"""Lower bounds that prune candidates without a MILP: the per-block fastest-option bound and
the LP relaxation of the stage MILP (both provably at or below the MILP's optimum).
"""

from __future__ import annotations

import math

import numpy as np

from planner.cost.memory import forward_state_bytes, option_states, step_state_bytes
from planner.cost.optimizer import offload_allowed
from planner.cost.pipeline import one_chunk_floor
from planner.cost.records import CostInputs
from planner.highs import pass_model, quiet_highs
from planner.search.candidates import Candidate
from planner.search.milp import relaxation
from planner.search.milp.data import GIB, StageProblem
from planner.search.milp.dominance import LP_FIELDS, undominated
from planner.search.milp.split_bound import SplitBound
from planner.training import num_microbatches


def _min_device_bytes(inp: CostInputs, zero: int, dp: int) -> float:
    """The least device memory the blocks need: the larger of two sums over blocks, each of the
    least any allowed option needs in one phase of a step (the activation peak's states with one
    micro-batch's activations, gradients not yet held; the optimizer step's states). The peak
    is at least either sum, so at least the larger. Memoized on ``inp`` since hundreds of
    candidates share (zero, dp); each list's options are taken by their states' inputs
    (``_state_groups``), a third as many as the options."""
    memo = inp.memo.setdefault("min_device_bytes", {})
    if (zero, dp) not in memo:
        lists, which = _distinct_lists(inp)
        per_list = []
        for groups in _state_groups(inp, lists):
            forward = step = math.inf
            for o, least_act in groups:
                if not offload_allowed(o.offload, zero):
                    continue
                sm = option_states(o, zero, dp, inp.training)
                forward = min(forward, forward_state_bytes(sm, False) + least_act)
                step = min(step, step_state_bytes(sm, inp.training))
            per_list.append((forward, step))
        forward = step = 0.0
        for k in which:  # block by block, in order: the sums' rounding is the blocks'
            forward += per_list[k][0]
            step += per_list[k][1]
        memo[(zero, dp)] = max(forward, step)
    return memo[(zero, dp)]


def _state_groups(inp: CostInputs, lists: list) -> list[list[tuple]]:
    """Per option list, its options by what ``option_states`` reads (parameters, expert
    share and degree, offload), each group as (its first option, the least activation bytes
    in it); found once per ``inp``. Options of one group differ in recompute and variant, not
    in states, so the least forward bytes of a group is its states' plus its least
    activations: a sum's rounding is monotone, so this is the minimum over its options."""
    if "state_groups" not in inp.memo:
        found = []
        for opts in lists:
            groups: dict[tuple, list] = {}
            for o in opts:
                key = (o.params, o.expert_params, o.ep, o.offload)
                if key not in groups:
                    groups[key] = [o, o.act_bytes]
                elif o.act_bytes < groups[key][1]:
                    groups[key][1] = o.act_bytes
            found.append([(o, act) for o, act in groups.values()])
        inp.memo["state_groups"] = found
    return inp.memo["state_groups"]


def _distinct_lists(inp: CostInputs) -> tuple[list, list[int]]:
    """The distinct option lists of ``inp`` (blocks of one class share one list object) and,
    per block, which of them it has; found once per ``inp``, since its bounds ask per
    (ZeRO stage, replicas) and a deep model's blocks are mostly copies of one."""
    if "distinct_lists" not in inp.memo:
        position: dict[int, int] = {}
        lists: list = []
        which = []
        for opts in inp.options:
            if id(opts) not in position:
                position[id(opts)] = len(lists)
                lists.append(opts)
            which.append(position[id(opts)])
        inp.memo["distinct_lists"] = (lists, which)
    return inp.memo["distinct_lists"]


def lower_bounds(inp: CostInputs, cand: Candidate) -> tuple[float, float]:
    """(step-time bound, peak-memory bound) without building a MILP."""
    m = num_microbatches(inp.training, cand.dp, cand.micro_batch_size)
    p, v = cand.pp, cand.virtual_stages
    memo = inp.memo
    if "least_time" not in memo:  # the same for every candidate sharing these options
        lists, which = _distinct_lists(inp)
        least = [min(o.time_s for o in opts) for opts in lists]
        memo["least_time"] = sum(least[k] for k in which)  # in block order, as block by block
    total = memo["least_time"]
    if v == 1:
        time_bound = total * one_chunk_floor(m, p)
    else:
        time_bound = m * total / p + (p - 1) * total / (p * v)
    replicas = cand.mesh.replicas
    mem_bound = _min_device_bytes(inp, cand.zero, replicas) / p + inp.cluster.profile.reserved_bytes
    return time_bound, mem_bound


def relaxed_bound(
    sp: StageProblem, bound: float, split: SplitBound | None = None, memo=None
) -> float:
    """A stronger step-time bound, or inf when no placement can fit at all: the LP relaxation
    of the stage MILP (fractional block counts per stage and option, per-rank memory with each
    stage's in-flight micro-batches, the pipeline objective) without the ordering constraints,
    the working-set terms and the DP exposure, which are all >= 0. Granularity cuts add what
    integrality forces: a segment of L blocks over J stages (p ranks) puts ceil(L / J)
    (ceil(L / p)) of them on one stage (rank). Every MILP solution is feasible here, so the LP
    optimum is a valid lower bound, and costs milliseconds. It carries only the options no
    other beats on every coefficient it reads (dominance.LP_FIELDS): exact, and a few times
    fewer columns; its rows are relaxation's. With ``split`` (split_bound's exact dynamic
    program over integer splits), T_max starts at T* and the result is at least S* + P*.
    ``memo``: a bound_memo.BoundMemo holding LPs solved before (by their arrays).
    """
    p, v, m = sp.pp, sp.v, sp.m
    J = p * v
    keep = undominated(sp, LP_FIELDS)  # the LP's optimum is the same without the others
    if any(not ids for ids in keep):
        return math.inf

    def kept(per: list[np.ndarray]) -> np.ndarray:
        return np.concatenate([per[s][ids] for s, ids in enumerate(keep)])

    time_k, optim_k, offl_k = kept(sp.time), kept(sp.optim), kept(sp.offl)
    state_k, act_k, host_k = kept(sp.state) / GIB, kept(sp.act) / GIB, kept(sp.host) / GIB
    seg_of = np.repeat(np.arange(len(sp.seg_len)), [len(ids) for ids in keep])
    sh = relaxation.shape(J, p, tuple(seg_of.tolist()))
    inflight = np.asarray(sp.inflight, dtype=float)[:, None]
    memory = state_k[None, :] + inflight * act_k[None, :]
    entries = relaxation.values(sh, time_k, memory, host_k, optim_k, offl_k)
    row_upper = np.zeros(sh.n_ub)
    row_upper[J : 2 * J] = -1.0
    ranks = np.arange(p)
    fixed = np.asarray(sp.const_mem, dtype=float) + np.asarray(sp.loss_mem, dtype=float)
    row_upper[2 * J + 5 * ranks + 1] = (sp.capacity - fixed) / GIB
    row_upper[2 * J + 5 * ranks + 2] = sp.host_capacity / GIB
    b_eq = np.concatenate(
        [np.asarray(sp.seg_len, dtype=float), np.asarray(sp.const_time, dtype=float)]
    )
    row_lower = np.concatenate([np.full(sh.n_ub, -np.inf), b_eq])
    row_upper = np.concatenate([row_upper, b_eq])
    c = np.zeros(sh.columns)
    if v == 1:
        c[sh.T : sh.T + J] = 1.0
        c[sh.tmax] = m - 1.0
    else:
        c[sh.rmax] = float(m)
        c[sh.tmax] = p - 1.0
    c[sh.opt] = c[sh.off] = 1.0
    lower = np.zeros(sh.columns)
    upper = np.full(sh.columns, np.inf)
    split = SplitBound(0.0, 0.0, 0.0) if split is None else split
    if not split.feasible:
        return math.inf
    hop = min(sp.const_time) if sp.const_time else 0.0
    lower[sh.tmax] = max(_granular(sp, sp.time, J) + hop, split.max_stage)
    lower[sh.rmax] = _granular(sp, sp.time, p) + v * hop
    lower[sh.opt] = _granular(sp, sp.optim, p)
    lower[sh.off] = _granular(sp, sp.offl, p)
    lp = (c, sh.pattern, entries, row_lower, row_upper, lower, upper)
    status, value = _solve_lp(*lp) if memo is None else memo.lp(_solve_lp, *lp)
    if status == "infeasible":
        return math.inf
    if status != "optimal":
        return bound
    return max(bound, value + sp.const_step, split.step_bound(sp))


def _solve_lp(c, pattern, entries, row_lower, row_upper, lower, upper) -> tuple[str, float]:
    """min c.x s.t. row_lower <= A x <= row_upper, lower <= x <= upper (A: ``entries`` in
    ``pattern``), straight through highspy: scipy's linprog wrapper costs as much as the
    solve on these small LPs, and the search runs hundreds of them."""
    import highspy

    h = quiet_highs()
    h.setOptionValue("presolve", "off")  # a third faster on these small LPs, same optimum
    pass_model(h, c, pattern, entries, row_lower, row_upper, lower, upper)
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
