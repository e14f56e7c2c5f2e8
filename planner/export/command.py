"""``plan export PLAN.json ENGINE [ENGINE ...]`` (``planner.engine_prices``) and ``plan MODEL ...
--export ENGINE``: write an engine's files beside the plan and say, per engine, what it runs
differently and what the plan as it runs it is predicted to cost."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from planner.errors import UserInputError
from planner.export import write_exports, write_files
from planner.export.pricing import EnginePrice, PlanModel, engine_price, planned_price
from planner.export.types import Export
from planner.schema import load_plan
from planner.schema.plan import Plan

SUMMARY = "exports.json"  # beside plan.json: per engine, its files, changes and prediction


def export_beside(
    plan: Plan,
    out_dir: Path,
    engines: list[str],
    quiet: bool = False,
    model: PlanModel | None = None,
) -> list[Path]:
    """Write the exports and print, per engine, its files, each change and (given the plan's
    ``model``) its predicted step and memory as the engine runs it, beside meshplan's own
    (stdout: results). The same goes into ``exports.json`` beside the files."""
    paths: list[Path] = []
    planned = planned_price(plan, model) if model is not None else None
    summary: dict = {}
    if planned is not None and not quiet:
        print(f"meshplan: {planned.line()}")
    for result, written in write_exports(plan, engines, out_dir):
        paths += written
        price, unpriced = None, ""
        if model is not None:
            try:
                price = engine_price(plan, result, model)
            except UserInputError as why:  # the engine's layout does not take the batch
                unpriced = str(why)
        summary[result.engine] = {
            "files": [p.name for p in written],
            "changes": result.changes,
            "command": result.command,
            "predicted": price.to_dict() if price else None,
        }
        if quiet:
            continue
        names = ", ".join(p.name for p in written)
        print(f"{result.engine}: wrote {names} in {out_dir}/")
        for change in result.changes:
            print(f"  changed: {change}")
        if not result.changes:
            print("  runs the plan as planned")
        if price is not None:
            print(f"  {price.line(planned)}")
        if unpriced:
            print(f"  not priced: {unpriced}")
        if result.command:
            print(f"  run: {result.command}")
    paths += write_summary(out_dir, summary, planned)
    sys.stdout.flush()
    return paths


def write_summary(out_dir: Path, engines: dict, planned: EnginePrice | None) -> list[Path]:
    """``exports.json``: the engines exported here (earlier exports' entries kept), each with
    its files, changes and prediction, and meshplan's own prediction of the plan."""
    path = out_dir / SUMMARY
    old: dict = {}
    if path.is_file():
        try:
            old = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            old = {}
    summary = {
        "written_by": "meshplan plan export",
        "meshplan": planned.to_dict() if planned else old.get("meshplan"),
        "engines": {**(old.get("engines") or {}), **engines},
    }
    text = json.dumps(summary, indent=1) + "\n"
    return write_files(Export("summary", {SUMMARY: text}), out_dir)


def emit_beside(plan_path: Path, opts) -> int:
    """``plan run PLAN.json --emit SCHEDULER``: the launch files beside the plan, each
    starting ``plan run`` with this command's run flags on every node; nothing runs here."""
    from planner.export.launch import LaunchSettings, launch_files

    plan = load_plan(plan_path)
    flags = ["--device", "cuda", "--steps", str(opts.steps)]
    if opts.checkpoint_every:
        flags += ["--checkpoint-every", str(opts.checkpoint_every)]
    if opts.max_restarts:
        flags += ["--max-restarts", str(opts.max_restarts)]
    if opts.hang_timeout:
        flags += ["--hang-timeout", str(opts.hang_timeout)]
    settings = LaunchSettings(plan_path=str(plan_path), run_flags=tuple(flags), image=opts.image)
    out_dir = plan_path.parent
    for scheduler in dict.fromkeys(opts.emit):
        result = launch_files(plan, scheduler, settings)
        for path in write_files(result, out_dir):
            print(f"{scheduler}: wrote {path}")
        for change in result.changes:
            print(f"  note: {change}")
        print(f"  run: {result.command}")
    return 0
