"""``plan MODEL.py`` draws its report in a worker process while it searches: the files it
leaves are the ones ``write_report`` writes in-process, byte for byte, report.html is complete
when the command returns, ``--no-report`` writes plan.json alone, and a request that ends in an
error leaves no worker behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshplan.cli import main
from planner.report import REPORT_NAMES, report_files, write_report
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
