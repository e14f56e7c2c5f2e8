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


def middle(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters by dropping its middle: the start and the end of a
    module path or a node name tell them apart, the middle rarely does."""
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    head = (width - 1 + 1) // 2
    tail = width - 1 - head
    return text[:head] + "…" + (text[-tail:] if tail else "")


MIN_SHRUNK = 8  # a shortened column keeps at least this many characters


def fitted_table(
    header: list[str],
    rows: list[list[str]],
    width: int,
    shrink: tuple[int, ...] = (),
    right: tuple[int, ...] = (),
    title: str | None = None,
) -> Table:
    """A borderless table no wider than ``width``: the ``shrink`` columns give up characters,
    widest first, and their cells are shortened from the middle, so no cell wraps onto a
    second line (a wrapped cell is what made 80-column tables unreadable)."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    budget = width - len(header)  # one space after each column
    while sum(widths) > budget:
        candidates = [i for i in shrink if widths[i] > MIN_SHRUNK]
        if not candidates:
            break
        widest = max(candidates, key=lambda i: widths[i])
        widths[widest] -= 1
    table = Table(
        title=title,
        title_justify="left",
        box=None,
        padding=(0, 1, 0, 0),
        pad_edge=False,
        header_style="bold",
    )
    for i, name in enumerate(header):
        table.add_column(
            middle(name, widths[i]),
            justify="right" if i in right else "left",
            no_wrap=True,
            max_width=widths[i],
            min_width=min(widths[i], len(name)),
        )
    for r in rows:
        table.add_row(*(middle(c, widths[i]) for i, c in enumerate(r)))
    return table


def terminal_width(default: int = 100) -> int:
    """The width tables are fitted to: $COLUMNS, else the terminal's, else ``default``."""
    import os
    import shutil

    if os.environ.get("COLUMNS", "").isdigit():
        return int(os.environ["COLUMNS"])
    return shutil.get_terminal_size((default, 24)).columns


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
    title = (
        f"{m['file'].rsplit('/', 1)[-1]}  ·  {human_count(m['params'])} parameters  ·  "
        f"micro-batch {m['traced_batch_size']}  ·  {m['dtype']}  ·  traced by {m['trace']}"
    )
    header = ["#", "block", "class", "parameters", "fwd GFLOPs", "saved act. MB"]
    rows = [
        [
            str(i),
            b["name"],
            b["class"],
            f"{b['params']:,}",
            f"{b['fwd_flops'] / 1e9:,.2f}",
            f"{b['saved_activation_bytes'] / 1e6:,.1f}",
        ]
        for i, b in enumerate(summary["blocks"])
    ]
    rows.append(
        [
            "",
            f"{len(summary['blocks'])} blocks",
            f"{len(m['classes'])} classes",
            f"{m['params']:,}",
            f"{m['fwd_flops'] / 1e9:,.2f}",
            f"{m['saved_activation_bytes'] / 1e6:,.1f}",
        ]
    )
    width = terminal_width()
    out.print(middle(title, width))
    out.print(fitted_table(header, rows, width, shrink=(1, 2), right=(0, 3, 4, 5)))


MAX_STAGE_ROWS = 12  # a longer stage table keeps its ends and sums up its middle in one row


def block_range(names: list[str]) -> str:
    """Consecutive blocks as a person names them: ``layers 3-5`` for ``layers.3`` ...
    ``layers.5`` (a common prefix before a trailing number), other blocks by their names,
    joined by commas: ``wte+wpe+drop, layers 0-1``."""
    parts: list[list] = []  # [prefix, first, last] for numbered runs, [name] otherwise
    for n in names:
        head, _, tail = n.rpartition(".")
        if head and tail.isdigit():
            k = int(tail)
            if parts and len(parts[-1]) == 3 and parts[-1][0] == head and parts[-1][2] == k - 1:
                parts[-1][2] = k
                continue
            parts.append([head, k, k])
        else:
            parts.append([n])
    return ", ".join(
        p[0] if len(p) == 1 else f"{p[0]}.{p[1]}" if p[1] == p[2] else f"{p[0]} {p[1]}-{p[2]}"
        for p in parts
    )


def _span(first: str, last: str) -> str:
    return first if first == last else f"{first}-{last}"


def stage_rows(plan: Plan) -> list[list[str]]:
    """The stage table's rows: stage, blocks, ranks, compute and communication per
    micro-batch, memory against capacity. Consecutive stages that show the same figures and
    hold blocks of the same classes on the same kind collapse into one row (``1-33``,
    ``layers 0-32``, each figure one stage's); when more than MAX_STAGE_ROWS rows remain, the
    middle ones become one row that counts their distinct figures."""
    blocks = {b.name: b for b in plan.blocks}
    pred = plan.predicted
    cap = pred.capacity_bytes
    runs: list[tuple[tuple, list]] = []  # (what must be equal, stages)
    for st in plan.stages:
        names = st.blocks
        modes = sorted({blocks[n].recompute for n in names} - {"none"})
        offl = sorted({blocks[n].offload for n in names} - {"none"})
        extra = "".join(f" [recompute {m}]" for m in modes) + "".join(
            f" [offload {o}]" for o in offl
        )
        mem = pred.memory_per_stage[st.pp_rank].total
        figures = (
            human_time(st.compute_s),
            human_time(st.tp_comm_s + st.p2p_s),
            f"{human_bytes(mem)} / {human_bytes(cap)}",
        )
        same = (figures, extra, st.kind, len(names), tuple(blocks[n].block_class for n in names))
        if runs and runs[-1][0] == same:
            runs[-1][1].append(st)
        else:
            runs.append((same, [st]))
    rows = []
    for (figures, extra, kind, _, _), stages in runs:
        names = [n for st in stages for n in st.blocks]
        first, last = stages[0], stages[-1]
        ranks = _span(str(first.ranks[0]), str(last.ranks[-1]))
        where = f"{kind}: " if kind else ""
        rows.append(
            [_span(str(first.index), str(last.index)), where + block_range(names) + extra, ranks]
            + list(figures)
        )
    if len(rows) > MAX_STAGE_ROWS:
        keep = (MAX_STAGE_ROWS - 1) // 2
        middle_rows = rows[keep : len(rows) - keep]
        first_stage = middle_rows[0][0].split("-")[0]
        last_stage = middle_rows[-1][0].split("-")[-1]
        summary = [
            _span(first_stage, last_stage),
            f"{int(last_stage) - int(first_stage) + 1} stages of various blocks",
            _span(middle_rows[0][2].split("-")[0], middle_rows[-1][2].split("-")[-1]),
        ] + [_value_range([r[i] for r in middle_rows]) for i in (3, 4, 5)]
        rows = rows[:keep] + [summary] + rows[len(rows) - keep :]
    return rows


def _value_range(cells: list[str]) -> str:
    distinct = list(dict.fromkeys(cells))
    return distinct[0] if len(distinct) == 1 else f"{distinct[0]} … ({len(distinct)})"


STAGE_HEADER = ["stage", "blocks", "ranks", "compute/mb", "comm/mb", "memory / capacity"]


def stage_table(plan: Plan, width: int) -> Table:
    """The stages fitted to ``width`` columns; blocks names give way first, from the middle."""
    rows = stage_rows(plan)
    right = (0, 3, 4, 5)
    return fitted_table(STAGE_HEADER, rows, width, shrink=(1, 2), right=right, title="stages")


def alternative_lines(alts: list, width: int) -> list[str]:
    """Two lines per alternative: its step, peak memory and layout, then why it lost, wrapped
    under it (a table's four columns wrapped every cell at 80 columns)."""
    import textwrap

    lines = []
    for a in alts:
        step = human_time(a.step_time_s) if a.step_time_s else "—"
        mem = human_bytes(a.peak_memory_bytes) if a.peak_memory_bytes else "—"
        head = f"  {step:>9}  {mem:>9}  "
        lines.append(head + middle(alternative_name(a), max(8, width - len(head))))
        lines += textwrap.wrap(
            a.why_not, width, initial_indent=" " * 24, subsequent_indent=" " * 24
        )
    return lines


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
    out.print(stage_table(plan, terminal_width()))
    out.print(
        f"predicted step {step_with_range(pred)}  ·  "
        f"{pred.samples_per_s:,.1f} samples/s  ·  {pred.tokens_per_s:,.0f} tokens/s  ·  "
        f"MFU {pred.mfu:.1%}  ·  peak memory {human_bytes(pred.peak_memory_bytes)}"
    )
    alts = [a for a in sol.alternatives if a.why_not != "chosen"][:6]
    if alts:
        out.print("alternatives", markup=False)
        for line in alternative_lines(alts, terminal_width()):
            out.print(line, markup=False)
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
        kinds = sorted({Path(p).suffix[1:].upper() for p in written} & {"PNG", "SVG"})
        out.print(
            f"wrote {folder}/: plan.json, report.html and the figures {', '.join(names)} "
            f"({' and '.join(kinds)})"
        )
