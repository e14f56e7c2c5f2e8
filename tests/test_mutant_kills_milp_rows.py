"""The stage MILP's rows (planner/search/milp/rows.py) against its formulation evaluated by hand,
written for its generated mutants (docs/mutation.md).

The reference below reads milp.solve's docstring, not rows.py: for a placement n (block counts
per stage and option) it checks the placement rows (every block placed, every stage holding
one, each stage a contiguous range in model order, only kept options), then prices it: T_j,
T_max, R_max, E = max_j (max(0, A_j) + max(0, B_j)), each rank's memory with its working set
and gathered buffer, its optimizer step and host memory, Opt, Off, the objective of either
schedule form, and the split cuts. Each test pins n in the model (its bounds) and solves the
rest with HiGHS, so every auxiliary variable takes its least value under the rows: the optimum
is the reference's price, or infeasible exactly where the reference says so. Every number is
distinct, and each row binds on some of the placements enumerated.
"""

from __future__ import annotations

import itertools
import math

import highspy
import numpy as np
import pytest

from planner.highs import pass_model, quiet_highs
from planner.search.milp.data import GIB, StageProblem
from planner.search.milp.rows import Layout, Rows, cumulative, stage_model
from planner.search.milp.split_bound import SplitBound

NO_CUTS = SplitBound(0.0, 0.0, math.inf)


@pytest.fixture(autouse=True)
def _own_highs_scheduler():
    """mutmut forks a child per mutant from the process that ran the clean tests; HiGHS's task
    scheduler's threads do not come with a fork (planner/search/overlap.py), and a MILP there
    would wait on them forever: each test starts HiGHS's scheduler afresh."""
    highspy.Highs.resetGlobalScheduler(False)


def _problem(pp=2, v=1, m=3, seg_len=(1, 2, 1), capacity=4.0, step=True, **kw) -> StageProblem:
    """Three segments of two options each (in GiB and seconds); the embedding holds no
    parameters; the DP terms' first part is negative for some options (hidden by overlap)."""
    g = GIB
    arr = lambda *x: np.array(x, float)  # noqa: E731
    J = pp * v
    S = len(seg_len)
    pick = lambda rows: rows[:S]  # noqa: E731
    fields = dict(
        pp=pp,
        v=v,
        m=m,
        seg_len=list(seg_len),
        time=pick([arr(1.0, 1.25), arr(2.0, 1.5), arr(1.75, 0.5)]),
        state=pick([arr(0.5, 0.25) * g, arr(0.625, 1.5) * g, arr(0.75, 1.875) * g]),
        host=pick([arr(0.0, 0.5) * g, arr(0.25, 0.0) * g, arr(0.125, 0.375) * g]),
        act=pick([arr(0.0625, 0.03125) * g, arr(0.125, 0.3125) * g, arr(0.046875, 0.09375) * g]),
        ws=pick([arr(0.1, 0.07) * g, arr(0.21, 0.35) * g, arr(0.6, 0.05) * g]),
        gather=pick([arr(0.01, 0.02) * g, arr(0.17, 0.03) * g, arr(0.06, 0.12) * g]),
        optim=pick([arr(0.3125, 0.375), arr(0.40625, 0.21875), arr(0.53125, 0.1875)]),
        offl=pick([arr(0.0625, 0.0), arr(0.0, 0.46875), arr(0.125, 0.59375)]),
        has_params=pick([False, True, True]),
        const_time=[0.0078125 * (j + 1) for j in range(J)],
        inflight=[float(pp - j % pp) + 0.5 * (j // pp) for j in range(J)],
        const_mem=[(0.25 + 0.125 * r) * g for r in range(pp)],
        capacity=capacity * g,
        host_capacity=0.7 * g,
        dp_first=pick([arr(-0.015625, 0.0234375), arr(-0.03125, 0.046875), arr(0.01171875, -0.2)]),
        dp_second=pick([arr(0.00390625, 0.0), arr(0.0546875, -0.01), arr(0.0, 0.02734375)]),
        dp_once=(0.0703125, -0.01953125),
        const_step=0.001953125,
        step=pick([arr(0.75, 0.375) * g, arr(1.25, 0.5) * g, arr(0.875, 1.125) * g])
        if step
        else None,
        loss_mem=[0.0] * (pp - 1) + [0.4 * g],
    )
    fields.update(kw)
    return StageProblem(**fields)


def _range_counts(seg_len, a: int, b: int) -> list[int]:
    starts = np.concatenate([[0], np.cumsum(seg_len)[:-1]])
    return [max(0, min(b, int(s0) + n) - max(a, int(s0))) for s0, n in zip(starts, seg_len)]


def reference(sp: StageProblem, n: np.ndarray, split: SplitBound, keep) -> float:
    """The step time milp.solve's docstring gives placement n (J x K counts), or inf where a
    row refuses it."""
    J, P = sp.pp * sp.v, sp.pp
    n_opts = [len(t) for t in sp.time]
    seg_of = np.repeat(np.arange(len(n_opts)), n_opts)
    col = lambda f: np.concatenate(f)  # noqa: E731
    per_seg = np.array([[n[j, seg_of == s].sum() for s in range(len(n_opts))] for j in range(J)])
    if (per_seg.sum(axis=0) != sp.seg_len).any() or (per_seg.sum(axis=1) < 1).any():
        return math.inf
    kept = np.zeros(len(seg_of), bool)
    for s, ids in enumerate(keep):
        kept[np.cumsum([0, *n_opts])[s] + np.asarray(ids, int)] = True
    if n[:, ~kept].any():
        return math.inf
    start = 0
    for j in range(J):  # each stage the next contiguous range of blocks
        total = int(per_seg[j].sum())
        if per_seg[j].tolist() != _range_counts(sp.seg_len, start, start + total):
            return math.inf
        start += total
    T = np.asarray(sp.const_time) + n @ col(sp.time)
    if T.sum() < split.sum_stages:
        return math.inf
    tmax = max(T.max(), split.max_stage)
    ranks = [range(r, J, P) for r in range(P)]
    rmax = max(T[list(js)].sum() for js in ranks)
    holds = (n[:, np.repeat(sp.has_params, n_opts)].sum(axis=1) > 0).astype(float)
    first = n @ col(sp.dp_first) + sp.dp_once[0] * holds
    second = n @ col(sp.dp_second) + sp.dp_once[1] * holds
    E = max(np.maximum(first, 0.0) + np.maximum(second, 0.0))
    opt = off = 0.0
    for r, js in enumerate(ranks):
        nr = n[list(js)]
        used = nr.sum(axis=0) > 0
        X = max([sp.loss_mem[r], *col(sp.ws)[used]])
        Z = max([0.0, *col(sp.gather)[used]])
        held = sum(n[j] @ (col(sp.state) + sp.inflight[j] * col(sp.act)) for j in js)
        if held + X + Z + sp.const_mem[r] > sp.capacity:
            return math.inf
        if sp.step is not None and nr.sum(axis=0) @ col(sp.step) + sp.const_mem[r] > sp.capacity:
            return math.inf
        if nr.sum(axis=0) @ col(sp.host) > sp.host_capacity:
            return math.inf
        opt = max(opt, nr.sum(axis=0) @ col(sp.optim))
        off = max(off, nr.sum(axis=0) @ col(sp.offl))
    if sp.v == 1:
        body, lead = T.sum() + (sp.m - 1) * tmax, (sp.m - 1) * tmax + opt + off
    else:
        body, lead = sp.m * rmax + (P - 1) * tmax, sp.m * rmax + opt + off
    cut = max(0.0, split.weighted_max - lead) if math.isfinite(split.weighted_max) else 0.0
    return body + E + opt + off + sp.const_step + cut


def _solve(model, pinned: np.ndarray | None = None) -> float:
    """The model's optimum with n pinned to ``pinned`` (or free): inf when infeasible."""
    lower, upper = model.col_lower.copy(), model.col_upper.copy()
    if pinned is not None:
        k = pinned.size
        lower[:k] = np.minimum(pinned.ravel(), upper[:k])
        upper[:k] = pinned.ravel()
        if (pinned.ravel() > model.col_upper[:k]).any():
            return math.inf  # beyond the column's bound: refused by the model
    h = quiet_highs()
    h.setOptionValue("mip_max_nodes", 2000)  # these solve in a few dozen: a mutant stops here
    pass_model(
        h, model.cost, model.pattern, model.values, model.row_lower, model.row_upper,
        lower, upper, model.integer, model.offset,
    )  # fmt: skip
    h.run()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible:
        return math.inf
    assert status == highspy.HighsModelStatus.kOptimal, status
    return float(h.getInfo().objective_function_value)


def _placements(sp: StageProblem):
    """Every n (J x K) placing each segment's L_s blocks in any stages and options."""
    J = sp.pp * sp.v
    n_opts = [len(t) for t in sp.time]
    cols = np.cumsum([0, *n_opts])
    per_seg = []
    for s, length in enumerate(sp.seg_len):
        cells = [(j, cols[s] + o) for j in range(J) for o in range(n_opts[s])]
        per_seg.append(list(itertools.combinations_with_replacement(cells, length)))
    for choice in itertools.product(*per_seg):
        n = np.zeros((J, cols[-1]))
        for cells in choice:
            for j, k in cells:
                n[j, k] += 1
        yield n


def _ranges(sp: StageProblem):
    """Every placement whose stages hold contiguous ranges in model order: each split of the
    blocks into J nonempty ranges, each stage's blocks of a segment over its options."""
    J, N = sp.pp * sp.v, sum(sp.seg_len)
    n_opts = [len(t) for t in sp.time]
    cols = np.cumsum([0, *n_opts])
    for cuts in itertools.combinations(range(1, N), J - 1):
        edges = (0, *cuts, N)
        cells = []  # per (stage, segment): the ways to spread its blocks over the options
        for j in range(J):
            for s, c in enumerate(_range_counts(sp.seg_len, edges[j], edges[j + 1])):
                ways = itertools.combinations_with_replacement(range(n_opts[s]), c)
                cells.append([(j, s, w) for w in ways])
        for choice in itertools.product(*cells):
            n = np.zeros((J, cols[-1]))
            for j, s, w in choice:
                for o in w:
                    n[j, cols[s] + o] += 1
            yield n


def _scattered(sp: StageProblem, count: int, seed: int):
    """``count`` placements drawn at random (each block a random stage and option) whose
    stages do not hold contiguous ranges, all distinct."""
    J, n_opts = sp.pp * sp.v, [len(t) for t in sp.time]
    cols = np.cumsum([0, *n_opts])
    contiguous = {n.tobytes() for n in _ranges(sp)}
    rng = np.random.default_rng(seed)
    seen: set[bytes] = set()
    out = []
    while len(out) < count:
        n = np.zeros((J, cols[-1]))
        for s, length in enumerate(sp.seg_len):
            for _ in range(length):
                n[rng.integers(J), cols[s] + rng.integers(n_opts[s])] += 1
        key = n.tobytes()
        if key not in contiguous and key not in seen:
            seen.add(key)
            out.append(n)
    return out


def _check_all(sp, split, keep=None, others: int | None = None, seed: int = 0) -> tuple[int, int]:
    """Every contiguous placement priced (or refused by memory or a cut) as the reference
    says; and every other placement (or ``others`` of them, drawn at random) refused."""
    keep = keep or [list(range(len(t))) for t in sp.time]
    model = stage_model(sp, keep, split)
    ranges = list(_ranges(sp))
    if others is None:
        contiguous = {n.tobytes() for n in ranges}
        rest = [n for n in _placements(sp) if n.tobytes() not in contiguous]
    else:
        rest = _scattered(sp, others, seed)
    feasible = refused = 0
    for n in ranges + rest:
        want, got = reference(sp, n, split, keep), _solve(model, n)
        if math.isinf(want):
            assert got == math.inf, n
            refused += 1
        else:
            assert got == pytest.approx(want, rel=1e-9, abs=1e-9), n
            feasible += 1
    return feasible, refused


@pytest.mark.parametrize("capacity,others,fit", [(4.0, 0, 13), (3.25, 40, 2), (2.75, 0, 1)])
def test_every_placement_is_priced_or_refused_as_the_formulation_says(capacity, others, fit):
    """Two stages, four blocks, two options each: the 40 contiguous count placements (of 160)
    at a roomy, a binding and a tight memory, and 40 of the others at the binding one."""
    feasible, refused = _check_all(_problem(capacity=capacity), NO_CUTS, others=others)
    assert feasible == fit and feasible + refused >= 40


def test_the_host_and_the_optimizer_steps_peak_refuse_placements():
    """The host row (0.7 GiB per GPU) and the step row each refuse placements the activation
    peak's row lets through: without them (host unbounded, no step peak) more fit."""
    sp = _problem(capacity=3.5)
    keep = [[0, 1]] * 3
    model = stage_model(sp, keep, NO_CUTS)
    loose = stage_model(_problem(capacity=3.5, step=False, host_capacity=1e3 * GIB), keep, NO_CUTS)
    by_host = by_step = 0
    for n in _ranges(sp):
        tight = reference(sp, n, NO_CUTS, keep)
        free = reference(
            _problem(capacity=3.5, step=False, host_capacity=1e3 * GIB), n, NO_CUTS, keep
        )
        if math.isinf(tight) and math.isfinite(free):
            assert _solve(model, n) == math.inf
            assert _solve(loose, n) == pytest.approx(free, rel=1e-9)
            no_step = reference(_problem(capacity=3.5, step=False), n, NO_CUTS, keep)
            by_step += math.isfinite(no_step)
            by_host += math.isinf(no_step)
    assert by_host and by_step


@pytest.mark.parametrize(
    "split",
    [
        SplitBound(4.0, 0.0, math.inf),  # T* above some placements' max stage: tmax lifted
        SplitBound(0.0, 6.1, math.inf),  # S* refuses the placements whose stages sum below it
        SplitBound(0.0, 0.0, 11.0),  # P* lifts Opt + Off above (m - 1) tmax + Opt + Off
        SplitBound(3.5, 5.6, 12.0),
    ],
)
def test_the_split_cuts_lift_or_refuse_as_stated(split):
    sp = _problem(capacity=4.0)
    feasible, refused = _check_all(sp, split, others=0)
    assert feasible and refused


@pytest.mark.parametrize("split", [NO_CUTS, SplitBound(3.3, 7.5, 19.0)])
def test_an_interleaved_pipeline_pays_m_times_its_busiest_rank(split):
    """pp = 2, v = 2 (stages 0 and 2 on rank 0): m R_max + (p - 1) T_max, and P* against
    m R_max + Opt + Off; a sample of the placements (every one would be 8,000)."""
    sp = _problem(pp=2, v=2, m=4, seg_len=(1, 3, 1), capacity=5.0)
    feasible, refused = _check_all(sp, split, others=10, seed=1)
    assert feasible > 10 and refused >= 10


def test_three_stages_of_one_chunk():
    sp = _problem(pp=3, seg_len=(1, 3, 1), capacity=3.5)
    feasible, refused = _check_all(sp, SplitBound(0.0, 0.0, 25.0), others=10, seed=2)
    assert feasible > 10 and refused >= 10
    model = stage_model(sp, [[0, 1]] * 3, NO_CUTS)
    prices = [reference(sp, n, NO_CUTS, [[0, 1]] * 3) for n in _ranges(sp)]
    # free: the least over every placement (integral and contiguous)
    assert _solve(model) == pytest.approx(min(prices), rel=1e-7)


@pytest.mark.parametrize("capacity", [4.0, 3.0])
def test_the_free_optimum_is_the_least_placement(capacity):
    """n free: HiGHS's optimum is the least price over every placement; fractional counts, a
    stage holding blocks out of order, or a placement of dropped options would go below."""
    sp = _problem(capacity=capacity)
    for keep in ([[0, 1], [0, 1], [0, 1]], [[1], [0, 1], [0]], [[0], [1], [0, 1]]):
        prices = [reference(sp, n, NO_CUTS, keep) for n in _ranges(sp)]
        assert _solve(stage_model(sp, keep, NO_CUTS)) == pytest.approx(min(prices), rel=1e-7)


def test_one_segment_and_one_stage():
    """No order rows (one segment), then no order_b (one stage): the same pricing."""
    one_seg = _problem(seg_len=(3,), capacity=4.0)
    assert all(_check_all(one_seg, NO_CUTS, others=3))
    one_stage = _problem(pp=1, seg_len=(1, 2, 1), capacity=6.0)
    feasible, _ = _check_all(one_stage, NO_CUTS, others=0)
    assert feasible


def test_the_model_reads_its_counts_back_by_stage_segment_and_option():
    sp = _problem()
    model = stage_model(sp, [[0, 1]] * 3, NO_CUTS)
    assert model.layout == Layout(J=2, P=2, S=3, K=6)
    x = np.zeros(model.layout.columns)
    x[:12] = [1, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1]  # stage 0: emb o0, 2 layers o1; stage 1: head o1
    x[:12] += 1e-9  # read to the nearest integer
    assert model.counts(x) == [[[1, 0], [0, 2], [0, 0]], [[0, 0], [0, 0], [0, 1]]]
    assert model.cols.tolist() == [0, 2, 4, 6]
    assert model.offset == sp.const_step
    lay = model.layout
    # columns: n (12), a (6), h (2), u (12), T (2), tmax, rmax, E, dp_first (2),
    # dp_second (2), X (2), Z (2), Opt, Off
    assert (lay.n, lay.a, lay.h, lay.u, lay.T, lay.tmax, lay.rmax, lay.E) == (
        0, 12, 18, 20, 32, 34, 35, 36,
    )  # fmt: skip
    assert (lay.dp_first, lay.dp_second, lay.X, lay.Z, lay.opt, lay.off, lay.columns) == (
        37, 39, 41, 43, 45, 46, 47,
    )  # fmt: skip
    assert model.integer.tolist() == [True] * 32 + [False] * 15
    assert model.col_upper[12:32].tolist() == [1.0] * 20


def test_rows_add_broadcasts_each_term_against_the_blocks_rows():
    rows = Rows()
    rows.add([1.0, 2.0], 5.0, ([0, 1], 3, 2.0), ([0, 1], [4, 5], [1.0, -1.0]))
    rows.add(0.0, np.inf, (0, 7, 1.5))
    assert rows.count == 3
    assert np.concatenate(rows.rows).tolist() == [0, 1, 0, 1, 2]
    assert np.concatenate(rows.cols).tolist() == [3, 3, 4, 5, 7]
    assert np.concatenate(rows.vals).tolist() == [2.0, 2.0, 1.0, -1.0, 1.5]
    assert np.concatenate(rows.lower).tolist() == [1.0, 2.0, 0.0]
    assert np.concatenate(rows.upper).tolist() == [5.0, 5.0, np.inf]


def test_cumulative_sums_each_segments_blocks_on_the_stages_so_far():
    """Three stages, segments of options (2, 1, 2): C[j, s + shift] for s < S - 1 sums every
    n[j', k] with j' <= j and k an option of segment s + shift."""
    lay = Layout(J=3, P=3, S=3, K=5)
    seg_of = np.array([0, 0, 1, 2, 2])
    for shift, n_rows in ((0, 3), (1, 2)):
        r, c, grid = cumulative(lay, seg_of, n_rows, 3, shift)
        got = sorted(zip(np.ravel(r).tolist(), np.ravel(c).tolist()))
        want = sorted(
            (j * 2 + s, lay.n + jp * 5 + k)
            for j in range(n_rows)
            for s in range(2)
            for jp in range(j + 1)
            for k in range(5)
            if seg_of[k] == s + shift
        )
        assert got == want
        assert grid.tolist() == [[j * 2 + s for s in range(2)] for j in range(n_rows)]
