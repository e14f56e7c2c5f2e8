"""The plan report: five figures (PNG, and SVG when asked) and a self-contained report.html
beside plan.json.

``write_report`` is what ``plan show`` calls, and ``plan`` through a worker process
(``planner.report.worker``) that draws while the planner searches. The report reads a plan and
nothing else: no trace, no solver (benchmarks/doc_figures.py plans the README's examples and
draws them with the same figures).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from planner.atomic import write_bytes_atomic, write_text_atomic
from planner.errors import UserInputError
from planner.schema import Plan

REPORT_NAMES = ("placement", "blocks", "memory", "timeline", "candidates")


def figure_formats(svg: bool) -> tuple[str, ...]:
    """The formats each figure is written in: PNG always (report.html inlines it); SVG only
    when asked, since drawing it costs about as much again as the PNG."""
    return ("png", "svg") if svg else ("png",)


def report_files(out_dir: Path, svg: bool = False) -> list[Path]:
    """The only files the report ever writes: fixed names, so a user's own file is never hit."""
    formats = figure_formats(svg)
    files = [out_dir / f"{name}.{ext}" for name in REPORT_NAMES for ext in formats]
    return files + [out_dir / "report.html"]


def figures_hold(draft: Plan, plan: Plan) -> bool:
    """Whether the figures drawn from ``draft`` are ``plan``'s: the two are equal but for the
    solver's alternatives (the baselines' rows), which no figure reads (report.html's table
    does)."""
    solver = dataclasses.replace(plan.solver, alternatives=draft.solver.alternatives)
    return dataclasses.replace(plan, solver=solver) == draft


def write_report(
    plan: Plan,
    out_dir: Path,
    command: str,
    svg: bool = False,
    split: bool = False,
    rendered: dict[str, dict[str, bytes]] | None = None,
) -> list[Path]:
    """Write the five figures as PNG (and SVG with ``svg``) and report.html into ``out_dir``;
    each file atomically (a crash leaves the previous report intact). Returns the paths
    written. ``split``: draw on two cores (``figures.render_all``). ``rendered``: the
    figures' bytes drawn already (``render_all``'s, of a draft that ``figures_hold``)."""
    from planner.report.figures import render_all
    from planner.report.html import render_html

    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserInputError(f"cannot create output directory {out_dir}: {exc.strerror}") from exc
    if rendered is None:
        rendered = render_all(plan, figure_formats(svg), split)
    written: list[Path] = []
    try:
        for name, formats in rendered.items():
            for ext, data in formats.items():
                path = out_dir / f"{name}.{ext}"
                write_bytes_atomic(path, data)
                written.append(path)
        page = render_html(plan, {n: f["png"] for n, f in rendered.items()}, command, svg)
        path = out_dir / "report.html"
        write_text_atomic(path, page)
        written.append(path)
    except OSError as exc:
        raise UserInputError(f"cannot write the report into {out_dir}: {exc.strerror}") from exc
    return written
