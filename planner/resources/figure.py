"""The resource choice for people: a table in the terminal and the time/cost/carbon figure.

The figure has three panels (time vs cost, time vs carbon, cost vs carbon) because a Pareto front
over three quantities does not fit one pair of axes; the front is drawn in every panel so a point
that looks dominated in one pair can be seen winning on the third.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from planner.resources.choose import Option


def si(x: float) -> str:
    """A number in at most six characters: 0.42, 37, 4,405, 14.0k, 1.56M."""
    if abs(x) >= 1e6:
        return f"{x / 1e6:.3g}M"
    if abs(x) >= 1e4:
        return f"{x / 1e3:.3g}k"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.2g}" if x else "0"


def duration(hours: float) -> str:
    """Hours up to two days, then days."""
    return f"{hours:.3g} h" if hours < 48 else f"{hours / 24:,.0f} d"


def table_rows(
    options: Sequence[Option],
    chosen: Option | None,
    front: Sequence[Option],
    deadline_h: float | None,
    budget_usd: float | None,
) -> list[list[str]]:
    """One row per option: its marks, label, GPUs, mesh, step, run time, $, kWh, tCO2.

    Marks (one character each, see ``LEGEND``): chosen, on the Pareto front, misses the
    deadline, over the budget; an option that fits no plan says so in its mesh cell."""
    from planner.report.console import human_time

    rows = []
    for o in options:
        if o.run is None or o.point is None:
            rows.append(["", o.label, str(o.gpus), "does not fit", "-", "-", "-", "-", "-"])
            continue
        marks = "*" if o is chosen else ""
        marks += "+" if o in front else ""
        if deadline_h is not None and o.run.wall_h > deadline_h:
            marks += "D"
        if budget_usd is not None and o.run.cost_usd > budget_usd:
            marks += "B"
        rows.append(
            [
                marks,
                o.label,
                str(o.gpus),
                o.point.mesh.split(" (")[0],  # a mixed mesh's kinds by stage: in the label
                human_time(o.point.step_time_s),
                duration(o.run.wall_h),
                "$" + si(o.run.cost_usd),
                si(o.run.energy_kwh),
                si(o.run.carbon_kg / 1000),
            ]
        )
    return rows


HEADER = ["", "option", "GPUs", "mesh", "step", "time", "cost", "kWh", "tCO2"]
LEGEND = "* chosen  + Pareto front (time, cost, carbon)  D past deadline  B over budget"


def print_table(rows: list[list[str]], title: str, width: int | None = None) -> None:
    """The options as a table fitted to the terminal (option and mesh names shortened from
    the middle when it is narrow), with the marks' legend and the options that do not fit."""
    from planner.report.console import console, fitted_table, middle, terminal_width

    width = width or terminal_width()
    out = console()
    table = fitted_table(HEADER, rows, width, shrink=(1, 3), right=(2, 4, 5, 6, 7, 8))
    out.print(middle(title, width))
    out.print(table)
    out.print(middle(LEGEND, width))


def draw_front(
    options: Sequence[Option], chosen: Option | None, front: Sequence[Option], path: Path
) -> Path:
    """Write the three-panel Pareto figure; the chosen option is a star, the front is joined."""
    from matplotlib.figure import Figure  # a figure outside pyplot: Agg, nothing to close

    priced = [o for o in options if o.run is not None]
    kinds = sorted({o.node.name for o in priced})
    colours = {k: f"C{i}" for i, k in enumerate(kinds)}

    def val(o: Option, axis: str) -> float:
        assert o.run is not None
        return {"time": o.run.wall_h, "cost": o.run.cost_usd, "carbon": o.run.carbon_kg / 1000}[
            axis
        ]

    names = {"time": "time to train (h)", "cost": "cost ($)", "carbon": "carbon (tCO2)"}
    pairs = (("time", "cost"), ("time", "carbon"), ("cost", "carbon"))
    fig = Figure(figsize=(15, 4.5))
    axes = fig.subplots(1, 3)
    for ax, (x, y) in zip(axes, pairs, strict=True):
        for k in kinds:
            pts = [o for o in priced if o.node.name == k]
            ax.scatter(
                [val(o, x) for o in pts], [val(o, y) for o in pts], c=colours[k], label=k, s=36
            )
            for o in pts:
                ax.annotate(
                    f"x{o.nodes}",
                    (val(o, x), val(o, y)),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
        f = sorted(front, key=lambda o: val(o, x))
        ax.plot(
            [val(o, x) for o in f],
            [val(o, y) for o in f],
            "k--",
            lw=0.8,
            label="Pareto (time, $, CO2)",
        )
        if chosen is not None and chosen.run is not None:
            ax.scatter(
                [val(chosen, x)],
                [val(chosen, y)],
                marker="*",
                s=260,
                c="gold",
                edgecolors="k",
                zorder=5,
                label=f"chosen: {chosen.label}",
            )
        ax.set_xlabel(names[x])
        ax.set_ylabel(names[y])
        if x == "time" and all(val(o, x) > 0 for o in priced):
            ax.set_xscale("log")  # counts in powers of two spread time by factors of two
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
