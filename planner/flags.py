"""Command-line building blocks every ``plan`` subcommand shares: the parser whose errors are
one-line UserInputErrors, number types, and the flags that run a plan (``plan model.py --run``
and ``plan run PLAN.json``).

They live here, importing nothing heavy, so that building any parser never imports torch or
the solver; the runtime reads the flags from the parsed namespace.
"""

from __future__ import annotations

import argparse

from planner.errors import UserInputError


class CommandParser(argparse.ArgumentParser):
    """argparse that raises meshplan's one-line error instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserInputError(f"{message} (see `{self.prog} --help`)")


def _number(text: str, parse, ok, what: str):
    """``text`` parsed and checked, or argparse's one-line error naming what was expected."""
    try:
        value = parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _number(text, int, lambda v: v > 0, "a positive integer")


def positive_float(text: str) -> float:
    return _number(text, float, lambda v: 0 < v < float("inf"), "a positive number")


def _non_negative_int(text: str) -> int:
    return _number(text, int, lambda v: v >= 0, "an integer >= 0")


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """Add the execution flags (a group titled "running") to ``parser``."""
    r = parser.add_argument_group("running (with --run, or plan run PLAN.json)")
    r.add_argument("--steps", type=positive_int, default=5, help="training steps (default 5)")
    r.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="cpu (gloo) or cuda (NCCL); default cuda when available",
    )
    r.add_argument("--seed", type=int, default=0, help="torch.manual_seed before build_model")
    r.add_argument(
        "--checkpoint-every",
        type=_non_negative_int,
        default=0,
        help="save a distributed checkpoint every K steps (0: never)",
    )
    r.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    r.add_argument(
        "--max-restarts",
        type=_non_negative_int,
        default=0,
        help="torchrun elastic restarts after a failed worker; each resumes from the last "
        "complete checkpoint (default 0)",
    )
    r.add_argument(
        "--hang-timeout",
        type=positive_float,
        help="if a step does not finish within this many seconds, every rank prints its "
        "stack and the run stops (a hung collective ends instead of waiting forever)",
    )
    r.add_argument(
        "--run-dir",
        help="where metrics.jsonl and checkpoints go (default: beside plan.json)",
    )
    r.add_argument("--nnodes", type=positive_int, default=1, help="torchrun: number of nodes")
    r.add_argument("--node-rank", type=_non_negative_int, default=0, help="torchrun: this node")
    r.add_argument(
        "--rdzv-endpoint",
        help="torchrun: HOST:PORT of the c10d rendezvous (needed with --nnodes > 1)",
    )
    r.add_argument("--rdzv-id", default="meshplan", help="torchrun: rendezvous id")
