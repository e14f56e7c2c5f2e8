"""Terminal output with rich: tables for people, nothing when --quiet or not a terminal."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from planner.schema import Plan
from planner.vocab import schedule_label


def cp_label(mesh: dict) -> str:
    """ " cp=N" when each sequence is split over N ranks (nothing otherwise)."""
    return f" cp={mesh.cp}" if mesh.cp > 1 else ""


def ep_label(mesh: dict) -> str:
    """ " ep=N" when experts are spread over N data-parallel ranks (nothing otherwise)."""
    return f" ep={mesh.ep}" if mesh.ep > 1 else ""


def console(quiet: bool = False) -> Console:
    return Console(quiet=quiet, highlight=False, soft_wrap=False)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def alternative_name(a) -> str:
    """How a plan's alternative is named: its layout, after the baseline's name if it is one."""
    return f"{a.baseline}: {a.label}" if a.baseline else a.label


def human_time(seconds: float) -> str:
    """Seconds with a unit that keeps three significant digits readable (s, ms or µs)."""
    if seconds >= 1:
        return f"{seconds:,.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.1f} µs"


def step_with_range(pred) -> str:
    """The predicted step and the range of measured steps its error bar allows:
    "31.7 s (27-35 s, from 201 published runs)"; the step alone for a plan without one."""
    step = human_time(pred.step_time_s)
    rng = pred.step_time_range_s
    if not rng:
        return step
    lo, hi = rng
    if hi >= 1:
        span = f"{lo:.3g}-{hi:.3g} s"
    else:
        span = f"{lo * 1e3:.3g}-{hi * 1e3:.3g} ms"
    scope = pred.step_time_range_scope
    which = f"{scope.replace(', ', ' ')} " if scope and scope != "all" else ""
    return f"{step} ({span}, from {pred.step_time_range_runs} published {which}runs)"


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


class Progress:
    """A one-line live status while tracing and solving; silent when quiet or not a tty."""

    def __init__(self, quiet: bool = False) -> None:
        self.enabled = not quiet and sys.stderr.isatty()
        self._status = None

    def __enter__(self) -> Progress:
        if self.enabled:
            from rich.console import Console as _C

            self._status = _C(stderr=True).status("tracing the model…")
            self._status.__enter__()
        return self

    def update(self, phase: str, done: int, total: int, pruned: int = 0) -> None:
        if self._status is None:
            return
        if phase == "trace":
            self._status.update("tracing the model…")
        elif phase == "price":
            self._status.update(f"pricing block options: {done} of {total} (TP, micro-batch) pairs")
        else:
            self._status.update(f"solving: {done} solved · {pruned} pruned · {total} candidates")

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.__exit__(None, None, None)


def print_plan(plan: Plan, written: list, quiet: bool = False) -> None:
    """The terminal summary of a plan: one line, the stage table, the prediction, the
    alternatives and where the files are."""
    out = console(quiet)
    mesh, pred, sol = plan.mesh, plan.predicted, plan.solver
    cl = plan.cluster
    sched = schedule_label(plan.schedule, plan.virtual_stages, mesh.pp)
    out.print(
        f"[bold]plan[/bold] pp={mesh.pp} dp={mesh.dp_label}{ep_label(mesh)}{cp_label(mesh)} "
        f"tp={mesh.tp_label} on "
        f"{cl.gpus} x {cl.profile} ({cl.nodes} node{'s' * (cl.nodes > 1)})  ·  "
        f"global batch {plan.global_batch_size} = {mesh.dp} x "
        f"{plan.micro_batch_size} x {plan.num_microbatches} micro-batches  ·  {sched}  ·  "
        f"ZeRO-{plan.zero_stage}  ·  {plan.dtype}"
    )
    blocks = {b.name: b for b in plan.blocks}
    table = Table(title="stages")
    for col in ("stage", "blocks", "ranks", "compute/mb", "comm/mb", "memory / capacity"):
        table.add_column(col, justify="right" if col != "blocks" else "left")
    cap = pred.capacity_bytes
    for st in plan.stages:
        names = st.blocks
        shown = names[0] if len(names) == 1 else f"{names[0]} … {names[-1]} ({len(names)})"
        modes = sorted({blocks[n].recompute for n in names} - {"none"})
        offl = sorted({blocks[n].offload for n in names} - {"none"})
        extra = "".join(f" [recompute {m}]" for m in modes) + "".join(
            f" [offload {o}]" for o in offl
        )
        ranks = st.ranks
        rank_text = f"{ranks[0]}–{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])
        mem = pred.memory_per_stage[st.pp_rank].total
        table.add_row(
            str(st.index),
            shown + extra,
            rank_text,
            human_time(st.compute_s),
            human_time(st.tp_comm_s + st.p2p_s),
            f"{human_bytes(mem)} / {human_bytes(cap)}",
        )
    out.print(table)
    out.print(
        f"predicted step {step_with_range(pred)}  ·  "
        f"{pred.samples_per_s:,.1f} samples/s  ·  {pred.tokens_per_s:,.0f} tokens/s  ·  "
        f"MFU {pred.mfu:.1%}  ·  peak memory {human_bytes(pred.peak_memory_bytes)}"
    )
    alts = [a for a in sol.alternatives if a.why_not != "chosen"][:6]
    if alts:
        t = Table(title="alternatives")
        for col in ("layout", "step", "peak memory", "why not"):
            t.add_column(col)
        for a in alts:
            step = human_time(a.step_time_s) if a.step_time_s else "—"
            mem = human_bytes(a.peak_memory_bytes) if a.peak_memory_bytes else "—"
            t.add_row(alternative_name(a), step, mem, a.why_not)
        out.print(t)
    out.print(
        f"solver: {sol.candidates_solved} of {sol.candidates_total} candidates solved "
        f"({sol.candidates_pruned} pruned by bounds) in {sol.solve_time_s:.2f} s"
    )
    if len(written) <= 2:
        for path in written:
            out.print(f"wrote {path}")
    else:
        from pathlib import Path

        folder = Path(written[0]).parent
        names = sorted({Path(p).stem for p in written} - {"plan", "report"})
        out.print(
            f"wrote {folder}/: plan.json, report.html and the figures {', '.join(names)} "
            "(PNG and SVG)"
        )
