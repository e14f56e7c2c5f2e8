"""report.html: one self-contained page for a plan.

Everything is inside the file (figures as base64 PNG, CSS in a <style> element, no scripts, no
network), so it can be mailed, attached to an issue or opened from an air-gapped cluster. Every
string that comes from the plan or the command line goes through ``html.escape``.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from planner.report.console import (
    alternative_name,
    cp_label,
    ep_label,
    human_bytes,
    human_count,
    human_time,
    step_with_range,
)
from planner.report.figures import CAPTIONS
from planner.schema import Plan
from planner.vocab import schedule_label

ACCENT = "#6a1b9a"  # the bar left of each figure; tests find figures on a screenshot by it

CSS = f"""
body {{ font: 14px/1.45 -apple-system, "Segoe UI", "DejaVu Sans", Arial, sans-serif;
       color: #1a1a1a; background: #ffffff; margin: 0; }}
main {{ max-width: 1340px; margin: 0 auto; padding: 16px 24px 48px; }}
h1 {{ font-size: 22px; margin: 8px 0 4px; }}
h2 {{ font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }}
.summary {{ color: #333; margin: 4px 0 12px; }}
.facts {{ display: flex; flex-wrap: wrap; gap: 10px; margin: 8px 0 4px; }}
.fact {{ border: 1px solid #ddd; border-radius: 6px; padding: 6px 12px; min-width: 130px; }}
.fact b {{ display: block; font-size: 18px; }}
.fact span {{ color: #555; font-size: 12px; }}
figure {{ margin: 18px 0; padding: 0 0 0 14px; border-left: 8px solid {ACCENT}; }}
figure img {{ max-width: 100%; height: auto; display: block; }}
figcaption {{ color: #444; font-size: 13px; margin-top: 4px; }}
figcaption a {{ color: #444; }}
table {{ border-collapse: collapse; font-size: 13px; margin: 6px 0; }}
th, td {{ border-bottom: 1px solid #e4e4e4; padding: 3px 10px; text-align: left;
          vertical-align: top; }}
th {{ background: #f4f4f4; }}
td.num {{ text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }}
dl {{ display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; }}
dt {{ color: #555; }} dd {{ margin: 0; }}
pre {{ background: #f6f6f6; padding: 10px; border-radius: 4px; white-space: pre-wrap;
       word-break: break-all; }}
.no {{ color: #999; }}
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], numeric: set[int]) -> str:
    """An HTML table; columns whose index is in ``numeric`` are right-aligned."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="num">{esc(c)}</td>' if i in numeric else f"<td>{esc(c)}</td>"
            for i, c in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def schedule_text(plan: Plan) -> str:
    return schedule_label(plan.schedule, plan.virtual_stages, plan.mesh.pp)


def summary_line(plan: Plan) -> str:
    mesh, cl = plan.mesh, plan.cluster
    return (
        f"pp={mesh.pp} dp={mesh.dp_label}{ep_label(mesh)}{cp_label(mesh)} tp={mesh.tp_label} "
        f"on {cl.gpus} × {cl.profile} "
        f"({cl.nodes} node{'s' * (cl.nodes > 1)})  ·  global batch "
        f"{plan.global_batch_size} = {mesh.dp} × {plan.micro_batch_size} × "
        f"{plan.num_microbatches} micro-batches  ·  {schedule_text(plan)}  ·  "
        f"ZeRO-{plan.zero_stage}  ·  {plan.dtype}  ·  {plan.optimizer}"
    )


def _facts(plan: Plan) -> str:
    pred = plan.predicted
    items = [
        (step_with_range(pred), "predicted step"),
        (f"{pred.samples_per_s:,.1f}", "samples / s"),
        (f"{pred.tokens_per_s:,.0f}", "tokens / s"),
        (f"{pred.mfu:.1%}", "model FLOPs utilization"),
        (
            f"{human_bytes(pred.peak_memory_bytes)}",
            f"peak memory of {human_bytes(pred.capacity_bytes)}",
        ),
    ]
    return (
        '<div class="facts">'
        + "".join(f'<div class="fact"><b>{esc(v)}</b><span>{esc(k)}</span></div>' for v, k in items)
        + "</div>"
    )


def figure(name: str, png: bytes, caption: str, svg: bool = True) -> str:
    """One figure, its PNG inlined, its caption linking the files beside the page (the SVG
    only where one was written)."""
    data = base64.b64encode(png).decode("ascii")
    links = f'<a href="{esc(name)}.png">PNG</a>'
    if svg:
        links = f'<a href="{esc(name)}.svg">SVG</a>, {links}'
    return (
        f'<figure id="fig-{esc(name)}"><img alt="{esc(name)} figure" '
        f'src="data:image/png;base64,{data}"><figcaption>{esc(caption)} ({links})'
        "</figcaption></figure>"
    )


def _figures(images: Mapping[str, bytes], svg: bool) -> str:
    return "\n".join(figure(name, png, CAPTIONS[name], svg) for name, png in images.items())


def _stages(plan: Plan) -> str:
    mem = plan.predicted.memory_per_stage
    rows = []
    for st in plan.stages:
        names, ranks = st.blocks, st.ranks
        shown = names[0] if len(names) == 1 else f"{names[0]} … {names[-1]} ({len(names)})"
        rows.append(
            [
                st.index,
                st.pp_rank,
                shown if names else "—",
                f"{ranks[0]}–{ranks[-1]}" if len(ranks) > 1 else ranks[0],
                human_time(st.forward_s),
                human_time(st.backward_s),
                human_time(st.tp_comm_s),
                human_time(st.p2p_s),
                f"{human_time(st.dp_comm_s)} ({human_time(st.dp_exposed_s)})",
                human_time(st.optimizer_s),
                human_time(st.offload_s),
                st.inflight_microbatches,
                human_bytes(mem[st.pp_rank].total),
            ]
        )
    headers = [
        "stage",
        "pp rank",
        "blocks",
        "ranks",
        "forward / mb",
        "backward / mb",
        "TP comm / mb",
        "p2p / mb",
        "DP comm (exposed) / step",
        "optimizer / step",
        "offload / step",
        "in flight",
        "rank memory",
    ]
    return table(headers, rows, set(range(4, 13)) | {0, 1})


def _blocks(plan: Plan) -> str:
    rows = [
        [
            i,
            b.name,
            b.block_class,
            b.stage,
            human_count(b.params),
            b.tp_variant,
            b.recompute,
            b.offload,
            human_time(b.time_per_microbatch_s),
            human_bytes(b.activation_bytes_per_microbatch),
            human_bytes(b.memory_bytes),
        ]
        for i, b in enumerate(plan.blocks)
    ]
    headers = [
        "#",
        "block",
        "class",
        "stage",
        "parameters",
        "TP variant",
        "recompute",
        "offload",
        "time / mb",
        "activations / mb",
        "device memory",
    ]
    return table(headers, rows, {0, 3, 4, 8, 9, 10})


def _alternatives(plan: Plan) -> str:
    rows = []
    for a in plan.solver.alternatives:
        name = alternative_name(a)
        rows.append(
            [
                name,
                human_time(a.step_time_s) if a.step_time_s else "—",
                human_bytes(a.peak_memory_bytes) if a.peak_memory_bytes else "—",
                {True: "yes", False: "no", None: "—"}[a.feasible],
                a.status,
                a.why_not,
            ]
        )
    return table(["layout", "step", "peak memory", "fits", "status", "why not"], rows, {1, 2})


def _facts_list(plan: Plan) -> str:
    model, cl, sol = plan.model, plan.cluster, plan.solver
    args = ", ".join(f"{k}={v}" for k, v in sorted(model.args.items())) or "none"
    items = [
        ("model file", model.file),
        ("model arguments", args),
        ("sha256", model.sha256),
        ("parameters", f"{model.params:,} ({human_count(model.params)})"),
        ("blocks", model.blocks or len(plan.blocks)),
        ("traced by", model.trace),
        ("cluster", f"{cl.nodes} node(s) × {cl.gpus_per_node} GPUs = {cl.gpus}"),
        ("device profile", cl.profile),
        ("capacity per device", human_bytes(plan.predicted.capacity_bytes)),
        ("training", f"{plan.dtype}, {plan.optimizer}, lr {plan.lr}"),
        ("rank order", "rank = (pp_i × dp + dp_i) × tp + tp_i"),
        (
            "solver",
            f"{sol.status}, {sol.candidates_solved} of {sol.candidates_total} "
            f"candidates solved ({sol.candidates_pruned} pruned by bounds) in "
            f"{sol.solve_time_s:.2f} s",
        ),
    ]
    return "<dl>" + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items) + "</dl>"


def render_html(plan: Plan, images: Mapping[str, bytes], command: str, svg: bool = False) -> str:
    """The page: summary, figures, stage / block / alternative tables, facts, command
    (``svg``: the figures' SVG files were written beside it, and are linked)."""
    model = plan.model
    name = Path(model.file).name
    args = " ".join(f"{k}={v}" for k, v in sorted(model.args.items()))
    title = f"meshplan: {name}{' ' + args if args else ''} on {plan.cluster.gpus} GPUs"
    body = f"""{_facts(plan)}
<h2>Figures</h2>
{_figures(images, svg)}
<h2>Stages</h2>
{_stages(plan)}
<h2>Blocks</h2>
{_blocks(plan)}
<h2>Alternatives</h2>
{_alternatives(plan)}
<h2>Cluster and model</h2>
{_facts_list(plan)}"""
    return page(title, summary_line(plan), body, command)


def page(title: str, summary: str, body: str, command: str) -> str:
    """The self-contained page every report is: the title, a summary line, ``body`` (HTML)
    and the command that made it."""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title>
<style>{CSS}</style>
</head>
<body>
<main>
<h1>{esc(title)}</h1>
<p class="summary">{esc(summary)}</p>
{body}
<h2>Command</h2>
<pre>{esc(command)}</pre>
</main>
</body>
</html>
"""
