"""Tests written for mutmut's generated mutants of planner/cost/error_bars.py (benchmarks/
generated_mutants.py): the error-bar file's cells summed by hand from a few runs, and the
lookup's edges (a cell of exactly MIN_RUNS runs, a file that is not JSON, one without cells).
docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import json

import pytest

from planner.cost.error_bars import (
    ErrorBar,
    error_bar,
    error_bars_file,
    parallel_form,
    spread,
    summarize,
)
from planner.hardware.profiles import profiles_dir


def _run(chip: str, form: str, error: float) -> dict:
    return {"chip": chip, "form": form, "error": error}


def test_each_cell_holds_its_runs_spread_and_count():
    """Runs: B100 pipelined 0.1, 0.3 (and a NaN, skipped); B100 data parallel -0.2; A100
    pipelined 0.5. Cells by chip and form, by chip over forms, by form over chips, and all."""
    runs = [_run("B100", "pipelined", 0.1), _run("B100", "pipelined", float("nan")),
            _run("B100", "pipelined", 0.3), _run("B100", "data parallel", -0.2),
            _run("A100", "pipelined", 0.5), _run("A100", "pipelined", float("inf"))]  # fmt: skip
    data = summarize(runs, {"z-chip": "B100", "a-chip": "A100"})
    assert data["quantiles"] == [0.1, 0.9]
    assert list(data["profiles"]) == ["a-chip", "z-chip"]  # sorted
    assert data["profiles"] == {"a-chip": "A100", "z-chip": "B100"}
    assert list(data["spread"]) == ["A100", "B100", "all"]
    b = data["spread"]["B100"]
    # two errors 0.1, 0.3: 10th percentile at 0.1 + 0.1 x 0.2, 90th at 0.1 + 0.9 x 0.2
    assert b["pipelined"]["runs"] == 2
    assert b["pipelined"]["low"] == pytest.approx(0.12)
    assert b["pipelined"]["high"] == pytest.approx(0.28)
    assert b["data parallel"] == {"low": -0.2, "high": -0.2, "runs": 1}
    assert b["all"]["runs"] == 3 and b["all"]["low"] == pytest.approx(-0.2 + 0.2 * 0.3)
    assert data["spread"]["A100"] == {
        "pipelined": {"low": 0.5, "high": 0.5, "runs": 1},
        "all": {"low": 0.5, "high": 0.5, "runs": 1},
    }
    every = data["spread"]["all"]
    assert (every["pipelined"]["runs"], every["data parallel"]["runs"], every["all"]["runs"]) == (
        3, 1, 4,
    )  # fmt: skip
    assert set(every["all"]) == {"low", "high", "runs"}


def test_no_errors_have_no_spread():
    with pytest.raises(ValueError, match="^no errors to take a spread of$"):
        spread([])


def test_the_percentiles_are_the_10th_and_90th_of_eleven_errors():
    """Eleven errors 0 .. 1.0: the 10th percentile is the second (0.1), the 90th the tenth."""
    lo, hi = spread([i / 10 for i in range(11)])
    assert (lo, hi) == (pytest.approx(0.1), pytest.approx(0.9))


def test_the_file_lies_in_the_profiles_folder():
    assert error_bars_file() == profiles_dir() / "error_bars.json"


def _write(tmp_path, cells: dict, chips: dict) -> object:
    path = tmp_path / "bars.json"
    path.write_text(json.dumps({"profiles": chips, "spread": cells}))
    return path


def test_a_cell_of_exactly_min_runs_is_its_own_bar(tmp_path):
    cell = {"low": -0.1, "high": 0.2, "runs": 5}
    small = {"low": -0.3, "high": 0.4, "runs": 4}
    every = {"low": -0.5, "high": 0.6, "runs": 40}
    path = _write(
        tmp_path,
        {
            "H100": {"tensor parallel": cell, "pipelined": small, "all": small},
            "all": {"all": every},
        },
        {"h100-sxm": "H100"},
    )
    assert error_bar("h100-sxm", 1, 8, path) == ErrorBar(-0.1, 0.2, 5, "H100, tensor parallel")
    # a cell and a chip of 4 runs each: every run stands in
    assert error_bar("h100-sxm", 2, 8, path) == ErrorBar(-0.5, 0.6, 40, "all")
    # a chip without a data-parallel cell: its chip's (4 runs: too few), then all
    assert error_bar("h100-sxm", 1, 1, path) == ErrorBar(-0.5, 0.6, 40, "all")


def test_the_chips_cell_stands_in_for_a_small_form(tmp_path):
    chip = {"low": -0.05, "high": 0.15, "runs": 12}
    path = _write(
        tmp_path,
        {"A100": {"pipelined": {"low": 0, "high": 0, "runs": 2}, "all": chip},
         "all": {"all": {"low": -1, "high": 1, "runs": 99}}},
        {"a100-80g": "A100"},
    )  # fmt: skip
    assert error_bar("a100-80g", 4, 1, path) == ErrorBar(-0.05, 0.15, 12, "A100")


def test_every_run_is_the_bar_whatever_its_count(tmp_path):
    """The last resort has no floor: two runs in all still give a bar."""
    path = _write(tmp_path, {"all": {"all": {"low": -0.2, "high": 0.3, "runs": 2}}}, {})
    assert error_bar("cpu", 1, 1, path) == ErrorBar(-0.2, 0.3, 2, "all")


@pytest.mark.parametrize(
    "text", ["{not json", "{}", '{"spread": {}}', '{"profiles": {"cpu": "CPU"}}']
)
def test_a_file_without_the_cells_gives_no_bar(tmp_path, text):
    path = tmp_path / "bars.json"
    path.write_text(text)
    assert error_bar("cpu", 1, 1, path) is None


def test_the_shipped_file_is_read_when_no_path_is_given():
    shipped = json.loads(error_bars_file().read_text())
    cell = shipped["spread"]["all"]["all"]
    bar = error_bar("a-profile-no-run-used", 1, 1)
    assert bar == ErrorBar(cell["low"], cell["high"], cell["runs"], "all")


def test_two_tp_ranks_are_tensor_parallel():
    assert parallel_form(1, 2) == "tensor parallel"
    assert parallel_form(2, 2) == "pipelined"
