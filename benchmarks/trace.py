"""Trace time and peak memory of the largest shipped examples, cold and from the cache.

    python benchmarks/trace.py            # writes reports/benchmarks/trace.json

Each measurement runs in a fresh process (so peak RSS is that trace's alone) with an empty
cache for the cold run, then again with the cache warm.
"""

from __future__ import annotations

import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = [
    ("examples/gpt.py", {"size": "gpt3-175b"}),
    ("examples/llama.py", {"size": "llama3-70b"}),
]

CHILD = """
import json, resource, sys, time
t0 = time.perf_counter()
from planner.api import trace
t1 = time.perf_counter()
traced = trace(sys.argv[1], json.loads(sys.argv[2]))
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "trace_s": t2 - t1, "from_cache": traced.from_cache,
                  "blocks": len(traced.blocks), "params": traced.params,
                  "ops": traced.graph.number_of_nodes(),
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def run_once(path: str, args: dict, cache: str) -> dict:
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, path, json.dumps(args)],
        cwd=ROOT,
        env={"MESHPLAN_CACHE": cache, "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - start
    return result


def main() -> None:
    rows = []
    for path, args in CASES:
        with tempfile.TemporaryDirectory() as cache:
            cold = run_once(path, args, cache)
            warm = run_once(path, args, cache)
        rows.append({"model": path, "args": args, "cold": cold, "cached": warm})
        print(
            f"{path} {args}: cold {cold['trace_s']:.1f} s, cached {warm['trace_s']:.2f} s "
            f"(process {warm['process_s']:.1f} s incl. importing torch), "
            f"peak RSS {cold['peak_rss_bytes'] / 2**30:.2f} GiB, {cold['ops']} ops, "
            f"{cold['blocks']} blocks"
        )
    out = ROOT / "reports" / "benchmarks" / "trace.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "machine": platform.machine(),
        "cpus": resource.getpagesize() and __import__("os").cpu_count(),
    }
    out.write_text(json.dumps({"machine": meta, "results": rows}, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
