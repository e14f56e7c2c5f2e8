"""``plan MODEL.py`` draws its report in a worker process while it searches: the files it
leaves are the ones ``write_report`` writes in-process, byte for byte, report.html is complete
when the command returns, ``--no-report`` writes plan.json alone, and a request that ends in an
error leaves no worker behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshplan.cli import main
from planner.report import REPORT_NAMES, report_files, write_report
from planner.report.worker import ReportWorker
from planner.schema import load_plan

ROOT = Path(__file__).resolve().parent.parent
MLP = ["examples/mlp.py", "--model-arg", "size=small", "--gpus", "8", "--quiet"]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.chdir(ROOT)


def test_worker_writes_what_write_report_writes(tmp_path):
    out = tmp_path / "cli"
    assert main([*MLP, "--out", str(out), "--svg"]) == 0
    assert sorted(out.iterdir()) == sorted([out / "plan.json", *report_files(out, svg=True)])
    page = (out / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == len(REPORT_NAMES)
    # the same plan drawn in this process: the same bytes (the command line aside)
    again = tmp_path / "here"
    command = page.split("<pre>")[-1].split("</pre>")[0]
    write_report(load_plan(out / "plan.json"), again, "COMMAND", svg=True)
    for path in report_files(out, svg=True):
        mine = (again / path.name).read_bytes()
        if path.name == "report.html":
            mine = mine.replace(b"COMMAND", command.encode())
        assert path.read_bytes() == mine, path.name


def test_no_report_writes_the_plan_alone(tmp_path):
    assert main([*MLP, "--out", str(tmp_path), "--no-report"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_an_infeasible_request_ends_the_worker(tmp_path, capsys):
    # no plan fits in 1% of a device: the worker is never asked, and must not be left waiting
    argv = [*MLP, "--out", str(tmp_path), "--memory-fraction", "0.0001"]
    assert main(argv) == 3
    assert "no plan fits" in capsys.readouterr().err
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_worker_draws_a_plan_that_plan_json_cannot_hold_back(tmp_path):
    """An alternative whose lower bound is infinite (Llama-3-8B at 128K tokens on 8 GPUs has
    one) is written to plan.json but refused when read back: the worker draws the planner's
    own record, so such a plan still gets its report, as write_report gave it in-process."""
    assert main([*MLP, "--out", str(tmp_path / "p"), "--no-report"]) == 0
    doc = load_plan(tmp_path / "p" / "plan.json")
    doc.solver.alternatives[-1].lower_bound_step_time_s = float("inf")
    with ReportWorker() as worker:
        worker.draw(doc, tmp_path / "r", "plan x", svg=False)
        written = worker.result()
    assert written == report_files(tmp_path / "r")
    here = write_report(doc, tmp_path / "here", "plan x")
    assert [p.read_bytes() for p in written] == [p.read_bytes() for p in here]


def test_figures_the_forked_copy_fails_to_draw_are_drawn_here(tmp_path, monkeypatch):
    """render_all(split=True) draws FORKED's figures in a forked copy; where the copy fails,
    this process draws them itself: the same bytes as drawing all five in turn."""
    import os

    from planner.report import figures

    assert main([*MLP, "--out", str(tmp_path), "--no-report"]) == 0
    plan = load_plan(tmp_path / "plan.json")
    whole = figures.render_all(plan, ("png",))
    here = os.getpid()
    name = figures.FORKED[0]
    inner = figures.FIGURES[name]

    def only_here(p):
        if os.getpid() != here:
            raise RuntimeError("the forked copy fails")
        return inner(p)

    monkeypatch.setitem(figures.FIGURES, name, only_here)
    assert figures.render_all(plan, ("png",), split=True) == whole
