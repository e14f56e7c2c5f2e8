"""What every figure shares: the Agg backend, one colour per pipeline stage, units, and a helper
that labels runs of equal values instead of every item (so 100 blocks or 128 nodes stay legible).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from planner.schema import Mesh  # noqa: E402

GIB = 2**30
BASE_FONT = 9

matplotlib.rcParams.update(
    {
        "font.size": BASE_FONT,
        "axes.titlesize": BASE_FONT + 2,
        "axes.titleweight": "bold",
        "axes.spines.top": False,
        "axes.spines.right": False,
        "legend.fontsize": BASE_FONT - 1,
        "legend.frameon": False,
        "svg.fonttype": "none",
        "svg.hashsalt": "meshplan",
    }
)

# Categories of memory and time, fixed so that every figure and the page agree.
MEMORY_COLORS = {
    "params": "#4c72b0",
    "grads": "#dd8452",
    "optimizer": "#55a868",
    "activations": "#c44e52",
    "other": "#8c8c8c",
}
TIME_COLORS = {
    "forward": "#9ecae1",
    "backward": "#2171b5",
    "p2p": "#fdae6b",
    "dp": "#e6550d",
    "optimizer": "#31a354",
    "offload": "#756bb1",
    "idle": "#eeeeee",
}


def stage_colors(n: int) -> list[str]:
    """n clearly distinct colours, one per pipeline rank: tab10/tab20 while they last, then
    evenly spaced samples of a perceptual colour map (still n distinct values)."""
    if n <= 10:
        cmap = matplotlib.colormaps["tab10"]
        return [to_hex(cmap(i)) for i in range(n)]
    if n <= 20:
        cmap = matplotlib.colormaps["tab20"]
        return [to_hex(cmap(i)) for i in range(n)]
    cmap = matplotlib.colormaps["turbo"]
    colors = [to_hex(cmap(0.05 + 0.9 * i / (n - 1))) for i in range(n)]
    assert len(set(colors)) == n
    return colors


def text_color(face: str) -> str:
    """Black or white, whichever reads better on ``face``."""
    r, g, b, _ = matplotlib.colors.to_rgba(face)
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"


def runs(values: Sequence[Any]) -> list[tuple[int, int, Any]]:
    """Runs of equal consecutive values as (first index, last index, value)."""
    out: list[tuple[int, int, Any]] = []
    for i, val in enumerate(values):
        if out and out[-1][2] == val and out[-1][1] == i - 1:
            out[-1] = (out[-1][0], i, val)
        else:
            out.append((i, i, val))
    return out


def span_text(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}–{last}"


def human_gib(n: float) -> str:
    return f"{n / GIB:,.1f} GiB"


def time_unit(seconds: float) -> tuple[float, str]:
    """A scale and unit name that keep an axis spanning ``seconds`` in readable numbers."""
    if seconds >= 2:
        return 1.0, "s"
    if seconds >= 2e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def replicas(mesh: Mesh) -> int:
    """Copies of each weight in a stage: data-parallel times context-parallel ranks."""
    return mesh.replicas


def stage_of_rank(rank: int, mesh: Mesh) -> int:
    return mesh.coords(rank)[0]


def coords(rank: int, mesh: Mesh) -> tuple[int, int, int]:
    """(pp, replica, tp) of a global rank, replica = dp_i * cp + cp_i (``Mesh.rank``)."""
    pp_i, dp_i, cp_i, tp_i = mesh.coords(rank)
    return pp_i, dp_i * mesh.cp + cp_i, tp_i


def text_width_in(text: str, fontsize: float) -> float:
    """A generous estimate of a label's printed width in inches (DejaVu Sans averages about
    0.6 em per character), used to drop labels that would not fit rather than let them overlap."""
    return len(text) * fontsize * 0.62 / 72


def keep_apart(centers_in: Sequence[float], texts: Sequence[str], fontsize: float) -> list[int]:
    """Indices of the labels to draw, left to right, so that no two drawn labels overlap."""
    kept: list[int] = []
    right = float("-inf")
    for i in sorted(range(len(texts)), key=lambda k: centers_in[k]):
        half = text_width_in(texts[i], fontsize) / 2
        if centers_in[i] - half >= right + 0.05:
            kept.append(i)
            right = centers_in[i] + half
    return kept


def new_figure(width: float, height: float) -> Figure:
    """A figure outside pyplot (whose import is most of a report worker's start-up, and whose
    registry would keep each figure until closed), on an Agg canvas of its own so that it can
    be drawn and measured (``fig.canvas.get_renderer()``) as well as saved."""
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig
