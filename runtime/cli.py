"""``plan run PLAN.json [flags]``: run a saved plan (see runtime.launch)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from planner.errors import MeshplanError, UserInputError
from planner.runflags import add_run_flags


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserInputError(f"{message} (see `plan run --help`)")


def main(argv: list[str]) -> int:
    parser = _Parser(prog="plan run", description="Train a saved plan with torch.distributed.")
    parser.add_argument("plan", help="a plan.json written by `plan MODEL.py`")
    add_run_flags(parser)
    opts = parser.parse_args(argv)
    from runtime.launch import run_plan

    return run_plan(Path(opts.plan), opts)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except MeshplanError as exc:
        print(f"plan run: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
