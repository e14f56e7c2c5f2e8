"""Tests written for mutmut's generated mutants of planner/resources/command.py (benchmarks/
generated_mutants.py): the ``--resources`` path with the planner stood in (each option's plan
point written by hand, the mixed option's planner recording what it is asked), so that what the
command writes, prints and refuses is checked whole in milliseconds: resources.json field by
field, the chosen and mixed plans written, the table and the sentences under it, the flags'
refusals, the progress bars' descriptions. docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_mutant_kills_pool_schema import plan_doc

from planner.errors import InfeasibleError, UserInputError
from planner.progress import Bars
from planner.resources import command
from planner.resources.choose import Option, PlanPoint
from planner.resources.command import (
    SCHEMA,
    chosen_kinds,
    option_record,
    print_choice,
    resources_doc,
    run_resources,
    say,
    write_resources,
)
from planner.resources.energy import RunCost
from planner.resources.pool import NodeType, load_pool
from planner.schema import load_plan, plan_from_dict
from planner.training import Training

POOL = """effective_time_fraction = 0.5

[[node]]
name = "a"
profile = "a100-80g"
nodes = 2
gpus_per_node = 4
price_per_gpu_hour = 1.0
gpu_busy_watts = 400
node_watts = 1000
carbon_g_per_kwh = 400
pue = 1.5

[[node]]
name = "h"
profile = "h100-sxm"
nodes = 1
gpus_per_node = 4
price_per_gpu_hour = 3.0
gpu_busy_watts = 700
gpu_idle_watts = 100
node_watts = 2000
carbon_g_per_kwh = 100
pue = 1.2
"""
FABRIC = """
[[fabric]]
between = ["a", "h"]
bandwidth_bytes_per_s = 1e10
latency_s = 1e-5
"""
# seconds a step of each option (None: fits no plan), 1,000 tokens a step, busy all step
STEPS = {("a", 1): None, ("a", 2): 4.0, ("h", 1): 3.0}
PLAN = plan_from_dict(plan_doc())


def args(tmp_path: Path, pool_text: str = POOL, **over) -> argparse.Namespace:
    path = tmp_path / "pool.toml"
    path.write_text(pool_text)
    base = dict(
        resources=str(path), tokens=10_000, objective="time", deadline=None, budget=None,
        quiet=False, json=False, verbose=False, out=str(tmp_path / "out"), no_cache=True,
        stage_degrees="auto",
    )  # fmt: skip
    return argparse.Namespace(**{**base, **over})


MF = SimpleNamespace(path=Path("/models/tiny_gpt.py"))


@pytest.fixture
def stand_ins(monkeypatch):
    """The planner stood in: plan_option answers STEPS (the chosen plan carries PLAN),
    mixed_option records its arguments and answers ``seen.mixed``, save_kept and draw_front
    record (test_mutant_kills_figure checks the figure)."""
    seen = SimpleNamespace(kwargs=None, mixed_args=None, mixed=(None, None), kept=[], asked=[])

    def plan_option(mf, kwargs):
        seen.mf = mf
        seen.kwargs = dict(kwargs)
        seen.kwargs_obj = kwargs

        def run(node, n):
            seen.asked.append((node.name, n))
            step = STEPS[node.name, n]
            if step is None:
                raise InfeasibleError(f"{node.name} x{n} does not fit; detail")
            return PlanPoint(
                step, 0.25, 1000, f"dp{n * 4}", plan=PLAN if node.name == "h" else None
            )

        return run

    def mixed_option(*a):
        seen.mixed_args = a
        seen.mixed_kwargs = dict(a[2])
        return seen.mixed

    monkeypatch.setattr(command, "plan_option", plan_option)
    monkeypatch.setattr(command, "mixed_option", mixed_option)
    monkeypatch.setattr(command, "save_kept", lambda kept: seen.kept.append(kept))
    seen.drawn = []

    def draw_front(options, chosen, front, path):  # matplotlib's figure: a second a call
        seen.drawn.append((options, chosen, front, path))
        return path

    monkeypatch.setattr(command, "draw_front", draw_front)
    monkeypatch.setenv("COLUMNS", "200")
    return seen


@pytest.mark.parametrize("flag", ["gpus", "nodes", "profile", "gpus_per_node"])
def test_device_flags_exclude_the_pool(tmp_path, stand_ins, flag):
    with pytest.raises(UserInputError) as exc:
        run_resources(args(tmp_path, **{flag: 2}), MF, Training(8), None)
    name = flag.replace("_", "-")
    assert str(exc.value) == (
        f"--{name} and --resources exclude each other: the pool file says which devices and "
        "how many"
    )


@pytest.mark.parametrize("flag", ["deadline", "budget"])
@pytest.mark.parametrize("value", [0, -1.5])
def test_deadline_and_budget_must_be_positive(tmp_path, stand_ins, flag, value):
    with pytest.raises(UserInputError) as exc:
        run_resources(args(tmp_path, **{flag: value}), MF, Training(8), None)
    assert str(exc.value) == f"--{flag} must be positive, got {value}"


def expected_options(tmp_path: Path) -> list[dict]:
    """10 steps (10,000 tokens at 1,000) at 50% effective: a x2 runs 4 s steps for 80 s,
    h x1 3 s steps for 60 s. a x2: 8 GPUs x 80 s = 0.17778 GPU-h, $0.17778; (8 x 400 +
    2 x 1000) x 80 / 3.6e6 x 1.5 = 0.17333 kWh, 69.333 g. h x1: 4 x 60 s = 0.066667 GPU-h,
    $0.2; (4 x 700 + 2000) x 60 / 3.6e6 x 1.2 = 0.096 kWh, 9.6 g."""
    a_kwh = (8 * 400 + 2 * 1000) * 80 / 3.6e6 * 1.5
    h_kwh = (4 * 700 + 2000) * 60 / 3.6e6 * 1.2
    unfit = dict(
        label="a x1", kinds=["a"], mixed=False, nodes=1, gpus=4, fits=False,
        why_not="a x1 does not fit", mesh=None, step_time_s=None, mfu=None, busy_share=None,
        tokens_per_step=None, steps=None, wall_h=None, cost_usd=None, energy_kwh=None,
        carbon_kg=None, chosen=False, pareto=False,
    )  # fmt: skip
    a2 = dict(
        label="a x2", kinds=["a"], mixed=False, nodes=2, gpus=8, fits=True, why_not=None,
        mesh="dp8", step_time_s=4.0, mfu=0.25, busy_share=1.0, tokens_per_step=1000,
        steps=10, wall_h=80 / 3600, cost_usd=8 * 80 / 3600, energy_kwh=a_kwh,
        carbon_kg=a_kwh * 0.4, chosen=False, pareto=True,
    )  # fmt: skip
    h1 = dict(
        label="h x1", kinds=["h"], mixed=False, nodes=1, gpus=4, fits=True, why_not=None,
        mesh="dp4", step_time_s=3.0, mfu=0.25, busy_share=1.0, tokens_per_step=1000,
        steps=10, wall_h=60 / 3600, cost_usd=3 * 4 * 60 / 3600, energy_kwh=h_kwh,
        carbon_kg=h_kwh * 0.1, chosen=True, pareto=True,
    )  # fmt: skip
    return [unfit, a2, h1]


def approx_doc(doc: dict) -> dict:
    return json.loads(json.dumps(doc), parse_float=lambda s: pytest.approx(float(s)))


def test_the_fastest_option_is_written_with_resources_json_and_the_figure(
    tmp_path, stand_ins, capsys
):
    a = args(tmp_path)
    assert run_resources(a, MF, Training(8), None) == 0
    out = tmp_path / "out"
    assert stand_ins.asked == [("a", 1), ("a", 2), ("h", 1)]
    doc = json.loads((out / "resources.json").read_text())
    pool = load_pool(a.resources)
    assert doc == approx_doc(
        {
            "schema": SCHEMA, "model": "/models/tiny_gpt.py", "pool": a.resources,
            "objective": "time", "deadline_h": None, "budget_usd": None, "tokens": 10_000,
            "options": expected_options(tmp_path), "chosen": "h x1", "plan": "plan.json",
            "pareto": ["a x2", "h x1"], "figures": command.figure_records(pool, ["a", "h"]),
            "notes": [],
        }
    )  # fmt: skip
    assert SCHEMA == "meshplan.resources/1"
    assert (out / "resources.json").read_text() == json.dumps(doc, indent=2) + "\n"
    assert load_plan(out / "plan.json").to_dict() == PLAN.to_dict()
    ((options, chosen, front, path),) = stand_ins.drawn
    assert [o.label for o in options] == ["a x1", "a x2", "h x1"]
    assert chosen is options[2] and front == options[1:] and path == out / "resources.png"
    assert not (out / "mixed").exists()
    text = capsys.readouterr().out
    assert f"{a.resources}: by time" in text
    assert "does not fit: a x1: a x1 does not fit" in text
    assert "chosen: h x1 has the least time (0.0 h) of the 2 options that meet" in text
    assert f"wrote {out / 'resources.json'}, {out / 'resources.png'}" in text


def test_the_planner_is_asked_with_the_commands_settings(tmp_path, stand_ins):
    training = Training(8)
    run_resources(args(tmp_path, no_cache=False, stage_degrees="off"), MF, training, None)
    kw = stand_ins.kwargs
    assert kw["training"] is training and kw["use_cache"] is True
    assert kw["bounds"] == {} and callable(kw["progress"])
    assert stand_ins.kept == [kw["bounds"]] and stand_ins.kept[0] is kw["bounds"]
    pool, mf, mixed_kwargs, options, tokens, steps, cb, obj, dl, bud, degrees = stand_ins.mixed_args
    assert pool.path == args(tmp_path).resources and mf is MF
    assert mixed_kwargs is stand_ins.kwargs_obj and "progress" not in stand_ins.mixed_kwargs
    assert stand_ins.mixed_kwargs == {"training": training, "use_cache": True, "bounds": {}}
    assert [o.label for o in options] == ["a x1", "a x2", "h x1"]
    assert (tokens, steps, obj, dl, bud, degrees) == (10_000, None, "time", None, None, False)
    assert callable(cb) and stand_ins.mf is MF
    run_resources(args(tmp_path, deadline=100.0, budget=50.0), MF, training, None)
    assert stand_ins.mixed_args[8:10] == (100.0, 50.0)
    run_resources(args(tmp_path, stage_degrees="on"), MF, training, None)
    assert stand_ins.mixed_args[-1] is True and stand_ins.kwargs["use_cache"] is False
    run_resources(args(tmp_path, stage_degrees="auto", tokens=None), MF, training, 7)
    assert stand_ins.mixed_args[-1] is None and stand_ins.mixed_args[5] == 7
    doc = json.loads((tmp_path / "out" / "resources.json").read_text())
    assert [o["steps"] for o in doc["options"]] == [None, 7, 7]


class Recorded(Bars):
    """Bars that keep what each bar is told (no terminal under pytest: the real ones draw
    nothing)."""

    log: list = []

    def task(self, description, total=None):
        rec = SimpleNamespace(description=description, total=total, updates=[])
        Recorded.log.append(rec)

        class T:
            def update(self, **f):
                rec.updates.append(("update", f))

            def advance(self, steps=1, info=None):
                rec.updates.append(("advance", steps, info))

        return T()


def test_progress_bars_and_verbose_lines(tmp_path, stand_ins, monkeypatch, capsys):
    Recorded.log = []
    monkeypatch.setattr(command, "Bars", Recorded)
    run_resources(args(tmp_path, pool_text=POOL + FABRIC, verbose=True), MF, Training(8), None)
    _, _, _, _, _, _, cb, *_ = stand_ins.mixed_args
    cb("pp2 dp1 tp4")
    cb("pp2 dp2 tp2")
    search, pool_bar, mixed_bar = Recorded.log
    assert search.description == "  option: tracing"
    assert (pool_bar.description, pool_bar.total) == ("pool: options", 3)
    assert pool_bar.updates == [
        ("update", {"info": "a x1"}),
        ("update", {"info": "a x2"}),
        ("update", {"info": "h x1"}),
        ("update", {"completed": 3}),
    ]
    assert (mixed_bar.description, mixed_bar.total) == ("pool: pipelines across kinds", None)
    assert mixed_bar.updates == [
        ("advance", 1, "1 candidates solved"),
        ("advance", 1, "2 candidates solved"),
    ]
    err = capsys.readouterr().err.splitlines()
    assert err == ["planning a x1", "planning a x2", "planning h x1"] + [
        "planning pp2 dp1 tp4",
        "planning pp2 dp2 tp2",
    ]


def test_without_a_fabric_the_mixed_candidates_draw_no_bar(tmp_path, stand_ins, monkeypatch):
    Recorded.log = []
    monkeypatch.setattr(command, "Bars", Recorded)
    run_resources(args(tmp_path, quiet=True), MF, Training(8), None)
    stand_ins.mixed_args[6]("pp2")  # no bar to advance: nothing happens
    assert [r.description for r in Recorded.log] == ["  option: tracing", "pool: options"]


def mixed_result(plan, notes=("kept the cheaper",)):
    return SimpleNamespace(plan=plan, search=SimpleNamespace(notes=list(notes)))


def mixed_plan():
    doc = plan_doc()
    doc["kinds"] = [
        {"name": "a", "profile": "a100-80g", "gpus_per_node": 4, "gpus": 2},
        {"name": "h", "profile": "h100-sxm", "gpus_per_node": 4, "gpus": 2},
    ]
    doc["rank_kinds"] = ["a", "a", "h", "h"]
    for st, kind in zip(doc["stages"], "ah", strict=True):
        st["kind"] = kind
    return plan_from_dict(doc)


def test_the_mixed_plan_and_notes_are_written_and_said(tmp_path, stand_ins, capsys):
    plan = mixed_plan()
    run = RunCost(10, 36.0, 0.04, 0.05, 500.0, 0.01, 2.0)
    mixed = Option(
        load_pool_type(tmp_path), 2, PlanPoint(1.8, 0.5, 1000, "pp2 dp1 tp2 (a/h)", 1.0, plan),
        run, name="", gpu_count=4,
    )  # fmt: skip
    stand_ins.mixed = (mixed, mixed_result(plan))
    a = args(tmp_path, pool_text=POOL + FABRIC)
    run_resources(a, MF, Training(8), None)
    out = tmp_path / "out"
    text = capsys.readouterr().out
    assert f"mixed plan: {out / 'mixed' / 'plan.json'}\n" in text
    assert "note: kept the cheaper\n" in text
    assert load_plan(out / "mixed" / "plan.json").to_dict() == plan.to_dict()
    doc = json.loads((out / "resources.json").read_text())
    assert doc["notes"] == ["kept the cheaper"]
    assert doc["chosen"] == "a+h x2"
    last = doc["options"][-1]
    assert last["kinds"] == ["a", "h"] and last["mixed"] is True and last["gpus"] == 4
    assert [o["mixed"] for o in doc["options"]] == [False, False, False, True]
    assert load_plan(out / "plan.json").to_dict() == plan.to_dict()  # the chosen is the mixed
    assert "  a: " in text and "  h: " in text  # figures of both kinds


def load_pool_type(tmp_path):
    """The mixed option's row: a node type named for both kinds (mixed_node_type's)."""
    from dataclasses import replace

    pool = load_pool(args(tmp_path, pool_text=POOL + FABRIC).resources)
    return replace(pool.node_types[0], name="a+h")


def test_quiet_says_nothing_and_json_prints_resources_json(tmp_path, stand_ins, capsys):
    plan = mixed_plan()
    stand_ins.mixed = (None, mixed_result(plan))
    run_resources(args(tmp_path, pool_text=POOL + FABRIC, quiet=True), MF, Training(8), None)
    assert capsys.readouterr().out == ""
    assert (tmp_path / "out" / "mixed" / "plan.json").exists()
    run_resources(args(tmp_path, pool_text=POOL + FABRIC, json=True), MF, Training(8), None)
    printed = capsys.readouterr().out
    doc = json.loads((tmp_path / "out" / "resources.json").read_text())
    assert printed == json.dumps(doc, indent=2) + "\n"


def test_no_mixed_result_means_no_notes(tmp_path, stand_ins):
    stand_ins.mixed = (None, None)
    run_resources(args(tmp_path), MF, Training(8), None)
    assert json.loads((tmp_path / "out" / "resources.json").read_text())["notes"] == []


def test_the_default_output_folder_is_reports_and_the_models_name(tmp_path, stand_ins, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_resources(args(tmp_path, out=None, quiet=True), MF, Training(8), None)
    assert (tmp_path / "reports" / "tiny_gpt" / "resources.json").exists()


def test_a_chosen_option_without_a_plan_writes_none(tmp_path, stand_ins, capsys):
    """By cost the a x2 option ($0.178) wins over h x1 ($0.2): its point holds no plan."""
    run_resources(args(tmp_path, objective="cost"), MF, Training(8), None)
    out = tmp_path / "out"
    doc = json.loads((out / "resources.json").read_text())
    assert doc["chosen"] == "a x2" and doc["plan"] is None
    assert not (out / "plan.json").exists()
    assert "chosen: a x2 has the least cost ($0)" in capsys.readouterr().out


def test_no_option_meeting_the_limits_writes_resources_json_and_raises(tmp_path, stand_ins, capsys):
    a = args(tmp_path, deadline=0.001, budget=0.01)
    with pytest.raises(InfeasibleError):
        run_resources(a, MF, Training(8), None)
    doc = json.loads((tmp_path / "out" / "resources.json").read_text())
    assert doc["chosen"] is None and doc["plan"] is None
    assert doc["deadline_h"] == 0.001 and doc["budget_usd"] == 0.01
    assert doc["notes"] == []
    assert [o["chosen"] for o in doc["options"]] == [False, False, False]
    text = capsys.readouterr().out
    assert f"{a.resources}: no option meets the limits" in text
    assert "DB" in text  # the table's marks: past the deadline and over the budget
    with pytest.raises(InfeasibleError):
        run_resources(args(tmp_path, deadline=0.001, quiet=True), MF, Training(8), None)
    assert capsys.readouterr().out == ""


def test_say_wraps_with_an_indent_and_keeps_hyphenated_words(capsys, monkeypatch):
    say("aaaa bbbb-cccc dddd", width=12)  # not "aaaa bbbb-" at a hyphen
    assert capsys.readouterr().out == "aaaa\n  bbbb-cccc\n  dddd\n"
    monkeypatch.setenv("COLUMNS", "12")
    say("aaaa bbbb cccc dddd")
    assert capsys.readouterr().out == "aaaa bbbb\n  cccc dddd\n"


def option(name, nodes, run=True, plan=None, why=""):
    nt = NodeType(name, "h100-sxm", 8, 4, 1.0, 400.0, 400.0, 1000.0, 400.0, 1.5)
    cost = RunCost(5, 3600.0 * nodes, 4.0, 10.0 * nodes, 500.0, 2.0, 1000.0 * nodes)
    return Option(
        nt, nodes, PlanPoint(1.0, 0.5, 10, "dp4", plan=plan) if run else None,
        cost if run else None, why,
    )  # fmt: skip


def test_print_choice_lists_three_misfits_then_counts_the_rest(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    pool = load_pool(args(tmp_path).resources)
    misfits = [option("a", n, run=False, why=f"needs {n} more") for n in (1, 2, 3, 4, 5)]
    chosen = option("a", 6)
    a = args(tmp_path, objective="cost", deadline=10.0)
    print_choice(a, pool, [*misfits, chosen], chosen, [chosen], [Path("x.json"), Path("y.png")])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{pool.path}: by cost"
    i = lines.index("does not fit: a x1: needs 1 more")
    assert lines[i : i + 5] == [
        "does not fit: a x1: needs 1 more",
        "does not fit: a x2: needs 2 more",
        "does not fit: a x3: needs 3 more",
        "... and 2 more that fit no plan (resources.json)",
        "chosen: a x6 has the least cost ($60) of the 1 options that meet the deadline and budget",
    ]
    assert lines[i + 5] == f"figures from {pool.path}:"
    assert lines[i + 6] == (
        "  a: price_per_gpu_hour 1 (line 8), gpu_busy_watts 400 (line 9), gpu_idle_watts 400"
        " (not set: gpu_busy_watts), node_watts 1000 (line 10), carbon_g_per_kwh 400 (line 11),"
        " pue 1.5 (line 12), step time (profile a100-80g)"
    )
    assert lines[i + 7] == "  run: effective_time_fraction 0.5 (line 1)"
    assert lines[-1] == "wrote x.json, y.png"
    # exactly three misfits: no count line
    print_choice(a, pool, [*misfits[:3], chosen], chosen, [chosen], [Path("x.json")])
    text = capsys.readouterr().out
    assert "... and" not in text and "does not fit: a x3" in text
    # a meets-count of the options that meet both limits (a x7: 7 h, past the deadline of 10?
    # no: 7 h meets it; a x12: 12 h does not)
    print_choice(a, pool, [chosen, option("a", 7), option("a", 12)], chosen, [], [Path("x")])
    assert "of the 2 options that meet" in capsys.readouterr().out


def test_figures_of_a_pool_without_a_line_name_the_default(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    text = POOL.replace("effective_time_fraction = 0.5\n", "")
    pool = load_pool(args(tmp_path, pool_text=text).resources)
    chosen = option("h", 1)
    print_choice(args(tmp_path), pool, [chosen], chosen, [chosen], [Path("x")])
    lines = capsys.readouterr().out.splitlines()
    assert "  run: effective_time_fraction 0.9 (the default, planner/resources/pool.py)" in lines
    assert any(line.startswith("  h: price_per_gpu_hour 3 (line 18), ") for line in lines)
    assert any("gpu_idle_watts 100 (line 20)" in line for line in lines)
    assert not any(line.startswith("  a: ") for line in lines)


def test_chosen_kinds_and_option_record():
    plan = mixed_plan()
    assert chosen_kinds(option("a", 1, plan=plan)) == ["a", "h"]
    assert chosen_kinds(option("a", 1, plan=PLAN)) == ["a"]  # a plan of one kind
    assert chosen_kinds(option("a", 1)) == ["a"]
    assert chosen_kinds(option("a", 1, run=False)) == ["a"]
    rec = option_record(option("a", 1, plan=PLAN), None, [])
    assert rec["mixed"] is False and rec["kinds"] == ["a"] and rec["why_not"] is None
    o = option("a", 2)
    rec = option_record(o, o, [o])
    assert rec["chosen"] is True and rec["pareto"] is True
    assert rec["wall_h"] == 2.0 and rec["busy_share"] == 1.0 and rec["steps"] == 5
    assert option_record(o, option("a", 2), [option("a", 2)])["chosen"] is False


def test_resources_doc_lists_the_figures_of_every_kind_an_option_ran_on(tmp_path):
    pool = load_pool(args(tmp_path).resources)
    opts = [option("h", 1), option("h", 2)]
    doc = resources_doc(args(tmp_path), MF, pool, opts, None, [], ["n"])
    assert doc["figures"] == command.figure_records(pool, ["h"])
    assert doc["chosen"] is None and doc["plan"] is None and doc["notes"] == ["n"]
    mixed = option("a", 1, plan=mixed_plan())
    doc = resources_doc(args(tmp_path), MF, pool, [mixed], mixed, [mixed], [])
    assert doc["figures"] == command.figure_records(pool, ["a", "h"])
    assert doc["plan"] == "plan.json" and doc["pareto"] == ["a x1"]


def test_write_resources_makes_its_folder(tmp_path):
    path = write_resources(tmp_path / "x" / "y", {"b": 1, "a": [1]})
    assert path == tmp_path / "x" / "y" / "resources.json"
    assert path.read_text() == '{\n  "b": 1,\n  "a": [\n    1\n  ]\n}\n'
    write_resources(tmp_path / "x" / "y", {"c": None})
    assert path.read_text() == '{\n  "c": null\n}\n'


def test_print_choice_marks_the_table_and_counts_what_meets_both_limits(tmp_path, capsys):
    """a x1 (1 h, $10) chosen and on the front; a x2 (2 h, $20) meets the 2 h deadline but
    not the $15 budget; a x3 (3 h, $30) misses both: one option meets them."""
    pool = load_pool(args(tmp_path).resources)
    a1, a2, a3 = option("a", 1), option("a", 2), option("a", 3)
    a = args(tmp_path, objective="cost", deadline=2.0, budget=15.0)
    print_choice(a, pool, [a1, a2, a3], a1, [a1], [Path("x")])
    lines = capsys.readouterr().out.splitlines()
    rows = [r for r in map(str.split, lines) if r[1:2] == ["a"] and set(r[0]) <= set("*+DB")]
    marks = {r[1] + r[2]: r[0] for r in rows}
    assert marks == {"ax1": "*+", "ax2": "B", "ax3": "DB"}
    assert any(
        line.startswith("chosen: a x1 has the least cost ($10) of the 1 options") for line in lines
    )


class Opened(Recorded):
    """Recorded bars that keep how they were opened."""

    opened: list = []

    def __init__(self, quiet=False, verbose=False):
        Opened.opened.append((quiet, verbose))
        super().__init__(quiet, verbose)


def test_a_namespace_without_json_or_verbose_is_neither(tmp_path, stand_ins, monkeypatch, capsys):
    """A caller's namespace may lack --json and --verbose: the table, no JSON, no verbose
    lines; the bars are opened quiet exactly when --quiet or --json is given."""
    Opened.opened = []
    monkeypatch.setattr(command, "Bars", Opened)
    a = args(tmp_path)
    del a.json, a.verbose
    run_resources(a, MF, Training(8), None)
    out, err = capsys.readouterr()
    assert f"{a.resources}: by time" in out and not out.startswith("{")
    assert err == ""
    run_resources(args(tmp_path, quiet=True), MF, Training(8), None)
    run_resources(args(tmp_path, json=True, verbose=True), MF, Training(8), None)
    run_resources(args(tmp_path, verbose=True), MF, Training(8), None)
    assert Opened.opened == [(False, False), (True, False), (True, True), (False, True)]


def test_the_budget_excludes_the_fastest(tmp_path, stand_ins):
    """By time with a $0.19 budget: h x1 ($0.20) is over it, a x2 ($0.178) is chosen."""
    run_resources(args(tmp_path, budget=0.19), MF, Training(8), None)
    assert json.loads((tmp_path / "out" / "resources.json").read_text())["chosen"] == "a x2"
