"""The figure of a recommendation plan: what each rank does in a step and what it holds.

A recommendation plan places tables, not stages, so the dense plan's five figures have nothing
to draw. This one has two panels, one row per rank: the predicted step split into the rank's
own table work (lookups, their all-to-alls, the optimizer) and the dense part every rank runs
alike; and the device memory the rank holds, one segment per table shard (coloured by its
sharding type) beside the dense part, against the device's capacity. A person reads from it
which rank sets the step and why, and how full each rank is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from planner.atomic import write_bytes_atomic
from planner.errors import UserInputError

RECPLAN_FIGURE = "ranks"
GIB = 2**30
# One colour per TorchRec sharding type, and the dense part.
SHARDING_COLOURS = {
    "table_wise": "#4C72B0",
    "column_wise": "#55A868",
    "row_wise": "#C44E52",
    "table_row_wise": "#8172B2",
    "data_parallel": "#CCB974",
    "dense": "#8C8C8C",
}
LABELS = {"dense": "dense part, buffers"}
STEP_PARTS = (  # (label, colour): the rank's own work, then what every rank runs alike
    ("lookups", "#4C72B0"),
    ("all-to-all", "#DD8452"),
    ("optimizer", "#55A868"),
    ("dense part, latencies", "#8C8C8C"),
)


def recplan_figure(doc: dict[str, Any]) -> Figure:
    """Two panels, one bar per rank: the predicted step by part, and device memory by shard."""
    ranks = sorted(doc["ranks"], key=lambda r: r["rank"])
    n = len(ranks)
    height = max(2.6, 0.32 * n + 1.6)
    fig = Figure(figsize=(12, height))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.15]})
    y = [r["rank"] for r in ranks]
    _step_panel(left, doc, ranks, y)
    _memory_panel(right, doc, ranks, y)
    c = doc["cluster"]
    fig.suptitle(
        f"{len(doc['tables'])} tables on {c['gpus']} x {c['profile']} ({doc.get('device', '?')}): "
        f"step {doc['predicted']['step_time_s'] * 1e3:.3f} ms predicted",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def _step_parts(doc: dict[str, Any], rank: dict[str, Any]) -> list[float]:
    """Seconds of each ``STEP_PARTS`` entry on ``rank``; the dense part is the step's rest."""
    own = [rank["lookup_s"], rank["comm_s"], rank.get("optimizer_s", 0.0)]
    return [*own, max(0.0, rank["step_s"] - sum(own))]


def _step_panel(ax, doc: dict[str, Any], ranks: list[dict], y: list[int]) -> None:
    start = [0.0] * len(ranks)
    for i, (label, colour) in enumerate(STEP_PARTS):
        widths = [_step_parts(doc, r)[i] * 1e3 for r in ranks]
        ax.barh(y, widths, left=start, color=colour, label=label, height=0.7)
        start = [s + w for s, w in zip(start, widths)]
    slow = max(ranks, key=lambda r: r["step_s"])
    ax.axvline(slow["step_s"] * 1e3, color="black", lw=0.8, ls="--")
    ax.set_xlabel("predicted step (ms)")
    ax.set_ylabel("rank")
    ax.set_yticks(y)
    ax.invert_yaxis()
    ax.set_title(f"what each rank does (slowest: rank {slow['rank']})", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")


def _memory_panel(ax, doc: dict[str, Any], ranks: list[dict], y: list[int]) -> None:
    held: dict[int, list[tuple[str, float]]] = {r["rank"]: [] for r in ranks}
    for t in doc["tables"]:
        for r in t["ranks"]:
            if r in held:
                held[r].append((t["sharding"], float(t["device_bytes"])))
    for r in ranks:
        tables = sum(b for _, b in held[r["rank"]])
        held[r["rank"]].append(("dense", max(0.0, r["device_bytes"] - tables)))
    for r in ranks:
        start = 0.0
        for sharding, nbytes in held[r["rank"]]:
            colour = SHARDING_COLOURS.get(sharding, "#DDDDDD")
            ax.barh(r["rank"], nbytes / GIB, left=start, color=colour, height=0.7,
                    edgecolor="white", linewidth=0.3)  # fmt: skip
            start += nbytes / GIB
    capacity = doc["predicted"]["device_capacity_bytes"] / GIB
    most = max(r["device_bytes"] for r in ranks) / GIB
    if most > capacity / 2:  # near full: the capacity line belongs on the axis
        ax.axvline(capacity, color="black", lw=0.8, ls="--")
        ax.set_xlabel(f"device memory (GiB; dashed: capacity {capacity:.0f} GiB)")
    else:  # mostly empty: the axis shows what is held
        ax.set_xlim(0, most * 1.1)
        ax.set_xlabel(f"device memory (GiB; capacity {capacity:.0f} GiB, off the axis)")
    ax.set_yticks(y)
    ax.invert_yaxis()
    ax.set_title("what each rank holds (one segment per table shard)", fontsize=9)
    used = {s for parts in held.values() for s, _ in parts}
    ax.legend(
        handles=[Patch(color=c, label=LABELS.get(s, s.replace("_", " ")))
                 for s, c in SHARDING_COLOURS.items() if s in used],
        fontsize=7,
        loc="lower right",
    )  # fmt: skip


def write_recplan_figure(doc: dict[str, Any], out_dir: Path) -> list[Path]:
    """``ranks.png`` and ``ranks.svg`` beside the plan, each written atomically (fixed names:
    a user's own file is never hit). Returns the paths written."""
    from planner.report.figures import render

    fig = recplan_figure(doc)
    written = []
    try:
        for ext in ("png", "svg"):
            path = Path(out_dir) / f"{RECPLAN_FIGURE}.{ext}"
            write_bytes_atomic(path, render(fig, ext))
            written.append(path)
    except OSError as exc:
        raise UserInputError(f"cannot write the figure into {out_dir}: {exc.strerror}") from exc
    return written
