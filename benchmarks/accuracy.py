"""Accuracy of the cost model: predicted vs measured step time on this CPU machine.

    MESHPLAN_CACHE=/tmp/mpcache-acc python -u benchmarks/accuracy.py
        # writes reports/accuracy/cpu.json and reports/accuracy/cpu.png

Each configuration of a fixed suite (GPT tiny/small, the residual MLP; 1 and 2 gloo ranks;
DP, ZeRO 1/3, TP, PP with several micro-batch counts; recompute on/off; fp32) is planned with
everything pinned, against the measured profile of this machine (profiles/measured/vm-cpu-x2),
then trained for STEPS steps by the runtime. All plans of one world size run in a single
torchrun launch (runtime.worker --plans ...), so process start-up and the torch import are paid
once. The median step time of the steps after the first WARMUP is compared with
plan["predicted"]["step_time_s"].

The whole suite runs --rounds times (default 3) and each configuration's figure is the median
over rounds, so a slow spell of the machine lands on every configuration alike.

Options: --steps N, --warmup N, --rounds N, --only NAME[,NAME...] (a subset, for debugging),
--no-plot.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the package, not benchmarks/planner.py beside this script

from planner.api import plan as make_plan  # noqa: E402
from planner.hardware.profiles import load_profile  # noqa: E402
from planner.schema import write_plan  # noqa: E402
from planner.search import Pins  # noqa: E402
from runtime.launch import torchrun_command, worker_env  # noqa: E402

PROFILE = "measured/vm-cpu-x2"
GPT = "examples/gpt.py"
MLP = "examples/mlp.py"

# name, model file, model args, global batch size, ranks, pins
SUITE: list[tuple[str, str, dict, int, int, dict]] = [
    # one rank
    ("gpt-small 1r m1", GPT, {"size": "small"}, 16, 1, dict(micro_batch_size=16, recompute="none")),
    ("gpt-small 1r m4", GPT, {"size": "small"}, 16, 1, dict(micro_batch_size=4, recompute="none")),
    (
        "gpt-small 1r m1 full-rc",
        GPT,
        {"size": "small"},
        16,
        1,
        dict(micro_batch_size=16, recompute="full"),
    ),
    ("gpt-tiny 1r m1", GPT, {"size": "tiny"}, 64, 1, dict(micro_batch_size=64, recompute="none")),
    (
        "mlp-small 1r m1",
        MLP,
        {"size": "small"},
        256,
        1,
        dict(micro_batch_size=256, recompute="none"),
    ),
    # two ranks
    (
        "gpt-small dp2 z0",
        GPT,
        {"size": "small"},
        16,
        2,
        dict(dp=2, zero=0, micro_batch_size=8, recompute="none"),
    ),
    (
        "gpt-small dp2 z1",
        GPT,
        {"size": "small"},
        16,
        2,
        dict(dp=2, zero=1, micro_batch_size=8, recompute="none"),
    ),
    (
        "gpt-small dp2 z3",
        GPT,
        {"size": "small"},
        16,
        2,
        dict(dp=2, zero=3, micro_batch_size=8, recompute="none"),
    ),
    (
        "gpt-small dp2 z0 m2 sel-rc",
        GPT,
        {"size": "small"},
        16,
        2,
        dict(dp=2, zero=0, micro_batch_size=4, recompute="selective"),
    ),
    (
        "gpt-small tp2",
        GPT,
        {"size": "small"},
        16,
        2,
        dict(tp=2, zero=0, micro_batch_size=16, recompute="none", tp_variant="sharded"),
    ),
    (
        "gpt-tiny tp2",
        GPT,
        {"size": "tiny"},
        64,
        2,
        dict(tp=2, zero=0, micro_batch_size=64, recompute="none", tp_variant="sharded"),
    ),
    (
        "gpt-small pp2 1f1b m4",
        GPT,
        {"size": "small"},
        16,
        2,
        dict(pp=2, zero=0, micro_batch_size=4, schedule="1f1b", recompute="none"),
    ),
    (
        "gpt-small pp2 gpipe m2",
        GPT,
        {"size": "small"},
        16,
        2,
        dict(pp=2, zero=0, micro_batch_size=8, schedule="gpipe", recompute="none"),
    ),
    (
        "gpt-small pp2 1f1b m8",
        GPT,
        {"size": "small"},
        16,
        2,
        dict(pp=2, zero=0, micro_batch_size=2, schedule="1f1b", recompute="none"),
    ),
    (
        "mlp-small dp2 z0",
        MLP,
        {"size": "small"},
        256,
        2,
        dict(dp=2, zero=0, micro_batch_size=128, recompute="none"),
    ),
    (
        "mlp-small pp2 1f1b m4 full-rc",
        MLP,
        {"size": "small"},
        256,
        2,
        dict(pp=2, zero=0, micro_batch_size=64, schedule="1f1b", recompute="full"),
    ),
]


def full_pins(ranks: int, pins: dict) -> Pins:
    d = dict(tp=1, pp=1, dp=1, zero=0, offload="none")
    d.update(pins)
    for axis in ("tp", "pp", "dp"):
        if axis not in pins:
            others = math.prod(d[a] for a in ("tp", "pp", "dp") if a != axis)
            d[axis] = ranks // others if axis == "dp" else d[axis]
    if d["pp"] == 1:
        d.setdefault("schedule", None)
    return Pins(**d)


def _no_nan(obj):
    """Strict JSON: an undefined statistic (tau over one configuration) is null, not NaN."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _no_nan(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_no_nan(v) for v in obj]
    return obj


def matmul_probe() -> float:
    """fp32 GFLOP/s of one thread on 512^3 matmuls right now, to hold against the profile's
    per-rank rate: how much CPU this process actually gets under the current load."""
    import torch

    torch.set_num_threads(1)
    a = torch.randn(512, 512)
    b = torch.randn(512, 512)
    a @ b
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(4):
            a @ b
        best = min(best, (time.perf_counter() - t0) / 4)
    return 2 * 512**3 / best / 1e9


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def summarize_stage(plan: dict) -> dict:
    """Per-step terms of the cost model, summed over the stages of pp rank 0 (enough to see
    which term dominates)."""
    m = plan["num_microbatches"]
    st = plan["stages"]
    keys = ("compute_s", "tp_comm_s", "p2p_s")
    per_mb = {k: sum(s.get(k, 0.0) for s in st) for k in keys}
    per_step = {
        k: max((s.get(k, 0.0) for s in st), default=0.0)
        for k in ("dp_comm_s", "dp_exposed_s", "optimizer_s", "offload_s")
    }
    return {
        "num_microbatches": m,
        "compute_per_mb_all_stages_s": per_mb["compute_s"],
        "tp_comm_per_mb_all_stages_s": per_mb["tp_comm_s"],
        "p2p_per_mb_all_stages_s": per_mb["p2p_s"],
        **{k + "_max_stage": v for k, v in per_step.items()},
    }


def kendall(pred: list[float], meas: list[float]) -> tuple[float, float]:
    from scipy.stats import kendalltau

    res = kendalltau(pred, meas)
    return float(res.statistic), float(res.pvalue)


def figure_title(report: dict) -> str:
    s = report["summary"]
    return (
        f"meshplan cost model vs runtime, CPU gloo, profile {report['profile']}, fp32\n"
        f"median |err| {s['median_abs_rel_error']:.0%}, worst "
        f"{s['worst_abs_rel_error']:.0%}, Kendall tau {s['kendall_tau']:.2f}; load avg "
        f"{report['load_average_before'][0]}→{report['load_average_after'][0]} on "
        f"{report['machine']['cpus']} CPUs"
    )


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.get("measured_s")]
    xs = [r["predicted_s"] for r in ok]
    ys = [r["measured_s"] for r in ok]
    lo = min(xs + ys) / 1.6
    hi = max(xs + ys) * 1.6
    fig = plt.figure(figsize=(12, 8))
    ax = fig.add_axes((0.08, 0.08, 0.6, 0.84))
    key = fig.add_axes((0.7, 0.08, 0.29, 0.84))
    key.axis("off")
    grid = [lo * (hi / lo) ** (i / 100) for i in range(101)]
    ax.fill_between(
        grid,
        [g * 0.75 for g in grid],
        [g * 1.25 for g in grid],
        color="tab:orange",
        alpha=0.12,
        label="±25%",
    )
    ax.fill_between(
        grid,
        [g * 0.9 for g in grid],
        [g * 1.1 for g in grid],
        color="tab:green",
        alpha=0.2,
        label="±10%",
    )
    ax.plot(grid, grid, "k-", lw=1, label="y = x")
    colors = {1: "tab:blue", 2: "tab:red"}
    # Points carry a number (names would pile up where configurations cluster); the key beside
    # the plot names each one with its error.
    offsets = [(4, 3), (4, -9), (-4, 3), (-4, -9)]
    for i, r in enumerate(ok, start=1):
        ax.scatter(r["predicted_s"], r["measured_s"], color=colors.get(r["ranks"], "k"), zorder=3)
        dx, dy = offsets[(i - 1) % len(offsets)]
        ax.annotate(
            str(i),
            (r["predicted_s"], r["measured_s"]),
            fontsize=7,
            xytext=(dx, dy),
            textcoords="offset points",
            ha="left" if dx > 0 else "right",
        )
        key.text(
            0.0,
            1 - (i - 0.5) / max(len(ok), 20),
            f"{i:>2}  {r['name']}  ({r['rel_error']:+.0%})",
            fontsize=8,
            family="monospace",
            color=colors.get(r["ranks"], "k"),
            va="center",
            transform=key.transAxes,
        )
    ax.scatter([], [], color="tab:blue", label="1 rank")
    ax.scatter([], [], color="tab:red", label="2 ranks")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("predicted step time (s), cost model")
    ax.set_ylabel("measured step time (s), median over rounds of the median warm step")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.savefig(path, dpi=130)
    plt.close(fig)


def run_round(batch: list[dict], ranks: int, rnd: int, args, load_during: list) -> None:
    """One torchrun launch training every plan of ``batch`` in turn; appends each plan's warm
    step times to its row's ``_rounds``."""
    dirs = [Path(r["run_dir"]) / f"round{rnd}" for r in batch]
    worker_args = [
        "--plans",
        *[r["plan_path"] for r in batch],
        "--run-dirs",
        *[str(d) for d in dirs],
        "--steps",
        str(args.steps),
        "--seed",
        "0",
        "--device",
        "cpu",
    ]
    cmd = torchrun_command(ranks, worker_args)
    env = worker_env()
    env["OMP_NUM_THREADS"] = "1"  # as the profile was measured: 1 thread per rank
    print(
        f"[run {rnd + 1}/{args.rounds}] {len(batch)} plan(s) on {ranks} rank(s), "
        f"{args.steps} steps each ...",
        flush=True,
    )
    load_during.append(loadavg())
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    load_during.append(loadavg())
    print(
        f"[run {rnd + 1}/{args.rounds}] {ranks} rank(s): exit {proc.returncode} in "
        f"{time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    if proc.returncode != 0:
        print((proc.stdout + proc.stderr)[-3000:], flush=True)
    for r, d in zip(batch, dirs):
        mpath = d / "metrics.jsonl"
        recs = []
        if mpath.is_file():
            recs = [json.loads(line) for line in mpath.read_text().splitlines() if line.strip()]
        times = [rec["step_time_s"] for rec in recs if rec["step"] > args.warmup]
        if times:
            r.setdefault("_rounds", []).append(times)
            r["peak_memory_bytes"] = recs[-1].get("peak_memory_bytes")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="runs of the whole suite (median)")
    ap.add_argument("--only", help="comma-separated config names (debugging)")
    ap.add_argument("--out", default=str(ROOT / "reports" / "accuracy"))
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument(
        "--replot", action="store_true", help="redraw cpu.png from --out's cpu.json; run nothing"
    )
    args = ap.parse_args()
    if args.replot:
        report = json.loads((Path(args.out) / "cpu.json").read_text())
        measured = [r for r in report["configs"] if r.get("measured_s")]
        plot(measured, Path(args.out) / "cpu.png", figure_title(report))
        print(f"wrote {Path(args.out) / 'cpu.png'}")
        return 0
    command = (
        "MESHPLAN_CACHE="
        + os.environ.get("MESHPLAN_CACHE", "<default>")
        + " python -u "
        + " ".join(shlex.quote(a) for a in sys.argv)
    )
    t_start = time.perf_counter()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    suite = SUITE
    if args.only:
        want = {s.strip() for s in args.only.split(",")}
        suite = [c for c in SUITE if c[0] in want]
    load_before = loadavg()
    ncpu = os.cpu_count() or 1
    probe_before = matmul_probe()
    prof = load_profile(PROFILE)
    profile_gflops = prof.peak_flops["fp32"] * prof.matmul_efficiency / 1e9
    print(
        f"load average before: {load_before} on {ncpu} CPUs; 1-thread fp32 matmul "
        f"{probe_before:.1f} GFLOP/s (profile: {profile_gflops:.1f} per rank)",
        flush=True,
    )

    work = Path(tempfile.mkdtemp(prefix="meshplan-accuracy-"))
    rows: list[dict] = []
    # 1. plan every configuration
    for i, (name, model, margs, gbs, ranks, pins) in enumerate(suite):
        t0 = time.perf_counter()
        row: dict = {
            "name": name,
            "model": model,
            "model_args": margs,
            "global_batch_size": gbs,
            "ranks": ranks,
            "pins": {k: v for k, v in pins.items()},
        }
        try:
            res = make_plan(
                ROOT / model,
                ranks,
                model_args=margs,
                profile=PROFILE,
                global_batch_size=gbs,
                dtype="fp32",
                pins=full_pins(ranks, pins),
            )
            p = res.plan.to_dict()
            d = work / f"c{i:02d}"
            path = write_plan(p, d)
            row.update(
                plan_path=str(path),
                run_dir=str(d),
                mesh=p["mesh"],
                micro_batch_size=p["micro_batch_size"],
                num_microbatches=p["num_microbatches"],
                schedule=p["schedule"],
                zero_stage=p["zero_stage"],
                recompute=sorted({b["recompute"] for b in p["blocks"]}),
                predicted_s=p["predicted"]["step_time_s"],
                model_flops_per_step=p["predicted"]["model_flops_per_step"],
                terms=summarize_stage(p),
            )
            print(
                f"[plan {i + 1}/{len(suite)}] {name}: predicted {row['predicted_s'] * 1e3:.1f} ms "
                f"(m={p['num_microbatches']}, {time.perf_counter() - t0:.1f} s to plan)",
                flush=True,
            )
        except Exception as exc:  # noqa: BLE001 - record and go on
            row["error"] = f"plan: {type(exc).__name__}: {exc}"
            print(f"[plan {i + 1}/{len(suite)}] {name}: FAILED {row['error']}", flush=True)
        rows.append(row)

    # 2. run: per round, one torchrun launch per world size, every plan of that size in turn.
    # Rounds spread the machine's slow spells (other tenants of the host) over every
    # configuration instead of whichever ran during one; each configuration's figure is the
    # median over rounds of its median warm step.
    load_during: list[list[float]] = []
    for rnd in range(args.rounds):
        for ranks in sorted({r["ranks"] for r in rows}):
            batch = [r for r in rows if r["ranks"] == ranks and "plan_path" in r]
            if batch:
                run_round(batch, ranks, rnd, args, load_during)
    for r in rows:
        rounds = r.pop("_rounds", [])
        if "plan_path" not in r:
            continue
        if len(rounds) < args.rounds:
            r["error"] = r.get("error") or "run failed: no warm steps in some round"
            continue
        medians = [statistics.median(t) for t in rounds]
        r["step_times_s"] = [[round(x, 6) for x in t] for t in rounds]
        r["round_medians_s"] = medians
        r["measured_s"] = statistics.median(medians)
        r["measured_min_s"] = min(min(t) for t in rounds)
        r["measured_spread"] = (max(medians) - min(medians)) / r["measured_s"]
        r["rel_error"] = (r["predicted_s"] - r["measured_s"]) / r["measured_s"]
        r["ratio_measured_over_predicted"] = r["measured_s"] / r["predicted_s"]
    load_after = loadavg()
    probe_after = matmul_probe()
    print(
        f"load average after: {load_after}; 1-thread fp32 matmul {probe_after:.1f} GFLOP/s",
        flush=True,
    )

    # 3. summary
    ok = [r for r in rows if "measured_s" in r]
    print()
    hdr = f"{'config':32s} {'m':>3s} {'pred ms':>9s} {'meas ms':>9s} {'rel err':>8s} {'spread':>7s}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if "measured_s" in r:
            print(
                f"{r['name']:32s} {r['num_microbatches']:3d} {r['predicted_s'] * 1e3:9.2f} "
                f"{r['measured_s'] * 1e3:9.2f} {r['rel_error']:+8.1%} {r['measured_spread']:7.1%}"
            )
        else:
            print(f"{r['name']:32s} ERROR {r.get('error', '')[:200]}")
    summary: dict = {"configs": len(rows), "measured": len(ok)}
    if ok:
        abs_err = [abs(r["rel_error"]) for r in ok]
        worst = max(ok, key=lambda r: abs(r["rel_error"]))
        pred = [r["predicted_s"] for r in ok]
        meas = [r["measured_s"] for r in ok]
        tau, pval = kendall(pred, meas) if len(ok) > 1 else (float("nan"), float("nan"))
        fastest_pred = min(ok, key=lambda r: r["predicted_s"])
        fastest_meas = min(ok, key=lambda r: r["measured_s"])
        within = fastest_pred["measured_s"] <= 1.10 * fastest_meas["measured_s"]
        # the same check among the configurations that are true alternatives of one another
        # (same model, size, batch and rank count), which is what the planner actually chooses
        groups: dict[str, list[dict]] = {}
        for r in ok:
            key = f"{r['model']} {r['model_args']} gbs={r['global_batch_size']} ranks={r['ranks']}"
            groups.setdefault(key, []).append(r)
        group_checks = []
        for key, g in groups.items():
            if len(g) < 2:
                continue
            fp = min(g, key=lambda r: r["predicted_s"])
            fm = min(g, key=lambda r: r["measured_s"])
            gt = (
                kendall([r["predicted_s"] for r in g], [r["measured_s"] for r in g])
                if len(g) > 2
                else (float("nan"), float("nan"))
            )
            group_checks.append(
                {
                    "group": key,
                    "configs": [r["name"] for r in g],
                    "fastest_predicted": fp["name"],
                    "fastest_measured": fm["name"],
                    "chosen_measured_over_fastest": fp["measured_s"] / fm["measured_s"],
                    "chosen_within_10pct": fp["measured_s"] <= 1.10 * fm["measured_s"],
                    "kendall_tau": gt[0],
                }
            )
        ratios = [r["ratio_measured_over_predicted"] for r in ok]
        summary.update(
            median_abs_rel_error=statistics.median(abs_err),
            mean_abs_rel_error=statistics.fmean(abs_err),
            worst_abs_rel_error=abs(worst["rel_error"]),
            worst_config=worst["name"],
            within_10pct=sum(e <= 0.10 for e in abs_err),
            within_25pct=sum(e <= 0.25 for e in abs_err),
            median_measured_over_predicted=statistics.median(ratios),
            geomean_measured_over_predicted=math.exp(statistics.fmean(math.log(x) for x in ratios)),
            kendall_tau=tau,
            kendall_pvalue=pval,
            fastest_predicted=fastest_pred["name"],
            fastest_measured=fastest_meas["name"],
            fastest_predicted_measured_s=fastest_pred["measured_s"],
            fastest_measured_s=fastest_meas["measured_s"],
            chosen_within_10pct_of_fastest=within,
            per_group=group_checks,
        )
        print()
        print(
            f"median |rel error| {summary['median_abs_rel_error']:.1%}, worst "
            f"{summary['worst_abs_rel_error']:.1%} ({worst['name']}); "
            f"{summary['within_10pct']}/{len(ok)} within 10%, "
            f"{summary['within_25pct']}/{len(ok)} within 25%"
        )
        print(
            f"measured/predicted: median {summary['median_measured_over_predicted']:.2f}x, "
            f"geomean {summary['geomean_measured_over_predicted']:.2f}x"
        )
        print(f"Kendall tau (predicted vs measured order, all configs): {tau:.3f} (p={pval:.2g})")
        print(
            f"fastest predicted: {fastest_pred['name']} "
            f"(measured {fastest_pred['measured_s'] * 1e3:.1f} ms); "
            f"fastest measured: {fastest_meas['name']} "
            f"({fastest_meas['measured_s'] * 1e3:.1f} ms): "
            f"{'within' if within else 'NOT within'} 10%"
        )
        for g in group_checks:
            print(
                f"  among {g['group']}: predicted-fastest {g['fastest_predicted']!r} is "
                f"{g['chosen_measured_over_fastest']:.2f}x the measured-fastest "
                f"{g['fastest_measured']!r} "
                f"({'ok' if g['chosen_within_10pct'] else 'NOT within 10%'}), "
                f"tau {g['kendall_tau']:.2f}"
            )

    busy = max([load_before[0], load_after[0]] + [x[0] for x in load_during])
    note = None
    if busy > ncpu * 0.75:
        note = (
            f"the machine was loaded by other processes (1-minute load average up to {busy:.2f} "
            f"on {ncpu} CPUs); measured times include contention and are noisier and slower "
            "than on an idle machine"
        )
        print(f"note: {note}")
    import torch

    report = {
        "benchmark": "meshplan cost-model accuracy (step time), CPU / gloo",
        "command": command,
        "profile": PROFILE,
        "dtype": "fp32",
        "steps": args.steps,
        "warmup_steps_dropped": args.warmup,
        "rounds": args.rounds,
        "measured": "per round, the median step_time_s of the runtime's metrics.jsonl over the "
        "warm steps (rank 0; each step ends with an all-reduce, so it is the slowest rank's); "
        "then the median over rounds (spread: the rounds' range over that)",
        "machine": {
            "host": platform.node(),
            "cpus": ncpu,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "omp_num_threads": 1,
        },
        "load_average_before": load_before,
        "load_average_during": load_during,
        "load_average_after": load_after,
        "load_note": note,
        "matmul_probe_gflops_1thread": {
            "before": round(probe_before, 1),
            "after": round(probe_after, 1),
            "profile_per_rank": round(profile_gflops, 1),
        },
        "wall_s": round(time.perf_counter() - t_start, 1),
        "summary": summary,
        "configs": rows,
    }
    out_json = out_dir / "cpu.json"
    report = _no_nan(report)
    out_json.write_text(json.dumps(report, indent=2, default=str, allow_nan=False) + "\n")
    print(f"wrote {out_json}")
    if not args.no_plot and ok:
        plot(rows, out_dir / "cpu.png", figure_title(report))
        print(f"wrote {out_dir / 'cpu.png'}")
    print(f"total {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
