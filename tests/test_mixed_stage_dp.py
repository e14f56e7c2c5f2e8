"""A DP degree per pipeline stage in the heterogeneous search, on a real model: one fast CPU
rank and two slow ones (``test_mixed_plan.half_profile``: half the fp32 peak, half the memory),
as in test_mixed_stage_tp but with the DP degree free. The fastest pipeline gives the slow kind
one stage of two replicas, each running half the step's micro-batches in turns, and the fast
rank one stage of one replica (``Mesh.stage_dp`` (2, 1), GPipe: the runtime's schedule for
stages of different DP degrees). Checks: it beats either kind alone and the best plan of one
replica a stage (TP 2 / 1), its step is the MILP's optimum and the brute force's over every
(kind, TP, DP) per stage, split and option choice of its cell, the pruned search equals every
cell solved with no bound above its cell's optimum, the file records each stage's DP degree,
ranks and kinds, and the plan trains under torchrun as one process does."""

from __future__ import annotations

import json
import math

import pytest
from test_mixed_milp import brute_force
from test_mixed_plan import LINK, certified, trains_like_one_process
from test_mixed_stage_tp import COMMON, plan_stage_tp

from planner.schema import load_plan, write_plan
from planner.search import Pins
from planner.search.mixed import search as mixed
from planner.search.mixed.cost import step_time
from planner.search.mixed.milp import solve_mixed
from planner.search.mixed.search import (
    TP_DEGREES,
    cell_variants,
    dp_multiples,
    mixed_problem,
    stage_variants,
)

FREE = Pins(offload="none")  # the DP degree left to the search


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stage_dp")
    return plan_stage_tp(tmp, pins=FREE), tmp


def test_the_plan_certifies_the_step_it_reports(searched):
    certified(searched[0])


def test_stage_dp_degrees_differ_and_beat_one_replica_a_stage(searched):
    res, tmp = searched
    plan = res.plan
    assert plan is not None, f"no mixed plan beat {res.single}"
    assert plan.solver.status == "optimal" and res.search.proven
    assert plan.mesh.stage_dp == (2, 1) and plan.mesh.dp == 2 and plan.mesh.stage_tp is None
    assert plan.schedule == "gpipe"
    assert [st.kind for st in plan.stages] == ["slow", "fast"]
    assert plan.predicted.step_time_s < min(res.single.values())
    # one replica a stage (DP pinned to 1): the slow pair can only take TP 2, which is slower
    one = plan_stage_tp(tmp)
    assert one.plan.mesh.stage_tp == (2, 1) and one.plan.mesh.stage_dp is None
    assert plan.predicted.step_time_s < one.plan.predicted.step_time_s
    # each replica of stage j runs n / dp_j of the step's n micro-batches, all in flight
    n = COMMON["global_batch_size"] // plan.micro_batch_size
    assert [st.inflight_microbatches for st in plan.stages] == [n // 2, n]
    assert plan.num_microbatches == n // plan.mesh.dp


def test_step_is_the_cells_brute_force_optimum(searched):
    """The plan's step is its placement priced directly, the MILP's optimum of its cell, and
    the brute force's over every (kind, TP, DP) per stage, split and option choice of it."""
    res, _ = searched
    best = res.search.best
    mp, sol = best.problem, best.solution
    assert best.dp_top == 2 and sol.dps == [2, 1] and mp.dp_needs == [1, 2]
    assert step_time(mp, sol.variants, sol.counts) == pytest.approx(res.plan.predicted.step_time_s)
    c, (lo, hi), top = best.cand, best.degrees, best.dp_top
    allowed = stage_variants(res.search.kinds, c.dp, list(TP_DEGREES), dp_multiples(top))
    vs = cell_variants(allowed, lo, hi, top)
    assert {r for _, _, r in vs} == {1, 2}
    ins = [res.search.inputs[k, t, c.micro_batch_size] for k, t, _ in vs]
    links = {(0, 1): LINK, (1, 0): LINK}
    fresh = mixed_problem(ins, c, vs, res.search.kinds, links, [lo, hi], dp_needs=[1, top])
    assert brute_force(fresh) == pytest.approx(solve_mixed(fresh).objective, rel=2e-4)
    assert solve_mixed(fresh).objective == pytest.approx(sol.objective, rel=2e-4)


def test_pruned_search_equals_every_cell_solved(searched, monkeypatch):
    """With pruning off every cell of every outer candidate, DP multiples included, is built
    and solved: the least of them is the plan the pruned search returned, and no cell's bound
    (floors, split bound, pipeline floor, each with its variants' own micro-batch counts) is
    above that cell's MILP optimum."""
    res, tmp = searched
    monkeypatch.setattr(mixed, "REL_TOL", -1e12)
    every = plan_stage_tp(tmp, pins=FREE, stage_degrees=True)
    solved = [mc for mc in every.search.candidates if mc.status == "solved"]
    for mc in every.search.candidates:
        assert mc.status in ("solved", "pruned-memory") or math.isinf(mc.bound), mc.status
    assert {mc.dp_top for mc in solved} == {1, 2}
    best = min(mc.value for mc in solved)
    assert best == pytest.approx(res.plan.predicted.step_time_s, rel=1e-6)
    for mc in solved:
        assert mc.bound <= mc.value * (1 + 1e-9), (mc.label(), mc.bound, mc.value)
    assert any("dp1..2" in mc.label() for mc in solved)


def test_stage_dp_is_searched_by_default_on_small_pools_only(searched, monkeypatch):
    """By default stages of their own DP degree are searched on pools of at most
    STAGE_DP_GPUS GPUs (this one holds 3); on a larger pool they are left, the search keeps
    each stage's own TP degree, and a note says what was not searched and how to search it."""
    res, tmp = searched
    assert not res.search.skipped and res.notes == []
    monkeypatch.setattr(mixed, "STAGE_DP_GPUS", 2)
    left = plan_stage_tp(tmp, pins=FREE)
    assert left.search.skipped and all(mc.dp_top == 1 for mc in left.search.candidates)
    assert "one DP degree here" in left.notes[-1] and "--stage-degrees on" in left.notes[-1]
    assert left.plan.mesh.stage_tp == (2, 1) and left.plan.mesh.stage_dp is None
    forced = plan_stage_tp(tmp, pins=FREE, stage_degrees=True)
    assert forced.plan.mesh.stage_dp == (2, 1) and not forced.search.skipped


def test_stage_dp_is_left_when_stage_degrees_are_off(searched):
    """``stage_degrees`` False keeps every stage at one DP degree as well as one TP degree."""
    res, tmp = searched
    never = plan_stage_tp(tmp, pins=FREE, stage_degrees=False)
    assert all(mc.dp_top == 1 for mc in never.search.candidates)
    assert never.plan is None or never.plan.mesh.stage_dp is None


def test_plan_file_records_each_stages_dp_degree(searched, tmp_path):
    res, _ = searched
    path = write_plan(res.plan, tmp_path / "plan")
    data = json.loads(path.read_text())
    assert data["mesh"]["stage_dp"] == [2, 1] and "stage_tp" not in data["mesh"]
    assert [st["ranks"] for st in data["stages"]] == [[0, 1], [2]]
    assert data["rank_kinds"] == ["slow", "slow", "fast"]
    assert {k["name"]: k["gpus"] for k in data["kinds"]} == {"slow": 2, "fast": 1}
    assert load_plan(path).to_dict() == data


@pytest.mark.distributed
@pytest.mark.long  # a torchrun launch of its own (about a minute): CI runs it after the suite
def test_runtime_trains_the_searched_dp_degrees_like_one_process(searched, tmp_path):
    """The plan the search chose (stage 0 on the two slow ranks as two replicas, stage 1 on
    the fast rank) runs under torchrun as written: every step's loss and the final parameters
    equal one process training the same model."""
    res, _ = searched
    trains_like_one_process(res.plan, tmp_path / "run", 3, 3)
