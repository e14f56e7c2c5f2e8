"""Tests written for mutmut's generated mutants of planner/search/mixed/bound.py
(benchmarks/generated_mutants.py). The bounds are compared with a brute force over every
contiguous split and every variant per stage, on problems of one option per segment whose
ranges are priced in closed form (a range's time is its blocks' times plus the variant's stage
constant and cheapest hop; a range is infeasible only past a variant's memory); the unit
moves, flags and exposed floor by hand. docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from planner.search.milp.data import GIB, StageProblem
from planner.search.milp.split_bound import SplitBound
from planner.search.mixed.bound import (
    PHI_POINTS,
    PHI_STEP,
    exposed_floor,
    fastest_floor,
    mixed_split_bound,
    pipeline_floor,
    step_bound,
    total_moves,
    unit_moves,
    variant_costs,
    variant_flags,
)
from planner.search.mixed.milp import MixedProblem

SEG_LEN = [1, 3, 1]
# variants (kind, TP, DP multiple): kind 0 at TP 1 and 2, kind 1 at TP 1 and at TP 2 x DP 2
VARIANTS = [(0, 1, 1), (0, 2, 1), (1, 1, 1), (1, 2, 2)]
# per variant, per segment: one option's time per micro-batch, optimizer and offload times
TIMES = [[1.0, 2.0, 1.5], [0.75, 1.25, 1.0], [0.5, 3.0, 0.25], [0.375, 0.625, 0.5]]
OPTIM = [[0.5, 0.25, 0.125], [0.0625, 0.25, 1.0], [0.75, 0.0, 0.5], [0.25, 0.125, 0.0]]
OFFL = [[0.0, 0.125, 0.0], [0.25, 0.0, 0.0], [0.0, 0.0625, 0.0], [0.125, 0.0, 0.25]]
M = [4, 4, 4, 2]
# variant 2 holds at most 2 blocks (1 GiB each in 2.5 GiB), the others any number
CAPACITY = [100.0, 100.0, 2.5, 100.0]


def variant_problem(v: int, pp: int) -> StageProblem:
    one = lambda x: [np.array([x[s]], dtype=float) for s in range(len(SEG_LEN))]  # noqa: E731
    zeros = one([0.0] * 3)
    return StageProblem(
        pp=pp, v=1, m=M[v], seg_len=list(SEG_LEN), time=one(TIMES[v]),
        state=one([GIB] * 3), host=zeros, act=zeros, ws=zeros, gather=zeros,
        optim=one(OPTIM[v]), offl=one(OFFL[v]), has_params=[True] * 3,
        const_time=[0.0] * pp, inflight=[1.0] * pp, const_mem=[0.0] * pp,
        capacity=CAPACITY[v] * GIB, host_capacity=GIB,
        dp_first=one([0.1 * (v + 1), -0.5, 0.05 * v]),
        dp_second=one([0.0, 0.125 * v, -0.25 + 0.1 * v]),
        dp_once=(0.01 * v, 0.02 + 0.01 * v),
    )  # fmt: skip


def problem(pp: int = 3, units=(2, 4), needs=(), dp_needs=(), seed: int = 0) -> MixedProblem:
    rng = np.random.default_rng(seed)
    V = len(VARIANTS)
    return MixedProblem(
        ["a", "b"], VARIANTS, [variant_problem(v, pp) for v in range(V)],
        rng.uniform(0.0, 0.5, (V, pp)).round(3), rng.uniform(0.0, 0.4, (pp - 1, V, V)).round(3),
        list(units), const_step=0.375, needs=list(needs), dp_needs=list(dp_needs),
    )  # fmt: skip


def block_times(mp: MixedProblem, v: int, name: str = "time") -> list[float]:
    sp = mp.per_variant[v]
    return [float(getattr(sp, name)[s][0]) for s, n in enumerate(mp.seg_len) for _ in range(n)]


def tau(mp: MixedProblem, v: int, j: int, a: int, b: int) -> float:
    """Stage j's least time on variant v over blocks [a, b): their times, the variant's stage
    constant and its cheapest hop onwards; inf past its memory (1 GiB a block)."""
    if b - a > CAPACITY[v]:
        return math.inf
    hop = float(min(mp.hop[j][v])) if j < mp.J - 1 else 0.0
    return sum(block_times(mp, v)[a:b]) + float(mp.base_time[v][j]) + hop


def psi(mp: MixedProblem, v: int, j: int, a: int, b: int) -> float:
    """(m_v - 1) tau + the range's optimizer and offload times."""
    extra = sum(block_times(mp, v, "optim")[a:b]) + sum(block_times(mp, v, "offl")[a:b])
    return (M[v] - 1) * tau(mp, v, j, a, b) + extra


def splits(n: int, J: int):
    for cuts in itertools.combinations(range(1, n), J - 1):
        bounds = (0, *cuts, n)
        yield list(itertools.pairwise(bounds))


def allowed(mp: MixedProblem, chosen, per_kind: bool) -> bool:
    """The pool's units (each kind's, or their sum) and the needed degrees and multiples."""
    widths = [(mp.kind_of(v), mp.width(v)) for v in chosen]
    if per_kind:
        if any(sum(w for k, w in widths if k == kind) > u for kind, u in enumerate(mp.units)):
            return False
    elif sum(w for _, w in widths) > sum(mp.units):
        return False
    return all(d in {mp.tp_of(v) for v in chosen} for d in mp.needs) and all(
        d in {mp.dp_of(v) for v in chosen} for d in mp.dp_needs
    )


def brute(mp: MixedProblem, price, combine, per_kind: bool, keep=lambda *_: True) -> float:
    """min over splits and variants per stage (within the units) of the stages' prices
    combined; ``keep(v, j, a, b)`` drops a stage's range on a variant (inf)."""
    best = math.inf
    for ranges in splits(sum(mp.seg_len), mp.J):
        for chosen in itertools.product(range(len(mp.variants)), repeat=mp.J):
            if not allowed(mp, chosen, per_kind):
                continue
            parts = [
                price(mp, v, j, a, b) if keep(v, j, a, b) else math.inf
                for j, (v, (a, b)) in enumerate(zip(chosen, ranges))
            ]
            best = min(best, combine(parts))
    return best


def test_each_variants_stage_costs_are_its_ranges_closed_form():
    mp = problem()
    n = sum(SEG_LEN)
    for v in range(len(VARIANTS)):
        taus, psis = variant_costs(mp, v)
        assert len(taus) == len(psis) == mp.J
        for j in range(mp.J):
            for a, b in itertools.product(range(n + 1), repeat=2):
                want_tau = tau(mp, v, j, a, b) if a < b else math.inf
                want_psi = psi(mp, v, j, a, b) if a < b else math.inf
                assert taus[j][a, b] == pytest.approx(want_tau, rel=1e-9), (v, j, a, b)
                assert psis[j][a, b] == pytest.approx(want_psi, rel=1e-9), (v, j, a, b)


CASES = [
    dict(),
    dict(units=(1, 4)),
    dict(units=(1, 3)),
    dict(units=(3, 1)),
    dict(units=(2, 2), needs=(2,)),
    dict(units=(3, 6), dp_needs=(2,)),
    dict(units=(4, 4), needs=(1, 2), seed=3),
    dict(pp=2, units=(2, 4), seed=1),
    dict(pp=4, units=(3, 2), seed=2),
]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_the_split_bound_is_the_brute_force_over_splits_and_variants(case):
    """T* and S* within the kinds' units added up, P* within each kind's."""
    mp = problem(**case)
    got = mixed_split_bound(mp)
    t_star = brute(mp, tau, max, False)
    assert got.max_stage == pytest.approx(t_star, rel=1e-9)
    if math.isinf(t_star):
        assert math.isinf(got.sum_stages)
        return
    assert got.sum_stages == pytest.approx(brute(mp, tau, sum, False), rel=1e-9)
    assert got.weighted_max == pytest.approx(brute(mp, psi, max, True), rel=1e-9)
    # the caller's costs give the same
    costs = tuple(
        [[variant_costs(mp, v)[i][j] for v in range(len(VARIANTS))] for j in range(mp.J)]
        for i in (0, 1)
    )
    assert mixed_split_bound(mp, costs) == got


def test_the_per_kind_units_bind_p_star_only():
    """Units (1, 3): the sum (4) lets kind 0's second variant or two stages of it through
    for T* and S*, not for P*."""
    mp = problem(units=(1, 3))
    got = mixed_split_bound(mp)
    assert got.weighted_max > brute(mp, psi, max, False) * (1 + 1e-6)
    assert got.max_stage < brute(mp, tau, max, True) * (1 - 1e-6)
    assert got.sum_stages < brute(mp, tau, sum, True) * (1 - 1e-6)


def test_fewer_blocks_than_stages_or_one_stage_has_a_trivial_bound():
    assert mixed_split_bound(problem(pp=6)) == SplitBound(math.inf, math.inf)
    one = problem(pp=1)
    assert mixed_split_bound(one) == SplitBound(0.0, 0.0, 0.0)
    assert mixed_split_bound(problem(pp=5)).feasible  # one block a stage


def test_units_too_few_for_the_stages_make_the_bound_infeasible():
    bound = mixed_split_bound(problem(units=(1, 1)))  # 2 units for 3 stages
    assert bound == SplitBound(math.inf, math.inf)
    assert not bound.feasible


def fastest_of(mp: MixedProblem) -> list[np.ndarray]:
    return [np.array(TIMES[v]) for v in range(len(VARIANTS))]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_the_fastest_floor_is_the_brute_force_without_memory_or_constants(case):
    mp = problem(**case)
    scale = [m - 1.0 for m in M]

    def plain(mp, v, j, a, b):
        return sum(block_times(mp, v)[a:b])

    def scaled(mp, v, j, a, b):
        return scale[v] * plain(mp, v, j, a, b)

    s_f, q_f = fastest_floor(
        fastest_of(mp), mp.seg_len, mp.variants, mp.units, mp.J, scale, mp.needs, mp.dp_needs
    )
    want_q = brute(mp, scaled, max, True)
    assert q_f == pytest.approx(want_q, rel=1e-9)
    want_s = brute(mp, plain, sum, False) if math.isfinite(want_q) else math.inf
    assert s_f == pytest.approx(want_s, rel=1e-9)


def test_the_fastest_floor_of_fewer_blocks_than_stages_is_infinite():
    assert fastest_floor(fastest_of(problem()), [1, 1], VARIANTS, [2, 4], 3, [1.0] * 4) == (
        math.inf,
        math.inf,
    )
    # two blocks on two stages, a unit of each kind: S_f counts the units added up (both
    # stages of kind 0: 1 + 1), Q_f each kind's (one stage each: max(2 x 1, 0.5 x 3))
    s_f, q_f = fastest_floor([np.array([1.0]), np.array([3.0])], [2], [(0, 1, 1), (1, 1, 1)],
                             [1, 1], 2, [2.0, 0.5])  # fmt: skip
    assert (s_f, q_f) == (2.0, 2.0)


def test_the_pipeline_floor_is_the_brute_force_over_its_grid():
    """min over the grid of S(phi_{i+1}) + phi_i, with S* + phi_G, and at least S* + P*."""
    for case in CASES[:6]:
        mp = problem(**case)
        split = mixed_split_bound(mp)
        got = pipeline_floor(mp, split)
        if not split.feasible:
            assert got == split.sum_stages + split.weighted_max
            continue
        grid = [split.weighted_max * (1 + PHI_STEP * i) for i in range(PHI_POINTS + 1)]
        best = split.sum_stages + grid[-1]
        for low, high in itertools.pairwise(grid):

            def keep(v, j, a, b, high=high, mp=mp):
                return psi(mp, v, j, a, b) <= high * (1 + 1e-12)

            best = min(best, brute(mp, tau, sum, True, keep) + low)
        want = max(best, split.sum_stages + split.weighted_max)
        assert got == pytest.approx(want, rel=1e-9), case


def test_the_pipeline_floor_rises_above_s_star_plus_p_star_somewhere():
    """The cases above are not all at the floor's minimum S* + P*: the grid is live."""
    lifted = 0
    for case in CASES:
        mp = problem(**case)
        split = mixed_split_bound(mp)
        if split.feasible and pipeline_floor(mp, split) > (
            split.sum_stages + split.weighted_max
        ) * (1 + 1e-9):
            lifted += 1
    assert lifted >= 2


def test_the_pipeline_floor_of_one_stage_or_no_split_is_s_star_plus_p_star():
    one = problem(pp=1)
    assert pipeline_floor(one, SplitBound(0.0, 0.5, 0.25)) == 0.75
    mp = problem()
    assert pipeline_floor(mp, SplitBound(math.inf, 2.0, 3.0)) == 5.0


def test_variant_flags_track_the_needs_some_variant_lacks():
    variants = [(0, 1, 1), (0, 2, 1), (1, 2, 2)]
    flags, count = variant_flags(variants, [2, 1, 2], [1, 2])
    assert count == 4  # TP 1, TP 2, DP 1, DP 2
    assert flags == [(0, 2), (1, 2), (1, 3)]
    # a need every variant meets is not tracked
    assert variant_flags(variants, [], [1, 1]) == ([(0,), (0,), ()], 1)
    assert variant_flags([(0, 2, 1), (1, 2, 1)], [2], [1]) == ([(), ()], 0)
    assert variant_flags(variants, [4], []) == ([(), (), ()], 1)


def test_total_moves_count_in_the_widths_greatest_common_divisor():
    variants = [(0, 2, 1), (0, 4, 1), (1, 2, 3)]
    moves, dims, count = total_moves(variants, [5, 6], [4])
    assert moves == [(0, 1, ()), (0, 2, (0,)), (0, 3, ())]
    assert dims == (2 + 3 + 1,)
    assert count == 1


def test_unit_moves_coarsen_the_kind_with_most_states_first():
    variants = [(0, 1, 1), (0, 2, 1), (1, 4, 1)]
    # caps 8 and 2 (q = 1, 4): 27 states; kind 0 doubles twice to reach 3 x 3 <= 10
    assert unit_moves(variants, [8, 8], states=10) == (
        [(0, 0, ()), (0, 0, ()), (1, 1, ())],
        (3, 3),
        0,
    )
    assert unit_moves(variants, [8, 8]) == ([(0, 1, ()), (0, 2, ()), (1, 1, ())], (9, 3), 0)
    # a tie (4 and 4, 25 states over 20): the first kind doubles
    even = [(0, 1, 1), (1, 1, 1)]
    assert unit_moves(even, [4, 4], states=20) == ([(0, 0, ()), (1, 1, ())], (3, 5), 0)
    assert unit_moves(even, [4, 4], states=25) == ([(0, 1, ()), (1, 1, ())], (5, 5), 0)
    # a kind without variants counts in ones
    assert unit_moves([(1, 2, 1)], [3, 4], [2], [1]) == ([(1, 1, ())], (4, 3), 0)
    moves, dims, count = unit_moves([(0, 2, 1), (1, 2, 2)], [4, 8], [2], [2])
    assert (moves, dims, count) == ([(0, 1, ()), (1, 1, (0,))], (3, 3), 1)


def test_the_exposed_floor_is_each_blocks_least_dp_terms_and_the_least_once_over_stages():
    mp = problem()
    # per block the least d1 + d2 of any variant: segment 0: 0.1 (v0); segment 1: -0.5 (v0)
    # x 3; segment 2: min(-0.25, -0.1, 0.05, 0.2) = -0.25; once: min 0.02 (v0)
    per_block = 0.1 - 1.5 - 0.25
    assert exposed_floor(mp) == 0.0  # negative: clamped
    for v in range(len(VARIANTS)):
        mp.per_variant[v].dp_first[1] = np.array([0.5 + 0.1 * v])
    per_block = 0.1 + 3 * (0.5 + 0.0) - 0.25
    assert exposed_floor(mp) == pytest.approx((per_block + 0.02) / 3)
    mp.per_variant[0].dp_once = (0.5, 0.5)  # v1's 0.01 + 0.03 is then the least
    assert exposed_floor(mp) == pytest.approx((per_block + 0.04) / 3)


def test_the_step_bound_adds_the_pipeline_the_exposed_floor_and_the_constant():
    mp = problem()
    for v in range(len(VARIANTS)):
        mp.per_variant[v].dp_first[1] = np.array([0.5])
    exposed = (0.1 + 1.5 - 0.25 + 0.02) / 3
    split = SplitBound(1.0, 2.0, 3.0)
    assert step_bound(mp, split) == pytest.approx(2.0 + 3.0 + exposed + 0.375)
    assert step_bound(mp, split, 7.0) == pytest.approx(7.0 + exposed + 0.375)


@pytest.mark.parametrize(
    ("slow", "needs", "dp_needs"), [((1, 2, 1), [2], []), ((1, 1, 2), [], [2])]
)  # fmt: skip
def test_the_fastest_floor_keeps_a_stage_at_each_needed_degree(slow, needs, dp_needs):
    """Four blocks on three stages; kind 0's variant takes a block in 1, kind 1's (the only
    one at the needed TP degree or DP multiple) in 10, and some stage must run it: the
    busiest stage takes at least 10, the sum at least 3 + 10. Without the need three stages
    of kind 0 would give 2 and 4; with an empty stage allowed, 2 as well."""
    variants = [(0, 1, 1), slow]
    fastest = [np.array([1.0]), np.array([10.0])]
    got = fastest_floor(fastest, [4], variants, [3, 2], 3, [1.0, 1.0], needs, dp_needs)
    assert got == (13.0, 10.0)
    assert fastest_floor(fastest, [4], variants, [3, 2], 3, [1.0, 1.0]) == (4.0, 2.0)


def test_the_floors_refuse_lists_of_other_lengths():
    """A scale per variant and a cost per stage: lists of other lengths are refused (zip's
    strict), not cut short."""
    with pytest.raises(ValueError):
        fastest_floor([np.array([1.0])] * 2, [4], VARIANTS[:2], [3, 2], 2, [1.0] * 3)
    mp = problem()
    split = mixed_split_bound(mp)
    costs = tuple(
        [[variant_costs(mp, v)[i][j] for v in range(len(VARIANTS))] for j in range(mp.J)]
        for i in (0, 1)
    )
    assert pipeline_floor(mp, split, costs) == pipeline_floor(mp, split)
    with pytest.raises(ValueError):
        pipeline_floor(mp, split, (costs[0], costs[1][:2]))


def flat_variant(per_block: float, m: int) -> StageProblem:
    """Two stages, one segment of 4 blocks at ``per_block`` each, no memory to speak of."""
    one = [np.array([per_block])]
    zero = [np.array([0.0])]
    return StageProblem(
        pp=2, v=1, m=m, seg_len=[4], time=one, state=zero, host=zero, act=zero, ws=zero,
        gather=zero, optim=zero, offl=zero, has_params=[True], const_time=[0.0, 0.0],
        inflight=[1.0, 1.0], const_mem=[0.0, 0.0], capacity=GIB, host_capacity=GIB,
        dp_first=zero, dp_second=zero,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("slow", "needs", "dp_needs"), [((1, 2, 2), [2], []), ((1, 1, 2), [], [2])]
)  # fmt: skip
def test_the_pipeline_floor_keeps_a_stage_at_each_needed_degree(slow, needs, dp_needs):
    """Two stages of four blocks; kind 0's variant takes 1 a block at m = 4 (psi = 3 tau),
    kind 1's, the only one at the needed degree, 2 a block at m = 2 (psi = tau), units for
    one stage of each. With a stage
    of each: S* = 3 + 2 = 5 (psi 9), P* = 6 (2 and 2 blocks: sum 6, or 1 and 3: sum 7), and
    every split within the grid (psi <= 6 x 1.18) sums to 6 or more, so the floor is
    6 + 6 = 12, above S* + P* = 11. Without the need two stages of kind 0 (2 and 2 blocks,
    psi 6) would sum to 4, and the floor fall to 11."""
    mp = MixedProblem(
        ["a", "b"], [(0, 1, 1), slow], [flat_variant(1.0, 4), flat_variant(2.0, 2)],
        np.zeros((2, 2)), np.zeros((1, 2, 2)), [2, slow[1] * slow[2]], needs=needs,
        dp_needs=dp_needs,
    )  # fmt: skip
    split = mixed_split_bound(mp)
    assert (split.sum_stages, split.weighted_max) == (5.0, 6.0)
    assert pipeline_floor(mp, split) == pytest.approx(12.0)


@pytest.mark.parametrize(
    ("slow", "needs", "dp_needs"), [((1, 2, 2), [2], []), ((1, 1, 2), [], [2])]
)  # fmt: skip
def test_the_split_bound_keeps_a_stage_at_each_needed_degree(slow, needs, dp_needs):
    """Kind 0's variant takes 1 a block, kind 1's (the needed degree's) 2, both at m = 4
    (psi = 3 tau), units for one stage of each. With the need, one stage of each: T* = 3
    (3 and 1 blocks), S* = 3 + 2 = 5, P* = max(3 x 3, 3 x 2) = 9; without it two stages of
    kind 0 give 2, 4 and 6."""
    variants = [(0, 1, 1), slow]
    per_variant = [flat_variant(1.0, 4), flat_variant(2.0, 4)]
    units = [2, slow[1] * slow[2]]
    args = (["a", "b"], variants, per_variant, np.zeros((2, 2)), np.zeros((1, 2, 2)), units)
    needed = mixed_split_bound(MixedProblem(*args, needs=needs, dp_needs=dp_needs))
    assert needed == SplitBound(3.0, 5.0, 9.0)
    assert mixed_split_bound(MixedProblem(*args)) == SplitBound(2.0, 4.0, 6.0)


def test_coarsened_units_count_whole_steps():
    """Units 9 over steps of 4 are 2 whole steps (3 states), not 2.25."""
    variants = [(0, 1, 1), (0, 2, 1), (1, 4, 1)]
    assert unit_moves(variants, [9, 8], states=10) == (
        [(0, 0, ()), (0, 0, ()), (1, 1, ())],
        (3, 3),
        0,
    )
    _, dims, _ = unit_moves(variants, [9, 8], states=10)
    assert all(type(d) is int for d in dims)
