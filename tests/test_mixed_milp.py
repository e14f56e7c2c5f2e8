"""The mixed stage MILP against brute force: every variant (device kind, TP degree, DP multiple)
per stage, every contiguous split, every multiset of options per stage, priced by
mixed_cost.step_time; the MILP must find the least step time. The pools are small and random:
some give a kind several TP degrees, some several DP degrees (a stage of DP multiple r runs
m / r micro-batches per replica, under GPipe), some tie the first segment's weight to the
last's, some cap a kind's units so that it cannot hold its widest stage everywhere."""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import replace

import numpy as np
import pytest

from planner.search.candidates import Candidate
from planner.search.milp.data import GIB, StageProblem
from planner.search.mixed.bound import fastest_floor, mixed_split_bound, step_bound
from planner.search.mixed.cost import step_time
from planner.search.mixed.milp import MixedProblem, solve_mixed, tied_groups
from planner.search.mixed.search import floors_of

SPEEDS, CAPACITIES = (1.0, 1.8, 1.3), (14.0, 9.0, 11.0)


def stage_problem(
    rng, seg_len, n_opts, pp, m, speed, capacity_gib, tp=1, gpipe=False
) -> StageProblem:
    """Random per-option numbers for one variant; ``speed`` scales its times down, and TP
    degree ``tp`` splits the time (less than perfectly) and the states and activations.
    ``m``: its micro-batches per replica, all in flight under ``gpipe``."""

    def per_opt(lo, hi):
        return [rng.uniform(lo, hi, n) for n in n_opts]

    split = tp**0.8
    return StageProblem(
        pp=pp,
        v=1,
        m=m,
        seg_len=list(seg_len),
        time=[t / (speed * split) for t in per_opt(0.5, 2.0)],
        state=[x * GIB / tp for x in per_opt(0.5, 3.0)],
        host=[np.zeros(n) for n in n_opts],
        act=[x * GIB / tp for x in per_opt(0.1, 1.0)],
        ws=[x * GIB for x in per_opt(0.0, 0.5)],
        gather=[np.zeros(n) for n in n_opts],
        optim=per_opt(0.0, 0.05),
        offl=[np.zeros(n) for n in n_opts],
        has_params=[True] * len(seg_len),
        const_time=[0.0] * pp,
        inflight=[m if gpipe else min(m, pp - j) for j in range(pp)],
        const_mem=[0.2 * GIB] * pp,
        capacity=capacity_gib * GIB,
        host_capacity=1e3 * GIB,
        dp_first=per_opt(-0.2, 0.2),
        dp_second=per_opt(-0.1, 0.1),
        dp_once=(0.01, 0.0),
    )


def random_problem(
    seed: int, pp: int, seg_len, n_opts, units, degrees=(1,), tied=(), mults=(1,)
) -> MixedProblem:
    """Variants (k, t, r) for every kind k, degree t and DP multiple r; ``units``: each
    kind's units (t r added up). Four micro-batches per replica at r = 1, 4 / r at r."""
    rng = np.random.default_rng(seed)
    K = len(units)
    variants = [(k, t, r) for k in range(K) for r in mults for t in degrees]
    gpipe = len(mults) > 1
    per_variant = [
        stage_problem(rng, seg_len, n_opts, pp, 4 // r, SPEEDS[k], CAPACITIES[k], t, gpipe)
        for k, t, r in variants
    ]
    V = len(variants)
    base = rng.uniform(0.0, 0.2, (V, pp))
    hop = rng.uniform(0.0, 0.1, (max(pp - 1, 0), V, V))
    for v in range(V):
        hop[:, v, v] *= 0.3  # inside one kind at one degree the link is faster
    return MixedProblem(
        [f"k{k}" for k in range(K)],
        variants,
        per_variant,
        base,
        hop,
        list(units),
        0.02,
        tied=list(tied),
    )


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


def placements(mp: MixedProblem):
    """Every (variant per stage, counts) placement: splits x variants x option multisets."""
    J, V = mp.J, len(mp.variants)
    for sizes in compositions(sum(mp.seg_len), J):
        rows = stage_rows(mp, sizes)
        for chosen in itertools.product(range(V), repeat=J):
            per_stage = []
            for j, v in enumerate(chosen):
                n_opts = [len(t) for t in mp.per_variant[v].time]
                choices = [list(option_multisets(c, n)) for c, n in zip(rows[j], n_opts)]
                per_stage.append(list(itertools.product(*choices)))
            for combo in itertools.product(*per_stage):
                yield list(chosen), [list(map(list, stage)) for stage in combo]


def brute_force(mp: MixedProblem) -> float:
    return min((step_time(mp, v, c) for v, c in placements(mp)), default=math.inf)


CASES = [
    # (seed, stages, blocks per segment, options per segment, units per kind, TP degrees,
    #  tied segment pairs[, DP multiples])
    (0, 2, [1, 3, 1], [2, 2, 2], [2, 2], (1,), ()),
    (1, 2, [1, 4, 1], [1, 3, 1], [1, 1], (1,), ()),
    (2, 3, [1, 3, 1], [2, 2, 1], [2, 1], (1,), ()),
    (3, 3, [1, 3, 1], [1, 2, 1], [1, 1, 1], (1,), ()),
    (4, 2, [4], [3], [2, 2, 2], (1,), ()),
    (5, 3, [1, 4, 1], [1, 2, 1], [3, 0], (1,), ()),
    (6, 2, [1, 3, 1], [2, 3, 2], [1, 2], (1,), ()),
    (7, 3, [2, 3], [2, 2], [1, 2], (1,), ()),
    # two TP degrees per kind
    (8, 2, [1, 3, 1], [2, 2, 1], [3, 2], (1, 2), ()),
    (9, 3, [1, 3, 1], [1, 2, 1], [3, 4], (1, 2), ()),
    (10, 2, [1, 4, 1], [1, 2, 1], [4, 4], (1, 2), ((0, 2),)),
    (11, 3, [1, 3, 1], [1, 2, 1], [4, 3], (1, 2), ((0, 2),)),
    (12, 2, [4], [2], [2, 2, 2], (1, 2), ()),
    (13, 2, [1, 3, 1], [2, 2, 1], [2, 4], (1, 2, 4), ((0, 2),)),
    (14, 3, [1, 2, 1], [1, 2, 1], [5, 1], (1, 2), ()),
    # the tie binds: untied, these optima's first and last stages differ in degree
    (16, 2, [1, 3, 1], [2, 2, 1], [3, 3], (1, 2), ((0, 2),)),
    (21, 3, [1, 3, 1], [1, 2, 1], [4, 3], (1, 2), ((0, 2),)),
    # two DP degrees per kind (GPipe), with and without two TP degrees and a tie
    (30, 2, [1, 3, 1], [2, 2, 1], [3, 2], (1,), (), (1, 2)),
    (31, 3, [1, 3, 1], [1, 2, 1], [4, 2], (1,), (), (1, 2)),
    (32, 2, [1, 3, 1], [1, 2, 1], [4, 4], (1, 2), ((0, 2),), (1, 2)),
    (33, 2, [4], [2], [3, 2, 2], (1,), (), (1, 2)),
    (34, 3, [2, 3], [2, 2], [2, 3], (1,), ((0, 1),), (1, 2)),
]
IDS = [f"seed{c[0]}" for c in CASES]


def problem(case) -> MixedProblem:
    seed, pp, seg_len, n_opts, units, degrees, tied, *mults = case
    return random_problem(seed, pp, seg_len, n_opts, units, degrees, tied, *mults)


# The brute force and the MILP of a case, each computed once for the module: several tests
# compare with the same optimum (the brute force is most of this file's time).
@functools.cache
def case_optimum(index: int, second: float = 1.0) -> float:
    """The brute force's optimum of CASES[index], its times in ``second``s (in_seconds)."""
    mp = problem(CASES[index])
    return brute_force(mp if second == 1.0 else in_seconds(mp, second))


@functools.cache
def cell_optimum(index: int, lo: int, hi: int, top: int) -> float:
    """The brute force's optimum of the cell (lo, hi, top) of CASES[index]."""
    return brute_force(cell(problem(CASES[index]), lo, hi, top))


@functools.cache
def case_solution(index: int):
    """solve_mixed of CASES[index], no split bound nor cutoff."""
    return solve_mixed(problem(CASES[index]))


def solved_as_brute_force(mp: MixedProblem, expected: float, split=None):
    """The MILP's solution of ``mp`` against the brute force's optimum ``expected``:
    infeasible where that is inf (None returned), else at that value."""
    sol = solve_mixed(mp, split=split)
    if math.isinf(expected):
        assert sol.status == "infeasible"
        return None
    assert sol.objective == pytest.approx(expected, rel=2e-4)
    return sol


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_mixed_milp_matches_brute_force(case):
    mp, index = problem(case), CASES.index(case)
    sol, expected = case_solution(index), case_optimum(index)
    if math.isinf(expected):
        assert sol.status == "infeasible"
        return
    assert sol.objective == pytest.approx(expected, rel=2e-4)
    assert sol.status == "optimal"
    # the placement the MILP returns is priced at what it claims
    assert step_time(mp, sol.variants, sol.counts) == pytest.approx(sol.objective, rel=1e-6)
    assert sol.kinds == [mp.kind_of(v) for v in sol.variants]
    assert sol.tps == [mp.tp_of(v) for v in sol.variants]
    assert sol.dps == [mp.dp_of(v) for v in sol.variants]


def test_some_case_mixes_kinds_and_degrees_and_some_does_not():
    """The cases above would not test the variant decision if every optimum used one kind,
    one TP degree or one DP degree: some optimum mixes kinds, some TP degrees, some DP
    degrees, and some does none of these."""
    kinds, degrees, dps = [], [], []
    for index in range(len(CASES)):
        sol = case_solution(index)
        if sol.variants:
            kinds.append(len(set(sol.kinds)) > 1)
            degrees.append(len(set(sol.tps)) > 1)
            dps.append(len(set(sol.dps)) > 1)
    assert any(kinds) and not all(kinds)
    assert any(degrees) and not all(degrees)
    assert any(dps) and not all(dps)


def units_of(mp: MixedProblem, variants: list[int]) -> list[int]:
    """Each kind's units: its stages' widths (TP degree times DP multiple) added up."""
    units = [0] * len(mp.kinds)
    for v in variants:
        units[mp.kind_of(v)] += mp.width(v)
    return units


def test_pool_limit_is_respected():
    """A kind the pool holds no units of is never chosen, even when it is the fastest; a
    placement giving a kind more TP units than it holds is priced at inf, and the MILP's
    never does."""
    mp = random_problem(0, 2, [1, 3, 1], [2, 2, 2], [2, 0])
    fast = random_problem(0, 2, [1, 3, 1], [2, 2, 2], [2, 2])
    assert set(solve_mixed(mp).kinds) == {0}
    assert solve_mixed(fast).objective <= solve_mixed(mp).objective
    mp = problem(CASES[11])  # kind 1: 3 units, so at most one of its stages at degree 2
    over = next((v, c) for v, c in placements(mp) if units_of(mp, v)[1] > mp.units[1])
    assert math.isinf(step_time(mp, *over))
    free = random_problem(11, 3, [1, 3, 1], [1, 2, 1], [6, 6], (1, 2), ((0, 2),))
    assert units_of(free, solve_mixed(free).variants)[1] > 3  # the cap binds
    assert units_of(mp, solve_mixed(mp).variants)[1] <= 3


def test_cutoff_prunes():
    mp = problem(CASES[9])
    best = case_solution(9).objective
    assert solve_mixed(mp, cutoff=best * 0.99).status == "cutoff"
    assert solve_mixed(mp, cutoff=best * 1.01).objective == pytest.approx(best, rel=2e-4)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_split_bound_never_exceeds_the_optimum(case):
    """mixed_bound's T*, S*, P* and step bound hold for the brute force's optimum; also when
    the fabric is cheaper than a variant's own link (the bound must use the cheaper hop)."""
    for fabric_cheaper in (False, True):
        mp = problem(case)
        if fabric_cheaper:
            for v in range(len(mp.variants)):
                mp.hop[:, v, v] *= 10.0
        expected = brute_force(mp) if fabric_cheaper else case_optimum(CASES.index(case))
        split = mixed_split_bound(mp)
        if math.isinf(expected):
            continue
        assert step_bound(mp, split) <= expected * (1 + 1e-9)
        sol = solve_mixed(mp, split=split)  # the cuts keep the optimum
        assert sol.objective == pytest.approx(expected, rel=2e-4)


def test_split_bound_prunes_something():
    """The bound is not vacuous: on some case it is within 20% of the optimum."""
    ratios = []
    for index, case in enumerate(CASES):
        mp = problem(case)
        best = case_solution(index).objective
        if math.isfinite(best):
            ratios.append(step_bound(mp, mixed_split_bound(mp)) / best)
    assert max(ratios) > 0.8 and max(ratios) <= 1 + 1e-9


def test_kinds_without_a_fabric_never_meet():
    """With no link between kinds 0 and 1 (inf hops), no pipeline hands over between them: the
    MILP's optimum equals the brute force's, which prices such placements at inf."""
    checked = 0
    for case in CASES:
        mp = problem(case)
        if len(mp.kinds) < 2 or mp.J < 2:
            continue
        for a, b in itertools.product(range(len(mp.variants)), repeat=2):
            if {mp.kind_of(a), mp.kind_of(b)} == {0, 1}:
                mp.hop[:, a, b] = math.inf
        sol = solved_as_brute_force(mp, brute_force(mp), mixed_split_bound(mp))
        if sol is None:
            continue
        assert all({a, b} != {0, 1} for a, b in zip(sol.kinds, sol.kinds[1:]))
        checked += 1
    assert checked >= 8


def test_tied_segments_share_one_degree():
    """A weight tied between the first and last segments: the MILP's stages holding them run
    one TP and one DP degree, the brute force prices any other placement at inf, and without
    the tie the optimum is lower on some case (the constraint binds)."""
    binds = 0
    for index, case in enumerate(CASES):
        if not case[6]:
            continue
        mp = problem(case)
        sol = case_solution(index)
        assert (sol.tps[0], sol.dps[0]) == (sol.tps[-1], sol.dps[-1])
        free = problem(case[:6] + ((),) + case[7:])
        unconstrained = solve_mixed(free)
        assert unconstrained.objective <= sol.objective * (1 + 2e-4)
        ends = [(unconstrained.tps[j], unconstrained.dps[j]) for j in (0, -1)]
        binds += ends[0] != ends[-1]
        v, c = unconstrained.variants, unconstrained.counts
        if ends[0] != ends[-1]:
            assert math.isinf(step_time(mp, v, c))
    assert binds >= 1


def test_tied_groups_join_pairs():
    assert tied_groups([(0, 4), (4, 2), (1, 3)], 5) == [(0, 2, 4), (1, 3)]
    assert tied_groups([], 3) == []


def fixed_units(mp: MixedProblem, units) -> MixedProblem:
    return replace(mp, units=list(units), units_low=list(units))


def test_fixed_units_match_brute_force_over_those_units():
    """Units fixed per kind (lo = hi, the rate search's leaves): the MILP's optimum is the
    brute force's over the placements whose kinds' stages add up to exactly those degrees
    (step_time prices the others at inf); and the least over every fixed entry is the free
    optimum (the entries cover every placement)."""
    checked = 0
    for index, case in enumerate(CASES):
        mp = problem(case)
        by_units: dict[tuple[int, ...], float] = {}
        spot = True
        for v, c in placements(mp):
            units = tuple(units_of(mp, v))
            value = step_time(mp, v, c)
            by_units[units] = min(by_units.get(units, math.inf), value)
            if math.isfinite(value) and spot:  # lo = hi prices only its own units
                spot = False
                assert step_time(fixed_units(mp, units), v, c) == value
                more = (units[0] + 1, *units[1:])
                assert math.isinf(step_time(fixed_units(mp, more), v, c))
        least = math.inf
        for units, expected in sorted(by_units.items()):
            if any(u > cap for u, cap in zip(units, mp.units)):
                continue  # beyond the pool: priced inf above
            sol = solved_as_brute_force(fixed_units(mp, units), expected)
            if sol is None:
                continue
            assert units_of(mp, sol.variants) == list(units)
            least = min(least, sol.objective)
            checked += 1
        assert least == pytest.approx(case_optimum(index), rel=2e-4)
    assert checked >= 40


def cell(mp: MixedProblem, lo: int, hi: int, top: int = 1) -> MixedProblem:
    """The search's cell of ``mp``: variants of degrees lo .. hi and DP multiples 1 .. top,
    each of lo, hi, 1 and top taken by some stage."""
    keep = [v for v, (_, t, r) in enumerate(mp.variants) if lo <= t <= hi and r <= top]
    return replace(
        mp,
        variants=[mp.variants[v] for v in keep],
        per_variant=[mp.per_variant[v] for v in keep],
        base_time=mp.base_time[keep],
        hop=mp.hop[:, keep][:, :, keep],
        needs=sorted({lo, hi}),
        dp_needs=sorted({1, top}),
    )


def test_cells_part_the_placements():
    """The cells (least and largest TP degree, largest DP multiple) of a problem: each cell's
    MILP optimum is the brute force's over its placements (the needed degrees priced inf when
    missing), and the least over the cells is the problem's optimum over the placements with a
    stage at DP multiple 1 (they cover every such placement)."""
    checked = 0
    for index, case in enumerate(CASES):
        mp = problem(case)
        degrees = sorted({t for _, t, _ in mp.variants})
        tops = sorted({r for _, _, r in mp.variants})
        if len(degrees) < 2 and len(tops) < 2:
            continue
        least = math.inf
        for lo, hi in itertools.combinations_with_replacement(degrees, 2):
            for top in tops:
                part = cell(mp, lo, hi, top)
                expected = cell_optimum(index, lo, hi, top)
                sol = solved_as_brute_force(part, expected, mixed_split_bound(part))
                if sol is None:
                    continue
                assert step_bound(part, mixed_split_bound(part)) <= expected * (1 + 1e-9)
                assert min(sol.tps) == lo and max(sol.tps) == hi
                assert min(sol.dps) == 1 and max(sol.dps) == top
                least = min(least, expected)
                checked += 1
        # the placements with no stage at multiple 1 are another candidate's (of a larger dp)
        assert least == pytest.approx(brute_force(replace(mp, dp_needs=[1])), rel=2e-4)
    assert checked >= 20


def test_cell_floors_never_exceed_the_cells_optimum():
    """The search's cheap floors of a cell, from each variant's fastest options alone
    (``mixed.floors_of``: F (1 + (m / top - 1) / pp) and the kinds' rank-seconds, and
    mixed_bound.fastest_floor's recurrences with each variant's own micro-batches), are at
    most the cell's optimum: with stages of several DP degrees, each replica of a stage at
    multiple r runs m / r micro-batches, not m."""
    checked = 0
    for index, case in enumerate(CASES):
        mp = problem(case)
        tops = sorted({r for _, _, r in mp.variants})
        degrees = sorted({t for _, t, _ in mp.variants})
        for lo, hi in itertools.combinations_with_replacement(degrees, 2):
            for top in tops:
                part = cell(mp, lo, hi, top)
                expected = cell_optimum(index, lo, hi, top)
                if math.isinf(expected):
                    continue
                fastest = [np.array([float(np.min(t)) for t in sp.time]) for sp in part.per_variant]
                cand = Candidate(part.J, 1, hi, 1, "gpipe", 1, 0)
                fl = floors_of(fastest, part.seg_len, part.variants, len(part.kinds), cand, 4, ())
                assert fl.step(part.units) <= expected * (1 + 1e-9), (case[0], lo, hi, top)
                scale = [4 // r - 1.0 for _, _, r in part.variants]
                least_sum, busiest = fastest_floor(
                    fastest, part.seg_len, part.variants, part.units, part.J, scale,
                    part.needs, part.dp_needs,
                )  # fmt: skip
                assert least_sum + busiest <= expected * (1 + 1e-9), (case[0], lo, hi, top)
                checked += 1
    assert checked >= 40


TIME_FIELDS = ("time", "optim", "offl", "dp_first", "dp_second")


def in_seconds(mp: MixedProblem, second: float) -> MixedProblem:
    """``mp`` with every time multiplied by ``second``: the cases' steps of a few units become
    steps of a few ``second`` (1e-5: the tens of microseconds of a small model on a pool)."""
    per_variant = [
        replace(
            sp,
            **{f: [np.asarray(x) * second for x in getattr(sp, f)] for f in TIME_FIELDS},
            dp_once=tuple(x * second for x in sp.dp_once),
            const_time=[x * second for x in sp.const_time],
        )
        for sp in mp.per_variant
    ]
    return replace(
        mp,
        per_variant=per_variant,
        base_time=mp.base_time * second,
        hop=mp.hop * second,
        const_step=mp.const_step * second,
    )


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_milp_objective_is_the_step_time_of_its_placement_at_any_scale(case):
    """The mixed twin of test_solver_exact's test_milp_objective_is_the_cost_models_step_time:
    the MILP's value of the placement it returns is that placement's step time
    (mixed.cost.step_time, what a plan reports) to 1e-9, with the case's times in seconds
    and in tens of microseconds, and its optimum is the brute force's. HiGHS's feasibility
    tolerances are absolute: priced in seconds, a step of 3e-5 s let the MILP count terms
    1e-6 s short and certify a placement 3% slower than it claimed (issue 50)."""
    for second in (1.0, 1e-5):
        mp = in_seconds(problem(case), second)
        expected = case_optimum(CASES.index(case), second)
        sol = solved_as_brute_force(mp, expected, mixed_split_bound(mp))
        if sol is None:
            continue
        assert sol.status == "optimal"
        assert sol.objective == pytest.approx(step_time(mp, sol.variants, sol.counts), rel=1e-9)


def one_way(mp: MixedProblem, first: int, then: int) -> MixedProblem:
    """``mp`` with its fabric between kinds ``first`` and ``then`` usable from ``first`` to
    ``then`` only: every hop from a stage of ``then`` to one of ``first`` forbidden (inf)."""
    hop = mp.hop.copy()
    for a, b in itertools.product(range(len(mp.variants)), repeat=2):
        if (mp.kind_of(a), mp.kind_of(b)) == (then, first):
            hop[:, a, b] = math.inf
    return replace(mp, hop=hop)


TWO_KIND_CASES = [c for c in CASES if len(c[4]) == 2 and c[1] >= 2]


def test_both_orders_of_a_fabric_are_searched():
    """Two kinds joined by a fabric, priced in tens of microseconds: the MILP's optimum is
    the brute force's over every placement, whichever kind comes first, and also over each
    order alone (the fabric usable one way); the one-way optima are never below the both-ways
    one, and on some case each order alone loses to the other (so a search of one order
    would miss the optimum, and its certificate would cover half the space)."""
    orders = []
    for case in TWO_KIND_CASES:
        mp = in_seconds(problem(case), 1e-5)
        both = case_optimum(CASES.index(case), 1e-5)
        ways = [brute_force(one_way(mp, a, b)) for a, b in ((0, 1), (1, 0))]
        for part, expected in zip((mp, one_way(mp, 0, 1), one_way(mp, 1, 0)), (both, *ways)):
            solved_as_brute_force(part, expected, mixed_split_bound(part))
        if math.isinf(both):
            continue
        assert min(ways) >= both * (1 - 1e-12)
        if mp.J == 2:  # one hand-over at most: the better order is the optimum
            assert min(ways) == pytest.approx(both, rel=1e-12)
        orders.append(tuple(w > both * (1 + 1e-9) for w in ways))
    assert (True, False) in orders and (False, True) in orders
