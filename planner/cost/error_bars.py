"""How far a predicted step time may be from a measured one: the cost model's error bar.

``benchmarks/published.py`` cross-validates the cost model on published GPU training runs:
its fitted efficiencies are fitted on one half of the runs and the other half is priced with
them, both ways, so every run has a held-out error (predicted / measured - 1). It writes the
spread of those errors, per chip and per parallel form, to ``profiles/error_bars.json``; this
module reads it and turns a prediction into a range.

The range is the central 80% of the held-out errors of the runs most like the plan: the plan's
chip and parallel form (pipelined, tensor parallel, or data parallel alone) when at least
``MIN_RUNS`` runs share both, else the chip's runs, else every run (a chip no published run
used, the CPU included). A measured time t and a prediction p with error e relate as
p = t (1 + e), so the range of t is p / (1 + e_90) .. p / (1 + e_10).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

# the fewest runs a cell's spread is read from before a wider group stands in for it
MIN_RUNS = 5
# the central share of the held-out errors the range spans (10th to 90th percentile)
QUANTILES = (0.10, 0.90)
ALL = "all"


@dataclass(frozen=True)
class ErrorBar:
    """The held-out errors' 10th and 90th percentiles (predicted / measured - 1) of ``runs``
    published runs, and which runs they are (``scope``: "A100, pipelined", "H100", "all")."""

    low: float
    high: float
    runs: int
    scope: str

    def step_range(self, predicted_s: float) -> tuple[float, float]:
        """(fastest, slowest) measured step the errors allow for a prediction of
        ``predicted_s``: a model that ran slow (positive error) means a faster real step."""
        return predicted_s / (1 + self.high), predicted_s / (1 + self.low)


def error_bars_file() -> Path:
    from planner.hardware.profiles import profiles_dir

    return profiles_dir() / "error_bars.json"


def parallel_form(pp: int, tp: int) -> str:
    """The parallel form a layout is grouped by: "pipelined" (pp > 1, whatever else),
    "tensor parallel" (tp > 1 without a pipeline), or "data parallel" (replicas or shards
    alone)."""
    if pp > 1:
        return "pipelined"
    return "tensor parallel" if tp > 1 else "data parallel"


def spread(errors: list[float]) -> tuple[float, float]:
    """The 10th and 90th percentiles of ``errors`` (linear between order statistics)."""
    if not errors:
        raise ValueError("no errors to take a spread of")
    if len(errors) == 1:
        return errors[0], errors[0]
    cuts = statistics.quantiles(errors, n=100, method="inclusive")
    lo, hi = (cuts[round(q * 100) - 1] for q in QUANTILES)
    return lo, hi


def summarize(runs: list[dict], chips: dict[str, str]) -> dict:
    """The file ``error_bars_file`` holds, from held-out runs, each
    ``{"chip": ..., "form": ..., "error": ...}``: every cell's spread and run count, by chip
    and form, by chip, and over all; ``chips`` maps profile names to the chip they group under."""
    cells: dict[str, dict[str, list[float]]] = {}
    for r in runs:
        if not math.isfinite(r["error"]):
            continue
        for chip in (r["chip"], ALL):
            for form in (r["form"], ALL):
                cells.setdefault(chip, {}).setdefault(form, []).append(r["error"])
    out = {
        chip: {form: dict(zip(("low", "high"), spread(e)), runs=len(e)) for form, e in f.items()}
        for chip, f in sorted(cells.items())
    }
    return {"quantiles": list(QUANTILES), "profiles": dict(sorted(chips.items())), "spread": out}


def error_bar(profile: str, pp: int, tp: int, path: Path | None = None) -> ErrorBar | None:
    """The error bar of a plan on ``profile`` with ``pp`` stages and TP degree ``tp``, or None
    when no error-bar file is there (a checkout that never ran the published benchmark)."""
    path = path or error_bars_file()
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    spreads = data.get("spread", {})
    chip = data.get("profiles", {}).get(profile)
    form = parallel_form(pp, tp)
    tries = [(chip, form, f"{chip}, {form}"), (chip, ALL, chip)] if chip else []
    tries.append((ALL, ALL, "all"))
    for c, f, scope in tries:
        cell = spreads.get(c, {}).get(f)
        if cell and (cell["runs"] >= MIN_RUNS or c == ALL):
            return ErrorBar(cell["low"], cell["high"], cell["runs"], scope)
    return None
