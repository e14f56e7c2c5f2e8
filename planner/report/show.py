"""``plan show PLAN.json [--out DIR] [--quiet]``: the summary and report of a saved plan.

No tracing and no solving: the plan file has every number the figures need, so this works on a
laptop for a plan made elsewhere, and regenerates the report after meshplan's figures change.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from planner.errors import UserInputError
from planner.flags import CommandParser


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser(
        prog="plan show", description="Summary, figures and report.html of a saved plan."
    )
    p.add_argument("plan", help="a plan.json written by `plan`")
    p.add_argument("--out", help="where to write the figures (default: beside the plan file)")
    p.add_argument("--svg", action="store_true", help="also write each figure as SVG")
    p.add_argument("--json", action="store_true", help="the plan as JSON on stdout, no tables")
    p.add_argument("--quiet", action="store_true", help="print only errors")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from planner.report import write_report
    from planner.report.console import print_plan
    from planner.schema import load_plan

    path = Path(args.plan)
    if path.is_dir():
        raise UserInputError(f"plan {path} is a directory: give its plan.json")
    from planner.report.recplan import print_recplan, read_recplan

    rec = read_recplan(path)
    if rec is not None:  # a recommendation plan: its tables and ranks, and their figure
        from planner.report.recfigure import write_recplan_report

        if args.json:
            print(path.read_text(), end="")
        print_recplan(rec, quiet=args.quiet or args.json)
        out_dir = Path(args.out) if args.out else path.parent
        command = shlex.join(["plan", "show", *argv])
        for figure in write_recplan_report(rec, out_dir, command):
            if not (args.quiet or args.json):
                print(f"wrote {figure}")
        return 0
    plan = load_plan(path)
    out_dir = Path(args.out) if args.out else path.parent
    command = shlex.join(["plan", "show", *argv])
    written = write_report(plan, out_dir, command, args.svg)
    if args.json:
        print(path.read_text(), end="")
    print_plan(plan, written, quiet=args.quiet or args.json)
    return 0
