"""Tests written for mutmut's generated mutants of planner/resources/mixed_pool.py (benchmarks/
generated_mutants.py): a mixed plan's run cost and table row with a kind's GPUs not filling its
nodes, the placement rate's per-GPU floor, and ``mixed_option`` around a stand-in for the mixed
planner (what it is asked, and how the plan it returns is priced), each worked by hand on
test_mixed_pool's two-kind pool (A100: 4 nodes of 8, $1, 400/100 W, 3,300 W a node, 400 g/kWh,
PUE 1.5; H100: 2 nodes of 8, $2, 700/100 W, 4,600 W, 100 g/kWh, PUE 1.2; 90% effective).
docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from test_mixed_pool import LINK, node, pool

from planner.resources import mixed_pool
from planner.resources.choose import Option, PlanPoint
from planner.resources.energy import RunCost
from planner.resources.mixed_pool import (
    best_single,
    mixed_node_type,
    mixed_option,
    placement_rate,
    summed_run_cost,
)
from planner.resources.pool import pool_from_dict
from planner.schema.mesh import Mesh

P = pool([LINK])
A, H = P.node_types


def kinds_plan(a_gpus: int = 12, h_gpus: int = 4, **predicted):
    """A plan's fields mixed_pool reads: its kinds' GPUs, its prediction (a 3.6 s step busy
    half of it: a 1.2 s bubble and 0.6 s of exposed DP communication), stage 0 on the A100s
    (DP 6, TP 2) and stage 1 on the H100s (DP 4, TP 1)."""
    pred = dict(
        step_time_s=3.6,
        mfu=0.3,
        bubble_s=1.2,
        dp_exposed_s=0.6,
        offload_s=0.0,
        tokens_per_s=2560.0,
        samples_per_s=10.0,
    )
    return SimpleNamespace(
        kinds=[SimpleNamespace(name="a", gpus=a_gpus), SimpleNamespace(name="h", gpus=h_gpus)],
        predicted=SimpleNamespace(**{**pred, **predicted}),
        global_batch_size=8,
        mesh=Mesh(2, 6, 2, stage_tp=(2, 1), stage_dp=(6, 4)),
        stages=[SimpleNamespace(kind="a"), SimpleNamespace(kind="h")],
    )


def test_best_single_is_inf_for_a_kind_nothing_fits():
    opt = SimpleNamespace(node=SimpleNamespace(name="h"), point=None)
    assert best_single([opt]) == {"h": math.inf}
    assert best_single([]) == {}


def test_summed_run_cost_rounds_each_kinds_gpus_up_to_whole_nodes():
    """12 A100 (2 nodes) and 4 H100 (1 node), 100 steps of 3.6 s at 90%: 400 s.
    A100: 12 x 400 / 3600 = 4/3 GPU-h, $4/3; 12 x 250 + 2 x 3300 = 9,600 W,
    9,600 x 400 / 3.6e6 x 1.5 = 1.6 kWh, 0.64 kg. H100: 4/9 GPU-h, $8/9; 4 x 400 + 4,600 =
    6,200 W, 6,200 x 400 / 3.6e6 x 1.2 = 0.82667 kWh, 0.082667 kg."""
    run, nodes = summed_run_cost([(A, 12), (H, 4)], 100, 3.6, 0.5, 0.9)
    assert nodes == 3
    assert run.steps == 100 and run.wall_s == pytest.approx(400.0)
    assert run.gpu_hours == pytest.approx(16 / 9)
    assert run.cost_usd == pytest.approx(4 / 3 + 8 / 9)
    assert run.gpu_watts == pytest.approx((12 * 250 + 4 * 400) / 16)
    h_kwh = 6200 * 400 / 3.6e6 * 1.2
    assert run.energy_kwh == pytest.approx(1.6 + h_kwh)
    assert run.carbon_kg == pytest.approx(0.64 + h_kwh * 0.1)
    alone, nodes = summed_run_cost([(H, 4)], 100, 3.6, 0.5, 0.9)
    assert nodes == 1 and alone.wall_s == pytest.approx(400.0)
    assert alone.cost_usd == pytest.approx(8 / 9) and alone.gpu_watts == pytest.approx(400.0)


def test_mixed_node_type_weighs_each_figure_by_gpus():
    """12 A100 and 4 H100 on 3 nodes: $(12 + 8) / 16 = 1.25, (4,800 + 2,800) / 16 = 475 W
    busy, 100 W idle, (4,800 + 400) / 16 = 325 g/kWh, (18 + 4.8) / 16 = 1.425 PUE; 16 // 3 = 5
    GPUs a node; the node's own draw is the first kind's."""
    row = mixed_node_type(P, kinds_plan(), 3)
    assert row.name == "a+h" and row.profile == "a100-80g+h100-sxm"
    assert row.nodes == 3 and row.gpus_per_node == 5
    assert row.price_per_gpu_hour == pytest.approx(1.25)
    assert row.gpu_busy_watts == pytest.approx(475.0)
    assert row.gpu_idle_watts == pytest.approx(100.0)
    assert row.carbon_g_per_kwh == pytest.approx(325.0)
    assert row.pue == pytest.approx(1.425)
    assert row.node_watts == 3300.0
    flipped = kinds_plan()
    flipped.kinds.reverse()
    back = mixed_node_type(P, flipped, 2)
    assert back.name == "h+a" and back.node_watts == 4600.0 and back.gpus_per_node == 8
    assert mixed_node_type(P, kinds_plan(1, 1), 3).gpus_per_node == 1  # never 0


WALL = 1000 / 0.9  # each step-second of 1000 steps at 90%


@pytest.mark.parametrize(
    "objective, per_gpu",
    [
        ("time", (0.0, 0.0)),
        ("cost", (1.0 * WALL / 3600, 2.0 * WALL / 3600)),
        (
            "energy",
            (
                (8 * 400 + 3300) * WALL / 3.6e6 * 1.5 / 8,
                (8 * 700 + 4600) * WALL / 3.6e6 * 1.2 / 8,
            ),
        ),
        (
            "carbon",
            (
                (8 * 400 + 3300) * WALL / 3.6e6 * 1.5 * 0.4 / 8,
                (8 * 700 + 4600) * WALL / 3.6e6 * 1.2 * 0.1 / 8,
            ),
        ),
    ],
)
def test_per_gpu_floor_is_a_whole_node_alone_per_gpu(objective, per_gpu):
    rate = placement_rate(P, 1000, objective)
    assert rate.per_gpu == pytest.approx(per_gpu)
    assert len(rate.per_gpu) == 2


def test_a_kind_with_no_gpus_adds_nothing_and_a_free_run_has_no_budget_limit():
    rate = placement_rate(P, 1000, "energy")
    assert rate.per_step_s([16, 0]) == pytest.approx((16 * 400 + 2 * 3300) * WALL / 3.6e6 * 1.5)
    assert rate.per_step_s([0, 8]) == pytest.approx((8 * 700 + 4600) * WALL / 3.6e6 * 1.2)
    # 10 steps: $ 32 x (10 / 0.9) / 3600 = 0.0988 a step-second, under a dollar
    small = placement_rate(P, 10, "cost", budget_usd=0.05)
    assert small.max_step_s([16, 8]) == pytest.approx(0.05 / (32 * (10 / 0.9) / 3600))
    free = free_pool()
    assert placement_rate(free, 10, "cost", budget_usd=0.05).max_step_s([16, 8]) == math.inf
    by_deadline = placement_rate(free, 10, "cost", deadline_h=1.0, budget_usd=0.05)
    assert by_deadline.max_step_s([16, 8]) == pytest.approx(3600 / (10 / 0.9))


def free_pool():
    """The pool with both kinds at $0 an hour (an owned cluster)."""
    data = {
        "effective_time_fraction": 0.9,
        "node": [
            node("a", "a100-80g", 4, 0.0, 400.0, 100.0, 3300.0, 400.0, 1.5),
            node("h", "h100-sxm", 2, 0.0, 700.0, 100.0, 4600.0, 100.0, 1.2),
        ],
        "fabric": [LINK],
    }
    return pool_from_dict(data, "test")


def priced(nt, nodes, wall_h, cost, energy=1.0, carbon=1.0, tokens_per_step=4096):
    run = RunCost(1, wall_h * 3600.0, 0.0, cost, 0.0, energy, carbon)
    return Option(nt, nodes, PlanPoint(2.0, 0.4, tokens_per_step, "dp8"), run)


@pytest.fixture
def planner(monkeypatch):
    """A stand-in for plan_mixed: records what it is asked and returns ``planner.plan``."""
    asked = SimpleNamespace(calls=[], plan=None)

    def plan_mixed(model_file, kinds, links, **kw):
        asked.calls.append(SimpleNamespace(model_file=model_file, kinds=kinds, links=links, **kw))
        return SimpleNamespace(plan=asked.plan)

    monkeypatch.setattr(mixed_pool, "plan_mixed", plan_mixed)
    return asked


def test_no_fabric_plans_nothing(planner):
    assert mixed_option(pool(), "m.py", {}, [], 100, None) == (None, None)
    assert planner.calls == []


def test_by_time_the_planner_is_asked_with_no_rate_and_no_cutoff(planner):
    unfit = Option(H, 1, None, None, "does not fit")
    options = [priced(A, 1, 5.0, 10.0), priced(A, 2, 3.0, 12.0), unfit]
    option, res = mixed_option(
        P, "m.py", {"model_args": {"size": "tiny"}}, options, 100, None, "prog", "time",
        stage_degrees=False,
    )  # fmt: skip
    assert option is None and res.plan is None
    (call,) = planner.calls
    assert call.model_file == "m.py" and call.model_args == {"size": "tiny"}
    assert [(k.name, k.profile, k.gpus, k.gpus_per_node) for k in call.kinds] == [
        ("a", "a100-80g", 32, 8),
        ("h", "h100-sxm", 16, 8),
    ]
    assert call.links == {("a", "h"): (25e9, 1e-5)}
    assert call.single == {"a": 2.0, "h": math.inf}
    assert call.progress == "prog" and call.stage_degrees is False
    assert call.rate is None and call.objective_cutoff == math.inf


@pytest.mark.parametrize("limits", [{"deadline_h": 100.0}, {"budget_usd": 100.0}])
def test_by_time_with_a_deadline_or_budget_the_planner_gets_a_rate(planner, limits):
    options = [priced(A, 1, 5.0, 10.0), priced(A, 2, 3.0, 120.0)]
    mixed_option(P, "m.py", {}, options, None, 7, None, "time", **limits)
    (call,) = planner.calls
    wall = 7 / 0.9
    assert call.rate.per_step_s([16, 8]) == pytest.approx(wall)
    met = [o for o in options if o.run.wall_h <= limits.get("deadline_h", 1e9)]
    met = [o for o in met if o.run.cost_usd <= limits.get("budget_usd", 1e9)]
    assert call.objective_cutoff == min(o.run.wall_s for o in met)


def test_by_cost_the_rate_prices_the_tokens_steps_and_the_cutoff_is_the_best_that_meets(planner):
    """10,000 tokens at 4,096 a step: 3 steps, 3 / 0.9 s of wall a step-second; 16 A100 and
    8 H100 cost $32 an hour: 32 x (3 / 0.9) / 3600 a step-second. The
    cheapest option (8 h) misses the 6 h deadline: the cutoff is the next, $12."""
    unfit = Option(H, 1, None, None, "does not fit")
    options = [unfit, priced(A, 1, 8.0, 10.0), priced(A, 2, 5.0, 12.0), priced(H, 1, 1.0, 30.0)]
    mixed_option(P, "m.py", {}, options, 10_000, None, None, "cost", deadline_h=6.0)
    (call,) = planner.calls
    wall = 3 / 0.9
    assert call.rate.per_step_s([16, 8]) == pytest.approx(32 * wall / 3600)
    assert call.rate.max_step_s([16, 8]) == pytest.approx(6 * 3600 / wall)
    assert call.objective_cutoff == 12.0
    planner.calls.clear()
    mixed_option(P, "m.py", {}, options, 10_000, None, None, "energy", budget_usd=11.0)
    (call,) = planner.calls
    assert call.objective_cutoff == 1.0  # only the $10 option meets the budget: its 1 kWh
    assert call.rate.max_step_s([16, 8]) == pytest.approx(11.0 / (32 * wall / 3600))


def test_by_cost_with_nothing_priced_there_is_no_rate(planner):
    mixed_option(P, "m.py", {}, [Option(H, 1, None, None, "no")], 100, None, None, "cost")
    (call,) = planner.calls
    assert call.rate is None and call.objective_cutoff == math.inf


def test_a_free_pool_is_searched_by_time(planner):
    """At $0 an hour every run costs nothing: ties go to the faster, by wall time."""
    free = free_pool()
    fa, fh = free.node_types
    options = [priced(fa, 1, 5.0, 0.0), priced(fh, 1, 3.0, 0.0)]
    mixed_option(free, "m.py", {}, options, None, 9, None, "cost")
    (call,) = planner.calls
    assert call.rate.per_step_s([16, 8]) == pytest.approx(9 / 0.9)
    assert call.objective_cutoff == 3.0 * 3600


def test_the_mixed_plan_becomes_an_option_priced_per_kind(planner):
    """8 samples of 2,560 / 10 = 256 tokens: 2,048 tokens a step, 1,000,000 tokens in
    ceil(488.3) = 489 steps; the run is summed_run_cost of 12 A100 and 4 H100 at the plan's
    3.6 s step, half busy; 3 nodes."""
    planner.plan = kinds_plan()
    option, res = mixed_option(P, "m.py", {}, [], 1_000_000, None)
    assert res.plan is planner.plan
    run, nodes = summed_run_cost([(A, 12), (H, 4)], 489, 3.6, 0.5, 0.9)
    assert option.run == run and option.nodes == nodes == 3
    assert option.gpus == 16 and option.gpu_count == 16
    assert option.point == PlanPoint(3.6, 0.3, 2048, "pp2 dp6/4 tp2/1 (a/h)", 0.5)
    assert option.point.plan is planner.plan
    assert option.name == "" and option.label == "a+h x3"
    assert option.node == mixed_node_type(P, planner.plan, 3)


def test_one_kind_pipeline_is_named_by_its_degrees_and_steps_given_are_kept(planner):
    plan = kinds_plan()
    plan.stages = [SimpleNamespace(kind="a"), SimpleNamespace(kind="a")]
    planner.plan = plan
    option, _ = mixed_option(P, "m.py", {}, [], None, 5)
    assert option.name == "a 16 GPUs tp 2/1 dp 6/4"
    assert option.run.steps == 5
    plan.stages = [SimpleNamespace(kind="a"), SimpleNamespace(kind=None)]
    option, _ = mixed_option(P, "m.py", {}, [], None, 5)
    assert option.point.mesh == "pp2 dp6/4 tp2/1 (a/)"


@pytest.mark.parametrize(
    "tokens_per_s, samples_per_s, gbs, tokens_per_step",
    [(0.0, 0.0, 8, 8), (1.0, 4.0, 1, 1), (30.0, 10.0, 3, 9)],
)
def test_tokens_per_step_is_at_least_one(
    planner, tokens_per_s, samples_per_s, gbs, tokens_per_step
):
    """No samples rate: a token a sample; a step rounds to whole tokens, at least one."""
    plan = kinds_plan(tokens_per_s=tokens_per_s, samples_per_s=samples_per_s)
    planner.plan = replace_gbs(plan, gbs)
    option, _ = mixed_option(P, "m.py", {}, [], 100, None)
    assert option.point.tokens_per_step == tokens_per_step
    assert option.run.steps == math.ceil(100 / tokens_per_step)


def replace_gbs(plan, gbs):
    plan.global_batch_size = gbs
    return plan


def test_mixed_node_type_weighs_idle_power_too():
    """An H100 idling at 300 W: (12 x 100 + 4 x 300) / 16 = 150 W."""
    data = {
        "node": [
            node("a", "a100-80g", 4, 1.0, 400.0, 100.0, 3300.0, 400.0, 1.5),
            node("h", "h100-sxm", 2, 2.0, 700.0, 300.0, 4600.0, 100.0, 1.2),
        ],
    }
    row = mixed_node_type(pool_from_dict(data, "test"), kinds_plan(), 3)
    assert row.gpu_idle_watts == pytest.approx(150.0)


def test_best_single_keeps_the_least_not_the_last():
    def opt(t):
        return SimpleNamespace(node=SimpleNamespace(name="a"), point=SimpleNamespace(step_time_s=t))

    assert best_single([opt(2.0), opt(3.0)]) == {"a": 2.0}


def test_the_default_objective_is_time(planner):
    """No objective given, no deadline or budget: the fastest pipeline, no rate."""
    mixed_option(P, "m.py", {}, [priced(A, 1, 5.0, 10.0)], 100, None)
    (call,) = planner.calls
    assert call.rate is None and call.objective_cutoff == math.inf


def test_an_option_with_a_point_but_no_run_is_not_priced(planner):
    """Priced means planned and costed: a point without a run prices no rate."""
    half = Option(H, 1, PlanPoint(1.0, 0.5, 100, "dp8"), None)
    mixed_option(P, "m.py", {}, [half], 100, None, None, "cost")
    (call,) = planner.calls
    assert call.rate is None and call.objective_cutoff == math.inf


def test_one_priced_option_sets_the_steps(planner):
    """The steps come from the first priced option's tokens a step (10,000 at 4,096: 3)."""
    mixed_option(P, "m.py", {}, [priced(A, 1, 5.0, 10.0)], 10_000, None, None, "cost")
    (call,) = planner.calls
    assert call.rate.per_step_s([16, 8]) == pytest.approx(32 * (3 / 0.9) / 3600)
    assert call.objective_cutoff == 10.0


def test_no_option_meeting_the_limits_leaves_no_cutoff(planner):
    """Priced options that all miss the deadline: the cutoff is inf, not the error of an
    empty min."""
    options = [priced(A, 1, 8.0, 10.0), priced(A, 2, 5.0, 12.0)]
    mixed_option(P, "m.py", {}, options, 10_000, None, None, "cost", deadline_h=1.0)
    (call,) = planner.calls
    assert call.objective_cutoff == math.inf and call.rate is not None
