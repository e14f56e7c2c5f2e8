"""Tests written for mutmut's generated mutants of planner/search/mixed/milp.py
(benchmarks/generated_mutants.py). The MILP's optimum against a brute force over every
placement (mixed.cost.step_time over every split, variant per stage and option multiset) on
tiny problems whose every term is live: host memory, gathered buffers, the loss's working set,
the optimizer step's peak, offload, options the candidate forbids, segments without parameters,
per-stage constants, needed degrees and multiples, a kind's least units, a tie, a forbidden
fabric. test_mixed_milp.py holds the larger matrix (two minutes); these take seconds.
docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import functools
import itertools
import math
import time
from dataclasses import replace

import highspy
import numpy as np
import pytest

from planner.search.milp.data import GIB, StageProblem
from planner.search.milp.solve import MIP_REL_GAP
from planner.search.milp.split_bound import SplitBound
from planner.search.mixed import milp
from planner.search.mixed.bound import mixed_split_bound
from planner.search.mixed.cost import step_time
from planner.search.mixed.milp import (
    FEASIBILITY_TOLERANCE,
    MixedProblem,
    MixedSolution,
    solve_mixed,
    tied_groups,
    time_unit,
    variant_triples,
)

SEG_LEN = [1, 2, 1]
N_OPTS = [1, 2, 2]


@pytest.fixture(autouse=True)
def _own_highs_scheduler():
    """mutmut forks a child per mutant from the process that ran the clean tests; HiGHS's task
    scheduler's threads do not come with a fork (planner/search/overlap.py), and a MILP there
    would wait on them forever: each test starts HiGHS's scheduler afresh."""
    highspy.Highs.resetGlobalScheduler(False)


def rich_variant(
    rng, pp: int, m: int, speed: float, tp: int, gpipe: bool, cap: tuple[float, float]
) -> StageProblem:
    """Random numbers for every field of a variant, each large enough to matter somewhere;
    ``cap``: the range of its device memory (GiB), its host's a fifth of it."""

    def per_opt(lo, hi):
        return [rng.uniform(lo, hi, n) for n in N_OPTS]

    return StageProblem(
        pp=pp, v=1, m=m, seg_len=list(SEG_LEN),
        time=[t / (speed * tp**0.8) for t in per_opt(0.5, 2.0)],
        state=[x * GIB / tp for x in per_opt(0.5, 2.5)],
        host=[x * GIB for x in per_opt(0.0, 1.0)],
        act=[x * GIB / tp for x in per_opt(0.1, 0.8)],
        ws=[x * GIB for x in per_opt(0.0, 1.0)],
        gather=[x * GIB for x in per_opt(0.0, 1.0)],
        optim=per_opt(0.0, 0.3),
        offl=per_opt(0.0, 0.3),
        has_params=[True, True, False],
        const_time=[0.0] * pp,
        inflight=[m if gpipe else min(m, pp - j) for j in range(pp)],
        const_mem=list(rng.uniform(0.1, 0.6, pp) * GIB),
        capacity=rng.uniform(*cap) * GIB,
        host_capacity=rng.uniform(*cap) * GIB / 5,
        dp_first=per_opt(-0.2, 0.3),
        dp_second=per_opt(-0.2, 0.3),
        dp_once=(float(rng.uniform(0, 0.1)), float(rng.uniform(0, 0.1))),
        allowed=[np.ones(n, bool) for n in N_OPTS[:2]] + [np.array([rng.random() < 0.5, True])],
        step=[x * GIB for x in per_opt(1.5, 3.5)] if rng.random() < 0.5 else None,
        loss_mem=[0.0] * (pp - 1) + [float(rng.uniform(0.0, 1.5)) * GIB],
    )  # fmt: skip


def rich_problem(
    seed: int,
    pp: int,
    units,
    degrees=(1,),
    mults=(1,),
    tied=(),
    low=None,
    needs=(),
    dp_needs=(),
    cap=(5.0, 7.0),
) -> MixedProblem:
    rng = np.random.default_rng(seed)
    variants = [(k, t, r) for k in range(len(units)) for r in mults for t in degrees]
    gpipe = len(mults) > 1
    per_variant = [
        rich_variant(rng, pp, 4 // r, (1.0, 1.6, 1.3)[k], t, gpipe, cap) for k, t, r in variants
    ]
    V = len(variants)
    hop = rng.uniform(0.0, 0.15, (pp - 1, V, V))
    return MixedProblem(
        [f"k{k}" for k in range(len(units))], variants, per_variant,
        rng.uniform(0.0, 0.2, (V, pp)), hop, list(units), float(rng.uniform(0.0, 0.05)),
        units_low=low, tied=list(tied), needs=list(needs), dp_needs=list(dp_needs),
    )  # fmt: skip


def compositions(total: int, parts: int):
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield [bounds[i + 1] - bounds[i] for i in range(parts)]


def placements(mp: MixedProblem):
    """Every (variant per stage, counts) placement of contiguous stages."""
    seq = [s for s, n in enumerate(mp.seg_len) for _ in range(n)]
    for sizes in compositions(len(seq), mp.J):
        starts = np.cumsum([0, *sizes])
        rows = [[seq[a:b].count(s) for s in range(len(mp.seg_len))] for a, b in
                zip(starts, starts[1:])]  # fmt: skip
        for chosen in itertools.product(range(len(mp.variants)), repeat=mp.J):
            per_stage = []
            for j, v in enumerate(chosen):
                choices = []
                for s, c in enumerate(rows[j]):
                    n = len(mp.per_variant[v].time[s])
                    combos = itertools.combinations_with_replacement(range(n), c)
                    choices.append([[combo.count(o) for o in range(n)] for combo in combos])
                per_stage.append(list(itertools.product(*choices)))
            for combo in itertools.product(*per_stage):
                yield list(chosen), [list(map(list, stage)) for stage in combo]


def brute_force(mp: MixedProblem) -> float:
    return min((step_time(mp, v, c) for v, c in placements(mp)), default=math.inf)


CASES = {
    "two kinds": dict(seed=0, pp=2, units=(1, 1), cap=(6.0, 8.0)),
    "three stages": dict(seed=1, pp=3, units=(2, 1)),
    "two degrees": dict(seed=2, pp=2, units=(2, 3), degrees=(1, 2)),
    "two degrees, least units": dict(seed=3, pp=2, units=(3, 3), degrees=(1, 2), low=(2, 1)),
    "dp multiples": dict(seed=4, pp=2, units=(2, 3), mults=(1, 2)),
    "needs": dict(seed=5, pp=2, units=(3, 3), degrees=(1, 2), needs=(1, 2), dp_needs=(1,)),
    "dp needs": dict(seed=6, pp=2, units=(3, 3), mults=(1, 2), dp_needs=(1, 2), cap=(8.0, 10.0)),
    "tied": dict(seed=7, pp=2, units=(3, 3), degrees=(1, 2), tied=((0, 2),)),
    "tied dp": dict(seed=8, pp=3, units=(3, 2), mults=(1, 2), tied=((0, 2),)),
    "one kind": dict(seed=9, pp=2, units=(2,), degrees=(1, 2), cap=(8.0, 10.0)),
    # no hop: the layout's w block is empty (its width max(J - 1, 0) V^2)
    "one stage": dict(seed=10, pp=1, units=(2, 1), cap=(20.0, 30.0)),
    # a tie and the needs that bind: without them the brute force's optimum is faster
    # (7.14 for 7.85 and 7.33 for 8.91)
    "tied, binding": dict(seed=11, pp=2, units=(3, 3), degrees=(1, 2), tied=((0, 2),)),
    "needs, binding": dict(seed=12, pp=2, units=(3, 3), degrees=(1, 2), needs=(1, 2)),
}


@functools.cache
def optimum(name: str) -> float:
    """The brute force's optimum, computed once (by the unmutated step_time in mutmut's runs:
    a reference the MILP's mutants cannot move)."""
    return brute_force(rich_problem(**CASES[name]))


def check(mp: MixedProblem, expected: float, **kw) -> MixedSolution:
    sol = solve_mixed(mp, **kw)
    if math.isinf(expected):
        assert sol.status in ("infeasible", "cutoff")
        assert (sol.variants, sol.counts, sol.objective) == ([], [], math.inf)
        return sol
    assert sol.status == "optimal"
    assert sol.objective == pytest.approx(expected, rel=2e-6)
    assert step_time(mp, sol.variants, sol.counts) == pytest.approx(sol.objective, rel=1e-9)
    assert all(type(c) is int for stage in sol.counts for seg in stage for c in seg)
    assert sol.kinds == [mp.kind_of(v) for v in sol.variants]
    assert sol.tps == [mp.tp_of(v) for v in sol.variants]
    assert sol.dps == [mp.dp_of(v) for v in sol.variants]
    assert math.isnan(sol.milp_objective)
    return sol


@pytest.mark.parametrize("name", CASES)
def test_the_milps_optimum_is_the_brute_forces(name):
    mp = rich_problem(**CASES[name])
    expected = optimum(name)
    assert math.isfinite(expected)
    check(mp, expected)
    check(mp, expected, split=mixed_split_bound(mp))


def test_the_binding_cases_bind():
    """Without their tie or their needs, the two binding cases' optima are faster."""
    for name, field in (("tied, binding", "tied"), ("needs, binding", "needs")):
        mp = rich_problem(**CASES[name])
        assert brute_force(replace(mp, **{field: []})) < optimum(name) * (1 - 1e-3)


def test_the_cases_make_every_term_matter():
    """Each field a random case sets is live in some optimum: without it (zeroed, or the
    limit lifted) some case's brute-force optimum moves."""
    live = dict.fromkeys(("host", "gather", "ws", "step", "loss", "offl", "allowed", "once"), 0)
    for name in ("two degrees", "two degrees, least units", "dp multiples"):
        mp, best = rich_problem(**CASES[name]), optimum(name)
        for field in live:
            per = []
            for sp in mp.per_variant:
                zero = [np.zeros_like(x) for x in sp.time]
                per.append(
                    {
                        "host": replace(sp, host_capacity=1e9 * GIB),
                        "gather": replace(sp, gather=zero),
                        "ws": replace(sp, ws=zero),
                        "step": replace(sp, step=None),
                        "loss": replace(sp, loss_mem=[0.0] * sp.pp),
                        "offl": replace(sp, offl=zero),
                        "allowed": replace(sp, allowed=None),
                        "once": replace(sp, dp_once=(0.0, 0.0)),
                    }[field]
                )
            if brute_force(replace(mp, per_variant=per)) != best:
                live[field] += 1
    assert all(live.values()), live


def apart(mp: MixedProblem) -> MixedProblem:
    """``mp`` with no fabric between kinds 0 and 1 (inf hops both ways)."""
    hop = mp.hop.copy()
    for a, b in itertools.product(range(len(mp.variants)), repeat=2):
        if mp.kind_of(a) != mp.kind_of(b):
            hop[:, a, b] = math.inf
    return replace(mp, hop=hop)


def test_a_forbidden_fabric_keeps_kinds_apart_and_an_empty_pool_is_infeasible():
    """One unit of each kind for two stages: without a fabric no placement is left. Three
    stages on three units of each: one kind takes them all, slower than the optimum that
    mixed them."""
    mp = rich_problem(**CASES["two kinds"])
    assert math.isfinite(optimum("two kinds"))
    assert brute_force(apart(mp)) == math.inf
    check(apart(mp), math.inf)
    check(replace(mp, units=[0, 0]), math.inf)
    roomy = apart(replace(rich_problem(**CASES["three stages"]), units=[3, 3]))
    sol = check(roomy, brute_force(roomy))
    assert len(set(sol.kinds)) == 1 and sol.objective > optimum("three stages")


def test_a_cutoff_below_the_optimum_prunes_and_above_it_keeps_it():
    mp = rich_problem(**CASES["two degrees"])
    best = optimum("two degrees")
    sol = solve_mixed(mp, cutoff=best * 0.999)
    assert (sol.status, sol.objective, sol.variants) == ("cutoff", math.inf, [])
    check(mp, best, cutoff=best * 1.001)


def test_an_infeasible_split_bound_is_infeasible_without_a_solve():
    mp = rich_problem(**CASES["two kinds"])
    sol = solve_mixed(mp, split=SplitBound(math.inf, math.inf))
    assert (sol.status, sol.objective, sol.variants, sol.counts) == ("infeasible", math.inf, [], [])
    assert sol.nodes == 0 and sol.solve_time_s == 0.0


def test_interleaved_variants_are_refused():
    mp = rich_problem(**CASES["two kinds"])
    mp.per_variant[1] = replace(mp.per_variant[1], v=2)
    with pytest.raises(ValueError) as err:
        solve_mixed(mp)
    assert str(err.value) == "the mixed-kind MILP covers plain 1F1B / GPipe pipelines (v = 1)"


def test_a_node_limit_of_one_stops_early_or_proves_optimal():
    mp = rich_problem(**CASES["three stages"])
    sol = solve_mixed(mp, node_limit=1)
    assert sol.status in ("node_limit", "optimal", "no_solution")
    assert sol.nodes <= 1
    if sol.status != "no_solution":
        assert sol.objective >= optimum("three stages") * (1 - 2e-6)


def test_the_time_unit_is_s_star_or_every_block_at_its_fastest():
    mp = rich_problem(**CASES["two degrees"])
    assert time_unit(mp, SplitBound(1.0, 2.5, 3.0)) == 2.5
    fastest = sum(
        n * min(float(np.min(sp.time[s])) for sp in mp.per_variant)
        for s, n in enumerate(mp.seg_len)
    )
    assert fastest > 0
    for split in (None, SplitBound(1.0, 0.0, 3.0), SplitBound(1.0, math.inf, 3.0)):
        assert time_unit(mp, split) == pytest.approx(fastest, rel=1e-12)
    zero = [replace(sp, time=[np.zeros_like(t) for t in sp.time]) for sp in mp.per_variant]
    assert time_unit(replace(mp, per_variant=zero), None) == 1.0


def test_a_problems_variants_and_their_figures():
    assert variant_triples([(0, 2), (1, 4, 2)]) == [(0, 2, 1), (1, 4, 2)]
    mp = rich_problem(**CASES["dp multiples"])
    assert mp.variants == [(0, 1, 1), (0, 1, 2), (1, 1, 1), (1, 1, 2)]
    assert [mp.kind_of(v) for v in range(4)] == [0, 0, 1, 1]
    assert [mp.dp_of(v) for v in range(4)] == [1, 2, 1, 2]
    assert [mp.width(v) for v in range(4)] == [1, 2, 1, 2]
    assert [mp.m_of(v) for v in range(4)] == [4, 2, 4, 2]
    assert (mp.J, mp.seg_len, mp.m_min, mp.low) == (2, SEG_LEN, 2, [0, 0])
    wide = rich_problem(**CASES["two degrees, least units"])
    assert [wide.tp_of(v) for v in range(4)] == [1, 2, 1, 2]
    assert [wide.width(v) for v in range(4)] == [1, 2, 1, 2]
    assert wide.low == [2, 1]
    pairs = MixedProblem(["a"], [(0, 2)], mp.per_variant[:1], mp.base_time[:1], mp.hop, [2])
    assert pairs.variants == [(0, 2, 1)] and pairs.width(0) == 2


def test_tied_groups_join_chains_and_keep_each_segment_once():
    assert tied_groups([(0, 4), (4, 2), (1, 3)], 5) == [(0, 2, 4), (1, 3)]
    assert tied_groups([(3, 1), (1, 0), (0, 3)], 4) == [(0, 1, 3)]
    assert tied_groups([(2, 2)], 3) == [(2,)]
    assert tied_groups([], 3) == []


# --- helper 54g: the statuses' paths, HiGHS's options read back, and hand-built shapes ---


@pytest.fixture
def highs_used(monkeypatch):
    """The HiGHS objects solve_mixed builds, kept so a test reads back what it was given."""
    made, quiet = [], milp.quiet_highs

    def keep():
        made.append(quiet())
        return made[-1]

    monkeypatch.setattr(milp, "quiet_highs", keep)
    return made


def timed(mp: MixedProblem, **kw) -> tuple[MixedSolution, float]:
    start = time.perf_counter()
    sol = solve_mixed(mp, **kw)
    return sol, time.perf_counter() - start


def check_figures(sol: MixedSolution, wall: float, h) -> None:
    """Seconds a float within the call's own wall time, nodes HiGHS's count."""
    assert type(sol.solve_time_s) is float and 0.0 < sol.solve_time_s <= wall
    assert type(sol.nodes) is int and sol.nodes == int(h.getInfo().mip_node_count)


def test_highs_holds_every_option_solve_mixed_sets_and_the_offset(highs_used):
    """A misspelt option name is refused by HiGHS with a warning and the solve goes on at
    the default: each option is read back from the HiGHS object, and HiGHS's own objective
    (the constant step included) is the returned one in time units."""
    mp = rich_problem(**CASES["two degrees"])
    best = optimum("two degrees")
    sol, wall = timed(mp, cutoff=best * 1.001, node_limit=77)
    check(mp, best, cutoff=best * 1.001)
    (h,) = highs_used[:1]
    unit = time_unit(mp, None)
    assert mp.const_step > 0
    expected = {
        "mip_max_nodes": 77,
        "mip_rel_gap": MIP_REL_GAP,
        "mip_abs_gap": 1e-12,
        "mip_feasibility_tolerance": FEASIBILITY_TOLERANCE,
        "primal_feasibility_tolerance": FEASIBILITY_TOLERANCE,
    }
    for name, value in expected.items():
        assert h.getOptionValue(name)[1] == value, name
    assert h.getOptionValue("objective_bound")[1] == pytest.approx(best * 1.001 / unit, rel=1e-12)
    assert h.getInfo().objective_function_value == pytest.approx(sol.objective / unit, rel=1e-9)
    check_figures(sol, wall, h)


def test_no_node_is_no_solution(highs_used):
    """node_limit 0: HiGHS stops before any placement (its solution limit), which is neither
    infeasible nor a cutoff."""
    mp = rich_problem(**CASES["two kinds"])
    sol, wall = timed(mp, node_limit=0)
    assert (sol.status, sol.objective, sol.variants, sol.counts) == (
        "no_solution",
        math.inf,
        [],
        [],
    )
    assert highs_used[-1].getModelStatus() == highspy.HighsModelStatus.kSolutionLimit
    check_figures(sol, wall, highs_used[-1])
    assert solve_mixed(mp, node_limit=1).status == "optimal"


def test_a_cutoff_pruned_by_highs_or_by_the_value_is_a_cutoff(highs_used):
    """Below the optimum, "two kinds" is pruned by HiGHS (its objective bound: infeasible)
    and "three stages" solved to a placement at or above the cutoff: both a cutoff, with
    nothing placed; an infeasible pool without a cutoff is infeasible, with one a cutoff."""
    for name, model_status in (
        ("two kinds", highspy.HighsModelStatus.kInfeasible),
        ("three stages", highspy.HighsModelStatus.kOptimal),
    ):
        mp = rich_problem(**CASES[name])
        sol, wall = timed(mp, cutoff=optimum(name) * 0.999)
        assert (sol.status, sol.objective, sol.variants, sol.counts) == ("cutoff", math.inf, [], [])
        assert highs_used[-1].getModelStatus() == model_status
        check_figures(sol, wall, highs_used[-1])
    assert sol.nodes == 1
    empty = replace(rich_problem(**CASES["two kinds"]), units=[0, 0])
    assert solve_mixed(empty).status == "infeasible"
    assert solve_mixed(empty, cutoff=100.0).status == "cutoff"


def test_a_step_of_milliseconds_needs_no_cut_of_a_second():
    """Every time of "two degrees" a thousandth: the optimum is a thousandth (the step time
    is linear in them), with no split given (its stand-in cuts must be zeros) and with a
    split whose P* is not computed."""
    name = "two degrees"
    mp = rich_problem(**CASES[name])
    ms = lambda xs: [np.asarray(x) * 1e-3 for x in xs]  # noqa: E731
    per = [
        replace(
            sp, time=ms(sp.time), optim=ms(sp.optim), offl=ms(sp.offl),
            dp_first=ms(sp.dp_first), dp_second=ms(sp.dp_second),
            dp_once=tuple(x * 1e-3 for x in sp.dp_once),
        )
        for sp in mp.per_variant
    ]  # fmt: skip
    fast = replace(
        mp, per_variant=per, base_time=mp.base_time * 1e-3, hop=mp.hop * 1e-3,
        const_step=mp.const_step * 1e-3,
    )  # fmt: skip
    assert time_unit(fast, None) < 1.0
    check(fast, optimum(name) * 1e-3)
    # T* and S* given, P* not computed (inf): no P* cut, not one of a second
    split = mixed_split_bound(fast)
    check(fast, optimum(name) * 1e-3, split=SplitBound(split.max_stage, split.sum_stages))


def test_a_unit_below_one_second_is_kept():
    mp = rich_problem(**CASES["two degrees"])
    assert time_unit(mp, SplitBound(1.0, 0.5, 3.0)) == 0.5
    small = [replace(sp, time=[t * 1e-3 for t in sp.time]) for sp in mp.per_variant]
    fastest = time_unit(mp, None) * 1e-3
    assert time_unit(replace(mp, per_variant=small), None) == pytest.approx(fastest, rel=1e-12)


def test_one_variant():
    """One kind at one degree: V = 1 (every per-variant read is of variant 0)."""
    mp = rich_problem(seed=13, pp=2, units=(2,), cap=(8.0, 10.0))
    assert len(mp.variants) == 1
    check(mp, brute_force(mp))


def test_two_tied_groups_each_take_their_own_code():
    """Segments 0 and 2 tied, and 1 tied to itself: two groups, each its own P column."""
    mp = rich_problem(**CASES["tied"])
    two = replace(mp, tied=[(0, 2), (1, 1)])
    assert tied_groups(two.tied, 3) == [(0, 2), (1,)]
    check(two, brute_force(two))


def test_a_tie_tells_tp_32_from_tp_16_at_twice_the_dp():
    """On nodes of more than 16 GPUs the tie's code of (TP, DP) must still tell the pairs
    apart: (32, 1) and (16, 2) once shared the code 48, and the MILP tied stages of the two
    (2.109 s a step, where the brute force's optimum with the tie kept is 2.355 s)."""
    mp = rich_problem(
        seed=19, pp=2, units=(64,), degrees=(16, 32), mults=(1, 2), tied=((0, 2),), cap=(6.0, 9.0)
    )
    assert [(t, r) for _, t, r in mp.variants] == [(16, 1), (32, 1), (16, 2), (32, 2)]
    expected = brute_force(mp)
    assert brute_force(replace(mp, tied=[])) < expected * (1 - 1e-2)  # the tie binds
    sol = check(mp, expected)
    assert len({(mp.tp_of(v), mp.dp_of(v)) for v in sol.variants}) == 1


def plain(seg_len, pp, time_s, act=None, capacity=100.0, m=2) -> MixedProblem:
    """One kind, one variant: per segment one option of ``time_s[s]`` s a block (or two,
    the second twice as slow, holding no activation, where ``act`` gives the first's GiB);
    no other term. 1F1B: stage j holds min(m, pp - j) micro-batches' activations."""
    S = len(seg_len)
    one = lambda x: [np.array([x]) for _ in range(S)]  # noqa: E731
    if act is None:
        times, acts = [np.array([t]) for t in time_s], one(0.0)
    else:
        times = [np.array([t, 2 * t]) for t in time_s]
        acts = [np.array([a * GIB, 0.0]) for a in act]
    zeros = [np.zeros_like(t) for t in times]
    sp = StageProblem(
        pp=pp, v=1, m=m, seg_len=list(seg_len), time=times, state=zeros, host=zeros,
        act=acts, ws=zeros, gather=zeros, optim=zeros, offl=zeros, has_params=[True] * S,
        const_time=[0.0] * pp, inflight=[min(m, pp - j) for j in range(pp)],
        const_mem=[0.0] * pp, capacity=capacity * GIB, host_capacity=GIB,
        dp_first=zeros, dp_second=zeros,
    )  # fmt: skip
    return MixedProblem(["k"], [(0, 1, 1)], [sp], np.zeros((1, pp)), np.zeros((pp - 1, 1, 1)), [pp])


def test_two_segments_in_reverse_would_be_faster():
    """Two segments on two stages: segment 0's fast option fits only on the last stage (one
    micro-batch in flight), so the reversed placement (1 | 0) is faster than any in model
    order; the order rows must refuse it, with two segments as with more."""
    mp = plain([1, 1], 2, [1.0, 1.0], act=[3.0, 0.0], capacity=4.0)
    best = brute_force(mp)
    reversed_ = step_time(mp, [0, 0], [[[0, 0], [1, 0]], [[1, 0], [0, 0]]])
    assert reversed_ < best * (1 - 1e-3)
    check(mp, best)


def test_a_long_last_segment_splits_across_stages():
    """Segments of 1, 1 and 6 equal blocks on two stages: the optimum puts two blocks of
    the last segment on stage 0 (4 | 4), more than the middle segment's length."""
    mp = plain([1, 1, 6], 2, [1.0, 1.0, 1.0])
    sol = check(mp, brute_force(mp))
    assert sol.counts == [[[1], [1], [2]], [[0], [0], [4]]]


def test_four_segments_on_four_stages():
    """The order rows' blocks at S = 4 and J = 4, of every shape (J, S - 1) and (J - 1, S - 1)."""
    mp = plain([1, 1, 2, 1], 4, [1.0, 2.0, 1.5, 3.0])
    check(mp, brute_force(mp))
