"""``plan export PLAN.json ENGINE [ENGINE ...]`` and ``plan MODEL ... --export ENGINE``: write
an engine's files beside the plan and say, per engine, what it runs differently."""

from __future__ import annotations

import sys
from pathlib import Path

from planner.export import ENGINES, write_exports
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
