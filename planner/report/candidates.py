"""The candidates figure: every solved candidate as (peak memory, step time).

It answers "what did the solver give up": the chosen plan should sit on the Pareto front of the
feasible candidates (nothing both faster and smaller), and infeasible ones show how much faster
a plan would be with more memory.
"""

from __future__ import annotations

from matplotlib.figure import Figure

from planner.report.style import GIB, new_figure, time_unit
from planner.schema import Plan


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats in both coordinates (lower is better), sorted
    by the first coordinate."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front: list[int] = []
    best = float("inf")
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


def candidates_figure(plan: Plan) -> Figure:
    """
    Long because a figure's layout reads best top to bottom, panel by panel.
    """
    cands = plan.solver.candidates
    cap = plan.predicted.capacity_bytes / GIB
    scale, unit = time_unit(max((c.step_time_s for c in cands), default=1.0))
    fig = new_figure(9.0, 5.6)
    ax = fig.subplots()
    fig.subplots_adjust(left=0.1, right=0.97, top=0.86, bottom=0.11)
    feas = [c for c in cands if c.feasible]
    infeas = [c for c in cands if not c.feasible]
    if infeas:
        ax.scatter(
            [c.peak_memory_bytes / GIB for c in infeas],
            [c.step_time_s * scale for c in infeas],
            marker="x",
            color="#b0b0b0",
            s=28,
            label=f"does not fit ({len(infeas)})",
            gid="infeasible",
        )
    if feas:
        ax.scatter(
            [c.peak_memory_bytes / GIB for c in feas],
            [c.step_time_s * scale for c in feas],
            color="#4c72b0",
            s=26,
            alpha=0.8,
            label=f"fits ({len(feas)})",
            gid="feasible",
        )
        pts = [(c.peak_memory_bytes / GIB, c.step_time_s * scale) for c in feas]
        front = [pts[i] for i in pareto_front(pts)]
        ax.step(
            [p[0] for p in front],
            [p[1] for p in front],
            where="post",
            color="#4c72b0",
            lw=1.2,
            ls="-",
            alpha=0.7,
            label="Pareto front of the fitting ones",
            gid="pareto",
        )
    ax.axvline(cap, color="black", ls="--", lw=1, label=f"capacity {cap:,.1f} GiB")
    chosen = [c for c in cands if c.chosen]
    if chosen:
        c = chosen[0]
        x, y = c.peak_memory_bytes / GIB, c.step_time_s * scale
        ax.scatter(
            [x],
            [y],
            marker="*",
            s=260,
            color="#e6550d",
            edgecolor="black",
            zorder=5,
            label="chosen",
            gid="chosen",
        )
        ax.annotate(
            c.label,
            (x, y),
            xytext=(0.5, 0.97),
            textcoords="axes fraction",
            ha="center",
            va="top",
            fontsize=8,
            bbox=dict(boxstyle="round", fc="white", ec="#e6550d"),
            arrowprops=dict(arrowstyle="->", color="#e6550d", lw=1),
        )
    times = [c.step_time_s * scale for c in cands]
    if times and min(times) > 0 and max(times) / min(times) > 30:
        ax.set_yscale("log")
        ax.set_ylim(min(times) / 1.5, max(times) * 4)
    elif times:
        lo, hi = min(times), max(times)
        span = max(hi - lo, 0.02 * hi)
        bottom = 0.0 if lo < 0.3 * hi else max(0.0, lo - 0.4 * span)
        ax.set_ylim(bottom, hi + 0.6 * span)
    ax.set_xlim(0, max([cap] + [c.peak_memory_bytes / GIB for c in cands]) * 1.05)
    ax.set_xlabel("predicted peak memory per device (GiB)")
    ax.set_ylabel(f"predicted step time ({unit})")
    ax.grid(alpha=0.3)
    fig.legend(loc="upper center", bbox_to_anchor=(0.5, 0.935), ncol=5)
    sol = plan.solver
    fig.suptitle(
        f"Candidates: {len(cands)} solved of {sol.candidates_total} "
        f"({sol.candidates_pruned} pruned by bounds)",
        fontsize=12,
        fontweight="bold",
    )
    return fig
