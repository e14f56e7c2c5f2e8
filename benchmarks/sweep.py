"""Run families no one here wrote through the zoo's four training forms and say, per cell,
whether the plan trains like one process.

    python benchmarks/sweep.py                           # stop 44's 51 families, 204 cells
    python benchmarks/sweep.py --families squeezebert,manual_tie --forms zero3-dp2
    python benchmarks/sweep.py --out reports/benchmarks/sweep44.json

The families are ``benchmarks/models/sweep44.py``'s. Each cell is planned with its form pinned
(``tests/runs.forced_plan``), trained 5 SGD steps under torchrun on CPU/gloo (one launch per
world size, ``tests/zoo/test_zoo.py``'s), and compared with one-process training by the
runtime oracle (``tests/oracle.py``): every loss within 1e-4 and every tensor within its
tolerance. A cell ends "ok", "mismatch" (with the worst tensors), "run failed" (the worker's
error line), "refused" (the planner's one-line error) or "unmoved" (it matches, but some
weight moves too little in 5 steps for the oracle to tell it from a frozen one). This is
a sweep for finding bugs, run by hand; the bugs it found have their own tests.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "zoo")]

import test_zoo as zoo_tests  # noqa: E402
from oracle import (  # noqa: E402
    checkpoint_model_state,
    parameter_mismatches,
    reference_key,
    references_for,
    unmoved_parameters,
)
from runs import forced_plan, losses_of  # noqa: E402

from planner.errors import UserInputError  # noqa: E402

MODELS = ROOT / "benchmarks" / "models" / "sweep44.py"


def _families() -> list[str]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("meshplan_sweep44_names", MODELS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.SWEEP)


def _error_line(log: str) -> str:
    lines = [ln for ln in log.splitlines() if ln.startswith("error:")]
    return lines[0][:300] if lines else "(no error line; see the launch log)"


def run(families: list[str], forms: list[str], base: Path) -> list[dict]:
    """Plan, train and check every (family, form) cell; one record per cell."""
    records: dict[str, dict] = {}
    by_world: dict[int, list] = {}
    for family in families:
        for form in forms:
            cell = f"{family}-{form}"
            world, pins = zoo_tests.FORMS[form]
            try:
                path = forced_plan(
                    MODELS, world, base / cell, optimizer="sgd", lr=zoo_tests.SGD_LR,
                    model_args={"family": family}, **{**pins, "recompute": "none"},
                )  # fmt: skip
            except UserInputError as exc:
                records[cell] = {"cell": cell, "result": "refused", "detail": str(exc)[:300]}
                continue
            by_world.setdefault(world, []).append((cell, path, base / cell))
    logs: dict[str, tuple[int, str]] = {}
    for world, items in sorted(by_world.items()):
        print(f"training {len(items)} plans on {world} ranks ...", flush=True)
        zoo_tests._launch_resuming(items, world, base, logs)
    for items in by_world.values():
        for cell, path, run_dir in items:
            plan = json.loads(path.read_text())
            ref = references_for([path], zoo_tests.STEPS)[reference_key(plan)]
            got = losses_of(run_dir)
            if len(got) != zoo_tests.STEPS:
                records[cell] = {"cell": cell, "result": "run failed",
                                 "detail": _error_line(logs.get(cell, (0, ""))[1])}  # fmt: skip
                continue
            off = [
                step
                for step, (g, w) in enumerate(zip(got, ref.losses), start=1)
                if abs(g - w) > zoo_tests.RTOL * abs(w)
            ]
            state = checkpoint_model_state(run_dir / "checkpoints" / f"step_{zoo_tests.STEPS:06d}")
            wrong = parameter_mismatches(state, ref)
            unmoved = unmoved_parameters(ref)
            if off or wrong:
                result, detail = "mismatch", f"losses off at steps {off}; " + "; ".join(wrong[:3])
            elif unmoved:
                result, detail = "unmoved", "; ".join(unmoved[:2])
            else:
                result, detail = "ok", ""
            records[cell] = {"cell": cell, "result": result, "detail": detail}
    return [records[f"{f}-{form}"] for f in families for form in forms if f"{f}-{form}" in records]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", help="comma-separated (default: all of sweep44.py's)")
    parser.add_argument("--forms", default=",".join(zoo_tests.FORMS),
                        help=f"comma-separated among {', '.join(zoo_tests.FORMS)}")  # fmt: skip
    parser.add_argument("--out", type=Path, help="also write the records as JSON here")
    args = parser.parse_args()
    known = _families()
    families = args.families.split(",") if args.families else known
    forms = args.forms.split(",")
    unknown = [f for f in families if f not in known] + [
        f for f in forms if f not in zoo_tests.FORMS
    ]
    if unknown:
        parser.error(f"unknown families or forms: {', '.join(unknown)}")
    with tempfile.TemporaryDirectory(prefix="meshplan-sweep-") as tmp:
        records = run(families, forms, Path(tmp))
    for r in records:
        print(f"{r['cell']:40s} {r['result']:10s} {r['detail'][:150]}")
    counts = {k: sum(r["result"] == k for r in records) for k in
              ("ok", "unmoved", "mismatch", "run failed", "refused")}  # fmt: skip
    print(", ".join(f"{v} {k}" for k, v in counts.items()))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"counts": counts, "cells": records}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
