"""The mixed-kind stage MILP against brute force: every kind per stage (every subset of the
pool's kinds), every contiguous split, every multiset of options per stage, priced by
mixed_cost.step_time; the MILP must find the least step time."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from planner.resources.mixed_bound import mixed_split_bound, step_bound
from planner.resources.mixed_cost import step_time
from planner.resources.mixed_milp import MixedProblem, solve_mixed
from planner.search.stage_data import GIB, StageProblem


def stage_problem(rng, seg_len, n_opts, pp, m, speed, capacity_gib) -> StageProblem:
    """Random per-option numbers for one kind; ``speed`` scales its times down."""

    def per_opt(lo, hi):
        return [rng.uniform(lo, hi, n) for n in n_opts]

    return StageProblem(
        pp=pp,
        v=1,
        m=m,
        seg_len=list(seg_len),
        time=[t / speed for t in per_opt(0.5, 2.0)],
        state=[x * GIB for x in per_opt(0.5, 3.0)],
        host=[np.zeros(n) for n in n_opts],
        act=[x * GIB for x in per_opt(0.1, 1.0)],
        ws=[x * GIB for x in per_opt(0.0, 0.5)],
        gather=[np.zeros(n) for n in n_opts],
        optim=per_opt(0.0, 0.05),
        offl=[np.zeros(n) for n in n_opts],
        has_params=[True] * len(seg_len),
        const_time=[0.0] * pp,
        inflight=[min(m, pp - j) for j in range(pp)],
        const_mem=[0.2 * GIB] * pp,
        capacity=capacity_gib * GIB,
        host_capacity=1e3 * GIB,
        dp_first=per_opt(-0.2, 0.2),
        dp_second=per_opt(-0.1, 0.1),
        dp_once=(0.01, 0.0),
    )


def random_problem(seed: int, pp: int, seg_len, n_opts, caps) -> MixedProblem:
    rng = np.random.default_rng(seed)
    K = len(caps)
    kinds = [
        stage_problem(rng, seg_len, n_opts, pp, 4, speed, cap)
        for speed, cap in zip((1.0, 1.8, 1.3)[:K], (14.0, 9.0, 11.0)[:K], strict=True)
    ]
    base = rng.uniform(0.0, 0.2, (K, pp))
    hop = rng.uniform(0.0, 0.1, (max(pp - 1, 0), K, K))
    for k in range(K):
        hop[:, k, k] *= 0.3  # inside one kind the link is faster than the fabric
    return MixedProblem([f"k{k}" for k in range(K)], kinds, base, hop, list(caps), 0.02)


def compositions(total: int, parts: int):
    """Every way to write ``total`` as ``parts`` positive integers, in order."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield [bounds[i + 1] - bounds[i] for i in range(parts)]


def stage_rows(mp: MixedProblem, sizes: list[int]):
    """Per stage, blocks per segment for a contiguous split of the model into ``sizes``."""
    seq = [s for s, n in enumerate(mp.seg_len) for _ in range(n)]
    rows, start = [], 0
    for size in sizes:
        part = seq[start : start + size]
        rows.append([part.count(s) for s in range(len(mp.seg_len))])
        start += size
    return rows


def option_multisets(count: int, n: int):
    """Every way to give ``count`` interchangeable blocks options of ``n``: counts per option."""
    for combo in itertools.combinations_with_replacement(range(n), count):
        yield [combo.count(o) for o in range(n)]


def brute_force(mp: MixedProblem) -> float:
    best = math.inf
    J, K = mp.J, len(mp.kinds)
    for sizes in compositions(sum(mp.seg_len), J):
        rows = stage_rows(mp, sizes)
        for kinds in itertools.product(range(K), repeat=J):
            per_stage = []
            for j, k in enumerate(kinds):
                n_opts = [len(t) for t in mp.per_kind[k].time]
                choices = [list(option_multisets(c, n)) for c, n in zip(rows[j], n_opts)]
                per_stage.append(list(itertools.product(*choices)))
            for combo in itertools.product(*per_stage):
                counts = [list(map(list, stage)) for stage in combo]
                best = min(best, step_time(mp, list(kinds), counts))
    return best


CASES = [
    # (seed, stages, blocks per segment, options per segment, stages each kind may run)
    (0, 2, [1, 3, 1], [2, 2, 2], [2, 2]),
    (1, 2, [1, 4, 1], [1, 3, 1], [1, 1]),
    (2, 3, [1, 3, 1], [2, 2, 1], [2, 1]),
    (3, 3, [1, 3, 1], [1, 2, 1], [1, 1, 1]),
    (4, 2, [4], [3], [2, 2, 2]),
    (5, 3, [1, 4, 1], [1, 2, 1], [3, 0]),
    (6, 2, [1, 3, 1], [2, 3, 2], [1, 2]),
    (7, 3, [2, 3], [2, 2], [1, 2]),
]


@pytest.mark.parametrize("case", CASES, ids=[f"seed{c[0]}" for c in CASES])
def test_mixed_milp_matches_brute_force(case):
    seed, pp, seg_len, n_opts, caps = case
    mp = random_problem(seed, pp, seg_len, n_opts, caps)
    expected = brute_force(mp)
    sol = solve_mixed(mp)
    if math.isinf(expected):
        assert sol.status == "infeasible"
        return
    assert sol.status == "optimal"
    assert sol.objective == pytest.approx(expected, rel=2e-4)
    # the placement the MILP returns is priced at what it claims
    assert step_time(mp, sol.kinds, sol.counts) == pytest.approx(sol.objective, rel=1e-6)


def test_some_case_mixes_kinds_and_some_does_not():
    """The cases above would not test the kind decision if every optimum used one kind."""
    mixed = []
    for seed, pp, seg_len, n_opts, caps in CASES:
        sol = solve_mixed(random_problem(seed, pp, seg_len, n_opts, caps))
        if sol.kinds:
            mixed.append(len(set(sol.kinds)) > 1)
    assert any(mixed) and not all(mixed)


def test_pool_limit_is_respected():
    """A kind the pool holds no stage of is never chosen, even when it is the fastest."""
    mp = random_problem(0, 2, [1, 3, 1], [2, 2, 2], [2, 0])
    fast = random_problem(0, 2, [1, 3, 1], [2, 2, 2], [2, 2])
    assert set(solve_mixed(mp).kinds) == {0}
    assert solve_mixed(fast).objective <= solve_mixed(mp).objective


def test_cutoff_prunes():
    mp = random_problem(2, 3, [1, 3, 1], [2, 2, 1], [2, 1])
    best = solve_mixed(mp).objective
    assert solve_mixed(mp, cutoff=best * 0.99).status == "cutoff"
    assert solve_mixed(mp, cutoff=best * 1.01).objective == pytest.approx(best, rel=2e-4)


@pytest.mark.parametrize("case", CASES, ids=[f"seed{c[0]}" for c in CASES])
def test_split_bound_never_exceeds_the_optimum(case):
    """mixed_bound's T*, S*, P* and step bound hold for the brute force's optimum; also when
    the fabric is cheaper than a kind's own link (the bound must use the cheaper hop)."""
    seed, pp, seg_len, n_opts, caps = case
    for fabric_cheaper in (False, True):
        mp = random_problem(seed, pp, seg_len, n_opts, caps)
        if fabric_cheaper:
            for k in range(len(caps)):
                mp.hop[:, k, k] *= 10.0
        expected = brute_force(mp)
        split = mixed_split_bound(mp)
        if math.isinf(expected):
            continue
        assert step_bound(mp, split) <= expected * (1 + 1e-9)
        sol = solve_mixed(mp, split=split)  # the cuts keep the optimum
        assert sol.objective == pytest.approx(expected, rel=2e-4)


def test_split_bound_prunes_something():
    """The bound is not vacuous: on some case it is within 20% of the optimum."""
    ratios = []
    for seed, pp, seg_len, n_opts, caps in CASES:
        mp = random_problem(seed, pp, seg_len, n_opts, caps)
        best = solve_mixed(mp).objective
        if math.isfinite(best):
            ratios.append(step_bound(mp, mixed_split_bound(mp)) / best)
    assert max(ratios) > 0.8 and max(ratios) <= 1 + 1e-9


def test_kinds_without_a_fabric_never_meet():
    """With no link between kinds 0 and 1 (inf hops), no pipeline hands over between them: the
    MILP's optimum equals the brute force's, which prices such placements at inf."""
    for seed, pp, seg_len, n_opts, caps in CASES:
        mp = random_problem(seed, pp, seg_len, n_opts, caps)
        if len(caps) < 2 or pp < 2:
            continue
        mp.hop[:, 0, 1] = mp.hop[:, 1, 0] = math.inf
        expected = brute_force(mp)
        sol = solve_mixed(mp, split=mixed_split_bound(mp))
        if math.isinf(expected):
            assert sol.status == "infeasible"
            continue
        assert sol.objective == pytest.approx(expected, rel=2e-4)
        assert all({a, b} != {0, 1} for a, b in zip(sol.kinds, sol.kinds[1:]))


def test_fixed_stage_counts_match_brute_force_over_those_counts():
    """Caps c adding up to the stages: the MILP's optimum is the brute force's over the
    placements that run exactly c[k] stages on kind k (the cost-objective search's problem)."""
    checked = 0
    for seed, pp, seg_len, n_opts, caps in CASES:
        mp = random_problem(seed, pp, seg_len, n_opts, caps)
        K = len(caps)
        for counts in itertools.product(range(pp + 1), repeat=K):
            if sum(counts) != pp or any(c > cap for c, cap in zip(counts, caps)):
                continue
            fixed = MixedProblem(
                mp.kinds, mp.per_kind, mp.base_time, mp.hop, list(counts), mp.const_step
            )
            expected = brute_force(fixed)
            sol = solve_mixed(fixed)
            if math.isinf(expected):
                assert sol.status == "infeasible"
                continue
            assert sol.objective == pytest.approx(expected, rel=2e-4)
            assert [sol.kinds.count(k) for k in range(K)] == list(counts)
            checked += 1
    assert checked >= 10
