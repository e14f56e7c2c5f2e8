"""A pool's heterogeneous side: the [[fabric]] tables (and their one-line errors), and the
run cost of a mixed plan as the per-kind sum, against hand-computed values."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from planner.errors import UserInputError
from planner.resources.mixed_pool import (
    best_single,
    mixed_node_type,
    mixed_run_cost,
    placement_rate,
    pool_kinds,
)
from planner.resources.pool import pool_from_dict


def node(name, profile, nodes, price, busy, idle, node_watts, grid, pue):
    return dict(
        name=name,
        profile=profile,
        nodes=nodes,
        gpus_per_node=8,
        price_per_gpu_hour=price,
        gpu_busy_watts=busy,
        gpu_idle_watts=idle,
        node_watts=node_watts,
        carbon_g_per_kwh=grid,
        pue=pue,
    )


def pool(fabric=None):
    data = {
        "effective_time_fraction": 0.9,
        "node": [
            node("a", "a100-80g", 4, 1.0, 400.0, 100.0, 3300.0, 400.0, 1.5),
            node("h", "h100-sxm", 2, 2.0, 700.0, 100.0, 4600.0, 100.0, 1.2),
        ],
    }
    if fabric is not None:
        data["fabric"] = fabric
    return pool_from_dict(data, "test")


LINK = {"between": ["a", "h"], "bandwidth_bytes_per_s": 25e9, "latency_s": 1e-5}


def test_fabric_reads_and_links_both_ways():
    p = pool([LINK])
    assert p.link("a", "h") == p.link("h", "a")
    assert p.link("a", "h").bandwidth_bytes_per_s == 25e9
    kinds, links = pool_kinds(p)
    assert [(k.name, k.gpus, k.gpus_per_node) for k in kinds] == [("a", 32, 8), ("h", 16, 8)]
    assert links == {("a", "h"): (25e9, 1e-5)}
    assert pool().fabric == ()


@pytest.mark.parametrize(
    "fabric, message",
    [
        ([dict(LINK, between=["a", "a"])], "two different node types"),
        ([dict(LINK, between=["a", "x"])], "two different node types"),
        ([dict(LINK, bandwidth_bytes_per_s=0)], "bandwidth_bytes_per_s must be"),
        ([dict(LINK, latency_s=-1)], "latency_s must be"),
        ([dict(LINK, speed=1)], "unknown field"),
        ([LINK, dict(LINK, between=["h", "a"])], "a second fabric"),
        ("fast", "must be a list"),
    ],
)
def test_bad_fabric_is_a_one_line_error(fabric, message):
    with pytest.raises(UserInputError, match=message) as err:
        pool(fabric)
    assert "\n" not in str(err.value)


def test_mixed_run_cost_is_the_per_kind_sum():
    # 16 A100 (2 nodes) + 8 H100 (1 node), 1000 steps of 3.6 s, busy for half of each (a
    # 1.2 s bubble, 0.6 s exposed DP communication), 90% effective:
    # wall = 3600 / 0.9 = 4000 s for both kinds.
    # A100: GPU-h = 16 x 4000/3600 = 17.78, $ = 17.78; W = 16 x (100 + 300 x .5) + 2 x 3300
    #   = 10,600 W; kWh = 10,600 x 4000 / 3.6e6 x 1.5 = 17.667; kg = 17.667 x .4 = 7.0667
    # H100: GPU-h = 8.889, $ = 17.78; W = 8 x (100 + 600 x .5) + 4600 = 7,800 W;
    #   kWh = 7,800 x 4000 / 3.6e6 x 1.2 = 10.4; kg = 10.4 x .1 = 1.04
    p = pool([LINK])
    plan = SimpleNamespace(
        kinds=[SimpleNamespace(name="a", gpus=16), SimpleNamespace(name="h", gpus=8)],
        predicted=SimpleNamespace(
            step_time_s=3.6, mfu=0.3, bubble_s=1.2, dp_exposed_s=0.6, offload_s=0.0
        ),
    )
    run, nodes = mixed_run_cost(p, plan, 1000, 0.9)
    assert nodes == 3
    assert run.wall_s == pytest.approx(4000.0)
    assert run.gpu_hours == pytest.approx(24 * 4000 / 3600)
    assert run.cost_usd == pytest.approx(16 * 4000 / 3600 + 2 * 8 * 4000 / 3600)
    assert run.energy_kwh == pytest.approx(10600 * 4000 / 3.6e6 * 1.5 + 7800 * 4000 / 3.6e6 * 1.2)
    assert run.carbon_kg == pytest.approx(
        10600 * 4000 / 3.6e6 * 1.5 * 0.4 + 7800 * 4000 / 3.6e6 * 1.2 * 0.1
    )
    assert run.gpu_watts == pytest.approx((16 * 250 + 8 * 400) / 24)
    row = mixed_node_type(p, plan, nodes)
    assert row.name == "a+h" and row.nodes * row.gpus_per_node == 24


def test_placement_rate_prices_a_step_second_of_each_objective_by_hand():
    # 16 A100 (2 nodes) + 8 H100 (1 node), 1000 steps, 90% effective: each second of step time
    # is 1000 / 0.9 = 1111.1 s of wall time.
    # $: (16 x 1 + 8 x 2) x 1111.1 / 3600 = 9.8765 per step-second
    # kWh at busy power: A100 (16 x 400 + 2 x 3300) x 1111.1 / 3.6e6 x 1.5 = 6.0185,
    #   H100 (8 x 700 + 4600) x 1111.1 / 3.6e6 x 1.2 = 3.7778; kg: 6.0185 x .4 + 3.7778 x .1
    # Deadline 10 h: step <= 36000 / 1111.1 = 32.4 s; budget $200: step <= 200 / 9.8765 = 20.25
    p = pool([LINK])
    wall = 1000 / 0.9
    gpus = [16, 8]
    dollars = (16 * 1.0 + 8 * 2.0) * wall / 3600
    a_kwh = (16 * 400 + 2 * 3300) * wall / 3.6e6 * 1.5
    h_kwh = (8 * 700 + 4600) * wall / 3.6e6 * 1.2
    assert placement_rate(p, 1000, "time").per_step_s(gpus) == pytest.approx(wall)
    assert placement_rate(p, 1000, "cost").per_step_s(gpus) == pytest.approx(dollars)
    assert placement_rate(p, 1000, "energy").per_step_s(gpus) == pytest.approx(a_kwh + h_kwh)
    carbon = placement_rate(p, 1000, "carbon").per_step_s(gpus)
    assert carbon == pytest.approx(a_kwh * 0.4 + h_kwh * 0.1)
    by_deadline = placement_rate(p, 1000, "cost", deadline_h=10.0)
    assert by_deadline.max_step_s(gpus) == pytest.approx(36000 / wall)
    by_budget = placement_rate(p, 1000, "cost", budget_usd=200.0)
    assert by_budget.max_step_s(gpus) == pytest.approx(200 / dollars)
    both = placement_rate(p, 1000, "cost", deadline_h=10.0, budget_usd=200.0)
    assert both.max_step_s(gpus) == pytest.approx(min(36000 / wall, 200 / dollars))
    assert placement_rate(p, 1000, "cost").max_step_s(gpus) == float("inf")
    # money is exact: the rate times a step is the summed run cost of those GPUs at that step
    plan = SimpleNamespace(
        kinds=[SimpleNamespace(name="a", gpus=16), SimpleNamespace(name="h", gpus=8)],
        predicted=SimpleNamespace(
            step_time_s=3.6, mfu=0.3, bubble_s=0.0, dp_exposed_s=0.0, offload_s=0.0
        ),
    )
    run, _ = mixed_run_cost(p, plan, 1000, 0.9)
    assert dollars * 3.6 == pytest.approx(run.cost_usd)
    assert (a_kwh + h_kwh) * 3.6 == pytest.approx(run.energy_kwh)  # busy all step


def test_best_single_takes_each_kinds_least_step():
    def opt(name, t):
        return SimpleNamespace(
            node=SimpleNamespace(name=name), point=SimpleNamespace(step_time_s=t) if t else None
        )

    found = best_single([opt("a", 3.0), opt("a", 2.0), opt("h", None), opt("h", 5.0)])
    assert found == {"a": 2.0, "h": 5.0}


def test_cli_adds_the_mixed_option_when_it_is_faster(tmp_path, capsys, monkeypatch):
    """The real planner: GPT 1.3B on one A100 node and one H100 node joined by a fabric; the
    pipeline across both is faster than either node alone, is chosen by time, and its plan
    is written with its kinds."""
    import json

    from meshplan.cli import main
    from planner.schema import load_plan

    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "cache"))
    rows = [
        f'[[node]]\nname = "{n}"\nprofile = "{prof}"\nnodes = 1\nprice_per_gpu_hour = 1.0\n'
        "gpu_busy_watts = 500\nnode_watts = 1000\ncarbon_g_per_kwh = 400\npue = 1.2\n"
        for n, prof in (("a", "a100-80g"), ("h", "h100-sxm"))
    ]
    rows.append(
        '[[fabric]]\nbetween = ["a", "h"]\nbandwidth_bytes_per_s = 25e9\nlatency_s = 1e-5\n'
    )
    pool = tmp_path / "pool.toml"
    pool.write_text("\n".join(rows))
    out_dir = tmp_path / "out"
    args = ["examples/gpt.py", "--model-arg", "size=1.3b", "--global-batch-size", "64"]
    args += ["--resources", str(pool), "--tokens", "1000000000", "--objective", "time"]
    assert main([*args, "--out", str(out_dir)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # lines wrapped to the terminal, as one
    assert "chosen: a+h x2 has the least time" in out
    said = out.split("figures from ", 1)[1]
    assert " a: price_per_gpu_hour" in said and " h: price_per_gpu_hour" in said
    doc = json.loads((out_dir / "resources.json").read_text())
    assert doc["chosen"] == "a+h x2" and doc["plan"] == "plan.json"
    assert [o["label"] for o in doc["options"] if o["mixed"]] == ["a+h x2"]
    plan = load_plan(out_dir / "mixed" / "plan.json")
    assert {st.kind for st in plan.stages} == {"a", "h"}
    assert sorted(k.name for k in plan.kinds) == ["a", "h"]
    data = json.loads((out_dir / "mixed" / "plan.json").read_text())
    assert len(data["rank_kinds"]) == plan.cluster.gpus == 16
    assert plan.solver.objective == plan.predicted.step_time_s  # the certificate's step
