"""The whole ``plan`` command as a user waits for it: cold (an empty trace cache: the first plan
of a model) and warm (everything cached), with where the time goes.

    python benchmarks/command.py       # every case -> reports/benchmarks/command.{json,md}
    python benchmarks/command.py --cases 70b,405b --warm-only

benchmarks/solve.py times the planner alone, in one process, trace excluded; users never see
that number alone. Here each run is a fresh ``plan`` process (``python -m meshplan``) with
the report drawn, as typed at a terminal, on the six cases of solve.py and two transformers
models built from their configs. Per run: wall seconds, CPU seconds of the process and its
report worker, peak resident memory, and the phases inside the process:

- ``imports``: the planner's modules and their libraries (cvxpy, highspy, networkx, rich);
- ``trace``: tracing the model (cold; torch and transformers imported here) or reading the
  cached trace (warm);
- ``search``: the rest of ``planner.api.plan``: pricing, the sharding ILP (read from the cache
  when warm), the stage MILPs, the baselines; on a first plan, Megatron's TP degree's ILPs
  in a forked copy beside the eager probe's model build (``planner.api.ilps_beside``), then
  the baselines in a forked copy beside the plan's own search: the process's CPU here is
  less than the phase's work (the copies' CPU is in the run's CPU total). Cold, the 70B's
  critical path after the trace is the baselines' copy (Megatron's interleaved stage
  MILPs, about 3.5 s of CPU), not the plan's own search;
- ``report``: waiting, after plan.json and the summary, for the worker drawing the figures
  (it started before the trace and imported matplotlib meanwhile, and drew the figures from a
  draft of the plan while the baselines were searched: only report.html waits for the plan);
- ``other``: the rest of the process (arguments, the cluster, writing plan.json, printing;
  on the pool case, the mixed search and the pool's figure, outside ``planner.api.plan``);
- ``start``: the interpreter's own start-up, outside the process's clock.

A warm run also reads back what the search kept from the run before: the stage MILPs' HiGHS
runs, the candidates' bounds (looked up by what each candidate's stage problem is built from,
so that none is built to look its bounds up) and the blocks' priced options
(planner.search.milp.runs, planner.search.bound_memo).
``--cold-search`` drops them before each warm run: the trace cached, the search computed anew,
as on a first plan of a cached model on another cluster.

The planner's compiled modules are kept between runs (``__pycache__``) as Python does by
default, also where the shell sets PYTHONDONTWRITEBYTECODE: a warm run is a user's second run.

Each warm run's plan.json is compared with the cold run's (solve time and path aside): the cache
must not change a plan. Timings depend on what else the machine runs; the load average is
recorded beside them, and CPU seconds are the figure less sensitive to it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "reports" / "benchmarks"


def _mesh(gpus: int, gbs: int) -> list[str]:
    return ["--gpus", str(gpus), "--profile", "h100-sxm", "--global-batch-size", str(gbs)]


# (id, label, model file, model args, flags): solve.py's six, Llama-3-405B on the 16,384 GPUs
# of issue 52, two transformers models from their configs (Mixtral's MoE, GPT-2 at 48 layers)
# and issue 52's resource pool: three kinds, 320 GPUs, a fabric between two of them, by cost
CASES = [
    ("gpt-1.3b", "GPT 1.3B / 8", "examples/gpt.py", {"size": "1.3b"}, _mesh(8, 512)),
    ("70b", "Llama-3-70B / 64", "examples/llama.py", {"size": "llama3-70b"}, _mesh(64, 1024)),
    ("175b", "GPT-3 175B / 1024", "examples/gpt.py", {"size": "gpt3-175b"}, _mesh(1024, 1536)),
    (
        "405b",
        "Llama-3-405B / 8192",
        "examples/llama.py",
        {"size": "llama3-405b"},
        _mesh(8192, 2048),
    ),
    (
        "405b-16k",
        "Llama-3-405B / 16384",
        "examples/llama.py",
        {"size": "llama3-405b"},
        _mesh(16384, 2048),
    ),
    ("moe", "Mixtral-8x7B / 64", "examples/moe.py", {"size": "mixtral-8x7b"}, _mesh(64, 256)),
    (
        "8b-128k",
        "Llama-3-8B 128K / 8",
        "examples/llama.py",
        {"size": "llama3-8b", "seq_len": 131072},
        _mesh(8, 8),
    ),
    (
        "hf-mixtral",
        "HF Mixtral-8x7B / 64",
        "examples/mixtral.py",
        {"size": "mixtral-8x7b"},
        _mesh(64, 256),
    ),
    ("hf-gpt2", "HF GPT-2, 48 layers / 8", "tests/models/gpt2.py", {"layers": 48}, _mesh(8, 64)),
    (
        "pool-320",
        "Llama-3-8B on a 3-kind pool of 320, by cost",
        "examples/llama.py",
        {"size": "llama3-8b"},
        [
            "--resources",
            "profiles/pools/three-kind-320.toml",
            "--tokens",
            "2e11",
            "--objective",
            "cost",
        ],
    ),
]
PHASES = ("start", "imports", "trace", "search", "report", "other")


def argv_of(case: tuple, out: Path) -> list[str]:
    _, _, path, args, flags = case
    argv = [path, *flags]
    for key, value in args.items():
        argv += ["--model-arg", f"{key}={value}"]
    return argv + ["--out", str(out), "--quiet"]


def child(argv: list[str], phases_path: str) -> int:
    """One ``plan`` run with its phases clocked (runs in the measured process)."""
    began = time.perf_counter()
    import meshplan.cli
    import planner.api
    import planner.assemble  # noqa: F401  (the search and its solver libraries)
    import planner.report.console  # noqa: F401
    import planner.report.worker
    import planner.schema  # noqa: F401

    spent = {"imports": time.perf_counter() - began, "trace": 0.0, "plan": 0.0, "report": 0.0}

    def clocked(owner, name: str, phase: str) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                spent[phase] += time.perf_counter() - start

        setattr(owner, name, timed)

    clocked(planner.api, "trace", "trace")
    clocked(planner.api, "plan", "plan")
    clocked(planner.report.worker.ReportWorker, "result", "report")
    rc = meshplan.cli.main(argv)
    total = time.perf_counter() - began
    phases = {
        "imports": spent["imports"],
        "trace": spent["trace"],
        "search": spent["plan"] - spent["trace"],
        "report": spent["report"],
    }
    phases["other"] = total - sum(phases.values())
    Path(phases_path).write_text(json.dumps({"rc": rc, "total": total, "phases": phases}))
    return rc


def run_once(case: tuple, cache: Path, out: Path) -> dict:
    """One fresh ``plan`` process: wall, CPU (with the report worker), peak memory, phases."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        phases_path = f.name
    env = {**os.environ, "MESHPLAN_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    # Python keeps the planner's compiled modules (__pycache__) as it does on a user's machine;
    # a shell that sets PYTHONDONTWRITEBYTECODE (this project's sandbox does) would have every
    # run compile them again, about 0.3 s of a warm run that no user pays twice
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cmd = [sys.executable, __file__, "--child", phases_path, "--", *argv_of(case, out)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    inside = json.loads(Path(phases_path).read_text()) if proc.returncode == 0 else None
    os.unlink(phases_path)
    if inside is None:
        raise SystemExit(f"{case[1]}: plan exited {proc.returncode}")
    phases = {"start": wall - inside["total"], **inside["phases"]}
    return {
        "wall_s": round(wall, 3),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        "peak_mb": round(usage.ru_maxrss / 1024, 1),
        "phases_s": {k: round(phases[k], 3) for k in PHASES},
    }


def same_plan(a: Path, b: Path) -> bool:
    """Whether two plan.json files agree but for the solve time and the model file's path."""

    def strip(path: Path) -> dict:
        doc = json.loads(path.read_text())
        doc.get("solver", {})["solve_time_s"] = 0
        doc.get("model", {})["file"] = ""
        return doc

    return strip(a) == strip(b)


def bench(
    case: tuple, warm_only: bool, kept_cache: Path | None = None, cold_search: bool = False
) -> dict:
    """The case cold then warm. ``kept_cache``: a trace cache kept between invocations (with
    ``warm_only``): the first run then only warms what it lacks and is not reported.
    ``cold_search``: the search's kept MILP runs and bounds dropped before the warm run."""
    row: dict = {"case": case[1], "argv": ["plan", *argv_of(case, Path("OUT"))]}
    with tempfile.TemporaryDirectory() as tmp:
        cache = kept_cache or Path(tmp) / "cache"
        cold_out, warm_out = Path(tmp) / "cold", Path(tmp) / "warm"
        first = run_once(case, cache, cold_out)
        if not warm_only:
            row["cold"] = first
        if cold_search:
            for kept in ("milp", "bounds"):
                shutil.rmtree(cache / kept, ignore_errors=True)
        row["warm"] = run_once(case, cache, warm_out)
        row["same_plan"] = same_plan(cold_out / "plan.json", warm_out / "plan.json")
        row["load_average"] = round(os.getloadavg()[0], 2)
    return row


def markdown(rows: list[dict]) -> str:
    head = (
        "| case | cold wall | cold CPU | cold peak | warm wall | warm CPU | warm peak | "
        + " | ".join(f"warm {p}" for p in PHASES)
        + " | same plan | load |\n"
    )
    head += "|" + "---|" * (9 + len(PHASES)) + "\n"
    lines = []
    for r in rows:
        cold, warm = r.get("cold"), r["warm"]
        c = (
            [f"{cold['wall_s']:.2f} s", f"{cold['cpu_s']:.2f} s", f"{cold['peak_mb']:.0f} MB"]
            if cold
            else ["—", "—", "—"]
        )
        w = [f"{warm['wall_s']:.2f} s", f"{warm['cpu_s']:.2f} s", f"{warm['peak_mb']:.0f} MB"]
        p = [f"{warm['phases_s'][k]:.2f}" for k in PHASES]
        same = "yes" if r["same_plan"] else "**no**"
        lines.append(
            "| " + " | ".join([r["case"], *c, *w, *p, same, f"{r['load_average']:.1f}"]) + " |"
        )
    return (
        "# The whole `plan` command, cold and warm\n\n"
        "Written by `python benchmarks/command.py`: each run a fresh `plan` process with the "
        "report drawn; cold = empty trace cache, warm = the same command again. CPU includes "
        "the report worker. Phases in seconds (see the script's docstring); the load average "
        "(1 min) shows what else the machine ran.\n\n" + head + "\n".join(lines) + "\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", help="comma-separated case ids (default: all)")
    ap.add_argument("--warm-only", action="store_true", help="report warm runs only")
    ap.add_argument("--out", default=str(OUT), help="folder for command.json and command.md")
    ap.add_argument(
        "--cache",
        help="with --warm-only: a trace cache folder kept between invocations (default: a new "
        "empty one per case, so each case's first run traces cold)",
    )
    ap.add_argument(
        "--cold-search",
        action="store_true",
        help="drop the search's kept MILP runs and bounds before each warm run",
    )
    args = ap.parse_args()
    if args.cache and not args.warm_only:
        raise SystemExit("--cache: only with --warm-only (a cold run needs an empty cache)")
    kept = Path(args.cache) if args.cache else None
    chosen = [c for c in CASES if not args.cases or c[0] in args.cases.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in chosen:
        rows.append(bench(case, args.warm_only, kept, args.cold_search))
        w = rows[-1]["warm"]
        cold = rows[-1].get("cold", {}).get("wall_s", float("nan"))
        print(f"{case[1]:28s} cold {cold:7.2f} s  warm {w['wall_s']:6.2f} s  {w['phases_s']}")
        # written after each case: a long run interrupted keeps what it measured
        (out / "command.json").write_text(json.dumps(rows, indent=2) + "\n")
        (out / "command.md").write_text(markdown(rows))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        sys.path.insert(0, str(ROOT))
        from planner.process_end import exit_without_teardown

        exit_without_teardown(child(sys.argv[4:], sys.argv[2]))  # as ``plan`` itself ends
    main()
