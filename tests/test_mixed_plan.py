"""Heterogeneous plans on a real model: two device kinds emulated on the CPU by two profiles
(the measured ``cpu`` profile, and a copy with half its fp32 peak and half its memory), one
rank of each. Checks: the mixed plan is predicted faster than either kind alone (and each
stage's numbers are its kind's); the MILP over the real model's numbers agrees with a brute
force over every kind assignment, split and option choice; one kind's placement is priced as
the homogeneous stage MILP prices it; the plan file records the kinds and a single-kind plan
is written as before; and torchrun runs the mixed plan unchanged, matching one process."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from oracle import (
    checkpoint_model_state,
    parameter_mismatches,
    reference_for_plan,
    unmoved_parameters,
)
from runs import cpu_profile, launch, losses_of
from test_mixed_milp import brute_force
from test_trace import ODD_OUTPUT

from planner.api import plan
from planner.resources.mixed_plan import KindSpec, plan_mixed
from planner.schema import load_plan, write_plan
from planner.search import Pins
from planner.search.milp.candidate import stage_problem
from planner.search.milp.solve import solve_stage_milp
from planner.search.mixed.cost import step_time
from planner.search.mixed.milp import solve_mixed
from planner.search.mixed.search import (
    TP_DEGREES,
    RunRate,
    cell_variants,
    dp_multiples,
    mixed_problem,
    stage_variants,
)

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "examples" / "gpt.py"
# Wide enough that compute, not the CPU's per-op overheads, sets the stage times.
ARGS = {"size": "tiny", "layers": 4, "hidden": 256, "seq_len": 128}
LINK = (4.4e9, 3.1e-4)  # the cpu profile's loopback: the fabric between the two "kinds"


def half_profile(tmp: Path) -> str:
    """profiles/cpu.toml with half the fp32 peak and half the memory, as its own kind."""
    return cpu_profile(tmp, "cpu-half", peak_flops_fp32="5.0e10", capacity_bytes=4294967296)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mixed")
    kinds = [KindSpec("fast", "cpu", 1), KindSpec("slow", half_profile(tmp), 1)]
    return plan_mixed(
        MODEL,
        kinds,
        {("fast", "slow"): LINK},
        model_args=ARGS,
        global_batch_size=8,
        dtype="fp32",
        optimizer="sgd",
        lr=0.5,
        pins=Pins(offload="none"),
    ), tmp


def test_mixed_plan_is_faster_than_either_kind_alone(mixed):
    res, _ = mixed
    plan = res.plan
    assert plan is not None, f"no mixed plan beat {res.single}"
    assert set(res.single) == {"fast", "slow"} and all(map(math.isfinite, res.single.values()))
    assert plan.predicted.step_time_s < min(res.single.values())
    assert plan.solver.status == "optimal"  # every MILP finished: optimal under the model
    assert {st.kind for st in plan.stages} == {"fast", "slow"}
    assert plan.mesh.pp == 2 and plan.mesh.dp == 1 and plan.mesh.tp == 1
    # The slower kind gets fewer layers: the split is uneven and follows the speeds.
    layers = {st.kind: sum(b.startswith("layers.") for b in st.blocks) for st in plan.stages}
    assert layers["fast"] > layers["slow"]
    # The step is the 1F1B / GPipe formula over the recorded stage times, plus the per-step
    # terms, each a stage's own: recomputed here by hand from the plan file.
    T = [st.time_per_microbatch_s for st in plan.stages]
    m = plan.num_microbatches
    per_step = (
        max(st.dp_exposed_s for st in plan.stages)
        + max(st.optimizer_s for st in plan.stages)
        + max(st.offload_s for st in plan.stages)
    )
    assert plan.predicted.step_time_s == pytest.approx(sum(T) + (m - 1) * max(T) + per_step)


def test_by_cost_the_cheapest_run_can_be_a_slower_mixed_pipeline(tmp_path):
    """Two fast ranks at $1 per second and one slow rank (half the FLOPs, 260 MiB: too little
    for the whole model) at $0.01. Two fast ranks step fastest, so the search by time (its
    cutoff the fastest kind) finds no mixed plan; by money, a pipeline over one fast and the
    slow rank costs less than either fast run, though it is slower. The search's value is the
    least over every candidate and GPU count per kind, each re-solved here without a cutoff."""
    slow = cpu_profile(tmp_path, "cpu-slow", peak_flops_fp32="5.0e10", capacity_bytes=260 * 2**20)
    kinds = [KindSpec("fast", "cpu", 2), KindSpec("slow", slow, 1)]
    links = {("fast", "slow"): LINK}
    common = dict(
        model_args=ARGS, global_batch_size=8, dtype="fp32", optimizer="sgd", lr=0.5,
        pins=Pins(offload="none"),
    )  # fmt: skip
    price = [1.0, 0.01]

    def dollars(gpus):
        return sum(p * g for p, g in zip(price, gpus))

    rate = RunRate(dollars, lambda gpus: math.inf, tuple(price))
    by_time = plan_mixed(MODEL, kinds, links, **common)
    assert by_time.plan is None and math.isinf(by_time.single["slow"])
    fast_one = plan(MODEL, 1, profile="cpu", **common).plan.predicted.step_time_s
    singles = min(1 * price[0] * fast_one, 2 * price[0] * by_time.single["fast"])
    res = plan_mixed(MODEL, kinds, links, rate=rate, objective_cutoff=singles, **common)
    assert res.plan is not None
    assert res.plan.predicted.step_time_s > by_time.single["fast"]  # slower than two fast
    used = {k.name: k.gpus for k in res.plan.kinds}
    value = dollars([used.get("fast", 0), used.get("slow", 0)]) * res.plan.predicted.step_time_s
    assert value == pytest.approx(res.search.best.value, rel=1e-6) and value < singles
    assert exhaustive_by_rate(res.search, {(0, 1): LINK, (1, 0): LINK}, dollars) == pytest.approx(
        res.search.best.value, rel=2e-3
    )
    # priced by a rate, stages of their own degree are left by default (a note says so); with
    # them searched (boxes of GPUs per kind over the cells of several degrees too) the least
    # is the same, the exhaustive's over every (kind, degree) per stage
    assert res.search.skipped and "priced by a rate" in res.notes[-1]
    every = plan_mixed(
        MODEL, kinds, links, rate=rate, objective_cutoff=singles, stage_degrees=True, **common
    )
    assert not every.search.skipped
    assert any(mc.degrees[0] != mc.degrees[1] for mc in every.search.candidates)
    assert every.search.best.value == pytest.approx(res.search.best.value, rel=2e-3)


def exhaustive_by_rate(search, links, rate) -> float:
    """The least rate x step over every candidate the search had and every TP-unit total per
    kind using two kinds (each kind's units fixed, no cutoff): what its boxes must find."""
    best = math.inf
    for c in {id(mc.cand): mc.cand for mc in search.candidates}.values():
        vs = stage_variants(search.kinds, c.dp, list(TP_DEGREES))
        ins = [search.inputs[k, t, c.micro_batch_size] for k, t, _ in vs]
        mp = mixed_problem(ins, c, vs, search.kinds, links)
        for units in itertools.product(*(range(cap + 1) for cap in mp.units)):
            if sum(1 for u in units if u) < 2:
                continue
            sol = solve_mixed(replace(mp, units=list(units), units_low=list(units)))
            if sol.variants:
                best = min(best, sol.objective * rate([u * c.dp for u in units]))
    return best


def cell_problem(search, mc, links=None):
    """The MixedProblem of the search's cell ``mc``, built afresh from its priced options."""
    c, (lo, hi), top = mc.cand, mc.degrees, mc.dp_top
    allowed = stage_variants(search.kinds, c.dp, list(TP_DEGREES), dp_multiples(top))
    vs = cell_variants(allowed, lo, hi, top)
    ins = [search.inputs[k, t, c.micro_batch_size] for k, t, _ in vs]
    links = links or {(0, 1): LINK, (1, 0): LINK}
    return mixed_problem(ins, c, vs, search.kinds, links, [lo, hi], dp_needs=[1, top])


def test_real_problem_milp_matches_brute_force(mixed):
    """The real model's numbers, on the search's two- and three-stage cells: the MILP's
    optimum is the brute force's over every variant, split and option choice."""
    res, _ = mixed
    cells = {(mc.cand.label(), mc.degrees): mc for mc in res.search.candidates}
    checked = 0
    for mc in cells.values():
        if mc.cand.pp > 3:
            continue
        mp = cell_problem(res.search, mc)
        expected = brute_force(mp)
        got = solve_mixed(mp)
        if math.isinf(expected):
            assert got.status == "infeasible"
            continue
        assert got.objective == pytest.approx(expected, rel=2e-4), mc.label()
        checked += 1
    assert checked >= 4


def test_one_kind_placement_is_priced_as_the_homogeneous_milp(mixed):
    """With one kind at one degree the mixed MILP is the homogeneous stage MILP: same
    optimum."""
    res, _ = mixed
    mc = next(x for x in res.search.candidates if x.problem is not None)
    c = mc.cand
    for k in range(2):
        inp = res.search.inputs[k, 1, c.micro_batch_size]
        one = replace(c, tp=1)
        mp = mixed_problem([inp], one, [(0, 1)], [res.search.kinds[k]], {})
        mp.units = [c.pp]
        homogeneous = solve_stage_milp(stage_problem(inp, one))
        assert solve_mixed(mp).objective == pytest.approx(homogeneous.objective, rel=2e-4)


def test_plan_file_records_kinds_and_single_kind_plans_are_unchanged(mixed):
    res, tmp = mixed
    path = write_plan(res.plan, tmp / "plan")
    data = json.loads(path.read_text())
    assert data["rank_kinds"] == [st["kind"] for st in data["stages"]]
    assert {k["name"] for k in data["kinds"]} == {"fast", "slow"}
    assert load_plan(path).to_dict() == data
    # A single-kind plan carries none of the new keys.
    single = res.single_plans["fast"].to_dict()
    assert "kinds" not in single and "rank_kinds" not in single
    assert all("kind" not in st for st in single["stages"])
    # A rank map that disagrees with a stage's kind is a one-line error.
    bad = dict(data, rank_kinds=list(reversed(data["rank_kinds"])))
    (tmp / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(Exception, match="stage 0 must name its kind"):
        load_plan(tmp / "bad.json")


def certified(res) -> None:
    """A mixed planning result certifies the step it reports: the plan's solver.objective is
    its predicted step time, and every MILP the search solved valued its placement at that
    placement's step time (mixed.cost.step_time) to 1e-9 (issue 50: 3% apart, both
    "optimal")."""
    plan = res.plan
    assert plan is not None
    assert plan.solver.objective == plan.predicted.step_time_s
    assert plan.solver.objective == float(f"{res.search.best.solution.objective:.12g}")
    solved = [mc for mc in res.search.candidates if mc.status == "solved"]
    assert solved
    for mc in solved:
        sol = mc.solution
        exact = step_time(mc.problem, sol.variants, sol.counts)
        assert sol.objective == exact
        assert sol.milp_objective == pytest.approx(exact, rel=1e-9, abs=0)


def test_mixed_plans_certify_the_step_they_report(mixed):
    certified(mixed[0])


def test_a_fabric_named_one_way_joins_its_kinds_both_ways(mixed):
    """A fabric is a link: named (fast, slow) or (slow, fast), the hops between the kinds are
    the same both ways and finite, and the MILP's optimum over a two-stage cell is the brute
    force's over both orders, whichever order names it."""
    res, _ = mixed
    mc = next(x for x in res.search.candidates if x.cand.pp == 2)
    both = cell_problem(res.search, mc)
    expected = brute_force(both)
    for named in ({(0, 1): LINK}, {(1, 0): LINK}):
        mp = cell_problem(res.search, mc, named)
        assert np.array_equal(mp.hop, both.hop) and np.isfinite(mp.hop).all()
        assert solve_mixed(mp).objective == pytest.approx(expected, rel=2e-4)


def test_plan_step_is_the_milp_optimum_and_kinds_cannot_swap(mixed):
    """The plan's predicted step is the MILP's optimum priced directly; the same split with
    the variants swapped or shared is no faster (or does not fit the pool)."""
    res, _ = mixed
    best = res.search.best
    mp, sol = best.problem, best.solution
    assert step_time(mp, sol.variants, sol.counts) == pytest.approx(res.plan.predicted.step_time_s)
    for chosen in itertools.product(range(len(mp.variants)), repeat=2):
        if list(chosen) != sol.variants:
            assert step_time(mp, list(chosen), sol.counts) >= sol.objective * (1 - 2e-4)


@pytest.mark.distributed
@pytest.mark.long  # a torchrun launch of its own (about a minute): CI runs it after the suite
def test_runtime_runs_the_mixed_plan_like_one_process(mixed):
    res, tmp = mixed
    trains_like_one_process(res.plan, tmp / "run", 2, 5)


def trains_like_one_process(plan, run_dir: Path, ranks: int, steps: int) -> None:
    """``plan`` written to ``run_dir`` and trained under torchrun on ``ranks`` ranks: every
    step's loss and the final parameters equal one process training the same model."""
    path = write_plan(plan, run_dir)
    rc, log = launch([path], [run_dir], ranks, "--checkpoint-every", str(steps), steps=steps)
    got = losses_of(run_dir)
    assert len(got) == steps, f"torchrun exit {rc}\n{log[-6000:]}"
    ref = reference_for_plan(json.loads(path.read_text()), steps)
    assert not unmoved_parameters(ref)
    for g, w in zip(got, ref.losses, strict=True):
        assert abs(g - w) <= 1e-4 * abs(w)
    state = checkpoint_model_state(run_dir / "checkpoints" / f"step_{steps:06d}")
    assert not parameter_mismatches(state, ref)


def test_a_model_export_cannot_trace_gets_no_pipeline_across_kinds(tmp_path, monkeypatch):
    """A pipeline across kinds is cut by torch's pipelining, which traces the model with
    torch.export: for a model only the module-level trace could follow (its output an
    unregistered class, ``test_trace.ODD_OUTPUT``) no mixed candidate is priced, and each kind
    alone still plans."""
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "odd.py"
    model.write_text(ODD_OUTPUT)
    kinds = [KindSpec("fast", "cpu", 1), KindSpec("slow", half_profile(tmp_path), 1)]
    res = plan_mixed(
        model, kinds, {("fast", "slow"): LINK}, global_batch_size=8, dtype="fp32",
        optimizer="sgd", lr=0.5, pins=Pins(offload="none"),
    )  # fmt: skip
    assert res.plan is None and res.search.best is None and res.search.candidates == []
    assert set(res.single) == {"fast", "slow"} and all(map(math.isfinite, res.single.values()))
