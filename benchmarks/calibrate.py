"""How long `plan calibrate --quick` takes on this machine: the minute its help text promises.

    python benchmarks/calibrate.py            # writes reports/benchmarks/calibrate.json

Each run is a fresh process (imports and the measuring ranks' start-up count, as a user waits
for them), timed by wall clock; the load average beside it says what else the machine ran. A
wall-clock bound is a benchmark's job, not a test's: under a shared CI runner's load the same
run takes longer without anything being wrong (tests/test_calibrate.py checks what the quick
run measures, not how fast).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = 60.0


def run_once() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "this-machine.toml"
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "meshplan", "calibrate", "--quick", "--out", str(out)]
            + ["--quiet"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"plan calibrate --quick failed: {proc.stderr.strip()[-500:]}")
    return {"wall_s": round(wall, 2), "load_average": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="how many runs (default 2)")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    args = parser.parse_args()
    runs = [run_once() for _ in range(args.runs)]
    result = {
        "command": "plan calibrate --quick",
        "budget_s": BUDGET_S,
        "runs": runs,
        "within_budget": all(r["wall_s"] < BUDGET_S for r in runs),
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "calibrate.json").write_text(json.dumps(result, indent=2) + "\n")
    for r in runs:
        print(f"plan calibrate --quick: {r['wall_s']:.1f} s (load {r['load_average']})")


if __name__ == "__main__":
    main()
