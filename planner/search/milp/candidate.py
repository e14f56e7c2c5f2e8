"""One candidate's stage MILP: its numbers from the cost model's own functions, the solve, and
the placement read back as a Config.
"""

from __future__ import annotations

import math
import time

import numpy as np

from planner.cost.data_parallel import (
    block_extra_time,
    dp_block_terms,
    dp_rates,
    dp_stage_terms,
    tied_sync_time,
)
from planner.cost.memory import (
    fixed_memory,
    forward_state_bytes,
    gathered_weight_bytes,
    loss_memory,
    option_states,
    step_state_bytes,
)
from planner.cost.optimizer import offload_allowed, offload_time, optimizer_time
from planner.cost.pipeline import chunk_held, stage_time_parts
from planner.cost.records import Config, CostInputs, deferred_reduce, grads_held, last_rank
from planner.cost.step import evaluate
from planner.search.candidates import Candidate
from planner.search.milp.data import StageProblem
from planner.search.milp.runs import RunStore
from planner.search.milp.solve import DEFAULT_NODE_LIMIT, solve_stage_milp
from planner.search.milp.split_bound import SplitBound
from planner.trace.blocks import Block
from planner.training import num_microbatches


def segments(blocks: list[Block]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive blocks of one class: (first index, length)."""
    runs: list[tuple[int, int]] = []
    for i, b in enumerate(blocks):
        if runs and blocks[runs[-1][0]].cls == b.cls:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def stage_problem(inp: CostInputs, cand: Candidate) -> StageProblem:
    """The MILP's numbers for one candidate, each computed by the cost model's own functions."""
    mesh = cand.mesh
    tr = inp.training
    m = num_microbatches(tr, cand.dp, cand.micro_batch_size)
    p, v = cand.pp, cand.virtual_stages
    J = p * v
    config = Config(mesh, cand.micro_batch_size, cand.schedule, v, cand.zero, [], [])
    deferred = deferred_reduce(config, tr)
    held = grads_held(config, tr)
    rates = dp_rates(inp, config)
    segs = segments(inp.blocks)
    cols: dict[str, list[np.ndarray]] = {k: [] for k in StageProblem.__annotations__}
    for first, _ in segs:
        opts = inp.options[first]
        sm = [option_states(o, cand.zero, mesh.replicas, tr, deferred) for o in opts]
        dp = [dp_block_terms(o, rates) for o in opts]
        cols["time"].append(np.array([o.time_s + block_extra_time(inp, o, config) for o in opts]))
        cols["state"].append(np.array([forward_state_bytes(x, held) for x in sm]))
        cols["step"].append(np.array([step_state_bytes(x, tr) for x in sm]))
        cols["host"].append(np.array([x["host"] for x in sm]))
        cols["act"].append(np.array([o.act_bytes for o in opts]))
        cols["ws"].append(np.array([o.transient_bytes + o.recompute_peak_bytes for o in opts]))
        cols["gather"].append(np.array([gathered_weight_bytes(o, cand.zero, tr) for o in opts]))
        cols["optim"].append(np.array([optimizer_time(inp, [o], config) for o in opts]))
        cols["offl"].append(np.array([offload_time(inp, [o], config, m) for o in opts]))
        cols["dp_first"].append(np.array([a for a, _, _ in dp]))
        cols["dp_second"].append(np.array([b for _, b, _ in dp]))
    # What a stage costs per micro-batch besides its blocks: its point-to-point hops, and on
    # the last stage the loss (stage_time_parts of no blocks).
    const_time = [sum(stage_time_parts(inp, [], config, j)) for j in range(J)]
    const_mem = [fixed_memory(inp, config, r) for r in range(p)]
    loss_mem = [loss_memory(inp, config, r == last_rank(config)) for r in range(p)]
    profile = inp.cluster.profile
    once_a, once_b, _ = dp_stage_terms(rates)
    return StageProblem(
        pp=p,
        v=v,
        m=m,
        seg_len=[n for _, n in segs],
        time=cols["time"],
        state=cols["state"],
        host=cols["host"],
        act=cols["act"],
        ws=cols["ws"],
        gather=cols["gather"],
        optim=cols["optim"],
        offl=cols["offl"],
        dp_first=cols["dp_first"],
        dp_second=cols["dp_second"],
        dp_once=(once_a, once_b),
        allowed=[
            np.array([offload_allowed(o.offload, cand.zero) for o in inp.options[first]])
            for first, _ in segs
        ],
        has_params=[inp.blocks[first].params > 0 for first, _ in segs],
        const_time=const_time,
        inflight=[chunk_held(cand.schedule, m, p, v, j % p) for j in range(J)],
        const_mem=const_mem,
        loss_mem=loss_mem,
        # persistent buffers' step holds no more than the activation peak's states
        step=None if tr.persistent_grad_buffers else cols["step"],
        const_step=tied_sync_time(inp, config),
        capacity=profile.memory_bytes * inp.memory_fraction,
        host_capacity=profile.host_memory_bytes / max(profile.gpus_per_node, 1),
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


def solve_candidate(
    inp: CostInputs,
    cand: Candidate,
    cutoff: float | None = None,
    node_limit: int = DEFAULT_NODE_LIMIT,
    sp: StageProblem | None = None,
    split: SplitBound | None = None,
    runs: RunStore | None = None,
) -> None:
    """Solve the candidate's stage MILP and record its placement, cost, status and certificate
    (``bound``: proven lower bound of its step time; ``gap``; ``nodes``) on it. ``runs``:
    HiGHS runs kept from earlier plans (milp.runs)."""
    sp = stage_problem(inp, cand) if sp is None else sp
    start = time.perf_counter()
    sol = solve_stage_milp(sp, node_limit, cutoff, split, runs)
    cand.solve_time_s += time.perf_counter() - start
    cand.nodes += sol.nodes
    if math.isfinite(sol.dual_bound):
        cand.bound = max(cand.bound, sol.dual_bound)
    if sol.status == "cutoff":
        cand.status = "pruned-bound"
        cand.bound = max(cand.bound, cutoff)
        cand.reason = f"its MILP proves no placement beats the best plan's {cutoff:.4g} s"
        return
    if sol.status == "no_solution":
        cand.status = "unresolved"
        cand.reason = f"no placement found within the MILP's {node_limit} node limit"
        return
    if sol.status not in ("optimal", "node_limit"):
        cand.status = "infeasible"
        cand.bound = math.inf
        cand.reason = "does not fit in memory with any placement and options"
        return
    cand.config = config_from_counts(inp, cand, sol.counts)
    cand.cost = evaluate(inp, cand.config)
    cand.milp_objective = sol.objective
    cand.status = "solved"
    cand.proven = sol.status == "optimal"
    # The incumbent's auxiliary variables (max terms) may be loose when the node limit stops
    # it: the cost model's own evaluation of its placement is the true step time.
    t = cand.cost.step_time_s
    cand.bound = min(cand.bound, t)
    cand.gap = max(0.0, (t - cand.bound) / t) if t > 0 else 0.0
