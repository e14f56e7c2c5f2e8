"""The timeline figure: one training step per pipeline rank, from the cost model's own timings.

Boxes come from ``schedule.simulate`` fed with each stage's ``forward_s`` and ``backward_s`` (the
point-to-point share, ``p2p_s / 2`` of each, drawn as the box's tail), followed by the rank's
exposed data-parallel communication, optimizer step and offload traffic. Grey is idle time: the
pipeline bubble. Past ```` micro-batches the steady state only repeats, so fewer are
drawn (the title says how many) and a bar below gives the whole step as the cost model prices it.
"""

from __future__ import annotations

from dataclasses import replace

from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.path import Path
from matplotlib.ticker import MaxNLocator

from planner.report.schedule import Box, compress, simulate, steady_cuts
from planner.report.style import TIME_COLORS, keep_apart, new_figure, text_width_in, time_unit
from planner.schema import Plan
from planner.vocab import Schedule, schedule_label


def step_boxes(plan: Plan, m: int | None = None) -> list[Box]:
    """The simulated schedule of ``plan`` with ``m`` micro-batches (default: the plan's)."""
    stages = plan.stages
    pp, v = plan.mesh.pp, plan.virtual_stages
    return simulate(
        schedule_of(plan),
        [st.forward_s for st in stages],
        [st.backward_s for st in stages],
        pp,
        plan.num_microbatches if m is None else m,
        v,
    )


def schedule_of(plan: Plan) -> str:
    return plan.schedule if plan.mesh.pp > 1 else Schedule.ONE_F_ONE_B


def tail_parts(plan: Plan, rank: int) -> list[tuple[str, float]]:
    """What a rank does after its last backward: exposed DP communication, optimizer, offload
    (summed over its chunks)."""
    own = [st for st in plan.stages if st.pp_rank == rank]
    return [
        ("dp", sum(st.dp_exposed_s for st in own)),
        ("optimizer", sum(st.optimizer_s for st in own)),
        ("offload", sum(st.offload_s for st in own)),
    ]


def timeline_boxes(plan: Plan) -> list[Box]:
    """Every box of the step in true time: forward and backward bodies ("F", "B"), their
    point-to-point tails ("P"), and each rank's exposed DP communication, optimizer step and
    offload after its last backward ("dp", "optimizer", "offload")."""
    stages = plan.stages
    out: list[Box] = []
    ends: dict[int, float] = {}
    for b in step_boxes(plan):
        tail = min(stages[b.stage].p2p_s / 2, b.end - b.start)
        out.append(replace(b, end=b.end - tail))
        if tail > 0:
            out.append(replace(b, kind="P", start=b.end - tail))
        ends[b.rank] = max(ends.get(b.rank, 0.0), b.end)
    for r, t in sorted(ends.items()):
        for kind, dur in tail_parts(plan, r):
            if dur > 0:
                out.append(Box(r, -1, 0, kind, -1, t, t + dur))
                t += dur
    return out


def _corners(x: float, y: float, width: float) -> list[tuple[float, float]]:
    """A box 0.8 high as the corners a ``Rectangle((x, y), width, 0.8)`` is drawn through, in
    its order: a PolyCollection of these draws the same boxes without a patch object each
    (Llama-3-405B on 16,384 GPUs: 5,150 boxes, half of the figure's CPU making Rectangles)."""
    return [(x, y), (width + x, y), (width + x, 0.8 + y), (x, 0.8 + y)]


def _hatched(boxes: list[list[tuple[float, float]]]) -> PathCollection:
    """The odd chunks' hatching over their boxes, as one compound path: Agg hatches each path
    of a collection on its own, and a path per box took half of the figure's CPU on
    Llama-3-405B / 16,384 (2,048 hatched boxes, 0.5 s); the boxes do not overlap, so one path
    covers the same pixels."""
    path = Path.make_compound_path(
        *(Path([*corners, corners[0]], closed=True) for corners in boxes)
    )
    return PathCollection(
        [path],
        facecolor="none",
        edgecolor="#08306b",
        hatch="///",
        lw=0,
        alpha=0.5,
        gid="odd-chunk",
    )


def timeline_figure(plan: Plan) -> Figure:
    """
    Long because a figure's layout reads best top to bottom, panel by panel.
    """
    pp, v, m = plan.mesh.pp, plan.virtual_stages, plan.num_microbatches
    true_boxes = timeline_boxes(plan)
    pipe_end = max(b.end for b in true_boxes if b.kind in "FBP")
    total = max(b.end for b in true_boxes)
    keep = max(3, pp if v == 1 else 2 * pp)
    cuts = steady_cuts(step_boxes(plan), schedule_of(plan), pp, m, v, keep) if m * v > 24 else []
    kept = total - sum(b - a for a, b, _ in cuts)
    gap = 0.05 * kept
    boxes, to_drawn = compress(true_boxes, cuts, gap)
    drawn_total = to_drawn(total)
    pred = plan.predicted
    scale, unit = time_unit(max(total, pred.step_time_s))
    row_h = 0.45 if pp <= 8 else max(0.16, 3.6 / pp)
    width = 13.0
    height = 3.1 + row_h * pp
    fig = new_figure(width, height)
    left, right = 0.09, 0.83
    ax = fig.add_axes((left, 1.5 / height, right - left, row_h * pp / height))
    bar = fig.add_axes((left, 0.45 / height, right - left, 0.3 / height))
    xmax = drawn_total * 1.01
    inch_per_s = (right - left) * width / xmax
    fs = 7 if pp <= 16 else 6
    groups: dict[str, list[list[tuple[float, float]]]] = {}
    odd: list[list[tuple[float, float]]] = []
    for r in range(pp):
        groups.setdefault("idle", []).append(_corners(0, pp - 1 - r + 0.1, to_drawn(pipe_end)))
    for b in boxes:
        y = pp - 1 - b.rank
        corners = _corners(b.start, y + 0.1, b.end - b.start)
        groups.setdefault(b.kind, []).append(corners)
        if b.kind in "FB" and b.chunk % 2 == 1:
            odd.append(corners)
        if b.kind in "FB" and row_h >= 0.25:
            text = str(b.microbatch) if v == 1 else f"{b.microbatch}.{b.chunk}"
            if text_width_in(text, fs) < (b.end - b.start) * inch_per_s * 0.9:
                ax.text(
                    (b.start + b.end) / 2,
                    y + 0.5,
                    text,
                    ha="center",
                    va="center",
                    fontsize=fs,
                    color="black" if b.kind == "F" else "white",
                )
    style = {
        "idle": ("idle", 0),
        "F": ("forward", 0.3),
        "B": ("backward", 0.3),
        "P": ("p2p", 0),
        "dp": ("dp", 0),
        "optimizer": ("optimizer", 0),
        "offload": ("offload", 0),
    }
    for kind, (color, lw) in style.items():
        if kind in groups:
            ax.add_collection(
                PolyCollection(
                    groups[kind], facecolor=TIME_COLORS[color], edgecolor="white", lw=lw, gid=color
                )
            )
    if odd:
        ax.add_collection(_hatched(odd))
    for a, b, skipped in cuts:
        x = to_drawn(a)
        ax.add_patch(
            Rectangle((x, 0), gap, pp, facecolor="white", edgecolor="none", zorder=3, gid="cut")
        )
        for edge in (x, x + gap):
            ax.plot([edge, edge], [0, pp], color="#555555", lw=0.8, ls=(0, (2, 2)), zorder=4)
        ax.text(
            x + gap / 2,
            pp + 0.15,
            f"⋯ {skipped} more micro-batches, {(b - a) * scale:,.1f} {unit} ⋯",
            ha="center",
            va="bottom",
            fontsize=7.5,
        )
    ax.set_xlim(0, xmax)
    ax.set_ylim(0, pp)
    _true_ticks(ax, cuts, to_drawn, total, scale, inch_per_s)
    ax.set_yticks([pp - 1 - r + 0.5 for r in range(pp)])
    ticks = [f"rank {r}" for r in range(pp)]
    if pp > 16:
        ticks = [t if r % (pp // 16 + 1) == 0 or r == pp - 1 else "" for r, t in enumerate(ticks)]
    ax.set_yticklabels(ticks, fontsize=8)
    ax.set_ylabel("pipeline rank")
    ax.set_xlabel(f"time ({unit})")
    ax.tick_params(axis="y", length=0)
    _breakdown(bar, plan, scale, unit)
    handles = [
        Patch(color=TIME_COLORS["forward"], label="forward"),
        Patch(color=TIME_COLORS["backward"], label="backward"),
    ]
    if v > 1:
        handles.append(
            Patch(
                facecolor="white", edgecolor="#08306b", hatch="///", label="odd chunk (interleaved)"
            )
        )
    for kind, color, label in (
        ("P", "p2p", "point-to-point"),
        ("dp", "dp", "exposed DP comm."),
        ("optimizer", "optimizer", "optimizer step"),
        ("offload", "offload", "offload traffic"),
    ):
        if kind in groups:
            handles.append(Patch(color=TIME_COLORS[color], label=label))
    handles.append(Patch(color=TIME_COLORS["idle"], label="idle (bubble)"))
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(right + 0.01, 1 - 0.8 / height))
    name = schedule_label(plan.schedule, v, pp)
    fig.suptitle(
        f"Timeline of one step: {name}, {pp} rank{'s' * (pp > 1)}, {m} micro-batch"
        f"{'es' * (m > 1)} per replica",
        y=1 - 0.12 / height,
        va="top",
        fontsize=12,
        fontweight="bold",
    )
    note = "boxes: micro-batch" + (".chunk" if v > 1 else "") + " (where it fits)"
    if cuts:
        note += "  ·  ⋯ marks repeated steady state cut out of the axis; tick labels are true times"
    fig.text(0.5, 1 - 0.5 / height, note, ha="center", va="top", fontsize=8.5)
    return fig


def _true_ticks(ax, cuts, to_drawn, total: float, scale: float, inch_per_s: float) -> None:
    """Ticks at round true times in each kept segment, placed on the compressed axis."""
    edges = [0.0] + [t for a, b, _ in sorted(cuts) for t in (a, b)] + [total]
    pos, texts = [], []
    for lo, hi in zip(edges[::2], edges[1::2]):
        width_in = (to_drawn(hi) - to_drawn(lo)) * inch_per_s
        nbins = max(1, int(width_in / 0.9))
        for t in MaxNLocator(nbins=nbins, steps=[1, 2, 2.5, 5, 10]).tick_values(
            lo * scale, hi * scale
        ):
            if lo * scale - 1e-9 <= t <= hi * scale + 1e-9:
                pos.append(to_drawn(t / scale))
                texts.append(f"{t:,.6g}")
    keep = keep_apart([p * inch_per_s for p in pos], texts, 8)
    ax.set_xticks([pos[i] for i in keep])
    ax.set_xticklabels([texts[i] for i in keep])


def _breakdown(ax, plan: Plan, scale: float, unit: str) -> None:
    """The whole step as the cost model prices it: work, bubble, exposed DP, optimizer, offload."""
    pred = plan.predicted
    pipeline = pred.pipeline_s
    bubble = pred.bubble_s
    parts = [
        ("forward + backward", pipeline - bubble, TIME_COLORS["backward"]),
        ("bubble", bubble, "#bdbdbd"),
        ("exposed DP", pred.dp_exposed_s, TIME_COLORS["dp"]),
        ("optimizer", pred.optimizer_s, TIME_COLORS["optimizer"]),
        ("offload", pred.offload_s, TIME_COLORS["offload"]),
    ]
    step = pred.step_time_s
    width_in = ax.get_position().width * ax.figure.get_figwidth()
    x = 0.0
    for name, dur, color in parts:
        if dur <= 0:
            continue
        ax.barh(0, dur * scale, left=x * scale, color=color, height=0.8, gid=f"step-{name}")
        text = f"{name} {dur * scale:,.1f} {unit}"
        if text_width_in(text, 7.5) < dur / step * width_in * 0.95:
            ink = "white" if color in (TIME_COLORS["backward"], TIME_COLORS["dp"]) else "black"
            ax.text(
                (x + dur / 2) * scale, 0, text, ha="center", va="center", fontsize=7.5, color=ink
            )
        x += dur
    ax.set_xlim(0, step * scale)
    ax.set_yticks([0])
    ax.set_yticklabels(["whole step"], fontsize=8)
    ax.tick_params(axis="y", length=0)
    ax.set_xlabel(
        f"predicted step {step * scale:,.1f} {unit}: bubble {bubble / step:.1%}, "
        f"MFU {pred.mfu:.1%}",
        fontsize=8.5,
    )
    for side in ("left",):
        ax.spines[side].set_visible(False)
