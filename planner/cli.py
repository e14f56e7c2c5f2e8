"""The ``plan`` command.

    plan MODEL.py [--graph [--json]] [planning flags]   trace, and show the block graph
    plan run PLAN.json [--steps K]                       run a saved plan
    plan show PLAN.json                                  summary and figures of a saved plan
    plan calibrate [--device cpu|cuda]                   measure this machine

Every user-facing problem ends as one line on stderr and exit status 2 (3 when a valid request
has no feasible plan); ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from planner.collector import cycles_uncollected
from planner.errors import MeshplanError, UserInputError
from planner.export.engines import DEFAULT_IMAGE, ENGINES, SCHEDULERS
from planner.flags import (
    CommandParser,
    add_run_flags,
    dollars,
    hours,
    parse_model_args,
    positive_float,
    positive_int,
    token_count,
)
from planner.hf_config import TASKS, apply_config_flags
from planner.training import Training, training_from
from planner.vocab import DTYPES, OFFLOAD, OPTIMIZERS, RECOMPUTE, SCHEDULES


def _lazy(module: str) -> Callable[[list[str]], int]:
    """A subcommand whose module (and torch.distributed, matplotlib...) loads only when used."""

    def call(argv: list[str]) -> int:
        import importlib

        return importlib.import_module(module).main(argv)

    return call


# Runs a written plan: (plan.json path, the parsed flags) -> exit status. The planner never
# imports the runtime; the entry (meshplan.cli) hands it this function.
RunPlan = Callable[[Path, argparse.Namespace], int]


def build_run_parser() -> argparse.ArgumentParser:
    """``plan run``'s flags (the entry, meshplan.cli, runs it; the CLI reference reads it)."""
    parser = CommandParser(
        prog="plan run", description="Train a saved plan with torch.distributed."
    )
    parser.add_argument("plan", help="a plan.json written by `plan MODEL.py`")
    add_run_flags(parser)
    parser.add_argument("--debug", action="store_true", help="show tracebacks, the workers' too")
    parser.add_argument(
        "--emit",
        action="append",
        choices=SCHEDULERS,
        help="write a launch file beside the plan instead of running (repeatable)",
    )
    parser.add_argument("--image", default=DEFAULT_IMAGE, help="with --emit kubernetes: the image")
    return parser


SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {
    "show": _lazy("planner.report.show"),
    "calibrate": _lazy("planner.calibrate"),
    "export": _lazy("planner.engine_prices"),
}


def add_model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        help="the model file (see docs/model-files.md), or a Hugging Face "
        "config: hf:ORG/NAME, a config.json or a directory holding one",
    )
    p.add_argument(
        "--task", choices=TASKS, help="with a config: the task (default: its architecture's)"
    )
    p.add_argument("--seq-len", type=positive_int, help="with a config: tokens per sample")
    p.add_argument(
        "--model-arg",
        action="append",
        metavar="KEY=VALUE",
        help="keyword argument for build_model (repeatable; int, float, bool or str)",
    )
    p.add_argument("--micro-batch-size", type=positive_int, help="samples per micro-batch")
    p.add_argument("--global-batch-size", type=positive_int, help="overrides TRAINING")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="overrides TRAINING")
    p.add_argument("--optimizer", choices=OPTIMIZERS, help="overrides TRAINING")
    p.add_argument("--lr", type=positive_float, help="learning rate; overrides TRAINING")
    p.add_argument(
        "--reduce-dtype",
        choices=sorted(DTYPES),
        help="gradients reduced and accumulated in fp32 (default) or in the 16-bit dtype",
    )
    p.add_argument("--no-cache", action="store_true", help="trace again even if cached")


def add_report_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--svg", action="store_true", help="also write each figure as SVG")
    p.add_argument(
        "--no-report", action="store_true", help="write plan.json only: no figures or report.html"
    )


def add_common_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true", help="print only errors")
    p.add_argument("--verbose", action="store_true", help="also print each candidate searched")
    p.add_argument("--debug", action="store_true", help="show tracebacks")


def build_parser() -> argparse.ArgumentParser:
    """``plan MODEL.py``'s flags. Long because each flag is one statement beside its help text,
    in the order ``plan --help`` lists them."""
    p = CommandParser(
        prog="plan",
        description="meshplan: plan data, tensor and pipeline parallelism for a PyTorch model.",
        epilog="Subcommands: plan run PLAN.json | plan show PLAN.json | plan calibrate",
    )
    add_model_flags(p)
    p.add_argument("--graph", action="store_true", help="print the block table and stop")
    p.add_argument(
        "--json",
        action="store_true",
        help="the result as JSON on stdout instead of tables: the block graph with --graph, "
        "resources.json with --resources, else plan.json",
    )
    c = p.add_argument_group("cluster")
    c.add_argument("--gpus", type=positive_int, help="number of devices")
    c.add_argument("--profile", help="device profile name (see profiles/) or a .toml path")
    c.add_argument("--gpus-per-node", type=positive_int, help="overrides the profile's")
    c.add_argument("--nodes", type=positive_int, help="number of nodes")
    s = p.add_argument_group("pin part of the plan (default: the solver chooses)")
    s.add_argument("--tp", type=positive_int, help="tensor-parallel degree")
    s.add_argument("--pp", type=positive_int, help="pipeline-parallel degree")
    s.add_argument("--dp", type=positive_int, help="data-parallel degree")
    s.add_argument(
        "--ep",
        type=positive_int,
        help="expert-parallel degree (MoE models; divides --dp and the expert count)",
    )
    s.add_argument(
        "--cp",
        type=positive_int,
        help="context-parallel degree (splits each sequence; models with fused attention)",
    )
    s.add_argument("--zero", type=int, choices=(0, 1, 2, 3), help="ZeRO stage")
    s.add_argument("--schedule", choices=SCHEDULES)
    s.add_argument("--virtual-stages", type=positive_int, help="chunks per rank (interleaved)")
    s.add_argument("--recompute", default="auto", choices=("auto", *RECOMPUTE))
    s.add_argument("--offload", default="auto", choices=("auto", *OFFLOAD))
    s.add_argument(
        "--tp-variant",
        default="auto",
        choices=("auto", "sharded", "sequence", "no-sequence"),
        help="sharded: with --tp > 1, shard every block that can be sharded; sequence: also "
        "run them sequence-parallel where they allow it; no-sequence: never sequence-parallel",
    )
    s.add_argument(
        "--memory-fraction", type=float, default=1.0, help="usable share of device memory"
    )
    r = p.add_argument_group("resource pool (instead of --gpus/--profile)")
    r.add_argument(
        "--resources", metavar="POOL.toml", help="choose node kind and count from a pool"
    )
    r.add_argument(
        "--tokens", type=token_count, help="with --resources: tokens to train (e.g. 15T, 1e12)"
    )
    r.add_argument(
        "--deadline", type=hours, help="with --resources: how long the run may take (72h, 30d)"
    )
    r.add_argument(
        "--budget", type=dollars, help="with --resources: dollars the run may cost (e.g. 1.5M)"
    )
    r.add_argument(
        "--objective",
        default="cost",
        choices=("time", "cost", "energy", "carbon"),
        help="with --resources: what to minimize (default cost); --steps N instead of --tokens",
    )
    r.add_argument(
        "--stage-degrees",
        default="auto",
        choices=("auto", "on", "off"),
        help="with --resources: whether a pipeline across kinds may give each stage its own "
        "TP and DP degree (auto: TP on pools of at most 2 kinds and 64 GPUs, DP on at most 8, "
        "by time; on: always, minutes on large pools)",
    )
    p.add_argument("--out", help="output directory (default: reports/<model file stem>/)")
    add_report_flags(p)
    p.add_argument("--run", action="store_true", help="after planning, run the plan")
    p.add_argument(
        "--export",
        action="append",
        choices=ENGINES,
        metavar="ENGINE",
        help=f"also write the plan for an engine: {', '.join(ENGINES)} (repeatable)",
    )
    add_run_flags(p)
    add_common_flags(p)
    return p


def cmd_plan(argv: list[str], run: RunPlan | None = None) -> int:
    """``plan MODEL.py [flags]``; ``run`` trains the plan when ``--run`` asks (None: refused)."""
    args = build_parser().parse_args(argv)
    if args.run and run is None:
        raise UserInputError("--run needs the runtime: use the `plan` command (meshplan.cli)")
    from planner.api import graph_summary, trace
    from planner.modelfile import load_model_file

    mf = load_model_file(args.model, apply_config_flags(args, parse_model_args(args.model_arg)))
    training = training_from(
        mf.training,
        mf.path.name,
        global_batch_size=args.global_batch_size,
        dtype=args.dtype,
        optimizer=args.optimizer,
        lr=args.lr,
        reduce_dtype=args.reduce_dtype,
    )
    if "torchrec" in mf.source and _uses_torchrec(mf):  # embedding tables: planner/recsys
        from planner.recsys.command import run as run_recsys
        from planner.report.recfigure import write_recplan_report

        command = shlex.join(["plan", *argv])
        return run_recsys(
            args,
            mf,
            training,
            draw=lambda doc, out: write_recplan_report(doc, out, command),
            run=run,
        )
    if args.export and (args.graph or args.resources):  # planner/export reads one plan
        raise UserInputError(
            "--export needs a plan: drop --graph/--resources, or run plan export PLAN.json ENGINE"
        )
    if args.graph:
        traced = trace(
            mf,
            traced_batch_size=args.micro_batch_size or 1,
            dtype=training.dtype,
            use_cache=not args.no_cache,
        )
        summary = graph_summary(traced)
        if args.json:
            print(json.dumps(summary, indent=2))
        else:
            from planner.report.console import print_graph

            print_graph(summary, traced.note, quiet=args.quiet)
        return 0
    if args.resources:
        from planner.resources.command import run_resources

        explicit = any(a == "--steps" or a.startswith("--steps=") for a in argv)
        return run_resources(args, mf, training, args.steps if explicit else None)
    for flag in ("tokens", "deadline", "budget"):
        if getattr(args, flag) is not None:
            raise UserInputError(f"--{flag} needs --resources POOL.toml")
    if args.stage_degrees != "auto":
        raise UserInputError(
            "--stage-degrees needs --resources POOL.toml (stages of their own TP and DP "
            "degree are for pipelines across device kinds)"
        )
    return run_planning(args, mf, training, shlex.join(["plan", *argv]), run)


def _uses_torchrec(mf) -> bool:
    """``uses_torchrec``, imported (with torch) only for a file that names TorchRec."""
    from planner.recsys.tables import uses_torchrec

    return uses_torchrec(mf)


def pins_from(args: argparse.Namespace):
    from planner.search import Pins

    if not 0 < args.memory_fraction <= 1:
        raise UserInputError(f"--memory-fraction must be in (0, 1], got {args.memory_fraction}")
    return Pins(
        tp=args.tp,
        pp=args.pp,
        dp=args.dp,
        ep=args.ep,
        cp=args.cp,
        zero=args.zero,
        micro_batch_size=args.micro_batch_size,
        schedule=args.schedule,
        virtual_stages=args.virtual_stages,
        recompute=args.recompute,
        offload=args.offload,
        memory_fraction=args.memory_fraction,
        tp_variant=args.tp_variant,
    )


def run_planning(
    args: argparse.Namespace, mf, training: Training, command: str, run: RunPlan | None = None
) -> int:
    from planner.api import plan
    from planner.progress import Bars
    from planner.report import report_files
    from planner.report.console import print_plan
    from planner.report.worker import ReportWorker
    from planner.schema import write_plan

    if args.gpus is None and args.nodes is None:
        raise UserInputError("say how many devices to plan for: --gpus N (or --graph)")
    pins = pins_from(args)
    if pins.tp and args.gpus and args.gpus % pins.tp:
        raise UserInputError(f"--tp {pins.tp} does not divide --gpus {args.gpus}")
    out_dir = Path(args.out) if args.out else Path("reports") / mf.path.stem
    notes = _run_profile_default(args)
    quiet = args.quiet or args.json  # --json: plan.json on stdout, nothing else there
    with contextlib.ExitStack() as stack:
        stack.enter_context(cycles_uncollected())
        # the report's worker imports matplotlib while this process traces and searches
        worker = None if args.no_report else stack.enter_context(ReportWorker())
        with Bars(quiet, args.verbose) as bars:
            result = plan(
                mf,
                args.gpus,
                profile=args.profile,
                gpus_per_node=args.gpus_per_node,
                nodes=args.nodes,
                training=training,
                pins=pins,
                use_cache=not args.no_cache,
                progress=bars.search_callback(),
                draft=None if worker is None else lambda doc: worker.draft(doc, args.svg),
            )
        if worker is not None:  # first: it draws while this process writes plan.json
            worker.draw(result.plan, out_dir, command, args.svg)
        path = write_plan(result.plan, out_dir)
        written = [path]
        if worker is not None:
            written += report_files(out_dir, args.svg)
        if args.export:  # engines' files beside plan.json (planner/export)
            from planner.engine_prices import result_model
            from planner.export.command import export_beside

            model = result_model(result)
            export_beside(result.plan, out_dir, args.export, quiet=quiet, model=model)
        if not args.quiet:
            for note in notes + result.notes:
                print(f"note: {note}", file=sys.stderr)
        if args.json:
            print(path.read_text(), end="")
        print_plan(result.plan, written, quiet=quiet)
        if worker is not None and worker.result() != written[1:]:
            raise RuntimeError(f"the report worker wrote other files than {written[1:]}")
    if args.run and run is not None:
        return run(path, args)
    return 0


def _run_profile_default(args: argparse.Namespace) -> list[str]:
    """With ``--run`` on the CPU and no ``--profile``, plan for the CPU the run will use.

    Planning for the GPU default and then running on gloo would predict microseconds per step
    and choose a layout for memory the run does not have."""
    if not args.run or args.profile is not None:
        return []
    from planner.device import choose_device

    if choose_device(args.device) != "cpu":
        return []
    args.profile = "cpu"
    return [
        "profile cpu: the run uses the CPU (gloo); plan calibrate --device cpu measures this "
        "host, then pass --profile measured/<name>"
    ]


def main(
    argv: Sequence[str] | None = None,
    run: RunPlan | None = None,
    subcommands: dict[str, Callable[[list[str]], int]] | None = None,
) -> int:
    """The command line, every error one line. ``run`` and ``subcommands`` are what the entry
    (meshplan.cli) adds: training a plan and ``plan run``; without them the planner alone
    plans, shows and calibrates."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("MESHPLAN_DEBUG") == "1"
    commands = {**SUBCOMMANDS, **(subcommands or {})}
    command = commands.get(argv[0]) if argv else None
    try:
        return command(argv[1:]) if command else cmd_plan(argv, run)
    except MeshplanError as exc:
        if debug:
            traceback.print_exc()
        print(f"plan: error: {_one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("plan: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug in meshplan: still one line unless --debug
        if debug:
            traceback.print_exc()
        print(
            f"plan: internal error: {type(exc).__name__}: {_one_line(str(exc))} "
            "(run again with --debug for the traceback, and please report it)",
            file=sys.stderr,
        )
        return 1


def _one_line(text: str) -> str:
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())  # the planner alone: `plan` (meshplan.cli) also runs plans
