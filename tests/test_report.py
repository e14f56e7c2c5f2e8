"""The report: figures and report.html follow the plan, stay legible at 8 and 1024 GPUs, and the
page renders in a real browser; the schedule simulation agrees with the pipeline formulas."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_hex
from matplotlib.text import Text

from planner.api import plan as make_plan
from planner.errors import UserInputError
from planner.report import REPORT_NAMES, report_files, write_report
from planner.report.blocks import HATCH, block_shares
from planner.report.candidates import candidates_figure, pareto_front
from planner.report.figures import FIGURES
from planner.report.html import ACCENT
from planner.report.memory import PARTS, memory_figure
from planner.report.placement import placement_figure
from planner.report.schedule import (
    compress,
    makespan,
    peak_inflight,
    simulate,
    steady_cuts,
)
from planner.report.show import main as show_main
from planner.report.style import GIB, coords, stage_colors
from planner.report.timeline import step_boxes, timeline_boxes
from planner.schema import ClusterInfo, Mesh, dumps
from planner.search import Pins

ROOT = Path(__file__).resolve().parent.parent

# name: (model file, GPUs, model args, global batch, pins). GPT and MLP share one trace between
# their two cluster sizes, and the pins at 1024 keep solving fast (docs/figures shows GPT-3 175B).
CASES = {
    "gpt-8": ("gpt.py", 8, {"size": "1.3b"}, 64, {}),
    "gpt-1024": (
        "gpt.py",
        1024,
        {"size": "1.3b"},
        1024,
        dict(tp=2, pp=4, micro_batch_size=1, schedule="interleaved_1f1b", virtual_stages=2),
    ),
    "llama-8": ("llama.py", 8, {"size": "tiny"}, None, {}),
    "llama-1024": ("llama.py", 1024, {"size": "llama3-8b"}, 1024, dict(tp=2)),
    "mlp-8": ("mlp.py", 8, {"size": "small"}, None, {}),
    "mlp-1024": ("mlp.py", 1024, {"size": "small"}, 4096, dict(micro_batch_size=4, tp=1)),
}


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """name -> (name, plan, report directory, written): each example planned once per module and
    its report written, shared by the tests that run on every case and those that need one.
    The plans trace into the run's cache (tests/conftest.py), where other files may have traced
    the same models already."""
    made: dict[str, tuple] = {}

    def get(name: str) -> tuple:
        if name not in made:
            model, gpus, args, gbs, pins = CASES[name]
            doc = make_plan(
                ROOT / "examples" / model,
                gpus,
                model_args=args,
                profile="h100-sxm",
                global_batch_size=gbs,
                pins=Pins(**pins),
            ).plan
            out = tmp_path_factory.mktemp(name)
            (out / "plan.json").write_text(dumps(doc))
            command = f"plan examples/{model} --gpus {gpus} <&> 'quoted'"
            svg = name.endswith("-8")  # SVG only when asked: half the cases ask
            made[name] = (name, doc, out, write_report(doc, out, command, svg=svg))
        return made[name]

    return get


@pytest.fixture(scope="module", params=list(CASES))
def case(request, planned):
    return planned(request.param)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# --------------------------------------------------------------------------- files and page


def test_report_writes_every_figure_and_the_page(case):
    name, doc, out, written = case
    svg = name.endswith("-8")
    assert written == report_files(out, svg)
    for path in written:
        assert path.stat().st_size > 1000, path
        assert path.stat().st_mode & 0o044, f"{path} is not readable by others"
    for fig in REPORT_NAMES:
        assert (out / f"{fig}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        if svg:
            root = ET.parse(out / f"{fig}.svg").getroot()
            assert root.tag.endswith("svg")
        else:
            assert not (out / f"{fig}.svg").exists()
    page = (out / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == len(REPORT_NAMES)
    # the page links the SVG files exactly when they were written
    assert page.count('.svg">SVG</a>') == (len(REPORT_NAMES) if svg else 0)
    # self-contained: no scripts, no stylesheets or images fetched from anywhere
    assert "<script" not in page and "<link" not in page
    assert 'src="http' not in page and "url(" not in page
    # the command, escaped
    assert "--gpus" in page and "&lt;&amp;&gt; &#x27;quoted&#x27;" in page
    assert "<&>" not in page
    # the tables follow the plan
    for st in doc.stages:
        assert f"<td>{st.blocks[0]}" in page
    for b in doc.blocks:
        assert f"<td>{b.name}</td>" in page
    for alt in doc.solver.alternatives:
        assert alt.why_not.replace("'", "&#x27;") in page
    assert doc.model.sha256 in page


def test_report_never_touches_other_files(tmp_path, planned):
    name, doc, _, _ = planned("mlp-8")
    mine = tmp_path / "notes.txt"
    mine.write_text("keep me")
    written = write_report(doc, tmp_path, "plan x")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [p.name for p in written] + ["notes.txt"]
    )
    assert mine.read_text() == "keep me"


# --------------------------------------------------------------------------- figure contents


def _gpu_patches(fig):
    return [p for p in fig.findobj() if getattr(p, "get_gid", lambda: None)() == "gpu"]


def test_placement_has_one_colour_per_stage_and_covers_every_gpu(case):
    _, doc, _, _ = case
    mesh, cl = doc.mesh, doc.cluster
    fig = placement_figure(doc)
    cells = _gpu_patches(fig)
    faces = {to_hex(p.get_facecolor()) for p in cells}
    assert len(faces) == mesh.pp
    assert faces == set(stage_colors(mesh.pp))
    texts = {t.get_text() for t in fig.findobj(Text)}
    if cl.nodes <= 16:  # every GPU drawn with its rank and coordinate
        assert len(cells) == cl.gpus
        for rank in range(cl.gpus):
            assert f"r{rank}" in texts
            assert "({},{},{})".format(*coords(rank, mesh)) in texts
    else:  # node grid: every GPU's slice is there, node 0 in detail
        grid = [p for p in cells if p.axes is fig.axes[0]]
        assert sum(p.get_width() for p in grid) == pytest.approx(0.9 * cl.nodes, rel=0.02)
        assert all(f"r{r}" in texts for r in range(cl.gpus_per_node))
    tp_groups = [p for p in fig.findobj() if getattr(p, "get_gid", lambda: None)() == "tp-group"]
    if mesh.tp > 1:
        shown = cl.gpus if cl.nodes <= 16 else cl.gpus_per_node
        assert len(tp_groups) == shown // mesh.tp
    else:
        assert not tp_groups


def test_placement_of_16384_gpus_draws_groups_of_nodes_with_every_gpu_in_its_stage(planned):
    """Llama-3-405B's 16,384 GPUs (pp 8 x dp 256 x tp 8, 2,048 nodes): 256 cells of 8 nodes,
    each split into its 64 GPUs' stages; every stage's slices add up to its 2,048 GPUs."""
    _, small, _, _ = planned("llama-8")
    mesh, gpn = Mesh(pp=8, dp=256, tp=8), 8
    doc = dataclasses.replace(small, mesh=mesh, cluster=ClusterInfo("h100-sxm", 2048, gpn, 16384))
    fig = placement_figure(doc)
    grid = [p for p in _gpu_patches(fig) if p.axes is fig.axes[0]]
    assert len(grid) == 256  # a stage holds 256 whole nodes: one slice per cell
    colors = stage_colors(mesh.pp)
    for stage in range(mesh.pp):
        ours = [p for p in grid if to_hex(p.get_facecolor()) == colors[stage]]
        assert sum(p.get_width() for p in ours) == pytest.approx(0.9 * 2048 / (8 * gpn))
    labels = {t.get_text() for t in fig.axes[0].texts}
    assert labels == {str(n) for n in range(0, 2048, 8)}
    plt.close(fig)


def test_memory_bars_are_the_plans_numbers(case):
    _, doc, _, _ = case
    per_rank = doc.predicted.memory_per_stage
    fig = memory_figure(doc)
    ax = fig.axes[0]
    stacked = [0.0] * len(per_rank)
    for part in PARTS:
        bars = [p for p in ax.patches if p.get_gid() == f"memory-{part}"]
        assert len(bars) == len(per_rank)
        for i, bar in enumerate(bars):
            want = getattr(per_rank[i], part)
            assert bar.get_height() * GIB == pytest.approx(want, rel=1e-9, abs=1)
            assert bar.get_y() == pytest.approx(stacked[i])
            stacked[i] += bar.get_height()
    for i, mem in enumerate(per_rank):
        assert stacked[i] * GIB == pytest.approx(mem.total, rel=1e-9)
    (cap,) = [ln for ln in ax.lines if ln.get_gid() == "capacity"]
    assert cap.get_ydata()[0] * GIB == pytest.approx(doc.predicted.capacity_bytes)


def test_blocks_figure_follows_the_plan(case):
    _, doc, _, _ = case
    blocks, pp = doc.blocks, doc.mesh.pp
    fig = FIGURES["blocks"](doc)
    colors = stage_colors(pp)
    time_pct, mem_pct = block_shares(doc)
    assert sum(time_pct) == pytest.approx(100) and sum(mem_pct) == pytest.approx(100)
    for gid, pct in (("time-bar", time_pct), ("memory-bar", mem_pct)):
        bars = [p for p in fig.findobj() if getattr(p, "get_gid", lambda: None)() == gid]
        assert len(bars) == len(blocks)
        for bar, b, share in zip(bars, blocks, pct):
            assert to_hex(bar.get_facecolor()) == colors[b.stage % pp]
            assert (bar.get_hatch() or "") == HATCH[b.recompute]
            assert bar.get_height() == pytest.approx(share)
    marks = [c for c in fig.findobj() if getattr(c, "get_gid", lambda: None)() == "offload-marks"]
    offloaded = sum(b.offload != "none" for b in blocks)
    assert (len(marks[0].get_offsets()) if marks else 0) == offloaded


def test_candidates_figure_shows_every_candidate_and_the_choice(case):
    _, doc, _, _ = case
    cands = doc.solver.candidates
    fig = candidates_figure(doc)
    ax = fig.axes[0]
    by_gid = {c.get_gid(): c for c in ax.collections}
    n_feasible = sum(c.feasible for c in cands)
    assert len(by_gid["feasible"].get_offsets()) == n_feasible
    if n_feasible < len(cands):
        assert len(by_gid["infeasible"].get_offsets()) == len(cands) - n_feasible
    (chosen,) = [c for c in cands if c.chosen]
    x, y = by_gid["chosen"].get_offsets()[0]
    assert x * GIB == pytest.approx(chosen.peak_memory_bytes)
    assert y > 0


def test_timeline_draws_every_micro_batch_of_the_schedule(case):
    _, doc, _, _ = case
    pp, v, m = doc.mesh.pp, doc.virtual_stages, doc.num_microbatches
    boxes = step_boxes(doc)
    assert sum(b.kind == "F" for b in boxes) == sum(b.kind == "B" for b in boxes) == m * pp * v
    for b in boxes:
        st = doc.stages[b.stage]
        want = st.forward_s if b.kind == "F" else st.backward_s
        assert b.end - b.start == pytest.approx(want)
    # the simulated pipeline is the cost model's, within the formula's approximation
    assert makespan(boxes) == pytest.approx(doc.predicted.pipeline_s, rel=0.1)
    # the tail after the pipeline carries the cost model's per-step terms
    tails = [b for b in timeline_boxes(doc) if b.kind in ("dp", "optimizer", "offload")]
    for kind, key in (
        ("dp", "dp_exposed_s"),
        ("optimizer", "optimizer_s"),
        ("offload", "offload_s"),
    ):
        drawn = sum(b.end - b.start for b in tails if b.kind == kind)
        assert drawn == pytest.approx(sum(getattr(st, key) for st in doc.stages))
    fig = FIGURES["timeline"](doc)
    ax = fig.axes[0]
    gids = {c.get_gid() for c in ax.collections}
    assert {"forward", "backward", "idle"} <= gids


# --------------------------------------------------------------------------- legibility


def _drawn_texts(fig):
    """Every text the renderer draws: tick labels only for ticks inside the view."""
    tick_labels, shown = set(), []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            eps = (hi - lo) * 1e-6
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                for label in (tick.label1, tick.label2):
                    tick_labels.add(id(label))
                    if lo - eps <= tick.get_loc() <= hi + eps and label.get_visible():
                        shown.append(label)
    shown += [t for t in fig.findobj(Text) if id(t) not in tick_labels and t.get_visible()]
    return [t for t in shown if t.get_text().strip()]


def test_no_label_overlaps_another_or_leaves_the_figure(case):
    name, doc, _, _ = case
    for fig_name, build in FIGURES.items():
        fig = build(doc)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        boxes = [
            (t.get_text(), t.get_window_extent(renderer).shrunk(0.97, 0.85))
            for t in _drawn_texts(fig)
        ]
        width, height = fig.canvas.get_width_height()
        for i, (text, box) in enumerate(boxes):
            assert box.x0 >= -1 and box.y0 >= -1, f"{name} {fig_name}: {text!r} leaves the page"
            assert box.x1 <= width + 1 and box.y1 <= height + 1, f"{name} {fig_name}: {text!r}"
            for other, obox in boxes[i + 1 :]:
                assert not box.overlaps(obox), f"{name} {fig_name}: {text!r} overlaps {other!r}"
        plt.close(fig)


# --------------------------------------------------------------------------- the browser


@pytest.mark.distributed
def test_page_renders_every_figure_in_headless_chromium(planned, tmp_path):
    name, _, out, _ = planned("gpt-1024")  # one page is enough for the browser: the largest
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "headless Chromium is needed for this test: apt-get install -y chromium"
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        [
            browser,
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
            f"--screenshot={shot}",
            "--window-size=1400,6000",
            (out / "report.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.exists(), proc.stderr[-2000:]
    console = [ln for ln in proc.stderr.splitlines() if "CONSOLE" in ln or "Failed to load" in ln]
    assert not console, console
    img = mpimg.imread(shot)[..., :3]
    accent = tuple(int(ACCENT[i : i + 2], 16) / 255 for i in (1, 3, 5))
    is_accent = (abs(img - accent) < 3 / 255).all(axis=2)
    column = int(is_accent.sum(axis=0).argmax())  # the figures' left bar
    rows = is_accent[:, column]
    bands, start = [], None
    for y, on in enumerate(list(rows) + [False]):
        if on and start is None:
            start = y
        elif not on and start is not None:
            bands.append((start, y))
            start = None
    assert len(bands) == len(REPORT_NAMES), bands
    for top, bottom in bands:
        assert bottom - top > 300, "a figure is missing or collapsed"
        # a figure draws lines, text and colour; a broken image only its alt text and caption
        area = img[top:bottom, column + 12 :]
        inked = (area.min(axis=2) < 0.9).mean()
        coloured = (area.max(axis=2) - area.min(axis=2) > 0.25).mean()
        assert inked > 0.015 and coloured > 0.001, f"figure at y={top}..{bottom} looks blank"


# --------------------------------------------------------------------------- plan show


@pytest.mark.parametrize("which", ["gpt-8", "gpt-1024"])
def test_show_rewrites_the_report_without_tracing(which, planned, tmp_path, capsys, monkeypatch):
    name, doc, out, _ = planned(which)
    import planner.api

    def no_trace(*a, **k):
        raise AssertionError("plan show must not trace")

    monkeypatch.setattr(planner.api, "trace", no_trace)
    target = tmp_path / "again"
    monkeypatch.setenv("COLUMNS", "220")  # a wide terminal: no cell wraps
    assert show_main([str(out / "plan.json"), "--out", str(target)]) == 0
    printed = capsys.readouterr().out
    assert "predicted step" in printed and "report.html" in printed
    # every alternative the terminal lists is named by its layout (the column was once empty)
    listed = [a for a in doc.solver.alternatives if a.why_not != "chosen"][:6]
    assert all(a.label in printed for a in listed)
    assert sorted(p.name for p in target.iterdir()) == sorted(p.name for p in report_files(target))
    assert "plan show" in (target / "report.html").read_text()
    assert show_main([str(out / "plan.json"), "--out", str(target), "--quiet"]) == 0
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "does not exist"),
        ("{not json", "not valid JSON"),
        (json.dumps({"schema": "meshplan.plan/0"}), "schema"),
        ("[1, 2]", "not a JSON object"),
    ],
)
def test_show_rejects_bad_plan_files_in_one_line(tmp_path, content, message):
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UserInputError, match=message) as err:
        show_main([str(path)])
    assert "\n" not in str(err.value)


def test_show_rejects_a_plan_missing_report_fields(planned, tmp_path):
    name, doc, _, _ = planned("gpt-8")
    broken = doc.to_dict()
    del broken["stages"][0]["p2p_s"]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(broken))
    with pytest.raises(UserInputError, match="p2p_s"):
        show_main([str(path)])
    assert not (tmp_path / "report.html").exists()


# --------------------------------------------------------------------------- the schedule


@pytest.mark.parametrize("pp, m", [(1, 4), (2, 6), (4, 8), (4, 4), (8, 16), (4, 3)])
def test_gpipe_and_1f1b_take_m_plus_pp_minus_1_slots(pp, m):
    f, b = 1.0, 2.0
    gpipe = simulate("gpipe", [f] * pp, [b] * pp, pp, m)
    onef = simulate("1f1b", [f] * pp, [b] * pp, pp, m)
    assert makespan(gpipe) == pytest.approx((m + pp - 1) * (f + b))
    assert makespan(onef) == pytest.approx((m + pp - 1) * (f + b))
    # GPipe holds every micro-batch's activations; 1F1B at most pp - rank of them
    assert [peak_inflight(gpipe, r) for r in range(pp)] == [m] * pp
    assert [peak_inflight(onef, r) for r in range(pp)] == [min(m, pp - r) for r in range(pp)]


@pytest.mark.parametrize("pp, m, v", [(2, 4, 2), (4, 8, 2), (4, 8, 4), (8, 16, 2)])
def test_interleaved_matches_the_cost_models_formula(pp, m, v):
    from planner.cost.pipeline import inflight_microbatches

    t_f, t_b = 1.0 / v, 2.0 / v  # a rank's v chunks together take as long as one 1F1B stage
    boxes = simulate("interleaved_1f1b", [t_f] * (pp * v), [t_b] * (pp * v), pp, m, v)
    chunk = t_f + t_b
    assert makespan(boxes) == pytest.approx(m * v * chunk + (pp - 1) * chunk)
    assert makespan(boxes) < (m + pp - 1) * 3.0  # a smaller bubble than 1F1B
    for r in range(pp):
        assert peak_inflight(boxes, r) == inflight_microbatches("interleaved_1f1b", m, pp, v, r)


@pytest.mark.parametrize("schedule, v", [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)])
def test_every_box_waits_for_its_input_and_ranks_do_one_thing_at_a_time(schedule, v):
    pp, m = 4, 8
    fwd = [0.5 + 0.1 * s for s in range(pp * v)]  # unequal stages
    bwd = [2 * t for t in fwd]
    boxes = simulate(schedule, fwd, bwd, pp, m, v)
    end = {(b.kind, b.microbatch, b.stage): b.end for b in boxes}
    n = pp * v
    for b in boxes:
        if b.kind == "F" and b.stage > 0:
            assert b.start >= end[("F", b.microbatch, b.stage - 1)] - 1e-12
        if b.kind == "B":
            dep = (
                ("B", b.microbatch, b.stage + 1)
                if b.stage < n - 1
                else ("F", b.microbatch, b.stage)
            )
            assert b.start >= end[dep] - 1e-12
    for r in range(pp):
        own = sorted((b.start, b.end) for b in boxes if b.rank == r)
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(own, own[1:]))
    # with a slowest stage, the formula sum(T) + (m - 1) max(T) bounds the simulated schedule
    if v == 1:
        T = [f + b for f, b in zip(fwd, bwd)]
        assert makespan(boxes) <= sum(T) + (m - 1) * max(T) + 1e-9


@pytest.mark.parametrize("schedule, v", [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)])
def test_cut_steady_state_is_busy_everywhere_and_compresses_exactly(schedule, v):
    pp, m = 4, 40
    boxes = simulate(schedule, [1.0] * (pp * v), [2.0] * (pp * v), pp, m, v)
    cuts = steady_cuts(boxes, schedule, pp, m, v)
    assert cuts and all(skipped == m - 2 * (2 * pp if v > 1 else pp) for *_, skipped in cuts)
    for a, b, _ in cuts:  # every rank works through the whole cut: it is steady state
        for r in range(pp):
            busy = sum(max(0.0, min(x.end, b) - max(x.start, a)) for x in boxes if x.rank == r)
            assert busy == pytest.approx(b - a)
    gap = 1.0
    drawn, to_drawn = compress(boxes, cuts, gap)
    removed = sum(b - a for a, b, _ in cuts)
    assert sum(x.end - x.start for x in drawn) == pytest.approx(
        sum(x.end - x.start for x in boxes) - pp * removed
    )
    assert to_drawn(makespan(boxes)) == pytest.approx(makespan(boxes) - removed + gap * len(cuts))
    assert (
        steady_cuts(
            simulate(schedule, [1.0] * (pp * v), [2.0] * (pp * v), pp, 8, v), schedule, pp, 8, v
        )
        == []
    )


def test_pareto_front_keeps_exactly_the_undominated_points():
    pts = [(1, 9), (2, 5), (3, 6), (4, 2), (5, 2), (6, 1), (2, 7)]
    front = pareto_front(pts)
    assert [pts[i] for i in front] == [(1, 9), (2, 5), (4, 2), (6, 1)]
    for i, p in enumerate(pts):
        dominated = any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in pts)
        assert (i in front) == (not dominated)


# --------------------------------------------------------------------------- docs


def test_doc_figures_are_committed_for_the_readme_examples():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from doc_figures import DOC_EXAMPLES

    for stem, *_ in DOC_EXAMPLES:
        for name in REPORT_NAMES:
            path = ROOT / "docs" / "figures" / f"{stem}-{name}.png"
            assert path.exists(), f"{path} missing: python benchmarks/doc_figures.py"
            assert mpimg.imread(path).shape[0] > 200
