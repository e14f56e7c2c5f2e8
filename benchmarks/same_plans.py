"""Whether a change to the planner's speed changed a plan: each case's plan.json written by the
``plan`` command (report off), the solve time zeroed, into a folder; ``--against DIR`` compares
byte for byte with a folder written before the change.

    python benchmarks/same_plans.py --out /tmp/before            # on the code before
    python benchmarks/same_plans.py --out /tmp/after --against /tmp/before

The cases: the six example models at the sizes their docstrings plan (examples/gpt.py,
llama.py, mixtral.py, moe.py, mlp.py, resnet.py) and Llama-3-70B on 64 H100s, the case issue 52
times (as the plan command's default and as benchmarks/command.py plans it, with a global
batch of 1,024). Every case runs in this one process, through the trace cache (MESHPLAN_CACHE).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CASES = {
    "gpt-1.3b-8": ["examples/gpt.py", "--gpus", "8", "--model-arg", "size=1.3b"],
    "llama-8b-8": ["examples/llama.py", "--gpus", "8", "--model-arg", "size=llama3-8b"],
    "mixtral-8": ["examples/mixtral.py", "--gpus", "8"],
    "moe-64": ["examples/moe.py", "--gpus", "64", "--model-arg", "size=mixtral-8x7b"],
    "mlp-1b-8": ["examples/mlp.py", "--gpus", "8", "--model-arg", "size=1b"],
    "resnet50-8": ["examples/resnet.py", "--gpus", "8", "--model-arg", "size=resnet50"],
    "llama-70b-64": ["examples/llama.py", "--gpus", "64", "--model-arg", "size=llama3-70b"],
    "llama-70b-64-gbs1024": [
        *["examples/llama.py", "--gpus", "64", "--model-arg", "size=llama3-70b"],
        *["--global-batch-size", "1024"],
    ],
}


def zeroed(path: Path) -> str:
    """plan.json with what differs between runs of one plan zeroed: its solve time, and the
    model file's path (a copy of the code elsewhere plans the same file)."""
    doc = json.loads(path.read_text())
    doc["solver"]["solve_time_s"] = 0
    doc["model"]["file"] = ""
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for <case>.json")
    ap.add_argument("--against", help="a folder written before: compare byte for byte")
    ap.add_argument("--cases", help="comma-separated case names (default: all)")
    args = ap.parse_args()
    from meshplan.cli import main as plan

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    differ = []
    for name, argv in CASES.items():
        if args.cases and name not in args.cases.split(","):
            continue
        run = out / f"{name}.run"
        rc = plan([*argv, "--profile", "h100-sxm", "--no-report", "--quiet", "--out", str(run)])
        if rc != 0:
            print(f"{name}: plan exited {rc}")
            differ.append(name)
            continue
        text = zeroed(run / "plan.json")
        (out / f"{name}.json").write_text(text)
        if args.against:
            same = (Path(args.against) / f"{name}.json").read_text() == text
            print(f"{name}: {'same' if same else 'DIFFERENT'}")
            differ += [] if same else [name]
        else:
            print(f"{name}: written")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
