"""The figure and page of a recommendation plan: what each rank does in a step and holds.

A recommendation plan places tables, not stages, so the dense plan's five figures have nothing
to draw. This one has two panels, one row per rank: the predicted step split into the rank's
own table work (lookups, their all-to-alls, the optimizer) and the dense part every rank runs
alike; and the device memory the rank holds, one segment per table shard (coloured by its
sharding type) beside the dense part, against the device's capacity. A person reads from it
which rank sets the step and why, and how full each rank is. ``report.html`` beside it is the
dense report's self-contained page for this plan: the figure, the tables' options and ranks,
the ranks' step and memory, and the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from planner.atomic import write_bytes_atomic, write_text_atomic
from planner.errors import UserInputError
from planner.report.console import human_bytes, human_time

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


def recplan_html(doc: dict[str, Any], png: bytes, command: str) -> str:
    """The page: summary, the figure (inlined), the tables and the ranks, the command."""
    from planner.report.html import figure, page, table
    from planner.report.recplan import ranks_label

    c, p = doc["cluster"], doc["predicted"]
    world = c["gpus"]
    model = doc.get("model") or {}
    name = Path(str(model.get("file", "model"))).name
    title = f"meshplan: {name} ({len(doc['tables'])} tables) on {world} x {c['profile']}"
    summary = (
        f"predicted step {human_time(p['step_time_s'])} ({p['samples_per_s']:,.0f} samples/s); "
        f"peak device memory {human_bytes(p['peak_device_bytes'])} of "
        f"{human_bytes(p['device_capacity_bytes'])}; global batch "
        f"{doc.get('global_batch_size', '?')}, {doc.get('device', '?')}"
    )
    tables = table(
        ("table", "rows", "dim", "option", "sharding", "kernel", "ranks", "lookup",
         "all-to-all", "memory/rank"),
        ((t["name"], f"{t['rows']:,}", t["dim"], t["option"], t["sharding"], t["kernel"],
          ranks_label(sorted(t["ranks"]), world), human_time(t["lookup_s"]),
          human_time(t["comm_s"]), human_bytes(t["device_bytes"])) for t in doc["tables"]),
        {1, 2, 7, 8, 9},
    )  # fmt: skip
    ranks = table(
        ("rank", "step", "lookups", "all-to-all", "device memory", "host memory"),
        ((r["rank"], human_time(r["step_s"]), human_time(r["lookup_s"]), human_time(r["comm_s"]),
          human_bytes(r["device_bytes"]), human_bytes(r["host_bytes"]))
         for r in sorted(doc["ranks"], key=lambda r: r["rank"])),
        {0, 1, 2, 3, 4, 5},
    )  # fmt: skip
    caption = "Each rank's predicted step by part and its device memory by table shard"
    body = (
        f"<h2>Figure</h2>\n{figure(RECPLAN_FIGURE, png, caption)}\n"
        f"<h2>Tables</h2>\n{tables}\n<h2>Ranks</h2>\n{ranks}"
    )
    return page(title, summary, body, command)


def write_recplan_report(doc: dict[str, Any], out_dir: Path, command: str) -> list[Path]:
    """``ranks.png``, ``ranks.svg`` and ``report.html`` beside the plan, each written
    atomically (fixed names: a user's own file is never hit). Returns the paths written."""
    from planner.report.figures import render

    fig = recplan_figure(doc)
    files = {ext: render(fig, ext) for ext in ("png", "svg")}
    written = []
    try:
        for ext, data in files.items():
            path = Path(out_dir) / f"{RECPLAN_FIGURE}.{ext}"
            write_bytes_atomic(path, data)
            written.append(path)
        path = Path(out_dir) / "report.html"
        write_text_atomic(path, recplan_html(doc, files["png"], command))
        written.append(path)
    except OSError as exc:
        raise UserInputError(f"cannot write the report into {out_dir}: {exc.strerror}") from exc
    return written
