"""``plan MODEL.py --resources POOL.toml --tokens N [--objective ...]``: the CLI's resource path.

Plans every option of the pool with the model's own planning flags, and, when the pool joins
node types by a [[fabric]], the best pipeline across kinds by the objective, within the
deadline and budget (kept when it beats every kind alone; its plan.json written under
mixed/). Writes the chosen option's plan.json and, beside it, ``resources.json``: every
option, the chosen one, the Pareto set and the pool-file line of each figure the choice was
priced with, so a script reads what a person reads in the table. Prints the table (fitted to
the terminal), says why the chosen option wins, draws the Pareto figure; ``--json`` prints
resources.json on stdout instead. Exit 3 when no option meets the deadline and budget.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path
from typing import Any

from planner.atomic import write_text_atomic
from planner.errors import InfeasibleError, UserInputError
from planner.progress import Bars
from planner.resources.choose import (
    Option,
    choose,
    evaluate,
    meets,
    node_counts,
    pareto,
    plan_option,
    why_chosen,
)
from planner.resources.figure import draw_front, print_table, table_rows
from planner.resources.mixed_pool import mixed_option
from planner.resources.pool import Pool, figure_records, load_pool
from planner.schema import write_plan
from planner.search.bound_memo import save_kept
from planner.training import Training

SCHEMA = "meshplan.resources/1"
SHOWN_MISFITS = 3  # options that fit no plan whose reason the terminal shows (all in the JSON)


def run_resources(args: argparse.Namespace, mf: Any, training: Training, steps: int | None) -> int:
    """Choose among the pool's options for ``mf`` trained as ``training``; ``steps`` is an
    explicit --steps budget."""
    for flag in ("gpus", "nodes", "profile", "gpus_per_node"):
        if getattr(args, flag, None) is not None:
            raise UserInputError(
                f"--{flag.replace('_', '-')} and --resources exclude each other: the pool file "
                "says which devices and how many"
            )
    for flag in ("deadline", "budget"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            raise UserInputError(f"--{flag} must be positive, got {value}")
    pool = load_pool(args.resources)
    as_json = bool(getattr(args, "json", False))
    quiet = args.quiet or as_json
    with Bars(quiet, getattr(args, "verbose", False)) as bars:
        options, mixed_res = _plan_options(args, mf, training, steps, pool, bars)
    front = pareto(options)
    out_dir = Path(args.out) if args.out else Path("reports") / mf.path.stem
    notes = list(mixed_res.search.notes) if mixed_res is not None else []
    if mixed_res is not None and mixed_res.plan is not None:
        path = write_plan(mixed_res.plan, out_dir / "mixed")
        if not quiet:
            say(f"mixed plan: {path}")
    if not quiet:
        for note in notes:
            say(f"note: {note}")
    try:
        chosen = choose(options, args.objective, args.deadline, args.budget)
    except InfeasibleError:
        write_resources(out_dir, resources_doc(args, mf, pool, options, None, front, notes))
        if not quiet:
            rows = table_rows(options, None, front, args.deadline, args.budget)
            print_table(rows, f"{pool.path}: no option meets the limits")
        raise
    if chosen.point is not None and chosen.point.plan is not None:
        write_plan(chosen.point.plan, out_dir)
    doc = resources_doc(args, mf, pool, options, chosen, front, notes)
    written = write_resources(out_dir, doc)
    fig = draw_front(options, chosen, front, out_dir / "resources.png")
    if as_json:
        print(json.dumps(doc, indent=2))
    elif not args.quiet:
        print_choice(args, pool, options, chosen, front, [written, fig])
    return 0


def _plan_options(
    args: argparse.Namespace,
    mf: Any,
    training: Training,
    steps: int | None,
    pool: Pool,
    bars: Bars,
) -> tuple[list[Option], Any]:
    """Every (kind, count) option planned and priced, then the mixed option, under one bar per
    search; per-candidate lines only with ``--verbose``."""
    kept: dict = {}  # the trace's BoundMemo, one for all the pool's plans, saved after them
    kwargs = dict(
        training=training,
        use_cache=not args.no_cache,
        progress=bars.search_callback("  option"),
        bounds=kept,
    )
    total = sum(len(node_counts(t.nodes)) for t in pool.node_types)
    pool_bar = bars.task("pool: options", total=total)

    def option_started(label: str) -> None:
        bars.say(f"planning {label}")
        pool_bar.update(info=label)

    options = evaluate(pool, plan_option(mf, kwargs), args.tokens, steps, option_started)
    pool_bar.update(completed=total)
    mixed_bar = bars.task("pool: pipelines across kinds") if pool.fabric else None
    built = 0

    def mixed_candidate(label: str) -> None:
        nonlocal built
        built += 1
        bars.say(f"planning {label}")
        if mixed_bar is not None:
            mixed_bar.advance(info=f"{built} candidates solved")

    kwargs.pop("progress")
    mixed, mixed_res = mixed_option(
        pool,
        mf,
        kwargs,
        options,
        args.tokens,
        steps,
        mixed_candidate,
        args.objective,
        args.deadline,
        args.budget,
        {"auto": None, "on": True, "off": False}[args.stage_degrees],
    )
    save_kept(kept)
    if mixed is not None:
        options.append(mixed)
    return options, mixed_res


def say(text: str, width: int | None = None) -> None:
    """A line of the result, wrapped to the terminal so it never runs off the side."""
    from planner.report.console import terminal_width

    width = width or terminal_width()
    print(textwrap.fill(text, width, subsequent_indent="  ", break_on_hyphens=False))


def print_choice(
    args: argparse.Namespace,
    pool: Pool,
    options: list[Option],
    chosen: Option,
    front: list[Option],
    written: list[Path],
) -> None:
    """The table, why the chosen option wins, where its figures came from, what was written."""
    rows = table_rows(options, chosen, front, args.deadline, args.budget)
    print_table(rows, f"{pool.path}: by {args.objective}")
    misfits = [o for o in options if o.run is None]
    for o in misfits[:SHOWN_MISFITS]:
        say(f"does not fit: {o.label}: {o.why_not}")
    if len(misfits) > SHOWN_MISFITS:
        say(f"... and {len(misfits) - SHOWN_MISFITS} more that fit no plan (resources.json)")
    ok = sum(1 for o in options if meets(o, args.deadline, args.budget))
    say(f"chosen: {why_chosen(chosen, options, args.objective, ok)}")
    by_kind: dict[str, list[str]] = {}
    for r in figure_records(pool, chosen_kinds(chosen)):
        where = f"line {r['line']}" if r["line"] is not None else r["source"]
        if r["figure"] == "step time":
            where = f"profile {r['value']}"
        value = "" if r["figure"] == "step time" else f" {r['value']:g}"
        by_kind.setdefault(r["kind"] or "run", []).append(f"{r['figure']}{value} ({where})")
    say(f"figures from {pool.path}:")
    for kind, figures in by_kind.items():
        say(f"  {kind}: " + ", ".join(figures))
    say(f"wrote {', '.join(str(p) for p in written)}")


def chosen_kinds(option: Option) -> list[str]:
    """The node kinds an option runs on: its own, or a mixed plan's."""
    plan = option.point.plan if option.point is not None else None
    if plan is not None and plan.kinds:
        return [k.name for k in plan.kinds]
    return [option.node.name]


def option_record(o: Option, chosen: Option | None, front: list[Option]) -> dict[str, Any]:
    """One option as resources.json holds it: what the table shows, unrounded."""
    p, r = o.point, o.run
    plan = p.plan if p is not None else None
    return {
        "label": o.label,
        "kinds": chosen_kinds(o),
        "mixed": plan is not None and bool(plan.kinds),
        "nodes": o.nodes,
        "gpus": o.gpus,
        "fits": r is not None,
        "why_not": o.why_not or None,
        "mesh": p.mesh if p is not None else None,
        "step_time_s": p.step_time_s if p is not None else None,
        "mfu": p.mfu if p is not None else None,
        "busy_share": p.busy if p is not None else None,
        "tokens_per_step": p.tokens_per_step if p is not None else None,
        "steps": r.steps if r is not None else None,
        "wall_h": r.wall_h if r is not None else None,
        "cost_usd": r.cost_usd if r is not None else None,
        "energy_kwh": r.energy_kwh if r is not None else None,
        "carbon_kg": r.carbon_kg if r is not None else None,
        "chosen": o is chosen,
        "pareto": o in front,
    }


def resources_doc(
    args: argparse.Namespace,
    mf: Any,
    pool: Pool,
    options: list[Option],
    chosen: Option | None,
    front: list[Option],
    notes: list[str],
) -> dict[str, Any]:
    """What resources.json holds (docs/resources.md describes each field)."""
    kinds = sorted({k for o in options for k in chosen_kinds(o)})
    return {
        "schema": SCHEMA,
        "model": str(mf.path),
        "pool": str(pool.path),
        "objective": args.objective,
        "deadline_h": args.deadline,
        "budget_usd": args.budget,
        "tokens": args.tokens,
        "options": [option_record(o, chosen, front) for o in options],
        "chosen": chosen.label if chosen is not None else None,
        "plan": "plan.json" if chosen is not None and chosen.point.plan is not None else None,
        "pareto": [o.label for o in front],
        "figures": figure_records(pool, kinds),
        "notes": notes,
    }


def write_resources(out_dir: Path, doc: dict[str, Any]) -> Path:
    path = out_dir / "resources.json"
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(doc, indent=2) + "\n")
    return path
