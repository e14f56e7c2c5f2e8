"""The five figures of a plan, built and rendered to PNG (and SVG) bytes.

Builders return matplotlib Figures (tests inspect them); ``render`` turns one into bytes with
fixed metadata, so the same plan gives the same files on every run.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable

from matplotlib.figure import Figure

from planner.report.blocks import blocks_figure
from planner.report.candidates import candidates_figure
from planner.report.memory import memory_figure
from planner.report.placement import placement_figure
from planner.report.timeline import timeline_figure
from planner.schema import Plan

FIGURES: dict[str, Callable[[Plan], Figure]] = {
    "placement": placement_figure,
    "blocks": blocks_figure,
    "memory": memory_figure,
    "timeline": timeline_figure,
    "candidates": candidates_figure,
}

CAPTIONS = {
    "placement": "Which GPU runs which (pp, dp, tp) coordinate: colour = pipeline stage, "
    "outline = tensor-parallel group, stripe = data-parallel group.",
    "blocks": "The model's blocks in order: each one's share of compute time and of memory, its "
    "stage, recompute (hatched), offload (▼) and tensor-parallel variant.",
    "memory": "What fills each device, per pipeline rank, against the usable capacity.",
    "timeline": "One step per pipeline rank, simulated from the cost model's per-stage timings: "
    "forward and backward of each micro-batch, communication, and the bubble (grey).",
    "candidates": "Every candidate the solver priced: predicted step time against peak memory; "
    "the chosen plan is the star.",
}

PNG_DPI = 110


def build_figures(plan: Plan) -> dict[str, Figure]:
    """All five figures of ``plan``, by name, in the order the report shows them."""
    return {name: build(plan) for name, build in FIGURES.items()}


def render(fig: Figure, fmt: str) -> bytes:
    """PNG or SVG bytes of ``fig``, without timestamps."""
    buf = io.BytesIO()
    meta = {"Software": None} if fmt == "png" else {"Date": None, "Creator": None}
    fig.savefig(buf, format=fmt, dpi=PNG_DPI, metadata=meta, facecolor="white")
    return buf.getvalue()


def render_all(
    plan: Plan, formats: tuple[str, ...] = ("png", "svg"), split: bool = False
) -> dict[str, dict[str, bytes]]:
    """{name: {format: bytes}} for the five figures; figures are closed after.

    ``split``: draw each of ``FORKED``'s figures in a forked copy of this process of its own
    while this one draws the rest (the report worker's case: when the plan arrives the planner
    only waits, so both cores are free, and the figures are the whole wait). Each figure is
    drawn from the plan alone, so the bytes are those of drawing them one after another; a
    copy that fails leaves its figure to this process, which then raises what went wrong."""
    if not split or not hasattr(os, "fork"):
        return _render(plan, list(FIGURES), formats)
    copies = [(name, *_forked(plan, name, formats)) for name in FIGURES if name in FORKED]
    drawn = _render(plan, [n for n in FIGURES if n not in FORKED], formats)
    for name, pid, read in copies:
        with os.fdopen(read, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) == 0:
            drawn.update(pickle.loads(data))  # from the copy of this process, just forked
        else:
            drawn.update(_render(plan, [name], formats))
    return {name: drawn[name] for name in FIGURES}


def _forked(plan: Plan, name: str, formats: tuple[str, ...]) -> tuple[int, int]:
    """(pid, the pipe to read) of a forked copy drawing figure ``name``; the copy leaves
    without running the parent's exit handlers."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the copy: draw, send, leave
        code = 1
        try:
            os.close(read)
            with os.fdopen(write, "wb") as pipe:
                pipe.write(pickle.dumps(_render(plan, [name], formats)))
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    return pid, read


# The figures each drawn in a forked copy of its own in ``render_all(split=True)``, the other
# three in the worker itself: three processes share the two cores, so the wait is about half of
# the drawing's CPU whichever figure is the longest (Llama-3-70B / 64: placement 0.63 s and
# timeline 0.37 s of CPU, against 0.97 s for the other three; Llama-3-405B on 16,384 GPUs, at
# load 15: about 1.4 s and 1.0 s against 1.5 s, where one copy drawing both took 2.4 s).
FORKED = ("placement", "timeline")


def _render(plan: Plan, names: list[str], formats: tuple[str, ...]) -> dict[str, dict[str, bytes]]:
    out: dict[str, dict[str, bytes]] = {}
    for name in names:
        fig = FIGURES[name](plan)  # a Figure of its own, outside pyplot: nothing to close
        out[name] = {fmt: render(fig, fmt) for fmt in formats}
    return out
