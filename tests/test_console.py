"""The terminal output fits 80 columns and stays short: stage tables name block ranges and
collapse identical stages, long names are shortened from the middle, the pool's table carries
every option in one line each, and a mixed option of one kind is not labelled like that kind's
own options. Checked on a real 35-stage plan and on the pool file's own node types."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent


def rendered(renderable, width: int = 80) -> list[str]:
    buf = io.StringIO()
    Console(file=buf, width=width, highlight=False).print(renderable)
    return buf.getvalue().splitlines()


def test_middle_keeps_both_ends():
    from planner.report.console import middle

    name = "model.decoder.layers.17.self_attn"
    assert middle(name, 100) == name
    short = middle(name, 15)
    assert len(short) == 15 and "…" in short
    assert short.startswith(name[:7]) and short.endswith(name[-7:])


def test_block_ranges_are_named_as_a_person_would():
    from planner.report.console import block_range

    assert block_range(["layers.3", "layers.4", "layers.5"]) == "layers 3-5"
    assert block_range(["model.h.10", "model.h.11"]) == "model.h 10-11"
    assert block_range(["embed"]) == "embed"
    assert block_range(["layers.3", "layers.5"]) == "layers.3, layers.5"  # not consecutive
    assert block_range(["wte+wpe", "layers.0", "layers.1"]) == "wte+wpe, layers 0-1"
    assert block_range(["enc.layers.1", "dec.layers.0"]) == "enc.layers.1, dec.layers.0"


@pytest.fixture(scope="module")
def plan35():
    """A tiny GPT of 33 layers on 35 pipeline stages: embeddings, one layer each, the head."""
    from planner.api import plan
    from planner.search import Pins

    result = plan(
        str(ROOT / "examples" / "gpt.py"),
        35,
        model_args={"size": "tiny", "layers": 33},
        profile="h100-sxm",
        gpus_per_node=35,
        pins=Pins(pp=35),
        compare_baselines=False,
    )
    assert len(result.plan.stages) == 35
    return result.plan


def test_a_35_stage_plan_prints_a_short_stage_table(plan35):
    from planner.report.console import stage_rows, stage_table

    rows = stage_rows(plan35)
    # the 33 one-layer stages show the same figures: one row, named by their ranges
    assert [r[0] for r in rows] == ["0", "1-33", "34"]
    assert rows[1][1] == "layers 0-32" and rows[1][2] == "1-33"
    lines = rendered(stage_table(plan35, 80))
    assert len(lines) <= 12 + 2  # title, header, rows
    assert all(len(line) <= 80 for line in lines)


def test_stages_that_differ_are_summed_up_in_the_middle(plan35):
    """Every stage different (a compute time of its own): the table keeps its ends and one
    row for the middle, never more than MAX_STAGE_ROWS rows."""
    from planner.report.console import MAX_STAGE_ROWS, stage_rows

    stages = [replace(st, compute_s=1e-3 * (i + 1)) for i, st in enumerate(plan35.stages)]
    rows = stage_rows(replace(plan35, stages=stages))
    assert len(rows) <= MAX_STAGE_ROWS
    assert rows[0][0] == "0" and rows[-1][0] == "34"
    middle_row = next(r for r in rows if "-" in r[0])
    first, last = (int(x) for x in middle_row[0].split("-"))
    assert last - first + 1 == 35 - (len(rows) - 1)  # every stage is in exactly one row
    assert middle_row[3].endswith(f"({last - first + 1})")  # as many distinct compute times


def test_the_plan_summary_fits_80_columns(plan35, capsys, monkeypatch):
    from planner.report.console import print_plan

    monkeypatch.setenv("COLUMNS", "80")
    print_plan(plan35, [Path("plan.json")])
    out = capsys.readouterr().out.splitlines()
    assert out and all(len(line) <= 80 for line in out), max(out, key=len)
    assert len(out) < 30


def _options():
    """Options of the onprem pool's kinds with figures the test states, plus a pipeline over
    one kind with stage degrees of its own, as planner.resources.mixed_pool makes it."""
    from planner.resources.choose import Option, PlanPoint, mixed_label
    from planner.resources.energy import run_cost
    from planner.resources.pool import load_pool

    pool = load_pool(ROOT / "profiles" / "pools" / "onprem.toml")
    options = []
    for node in pool.node_types:
        for n, step in ((1, 2.0), (2, 1.1)):
            gpus = n * node.gpus_per_node
            run = run_cost(node, n, gpus, 1000, step, 1.0, pool.effective_time_fraction)
            point = PlanPoint(step, 0.4, 4096, f"pp1 dp{gpus} tp1")
            options.append(Option(node, n, point, run))
    h100 = pool.node_types[-1]
    name = mixed_label([h100.name, h100.name], 24, "2/1", "8")
    run = run_cost(h100, 2, 24, 1000, 0.9, 1.0, pool.effective_time_fraction)
    point = PlanPoint(0.9, 0.45, 4096, f"pp2 dp8 tp2/1 ({h100.name}/{h100.name})")
    options.append(Option(h100, 2, point, run, name=name, gpu_count=24))
    options.append(Option(pool.node_types[0], 4, None, None, "needs 81.2 GiB of 79.2 GiB"))
    return pool, options


def test_a_mixed_option_of_one_kind_is_labelled_by_its_gpus_and_degrees():
    from planner.resources.choose import mixed_label

    pool, options = _options()
    mixed = options[-2]
    assert mixed.label == f"{pool.node_types[-1].name} 24 GPUs tp 2/1 dp 8"
    assert mixed.gpus == 24
    labels = [o.label for o in options]
    assert len(set(labels)) == len(labels)
    assert mixed_label(["a100", "h100"], 16, "2/1", "4") == ""  # several kinds: name x nodes


def test_the_pool_table_fits_80_columns_one_line_per_option(capsys, monkeypatch):
    from planner.resources.choose import choose, pareto
    from planner.resources.figure import print_table, table_rows

    _, options = _options()
    front = pareto(options)
    chosen = choose(options, "time")
    rows = table_rows(options, chosen, front, None, None)
    monkeypatch.setenv("COLUMNS", "80")
    print_table(rows, "profiles/pools/onprem.toml: by time")
    out = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 80 for line in out), max(out, key=len)
    assert len(out) == 1 + 1 + len(options) + 1  # title, header, one row each, legend
    chosen_line = next(line for line in out if line.startswith("*"))
    assert chosen.label[:10] in chosen_line


def test_resources_json_holds_every_option_and_reads_back(tmp_path):
    import argparse
    import json

    from planner.resources.choose import choose, pareto
    from planner.resources.command import resources_doc, write_resources

    pool, options = _options()
    front = pareto(options)
    chosen = choose(options, "cost")
    args = argparse.Namespace(objective="cost", deadline=None, budget=None, tokens=10**9)
    model = argparse.Namespace(path=Path("examples/mlp.py"))
    doc = resources_doc(args, model, pool, options, chosen, front, ["a note"])
    path = write_resources(tmp_path, doc)
    back = json.loads(path.read_text())
    assert [o["label"] for o in back["options"]] == [o.label for o in options]
    assert back["chosen"] == chosen.label
    assert [o["label"] for o in back["options"] if o["chosen"]] == [chosen.label]
    assert set(back["pareto"]) == {o.label for o in front}
    misfit = back["options"][-1]
    assert not misfit["fits"] and misfit["why_not"].startswith("needs")
    lines = Path(pool.path).read_text().splitlines()
    for fig in back["figures"]:
        if fig["line"] is not None:  # the cited line types that figure
            assert lines[fig["line"] - 1].split("=")[0].strip() == fig["figure"]


def test_json_puts_the_plan_alone_on_stdout(tmp_path, capsys):
    """``--json``: stdout is plan.json as written, nothing else (no table, no 'wrote' line);
    ``plan show --json`` prints the same document."""
    import json

    from meshplan.cli import main

    out = tmp_path / "tiny"
    args = ["examples/gpt.py", "--model-arg", "size=tiny", "--gpus", "2", "--profile", "h100-sxm"]
    assert main([str(ROOT / args[0]), *args[1:], "--out", str(out), "--json"]) == 0
    printed = capsys.readouterr().out
    assert json.loads(printed) == json.loads((out / "plan.json").read_text())
    assert main(["show", str(out / "plan.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(printed)


def test_bars_are_drawn_only_for_a_person_at_a_terminal(monkeypatch):
    """Not with --quiet, not when stderr is a pipe or a file, not in CI."""
    import sys

    from planner.progress import Bars, bars_enabled

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert bars_enabled() and not bars_enabled(quiet=True)
    monkeypatch.setenv("CI", "true")
    assert not bars_enabled()
    monkeypatch.delenv("CI")
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not bars_enabled()
    with Bars(verbose=True) as bars:  # disabled: every call is a no-op, --verbose still says
        bars.task("x", total=2).advance(info="one")
        bars.search_callback()("solve", 1, 4, pruned=2)
        bars.say("planning pp2 dp1 tp1")
    assert sys.stderr.getvalue() == "planning pp2 dp1 tp1\n"
