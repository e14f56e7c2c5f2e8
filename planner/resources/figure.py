"""The resource choice for people: a table in the terminal and the time/cost/carbon figure.

The figure has three panels (time vs cost, time vs carbon, cost vs carbon) because a Pareto front
over three quantities does not fit one pair of axes; the front is drawn in every panel so a point
that looks dominated in one pair can be seen winning on the third.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from planner.resources.choose import Option


def table_rows(
    options: Sequence[Option],
    chosen: Option | None,
    front: Sequence[Option],
    deadline_h: float | None,
    budget_usd: float | None,
) -> list[list[str]]:
    """One row per option: kind, nodes, GPUs, mesh, step, time, $, kWh, tCO2, marks."""
    rows = []
    for o in options:
        if o.run is None or o.point is None:
            rows.append(
                [
                    o.node.name,
                    str(o.nodes),
                    str(o.gpus),
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    f"does not fit: {o.why_not}",
                ]
            )
            continue
        marks = []
        if o is chosen:
            marks.append("CHOSEN")
        if o in front:
            marks.append("pareto")
        if deadline_h is not None and o.run.wall_h > deadline_h:
            marks.append("misses deadline")
        if budget_usd is not None and o.run.cost_usd > budget_usd:
            marks.append("over budget")
        rows.append(
            [
                o.node.name,
                str(o.nodes),
                str(o.gpus),
                o.point.mesh,
                f"{o.point.step_time_s:.3g}",
                f"{o.run.wall_h:,.1f}",
                f"{o.run.cost_usd:,.0f}",
                f"{o.run.energy_kwh:,.0f}",
                f"{o.run.carbon_kg / 1000:,.2f}",
                " ".join(marks),
            ]
        )
    return rows


HEADER = ["kind", "nodes", "GPUs", "mesh", "step s", "time h", "$", "kWh", "tCO2", ""]


def print_table(rows: list[list[str]], title: str) -> None:
    """Rich when it is installed, else aligned plain text: the same columns either way."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
        print(title)
        for r in [HEADER, *rows]:
            print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
        return
    table = Table(title=title)
    for h in HEADER:
        table.add_column(h, justify="left" if h in ("kind", "mesh", "") else "right")
    for r in rows:
        table.add_row(*r)
    Console(width=160).print(table)


def draw_front(
    options: Sequence[Option], chosen: Option | None, front: Sequence[Option], path: Path
) -> Path:
    """Write the three-panel Pareto figure; the chosen option is a star, the front is joined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
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
    plt.close(fig)
    return path
