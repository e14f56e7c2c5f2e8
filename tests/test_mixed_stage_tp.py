"""A TP degree per pipeline stage in the heterogeneous search, on a real model: one fast CPU
rank and two slow ones (``test_mixed_plan.half_profile``: half the fp32 peak, half the memory),
every stage pinned to one replica (``Pins.dp`` 1: test_mixed_stage_dp gives the slow kind's
two ranks to DP instead). The fastest pipeline gives the slow kind one stage at TP 2 and the
fast rank one at TP 1, which no plan of one degree for all stages can: the fast kind holds one
rank. Checks: the plan is
faster than either kind alone and than the best mixed plan of one degree (searched with the
cutoff off), its step is the MILP's optimum and the brute force's over every variant, split and
option choice of its cell, and its file records the degrees (``Mesh.stage_tp``), ranks and
kinds stage by stage.

``stage_tp_plan`` writes that plan.json for the runtime's tests (3 ranks, stage_tp (2, 1))."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_mixed_milp import brute_force
from test_mixed_plan import LINK, MODEL, certified, half_profile, trains_like_one_process

from planner.cost.pipeline import hop_time
from planner.hardware.collectives import p2p_time
from planner.resources.mixed_plan import KindSpec, MixedPlanResult, plan_mixed
from planner.schema import load_plan, write_plan
from planner.schema.mesh import Mesh
from planner.search import Pins
from planner.search.mixed import search as mixed
from planner.search.mixed.cost import step_time
from planner.search.mixed.milp import solve_mixed
from planner.search.mixed.search import TP_DEGREES, cell_variants, mixed_problem, stage_variants

ARGS = {"size": "tiny", "layers": 2, "hidden": 512, "seq_len": 128}
COMMON = dict(model_args=ARGS, global_batch_size=8, dtype="fp32", optimizer="sgd", lr=0.5)


def kinds_of(tmp: Path) -> list[KindSpec]:
    """One rank of profiles/cpu.toml, two of a copy with half its fp32 peak and memory."""
    return [KindSpec("fast", "cpu", 1), KindSpec("slow", half_profile(tmp), 2)]


def plan_stage_tp(tmp: Path, **kwargs) -> MixedPlanResult:
    """The mixed search over the two kinds, one replica a stage (``kwargs``: plan_mixed's,
    e.g. pins, single)."""
    kwargs.setdefault("pins", Pins(offload="none", dp=1))
    return plan_mixed(MODEL, kinds_of(tmp), {("fast", "slow"): LINK}, **COMMON, **kwargs)


def stage_tp_plan(out_dir: Path, tmp: Path) -> Path:
    """plan.json of the gpt example (2 layers, hidden 512) over 3 CPU ranks: stage 0 on the
    two slow ranks at TP 2, stage 1 on the fast rank at TP 1 (``Mesh.stage_tp`` (2, 1)).
    ``tmp``: where the slow kind's profile is written."""
    res = plan_stage_tp(tmp)
    assert res.plan is not None and res.plan.mesh.stage_tp == (2, 1), res.plan
    return write_plan(res.plan, out_dir)


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stage_tp")
    return plan_stage_tp(tmp), tmp


def test_the_plan_certifies_the_step_it_reports(searched):
    certified(searched[0])


def test_stage_degrees_differ_and_beat_one_degree_for_all(searched):
    res, tmp = searched
    plan = res.plan
    assert plan is not None, f"no mixed plan beat {res.single}"
    assert plan.solver.status == "optimal" and res.search.proven
    assert plan.mesh.stage_tp == (2, 1) and plan.mesh.tp == 2 and plan.mesh.dp == 1
    assert [st.kind for st in plan.stages] == ["slow", "fast"]
    assert plan.predicted.step_time_s < min(res.single.values())
    # The best mixed plan of one degree, the cutoff off (every kind alone priced at inf): at
    # TP 1 the slow ranks hold a stage each; TP 2 is out, the fast kind has one rank.
    off = {"fast": math.inf, "slow": math.inf}
    one = plan_stage_tp(tmp, pins=Pins(offload="none", tp=1, dp=1), single=off).plan
    assert one is not None and one.mesh.stage_tp is None and one.mesh.tp == 1
    assert plan.predicted.step_time_s < one.predicted.step_time_s * 0.95
    assert plan_stage_tp(tmp, pins=Pins(offload="none", tp=2, dp=1), single=off).plan is None


def test_pruned_search_equals_every_cell_solved(searched, monkeypatch):
    """With pruning off (REL_TOL so negative that no bound prunes and no MILP has a cutoff)
    every cell of every outer candidate is built and solved: the least of them is the plan
    the pruned search returned, and no cell's bound, as it stood when its MILP ran, is above
    that MILP's optimum (the floors, the split bound and the pipeline floor on real numbers)."""
    res, tmp = searched
    monkeypatch.setattr(mixed, "REL_TOL", -1e12)
    every = plan_stage_tp(tmp, stage_degrees=True)
    solved = [mc for mc in every.search.candidates if mc.status == "solved"]
    for mc in every.search.candidates:  # pruned only where nothing fits (an infinite bound)
        assert mc.status in ("solved", "pruned-memory") or math.isinf(mc.bound), mc.status
    # TP 2 alone is the slow kind's only: a cell of one kind is no mixed pipeline
    assert {mc.degrees for mc in solved} == {(1, 1), (1, 2)}
    best = min(mc.value for mc in solved)
    assert best == pytest.approx(res.plan.predicted.step_time_s, rel=1e-6)
    for mc in solved:
        assert mc.bound <= mc.value * (1 + 1e-9), (mc.label(), mc.bound, mc.value)


def test_stage_degrees_are_searched_by_default_on_small_pools(searched, monkeypatch):
    """By default (None) the cells of several degrees are searched on pools of at most
    STAGE_DEGREE_KINDS kinds and STAGE_DEGREE_GPUS GPUs, as this one; on a larger pool they are
    left, the plan is the best of one degree for all stages and a note says what was not
    searched and how to search it; True searches them whatever the pool, False never (and
    says nothing: the user chose)."""
    res, tmp = searched
    assert not res.search.skipped and res.notes == []
    monkeypatch.setattr(mixed, "STAGE_DEGREE_GPUS", 2)  # the pool holds 3
    left = plan_stage_tp(tmp)
    assert left.search.skipped and "2 kinds, 3 GPUs" in left.notes[-1]
    assert "--stage-degrees on" in left.notes[-1]
    assert left.plan is None  # no plan of one degree for all stages beats the fast rank alone
    assert all(mc.degrees[0] == mc.degrees[1] for mc in left.search.candidates)
    forced = plan_stage_tp(tmp, stage_degrees=True)
    assert forced.plan.mesh.stage_tp == (2, 1) and not forced.search.skipped
    assert forced.plan.predicted.step_time_s == res.plan.predicted.step_time_s
    monkeypatch.undo()
    never = plan_stage_tp(tmp, stage_degrees=False)
    assert never.plan is None and not never.search.skipped and never.notes == []


def test_step_is_the_cells_brute_force_optimum(searched):
    """The plan's step is its placement priced directly, the MILP's optimum of its cell, and
    the brute force's over every (kind, degree) per stage, split and option choice of it."""
    res, _ = searched
    best = res.search.best
    mp, sol = best.problem, best.solution
    assert sol.tps == [2, 1] and mp.needs == [1, 2]
    assert step_time(mp, sol.variants, sol.counts) == pytest.approx(res.plan.predicted.step_time_s)
    c, (lo, hi) = best.cand, best.degrees
    vs = cell_variants(stage_variants(res.search.kinds, c.dp, list(TP_DEGREES)), lo, hi)
    ins = [res.search.inputs[k, t, c.micro_batch_size] for k, t, _ in vs]
    fresh = mixed_problem(ins, c, vs, res.search.kinds, {(0, 1): LINK, (1, 0): LINK}, [lo, hi])
    assert brute_force(fresh) == pytest.approx(solve_mixed(fresh).objective, rel=2e-4)
    assert solve_mixed(fresh).objective == pytest.approx(sol.objective, rel=2e-4)


def test_plan_file_records_each_stages_degree(searched, tmp_path):
    res, tmp = searched
    path = stage_tp_plan(tmp_path / "plan", tmp)
    data = json.loads(path.read_text())
    assert data["mesh"]["stage_tp"] == [2, 1] and data["mesh"]["tp"] == 2
    assert [st["ranks"] for st in data["stages"]] == [[0, 1], [2]]
    assert data["rank_kinds"] == ["slow", "slow", "fast"]
    assert {k["name"]: k["gpus"] for k in data["kinds"]} == {"slow": 2, "fast": 1}
    assert data["cluster"]["gpus"] == 3
    assert load_plan(path).to_dict() == data
    # each stage's blocks carry their own degree's sharding: the TP 2 stage's layer is split
    # (Megatron's column/row pairs), the TP 1 stage's blocks are whole
    rows = {b["name"]: b for b in data["blocks"]}
    assert rows["layers.0"]["stage"] == 0 and rows["layers.0"]["tp_variant"].startswith("tp2")
    assert rows["layers.0"]["tp_plan"]["layers.0.mlp.fc1"] == "colwise"
    assert all(not b["tp_plan"] for b in data["blocks"] if b["stage"] == 1)


@pytest.mark.distributed
@pytest.mark.long  # a torchrun launch of its own (about a minute): CI runs it after the suite
def test_runtime_trains_the_searched_degrees_like_one_process(searched, tmp_path):
    """The plan the search chose (stage 0 on the two slow ranks at TP 2, stage 1 on the fast
    rank at TP 1) runs under torchrun as written: every step's loss and the final parameters
    equal one process training the same model."""
    res, _ = searched
    trains_like_one_process(res.plan, tmp_path / "run", 3, 3)


@pytest.mark.parametrize(
    "t, u", [(1, 1), (4, 4), (1, 2), (2, 1), (2, 8), (8, 2), (1, 8), (2, 3), (3, 2), (4, 6), (6, 4)]
)
def test_hop_prices_the_copies_the_runtime_sends(t, u):
    """A hop between stages of TP degrees t and u costs what the runtime's routing
    (``Mesh.neighbours``) sends over the busiest rank's link: forward, the most copies of the
    whole activation one rank of the first stage sends, in one transfer; backward, the same
    with the stages' roles swapped (gradients go back along the same links)."""
    mesh = Mesh(2, 1, t) if t == u else Mesh(2, 1, max(t, u), stage_tp=(t, u))

    def busiest(sender: int, receiver: int) -> int:
        return max(len(mesh.neighbours(r, receiver)[1]) for r in mesh.stage_ranks(sender))

    nbytes, bw, lat = 3e6, 2e10, 4e-6
    want = p2p_time(nbytes * busiest(0, 1), bw, lat) + p2p_time(nbytes * busiest(1, 0), bw, lat)
    assert hop_time(nbytes, t, u, bw, lat, shards=False) == pytest.approx(want, rel=1e-12)
    if t == u:  # one degree, shards sent: each TP rank sends its 1/t to its peer
        shard = 2 * p2p_time(nbytes / t, bw, lat)
        assert hop_time(nbytes, t, u, bw, lat, shards=True) == pytest.approx(shard, rel=1e-12)
