"""The five figures of a plan, built and rendered to PNG (and SVG) bytes.

Builders return matplotlib Figures (tests inspect them); ``render`` turns one into bytes with
fixed metadata, so the same plan gives the same files on every run.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import matplotlib.pyplot as plt
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
    plan: Plan, formats: tuple[str, ...] = ("png", "svg")
) -> dict[str, dict[str, bytes]]:
    """{name: {format: bytes}} for the five figures; figures are closed after."""
    out: dict[str, dict[str, bytes]] = {}
    for name, build in FIGURES.items():
        fig = build(plan)
        try:
            out[name] = {fmt: render(fig, fmt) for fmt in formats}
        finally:
            plt.close(fig)
    return out
