"""One candidate's stage MILP (planner/search/milp/candidate.py) against the cost model, written
for its generated mutants (docs/mutation.md).

The reference is ``evaluate``, the cost model's step time of a configuration: for every
placement of a few small instances (test_solver_exact's random shapes, picked to cover ZeRO 0
to 3, expert parallelism, tied weights, GPipe, 1F1B and the interleaved schedule, a
parameterless block, persistent gradient buffers), the model built from ``stage_problem``'s
numbers, with the placement pinned, costs exactly evaluate's step time, and refuses exactly
the placements evaluate finds do not fit. Then ``solve_candidate`` records brute force's
optimum, and says why when it cannot.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import highspy
import numpy as np
import pytest
from bruteforce import every_config
from conftest import make_block, make_option
from test_solver_exact import HUGE, configs, inputs, random_shape

from planner.cost.step import evaluate
from planner.highs import pass_model, quiet_highs
from planner.search import Candidate
from planner.search.milp.candidate import (
    config_from_counts,
    segments,
    solve_candidate,
    stage_problem,
)
from planner.search.milp.rows import stage_model
from planner.search.milp.split_bound import SplitBound

NO_CUTS = SplitBound(0.0, 0.0, math.inf)
# (seed, what it covers): GPipe over 4 stages, ZeRO-3, ep 2, tied; interleaved 2 x 2, ZeRO-1,
# ep 4, tied; 1F1B ZeRO-3 on 2 x 2, tied; 1F1B ZeRO-1 on 2 x 4; ZeRO-2 over 8, tied
SEEDS = (3, 54, 21, 60, 12)


@pytest.fixture(autouse=True)
def _own_highs_scheduler():
    """mutmut forks a child per mutant from the process that ran the clean tests; HiGHS's task
    scheduler's threads do not come with a fork (planner/search/overlap.py), and a MILP there
    would wait on them forever: each test starts HiGHS's scheduler afresh."""
    highspy.Highs.resetGlobalScheduler(False)


def _shape(seed: int, persistent: bool = False, parameterless: bool = False):
    blocks, options, gpus, training, cand = random_shape(random.Random(seed))
    if persistent:
        training = replace(training, persistent_grad_buffers=True)
    if parameterless:  # the first block holds no parameter: no collective latency for it
        blocks = [replace(blocks[0], params=0), *blocks[1:]]
    return blocks, options, gpus, training, cand


def _counts(inp, cand, cfg) -> np.ndarray:
    """The placement's n (J x K) in the model's column order."""
    segs = segments(inp.blocks)
    n_opts = [len(inp.options[first]) for first, _ in segs]
    cols = np.cumsum([0, *n_opts])
    n = np.zeros((cand.pp * cand.virtual_stages, cols[-1]))
    for s, (first, length) in enumerate(segs):
        for i in range(first, first + length):
            n[cfg.stage_of[i], cols[s] + cfg.choice[i]] += 1
    return n


def _allowed(sp) -> list[list[int]]:
    """The options the candidate may use (weights on the host only under ZeRO-3): the model
    fixes the others to 0, as solve_stage_milp's ``undominated`` keeps only allowed ones."""
    return [np.flatnonzero(a).tolist() for a in sp.allowed]


def _pinned(model, n: np.ndarray) -> float:
    if (n.ravel() > model.col_upper[: n.size]).any():
        return math.inf  # an option the model fixes to 0
    lower, upper = model.col_lower.copy(), model.col_upper.copy()
    lower[: n.size] = upper[: n.size] = n.ravel()
    h = quiet_highs()
    pass_model(
        h, model.cost, model.pattern, model.values, model.row_lower, model.row_upper,
        lower, upper, model.integer, model.offset,
    )  # fmt: skip
    h.run()
    if h.getModelStatus() == highspy.HighsModelStatus.kInfeasible:
        return math.inf
    assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    return float(h.getInfo().objective_function_value)


# evaluate's prices by instance: mutmut runs this file once clean, then forks a child per
# mutant, which inherits them (evaluate is the reference here, not the code under test)
_PRICED: dict[tuple, list] = {}


def _every(key: tuple, inp, cand) -> list:
    if key not in _PRICED:
        mesh, args = configs(inp, cand)
        _PRICED[key] = list(every_config(inp, mesh, *args))
    return _PRICED[key]


@pytest.mark.parametrize(
    "seed,persistent,parameterless",
    [*((s, False, False) for s in SEEDS), (60, True, False), (21, False, True)],
)
def test_every_pinned_placement_costs_evaluates_step_time(seed, persistent, parameterless):
    blocks, options, gpus, training, cand = _shape(seed, persistent, parameterless)
    inp = inputs(blocks, options, gpus, training, HUGE, HUGE)
    sp = stage_problem(inp, cand)
    model = stage_model(sp, _allowed(sp), NO_CUTS)
    checked = 0
    for cfg, cost in _every(("free", seed, persistent, parameterless), inp, cand):
        got = _pinned(model, _counts(inp, cand, cfg))
        if cost.feasible:
            assert got == pytest.approx(cost.step_time_s, rel=1e-9, abs=1e-12), cfg
            checked += 1
        else:  # memory is free: only weights on the host without ZeRO-3 are refused
            assert got == math.inf, cfg
    assert checked >= 4


@pytest.mark.parametrize("seed,share", [(3, 0.5), (54, 0.4), (21, 0.5), (60, 0.6), (12, 0.3)])
def test_a_placement_fits_the_model_exactly_where_it_fits_the_cost_model(seed, share):
    """Device memory between the least any placement needs and the most (``share`` of the
    way): the model refuses exactly the placements whose priced peak exceeds it, and prices
    the others at their step time."""
    blocks, options, gpus, training, cand = _shape(seed)
    free = inputs(blocks, options, gpus, training, HUGE, HUGE)
    peaks = [c.peak_memory_bytes for _, c in _every(("free", seed, False, False), free, cand)]
    memory = min(peaks) + share * (max(peaks) - min(peaks))
    inp = inputs(blocks, options, gpus, training, memory, HUGE)
    sp = stage_problem(inp, cand)
    model = stage_model(sp, _allowed(sp), NO_CUTS)
    fit = refused = 0
    for cfg, cost in _every(("device", seed), inp, cand):
        got = _pinned(model, _counts(inp, cand, cfg))
        if cost.feasible:
            assert got == pytest.approx(cost.step_time_s, rel=1e-9, abs=1e-12), cfg
            fit += 1
        else:
            assert got == math.inf, cfg
            refused += 1
    assert fit and refused


def test_host_memory_refuses_what_the_cost_model_refuses():
    """Seed 3's options offload to the host; a host memory per GPU between the least and
    the most any placement holds there."""
    blocks, options, gpus, training, cand = _shape(3)
    free = inputs(blocks, options, gpus, training, HUGE, HUGE)
    hosts = [c.host_bytes_per_gpu for _, c in _every(("free", 3, False, False), free, cand)]
    host = min(hosts) + 0.5 * (max(hosts) - min(hosts))
    inp = inputs(blocks, options, gpus, training, HUGE, host)
    sp = stage_problem(inp, cand)
    model = stage_model(sp, _allowed(sp), NO_CUTS)
    fit = refused = 0
    for cfg, cost in _every(("host", 3), inp, cand):
        got = _pinned(model, _counts(inp, cand, cfg))
        assert math.isinf(got) == (not cost.feasible), cfg
        fit += cost.feasible
        refused += not cost.feasible
    assert fit and refused


@pytest.mark.parametrize("seed", [3, 54, 21])
def test_solve_candidate_records_brute_forces_optimum(seed):
    """Half-way device memory: the candidate's placement is the best evaluate finds among
    those that fit, with its cost, and a proven bound at its step time (no gap)."""
    blocks, options, gpus, training, cand = _shape(seed)
    free = inputs(blocks, options, gpus, training, HUGE, HUGE)
    peaks = [c.peak_memory_bytes for _, c in _every(("free", seed, False, False), free, cand)]
    inp = inputs(blocks, options, gpus, training, (min(peaks) + max(peaks)) / 2, HUGE)
    best = min(c.step_time_s for _, c in _every(("half", seed), inp, cand) if c.feasible)
    solve_candidate(inp, cand)
    assert cand.status == "solved" and cand.proven
    assert cand.cost.step_time_s == pytest.approx(best, rel=1e-9)
    assert cand.milp_objective == pytest.approx(best, rel=1e-9)
    assert evaluate(inp, cand.config).step_time_s == cand.cost.step_time_s
    assert cand.bound <= cand.cost.step_time_s and cand.bound >= best * (1 - 2e-4)
    assert cand.gap == pytest.approx((cand.cost.step_time_s - cand.bound) / best, abs=1e-15)
    assert cand.nodes >= 0 and cand.solve_time_s > 0


def test_a_cutoff_below_the_optimum_prunes_the_candidate_by_its_bound():
    blocks, options, gpus, training, cand = _shape(21)
    inp = inputs(blocks, options, gpus, training, HUGE, HUGE)
    best = min(c.step_time_s for _, c in _every(("free", 21, False, False), inp, cand))
    cutoff = best * 0.9
    solve_candidate(inp, cand, cutoff=cutoff)
    assert cand.status == "pruned-bound" and cand.config is None
    assert cand.bound == pytest.approx(cutoff, rel=1e-12)
    assert cand.reason == f"its MILP proves no placement beats the best plan's {cutoff:.4g} s"
    # a cutoff above it: solved as without one
    again = _shape(21)[4]
    solve_candidate(inp, again, cutoff=best * 1.5)
    assert again.status == "solved" and again.cost.step_time_s == pytest.approx(best, rel=1e-9)


def test_a_candidate_that_fits_nowhere_says_so():
    blocks, options, gpus, training, cand = _shape(21)
    inp = inputs(blocks, options, gpus, training, 2**30 + 1e6, HUGE)  # 1 MB beyond the reserve
    solve_candidate(inp, cand)
    assert cand.status == "infeasible" and cand.bound == math.inf and cand.config is None
    assert cand.reason == "does not fit in memory with any placement and options"


def test_segments_are_runs_of_one_class():
    blocks = [make_block(i, c) for i, c in enumerate("AABBBAC")]
    assert segments(blocks) == [(0, 2), (2, 3), (5, 1), (6, 1)]
    assert segments([]) == []


def test_counts_are_read_back_block_by_block_in_model_order():
    """Segments (A, A), (B, B, B), (C): stage 0 holds both A's (options 1 and 0) and one B
    (option 2); stage 1 the other B's (option 0 twice) and C (option 1). Within a segment the
    counts fill its blocks in order, option by option."""
    blocks = [make_block(i, c) for i, c in enumerate("AABBBC")]
    opts = [make_option(1e-3, 1e3, 1e3)] * 3
    inp = type("I", (), {"blocks": blocks, "options": [opts] * 6})()
    cand = Candidate(2, 4, 1, 2, "interleaved_1f1b", 2, 3)
    counts = [[[1, 1, 0], [0, 0, 1], [0, 0, 0]], [[0, 0, 0], [2, 0, 0], [0, 1, 0]]]
    cfg = config_from_counts(inp, cand, counts)
    assert cfg.stage_of == [0, 0, 0, 1, 1, 1]
    assert cfg.choice == [0, 1, 2, 0, 0, 1]
    assert (cfg.micro_batch_size, cfg.schedule, cfg.virtual_stages, cfg.zero_stage) == (
        2, "interleaved_1f1b", 2, 3,
    )  # fmt: skip
    assert cfg.mesh == cand.mesh


def test_the_problems_limits_are_the_profiles_device_share_and_host_per_gpu():
    blocks, options, gpus, training, cand = _shape(60)
    inp = inputs(blocks, options, gpus, training, 40e9, 96e9)
    inp = replace(inp, memory_fraction=0.75)
    sp = stage_problem(inp, cand)
    assert sp.capacity == pytest.approx(40e9 * 0.75, rel=1e-15)
    assert sp.host_capacity == pytest.approx(96e9 * 8 / 8, rel=1e-15)  # the node's over 8 GPUs
    assert sp.pp == cand.pp and sp.v == cand.virtual_stages
    assert sp.m == training.global_batch_size // (cand.dp * cand.micro_batch_size)


def _solved_run(seed: int):
    """Seed's candidate solved for real, and the HiGHS run its solve kept."""
    from test_mutant_kills_milp_solve import Store

    blocks, options, gpus, training, cand = _shape(seed)
    inp = inputs(blocks, options, gpus, training, HUGE, HUGE)
    store = Store()
    solve_candidate(inp, cand, runs=store)
    (run,) = store.saved.values()
    return inp, cand, run, Store


def test_a_node_limited_run_is_solved_unproven_with_its_gap():
    """The same run read back as stopped by the node limit with half the step time proven:
    solved, not proven, bound half, gap one half."""
    inp, solved, run, Store = _solved_run(21)
    t = solved.cost.step_time_s
    assert 0 < t < 1  # a step under a second: the gap is still counted
    cand = _shape(21)[4]
    solve_candidate(inp, cand, runs=Store(replace(run, model_status="other", dual_bound=t / 2)))
    assert cand.status == "solved" and not cand.proven
    assert cand.cost.step_time_s == t and cand.milp_objective == pytest.approx(t, rel=1e-9)
    assert cand.bound == t / 2 and cand.gap == pytest.approx(0.5, rel=1e-12)


def test_a_run_without_a_placement_leaves_the_candidate_unresolved():
    inp, _, run, Store = _solved_run(21)
    cand = _shape(21)[4]
    bare = replace(run, model_status="other", dual_bound=0.125, primal_feasible=False, x=[])
    solve_candidate(inp, cand, node_limit=321, runs=Store(bare))
    assert cand.status == "unresolved" and cand.config is None and cand.cost is None
    assert cand.reason == "no placement found within the MILP's 321 node limit"
    assert cand.bound == 0.125


def test_a_second_solve_adds_its_seconds_and_nodes_to_the_first():
    inp, _, run, Store = _solved_run(21)
    cand = _shape(21)[4]
    cand.solve_time_s, cand.nodes = 100.0, 1000
    solve_candidate(inp, cand, runs=Store(replace(run, nodes=7)))
    assert 100.0 < cand.solve_time_s < 160.0 and cand.nodes == 1007
