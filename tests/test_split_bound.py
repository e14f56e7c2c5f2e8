"""split_bound's dynamic program over contiguous splits against brute force: on the random
instances of test_solver_exact (memory free, device memory binding, host memory binding), its
T*, S* and P* lie at or below the least max stage time, sum of stage times and
(m - 1) T_max + Opt + Off (interleaved: m R_max + Opt + Off) of any placement that fits, so the
cuts the MILP carries and the
bounds the search prunes with never remove the optimum; and where nothing but the split
matters (one option per class, memory free) T* is the brute-force minimum itself.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from bruteforce import every_config
from conftest import cluster_of, make_block, make_option
from test_solver_exact import SITUATIONS, configs, instances, reference

from planner.cost.records import CostInputs
from planner.search import Candidate
from planner.search.milp.candidate import stage_problem
from planner.search.milp.split_bound import split_bound
from planner.training import Training


def _least(inp: CostInputs, cand: Candidate) -> tuple[float, float, float]:
    """Over every placement that fits: least max_j T_j, sum_j T_j, (m-1) T_max + Opt + Off."""
    mesh, args = configs(inp, cand)
    m = inp.training.global_batch_size // (cand.dp * cand.micro_batch_size)
    most, total, weighted = math.inf, math.inf, math.inf
    for _, cost in every_config(inp, mesh, *args):
        if not cost.feasible:
            continue
        times = [st.time_s for st in cost.stages]
        most = min(most, max(times))
        total = min(total, sum(times))
        if cand.virtual_stages == 1:
            lead = (m - 1) * max(times)
        else:  # interleaved: m times the busiest rank's chunks
            lead = m * max(
                sum(st.time_s for st in cost.stages if st.pp_rank == r) for r in range(cand.pp)
            )
        weighted = min(weighted, lead + cost.optimizer_s + cost.offload_s)
    return most, total, weighted


@pytest.mark.parametrize("situation", SITUATIONS)
def test_split_bound_never_exceeds_any_placement(situation):
    strict = interleaved = wanted = 0
    for seed, inp, cand in instances(situation):
        wanted += cand.pp > 1 and cand.virtual_stages > 1
        sp = stage_problem(inp, cand)
        b = split_bound(sp)
        most, total, weighted = _least(inp, cand)
        assert b.feasible, f"seed {seed}: a placement fits by construction"
        assert b.max_stage <= most * (1 + 1e-9), f"seed {seed}"
        assert b.sum_stages <= total * (1 + 1e-9), f"seed {seed}"
        if cand.pp > 1:
            assert b.weighted_max <= weighted * (1 + 1e-9), f"seed {seed}"
            interleaved += cand.virtual_stages > 1 and math.isfinite(b.weighted_max)
        assert b.step_bound(sp) <= reference(inp, cand) * (1 + 1e-9), f"seed {seed}"
        strict += cand.pp > 1 and b.max_stage > 0
    assert strict >= 2  # pipelined instances are checked, not skipped
    assert interleaved >= min(wanted, 1)  # and interleaved ones' P*, where there are some


@pytest.mark.parametrize("n_layers,pp", [(8, 4), (11, 4), (6, 3), (9, 2)])
def test_min_max_split_is_exact_without_memory(n_layers, pp):
    """Identical layers between a light first block and a heavy last one, one option each,
    memory free: T* equals brute force's least max stage time over every contiguous split
    (the LP relaxation's even split would sit below it)."""
    times = [0.2e-3] + [1e-3] * n_layers + [2.5e-3]
    blocks = [make_block(i, "EL"[0 < i <= n_layers] if i <= n_layers else "H", params=0)
              for i in range(len(times))]  # fmt: skip
    options = [[make_option(t, 0.0, 1e6)] for t in times]
    inp = CostInputs(blocks, options, 1, cluster_of(pp), Training(4 * pp))
    cand = Candidate(pp, 1, 1, 1, "1f1b", 1, 0)
    most, _, _ = _least(inp, cand)
    b = split_bound(stage_problem(inp, cand))
    assert b.max_stage == pytest.approx(most, rel=1e-12)
    even = sum(times) / pp
    assert b.max_stage > even * 1.01 or n_layers % pp == 0


def test_split_bound_is_infeasible_when_no_stage_can_hold_the_first_blocks():
    """Device memory below what the first stage's in-flight activations need for any split:
    split_bound says no split fits, as brute force does."""
    seed, inp, cand = next(
        (s, i, c) for s, i, c in instances("device") if c.pp > 1 and c.schedule == "1f1b"
    )
    tight = CostInputs(
        inp.blocks,
        inp.options,
        1,
        cluster_of(cand.pp * cand.dp, memory_bytes=2**30, reserved_bytes=2**30),
        inp.training,
    )
    assert reference(tight, cand) == math.inf, f"seed {seed}"
    assert not split_bound(stage_problem(tight, cand)).feasible


def _rank_max_stage_by_stage(costs, n: int, p: int, rounds: int = 40) -> float:
    """_rank_max as written before its stages were weighted as one array: each stage's costs
    weighted on their own, the minimum read with ``min``, the reference for the same floats."""
    from planner.search.milp.split_bound import _project_simplex

    w = np.full(p, 1.0 / p)
    best, step = -math.inf, None
    for _ in range(rounds):
        with np.errstate(invalid="ignore"):
            weighted = [np.where(np.isinf(c), math.inf, c * w[j % p]) for j, c in enumerate(costs)]
        run, arg = weighted[0][0].copy(), []
        for cost in weighted[1:]:
            total = run[:, None] + cost
            arg.append(total.argmin(axis=0))
            run = total.min(axis=0)
        value, per_rank = float(run[n]), np.zeros(p)
        if not math.isfinite(value):
            return value
        b = n
        for j in range(len(weighted) - 1, 0, -1):
            a = int(arg[j - 1][b])
            per_rank[j % p] += costs[j][a, b]
            b = a
        per_rank[0] += costs[0][0, b]
        best = max(best, value)
        spread = per_rank - per_rank.mean()
        if np.allclose(spread, 0.0, atol=1e-12 * max(1.0, abs(value))):
            break
        step = step or 1.0 / max(per_rank.max() - per_rank.min(), 1e-300)
        w = _project_simplex(w + step * spread)
        step *= 0.85
    return best


@pytest.mark.parametrize("seed", range(6))
def test_rank_max_weighs_the_stages_as_stage_by_stage(seed):
    """Random interleaved problems (ranges not a stage and some too big infinite, weights that
    reach 0 on the simplex): the same bound to the bit."""
    from planner.search.milp.split_bound import _rank_max

    rng = np.random.default_rng(seed)
    n, p, v = int(rng.integers(8, 30)), int(rng.integers(2, 5)), int(rng.integers(2, 4))
    costs = []
    for _ in range(p * v):
        c = rng.random((n + 1, n + 1)) * rng.choice([1.0, 10.0, 1000.0], size=(n + 1, n + 1))
        c[np.tril(np.ones((n + 1, n + 1), bool))] = math.inf
        c[rng.random((n + 1, n + 1)) < 0.1] = math.inf
        costs.append(c)
    got, want = _rank_max(costs, n, p), _rank_max_stage_by_stage(costs, n, p)
    assert repr(got) == repr(want)
