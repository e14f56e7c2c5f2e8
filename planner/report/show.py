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
    p.add_argument("--quiet", action="store_true", help="print only errors")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


STAGE_KEYS = ("tp_comm_s", "p2p_s", "dp_comm_s", "dp_exposed_s", "optimizer_s", "offload_s")
BLOCK_KEYS = ("time_per_microbatch_s", "memory_bytes", "activation_bytes_per_microbatch")
CANDIDATE_KEYS = ("step_time_s", "peak_memory_bytes")


def check_report_fields(plan: dict, where: str) -> None:
    """What the figures read beyond what ``validate_plan`` checks, so a hand-edited or truncated
    plan is a one-line error rather than a traceback."""

    def number(obj: object, key: str, what: str) -> None:
        value = obj.get(key) if isinstance(obj, dict) else None
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
            raise UserInputError(f"plan {where}: {what} lacks a non-negative number {key!r}")

    cl = plan["cluster"]
    for key in ("nodes", "gpus_per_node"):
        if not isinstance(cl.get(key), int) or cl[key] < 1:
            raise UserInputError(f"plan {where}: cluster.{key} must be a positive integer")
    if cl["nodes"] * cl["gpus_per_node"] < cl["gpus"]:
        raise UserInputError(f"plan {where}: cluster has fewer GPUs than cluster.gpus")
    for st in plan["stages"]:
        for key in STAGE_KEYS:
            number(st, key, f"stage {st.get('index')}")
    for b in plan["blocks"]:
        for key in BLOCK_KEYS:
            number(b, key, f"block {b['name']!r}")
        if not isinstance(b.get("tp_variant"), str) or not isinstance(b.get("class"), str):
            raise UserInputError(f"plan {where}: block {b['name']!r} lacks tp_variant or class")
    sol = plan["solver"]
    cands, alts = sol.get("candidates"), sol.get("alternatives")
    if not isinstance(cands, list) or not isinstance(alts, list):
        raise UserInputError(f"plan {where}: solver.candidates or solver.alternatives is missing")
    for c in cands:
        for key in CANDIDATE_KEYS:
            number(c, key, "a solver candidate")
        if not isinstance(c.get("label"), str) or not isinstance(c.get("feasible"), bool):
            raise UserInputError(f"plan {where}: a solver candidate lacks label or feasible")
    for a in alts:
        if (
            not isinstance(a, dict)
            or not isinstance(a.get("label"), str)
            or not isinstance(a.get("why_not"), str)
        ):
            raise UserInputError(f"plan {where}: an alternative lacks label or why_not")
    for key in ("samples_per_s", "tokens_per_s"):
        number(plan["predicted"], key, "predicted")
    for key in ("candidates_total", "candidates_solved", "candidates_pruned", "solve_time_s"):
        number(sol, key, "solver")


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from planner.report import write_report
    from planner.report.console import print_plan
    from planner.schema import load_plan

    path = Path(args.plan)
    if path.is_dir():
        raise UserInputError(f"plan {path} is a directory: give its plan.json")
    plan = load_plan(path)
    check_report_fields(plan, str(path))
    out_dir = Path(args.out) if args.out else path.parent
    command = shlex.join(["plan", "show", *argv])
    written = write_report(plan, out_dir, command)
    print_plan(plan, written, quiet=args.quiet)
    return 0
