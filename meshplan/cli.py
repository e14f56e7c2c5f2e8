"""``plan``: the planner's command line (planner.cli) with the runtime plugged in.

    plan MODEL.py [flags] [--run]      plan, and with --run train the plan (runtime.launch)
    plan run PLAN.json [--steps K]     train a saved plan
    plan show | calibrate | ...        the planner's other subcommands

Why a package of its own: this is the one place where the planner and the runtime meet, so
that every module under ``planner`` can be held to "never imports the runtime" by machine."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from planner import cli
from planner.process_end import exit_without_teardown


def run_saved_plan(path: Path, opts: argparse.Namespace) -> int:
    """Train the plan at ``path``: a recommendation plan on TorchRec, any other on torchrun."""
    from planner.recsys.plan import is_recplan

    if is_recplan(path):
        from runtime.recsys import run_recplan

        return run_recplan(path, opts)
    from runtime.launch import run_plan

    return run_plan(path, opts)


def cmd_run(argv: list[str]) -> int:
    """``plan run PLAN.json [flags]``: train a saved plan (see runtime.launch)."""
    opts = cli.build_run_parser().parse_args(argv)
    if opts.emit:  # launch files for a scheduler instead of a run (planner/export/launch.py)
        from planner.export.command import emit_beside

        return emit_beside(Path(opts.plan), opts)
    return run_saved_plan(Path(opts.plan), opts)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return cli.main(argv, run=run_saved_plan, subcommands={"run": cmd_run})


def console(argv: Sequence[str] | None = None) -> NoReturn:
    """The ``plan`` process's entry: ``main``, then ``exit_without_teardown``."""
    exit_without_teardown(main(argv))


if __name__ == "__main__":
    sys.exit(console())
