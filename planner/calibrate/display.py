"""What ``plan calibrate`` shows: a rich progress bar per phase while measuring, then the key
numbers of the written profile. Silent with --quiet or when stderr is not a terminal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from planner.calibrate.workers import phase_totals

LABELS = {
    "single": "one process alone",
    "start": "starting ranks",
    "matmul": "matmul rates",
    "memory": "memory bandwidth",
    "collectives": "collectives",
    "p2p": "point-to-point",
}


class Display:
    """A progress bar per phase; ``update(phase, done, total)`` is the workers' callback."""

    def __init__(self, quiet: bool, device: str, quick: bool) -> None:
        self.progress = Progress(
            TextColumn("{task.description:<20}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            disable=quiet,
            transient=False,
        )
        totals = {"single": 1, **phase_totals(device, quick)}
        self.tasks = {k: self.progress.add_task(LABELS[k], total=v) for k, v in totals.items()}

    def __enter__(self) -> Display:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def update(self, phase: str, done: int, total: int) -> None:
        task = self.tasks.get(phase)
        if task is not None:
            self.progress.update(task, completed=done, total=total)


def print_summary(result: Any, path: Path, seconds: float) -> None:
    """The measured profile's headline numbers and where it was written."""
    p = result.profile
    s = result.summary
    table = Table(title=f"{p.name}: {p.description}", title_justify="left")
    table.add_column("measured")
    table.add_column("value", justify="right")
    table.add_column("model input", justify="right")
    for dtype, rate in s["matmul_flops"].items():
        table.add_row(
            f"matmul {dtype} per rank",
            f"{rate / 1e9:,.1f} GFLOP/s",
            f"peak {p.peak_flops[dtype] / 1e9:,.1f} x {p.matmul_efficiency:.3f}",
        )
    table.add_row("memory bandwidth", f"{p.memory_bandwidth / 1e9:,.2f} GB/s", "")
    table.add_row(
        "element-wise ops",
        f"{p.memory_bandwidth * p.elementwise_efficiency / 1e9:,.2f} GB/s",
        f"efficiency {p.elementwise_efficiency:.3f}",
    )
    if "collective" in s:
        c, link = s["collective"], s["p2p"]
        link_alpha = f", {link.alpha * 1e6:,.1f} µs" if link else ""
        table.add_row(
            "collectives (alpha-beta)",
            f"{c.bandwidth / 1e9:,.3f} GB/s, {c.alpha * 1e6:,.1f} µs",
            f"worst point off {c.max_rel_error:.0%}",
        )
        if s.get("samples_in_situ"):
            table.add_row(
                "in-situ collective",
                f"+{p.collective_sync * 1e3:,.2f} ms a call",
                "in situ, over the fit",
            )
        table.add_row(
            "point-to-point (link)",
            f"{s['link_bandwidth'] / 1e9:,.3f} GB/s{link_alpha}",
            f"collective efficiency {p.collective_efficiency:.3f}",
        )
    if "comm_overlap" in s:
        ov = s["comm_overlap"]
        table.add_row(
            "comm/compute overlap",
            f"{p.comm_overlap:.2f} hidden",
            f"alone {ov['comm_s'] * 1e3:,.1f} + {ov['compute_s'] * 1e3:,.1f} ms, "
            f"together {ov['both_s'] * 1e3:,.1f} ms",
        )
    table.add_row("host link", f"{p.host_bandwidth / 1e9:,.2f} GB/s", "")
    table.add_row("reserved per rank", f"{p.reserved_bytes / 2**20:,.0f} MiB", "")
    console = Console()
    console.print(table)
    console.print(f"wrote {path} in {seconds:.0f} s; plan with --profile {path}")
