"""The blocks figure: the model from input to output, one bar per block.

Top: each block's share of the step's compute time (forward + backward per micro-batch); bottom:
its share of device memory. Bars take their stage's colour, hatching marks recompute, a marker
marks offload, and a strip under the bars names the TP variant. Runs of equal values (stages,
variants, block classes) are labelled once, so a 100-layer model stays legible.
"""

from __future__ import annotations

import matplotlib
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from planner.report.style import (
    keep_apart,
    new_figure,
    runs,
    stage_colors,
    text_color,
    text_width_in,
)
from planner.schema import Plan
from planner.vocab import Offload, Recompute

HATCH = {Recompute.NONE: "", Recompute.SELECTIVE: "///", Recompute.FULL: "xxx"}
VARIANT_COLORS = matplotlib.colormaps["Pastel2"]
MAX_NAMED = 32  # up to this many blocks, every block's name is an x tick


def block_shares(plan: Plan) -> tuple[list[float], list[float]]:
    """Each block's percentage of the summed block time and of the summed block memory."""
    blocks = plan.blocks
    t = [b.time_per_microbatch_s for b in blocks]
    mem = [b.memory_bytes for b in blocks]
    tt, mm = sum(t) or 1.0, sum(mem) or 1.0
    return [100 * x / tt for x in t], [100 * x / mm for x in mem]


def short(name: str, limit: int = 28) -> str:
    """A block name cut in the middle to at most ``limit`` characters."""
    if len(name) <= limit:
        return name
    keep = (limit - 1) // 2
    return name[:keep] + "…" + name[-keep:]


def blocks_figure(plan: Plan) -> Figure:
    """The block strip: per block its share of compute time and of memory, coloured by
    stage, hatched by recompute, marked where offloaded, with the stage band above and the
    TP-variant strip below."""
    blocks = plan.blocks
    n = len(blocks)
    pp, v = plan.mesh.pp, plan.virtual_stages
    colors = stage_colors(pp)
    time_pct, mem_pct = block_shares(plan)
    width = min(16.0, max(9.0, 0.32 * n + 3))
    names = [short(b.name) for b in blocks]
    longest = text_width_in(max(names, key=len), 7.5)
    flat = longest < (width - 1.4) / n * 0.95  # names fit side by side
    if n <= MAX_NAMED:  # else they stand vertically under their bars
        bottom_in = 0.8 if flat else 0.55 + longest
    else:
        bottom_in = 0.75
    height = 1.0 + 5.4 + bottom_in
    fig = new_figure(width, height)
    gs = fig.add_gridspec(
        4,
        1,
        height_ratios=[0.3, 2.2, 2.2, 0.35],
        hspace=0.15,
        left=1.15 / width,
        right=1 - 0.25 / width,
        top=1 - 1.0 / height,
        bottom=bottom_in / height,
    )
    band, ax_t, ax_m, strip = (fig.add_subplot(gs[i]) for i in range(4))
    for ax in (band, ax_m, strip):
        ax.sharex(ax_t)
    xs = list(range(n))
    faces = [colors[b.stage % pp] for b in blocks]
    hatches = [HATCH[b.recompute] for b in blocks]
    for ax, vals, name in ((ax_t, time_pct, "time"), (ax_m, mem_pct, "memory")):
        bars = ax.bar(xs, vals, width=0.8, color=faces, edgecolor="#333333", linewidth=0.3)
        for bar, h in zip(bars, hatches):
            bar.set_hatch(h)
            bar.set_gid(f"{name}-bar")
        ax.set_xlim(-0.6, n - 0.4)
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(axis="x", labelbottom=False, length=0)
        ax.yaxis.set_major_locator(MaxNLocator(nbins=5, prune="upper"))
    ax_t.set_ylabel("share of compute\ntime per micro-batch (%)")
    ax_m.set_ylabel("share of device\nmemory (%)")
    offl = [i for i, b in enumerate(blocks) if b.offload != Offload.NONE]
    if offl:
        top = max(mem_pct)
        ax_m.scatter(
            offl,
            [mem_pct[i] + 0.04 * top for i in offl],
            marker="v",
            color="black",
            s=18,
            zorder=3,
            gid="offload-marks",
        )
        ax_m.set_ylim(0, top * 1.15)
    inch_per_block = ax_t.get_position().width * width / n
    _stage_band(band, blocks, colors, pp, v, inch_per_block)
    _variant_strip(strip, blocks, names, flat, inch_per_block, width)
    handles = _legend(blocks, colors, pp, v, offl)
    fig.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, 1 - 0.42 / height),
        ncol=min(len(handles), 8),
    )
    fig.suptitle(
        f"Blocks: {n} blocks on {pp * v} stage{'s' * (pp * v > 1)}"
        + (f" ({pp} ranks × {v} chunks)" if v > 1 else "")
        + "  ·  stage colours as in the placement",
        y=1 - 0.08 / height,
        va="top",
        fontsize=12,
        fontweight="bold",
    )
    return fig


def _stage_band(band, blocks, colors, pp: int, v: int, inch_per_block: float) -> None:
    """The band above the bars: each stage's run of blocks in its colour, named where the
    name fits."""
    stage_label = [b.stage for b in blocks]
    for first, last, s in runs(stage_label):
        # an artist, not a patch: the limits are set (x shared with the bars), and add_patch's
        # update of the data limits was a fifth of building Llama-3-405B's figure
        band.add_artist(Rectangle((first - 0.5, 0), last - first + 1, 1, color=colors[s % pp]))
        room = (last - first + 1) * inch_per_block
        for text in (f"stage {s}" if v == 1 else f"stage {s} (rank {s % pp})", str(s)):
            if text_width_in(text, 8) < room:
                band.text(
                    (first + last) / 2,
                    0.5,
                    text,
                    ha="center",
                    va="center",
                    fontsize=8,
                    color=text_color(colors[s % pp]),
                )
                break
    band.set_ylim(0, 1)
    band.axis("off")


def _variant_strip(strip, blocks, names, flat: bool, inch_per_block: float, width: float) -> None:
    """The strip below the bars: each run of one TP variant, and the blocks' names (every
    name where they fit, else one label per run of a block class, end labels leaning in)."""
    n = len(blocks)
    xs = list(range(n))
    variants = [b.tp_variant for b in blocks]
    variant_names = sorted(set(variants))
    for first, last, var in runs(variants):
        face = VARIANT_COLORS(variant_names.index(var) % 8)
        strip.add_patch(
            Rectangle(
                (first - 0.5, 0), last - first + 1, 1, facecolor=face, edgecolor="white", lw=0.8
            )
        )
        if text_width_in(var, 7.5) < (last - first + 1) * inch_per_block:
            strip.text((first + last) / 2, 0.5, var, ha="center", va="center", fontsize=7.5)
    strip.set_ylim(0, 1)
    strip.set_yticks([0.5])
    strip.set_yticklabels(["TP variant"])
    strip.tick_params(length=0)
    for side in ("left", "bottom"):
        strip.spines[side].set_visible(False)
    if n <= MAX_NAMED:
        strip.set_xticks(xs)
        strip.set_xticklabels(names, rotation=0 if flat else 90, va="top", fontsize=7.5)
    else:
        class_runs = runs([b.block_class for b in blocks])
        ticks = [(first + last) / 2 for first, last, _ in class_runs]
        labels = [
            f"{blocks[first].name} … {blocks[last].name}" if last > first else blocks[first].name
            for first, last, _ in class_runs
        ]
        keep = keep_apart([(t + 0.5) * inch_per_block for t in ticks], labels, 7.5)
        strip.set_xticks([ticks[i] for i in keep])
        drawn = strip.set_xticklabels([labels[i] for i in keep], fontsize=7.5)
        left_room = strip.get_position().x0 * width
        right_room = (1 - strip.get_position().x1) * width
        axes_w = strip.get_position().width * width
        for i, label in zip(keep, drawn):  # end labels lean inwards instead of leaving the page
            center, half = (ticks[i] + 0.5) * inch_per_block, text_width_in(labels[i], 7.5) / 2
            if center - half < -left_room:
                label.set_ha("left")
            elif center + half > axes_w + right_room:
                label.set_ha("right")
    strip.tick_params(axis="x", labelbottom=True, length=0)
    strip.set_xlabel(f"{n} blocks, input to output")


def _legend(blocks, colors, pp: int, v: int, offl: list[int]) -> list:
    """The figure's legend: stages (or pp ranks), recompute hatches, offload marks."""
    who = "stage" if v == 1 else "pp rank"
    handles = [Patch(color=colors[i], label=f"{who} {i}") for i in range(min(pp, 8))]
    if pp > 8:
        handles.append(Patch(color="white", label=f"… {pp} ranks"))
    for mode in (Recompute.SELECTIVE, Recompute.FULL):
        if any(b.recompute == mode for b in blocks):
            handles.append(
                Patch(
                    facecolor="white",
                    edgecolor="#333333",
                    hatch=HATCH[mode],
                    label=f"recompute {mode}",
                )
            )
    if offl:
        kinds = sorted({blocks[i].offload for i in offl})
        handles.append(
            Line2D([], [], marker="v", color="black", ls="", label="offload " + ", ".join(kinds))
        )
    return handles
