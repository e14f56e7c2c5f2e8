"""split_bound's dynamic program (planner/search/milp/split_bound.py) against brute force,
written for its generated mutants (docs/mutation.md).

The reference follows the module docstring's definitions, not its algorithm: each stage's
least cost over a range [a, b) is the LP solved by scipy's ``linprog`` (options fractional,
each present segment's blocks placed, the stage's memory row with W_j(a, b) as the docstring
writes it), and T*, S* and P* are the least max, sum and weighted max over every contiguous
split, enumerated. The problems are small (a few blocks of three classes, two or three options
each, every number distinct) and their memory binds on some ranges, so the LP's fractional
mix, the infeasible ranges and each term of the room show in the numbers.
"""

from __future__ import annotations

import itertools
import math
import pickle
import warnings

import numpy as np
import pytest
from scipy.optimize import linprog

from planner.search.milp.data import GIB, StageProblem
from planner.search.milp.split_bound import (
    SplitBound,
    _breakpoints,
    _envelope,
    _least,
    _min_sum_ranks,
    _project_simplex,
    _rank_max,
    range_counts,
    split_bound,
    stage_costs,
)


def _problem(pp: int = 3, v: int = 1, m: int = 4, capacity: float = 9.0, **kw) -> StageProblem:
    """Three segments (1 block, 4 blocks, 1 block); options in GiB and seconds, each distinct.
    Segment 1's second option is fast and heavy, its third slow and light, so a stage holding
    several of its blocks under a tight room mixes them fractionally."""
    g = GIB
    arr = lambda *x: np.array(x, float)  # noqa: E731
    J = pp * v
    fields = dict(
        pp=pp,
        v=v,
        m=m,
        seg_len=[1, 4, 1],
        time=[arr(1.0, 1.3), arr(2.0, 1.1, 3.1), arr(1.7, 0.9)],
        state=[arr(0.5, 0.2) * g, arr(0.6, 1.5, 0.15) * g, arr(0.7, 1.9) * g],
        host=[arr(0, 0)] * 3,
        act=[arr(0.05, 0.03) * g, arr(0.1, 0.3, 0.02) * g, arr(0.04, 0.08) * g],
        ws=[arr(0.11, 0.07) * g, arr(0.21, 0.35, 0.13) * g, arr(0.6, 0.05) * g],
        gather=[arr(0.01, 0.02) * g, arr(0.17, 0.03, 0.09) * g, arr(0.06, 0.12) * g],
        optim=[arr(0.31, 0.37), arr(0.41, 0.23, 0.29), arr(0.53, 0.19)],
        offl=[arr(0.07, 0.0), arr(0.0, 0.47, 0.11), arr(0.13, 0.61)],
        has_params=[True] * 3,
        const_time=[0.013 * (j + 1) for j in range(J)],
        inflight=[float(pp - j % pp) + 0.5 * (j // pp) for j in range(J)],
        const_mem=[(0.3 + 0.1 * r) * g for r in range(pp)],
        capacity=capacity * g,
        host_capacity=1e30,
        dp_first=[arr(0, 0)] * 3,
        dp_second=[arr(0, 0)] * 3,
        loss_mem=[0.0] * (pp - 1) + [0.4 * g],
    )
    fields.update(kw)
    return StageProblem(**fields)


def _counts(sp: StageProblem, a: int, b: int) -> list[int]:
    starts = np.concatenate([[0], np.cumsum(sp.seg_len)[:-1]])
    return [max(0, min(b, s0 + n) - max(a, s0)) for s0, n in zip(starts, sp.seg_len)]


def _allowed(sp: StageProblem, s: int) -> list[int]:
    k = range(len(sp.time[s]))
    return list(k) if sp.allowed is None else [o for o in k if sp.allowed[s][o]]


# the reference's LP optima by their inputs: mutmut runs this file once clean, then forks a
# child per mutant, which inherits them (split_bound's own results are never kept)
_LP_SOLVED: dict[tuple, float] = {}


def _lp(sp: StageProblem, j: int, a: int, b: int, alpha: float, beta: float) -> float:
    """The docstring's LP for stage j over [a, b): min sum n (alpha t + beta (optim + offl))
    over fractional n with each present segment's count placed and sum n w <= W_j(a, b), plus
    alpha c_j; inf when it has no solution."""
    key = (pickle.dumps(sp), j, a, b, alpha, beta)
    if key not in _LP_SOLVED:
        _LP_SOLVED[key] = _solve_lp(sp, j, a, b, alpha, beta)
    return _LP_SOLVED[key]


def _solve_lp(sp: StageProblem, j: int, a: int, b: int, alpha: float, beta: float) -> float:
    r = j % sp.pp
    c = _counts(sp, a, b)
    present = [s for s in range(len(c)) if c[s] > 0]
    if any(not _allowed(sp, s) for s in present):
        return math.inf
    ws = max(min(sp.ws[s][o] for o in _allowed(sp, s)) for s in present)
    gather = max(min(sp.gather[s][o] for o in _allowed(sp, s)) for s in present)
    room = sp.capacity - sp.const_mem[r] - max(ws, sp.loss_mem[r]) - gather
    var = [(s, o) for s in present for o in _allowed(sp, s)]
    cost = [alpha * sp.time[s][o] + beta * (sp.optim[s][o] + sp.offl[s][o]) for s, o in var]
    weight = [(sp.state[s][o] + sp.inflight[j] * sp.act[s][o]) / GIB for s, o in var]
    eq = [[1.0 if vs == s else 0.0 for vs, _ in var] for s in present]
    res = linprog(
        cost,
        A_ub=[weight],
        b_ub=[room / GIB],
        A_eq=eq,
        b_eq=[c[s] for s in present],
        bounds=(0, None),
        method="highs",
    )
    if res.status == 2:
        return math.inf
    assert res.status == 0, res.message
    return res.fun + alpha * sp.const_time[j]


def _splits(n: int, stages: int):
    for cuts in itertools.combinations(range(1, n), stages - 1):
        edges = (0, *cuts, n)
        yield list(zip(edges[:-1], edges[1:]))


def _cells(stages: int, n: int):
    """Every (stage, a, b) with a nonempty range [a, b) of n blocks."""
    for j in range(stages):
        for a in range(n):
            for b in range(a + 1, n + 1):
                yield j, a, b


def _brute(sp: StageProblem) -> tuple[float, float, float]:
    """Least max_j tau_j, sum_j tau_j and the weighted max (v = 1: max_j psi_j; v > 1:
    max_r sum_{j = r mod p} psi_j) over every contiguous split into J nonempty stages."""
    n, J = sum(sp.seg_len), sp.pp * sp.v
    alpha = sp.m - 1.0 if sp.v == 1 else float(sp.m)
    tau = {(j, a, b): _lp(sp, j, a, b, 1.0, 0.0) for j, a, b in _cells(J, n)}
    psi = {(j, a, b): _lp(sp, j, a, b, alpha, 1.0) for j, a, b in _cells(J, n)}
    most = total = weighted = math.inf
    for split in _splits(n, J):
        times = [tau[j, a, b] for j, (a, b) in enumerate(split)]
        most, total = min(most, max(times)), min(total, sum(times))
        ranks = [0.0] * sp.pp
        for j, (a, b) in enumerate(split):
            ranks[j % sp.pp] += psi[j, a, b]
        lead = max(psi[j, a, b] for j, (a, b) in enumerate(split)) if sp.v == 1 else max(ranks)
        weighted = min(weighted, lead)
    return most, total, weighted


@pytest.mark.parametrize("capacity", [9.0, 3.2, 2.6])
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (3.0, 1.0)])
def test_each_ranges_stage_cost_is_its_lp(capacity, alpha, beta):
    """Every stage, every range [a, b), against the LP (memory free at 9 GiB; binding at
    3.2, where heavy ranges mix options; at 2.6 some ranges fit on no stage)."""
    allowed = [np.array([1, 1]), np.array([1, 1, 1]), np.array([0, 1])]  # not the head's o0
    sp = _problem(capacity=capacity, allowed=allowed)
    n = sum(sp.seg_len)
    counts = range_counts(sp.seg_len)
    infinite = finite = mixed = 0
    for j in range(sp.pp * sp.v):
        got = stage_costs(sp, j, counts, alpha, beta)
        assert got.shape == (n + 1, n + 1)
        for a in range(n):
            for b in range(a + 1, n + 1):
                want = _lp(sp, j, a, b, alpha, beta)
                if math.isinf(want):
                    assert got[a, b] == math.inf, (j, a, b)
                    infinite += 1
                else:
                    assert got[a, b] == pytest.approx(want, rel=1e-9, abs=1e-12), (j, a, b)
                    finite += 1
                    free = _lp(_problem(capacity=1e6, allowed=sp.allowed), j, a, b, alpha, beta)
                    mixed += want > free * (1 + 1e-6)
    assert finite
    if capacity < 3:
        assert infinite and mixed
    if capacity == 3.2:
        assert mixed  # the memory row binds somewhere


def test_the_stage_cost_reads_the_working_set_gather_and_loss_of_present_segments_only():
    """Stage 2 (the last rank, loss 0.4 GiB) over [5, 6) holds only the head: its room
    leaves out the layers' larger working set and gathered buffer. Worked by hand with one
    option per segment: room = 9 - 0.5 - max(0.6, 0.4) - 0.06 GiB; 1 block of state 0.7 +
    1 x 0.04 = 0.74 GiB must fit; cost 1.7 + c_2 = 1.7 + 0.039."""
    one = lambda x, s: [np.array([x[0]]) * s, np.array([x[1]]) * s, np.array([x[2]]) * s]  # noqa: E731
    sp = _problem(
        time=one((1.0, 2.0, 1.7), 1.0),
        state=one((0.5, 0.6, 0.7), GIB),
        act=one((0.05, 0.1, 0.04), GIB),
        ws=one((0.11, 2.5, 0.6), GIB),
        gather=one((0.01, 3.0, 0.06), GIB),
        optim=one((0.3, 0.4, 0.5), 1.0),
        offl=one((0.0, 0.0, 0.0), 1.0),
        host=one((0, 0, 0), 1.0),
        dp_first=one((0, 0, 0), 1.0),
        dp_second=one((0, 0, 0), 1.0),
        capacity=1.3,
    )
    cost = stage_costs(sp, 2, range_counts(sp.seg_len), 1.0, 0.0)
    # room 1.3 - 0.5 - 0.6 - 0.06 = 0.14 GiB < 0.74: the head alone does not fit on 1.3 GiB
    assert cost[5, 6] == math.inf
    sp.capacity = 2.0 * GIB  # room 0.84 GiB
    cost = stage_costs(sp, 2, range_counts(sp.seg_len), 1.0, 0.0)
    assert cost[5, 6] == pytest.approx(1.7 + 0.039, rel=1e-12)
    # the loss (0.9 GiB) larger than the head's working set takes its place
    sp.loss_mem = [0.0, 0.0, 0.9 * GIB]
    cost = stage_costs(sp, 2, range_counts(sp.seg_len), 1.0, 0.0)
    assert cost[5, 6] == math.inf
    sp.capacity = 2.3 * GIB  # room 2.3 - 0.5 - 0.9 - 0.06 = 0.84 GiB
    cost = stage_costs(sp, 2, range_counts(sp.seg_len), 1.0, 0.0)
    assert cost[5, 6] == pytest.approx(1.739, rel=1e-12)
    # on stage 0 (rank 0: no loss, 0.3 GiB fixed; 3 micro-batches in flight) the head holds
    # 0.7 + 3 x 0.04 = 0.82 GiB: it fits in 1.8 GiB (room 0.84), not in 1.75 (room 0.79)
    sp.capacity = 1.8 * GIB
    assert stage_costs(sp, 0, range_counts(sp.seg_len), 1.0, 0.0)[5, 6] == pytest.approx(
        1.7 + 0.013, rel=1e-12
    )
    sp.capacity = 1.75 * GIB
    assert stage_costs(sp, 0, range_counts(sp.seg_len), 1.0, 0.0)[5, 6] == math.inf


@pytest.mark.parametrize(
    "pp,v,m,capacity",
    [
        (3, 1, 4, 9.0),
        (3, 1, 4, 3.2),
        (2, 1, 5, 3.0),
        (3, 1, 7, 2.9),
        (2, 2, 3, 9.0),
        (2, 2, 3, 4.0),
    ],
)
def test_the_split_bounds_are_brute_forces_least_over_every_split(pp, v, m, capacity):
    """v = 1: T*, S* and P* are the least over every contiguous split, exactly (the dynamic
    program is exact). v = 2: T* and S* exactly; P* (subgradient ascent over rank weights)
    lies between the uniform weights' bound and the least busiest rank."""
    sp = _problem(pp=pp, v=v, m=m, capacity=capacity)
    got = split_bound(sp)
    most, total, weighted = _brute(sp)
    assert math.isfinite(most)
    assert got.max_stage == pytest.approx(most, rel=1e-9)
    assert got.sum_stages == pytest.approx(total, rel=1e-9)
    if v == 1:
        assert got.weighted_max == pytest.approx(weighted, rel=1e-9)
    else:
        assert got.weighted_max <= weighted * (1 + 1e-9)
        n, J = sum(sp.seg_len), pp * v
        psi = {(j, a, b): _lp(sp, j, a, b, float(m), 1.0) for j, a, b in _cells(J, n)}
        uniform = min(
            sum(psi[j, a, b] for j, (a, b) in enumerate(split)) / pp for split in _splits(n, J)
        )
        assert got.weighted_max >= uniform * (1 - 1e-9)


def test_an_interleaved_bound_is_exact_where_the_uniform_weights_balance_the_ranks():
    """Six identical blocks, one option each, on 2 ranks x 2 chunks, memory free, m = 3:
    psi of c blocks is c (m t + optim) = 3.25 c: every split's weighted sum under uniform
    weights is half of 6 blocks' psi, which is what the busiest rank of a 3 / 3 split pays,
    so the bound is exact."""
    t = 1.0
    arr = lambda x: [np.array([x])]  # noqa: E731
    sp = StageProblem(
        pp=2, v=2, m=3, seg_len=[6], time=arr(t), state=arr(0.0), host=arr(0.0), act=arr(0.0),
        ws=arr(0.0), gather=arr(0.0), optim=arr(0.25), offl=arr(0.0), has_params=[True],
        const_time=[0.0] * 4, inflight=[1.0] * 4, const_mem=[0.0, 0.0], capacity=GIB,
        host_capacity=GIB, dp_first=arr(0.0), dp_second=arr(0.0),
    )  # fmt: skip
    got = split_bound(sp)
    # each rank holds 3 blocks: m t 3 + 0.25 x 3
    assert got.weighted_max == pytest.approx(3 * (3 * t + 0.25), rel=1e-12)
    assert got.weighted_max == pytest.approx(_brute(sp)[2], rel=1e-9)
    assert got.max_stage == pytest.approx(2 * t, rel=1e-12)  # 6 blocks on 4 stages
    assert got.sum_stages == pytest.approx(6 * t, rel=1e-12)


def test_no_split_fits_and_too_few_blocks():
    # stage 0 starts at block 0: 0.5 - 0.3 fixed - 0.07 working set - 0.01 gathered leaves
    # 0.12 GiB, below the first block's least 0.2 + 3 x 0.03
    sp = _problem(capacity=0.5)
    got = split_bound(sp)
    assert got.max_stage == math.inf and got.sum_stages == math.inf
    assert got.weighted_max == math.inf and not got.feasible
    few = _problem(pp=3, seg_len=[1, 0, 1])  # 2 blocks on 3 stages
    assert split_bound(few) == SplitBound(math.inf, math.inf, math.inf)
    one = _problem(pp=1, const_time=[0.5], inflight=[1.0], const_mem=[0.0], loss_mem=[0.0])
    assert split_bound(one) == SplitBound(0.0, 0.0, 0.0)
    exact = _problem(pp=3, seg_len=[1, 1, 1])  # as many blocks as stages: one each
    got = split_bound(exact)
    taus = [_lp(exact, j, j, j + 1, 1.0, 0.0) for j in range(3)]
    assert got.max_stage == pytest.approx(max(taus), rel=1e-9)
    assert got.sum_stages == pytest.approx(sum(taus), rel=1e-9)
    assert got.feasible


def test_the_step_bound_adds_the_cuts_as_each_schedule_prices_them():
    one = _problem(pp=3, v=1, const_step=0.125)
    b = SplitBound(2.0, 5.0, 7.0)
    assert b.step_bound(one) == 5.0 + 7.0 + 0.125
    two = _problem(pp=3, v=2, const_step=0.125)
    assert b.step_bound(two) == 7.0 + 2 * 2.0 + 0.125
    assert SplitBound(2.0, 5.0).step_bound(one) == 0.0
    assert SplitBound(2.0, 5.0).weighted_max == math.inf
    assert SplitBound(2.0, 5.0).feasible and not SplitBound(math.inf, 5.0).feasible


def test_range_counts_are_each_segments_blocks_in_the_range():
    vectors, where = range_counts([2, 3, 1])
    for a in range(7):
        for b in range(7):
            want = [max(0, min(b, s0 + n) - max(a, s0)) for s0, n in ((0, 2), (2, 3), (5, 1))]
            assert vectors[:, where[a, b]].tolist() == want, (a, b)
    # distinct vectors only: each appears once
    assert len({tuple(c) for c in vectors.T}) == vectors.shape[1]


@pytest.mark.parametrize("scale", [1.0, 1e-4, 1e3])
def test_breakpoints_are_where_two_options_tie_at_the_envelope(scale):
    """Brute force: every l > 0 where two options' lines t + l w meet at the lower envelope,
    at times of seconds, of a tenth of a millisecond (lines below 1e-3, where an absolute
    tolerance would outweigh the relative one) and of a thousand seconds (where a tie computed
    two ways differs in its last bits)."""
    rng = np.random.default_rng(3)
    for _ in range(30):
        k = int(rng.integers(1, 6))
        pairs = rng.permutation([(a, b) for a in range(1, 9) for b in range(1, 9)])[:k]
        t, w = pairs[:, 0] * scale, pairs[:, 1].astype(float)  # no two options alike
        want = set()
        for i, j in itertools.permutations(range(k), 2):
            if w[i] > w[j] and t[j] > t[i]:
                lam = (t[j] - t[i]) / (w[i] - w[j])
                low = min(t + lam * w)
                if t[i] + lam * w[i] <= low * (1 + 1e-9):
                    want.add(round(lam / scale, 9))
        got = _breakpoints(t, w)
        assert sorted(round(x / scale, 9) for x in got) == sorted(want), (t, w)
        assert len(got) == len(want)
    # two options tying at l = 1, a third below the meeting point there: none on the envelope
    assert _breakpoints(np.array([1.0, 3.0, 1.5]), np.array([3.0, 1.0, 1.0])).tolist() == [0.25]
    assert len(_breakpoints(np.array([1.0]), np.array([1.0]))) == 0
    assert _breakpoints(np.array([1.0, 2.0]), np.array([2.0, 1.0])).tolist() == [1.0]
    # one option heavier and slower: never the minimum, no breakpoint
    assert len(_breakpoints(np.array([1.0, 2.0]), np.array([1.0, 2.0]))) == 0


def test_envelope_and_least():
    lams = np.array([0.0, 0.5, 2.0])
    got = _envelope(np.array([1.0, 2.0]), np.array([2.0, 0.5]), lams)
    assert got.tolist() == [1.0, 2.0, 3.0]  # min(1, 2), min(1 + 1, 2 + 0.25), min(5, 3)
    assert _envelope(np.zeros(0), np.zeros(0), lams).tolist() == [math.inf] * 3
    assert _least(np.array([3.0, 2.0, 5.0])) == 2.0 and _least(np.zeros(0)) == math.inf


def test_projection_onto_the_simplex_is_the_nearest_point():
    """Against the closed form's defining property: the projection w of v is on the simplex
    and v - w is constant on w's support and no larger off it (KKT)."""
    rng = np.random.default_rng(5)
    for _ in range(50):
        v = rng.normal(size=int(rng.integers(1, 6))) * 2
        w = _project_simplex(v)
        assert w.sum() == pytest.approx(1.0, abs=1e-12) and (w >= 0).all()
        gap = v - w
        on = w > 0
        assert np.ptp(gap[on]) < 1e-12
        assert (gap[~on] <= gap[on].max() + 1e-12).all()
    assert _project_simplex(np.array([0.2, 0.3, 0.5])).tolist() == pytest.approx([0.2, 0.3, 0.5])
    assert _project_simplex(np.array([3.0, 0.0])).tolist() == [1.0, 0.0]


def test_min_sum_over_ranks_is_the_least_split_and_its_ranks_sums():
    """Brute force over every split of 5 blocks into 4 stages on 2 ranks: the least weighted
    sum, and the unweighted costs of that split summed per rank."""
    rng = np.random.default_rng(11)
    n, J, p = 5, 4, 2
    costs = [rng.random((n + 1, n + 1)) for _ in range(J)]
    for c in costs:
        c[np.tril(np.ones((n + 1, n + 1), bool))] = math.inf
    weighted = [c * (0.3 if j % 2 else 0.7) for j, c in enumerate(costs)]
    best, arg = math.inf, None
    for split in _splits(n, J):
        total = sum(weighted[j][a, b] for j, (a, b) in enumerate(split))
        if total < best:
            best, arg = total, split
    value, per_rank = _min_sum_ranks(weighted, costs, n, p)
    assert value == pytest.approx(best, rel=1e-12)
    want = [sum(costs[j][a, b] for j, (a, b) in enumerate(arg) if j % p == r) for r in range(p)]
    assert per_rank.tolist() == pytest.approx(want, rel=1e-12)
    # nothing fits: inf and zero sums
    blocked = [np.full((n + 1, n + 1), math.inf) for _ in range(J)]
    value, per_rank = _min_sum_ranks(blocked, blocked, n, p)
    assert value == math.inf and per_rank.tolist() == [0.0, 0.0]


def test_rank_max_is_infinite_when_nothing_fits_and_never_above_the_least_busiest_rank():
    n, p = 4, 2
    blocked = [np.full((n + 1, n + 1), math.inf) for _ in range(4)]
    assert _rank_max(blocked, n, p) == math.inf
    rng = np.random.default_rng(2)
    for _ in range(5):
        costs = [rng.random((n + 1, n + 1)) for _ in range(4)]
        for c in costs:
            c[np.tril(np.ones((n + 1, n + 1), bool))] = math.inf
        least = min(
            max(sum(costs[j][a, b] for j, (a, b) in enumerate(s) if j % p == r) for r in range(p))
            for s in _splits(n, 4)
        )
        uniform = min(sum(costs[j][a, b] for j, (a, b) in enumerate(s)) / p for s in _splits(n, 4))
        got = _rank_max(costs, n, p)
        assert uniform * (1 - 1e-12) <= got <= least * (1 + 1e-12)


def test_the_split_bound_warns_nothing():
    """numpy's divisions by zero and infinities times zero inside the bound are expected
    (equal weights, a rank weighted 0, a segment without an option absent from a range): no
    RuntimeWarning reaches the user's console."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # equal weights (l = dt / 0) and each option against itself (0 / 0)
        assert _breakpoints(np.array([1.0, 2.0, 1.5]), np.array([1.0, 1.0, 2.0])).tolist() == []
        # the ascent puts all weight on rank 1: rank 0's infinite ranges times 0
        costs = [np.full((3, 3), math.inf), np.full((3, 3), math.inf)]
        costs[0][0, 1], costs[1][1, 2] = 1.0, 3.0
        assert _rank_max(costs, 2, 2) == 3.0
        # the head has no allowed option: ranges without it are priced, with it infinite
        sp = _problem(allowed=[np.array([1, 1]), np.array([1, 1, 1]), np.array([0, 0])])
        cost = stage_costs(sp, 0, range_counts(sp.seg_len), 1.0, 0.0)
        assert math.isfinite(cost[0, 2]) and cost[0, 6] == math.inf


def _two_ranks(first: float, second: float) -> list[np.ndarray]:
    """Two blocks on two stages of one chunk each: the only split, costing ``first`` on rank 0
    and ``second`` on rank 1."""
    costs = [np.full((3, 3), math.inf), np.full((3, 3), math.inf)]
    costs[0][0, 1], costs[1][1, 2] = first, second
    return costs


@pytest.mark.parametrize(
    "first,second,want",
    [
        (1.0, 1.0, 1.0),  # balanced at once: the uniform weights' bound, the busiest rank
        (1.0, 1.0 + 5e-9, 1.0 + 5e-9),  # 5e-9 apart: the ascent reaches the busiest rank
        (1.0, 1.0 + 3e-12, 1.0 + 3e-12),  # beyond 1e-12 of balance: the same
        (100.0, 100.0 + 1e-10, 100.0 + 5e-11),  # within 1e-12 of the value: taken as balanced
    ],
)
def test_the_ascent_stops_where_the_ranks_balance_to_1e_12_of_the_value(first, second, want):
    assert _rank_max(_two_ranks(first, second), 2, 2) == pytest.approx(want, rel=1e-15)


def test_a_negative_infinite_cost_is_a_range_that_cannot_run():
    """As the stages weighted one by one (the reference of test_split_bound): -inf is inf."""
    costs = _two_ranks(1.0, 2.0)
    costs[0][0, 1] = -math.inf
    assert _rank_max(costs, 2, 2) == math.inf


@pytest.mark.parametrize(
    "state,fits",
    [
        (1.0, True),  # exactly the room
        (1.0 + 1.5e-12, True),  # within the tolerance (1e-12 of the room, plus 1e-12 GiB)
        ((1 + 1e-12) + 1e-12, True),  # at its edge
        (1.0 + 3e-12, False),
    ],
)
def test_a_range_fits_its_room_to_a_tolerance_of_1e_12(state, fits):
    """One block, one option: state ``state`` GiB, no activation, working set or gathered
    buffer; 1 GiB of device, nothing fixed: the room is exactly 1 GiB."""
    one = [np.zeros(1)]
    sp = StageProblem(
        pp=1, v=1, m=1, seg_len=[1], time=[np.array([1.0])], state=[np.array([state * GIB])],
        host=one, act=one, ws=one, gather=one, optim=one, offl=one, has_params=[True],
        const_time=[0.0], inflight=[1.0], const_mem=[0.0], capacity=GIB, host_capacity=GIB,
        dp_first=one, dp_second=one,
    )  # fmt: skip
    cost = stage_costs(sp, 0, range_counts(sp.seg_len), 1.0, 0.0)[0, 1]
    assert cost == (1.0 if fits else math.inf)
