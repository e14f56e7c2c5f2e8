"""``plan``: the planner's command line (planner.cli) with the runtime plugged in.

    plan MODEL.py [flags] [--run]      plan, and with --run train the plan (runtime.launch)
    plan run PLAN.json [--steps K]     train a saved plan
    plan show | calibrate | ...        the planner's other subcommands

Why a package of its own: this is the one place where the planner and the runtime meet, so
that every module under ``planner`` can be held to "never imports the runtime" by machine."""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from planner import cli


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


def exit_without_teardown(status: int) -> NoReturn:
    """End the process as the interpreter would, less its teardown. A plan's heap (torch,
    transformers, the traced graph, the search's records) lives until the process ends, and the
    teardown frees it object by object after a full cyclic collection over all of it, for memory the
    operating system takes back anyway: on a first plan of Llama-3-70B under load, 7.8-9.8 s of
    56-76 s, 0.3 s without it (docs/benchmarks.md, ninth stop). Everything a user can see still
    happens: the threads that are not daemons are waited for and the exit handlers run (logging's
    flush, finalizers registered for exit, libraries' own), in the interpreter's order, and both
    streams are flushed. Freezing the heap instead would skip only the collection, but then
    libraries that count their objects at teardown (triton's nanobind bindings, which torch.export
    imports) print leak warnings. ``main`` stays free of this, for callers that go on living (the
    tests)."""
    threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's exit, in order
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(console())
