"""Which GPUs, and how many, should train Llama-3-8B on its published token budget?

    python benchmarks/resources.py      # writes reports/benchmarks/resources.{json,md,png}

Llama-3-8B (examples/llama.py size llama3-8b, sequence 8192) on 15T tokens, the pre-training
budget Meta published for Llama 3 ("over 15T tokens", Dubey et al. 2024), at 512 sequences per
step (4.2M tokens; the Llama 3 report's 405B run starts at 4M tokens per batch), over the cloud
pool profiles/pools/cloud.toml (A100 80GB, H100 SXM, H200; up to 8 nodes of 8 each, at the prices
and power figures with the sources in that file). Under a $2.5M budget (this benchmark's figure,
not from a source: a first run at $2M showed that no H200 option fits it, which left (a) empty)
meshplan's choice by cost is set against

  (a) the newest GPU (H200) at as many nodes as the budget allows, and
  (b) the fastest plan on everything available (the option with the least time, any kind).

Every number is the cost model's prediction, not a measured training run.

    python benchmarks/resources.py --mixed  # writes reports/benchmarks/resources_mixed.{json,md}

Heterogeneous jobs: Llama-3-8B at 512 sequences per step over (1) the on-premises pool
profiles/pools/onprem.toml (32 A100 + 16 H100 joined by a fabric), where one pipeline across
both kinds is set against each kind alone, and (2) profiles/pools/mixed-3x256.toml (A100, H100
and H200, 256 GPUs each, one fabric), the scale test: the CPU time of planning the pool (each
kind alone on all its GPUs, then the mixed search), this process and its children, measured
with resource.getrusage because the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the package, not benchmarks/planner.py beside this script

from planner.resources.choose import choose, evaluate, pareto, plan_option  # noqa: E402
from planner.resources.figure import draw_front  # noqa: E402
from planner.resources.pool import load_pool  # noqa: E402

TOKENS = 15 * 10**12
GLOBAL_BATCH = 512
BUDGET_USD = 2_500_000.0
NEWEST = "h200"


def main() -> None:
    pool = load_pool(ROOT / "profiles/pools/cloud.toml")
    model = ROOT / "examples/llama.py"
    from planner.modelfile import load_model_file

    mf = load_model_file(model, {"size": "llama3-8b"})
    planner = plan_option(mf, {"global_batch_size": GLOBAL_BATCH})
    start = time.perf_counter()
    options = evaluate(
        pool, planner, tokens=TOKENS, progress=lambda s: print(f"planning {s}", flush=True)
    )
    elapsed = time.perf_counter() - start
    chosen = choose(options, "cost", budget_usd=BUDGET_USD)
    newest = [o for o in options if o.node.name == NEWEST and o.run]
    in_budget = [o for o in newest if o.run.cost_usd <= BUDGET_USD]
    if not in_budget:
        raise SystemExit(f"no {NEWEST} option fits ${BUDGET_USD:,.0f}: (a) is empty")
    a = max(in_budget, key=lambda o: o.nodes)
    b = min((o for o in options if o.run), key=lambda o: (o.run.wall_s, o.run.cost_usd))
    rows = []
    for role, o in (
        ("meshplan (cost, $2.5M budget)", chosen),
        ("(a) newest GPU, most nodes in budget", a),
        ("(b) fastest plan", b),
    ):
        r = o.run
        rows.append(
            {
                "role": role,
                "option": o.label,
                "gpus": o.gpus,
                "mesh": o.point.mesh,
                "step_time_s": o.point.step_time_s,
                "mfu": o.point.mfu,
                "days": r.wall_h / 24,
                "usd": r.cost_usd,
                "mwh": r.energy_kwh / 1000,
                "tco2": r.carbon_kg / 1000,
            }
        )
    out = ROOT / "reports/benchmarks"
    out.mkdir(parents=True, exist_ok=True)
    all_rows = [
        {
            "option": o.label,
            "gpus": o.gpus,
            "mesh": o.point.mesh if o.point else None,
            "step_time_s": o.point.step_time_s if o.point else None,
            "mfu": o.point.mfu if o.point else None,
            "days": o.run.wall_h / 24 if o.run else None,
            "usd": o.run.cost_usd if o.run else None,
            "mwh": o.run.energy_kwh / 1000 if o.run else None,
            "tco2": o.run.carbon_kg / 1000 if o.run else None,
            "why_not": o.why_not,
        }
        for o in options
    ]
    (out / "resources.json").write_text(
        json.dumps({"planning_s": elapsed, "compare": rows, "options": all_rows}, indent=2)
    )
    draw_front(options, chosen, pareto(options), out / "resources.png")
    lines = [
        "| | option | GPUs | mesh | step s | MFU | days | $ | MWh | tCO2 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['role']} | {r['option']} | {r['gpus']} | {r['mesh']} | {r['step_time_s']:.2f} "
            f"| {r['mfu']:.3f} | {r['days']:,.0f} | {r['usd']:,.0f} | {r['mwh']:,.0f} "
            f"| {r['tco2']:,.0f} |"
        )
    m = rows[0]
    for r in rows[1:]:
        lines.append(
            f"\nmeshplan vs {r['role']} ({r['option']}): ${m['usd'] - r['usd']:+,.0f} "
            f"({m['usd'] / r['usd'] - 1:+.0%}), {m['mwh'] - r['mwh']:+,.0f} MWh, "
            f"{m['tco2'] - r['tco2']:+,.0f} tCO2, {m['days'] - r['days']:+,.0f} days."
        )
    lines.append(f"\nPlanning {len(options)} options took {elapsed:.0f} s.")
    (out / "resources.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def mixed_main() -> None:
    """The two heterogeneous results of the module docstring."""
    from planner.modelfile import load_model_file
    from planner.resources.mixed_plan import plan_mixed
    from planner.resources.mixed_pool import pool_kinds

    mf = load_model_file(ROOT / "examples/llama.py", {"size": "llama3-8b"})
    load_plan_cpu = cpu_seconds()
    results = {}
    for name in ("onprem", "mixed-3x256"):
        kinds, links = pool_kinds(load_pool(ROOT / f"profiles/pools/{name}.toml"))
        c0, w0 = cpu_seconds(), time.perf_counter()
        res = plan_mixed(mf, kinds, links, global_batch_size=GLOBAL_BATCH)
        cpu, wall = cpu_seconds() - c0, time.perf_counter() - w0
        p = res.plan
        statuses: dict[str, int] = {}
        for c in res.search.candidates:
            statuses[c.status] = statuses.get(c.status, 0) + 1
        results[name] = {
            "gpus": {k.name: k.gpus for k in kinds},
            "single_kind_step_s": res.single,
            "mixed_step_s": p.predicted.step_time_s if p else None,
            "mixed_mesh": f"pp{p.mesh.pp} dp{p.mesh.dp_label} tp{p.mesh.tp_label}" if p else None,
            "mixed_stages": [
                {
                    "kind": st.kind,
                    "tp": p.mesh.tp_of(j),
                    "dp": p.mesh.dp_of(j),
                    "blocks": len(st.blocks),
                }
                for j, st in enumerate(p.stages if p else [])
            ],
            "mixed_micro_batch": p.micro_batch_size if p else None,
            "mixed_zero": p.zero_stage if p else None,
            "mixed_mfu": p.predicted.mfu if p else None,
            "candidates": statuses,
            "stage_degrees_searched": not res.search.skipped,
            "planning_cpu_s": round(cpu, 1),
            "planning_wall_s": round(wall, 1),
        }
        print(name, json.dumps(results[name]), flush=True)
    out = ROOT / "reports/benchmarks"
    out.mkdir(parents=True, exist_ok=True)
    results["model_load_cpu_s"] = round(load_plan_cpu, 1)
    (out / "resources_mixed.json").write_text(json.dumps(results, indent=2))
    lines = [
        "| pool | GPUs | best kind alone: step s | mixed plan | stages (kind TP: blocks) "
        "| mixed step s | speed-up | planning CPU s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in ("onprem", "mixed-3x256"):
        r = results[name]
        alone = min(r["single_kind_step_s"].items(), key=lambda kv: kv[1])
        stages = (
            ", ".join(f"{s['kind']} tp{s['tp']}: {s['blocks']}" for s in r["mixed_stages"]) or "-"
        )
        mixed = r["mixed_step_s"]
        gain = f"{alone[1] / mixed:.2f}x" if mixed else "none (no mixed plan is faster)"
        lines.append(
            f"| {name} | {' + '.join(f'{v} {k}' for k, v in r['gpus'].items())} "
            f"| {alone[0]}: {alone[1]:.2f} | {r['mixed_mesh'] or '-'} | {stages} "
            f"| {mixed if mixed is None else round(mixed, 2)} | {gain} | {r['planning_cpu_s']} |"
        )
    (out / "resources_mixed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Which GPUs, and how many, should train Llama-3-8B (writes reports/benchmarks)"
    )
    parser.add_argument(
        "--mixed", action="store_true", help="heterogeneous jobs: resources_mixed.{json,md}"
    )
    if parser.parse_args().mixed:  # anything else: argparse's one-line error, nothing written
        mixed_main()
    else:
        main()
