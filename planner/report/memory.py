"""The memory figure: per pipeline rank, what fills a device, against its capacity.

Stacked bars of params, grads, optimizer states, activations and other (reserved, working
memory, buffers), straight from ``predicted.memory_per_stage``, so the bar tops are the numbers
the solver checked against ``capacity_bytes``.
"""

from __future__ import annotations

from matplotlib.figure import Figure

from planner.report.style import GIB, MEMORY_COLORS, keep_apart, new_figure
from planner.schema import Plan

PARTS = ("params", "grads", "optimizer", "activations", "other")


def memory_figure(plan: Plan) -> Figure:
    pred = plan.predicted
    per_rank = pred.memory_per_stage
    cap = pred.capacity_bytes
    pp = len(per_rank)
    width = min(14.0, max(8.0, 0.45 * pp + 4))
    fig = new_figure(width, 5.0)
    ax = fig.subplots()
    fig.subplots_adjust(left=0.09, right=0.8, top=0.86, bottom=0.14)
    xs = list(range(pp))
    bottom = [0.0] * pp
    for part in PARTS:
        vals = [getattr(m, part) / GIB for m in per_rank]
        bars = ax.bar(
            xs,
            vals,
            bottom=bottom,
            width=0.7,
            color=MEMORY_COLORS[part],
            label=part,
            edgecolor="white",
            linewidth=0.4,
        )
        for bar in bars:
            bar.set_gid(f"memory-{part}")
        bottom = [b + val for b, val in zip(bottom, vals)]
    ax.axhline(
        cap / GIB,
        color="black",
        ls="--",
        lw=1.2,
        gid="capacity",
        label=f"capacity {cap / GIB:,.1f} GiB",
    )
    inch_per_bar = ax.get_position().width * width / pp
    if pp <= 16:
        labels = [f"{m.total / GIB:,.1f}" for m in per_rank]
        if all(len(t) * 8 * 0.62 / 72 < inch_per_bar for t in labels):
            for x, total, text in zip(xs, bottom, labels):
                ax.text(
                    x,
                    total,
                    text,
                    ha="center",
                    va="bottom",
                    fontsize=8,
                    zorder=5,
                    bbox=dict(fc="white", ec="none", pad=0.6),
                )
    names = [f"stage {i}" if pp <= 16 else str(i) for i in xs]
    keep = keep_apart([(x + 0.5) * inch_per_bar for x in xs], names, 8.5)
    ax.set_xticks([xs[i] for i in keep])
    ax.set_xticklabels([names[i] for i in keep])
    ax.set_xlim(-0.6, pp - 0.4)
    ax.set_ylim(0, max(max(bottom), cap / GIB) * 1.12)
    ax.set_ylabel("device memory (GiB)")
    v = plan.virtual_stages
    ax.set_xlabel("pipeline rank" + (f" (its {v} chunks summed)" if v > 1 else ""))
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 0.9), title="per device")
    peak = pred.peak_memory_bytes
    headroom = (cap - peak) / GIB
    zero = plan.zero_stage
    fig.suptitle(
        f"Memory per device: peak {peak / GIB:,.1f} of {cap / GIB:,.1f} GiB "
        f"({headroom:,.1f} GiB free)",
        fontsize=12,
        fontweight="bold",
    )
    fig.text(
        0.5,
        0.905,
        f"ZeRO-{zero}, dp {plan.mesh.dp}, {plan.dtype} {plan.optimizer}; activations "
        f"for each rank's in-flight micro-batches ({plan.schedule})",
        ha="center",
        fontsize=8.5,
    )
    return fig
