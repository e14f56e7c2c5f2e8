"""Terminal output with rich: tables for people, nothing when --quiet or not a terminal."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.table import Table


def console(quiet: bool = False) -> Console:
    return Console(quiet=quiet, highlight=False, soft_wrap=False)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_count(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def print_graph(summary: dict[str, Any], note: str = "", quiet: bool = False) -> None:
    """The block table of ``plan --graph``: one row per block, then totals."""
    out = console(quiet)
    m = summary["model"]
    if note:
        print(f"note: {note}", file=sys.stderr)
    table = Table(
        title=(
            f"{m['file'].rsplit('/', 1)[-1]}  ·  {human_count(m['params'])} parameters  ·  "
            f"micro-batch {m['micro_batch_size']}  ·  {m['dtype']}  ·  traced by {m['trace']}"
        )
    )
    table.add_column("#", justify="right")
    table.add_column("block")
    table.add_column("class")
    table.add_column("parameters", justify="right")
    table.add_column("fwd GFLOPs", justify="right")
    table.add_column("saved act. MB", justify="right")
    for i, b in enumerate(summary["blocks"]):
        table.add_row(
            str(i),
            b["name"],
            b["class"],
            f"{b['params']:,}",
            f"{b['fwd_flops'] / 1e9:,.2f}",
            f"{b['saved_activation_bytes'] / 1e6:,.1f}",
        )
    table.add_section()
    table.add_row(
        "",
        f"{len(summary['blocks'])} blocks",
        f"{len(m['classes'])} classes",
        f"{m['params']:,}",
        f"{m['fwd_flops'] / 1e9:,.2f}",
        f"{m['saved_activation_bytes'] / 1e6:,.1f}",
    )
    out.print(table)
