"""The report worker draws the figures from a draft: the plan when its own search ends, before
the baselines' rows are in its alternatives. No figure reads those rows, so the draft's figures
are the plan's, byte for byte, and ``figures_hold`` says so; a draft that differs otherwise is
drawn again from the plan, and the files are those write_report writes in-process."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from planner.api import plan
from planner.report import figures_hold, report_files, write_report
from planner.report.figures import render_all
from planner.report.worker import ReportWorker

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """(draft, plan) of the small MLP on 8 GPUs, baselines compared."""
    mp = pytest.MonkeyPatch()
    mp.setenv("MESHPLAN_CACHE", str(tmp_path_factory.mktemp("cache")))
    drafts = []
    result = plan(
        ROOT / "examples" / "mlp.py", 8, model_args={"size": "small"}, draft=drafts.append
    )
    mp.undo()
    (draft,) = drafts
    return draft, result.plan


def test_the_draft_lacks_only_the_baselines_and_draws_the_same_figures(planned):
    draft, final = planned
    baselines = [a for a in final.solver.alternatives if a.baseline]
    assert baselines  # the plan compared baselines; the draft has none of them
    assert [a for a in draft.solver.alternatives if a.baseline] == []
    assert draft.solver.alternatives == [a for a in final.solver.alternatives if not a.baseline]
    assert draft != final and figures_hold(draft, final)
    assert render_all(draft, ("png", "svg")) == render_all(final, ("png", "svg"))


def test_a_draft_that_differs_elsewhere_does_not_hold(planned):
    draft, final = planned
    slower = dataclasses.replace(final.predicted, step_time_s=final.predicted.step_time_s * 2)
    assert not figures_hold(dataclasses.replace(draft, predicted=slower), final)
    assert not figures_hold(
        dataclasses.replace(draft, micro_batch_size=final.micro_batch_size + 1), final
    )


@pytest.mark.parametrize("holds", [True, False])
def test_the_worker_writes_the_plans_report_after_a_draft(planned, tmp_path, holds):
    draft, final = planned
    if not holds:  # a draft whose figures are not the plan's: drawn again
        slower = dataclasses.replace(final.predicted, step_time_s=final.predicted.step_time_s * 2)
        draft = dataclasses.replace(draft, predicted=slower)
    with ReportWorker() as worker:
        worker.draft(draft, svg=False)
        worker.draw(final, tmp_path / "w", "plan x", svg=False)
        written = worker.result()
    assert written == report_files(tmp_path / "w")
    here = write_report(final, tmp_path / "here", "plan x")
    assert [p.read_bytes() for p in written] == [p.read_bytes() for p in here]
