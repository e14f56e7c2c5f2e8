"""``plan MODEL.py --resources POOL.toml --tokens N [--objective ...]``: the CLI's resource path.

Plans every option of the pool with the model's own planning flags, and, when the pool joins
node types by a [[fabric]], the best pipeline across kinds by the objective, within the
deadline and budget (kept when it beats every kind alone; its plan.json written under
mixed/); prints the table, draws the Pareto figure beside
the model's reports, and says why the chosen option wins; exit 3 when no option meets the
deadline and budget.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from planner.errors import InfeasibleError, UserInputError
from planner.resources.choose import choose, evaluate, meets, pareto, plan_option, why_chosen
from planner.resources.figure import draw_front, print_table, table_rows
from planner.resources.mixed_pool import mixed_option
from planner.resources.pool import figure_sources, load_pool
from planner.schema import write_plan
from planner.training import Training


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
    kwargs = dict(training=training, use_cache=not args.no_cache)
    say = (lambda s: None) if args.quiet else (lambda s: print(f"planning {s}", file=sys.stderr))
    options = evaluate(pool, plan_option(mf, kwargs), args.tokens, steps, say)
    mixed, mixed_res = mixed_option(
        pool,
        mf,
        kwargs,
        options,
        args.tokens,
        steps,
        say,
        args.objective,
        args.deadline,
        args.budget,
        {"auto": None, "on": True, "off": False}[args.stage_degrees],
    )
    if mixed is not None:
        options.append(mixed)
    front = pareto(options)
    out_dir = Path(args.out) if args.out else Path("reports") / mf.path.stem
    if mixed_res is not None and mixed_res.plan is not None:
        path = write_plan(mixed_res.plan, out_dir / "mixed")
        if not args.quiet:
            print(f"mixed plan: {path}")
    if mixed_res is not None and not args.quiet:
        for note in mixed_res.search.notes:
            print(f"note: {note}")
    try:
        chosen = choose(options, args.objective, args.deadline, args.budget)
    except InfeasibleError:
        if not args.quiet:
            rows = table_rows(options, None, front, args.deadline, args.budget)
            print_table(rows, f"{pool.path}: no option meets the limits")
        raise
    fig = draw_front(options, chosen, front, out_dir / "resources.png")
    if not args.quiet:
        rows = table_rows(options, chosen, front, args.deadline, args.budget)
        print_table(rows, f"{pool.path}: objective {args.objective}")
        ok = sum(1 for o in options if meets(o, args.deadline, args.budget))
        print(f"chosen: {why_chosen(chosen, options, args.objective, ok)}")
        kinds = [chosen.node.name]
        if chosen is mixed and mixed_res is not None and mixed_res.plan is not None:
            kinds = [k.name for k in mixed_res.plan.kinds or []]
        print(f"figures: {figure_sources(pool, kinds)}")
        print(f"figure: {fig}")
    return 0
