"""The stage MILP's solve (planner/search/milp/solve.py), written for its generated mutants
(docs/mutation.md).

Real solves of test_mutant_kills_milp_rows' small problems against the least price over every
contiguous placement (that file's reference, priced from milp.solve's docstring); then every
branch of the status logic fed HiGHS runs written here through the run store (a store is read
instead of solving, milp.runs): a node limit with a placement, without one, a bound that clears
the cutoff, a placement at or above it, an optimum without a bound. Each outcome's status,
objective, placement, bound and node count are checked.
"""

from __future__ import annotations

import math
from dataclasses import replace

import highspy
import numpy as np
import pytest
from test_mutant_kills_milp_rows import NO_CUTS, _problem, _ranges, reference

from planner.search.milp.data import GIB
from planner.search.milp.rows import stage_model
from planner.search.milp.runs import HighsRun, RunStore
from planner.search.milp.solve import MIP_REL_GAP, _highs, solve_stage_milp
from planner.search.milp.split_bound import SplitBound, split_bound

ALL = [[0, 1]] * 3


@pytest.fixture(autouse=True)
def _own_highs_scheduler():
    """mutmut forks a child per mutant from the process that ran the clean tests; HiGHS's task
    scheduler's threads do not come with a fork (planner/search/overlap.py), and a MILP there
    would wait on them forever: each test starts HiGHS's scheduler afresh."""
    highspy.Highs.resetGlobalScheduler(False)


def _least(sp) -> float:
    return min(reference(sp, n, NO_CUTS, ALL) for n in _ranges(sp))


def _price(sp, counts) -> float:
    return reference(sp, np.array([sum(c, []) for c in counts], float), NO_CUTS, ALL)


class Store(RunStore):
    """A run store in memory: records each key asked for and what was saved; ``given``
    answers loads (None: solve)."""

    def __init__(self, given: HighsRun | None = None) -> None:
        super().__init__(folder=None)
        self.given, self.asked, self.saved = given, [], {}

    def load(self, key):
        self.asked.append(key)
        return self.given

    def save(self, key, run):
        self.saved[key] = run


@pytest.mark.parametrize(
    "kw",
    [
        dict(capacity=4.0),
        dict(capacity=3.25),
        dict(pp=2, v=2, m=4, seg_len=(1, 3, 1), capacity=5.0),
    ],
)
def test_the_optimum_is_the_least_placement(kw):
    sp = _problem(**kw)
    sol = solve_stage_milp(sp)
    want = _least(sp)
    assert sol.status == "optimal"
    assert sol.objective == pytest.approx(want, rel=1e-9)
    assert _price(sp, sol.counts) == pytest.approx(sol.objective, rel=1e-12)
    assert want * (1 - MIP_REL_GAP) <= sol.dual_bound <= sol.objective * (1 + 1e-12)
    assert sol.nodes >= 0 and sol.solve_time_s > 0


def test_a_cutoff_below_the_optimum_is_proven_and_above_it_changes_nothing():
    sp = _problem(capacity=3.25)
    best = _least(sp)
    low = solve_stage_milp(sp, cutoff=best * 0.95)
    assert (low.status, low.objective, low.counts) == ("cutoff", math.inf, [])
    high = solve_stage_milp(sp, cutoff=best * 1.5)
    assert high.status == "optimal" and high.objective == pytest.approx(best, rel=1e-9)
    inf = solve_stage_milp(sp, cutoff=math.inf)  # no incumbent yet: as without a cutoff
    assert inf.status == "optimal" and inf.objective == pytest.approx(best, rel=1e-9)


def test_no_placement_is_infeasible_whatever_refuses_it():
    # a segment without an allowed option: refused before any solve
    none = _problem(allowed=[np.array([1, 1]), np.array([0, 0]), np.array([1, 1])])
    sol = solve_stage_milp(none)
    assert (sol.status, sol.objective, sol.counts, sol.solve_time_s) == (
        "infeasible", math.inf, [], 0.0,
    )  # fmt: skip
    # no split fits the device: split_bound says so, HiGHS is not asked
    store = Store()
    sol = solve_stage_milp(_problem(capacity=1.0), runs=store)
    assert (sol.status, sol.objective, sol.solve_time_s) == ("infeasible", math.inf, 0.0)
    assert sol.counts == []
    assert store.asked == []
    # a split fits the device but no placement the host (split_bound leaves host memory out):
    # HiGHS proves it; with an incumbent's cutoff that reads "nothing beats it"
    tight = _problem(capacity=4.0, host_capacity=0.01 * GIB)
    assert split_bound(tight).feasible
    sol = solve_stage_milp(tight)
    assert (sol.status, sol.objective, sol.counts) == ("infeasible", math.inf, [])
    assert solve_stage_milp(tight, cutoff=100.0).status == "cutoff"


def test_a_given_split_bound_is_used_instead_of_computing_it():
    sp = _problem(capacity=4.0)
    best = _least(sp)
    # T* above every placement's max stage: the model's tmax is lifted, and so the objective
    # by (m - 1) (T* - max T_j) of the best placement under it
    lifted = solve_stage_milp(sp, split=SplitBound(10.0, 0.0, math.inf))
    assert lifted.status == "optimal" and lifted.objective > best + 1.0
    assert solve_stage_milp(sp, split=SplitBound(math.inf, 0.0)).status == "infeasible"


def _crafted(sp, **fields) -> tuple:
    """The model's real optimal run (x and all), then the store answering ``fields`` over it."""
    store = Store()
    sol = solve_stage_milp(sp, runs=store)
    (run,) = store.saved.values()
    return sol, run, Store(replace(run, **fields))


def test_a_run_read_back_is_what_solving_returned():
    sp = _problem(capacity=3.25)
    sol, run, store = _crafted(sp)
    again = solve_stage_milp(sp, runs=store)
    assert (again.status, again.objective, again.counts, again.dual_bound, again.nodes) == (
        sol.status, sol.objective, sol.counts, sol.dual_bound, sol.nodes,
    )  # fmt: skip
    assert store.saved == {}  # read, not solved again
    assert run.model_status == "optimal" and run.primal_feasible


def test_the_key_changes_with_every_input_and_option():
    """Each run is kept under a key of what HiGHS is given: the model's arrays, the node
    limit and the cutoff (a run of one must not answer another)."""
    base = _problem(capacity=3.25)
    keys = []
    for sp, kw in [
        (base, {}),
        (base, {"node_limit": 7}),
        (base, {"cutoff": 30.0}),
        (base, {"cutoff": 31.0}),
        (_problem(capacity=3.25, const_step=0.5), {}),  # the objective's constant
        (_problem(capacity=3.5), {}),  # a row bound
        (_problem(capacity=3.25, m=4), {}),  # objective costs
        (base, {"split": SplitBound(3.0, 0.0, math.inf)}),  # a column bound
    ]:
        store = Store()
        solve_stage_milp(sp, runs=store, **kw)
        assert len(store.asked) == 1 and list(store.saved) == store.asked
        keys.append(store.asked[0])
    assert len(set(keys)) == len(keys)


def test_a_node_limit_with_a_placement_returns_it_with_the_bound_proven():
    sp = _problem(capacity=3.25)
    sol, run, store = _crafted(sp, model_status="other", dual_bound=1.0, nodes=17)
    got = solve_stage_milp(sp, runs=store)
    assert got.status == "node_limit"
    assert got.objective == pytest.approx(sol.objective, rel=1e-12)
    assert got.counts == sol.counts and got.dual_bound == 1.0 and got.nodes == 17
    # with a cutoff above it (the bound below the cutoff), still the placement
    above = solve_stage_milp(sp, cutoff=sol.objective * 2, runs=store)
    assert above.status == "node_limit" and above.objective == got.objective
    # a cutoff the placement does not beat, the bound below it: nothing proven either way
    at = solve_stage_milp(sp, cutoff=sol.objective, runs=store)
    assert (at.status, at.objective, at.counts, at.dual_bound, at.nodes) == (
        "no_solution", math.inf, [], 1.0, 17,
    )  # fmt: skip


def test_a_node_limit_whose_bound_clears_the_cutoff_is_a_proven_cutoff():
    sp = _problem(capacity=3.25)
    sol, run, store = _crafted(sp, model_status="other", dual_bound=40.0, nodes=5)
    got = solve_stage_milp(sp, cutoff=40.0, runs=store)  # bound == cutoff: proven
    assert (got.status, got.objective, got.counts, got.dual_bound, got.nodes) == (
        "cutoff", math.inf, [], 40.0, 5,
    )  # fmt: skip
    # without a placement, the same
    _, _, bare = _crafted(
        sp, model_status="other", dual_bound=40.0, nodes=5, primal_feasible=False, x=[]
    )
    assert solve_stage_milp(sp, cutoff=39.0, runs=bare).status == "cutoff"
    # a bound below the cutoff and no placement: unresolved, with the bound it proved
    got = solve_stage_milp(sp, cutoff=41.0, runs=bare)
    assert (got.status, got.objective, got.counts, got.dual_bound, got.nodes) == (
        "no_solution", math.inf, [], 40.0, 5,
    )  # fmt: skip
    # an infinite bound proves nothing
    _, _, nothing = _crafted(
        sp, model_status="other", dual_bound=math.inf, nodes=5, primal_feasible=False, x=[]
    )
    assert solve_stage_milp(sp, cutoff=41.0, runs=nothing).status == "no_solution"


def test_an_optimum_at_or_above_the_cutoff_proves_the_cutoff():
    sp = _problem(capacity=3.25)
    sol, run, store = _crafted(sp, nodes=9)
    got = solve_stage_milp(sp, cutoff=sol.objective, runs=store)
    assert (got.status, got.objective, got.counts, got.dual_bound, got.nodes) == (
        "cutoff", math.inf, [], run.dual_bound, 9,
    )  # fmt: skip
    # finished without any placement: nothing under the cutoff (or none at all)
    _, _, empty = _crafted(sp, primal_feasible=False, x=[], nodes=3)
    got = solve_stage_milp(sp, cutoff=50.0, runs=empty)
    assert (got.status, got.objective, got.nodes, got.counts) == ("cutoff", math.inf, 3, [])
    assert solve_stage_milp(sp, runs=empty).status == "infeasible"
    # HiGHS's infeasible: the cutoff's word with one, with the nodes it spent
    _, _, proven = _crafted(sp, model_status="infeasible", primal_feasible=False, x=[], nodes=4)
    got = solve_stage_milp(sp, runs=proven)
    assert (got.status, got.objective, got.nodes) == ("infeasible", math.inf, 4)
    assert solve_stage_milp(sp, cutoff=50.0, runs=proven).status == "cutoff"


def test_an_optimum_without_a_bound_is_its_own_bound():
    sp = _problem(capacity=3.25)
    sol, run, store = _crafted(sp, dual_bound=math.nan)
    got = solve_stage_milp(sp, runs=store)
    assert got.status == "optimal" and got.dual_bound == got.objective == sol.objective
    _, _, finite = _crafted(sp, dual_bound=12.5)
    assert solve_stage_milp(sp, runs=finite).dual_bound == 12.5


def test_highs_is_told_the_node_limit_the_gaps_and_the_cutoff():
    sp = _problem(capacity=3.25)
    model = stage_model(sp, ALL, NO_CUTS)
    h = _highs(model, 123, 45.5)
    assert h.getOptionValue("mip_max_nodes")[1] == 123
    assert h.getOptionValue("mip_rel_gap")[1] == MIP_REL_GAP == 1e-4
    assert h.getOptionValue("mip_abs_gap")[1] == 1e-12
    assert h.getOptionValue("objective_bound")[1] == 45.5
    assert h.getNumCol() == model.layout.columns and h.getNumRow() == len(model.row_lower)
    assert _highs(model, 5, None).getOptionValue("objective_bound")[1] == math.inf
    # its model is the one given: solving it gives the model's optimum, offset included
    h.setOptionValue("objective_bound", math.inf)
    h.run()
    assert h.getInfo().objective_function_value == pytest.approx(_least(sp), rel=1e-9)


def test_every_outcome_reports_the_seconds_it_spent():
    sp = _problem(capacity=3.25)
    best = _least(sp)
    outcomes = [
        solve_stage_milp(sp, cutoff=best * 0.95),
        solve_stage_milp(_problem(capacity=4.0, host_capacity=0.01 * GIB)),
    ]
    for fields, cutoff in [
        (dict(model_status="other", dual_bound=1.0), None),  # node limit
        (dict(model_status="other", dual_bound=1.0), best),  # no solution under the cutoff
        (dict(model_status="other", dual_bound=40.0), 40.0),  # proven cutoff
        (dict(model_status="other", primal_feasible=False, x=[]), 41.0),  # no solution
        (dict(), best),  # an optimum at the cutoff
        (dict(primal_feasible=False, x=[]), 50.0),  # finished without a placement
    ]:
        outcomes.append(solve_stage_milp(sp, cutoff=cutoff, runs=_crafted(sp, **fields)[2]))
    assert len({o.status for o in outcomes}) == 4
    for o in outcomes:
        assert type(o.solve_time_s) is float and 0.0 < o.solve_time_s < 60.0, o


def test_highs_is_handed_the_cutoff_only_when_there_is_one(monkeypatch):
    from planner.search.milp import solve

    handed = []
    real = solve._highs
    monkeypatch.setattr(solve, "_highs", lambda m, n, c: handed.append((n, c)) or real(m, n, c))
    sp = _problem(capacity=3.25)
    solve_stage_milp(sp, node_limit=77, cutoff=30.0)
    solve_stage_milp(sp, node_limit=78, cutoff=math.inf)
    solve_stage_milp(sp, node_limit=79)
    assert handed == [(77, 30.0), (78, None), (79, None)]
