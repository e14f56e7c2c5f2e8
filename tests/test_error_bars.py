"""The cost model's error bars: the held-out errors' spread per chip and parallel form, the
range a prediction becomes, how ``plan`` prints it and plan.json keeps it. Every number is
worked out by hand."""

from __future__ import annotations

import json

import pytest

from planner.cost.error_bars import (
    MIN_RUNS,
    ErrorBar,
    error_bar,
    parallel_form,
    spread,
    summarize,
)
from planner.errors import UserInputError
from planner.report.console import human_time, step_with_range
from planner.schema import Prediction, plan_from_dict


def test_spread_is_the_10th_and_90th_percentile_between_order_statistics():
    """Six errors: the 10th percentile sits half-way between the first two (position
    0.1 x 5 = 0.5), the 90th half-way between the last two (0.9 x 5 = 4.5)."""
    lo, hi = spread([0.3, -0.2, 0.1, -0.1, 0.0, 0.2])
    assert (lo, hi) == (pytest.approx(-0.15), pytest.approx(0.25))
    assert spread([0.07]) == (0.07, 0.07)


def test_a_prediction_becomes_the_measured_steps_its_errors_allow():
    """predicted = measured x (1 + error): a model that ran 20% slow means a 31.7 s prediction
    measures 31.7 / 1.2 = 26.4 s; one that ran 10% fast, 31.7 / 0.9 = 35.2 s."""
    lo, hi = ErrorBar(-0.10, 0.20, 201, "all").step_range(31.7)
    assert (lo, hi) == (pytest.approx(26.4167, abs=1e-4), pytest.approx(35.2222, abs=1e-4))


@pytest.mark.parametrize(
    "pp, tp, form",
    [(4, 8, "pipelined"), (4, 1, "pipelined"), (1, 8, "tensor parallel"), (1, 1, "data parallel")],
)
def test_layouts_group_by_their_parallel_form(pp, tp, form):
    assert parallel_form(pp, tp) == form


def _bars(tmp_path):
    """A100: 6 pipelined runs (errors -0.05 .. +0.20) and 2 data-parallel ones; H100: 1 run."""
    runs = [
        {"chip": "A100", "form": "pipelined", "error": e} for e in (-0.05, 0, 0.05, 0.1, 0.15, 0.2)
    ]
    runs += [{"chip": "A100", "form": "data parallel", "error": e} for e in (-0.3, -0.1)]
    runs += [{"chip": "H100", "form": "data parallel", "error": 0.4}]
    data = summarize(runs, {"a100-80g": "A100", "h100-sxm": "H100"})
    path = tmp_path / "error_bars.json"
    path.write_text(json.dumps(data))
    return path


def test_the_plans_cell_then_its_chip_then_every_run(tmp_path):
    """A cell of at least MIN_RUNS runs is its own bar; a smaller one gives way to its chip's
    runs, a chip with too few runs to all runs, and a profile no run used (the CPU) to all."""
    path = _bars(tmp_path)
    assert MIN_RUNS == 5
    bar = error_bar("a100-80g", 8, 8, path)
    # six errors -0.05 .. 0.20 in steps of 0.05: positions 0.5 and 4.5
    assert (bar.low, bar.high, bar.runs, bar.scope) == (
        pytest.approx(-0.025),
        pytest.approx(0.175),
        6,
        "A100, pipelined",
    )
    chip = error_bar("a100-80g", 1, 1, path)  # 2 data-parallel runs: the chip's 8
    assert (chip.runs, chip.scope) == (8, "A100")
    assert chip.low == pytest.approx(spread([-0.3, -0.1, -0.05, 0, 0.05, 0.1, 0.15, 0.2])[0])
    everything = error_bar("h100-sxm", 1, 1, path)  # H100 has one run
    assert (everything.runs, everything.scope) == (9, "all")
    assert error_bar("cpu", 1, 1, path).scope == "all"
    assert error_bar("cpu", 1, 1, tmp_path / "missing.json") is None


def test_plan_prints_the_range_and_the_runs_it_is_read_from():
    pred = Prediction(31.7, 1.0, 2.0, 0.4, [], step_time_range_s=[26.42, 35.22])
    pred.step_time_range_runs, pred.step_time_range_scope = 201, "all"
    assert step_with_range(pred) == "31.70 s (26.4-35.2 s, from 201 published runs)"
    pred.step_time_range_scope = "A100, pipelined"
    assert step_with_range(pred).endswith("from 201 published A100 pipelined runs)")
    fast = Prediction(0.0123, 1.0, 2.0, 0.4, [], step_time_range_s=[0.0101, 0.0149])
    fast.step_time_range_runs, fast.step_time_range_scope = 9, "all"
    assert step_with_range(fast) == "12.3 ms (10.1-14.9 ms, from 9 published runs)"
    assert step_with_range(Prediction(2.0, 1.0, 2.0, 0.4, [])) == "2.00 s"


@pytest.fixture(scope="module")
def planned():
    from pathlib import Path

    from planner.api import plan
    from planner.search import Pins

    gpt = Path(__file__).resolve().parent.parent / "examples" / "gpt.py"
    return plan(gpt, 4, model_args={"size": "tiny"}, profile="cpu", pins=Pins(pp=2, dp=2)).plan


def test_plan_json_keeps_the_range_and_older_plans_still_load(planned):
    """A plan stores its range (the CPU's: every published run's spread) and reads back the
    same; a plan written before error bars existed loads with none; a malformed range is one
    clear error."""
    pred = planned.predicted
    bar = error_bar("cpu", 2, 1)
    assert bar is not None and pred.step_time_range_runs == bar.runs
    lo, hi = bar.step_range(pred.step_time_s)
    assert pred.step_time_range_s == [pytest.approx(lo), pytest.approx(hi)]
    data = planned.to_dict()
    again = plan_from_dict(json.loads(json.dumps(data)))
    assert again.predicted.step_time_range_s == pred.step_time_range_s
    old = json.loads(json.dumps(data))
    for key in ("step_time_range_s", "step_time_range_runs", "step_time_range_scope"):
        old["predicted"].pop(key)
    older = plan_from_dict(old)
    assert older.predicted.step_time_range_s is None
    assert step_with_range(older.predicted) == human_time(older.predicted.step_time_s)
    old["predicted"]["step_time_range_s"] = [3.0]
    with pytest.raises(UserInputError, match="step_time_range_s"):
        plan_from_dict(old)
