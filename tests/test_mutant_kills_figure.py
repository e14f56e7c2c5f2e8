"""Tests written for mutmut's generated mutants of planner/resources/figure.py (benchmarks/
generated_mutants.py): the number and duration formats at each threshold, the table's rows and
marks for options priced by hand, the printed table, and the three-panel figure read back from
matplotlib's own objects (points, labels, scales, the front's line, the chosen star).
docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import matplotlib
import pytest
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

from planner.resources import figure as fig_module
from planner.resources.choose import Option, PlanPoint
from planner.resources.energy import RunCost
from planner.resources.figure import (
    HEADER,
    LEGEND,
    draw_front,
    duration,
    print_table,
    si,
    table_rows,
)
from planner.resources.pool import NodeType


def kind(name: str, gpus_per_node: int = 8) -> NodeType:
    return NodeType(name, "h100-sxm", 4, gpus_per_node, 2.0, 500.0, 100.0, 1000.0, 400.0, 1.5)


def option(node, nodes, wall_h, cost, energy, carbon_kg, step=2.5, mesh="pp1 dp8 tp1", name=""):
    run = RunCost(10, wall_h * 3600.0, 1.0, cost, 700.0, energy, carbon_kg)
    return Option(node, nodes, PlanPoint(step, 0.4, 1000, mesh), run, name=name)


@pytest.mark.parametrize(
    "x, text",
    [
        (0, "0"),
        (0.0, "0"),
        (0.4219, "0.42"),
        (37.4, "37"),
        (99.4, "99"),
        (100, "100"),
        (4405.2, "4,405"),
        (9999.4, "9,999"),
        (10000, "10k"),
        (14049, "14k"),
        (14050, "14.1k"),
        (999_000, "999k"),
        (1_000_000, "1M"),
        (1_564_000, "1.56M"),
        (-1_564_000, "-1.56M"),
        (-14050, "-14.1k"),
        (-4405.2, "-4,405"),
        (-0.5, "-0.5"),
        (-0.0, "0"),  # not "-0"
        (2_345_000, "2.35M"),  # 2.345 rounds up; 2_345_000 / 1_000_001 would round down
    ],
)
def test_si_at_each_threshold(x, text):
    assert si(x) == text


@pytest.mark.parametrize(
    "hours, text",
    [
        (1.2345, "1.23 h"),
        (47.99, "48 h"),
        (48, "2 d"),
        (60, "2 d"),
        (1200, "50 d"),
        (26400, "1,100 d"),
    ],
)
def test_duration_is_hours_up_to_two_days_then_days(hours, text):
    assert duration(hours) == text


A, B = kind("a100"), kind("h100", gpus_per_node=4)
FAST = option(A, 2, 10.0, 1500.0, 120.0, 2500.0, step=0.0123, mesh="pp2 dp4 tp2 (a100, h100)")
CHEAP = option(B, 1, 50.0, 900.0, 45000.0, 18_000_000.0, step=3.0, name="cheap one")
SLOW = option(A, 1, 100.0, 2000.0, 7.0, 4.0)
UNFIT = Option(B, 4, None, None, "does not fit")
HALF = Option(B, 2, PlanPoint(1.0, 0.5, 1, "dp1"), None)


def test_table_rows_by_hand():
    rows = table_rows([FAST, CHEAP, SLOW, UNFIT, HALF], FAST, [FAST, CHEAP], 40.0, 1000.0)
    assert rows == [
        ["*+B", "a100 x2", "16", "pp2 dp4 tp2", "12.3 ms", "10 h", "$1,500", "120", "2.5"],
        ["+D", "cheap one", "4", "pp1 dp8 tp1", "3.00 s", "2 d", "$900", "45k", "18k"],
        ["DB", "a100 x1", "8", "pp1 dp8 tp1", "2.50 s", "4 d", "$2,000", "7", "0.004"],
        ["", "h100 x4", "16", "does not fit", "-", "-", "-", "-", "-"],
        ["", "h100 x2", "8", "does not fit", "-", "-", "-", "-", "-"],
    ]


def test_marks_at_the_deadline_and_budget_edges_and_without_them():
    """A run exactly at the deadline or budget meets it; no deadline or budget marks none."""
    edge = table_rows([SLOW], None, [], 100.0, 2000.0)
    assert edge[0][0] == ""
    assert table_rows([SLOW], None, [], None, None)[0][0] == ""
    assert table_rows([SLOW], SLOW, [SLOW], None, None)[0][0] == "*+"
    # the chosen mark is by identity: an equal option that is not the chosen one is unmarked
    twin = option(A, 1, 100.0, 2000.0, 7.0, 4.0)
    assert twin == SLOW
    assert table_rows([twin], SLOW, [], None, None)[0][0] == ""


def test_print_table_fits_the_width_and_prints_title_table_and_legend(capsys, monkeypatch):
    rows = table_rows([FAST, CHEAP], FAST, [FAST], None, None)
    print_table(rows, "options for the run", width=200)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "options for the run"
    assert lines[-1] == LEGEND
    header = lines[1].split()
    assert header == HEADER[1:]
    body = lines[2:-1]
    assert [line.split()[:2] for line in body] == [["*+", "a100"], ["cheap", "one"]]
    # the GPU count and the figures are right-justified: their last characters line up
    gpus = [line.rstrip() for line in lines[1:4]]
    ends = {gpus[0].index("GPUs") + 4, gpus[1].index("16") + 2, gpus[2].index(" 4 ") + 2}
    assert len(ends) == 1
    assert lines[2].rstrip().endswith("2.5") and lines[3].rstrip().endswith("18k")
    # left-justified mesh: both start under the header's "mesh"
    col = lines[1].index("mesh")
    assert lines[2][col:].startswith("pp2 dp4 tp2") and lines[3][col:].startswith("pp1 dp8")
    # a narrow terminal shortens the option and mesh columns from the middle, nothing else
    long = option(A, 2, 10.0, 1500.0, 120.0, 2500.0, mesh="pp2 dp4 tp2 ep2 cp2", name="x" * 30)
    print_table(table_rows([long], None, [], None, None), "t" * 100, width=60)
    narrow = capsys.readouterr().out.splitlines()
    assert narrow[0] == "t" * 30 + "…" + "t" * 29
    assert narrow[-1] == LEGEND[:30] + "…" + LEGEND[-29:]
    assert max(len(line) for line in narrow) <= 60
    assert (
        "xxxx…xxxx" in narrow[2]
        and "$1,500" in narrow[2]
        and "pp2 dp4 tp2 ep2 cp2" not in narrow[2]
    )
    # no width given: the terminal's ($COLUMNS)
    monkeypatch.setenv("COLUMNS", "50")
    print_table(table_rows([long], None, [], None, None), "u" * 100)
    assert capsys.readouterr().out.splitlines()[0] == "u" * 25 + "…" + "u" * 24


@pytest.fixture
def drawn(monkeypatch, tmp_path):
    """draw_front's figure, kept when it is saved (the savefig arguments too)."""
    kept = {}
    real = Figure.savefig

    def savefig(self, path, **kw):
        kept["fig"], kept["path"], kept["kw"] = self, path, kw
        return real(self, path, **kw)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return kept


def offsets(collection) -> list[tuple[float, float]]:
    return [tuple(map(float, p)) for p in collection.get_offsets()]


def test_the_figure_read_back(drawn, tmp_path):
    """Panels (time, cost), (time, carbon), (cost, carbon): each kind's points in its own
    colour, each annotated with its node count, the front joined in order of x, the chosen
    option a gold star on top; time on a log axis."""
    out = tmp_path / "deep" / "er" / "front.png"  # folders made
    assert draw_front([FAST, CHEAP, SLOW, UNFIT], SLOW, [CHEAP, FAST], out) == out
    assert out.stat().st_size > 0
    fig = drawn["fig"]
    assert drawn["path"] == out and drawn["kw"] == {"dpi": 110}
    assert tuple(fig.get_size_inches()) == (15, 4.5)
    axes = fig.get_axes()
    assert len(axes) == 3
    value = {  # (time h, cost $, tCO2) by hand
        "fast": (10.0, 1500.0, 2.5),
        "cheap": (50.0, 900.0, 18000.0),
        "slow": (100.0, 2000.0, 0.004),
    }
    pairs = ((0, 1), (0, 2), (1, 2))
    names = ("time to train (h)", "cost ($)", "carbon (tCO2)")
    for ax, (x, y) in zip(axes, pairs, strict=True):
        assert ax.get_xlabel() == names[x] and ax.get_ylabel() == names[y]
        assert ax.get_xscale() == ("log" if x == 0 else "linear")
        a100, h100, star = ax.collections
        assert a100.get_label() == "a100" and h100.get_label() == "h100"
        assert offsets(a100) == [(value[k][x], value[k][y]) for k in ("fast", "slow")]
        assert offsets(h100) == [(value["cheap"][x], value["cheap"][y])]
        assert list(a100.get_sizes()) == [36] and list(h100.get_sizes()) == [36]
        assert tuple(a100.get_facecolor()[0]) == to_rgba("C0")
        assert tuple(h100.get_facecolor()[0]) == to_rgba("C1")
        assert offsets(star) == [(value["slow"][x], value["slow"][y])]
        assert star.get_label() == "chosen: a100 x1"
        assert list(star.get_sizes()) == [260] and star.get_zorder() == 5
        assert tuple(star.get_facecolor()[0]) == to_rgba("gold")
        assert tuple(star.get_edgecolor()[0]) == to_rgba("k")
        marker = matplotlib.markers.MarkerStyle("*")
        star_path = marker.get_path().transformed(marker.get_transform())
        assert (star.get_paths()[0].vertices == star_path.vertices).all()
        notes = [(t.get_text(), tuple(map(float, t.xy))) for t in ax.texts]
        assert notes == [
            ("x2", (value["fast"][x], value["fast"][y])),
            ("x1", (value["slow"][x], value["slow"][y])),
            ("x1", (value["cheap"][x], value["cheap"][y])),
        ]
        for t in ax.texts:
            assert t.get_fontsize() == 7 and t.xyann == (3, 3)
            assert t.anncoords == "offset points"
        (line,) = ax.lines
        front = sorted(("fast", "cheap"), key=lambda k: value[k][x])
        assert list(map(float, line.get_xdata())) == [value[k][x] for k in front]
        assert list(map(float, line.get_ydata())) == [value[k][y] for k in front]
        assert line.get_linestyle() == "--" and line.get_color() == "k"
        assert line.get_linewidth() == 0.8 and line.get_label() == "Pareto (time, $, CO2)"
        assert ax.xaxis.get_gridlines()[0].get_visible()
        assert ax.xaxis.get_gridlines()[0].get_alpha() == 0.3
    legend = axes[0].get_legend()
    assert legend is not None and axes[1].get_legend() is None
    assert [t.get_text() for t in legend.get_texts()] == [
        "a100",
        "h100",
        "Pareto (time, $, CO2)",
        "chosen: a100 x1",
    ]
    assert legend.get_texts()[0].get_fontsize() == 8
    # tight_layout: the first panel's left edge is pulled in from the default 0.125
    assert axes[0].get_position().x0 < 0.1
    # three panels side by side: one row, left to right
    boxes = [ax.get_position() for ax in axes]
    assert boxes[0].x1 < boxes[1].x0 and boxes[1].x1 < boxes[2].x0
    assert boxes[0].y0 == boxes[1].y0 == boxes[2].y0


def test_no_star_without_a_chosen_priced_option_and_linear_time_at_zero(drawn, tmp_path):
    zero = option(A, 1, 0.0, 0.0, 0.0, 0.0)
    for chosen in (None, UNFIT):
        draw_front([FAST, zero], chosen, [FAST], tmp_path / "f.png")
        for ax in drawn["fig"].get_axes():
            assert len(ax.collections) == 1  # one kind, no star
            assert ax.get_xscale() == "linear"  # a zero time cannot go on a log axis
    draw_front([FAST], FAST, [FAST], tmp_path / "g.png")
    assert [len(ax.collections) for ax in drawn["fig"].get_axes()] == [2, 2, 2]
    assert fig_module.draw_front is draw_front


def test_the_figure_columns_are_right_justified_and_the_names_left(capsys):
    """Cells one character wide under wider ones: a right-justified column ends each cell
    where its header ends, a left-justified one starts it where its header starts."""
    rows = [
        ["*", "o", "1", "m", "1", "1", "1", "1", "1"],
        ["", "option-wide", "1234", "mesh-wide", "12345", "12345", "12345", "12345", "12345"],
    ]
    print_table(rows, "t", width=200)
    header, first = capsys.readouterr().out.splitlines()[1:3]
    for i, name in enumerate(HEADER):
        if not name:
            continue
        if i in (1, 3):  # option and mesh: left
            assert first[header.index(name)] == rows[0][i], name
        else:
            end = header.index(name) + len(name) - 1
            assert first[end] == "1" and first[end + 1 : end + 2] in ("", " "), name


def test_carbon_is_in_tonnes():
    """1,000,000 kg is 1,000 t (a kilo-tonne less one kilogram would print 999)."""
    heavy = option(A, 1, 1.0, 1.0, 1.0, 1_000_000.0)
    assert table_rows([heavy], None, [], None, None)[0][8] == "1,000"


def test_time_under_an_hour_is_still_on_a_log_axis(drawn, tmp_path):
    quick = option(A, 1, 0.5, 1.0, 1.0, 1.0)
    draw_front([quick, FAST], None, [quick], tmp_path / "q.png")
    assert drawn["fig"].get_axes()[0].get_xscale() == "log"
