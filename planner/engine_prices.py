"""``plan export PLAN.json ENGINE [ENGINE ...]``: a saved plan's engine files beside it, each
engine's prediction of the plan as it runs it printed beside meshplan's own.

It sits above ``planner.api`` because pricing a saved plan needs what planning had: the model's
trace (through the trace cache, so a plan made here prices in seconds) and the sharding
variants; ``planner.export.pricing`` prices, ``planner.export.command`` writes and prints.
"""

from __future__ import annotations

from pathlib import Path

from planner.api import PlanResult, trace, variants_for
from planner.errors import UserInputError
from planner.export import ENGINES
from planner.export.command import export_beside
from planner.export.pricing import PlanModel
from planner.flags import CommandParser
from planner.hardware.cluster import Cluster
from planner.hardware.profiles import load_profile
from planner.modelfile import load_model_file
from planner.schema import load_plan
from planner.schema.plan import Plan
from planner.training import on_devices, training_from


def main(argv: list[str]) -> int:
    parser = CommandParser(
        prog="plan export",
        description="Write a saved plan as an engine's configuration, beside the plan, and "
        "print each engine's predicted step time and memory for the plan as it runs it.",
    )
    parser.add_argument("plan", help="a plan.json written by `plan MODEL`")
    parser.add_argument("engines", nargs="+", choices=ENGINES, metavar="ENGINE",
                        help=f"one or more of {', '.join(ENGINES)}")  # fmt: skip
    parser.add_argument("--out", help="directory for the files (default: the plan's)")
    parser.add_argument(
        "--no-price",
        action="store_true",
        help="write the files only: no trace of the model, no predictions",
    )
    parser.add_argument("--no-cache", action="store_true", help="trace again, ignoring the cache")
    parser.add_argument("--quiet", action="store_true", help="print only errors")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    opts = parser.parse_args(argv)
    path = Path(opts.plan)
    plan = load_plan(path)
    out_dir = Path(opts.out) if opts.out else path.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    model = None if opts.no_price else plan_model(plan, use_cache=not opts.no_cache)
    export_beside(plan, out_dir, opts.engines, quiet=opts.quiet, model=model)
    return 0


def plan_model(plan: Plan, use_cache: bool = True) -> PlanModel:
    """What ``plan`` was priced from, rebuilt from the plan: its model file (refused if it
    changed since), its cluster and the training settings the planner read."""
    mf = load_model_file(plan.model.file, plan.model.args)
    if mf.sha256 != plan.model.sha256:
        raise UserInputError(
            f"{plan.model.file} changed since the plan was made: plan it again, or pass "
            "--no-price to write the engines' files without predictions"
        )
    profile = load_profile(plan.cluster.profile)
    cluster = Cluster(profile, plan.cluster.nodes, plan.cluster.gpus_per_node)
    training = training_from(
        mf.training,
        mf.path.name,
        global_batch_size=plan.global_batch_size,
        dtype=plan.dtype,
        optimizer=plan.optimizer,
        lr=plan.lr,
        reduce_dtype=plan.reduce_dtype,
    )
    training = on_devices(training, profile.device == "gpu")
    traced = trace(mf, traced_batch_size=1, dtype=training.dtype, use_cache=use_cache)
    variants_of = variants_for(traced.graph, cluster)
    return PlanModel(
        traced.graph, traced.blocks, traced.traced_batch_size, cluster, training, variants_of
    )


def result_model(result: PlanResult) -> PlanModel:
    """What a plan just made was priced from (``plan MODEL --export``)."""
    traced = result.traced
    variants_of = variants_for(traced.graph, result.cluster)
    return PlanModel(
        traced.graph,
        traced.blocks,
        traced.traced_batch_size,
        result.cluster,
        result.training,
        variants_of,
    )
