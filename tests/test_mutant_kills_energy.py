"""Tests written for mutmut's generated mutants of planner/resources/energy.py
(benchmarks/generated_mutants.py): a run's time, money, energy and carbon worked by hand from the
module docstring's formulas, each figure of the node distinct so that a wrong one shows, and the
busy share and power at their clamps. docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from planner.resources.energy import (
    busy_share,
    gpu_watts,
    prediction_busy_share,
    run_cost,
    steps_for,
)
from planner.resources.pool import NodeType

NODE = NodeType(
    name="n", profile="h100-sxm", nodes=4, gpus_per_node=8, price_per_gpu_hour=2.5,
    gpu_busy_watts=700.0, gpu_idle_watts=100.0, node_watts=500.0, carbon_g_per_kwh=400.0,
    pue=1.25,
)  # fmt: skip


def test_a_runs_cost_by_hand():
    cost = run_cost(NODE, nodes=2, gpus=16, steps=1000, step_time_s=3.6, utilization=0.5,
                    effective_time_fraction=0.9)  # fmt: skip
    # wall 3600 s / 0.9 = 4000 s; 16 GPUs: 16 x 4000 / 3600 = 160/9 GPU-hours at 2.5 $/h;
    # 100 + 600 x 0.5 = 400 W a GPU; 16 x 400 + 2 x 500 = 7400 W for 4000 s, x 1.25 PUE:
    # 7400 x 4000 / 3.6e6 x 1.25 = 185/18 kWh; 400 g a kWh: 185/18 x 0.4 kg
    assert cost.steps == 1000
    assert cost.wall_s == pytest.approx(4000.0, rel=1e-12)
    assert cost.gpu_hours == pytest.approx(160 / 9, rel=1e-12)
    assert cost.cost_usd == pytest.approx(160 / 9 * 2.5, rel=1e-12)
    assert cost.gpu_watts == pytest.approx(400.0, rel=1e-12)
    assert cost.energy_kwh == pytest.approx(185 / 18, rel=1e-12)
    assert cost.carbon_kg == pytest.approx(185 / 18 * 0.4, rel=1e-12)
    assert cost.wall_h == pytest.approx(4000 / 3600, rel=1e-12)


@pytest.mark.parametrize("u, watts", [(0.25, 250.0), (0.0, 100.0), (1.0, 700.0), (-0.5, 100.0),
                                      (1.5, 700.0)])  # fmt: skip
def test_gpu_power_is_linear_in_the_utilization_clamped(u, watts):
    assert gpu_watts(NODE, u) == pytest.approx(watts, rel=1e-12)


@pytest.mark.parametrize(
    "step, bubble, dp, offload, share",
    [
        (10.0, 1.0, 2.0, 4.0, 0.3),
        (0.5, 0.125, 0.0625, 0.0625, 0.5),  # a step under a second
        (10.0, 6.0, 3.0, 4.0, 0.0),  # more idle than the step: never below 0
        (10.0, 0.0, 0.0, -2.0, 1.0),  # never above 1
        (0.0, 0.0, 0.0, 0.0, 0.0),  # no step: no busy share (and no division by 0)
        (-1.0, 0.0, 0.0, 0.0, 0.0),
    ],
)
def test_the_busy_share_is_the_step_less_its_idle_parts(step, bubble, dp, offload, share):
    assert busy_share(step, bubble, dp, offload) == pytest.approx(share, rel=1e-12, abs=0)
    pred = SimpleNamespace(step_time_s=step, bubble_s=bubble, dp_exposed_s=dp, offload_s=offload)
    assert prediction_busy_share(pred) == pytest.approx(share, rel=1e-12, abs=0)


def test_whole_steps_train_at_least_the_tokens():
    assert steps_for(900, 300) == 3 and steps_for(901, 300) == 4 and steps_for(1, 300) == 1
