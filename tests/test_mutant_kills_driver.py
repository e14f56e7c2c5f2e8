"""The outer search (planner/search/driver.py), written for its generated mutants
(docs/mutation.md): a whole ``search_space`` over a four-block model whose options are written
here (the pricing stood in, everything else the real enumeration, bounds and MILPs), checked
candidate by candidate against brute force over every split and option (bruteforce.py); then
each of the driver's parts on candidates and incumbents built by hand: the order, the
tolerance band, the tie-break, the second pass's proof, the gap, the simpler-option pass, the
stream twins, the error messages and the context-parallel fallback.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from types import SimpleNamespace

import highspy
import networkx as nx
import pytest
from bruteforce import brute_force
from conftest import cluster_of, make_block, make_option

import planner.search.driver as driver
from planner.cost.records import Config, CostInputs
from planner.cost.step import evaluate
from planner.errors import UserInputError
from planner.search.bound_memo import BoundMemo
from planner.search.candidates import Candidate, Pins
from planner.search.driver import (
    SEARCH_REL_TOL,
    TIE_REL_TOL,
    SearchResult,
    _beaten,
    _better,
    _Incumbent,
    _open,
    _order,
    _prune_by_bound,
    _prune_by_memory,
    _tp_unused,
    _tp_useful,
    prefer_simpler,
    search,
    search_space,
    stream_twins,
)
from planner.search.memo import SearchMemo
from planner.training import Training


@pytest.fixture(autouse=True)
def _own_highs_scheduler():
    """mutmut forks a child per mutant from the process that ran the clean tests; HiGHS's task
    scheduler's threads do not come with a fork, and a MILP there would wait on them forever:
    each test starts HiGHS's scheduler afresh."""
    highspy.Highs.resetGlobalScheduler(False)


# ------------------------------------------------------------------ a small model, priced here

GIB = 2**30


def _graph(**attrs) -> nx.DiGraph:
    """A traced graph with no op: no attention, no BatchNorm, nothing refusing a pipeline."""
    g = nx.DiGraph()
    g.graph["traced_batch_size"] = 1
    g.graph.update(attrs)
    return g


def _blocks():
    return [make_block(0, "E", 10**7), make_block(1, "L", 10**8), make_block(2, "L", 10**8),
            make_block(3, "H", 10**7)]  # fmt: skip


def _options(mbs: int, params: float):
    """Per block, at micro-batch ``mbs``: fast with many activations, or recomputed."""
    layer = [
        make_option(2e-3 * mbs, params, 1 * GIB * mbs),
        make_option(2.6e-3 * mbs, params, 0.2 * GIB * mbs, recompute="full"),
    ]
    return [
        [make_option(0.2e-3 * mbs, params / 10, 0.05 * GIB * mbs)],
        layer,
        layer,
        [make_option(0.9e-3 * mbs, params / 10, 0.5 * GIB * mbs),
         make_option(1.1e-3 * mbs, params / 10, 0.1 * GIB * mbs, recompute="full")],
    ]  # fmt: skip


def _replicated(block, tp, *rest):
    return [SimpleNamespace(name="replicated", exit_gather=())]


def _stand_in_pricing(monkeypatch, params=1e8, asked=None):
    """``price_options`` answered from ``_options``, recording what it is asked."""

    def price(graph, blocks, tp, mbs, cluster, training, pins, variants_of, ep, cp, priced,
              pipelined, stream, bounds):  # fmt: skip
        if asked is not None:
            asked.append((tp, mbs, ep, cp, pipelined, stream, priced, bounds, cluster, training))
        return _options(mbs, params)

    monkeypatch.setattr(driver, "price_options", price)


# (memory GiB, parameters per layer, GPUs per node): one-stage plans win (the first two), or
# pipelines do, over a slow inter-node link that makes data parallelism's reduction dear
SHAPES = [(8.0, 1e8, 8), (3.0, 1e8, 8), (20.0, 1e9, 1), (80.0, 1e9, 1)]
WINNERS = [  # the label, options and stages of each shape's best plan
    ("pp1 dp4 tp1, micro-batch 2, no pipeline, ZeRO-2", [0, 0, 0, 0], [0, 0, 0, 0]),
    ("pp1 dp4 tp1, micro-batch 2, no pipeline, ZeRO-2", [0, 1, 1, 0], [0, 0, 0, 0]),
    ("pp2 dp2 tp1, micro-batch 4, gpipe, ZeRO-2", [0, 0, 0, 0], [0, 0, 1, 1]),
    ("pp4 dp1 tp1, micro-batch 8, gpipe, ZeRO-0", [0, 0, 0, 0], [0, 1, 2, 3]),
]


def _run(monkeypatch, memory_gib=8.0, params=1e8, per_node=8, gbs=8, gpus=4, pins=None,
         memo=None):  # fmt: skip
    _stand_in_pricing(monkeypatch, params)
    cl = cluster_of(gpus, memory_bytes=memory_gib * GIB, reserved_bytes=0, gpus_per_node=per_node)
    training = Training(gbs)
    res = search_space(_graph(), _blocks(), cl, training, pins or Pins(), _replicated, memo=memo)
    return res, cl, training


def _optimum(res: SearchResult, c: Candidate) -> float:
    inp = res.inputs[c.key]
    t, _, _ = brute_force(inp, c.mesh, c.micro_batch_size, c.schedule, c.virtual_stages, c.zero)
    return t


def _check_reason(c: Candidate, t: float) -> None:
    """A bound's pruning names the bound and the best time then (no faster than the final);
    a MILP's, the cutoff it proved."""
    found = re.fullmatch(r"lower bound (\S+) s is no better than the best plan's (\S+) s", c.reason)
    if found is None:
        assert re.fullmatch(r"its MILP proves no placement beats the best plan's \S+ s", c.reason)
        return
    assert found[1] == f"{c.bound:.4g}"
    assert float(found[2]) >= float(f"{t:.4g}")


@pytest.mark.parametrize("shape,winner", zip(SHAPES, WINNERS, strict=True))
def test_the_search_finds_brute_forces_optimum_and_every_certificate_holds(
    monkeypatch, shape, winner
):
    """One-stage plans win with small layers, pipelines with large ones over a slow link."""
    res, _, _ = _run(monkeypatch, *shape)
    assert (res.best.label(), res.best.config.choice, res.best.config.stage_of) == winner
    optima = {id(c): _optimum(res, c) for c in res.candidates}
    best = min(optima.values())
    assert best < math.inf
    assert res.best is not None and res.best.status == "solved"
    t = res.best.cost.step_time_s
    assert t == pytest.approx(best, rel=1e-9)
    assert t == pytest.approx(evaluate(res.inputs[res.best.key], res.best.config).step_time_s)
    assert res.total == len(res.candidates) == 41
    assert res.solved == sum(c.solve_time_s > 0 for c in res.candidates) > 0
    assert res.nodes == sum(c.nodes for c in res.candidates)
    assert res.gap == 0.0 and res.bound == t
    assert res.solve_time_s > 0
    for c in res.candidates:
        opt = optima[id(c)]
        if c.status == "solved":
            assert c.cost.step_time_s == pytest.approx(opt, rel=1e-6)
            assert c.bound <= opt * (1 + 1e-9)
        elif c.status == "pruned-bound":
            assert c.bound >= t * (1 - SEARCH_REL_TOL)
            assert c.bound <= opt * (1 + 1e-9)
            _check_reason(c, t)
        elif c.status == "pruned-memory":
            assert opt == math.inf
        elif c.status == "dominated":
            assert c.schedule == "gpipe" and c.pp > 1
            assert c.reason == "GPipe: same time as 1F1B, more memory"
        else:
            assert c.status == "infeasible" and opt == math.inf, c.status


def test_nothing_fitting_leaves_no_best_and_no_gap(monkeypatch):
    res, _, _ = _run(monkeypatch, 1.0)
    assert res.best is None
    assert res.gap == 0.0 and res.bound == 0.0
    assert res.solved == 0
    assert {c.status for c in res.candidates} == {"pruned-memory", "dominated"}
    memory = [c for c in res.candidates if c.status == "pruned-memory"]
    assert all(c.bound == math.inf or c.min_memory > GIB for c in memory)


def test_the_bound_memo_gives_the_same_search(monkeypatch):
    """With a BoundMemo the relaxations and split bounds are read through it: the same plan,
    certificates and work as without, and a second search reads them back."""
    plain, _, _ = _run(monkeypatch, *SHAPES[2])
    memo = SearchMemo(bounds=BoundMemo())
    kept, _, _ = _run(monkeypatch, *SHAPES[2], memo=memo)
    again, _, _ = _run(monkeypatch, *SHAPES[2], memo=memo)
    for res in (kept, again):
        assert res.best.label() == plain.best.label()
        assert res.best.cost.step_time_s == plain.best.cost.step_time_s
        assert res.nodes == plain.nodes and res.solved == plain.solved
        assert [(c.status, c.bound) for c in res.candidates] == [
            (c.status, c.bound) for c in plain.candidates
        ]
    assert memo.bounds.entries


def test_progress_counts_prices_and_solves(monkeypatch):
    _stand_in_pricing(monkeypatch, 1e9)
    cl = cluster_of(4, memory_bytes=20 * GIB, reserved_bytes=0, gpus_per_node=1)
    calls = []
    res = search_space(_graph(), _blocks(), cl, Training(8), Pins(), _replicated,
                       progress=lambda *a, **k: calls.append((a, k)))  # fmt: skip
    prices = [a for a, _ in calls if a[0] == "price"]
    assert prices == [("price", i, 4) for i in range(4)]  # micro-batches 1, 2, 4, 8
    solves = [(a, k) for a, k in calls if a[0] == "solve"]
    assert [a for a, _ in solves] == [("solve", i, 41) for i in range(res.solved)]
    pruned = [k["pruned"] for _, k in solves]
    # first the ten dominated GPipe candidates and those whose states alone do not fit
    ordered_out = ("GPipe: same time as 1F1B, more memory", "model states alone exceed memory")
    assert pruned == sorted(pruned)
    assert pruned[0] == sum(c.reason in ordered_out for c in res.candidates) == 12
    assert all(p + d < 41 for p, (_, d, _) in zip(pruned, (a for a, _ in solves), strict=True))


# ------------------------------------------------------------------ the small parts, by hand


def _cand(pp=1, tp=1, zero=0, ep=1, cp=1, bound=0.0, time=None, memory=0.0, **kw):
    c = Candidate(pp, 1, tp, 1, "1f1b", 1, zero, ep, cp, bound=bound, **kw)
    if time is not None:
        c.cost = SimpleNamespace(step_time_s=time, peak_memory_bytes=memory, feasible=True)
    return c


@pytest.mark.parametrize(
    "bound,beaten,banded",
    [
        (1.0 + 2e-9, True, False),
        (1.0 + 0.5e-9, True, True),
        (1.0, True, True),
        (1.0 - SEARCH_REL_TOL, True, True),
        (1.0 - 1.001 * SEARCH_REL_TOL, False, False),
        (0.5, False, False),
    ],
)
def test_beaten_and_the_band(bound, beaten, banded):
    band = []
    c = _cand(bound=bound)
    assert _beaten(c, _cand(time=1.0), band) is beaten
    assert band == ([c] if banded else [])
    assert TIE_REL_TOL == 1e-9 and SEARCH_REL_TOL == 1e-3


def test_better_is_faster_then_less_memory_then_the_simpler_mesh():
    base = dict(time=1.0, memory=5.0)
    assert _better(_cand(time=0.9, memory=9.0, pp=4), _cand(**base))
    assert not _better(_cand(**base), _cand(**base))
    assert _better(_cand(time=1.0, memory=4.0, pp=4), _cand(**base))
    for field_ in ("pp", "tp", "zero", "ep", "cp"):
        low, high = _cand(**base, **{field_: 1}), _cand(**base, **{field_: 2})
        assert _better(low, high) and not _better(high, low), field_
    # the order of the keys: pp before tp before zero before ep before cp
    assert _better(_cand(**base, pp=1, tp=4), _cand(**base, pp=2, tp=1))
    assert _better(_cand(**base, tp=1, zero=3), _cand(**base, tp=2, zero=0))
    assert _better(_cand(**base, zero=0, ep=4), _cand(**base, zero=1, ep=1))
    assert _better(_cand(**base, ep=1, cp=4), _cand(**base, ep=2, cp=1))


def test_open_is_unresolved_or_solved_without_proof():
    assert _open(_cand(status="unresolved"))
    assert _open(_cand(status="solved", proven=False))
    assert not _open(_cand(status="solved", proven=True))
    assert not _open(_cand(status="pruned-bound"))


def test_the_prunings_say_why():
    c = _cand(bound=0.123456)
    _prune_by_bound(c, _cand(time=0.1))
    assert (c.status, c.reason) == (
        "pruned-bound", "lower bound 0.1235 s is no better than the best plan's 0.1 s"
    )  # fmt: skip
    _prune_by_memory(c)
    assert (c.status, c.bound, c.reason) == (
        "pruned-memory", math.inf,
        "even split fractionally over the ranks, the model does not fit in memory",
    )  # fmt: skip


def _ordered(cands, pins=None, gbs=8, memory=10.0):
    cl = cluster_of(8, memory_bytes=memory * GIB)
    return _order(cands, Training(gbs), pins or Pins(memory_fraction=0.5), cl)


def test_order_drops_dominated_gpipe_and_what_cannot_fit_then_seeds_first():
    def mk(pp, schedule="1f1b", v=1, mbs=1, dp=1, bound=1.0, mem=0.0, tp=1, zero=0, ep=1):
        return Candidate(pp, dp, tp, mbs, schedule, v, zero, ep, bound=bound, min_memory=mem)

    gpipe_m8 = mk(2, "gpipe")  # m = 8 >= 2: dominated
    gpipe_m2 = mk(4, "gpipe", mbs=4, bound=0.1)  # m = 2 < 4: kept
    gpipe_m4 = mk(4, "gpipe", mbs=2, bound=0.2)  # m = 4 == pp: dominated
    full = mk(1, mem=5.01 * GIB)  # over half of 10 GiB
    fits = mk(1, mem=5.0 * GIB, bound=3.0)
    inter = mk(1, "interleaved", v=2, bound=0.05)  # a one-rank pipeline of two chunks
    a = mk(2, bound=0.5, tp=2)
    b = mk(2, bound=0.5, tp=1)
    c = mk(1, bound=2.0, mbs=2)
    d = mk(1, bound=2.0, mbs=4)
    e = mk(1, bound=2.0, mbs=4, zero=1)
    f = mk(1, bound=2.0, mbs=4, zero=1, ep=2)
    g = mk(1, bound=2.0, mbs=4, zero=1, ep=1, tp=2)
    order = _ordered([gpipe_m8, gpipe_m2, gpipe_m4, full, fits, inter, a, b, c, d, e, f, g])
    assert gpipe_m8.status == gpipe_m4.status == "dominated"
    assert gpipe_m8.reason == "GPipe: same time as 1F1B, more memory"
    assert (full.status, full.reason) == ("pruned-memory", "model states alone exceed memory")
    assert [x is y for x, y in zip(order, [d, e, f, c, g, fits, inter, gpipe_m2, b, a],
                                   strict=True)] == [True] * 10  # fmt: skip


def test_a_pinned_schedule_keeps_gpipe_and_virtual_stages_order_pipelines():
    gp = Candidate(2, 1, 1, 1, "gpipe", 1, 0, bound=1.0)
    v4 = Candidate(2, 1, 1, 1, "interleaved", 4, 0, bound=1.0)
    v2 = Candidate(2, 1, 1, 1, "interleaved", 2, 0, bound=1.0)
    order = _ordered([gp, v4, v2], Pins(schedule="gpipe"))
    assert gp.status == "pending" and order == [gp, v2, v4]


# ------------------------------------------------------------------ the passes, on a stand-in


class _Solver:
    """A stand-in for ``solve_candidate``: records each call and plays the outcome given for
    the candidate (by label), as the real one records it on the candidate."""

    def __init__(self, outcomes: dict):
        self.outcomes = outcomes
        self.calls = []

    def __call__(self, inp, c, cutoff, nodes, sp=None, split=None, runs=None):
        self.calls.append((c.label(), cutoff, nodes, sp, split, runs))
        status, time_, bound, spent = self.outcomes[c.label()]
        c.nodes += spent
        c.solve_time_s += 0.5
        c.status = status
        c.bound = max(c.bound, bound)
        if status == "solved":
            c.cost = SimpleNamespace(step_time_s=time_, peak_memory_bytes=0.0, feasible=True)
            c.config = SimpleNamespace(choice=[0])
            c.milp_objective = time_
            c.proven = bound >= time_
            c.gap = (time_ - c.bound) / time_


def _incumbent(monkeypatch, outcomes, runs="runs"):
    solver = _Solver(outcomes)
    monkeypatch.setattr(driver, "solve_candidate", solver)
    return _Incumbent(_KeyedInputs(), runs=runs), solver


class _KeyedInputs(dict):
    """Priced options for any key: every block's one option replicated."""

    def __missing__(self, key):
        return SimpleNamespace(options=[[SimpleNamespace(variant="replicated")]])


def _c(pp, bound=0.0, status="pending", time=None, proven=False, nodes=0, tp=1):
    c = Candidate(pp, 1, tp, 1, "1f1b", 1, 0, bound=bound, status=status, nodes=nodes,
                  proven=proven)  # fmt: skip
    if time is not None:
        c.cost = SimpleNamespace(step_time_s=time, peak_memory_bytes=0.0, feasible=True)
        c.config = SimpleNamespace(choice=[0])
    return c


def test_solve_cuts_off_at_the_best_time_less_the_tolerance_and_bands_what_it_prunes(
    monkeypatch,
):
    inc, solver = _incumbent(monkeypatch, {})
    a, b = _c(1), _c(2)
    solver.outcomes = {a.label(): ("solved", 2.0, 2.0, 3), b.label(): ("pruned-bound", 0, 1.9, 4)}
    inc.problems[id(b)] = ("problem", "split")
    inc.solve(a, 7)
    assert solver.calls[-1] == (a.label(), None, 7, None, None, "runs")
    inc.offer(a)
    assert inc.best is a
    inc.solve(b, 9)
    assert solver.calls[-1] == (b.label(), 2.0 * (1 - SEARCH_REL_TOL), 9, "problem", "split",
                                "runs")  # fmt: skip
    assert inc.band == [b]
    inc.solve(b, 9, tol=-TIE_REL_TOL)
    assert solver.calls[-1][1] == 2.0 * (1 + TIE_REL_TOL)


def test_offer_takes_only_a_solved_feasible_better_plan(monkeypatch):
    inc, _ = _incumbent(monkeypatch, {})
    slow, fast = _c(1, status="solved", time=2.0), _c(2, status="solved", time=1.0)
    unfit = _c(4, status="solved", time=0.5)
    unfit.cost.feasible = False
    pruned = _c(8, status="pruned-bound", time=0.1)
    for c in (slow, fast, slow, unfit, pruned):
        inc.offer(c)
    assert inc.best is fast


def test_a_tp_degree_that_shards_nothing_is_dominated_unless_pinned(monkeypatch):
    inc, _ = _incumbent(monkeypatch, {})
    c, pinned, one = _c(1, tp=2), _c(2, tp=2), _c(4)
    driver.solve_candidate.outcomes = {
        x.label(): ("solved", t, t, 1) for x, t in ((c, 1.0), (pinned, 2.0), (one, 3.0))
    }
    inc._solve_first(c, Pins())
    assert (c.status, c.reason) == (
        "dominated", "TP degree 2 shards no block: 2 devices repeat the same work"
    )  # fmt: skip
    assert inc.best is None and inc.done == 1
    inc._solve_first(pinned, Pins(tp=2))
    inc._solve_first(one, Pins())
    assert pinned.status == one.status == "solved" and inc.best is pinned and inc.done == 3
    assert driver.solve_candidate.calls[0][2] == driver.FIRST_PASS_NODES == 300


def test_tp_unused_and_useful():
    inputs = {
        (2,): SimpleNamespace(options=[[SimpleNamespace(variant="replicated"),
                                        SimpleNamespace(variant="colwise")]] * 2)
    }  # fmt: skip
    c = SimpleNamespace(key=(2,), config=SimpleNamespace(choice=[0, 0]))
    assert _tp_unused(inputs, c)
    c.config.choice = [0, 1]
    assert not _tp_unused(inputs, c)
    blocks = [make_block(0, "A"), make_block(1, "B"), make_block(2, "A")]
    asked = []

    def variants_of(block, tp):
        asked.append((block.index, tp))
        name = "colwise" if block.cls == "B" and tp == 2 else "replicated"
        return [SimpleNamespace(name="replicated"), SimpleNamespace(name=name)]

    assert _tp_useful(None, blocks, 1, variants_of) and asked == []
    assert _tp_useful(None, blocks, 2, variants_of)
    assert not _tp_useful(None, blocks, 4, variants_of)
    # one block per class: the last of each (a dict keeps the last value of a key)
    assert asked == [(2, 2), (1, 2), (2, 4), (1, 4)]


def test_prove_best_proves_replaces_or_raises_the_bound(monkeypatch):
    inc, solver = _incumbent(monkeypatch, {})
    assert inc.prove_best() == 0  # no best
    best = _c(2, bound=1.0, status="solved", time=2.0, nodes=5)
    best.solve_time_s = 1.0
    inc.best = best
    solver.outcomes = {best.label(): ("pruned-bound", 0, 2.0, 40)}
    assert inc.prove_best() == 40
    assert solver.calls[-1][1:3] == (2.0, driver.SECOND_PASS_NODES)
    assert (best.bound, best.gap, best.proven, best.nodes, best.solve_time_s) == (
        2.0, 0.0, True, 45, 1.5
    )  # fmt: skip
    assert inc.prove_best() == 0  # proven now
    # a node limit again: the higher bound, never above the best time
    best = _c(2, bound=1.0, status="solved", time=2.0)
    inc.best = best
    solver.outcomes = {best.label(): ("unresolved", 0, 1.5, 7)}
    assert inc.prove_best() == 7
    assert (best.bound, best.gap, best.proven) == (1.5, 0.25, False)
    solver.outcomes = {best.label(): ("unresolved", 0, 0.5, 7)}  # the trial starts at 1.5
    inc.prove_best()
    assert best.bound == 1.5
    solver.outcomes = {best.label(): ("unresolved", 0, 3.0, 7)}
    inc.prove_best()
    assert (best.bound, best.gap) == (2.0, 0.0)
    # a faster placement found: it replaces the best plan's, with its own certificate
    best = _c(2, bound=1.0, status="solved", time=2.0)
    inc.best = best
    solver.outcomes = {best.label(): ("solved", 1.8, 1.2, 3)}
    inc.prove_best()
    assert (best.cost.step_time_s, best.milp_objective, best.bound, best.proven) == (
        1.8, 1.8, 1.2, False
    )  # fmt: skip
    assert best.gap == pytest.approx(1 / 3)
    # a solved trial no better: the bound only
    best = _c(2, bound=1.0, status="solved", time=2.0)
    inc.best = best
    solver.outcomes = {best.label(): ("solved", 2.0, 1.9, 3)}
    inc.prove_best()
    assert best.cost.step_time_s == 2.0 and best.bound == 1.9
    assert best.gap == pytest.approx(0.05)


def test_a_zero_step_time_has_no_gap(monkeypatch):
    inc, solver = _incumbent(monkeypatch, {})
    best = _c(2, bound=0.0, status="solved", time=0.0)
    inc.best = best
    solver.outcomes = {best.label(): ("unresolved", 0, 0.0, 1)}
    inc.prove_best()
    assert best.gap == 0.0


def test_second_pass_solves_the_open_best_bound_first_within_its_budget(monkeypatch):
    inc, solver = _incumbent(monkeypatch, {})
    best = _c(1, bound=2.0, status="solved", time=2.0, proven=True)
    inc.best = best
    low = _c(2, bound=0.5, status="unresolved")
    mid = _c(4, bound=1.0, status="solved", time=2.5)
    late = _c(8, bound=1.5, status="unresolved")
    beaten_open = _c(16, bound=3.0, status="unresolved")
    beaten_solved = _c(32, bound=2.5, status="solved", time=3.0)
    done = _c(64, bound=0.1, status="solved", time=2.2, proven=True)
    solver.outcomes = {
        low.label(): ("solved", 1.5, 1.5, 10),
        mid.label(): ("pruned-bound", 0, 1.5, 1),
    }
    spent = inc.second_pass([beaten_open, late, mid, best, done, low, beaten_solved])
    assert spent == 11
    assert [call[0] for call in solver.calls] == [low.label(), mid.label()]
    assert solver.calls[0][1:3] == (2.0 * (1 - SEARCH_REL_TOL), driver.SECOND_PASS_NODES)
    assert solver.calls[1][1] == 1.5 * (1 - SEARCH_REL_TOL)  # the new best's cutoff
    assert inc.best is low and mid.status == "pruned-bound"
    # the beaten: an unresolved one pruned by its bound, a solved one left as it is
    assert late.status == beaten_open.status == "pruned-bound"
    assert late.reason == "lower bound 1.5 s is no better than the best plan's 1.5 s"
    assert beaten_solved.status == "solved"
    assert driver.SECOND_PASS_NODES == 2000 and driver.SECOND_PASS_BUDGET == 4000


def test_second_pass_stops_at_the_budget_exactly(monkeypatch):
    inc, solver = _incumbent(monkeypatch, {})
    best = _c(1, bound=1.0, status="solved", time=2.0)
    inc.best = best
    a = _c(2, bound=0.5, status="unresolved")
    b = _c(4, bound=0.6, status="unresolved")
    solver.outcomes = {
        best.label(): ("unresolved", 0, 1.0, driver.SECOND_PASS_BUDGET),
        a.label(): ("unresolved", 0, 0.5, 1),
    }
    assert inc.second_pass([a, b, best]) == driver.SECOND_PASS_BUDGET
    assert [call[0] for call in solver.calls] == [best.label()]


def test_close_band_solves_the_band_at_the_best_time_lowest_first(monkeypatch):
    inc, solver = _incumbent(monkeypatch, {})
    assert inc.close_band(0) is None and solver.calls == []  # no best: nothing
    best = _c(1, status="solved", time=2.0, proven=True)
    inc.best = best
    tie = _c(2, bound=2.0, status="pruned-bound")
    near = _c(4, bound=1.999, status="pruned-bound")
    above = _c(8, bound=2.0 + 1e-12, status="pruned-bound")
    reopened = _c(16, bound=1.9995, status="solved", time=2.1)
    inc.band = [tie, above, reopened, near]
    solver.outcomes = {
        near.label(): ("solved", 1.9995, 1.9995, 2),
        tie.label(): ("pruned-bound", 0, 2.0, 3),
    }
    inc.close_band(driver.SECOND_PASS_BUDGET - 3)
    assert [call[0] for call in solver.calls] == [near.label()]
    assert solver.calls[0][1:3] == (2.0 * (1 + TIE_REL_TOL), driver.SECOND_PASS_NODES)
    assert inc.best is near
    inc.best = best
    solver.calls.clear()
    near.status = "pruned-bound"
    solver.outcomes[near.label()] = ("pruned-bound", 0, 2.0, 2)  # proven no better
    inc.close_band(driver.SECOND_PASS_BUDGET - 5)
    assert inc.best is best
    assert [call[0] for call in solver.calls] == [near.label(), tie.label()]
    inc.best = best
    solver.calls.clear()
    inc.close_band(driver.SECOND_PASS_BUDGET)
    assert solver.calls == []


def test_the_gap_and_lower_bound_read_the_band_and_the_open_candidates(monkeypatch):
    inc, _ = _incumbent(monkeypatch, {})
    assert inc.gap([]) == 0.0 and inc.lower_bound([]) == 0.0
    inc.best = _c(1, status="solved", time=2.0, proven=True)
    proven = _c(2, bound=1.0, status="solved", time=2.5, proven=True)
    assert inc.lower_bound([inc.best, proven]) == 2.0 and inc.gap([proven]) == 0.0
    inc.band = [_c(4, bound=1.9, status="pruned-bound"), _c(8, bound=0.1, status="solved")]
    assert inc.lower_bound([]) == 1.9 and inc.gap([]) == pytest.approx(0.05)
    open_ = _c(16, bound=1.6, status="unresolved")
    unproven = _c(32, bound=1.5, status="solved", time=2.2)
    assert inc.lower_bound([open_]) == 1.6
    assert inc.lower_bound([open_, unproven]) == 1.5
    assert inc.gap([open_, unproven]) == pytest.approx(0.25)
    inc.band = [_c(4, bound=2.5, status="pruned-bound")]
    assert inc.gap([]) == 0.0 and inc.lower_bound([]) == 2.0


# ------------------------------------------------------------------ the stream's twins, pricing


def _flags_stand_in(monkeypatch, chained_tps):
    """``sequence_stream_flags`` chaining the stream at the TP degrees given (pipelined or
    not), recording what it is asked."""
    asked = []

    def flags(graph, blocks, tp, pipelined, variants_of):
        asked.append((tp, pipelined))
        if tp in chained_tps:
            return [(False, True), (True, False)] + [(False, False)] * (len(blocks) - 2)
        return [(False, False)] * len(blocks)

    monkeypatch.setattr(driver, "sequence_stream_flags", flags)
    return asked


@pytest.mark.parametrize(
    "variant,expected",
    [
        ("auto", [(1, 1, False), (2, 1, False), (2, 1, True), (2, 2, False), (2, 2, True),
                  (2, 1, False), (2, 1, True)]),
        ("sequence", [(1, 1, False), (2, 1, True), (2, 2, True), (2, 1, True)]),
        ("no-sequence", [(1, 1, False), (2, 1, False), (2, 2, False), (2, 1, False)]),
    ],
)  # fmt: skip
def test_stream_twins_add_or_replace_where_the_stream_chains(monkeypatch, variant, expected):
    asked = _flags_stand_in(monkeypatch, {2})
    cands = [Candidate(1, 4, 1, 1, "1f1b", 1, 0), Candidate(1, 2, 2, 1, "1f1b", 1, 0),
             Candidate(2, 1, 2, 1, "1f1b", 1, 0), Candidate(1, 2, 2, 2, "1f1b", 1, 0)]  # fmt: skip
    out = stream_twins(None, _blocks(), cands, Pins(tp_variant=variant), None)
    assert [(c.tp, c.pp, c.stream) for c in out] == expected
    # asked once per (TP degree, pipelined): the second dp2 tp2 candidate reads it back
    assert asked == ([] if variant == "no-sequence" else [(1, False), (2, False), (2, True)])


def test_stream_training_sends_shards_only_for_a_pipelined_stream_every_cut_can_send(
    monkeypatch,
):
    _flags_stand_in(monkeypatch, {2})
    cut_answers = []

    def cuts(graph, blocks, flags):
        cut_answers.append(flags)
        return cut_answers[0] is not None and len(cut_answers) % 2 == 1

    monkeypatch.setattr(driver, "cuts_send_shards", cuts)
    training = Training(8)
    plain = Candidate(2, 1, 2, 1, "1f1b", 1, 0)
    assert driver.stream_training(None, _blocks(), plain, training, None) is training
    one_stage = Candidate(1, 1, 2, 1, "1f1b", 1, 0, stream=True)
    assert driver.stream_training(None, _blocks(), one_stage, training, None) is training
    assert cut_answers == []
    piped = Candidate(2, 1, 2, 1, "1f1b", 1, 0, stream=True)
    sent = driver.stream_training(None, _blocks(), piped, training, None)
    assert sent == Training(8, pipeline_sends_shards=True) and not training.pipeline_sends_shards
    assert cut_answers[0][:2] == [(False, True), (True, False)]
    assert driver.stream_training(None, _blocks(), piped, training, None) is training


def test_price_asks_once_per_key_and_bounds_every_candidate(monkeypatch):
    asked = []
    _stand_in_pricing(monkeypatch, 1e8, asked)
    memo = SearchMemo(bounds="bounds")
    cl = cluster_of(4)
    training = Training(8)
    cands = [Candidate(1, 4, 1, 2, "1f1b", 1, 0), Candidate(1, 4, 1, 2, "1f1b", 1, 3),
             Candidate(2, 2, 1, 1, "1f1b", 1, 0)]  # fmt: skip
    progress = []
    inputs = driver._price(_graph(traced_batch_size=2), _blocks(), cl, training,
                           Pins(memory_fraction=0.75), None, cands,
                           lambda *a: progress.append(a), memo)  # fmt: skip
    assert progress == [("price", 0, 2), ("price", 1, 2)]
    assert [a[:6] for a in asked] == [(1, 2, 1, 1, False, False), (1, 1, 1, 1, False, False)]
    assert all(a[6] is memo.priced and a[7] == "bounds" and a[8] is cl for a in asked)
    assert all(a[9] is training for a in asked)
    assert list(inputs) == [cands[0].key, cands[2].key]
    inp = inputs[cands[0].key]
    assert (inp.traced_mbs, inp.memory_fraction, inp.cluster, inp.training) == (
        2, 0.75, cl, training
    )  # fmt: skip
    assert inp.options == _options(2, 1e8) and inp.blocks == _blocks()
    for c in cands:
        assert (c.bound, c.min_memory) == driver.lower_bounds(inputs[c.key], c)
        assert c.bound > 0 and c.min_memory > 0
    driver._price(_graph(), _blocks(), cl, training, Pins(), None, cands, None, memo)  # quiet


# ------------------------------------------------------------------ candidates and their errors


def _sharding(names: dict):
    """variants_of answering the variant names given per TP degree, recording the degrees."""
    asked = []

    def variants_of(block, tp, *rest):
        asked.append(tp)
        return [SimpleNamespace(name=n, exit_gather=()) for n in names.get(tp, ["replicated"])]

    return variants_of, asked


def _cands(graph, pins, variants_of=_replicated, gpus=4, gbs=8):
    return driver._candidates(graph, _blocks(), cluster_of(gpus), Training(gbs), pins, variants_of)


def test_candidates_price_only_a_pinned_tp_degree(monkeypatch):
    _flags_stand_in(monkeypatch, set())
    variants_of, asked = _sharding({2: ["replicated", "colwise"]})
    cands = _cands(_graph(), Pins(tp=2), variants_of)
    assert {c.tp for c in cands} == {2} and set(asked) == {2}
    asked.clear()
    cands = _cands(_graph(), Pins(), variants_of)
    assert {c.tp for c in cands} == {1, 2} and set(asked) == {2, 4}


def test_context_parallelism_needs_fused_attention():
    with pytest.raises(UserInputError) as err:
        _cands(_graph(), Pins(cp=2))
    assert str(err.value) == (
        "--cp 2: context parallelism splits attention computed by fused attention ops "
        "(scaled_dot_product_attention); this model computes its attention with plain matrix "
        "products and softmax: drop --cp"
    )
    assert _cands(_graph(), Pins(cp=1))  # a degree of 1 is no context parallelism


def test_a_model_no_pipeline_can_run_gets_none_and_a_pinned_one_is_refused():
    hooks = _graph(method="hooks")
    assert {c.pp for c in _cands(hooks, Pins())} == {1}
    assert {c.pp for c in _cands(_graph(), Pins())} == {1, 2, 4}
    refusal = driver.pipeline_refusal(hooks)
    with pytest.raises(UserInputError) as err:
        _cands(hooks, Pins(pp=2))
    assert str(err.value) == (
        f"--pp 2: {refusal}: drop --pp (data, tensor parallelism and ZeRO run the model's own code)"
    )
    assert {c.pp for c in _cands(hooks, Pins(pp=1))} == {1}


def test_a_batchnorm_floor_keeps_layouts_with_two_samples_per_replica_group(monkeypatch):
    monkeypatch.setattr(driver, "batch_statistics_floor", lambda graph: 2)
    cands = _cands(_graph(), Pins(), gpus=2, gbs=4)
    monkeypatch.setattr(driver, "batch_statistics_floor", lambda graph: 1)
    unfloored = _cands(_graph(), Pins(), gpus=2, gbs=4)
    assert [c.label() for c in cands] == [
        c.label() for c in unfloored if c.micro_batch_size * c.dp >= 2
    ]
    assert any(c.micro_batch_size * c.dp == 1 for c in unfloored)
    assert any(c.micro_batch_size * c.dp == 2 for c in cands)
    monkeypatch.setattr(driver, "batch_statistics_floor", lambda graph: 2)
    with pytest.raises(UserInputError) as err:
        _cands(_graph(), Pins(micro_batch_size=1, dp=1), gpus=2, gbs=4)
    assert str(err.value) == (
        "a BatchNorm of this model normalises one value per channel per sample, so its "
        "statistics need at least 2 samples together, and every layout the pins allow gives "
        "it a micro-batch of 1 on one replica: pin --micro-batch-size 2 or more, or more "
        "data-parallel replicas (--dp)"
    )


def test_no_candidate_names_why_and_what_the_hooks_trace_could_not_shard():
    tail = (
        "; torch.export could not trace the model (its note says why; a transformers model "
        "that returns its KV cache is the usual case: build it with use_cache=False), and the "
        "module-level trace it fell back to shards no weight"
    )
    plain = driver.no_candidate_message(4, Training(8), Pins(tp=2), [1], _blocks())
    with pytest.raises(UserInputError) as err:
        _cands(_graph(), Pins(tp=2))
    assert str(err.value) == plain
    with pytest.raises(UserInputError) as err:
        _cands(_graph(method="hooks"), Pins(tp=2))
    assert str(err.value) == plain + tail
    # a degree that shards something: the hooks' note is not added
    variants_of, _ = _sharding({2: ["colwise"]})
    with pytest.raises(UserInputError) as err:
        _cands(_graph(method="hooks"), Pins(tp=4), variants_of)
    assert str(err.value) == driver.no_candidate_message(
        4, Training(8), Pins(tp=4), [1, 2], _blocks()
    )
    with pytest.raises(UserInputError, match="--ep 2: the model has no mixture-of-experts"):
        _cands(_graph(), Pins(ep=2))


def test_search_tries_without_context_parallelism_first(monkeypatch):
    calls = []
    found = {}

    def space(graph, blocks, cluster, training, pins, variants_of, progress, memo):
        calls.append((graph, blocks, cluster, training, pins, variants_of, progress, memo))
        return SimpleNamespace(best=found.get(pins.cp))

    monkeypatch.setattr(driver, "search_space", space)
    # "g" computes its attention with fused ops over 128 positions, "h" with none
    monkeypatch.setattr(driver, "attention_sequence", lambda graph: {"g": 128, "h": 0}[graph])
    memo, pins = SearchMemo(), Pins(tp=2)
    found[1] = "one"
    res = search("g", "b", "c", "t", pins, "v", "p", memo)
    assert res.best == "one" and len(calls) == 1
    assert calls[0] == ("g", "b", "c", "t", replace(pins, cp=1), "v", "p", memo)
    del found[1]
    found[None] = "any"
    calls.clear()
    assert search("g", "b", "c", "t", pins, "v", "p", memo).best == "any"
    assert calls == [
        ("g", "b", "c", "t", replace(pins, cp=1), "v", "p", memo),
        ("g", "b", "c", "t", pins, "v", "p", memo),
    ]
    calls.clear()
    search("g", "b", "c", "t", Pins(cp=4), "v")  # a pinned degree: at once
    assert [call[4] for call in calls] == [Pins(cp=4)]
    assert isinstance(calls[0][7], SearchMemo) and calls[0][6] is None
    calls.clear()
    search("h", "b", "c", "t", pins, "v", "p", memo)  # no attention: one search
    assert calls == [("h", "b", "c", "t", pins, "v", "p", memo)]
    calls.clear()
    search("h", "b", "c", "t", pins, "v")
    assert calls[0][7] is not memo


def test_prepare_enumerates_what_the_first_search_would(monkeypatch):
    asked = []

    def cands(graph, blocks, cluster, training, pins, variants_of):
        asked.append((graph, blocks, cluster, training, pins, variants_of))
        if pins.tp == 3:
            raise UserInputError("no")
        return []

    monkeypatch.setattr(driver, "_candidates", cands)
    monkeypatch.setattr(driver, "attention_sequence", lambda graph: graph)
    assert driver.prepare(128, "b", "c", "t", Pins(), "v") is True
    assert asked[-1] == (128, "b", "c", "t", Pins(cp=1), "v")
    assert driver.prepare(0, "b", "c", "t", Pins(), "v") is True
    assert asked[-1][4] == Pins()
    assert driver.prepare(128, "b", "c", "t", Pins(cp=2), "v") is True
    assert asked[-1][4] == Pins(cp=2)
    assert driver.prepare(0, "b", "c", "t", Pins(tp=3), "v") is False


# ------------------------------------------------------------------ the simpler options


def _simpler_inputs(capacity_gib: float, gpus: int = 1):
    """Three blocks, each with the same six options: none, selective and full recompute (the
    same time, less memory each), the optimizer or the weights offloaded (slower), and a
    sharded variant without recompute that needs the least memory of all."""
    opts = [
        make_option(1e-3, 1e7, 1 * GIB),
        make_option(1e-3, 1e7, 0.5 * GIB, recompute="selective"),
        make_option(1e-3, 1e7, 0.1 * GIB, recompute="full"),
        make_option(1e-3, 1e7, 1 * GIB, offload="optimizer"),
        make_option(1e-3, 1e7, 0.1 * GIB, recompute="full", offload="optimizer"),
        replace(make_option(1e-3, 1e7, 0.01 * GIB), variant="colwise"),
    ]
    blocks = [make_block(i, "A", 10**7) for i in range(3)]
    cl = cluster_of(gpus, memory_bytes=capacity_gib * GIB, reserved_bytes=0)
    return CostInputs(blocks, [opts] * 3, 1, cl, Training(4))


def _placed(inp, choice, zero=0, stage_of=None, pp=1):
    c = Candidate(pp, 1, 1, 1, "1f1b", 1, zero)
    stage_of = [0] * len(choice) if stage_of is None else list(stage_of)
    c.config = Config(c.mesh, 1, "1f1b", 1, zero, stage_of, list(choice))
    c.cost = evaluate(inp, c.config)
    return c


def _peak(inp, choice, zero=0):
    return _placed(inp, choice, zero).cost.peak_memory_bytes / GIB


def test_simpler_options_by_group_least_recompute_that_fits_first():
    # [0, 0, 0] needs 3.5 GiB, [1, 1, 0] 2.5: a capacity between the two
    probe = _simpler_inputs(100)
    assert _peak(probe, [1, 1, 0]) < 2.8 < _peak(probe, [0, 0, 0])
    inp = _simpler_inputs(2.8)
    c = _placed(inp, [2, 2, 1])
    before = c.cost.step_time_s
    prefer_simpler(inp, c)
    # block 2 (its own group, selective) drops recompute; blocks 0 and 1 (full) cannot both
    # drop it, and fall back to selective; never the sharded variant or an offload
    assert c.config.choice == [1, 1, 0]
    assert c.cost.step_time_s == before
    assert c.cost == evaluate(inp, c.config)
    assert (c.config.mesh, c.config.micro_batch_size, c.config.schedule) == (c.mesh, 1, "1f1b")
    assert (c.config.virtual_stages, c.config.zero_stage, c.config.stage_of) == (1, 0, [0, 0, 0])
    roomy = _simpler_inputs(100)
    c = _placed(roomy, [2, 2, 1])
    prefer_simpler(roomy, c)
    assert c.config.choice == [0, 0, 0]


def test_simpler_options_drop_offloads_and_group_by_stage():
    inp = _simpler_inputs(100)
    # full recompute with the optimizer offloaded: the plain option is faster and simpler
    c = _placed(inp, [4, 4, 4])
    prefer_simpler(inp, c)
    assert c.config.choice == [0, 0, 0]
    # the optimizer offloaded alone: none is simpler and faster
    c = _placed(inp, [3, 3, 3], zero=3)
    prefer_simpler(inp, c)
    assert c.config.choice == [0, 0, 0]
    # a group per stage: the two stages' blocks change apart (the second stage's two blocks
    # only together)
    inp = _simpler_inputs(100, gpus=2)
    c = _placed(inp, [2, 2, 2], stage_of=(0, 1, 1), pp=2)
    prefer_simpler(inp, c)
    assert c.config.choice == [0, 0, 0] and c.config.stage_of == [0, 1, 1]


def test_a_slower_simpler_option_is_not_taken():
    slow_plain = [make_option(2e-3, 1e7, 1 * GIB), make_option(1e-3, 1e7, 0.1 * GIB,
                                                                recompute="full")]  # fmt: skip
    blocks = [make_block(i, "A", 10**7) for i in range(2)]
    inp = CostInputs(blocks, [slow_plain] * 2, 1, cluster_of(1), Training(4))
    c = _placed(inp, [1, 1])
    prefer_simpler(inp, c)
    assert c.config.choice == [1, 1]
    # a plain option exactly as fast is taken (no slower)
    same = [make_option(1e-3, 1e7, 1 * GIB), slow_plain[1]]
    inp = CostInputs(blocks, [same] * 2, 1, cluster_of(1), Training(4))
    c = _placed(inp, [1, 1])
    prefer_simpler(inp, c)
    assert c.config.choice == [0, 0]


def test_a_placement_kept_in_the_memo_is_read_back_not_tried_again(monkeypatch):
    inp = _simpler_inputs(2.8)
    kept = BoundMemo()
    first = _placed(inp, [2, 2, 1])
    prefer_simpler(inp, first, kept)
    assert first.config.choice == [1, 1, 0] and kept.added == 1
    tried = []
    monkeypatch.setattr(driver, "_prefer_simpler", lambda *a: tried.append(a) or [9])
    again = _placed(inp, [2, 2, 1])
    prefer_simpler(inp, again, kept)
    assert tried == []
    assert again.config.choice == [1, 1, 0]
    assert again.cost == evaluate(inp, again.config) == first.cost
    # a memo whose choice is the placement's own: nothing evaluated again
    same = _placed(inp, [1, 1, 0])
    cost = same.cost
    monkeypatch.setattr(driver, "_prefer_simpler", lambda inp, cand: cand.config.choice)
    prefer_simpler(inp, same, kept)
    assert same.cost is cost
