"""The placement figure: which GPU runs which (pp, dp, tp) coordinate.

Up to ``DETAIL_NODES`` nodes every GPU is a labelled cell, one node per row. Beyond that a cell
per GPU would be unreadable, so the cluster becomes a grid of nodes, each split into thin GPU
slices coloured by stage (the stages appear as bands of nodes), with node 0 drawn in detail above
it to show the layout inside a node. Beyond ``GRID_CELLS`` nodes a cell holds a group of
consecutive nodes (16,384 GPUs: 2,048 nodes in 256 cells of 8): a cell per node was unreadable
too, and its 6,000 patches and labels took most of the report's time (8 s of CPU of that plan's
figures).
"""

from __future__ import annotations

import math

import matplotlib
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Patch, Rectangle

from planner.report.style import (
    coords,
    new_figure,
    replicas,
    runs,
    span_text,
    stage_colors,
    text_color,
)
from planner.schema import Mesh, Plan

DETAIL_NODES = 16
GRID_CELLS = 256  # the node grid's most cells; more nodes share cells
DP_STRIPE = matplotlib.colormaps["Set2"]
SEP = "  ·  "
SUBTITLE_LINE_IN = 0.17  # one 8.5 pt line of the subtitle, in inches


def group_facts(plan: Plan) -> str:
    """One line on where the TP and DP groups and the stages fall, for the subtitle."""
    mesh, cl = plan.mesh, plan.cluster
    gpn = cl.gpus_per_node
    pp, dp, tp = mesh.pp, replicas(mesh), mesh.tp
    if mesh.uneven:
        widths = "/".join(str(mesh.replicas_of(i) * mesh.tp_of(i)) for i in range(pp))
        return SEP.join(
            [
                f"{pp} stages of {widths} GPUs",
                f"TP {mesh.tp_label}, DP {mesh.dp_label} by stage",
                "DP groups at each stage's TP stride",
            ]
        )
    parts = [f"{pp} stage{'s' * (pp > 1)} of {dp * tp} GPUs"]
    if tp > 1:
        where = "inside a node" if tp <= gpn and gpn % tp == 0 else "across nodes"
        parts.append(f"TP groups: {tp} consecutive GPUs {where}")
    if dp > 1:
        first = [(0 * dp + d) * tp for d in range(dp)]
        nodes = len({r // gpn for r in first})
        where = "inside one node" if nodes == 1 else f"across {nodes} nodes"
        stride = f" at stride {tp}" if tp > 1 else ""
        kind = "DP x CP" if mesh.cp > 1 else "DP"
        parts.append(f"{kind} groups: {dp} GPUs{stride}, {where}")
    return SEP.join(parts)


def _gpu_cell(ax, x: float, y: float, rank: int, plan: Plan, colors: list[str], fs: float):
    mesh = plan.mesh
    pp_i, dp_i, tp_i = coords(rank, mesh)
    face = colors[pp_i]
    cell = Rectangle((x + 0.05, y + 0.08), 0.9, 0.84, facecolor=face, edgecolor="white", lw=0.5)
    cell.set_gid("gpu")
    ax.add_patch(cell)
    ink = text_color(face)
    ax.text(
        x + 0.5,
        y + 0.62,
        f"r{rank}",
        ha="center",
        va="center",
        fontsize=fs,
        color=ink,
        fontweight="bold",
    )
    ax.text(
        x + 0.5,
        y + 0.38,
        f"({pp_i},{dp_i},{tp_i})",
        ha="center",
        va="center",
        fontsize=fs * 0.85,
        color=ink,
    )
    if mesh.tp > 1 and replicas(mesh) > 1:
        stripe = Rectangle((x + 0.05, y + 0.08), 0.9, 0.1, facecolor=DP_STRIPE(tp_i % 8), lw=0)
        stripe.set_gid("dp-stripe")
        ax.add_patch(stripe)


def _tp_outlines(ax, ranks_by_pos: dict[int, tuple[float, float]], mesh: Mesh) -> None:
    """A dark outline around each TP group, split where the group wraps to the next row."""
    for i in range(mesh.pp):
        tp = mesh.tp_of(i)
        for d in range(mesh.replicas if tp > 1 else 0):
            _outline(ax, ranks_by_pos, [mesh.rank(i, d, t) for t in range(tp)])


def _outline(ax, ranks_by_pos: dict[int, tuple[float, float]], group: list[int]) -> None:
    rows: dict[float, list[float]] = {}
    for r in group:
        if r in ranks_by_pos:
            x, y = ranks_by_pos[r]
            rows.setdefault(y, []).append(x)
    for y, xs in rows.items():
        box = FancyBboxPatch(
            (min(xs) + 0.03, y + 0.05),
            max(xs) - min(xs) + 0.94,
            0.9,
            boxstyle="round,pad=0,rounding_size=0.08",
            fill=False,
            edgecolor="#222222",
            lw=1.8,
        )
        box.set_gid("tp-group")
        ax.add_patch(box)


def _detail(ax, plan: Plan, ranks: list[int], colors: list[str], per_row: int, fs: float) -> None:
    pos: dict[int, tuple[float, float]] = {}
    rows = math.ceil(len(ranks) / per_row)
    for k, rank in enumerate(ranks):
        x, y = k % per_row, rows - 1 - k // per_row
        pos[rank] = (x, y)
        _gpu_cell(ax, x, y, rank, plan, colors, fs)
    _tp_outlines(ax, pos, plan.mesh)
    ax.set_xlim(-0.05, per_row + 0.05)
    ax.set_ylim(-0.05, rows + 0.05)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)


def _legend(fig: Figure, plan: Plan, colors: list[str], y: float) -> None:
    """One entry per stage with its ranks (at most 16, then a summary entry)."""
    mesh = plan.mesh
    gpn = plan.cluster.gpus_per_node
    handles = []
    shown = list(range(mesh.pp))
    if len(shown) > 16:
        shown = shown[:8] + shown[-7:]
    for i in shown:
        first, last = mesh.stage_ranks(i)[0], mesh.stage_ranks(i)[-1]
        a, b = first // gpn, last // gpn
        where = f"node {a}" if a == b else f"nodes {a}–{b}"
        handles.append(
            Patch(color=colors[i], label=f"stage {i}: ranks {span_text(first, last)}, {where}")
        )
        if len(shown) < mesh.pp and i == 7:
            handles.append(Patch(color="white", label=f"… {mesh.pp - 15} more stages …"))
    if mesh.tp > 1:
        handles.append(Patch(facecolor="none", edgecolor="#222222", lw=1.8, label="TP group"))
    if mesh.tp > 1 and replicas(mesh) > 1:
        handles.append(Patch(color=DP_STRIPE(0), label="DP group: same stripe colour in a stage"))
    ncol = min(4, max(1, len(handles)))
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, y), ncol=ncol)


def _wrap(facts: list[str], width_in: float) -> str:
    """Join the subtitle's facts on as few lines as fit the figure's width (8.5 pt text is
    about 0.075 inch a character), breaking only between facts."""
    fit = int((width_in - 0.4) / 0.075)
    lines = [facts[0]]
    for fact in facts[1:]:
        if len(lines[-1]) + len(SEP) + len(fact) <= fit:
            lines[-1] += SEP + fact
        else:
            lines.append(fact)
    return "\n".join(lines)


def placement_figure(plan: Plan) -> Figure:
    """The cluster as nodes x GPUs, coloured by pipeline stage, with TP and DP groups."""
    mesh, cl = plan.mesh, plan.cluster
    nodes, gpn, gpus = cl.nodes, cl.gpus_per_node, cl.gpus
    colors = stage_colors(mesh.pp)
    title = (
        f"Placement: pp {mesh.pp} × dp {mesh.dp_label}"
        + (f" × cp {mesh.cp}" if mesh.cp > 1 else "")
        + f" × tp {mesh.tp_label} on {nodes} "
        f"node{'s' * (nodes > 1)} × {gpn} {cl.profile} GPUs"
    )
    facts = ["cell: rank r and its (pp, dp, tp) coordinate", *group_facts(plan).split(SEP)]
    per_row = min(gpn, 16)
    legend_rows = math.ceil((min(mesh.pp, 16) + 2) / 4)
    if nodes <= DETAIL_NODES:
        rows = math.ceil(gpus / per_row)
        width = max(8.0, 1.0 * per_row + 1.5)
        subtitle = _wrap(facts, width)
        extra = SUBTITLE_LINE_IN * subtitle.count("\n")
        height = 1.0 * rows + 1.3 + 0.25 * legend_rows + extra
        fig = new_figure(width, height)
        top = 1 - (0.85 + extra) / height
        bottom = (0.35 + 0.25 * legend_rows) / height
        ax = fig.add_axes((1.1 / width, bottom, 1 - 1.4 / width, top - bottom))
        _detail(ax, plan, list(range(gpus)), colors, per_row, 9)
        for row in range(rows):
            first = row * per_row
            label = f"node {first // gpn}" if per_row == gpn else f"ranks {first}–"
            ax.text(-0.15, rows - 1 - row + 0.5, label, ha="right", va="center", fontsize=9)
        legend_y = bottom - 0.05 / height
    else:
        per_cell = math.ceil(nodes / GRID_CELLS)  # nodes per cell of the grid
        cells = math.ceil(nodes / per_cell)
        cols = 16 if cells <= 256 else 32
        grid_rows = math.ceil(cells / cols)
        width = 13.0
        subtitle = _wrap(facts, width)
        extra = SUBTITLE_LINE_IN * subtitle.count("\n")
        node_w = (width - 1.6) / cols
        grid_h = grid_rows * node_w * 0.7
        detail_h = (width - 1.6) / max(per_row, 12) * math.ceil(gpn / per_row)
        height = grid_h + detail_h + 1.9 + 0.25 * legend_rows + extra
        fig = new_figure(width, height)
        bottom = (0.35 + 0.25 * legend_rows) / height
        ax = fig.add_axes((1.0 / width, bottom, 1 - 1.6 / width, grid_h / height))
        _node_grid(ax, plan, colors, cols, grid_rows, per_cell)
        d_w = detail_h / math.ceil(gpn / per_row) * per_row
        dax = fig.add_axes(
            (
                (width - d_w) / 2 / width,
                (bottom * height + grid_h + 0.45) / height,
                d_w / width,
                detail_h / height,
            )
        )
        _detail(dax, plan, list(range(min(gpn, gpus))), colors, per_row, 8)
        dax.set_title("node 0 in detail", fontsize=9, fontweight="normal", pad=3)
        what = (
            f"all {nodes} nodes ({cols} per row), each split into its {gpn} GPUs"
            if per_cell == 1
            else f"all {nodes} nodes in cells of {per_cell} consecutive nodes ({cols} cells per "
            f"row), each cell split into its {per_cell * gpn} GPUs"
        )
        ax.set_title(
            what,
            fontsize=9,
            fontweight="normal",
            pad=3,
        )
        legend_y = bottom - 0.05 / height
    fig.suptitle(title, y=1 - 0.12 / fig.get_figheight(), va="top", fontsize=12, fontweight="bold")
    fig.text(0.5, 1 - 0.45 / fig.get_figheight(), subtitle, ha="center", va="top", fontsize=8.5)
    _legend(fig, plan, colors, legend_y)
    return fig


def _node_grid(ax, plan: Plan, colors: list[str], cols: int, rows: int, per_cell: int = 1) -> None:
    """Every node (or group of ``per_cell`` consecutive nodes) as a cell of thin slices, one
    per GPU, coloured by each GPU's stage; the cell is labelled with its first node. Cells are
    added as artists, not patches: the limits are set below, and ``add_patch`` would update the
    data limits per cell (a third of drawing 16,384 GPUs' 256 cells), which nothing reads."""
    mesh, cl = plan.mesh, plan.cluster
    gpn = cl.gpus_per_node
    width = gpn * per_cell  # GPUs per cell
    # each rank's stage, read off the stages' rank ranges once: ``coords`` per rank walks the
    # stages (16,384 calls, a fifth of drawing that plan's placement)
    stage_of = [i for i in range(mesh.pp) for _ in mesh.stage_ranks(i)]
    stage_of += [mesh.pp - 1] * (cl.gpus - len(stage_of))  # as ``coords`` places any rank past
    for cell_i in range(math.ceil(cl.nodes / per_cell)):
        x0, y0 = cell_i % cols, rows - 1 - cell_i // cols
        first_rank = cell_i * width
        stages = stage_of[first_rank : min(first_rank + width, cl.gpus)]
        for first, last, stage in runs(stages):  # one patch per run: no seams between slices
            cell = Rectangle(
                (x0 + 0.05 + 0.9 * first / width, y0 + 0.1),
                0.9 * (last - first + 1) / width,
                0.8,
                facecolor=colors[stage],
                lw=0,
            )
            cell.set_gid("gpu")
            ax.add_artist(cell)
        ax.add_artist(
            Rectangle((x0 + 0.05, y0 + 0.1), 0.9, 0.8, fill=False, edgecolor="white", lw=0.8)
        )
        face = colors[stage_of[first_rank]]
        ax.text(
            x0 + 0.5,
            y0 + 0.5,
            str(cell_i * per_cell),
            ha="center",
            va="center",
            fontsize=6.5,
            color=text_color(face),
        )
    per_row = cols * per_cell  # nodes per row of cells
    ax.set_xlim(0, cols)
    ax.set_ylim(0, rows)
    ax.set_xticks([])
    ax.set_yticks([(rows - 1 - r) + 0.5 for r in range(rows)])
    ax.set_yticklabels(
        [
            f"nodes {span_text(r * per_row, min((r + 1) * per_row, cl.nodes) - 1)}"
            for r in range(rows)
        ],
        fontsize=7.5,
    )
    ax.tick_params(length=0)
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)
