"""``plan export PLAN.json ENGINE [ENGINE ...]`` and ``plan MODEL ... --export ENGINE``: write
an engine's files beside the plan and say, per engine, what it runs differently."""

from __future__ import annotations

import sys
from pathlib import Path

from planner.export import ENGINES, write_exports, write_files
from planner.flags import CommandParser
from planner.schema import load_plan
from planner.schema.plan import Plan


def main(argv: list[str]) -> int:
    parser = CommandParser(
        prog="plan export",
        description="Write a saved plan as an engine's configuration, beside the plan.",
    )
    parser.add_argument("plan", help="a plan.json written by `plan MODEL`")
    parser.add_argument("engines", nargs="+", choices=ENGINES, metavar="ENGINE",
                        help=f"one or more of {', '.join(ENGINES)}")  # fmt: skip
    parser.add_argument("--out", help="directory for the files (default: the plan's)")
    parser.add_argument("--quiet", action="store_true", help="print only errors")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    opts = parser.parse_args(argv)
    path = Path(opts.plan)
    plan = load_plan(path)
    out_dir = Path(opts.out) if opts.out else path.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    export_beside(plan, out_dir, opts.engines, quiet=opts.quiet)
    return 0


def export_beside(plan: Plan, out_dir: Path, engines: list[str], quiet: bool = False) -> list[Path]:
    """Write the exports and print, per engine, its files and each change (stdout: results)."""
    paths: list[Path] = []
    for result, written in write_exports(plan, engines, out_dir):
        paths += written
        if quiet:
            continue
        names = ", ".join(p.name for p in written)
        print(f"{result.engine}: wrote {names} in {out_dir}/")
        for change in result.changes:
            print(f"  changed: {change}")
        if not result.changes:
            print("  runs the plan as planned")
        if result.command:
            print(f"  run: {result.command}")
    sys.stdout.flush()
    return paths


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
