"""The search prunes candidates with lower bounds; a bound above the optimum would prune the
winner. On the brute-force instances of test_solver_exact, every bound lies at or below what
brute force finds: the step-time bound of ``lower_bounds``, the LP relaxation
(``relaxed_bound``), and the peak-memory bound below the least memory any placement the
runtime can run needs."""

from __future__ import annotations

import pytest
from bruteforce import every_config
from test_solver_exact import HUGE, SITUATIONS, configs, inputs, instances, reference

from planner.search.bounds import lower_bounds, relaxed_bound
from planner.search.milp.candidate import stage_problem


@pytest.mark.parametrize("situation", SITUATIONS)
def test_bounds_never_exceed_the_optimum(situation):
    tight = 0
    for seed, inp, cand in instances(situation):
        best = reference(inp, cand)
        time_bound, memory_bound = lower_bounds(inp, cand)
        assert time_bound <= best * (1 + 1e-9), f"seed {seed}"
        lp = relaxed_bound(stage_problem(inp, cand), time_bound)
        assert time_bound <= lp <= best * (1 + 1e-9), f"seed {seed}"
        mesh, args = configs(inp, cand)
        free = inputs(inp.blocks, inp.options, cand.pp * cand.dp, inp.training, HUGE, HUGE)
        runnable = [c for _, c in every_config(free, mesh, *args) if c.feasible]
        least = min(c.peak_memory_bytes for c in runnable)
        assert memory_bound <= least * (1 + 1e-9), f"seed {seed}"
        tight += lp >= 0.5 * best
    assert tight >= len(instances(situation)) // 2  # the bounds are not vacuous either


@pytest.mark.parametrize("pp,m,v", [(1, 1, 1), (2, 4, 1), (4, 8, 1), (2, 4, 2)])
def test_the_step_time_bound_is_exact_for_balanced_stages(pp, m, v):
    """Blocks without parameters (no optimizer, no gradient reduction), equal and as many as
    a balanced split needs: the best placement reaches the bound, so the bound is tight."""
    from conftest import cluster_of, make_block, make_option

    from planner.cost.records import CostInputs
    from planner.search import Candidate
    from planner.search.milp.candidate import solve_candidate
    from planner.training import Training

    n = 2 * pp * v
    blocks = [make_block(i, "L", params=0, boundary=0, out=0) for i in range(n)]
    options = [[make_option(1e-3, 0.0, 1e6)] for _ in blocks]
    inp = CostInputs(blocks, options, 1, cluster_of(pp), Training(m))
    schedule = "interleaved_1f1b" if v > 1 else "1f1b"
    cand = Candidate(pp, 1, 1, 1, schedule, v, 0)
    bound, _ = lower_bounds(inp, cand)
    solve_candidate(inp, cand)
    assert cand.cost.step_time_s == pytest.approx(bound, rel=1e-12)
