"""``plan MODEL.py --gpus N`` for a recommendation model: plan, write plan.json, print a
summary, and with ``--run`` train it (runtime.recsys)."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from planner.modelfile import ModelFile
from planner.recsys.plan import write_recplan
from planner.training import Training
from planner.vocab import DenseStrategy

GIB = 2.0**30


def plan_device(args: argparse.Namespace) -> str:
    """cpu when the plan is for this CPU (``--device cpu``, the cpu profile, or ``--run`` with
    no GPU visible): TorchRec's CPU path then limits the options."""
    if getattr(args, "device", None) == "cpu" or args.profile == "cpu":
        return "cpu"
    if getattr(args, "device", None) == "cuda":
        return "cuda"
    if args.run:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda"


def run(
    args: argparse.Namespace,
    mf: ModelFile,
    training: Training,
    draw: Callable[[dict[str, Any], Path], list[Path]] | None = None,
    run: Callable[[Path, argparse.Namespace], int] | None = None,
) -> int:
    """Plan, write plan.json and print; ``draw`` renders the report (planner.report) and ``run``
    trains the plan with ``--run`` (the runtime, handed in by the entry meshplan.cli)."""
    from planner.recsys.planning import plan_recsys

    if args.graph:
        from planner.recsys.tables import read_model

        model = read_model(mf)
        print(json.dumps({"tables": [t.__dict__ for t in model.tables],
                          "dense_params": model.dense_params}, indent=2))  # fmt: skip
        return 0
    if args.gpus is None and args.nodes is None:
        from planner.errors import UserInputError

        raise UserInputError("say how many devices to plan for: --gpus N")
    device = plan_device(args)
    notes: list[str] = []
    if device == "cpu" and args.profile is None:
        args.profile = "cpu"
        notes.append("profile cpu: the plan is for CPU ranks (gloo)")
    doc, more = plan_recsys(
        mf,
        args.gpus,
        profile=args.profile,
        gpus_per_node=args.gpus_per_node,
        nodes=args.nodes,
        training=training,
        device=device,
        memory_fraction=args.memory_fraction,
    )
    out_dir = Path(args.out) if args.out else Path("reports") / mf.path.stem
    path = write_recplan(doc, out_dir)
    drawn = draw(doc, out_dir) if draw else []  # the report's figure (planner.report)
    if args.json:  # the recommendation plan on stdout, as written
        print(path.read_text(), end="")
    elif not args.quiet:
        for note in notes + more:
            print(f"note: {note}", file=sys.stderr)
        print_summary(doc, path)
        for figure in drawn:
            print(f"wrote {figure}")
    if args.run and run is not None:
        return run(path, args)
    return 0


def print_summary(doc: dict[str, Any], path: Path) -> None:
    """A few lines: cluster, step time, the options chosen, memory, the solver's record."""
    c, p, s = doc["cluster"], doc["predicted"], doc["solver"]
    kinds = Counter(t["option"] for t in doc["tables"])
    print(
        f"recommendation plan: {len(doc['tables'])} tables on {c['gpus']} x {c['profile']} "
        f"({doc['device']}), global batch {doc['global_batch_size']}"
    )
    print(
        f"  step {p['step_time_s'] * 1e3:.3f} ms ({p['samples_per_s']:,.0f} samples/s); "
        f"peak device memory {p['peak_device_bytes'] / GIB:.2f} GiB of "
        f"{p['device_capacity_bytes'] / GIB:.0f} GiB"
    )
    print("  tables: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    d = doc["dense"]
    print(
        f"  dense part: {DenseStrategy(d['strategy']).label()}, {d['params']:,} params, "
        f"{d['compute_s'] * 1e3:.3f} ms compute, "
        f"{d['allreduce_exposed_s'] * 1e3:.3f} ms exposed gradient collectives, "
        f"{d['collective_latency_s'] * 1e3:.3f} ms collectives' latency"
    )
    slow = max(doc["ranks"], key=lambda r: r["step_s"])
    print(
        f"  slowest rank {slow['rank']}: lookups {slow['lookup_s'] * 1e3:.3f} ms, "
        f"all-to-all {slow['comm_s'] * 1e3:.3f} ms"
    )
    print(
        f"  solver: {s['status']}, gap {s['gap'] * 100:.3f}%, {s['solve_time_s']:.2f} s, "
        f"{s['variables']:,} variables"
    )
    print(f"wrote {path}")
