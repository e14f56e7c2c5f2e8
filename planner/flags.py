"""Command-line building blocks every ``plan`` subcommand shares: the parser whose errors are
one-line UserInputErrors, number types, and the flags that run a plan (``plan model.py --run``
and ``plan run PLAN.json``).

They live here, importing nothing heavy, so that building any parser never imports torch or
the solver; the runtime reads the flags from the parsed namespace.
"""

from __future__ import annotations

import argparse
from typing import Any

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


def parse_model_args(items: list[str] | None) -> dict[str, Any]:
    """``KEY=VALUE`` strings to kwargs; values become int, float, bool or str, in that order."""
    result: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UserInputError(f"--model-arg {item!r} is not KEY=VALUE (e.g. size=1.3b)")
        result[key.strip()] = parse_value(raw.strip())
    return result


def parse_value(raw: str) -> Any:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


# Suffixes people write on large counts and sums ("15T tokens", "$1.5M"): powers of 1000.
_SCALES = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
# Units a duration may carry, in hours ("72h", "30d", "2w"); a bare number is hours.
_HOURS = {"h": 1.0, "d": 24.0, "w": 168.0}


def _scaled(text: str) -> float:
    """A number as people write large ones: 1e9, 15_000, 2,048, 15T, 1.5B (powers of 1000)."""
    t = text.strip().replace("_", "").replace(",", "").lower()
    scale = _SCALES.get(t[-1:], 1.0) if t else 1.0
    return float(t[:-1] if scale != 1.0 else t) * scale


def token_count(text: str) -> int:
    """A positive whole count: ``positive_int``'s, or written with an exponent or a K/M/B/T
    suffix (15T, 1.5e12) as long as it is a whole number."""

    def parse(t: str) -> int:
        value = _scaled(t)
        if not value.is_integer():
            raise ValueError(t)
        return int(value)

    return _number(text, parse, lambda v: v > 0, "a positive whole number (e.g. 15T, 1e12)")


def hours(text: str) -> float:
    """A positive duration in hours, or with a unit: 72h, 30d, 2w."""

    def parse(t: str) -> float:
        t = t.strip().lower()
        unit = _HOURS.get(t[-1:])
        return float(t[:-1]) * unit if unit else float(t)

    return _number(text, parse, lambda v: 0 < v < float("inf"), "a duration (hours, or 30d, 2w)")


def dollars(text: str) -> float:
    """A positive sum of money: 2000000, $2,000,000, 1.5M."""
    return _number(
        text,
        lambda t: _scaled(t.strip().lstrip("$")),
        lambda v: 0 < v < float("inf"),
        "a positive sum (e.g. 2000000, $1.5M)",
    )


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
