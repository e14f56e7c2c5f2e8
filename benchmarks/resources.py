"""Which GPUs, and how many, should train a model on its published token budget?

    python benchmarks/resources.py      # writes reports/benchmarks/resources.{json,md} and
                                        # resources-<model>.png

Three models at their published budgets, each over the cloud price list
profiles/pools/cloud.toml (8-GPU nodes of A100 80GB, H100 SXM and H200 at the on-demand prices,
power figures and sources in that file), with each kind's availability raised from the file's 8
nodes to 256 (2,048 GPUs of each kind: this benchmark's figure, so that the 70B and 175B runs
have counts that finish within a year; every other figure is the file's):

  Llama-3-8B   examples/llama.py size llama3-8b, 15T tokens ("over 15T tokens", Dubey et al.
               2024), 512 sequences of 8192 per step (4.2M tokens; the Llama 3 report's 405B run
               starts at 4M tokens per batch)
  Llama-3-70B  size llama3-70b, the same 15T tokens and batch
  GPT-3 175B   examples/gpt.py size gpt3-175b, 300B tokens (Brown et al. 2020, every GPT-3
               model), 1536 sequences of 2048 per step (3.2M tokens, their Table 2.1)

For each, meshplan's choice by cost within a one-year deadline and a budget (both this
benchmark's figures; each budget was set after a first run, so that some H200 option fits
it), and its choice by carbon within the same limits, are set against

  (a) the newest GPU (H200) at as many nodes as the budget allows (Megatron's rule: the newest
      device, as many as one can pay for), and
  (b) the fastest plan on everything available (the option with the least time, any kind,
      whatever it costs).

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
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the package, not benchmarks/planner.py beside this script

from planner.resources.choose import choose, evaluate, pareto, plan_option  # noqa: E402
from planner.resources.figure import draw_front  # noqa: E402
from planner.resources.pool import load_pool  # noqa: E402

NODES_PER_KIND = 256
DEADLINE_H = 365 * 24.0
NEWEST = "h200"
GLOBAL_BATCH = 512  # the --mixed runs' Llama-3-8B batch


@dataclasses.dataclass(frozen=True)
class Job:
    name: str
    model_file: str
    size: str
    tokens: int
    global_batch: int
    budget_usd: float


JOBS = (
    Job("Llama-3-8B", "examples/llama.py", "llama3-8b", 15 * 10**12, 512, 2_500_000.0),
    Job("Llama-3-70B", "examples/llama.py", "llama3-70b", 15 * 10**12, 512, 20_000_000.0),
    Job("GPT-3 175B", "examples/gpt.py", "gpt3-175b", 300 * 10**9, 1536, 1_000_000.0),
)


def _figures(o) -> dict:
    """One option's plan and run, None where nothing fits."""
    p, r = o.point, o.run
    return {
        "option": o.label,
        "gpus": o.gpus,
        "mesh": p.mesh if p else None,
        "step_time_s": p.step_time_s if p else None,
        "mfu": p.mfu if p else None,
        "busy": p.busy if p else None,
        "days": r.wall_h / 24 if r else None,
        "usd": r.cost_usd if r else None,
        "mwh": r.energy_kwh / 1000 if r else None,
        "tco2": r.carbon_kg / 1000 if r else None,
    }


def _row(role: str, o) -> dict:
    return {"role": role, **_figures(o)}


def run_job(job: Job, pool, out: Path) -> dict:
    """Plan every option of the pool for one model and compare the three choices."""
    from planner.modelfile import load_model_file

    mf = load_model_file(ROOT / job.model_file, {"size": job.size})
    planner = plan_option(mf, {"global_batch_size": job.global_batch})
    start = time.perf_counter()
    options = evaluate(
        pool,
        planner,
        tokens=job.tokens,
        progress=lambda s: print(f"{job.name}: planning {s}", flush=True),
    )
    elapsed = time.perf_counter() - start
    chosen = choose(options, "cost", deadline_h=DEADLINE_H, budget_usd=job.budget_usd)
    greenest = choose(options, "carbon", deadline_h=DEADLINE_H, budget_usd=job.budget_usd)
    newest = [o for o in options if o.node.name == NEWEST and o.run]
    in_budget = [o for o in newest if o.run.cost_usd <= job.budget_usd]
    if not in_budget:
        raise SystemExit(
            f"{job.name}: no {NEWEST} option fits ${job.budget_usd:,.0f}: (a) is empty"
        )
    a = max(in_budget, key=lambda o: o.nodes)
    b = min((o for o in options if o.run), key=lambda o: (o.run.wall_s, o.run.cost_usd))
    slug = job.size.replace(".", "")
    draw_front(options, chosen, pareto(options), out / f"resources-{slug}.png")
    return {
        "model": job.name,
        "tokens": job.tokens,
        "global_batch": job.global_batch,
        "budget_usd": job.budget_usd,
        "deadline_days": DEADLINE_H / 24,
        "planning_s": round(elapsed, 1),
        "figure": f"reports/benchmarks/resources-{slug}.png",
        "compare": [
            _row(f"meshplan (cost, 1 year, ${job.budget_usd / 1e6:g}M)", chosen),
            _row("(a) newest GPU, most nodes in budget", a),
            _row("(b) fastest plan", b),
            _row("meshplan (carbon, same limits)", greenest),
        ],
        "options": [{**_figures(o), "why_not": o.why_not} for o in options],
    }


def _saving(m: dict, r: dict) -> str:
    return (
        f"{m['role']} vs {r['role']} ({r['option']}): ${m['usd'] - r['usd']:+,.0f} "
        f"({m['usd'] / r['usd'] - 1:+.0%}), {m['mwh'] - r['mwh']:+,.0f} MWh "
        f"({m['mwh'] / r['mwh'] - 1:+.0%}), {m['tco2'] - r['tco2']:+,.0f} tCO2, "
        f"{m['days'] - r['days']:+,.0f} days."
    )


def main() -> None:
    base = load_pool(ROOT / "profiles/pools/cloud.toml")
    pool = dataclasses.replace(
        base,
        node_types=tuple(dataclasses.replace(n, nodes=NODES_PER_KIND) for n in base.node_types),
    )
    out = ROOT / "reports/benchmarks"
    out.mkdir(parents=True, exist_ok=True)
    results = [run_job(job, pool, out) for job in JOBS]
    (out / "resources.json").write_text(
        json.dumps({"nodes_per_kind": NODES_PER_KIND, "jobs": results}, indent=2) + "\n"
    )
    lines = [
        "| model | | option | GPUs | mesh | step s | MFU | days | $ | MWh | tCO2 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        for r in res["compare"]:
            lines.append(
                f"| {res['model']} | {r['role']} | {r['option']} | {r['gpus']} | {r['mesh']} "
                f"| {r['step_time_s']:.2f} | {r['mfu']:.3f} | {r['days']:,.0f} | {r['usd']:,.0f} "
                f"| {r['mwh']:,.0f} | {r['tco2']:,.0f} |"
            )
    for res in results:
        m, a, b, green = res["compare"]
        lines.append(
            f"\n{res['model']} ({res['planning_s']:.0f} s to plan {len(res['options'])} options):"
        )
        lines += [f"- {_saving(mine, r)}" for mine in (m, green) for r in (a, b)]
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
        description="Which GPUs, and how many, should train Llama-3-8B, Llama-3-70B and GPT-3 175B"
    )
    parser.add_argument(
        "--mixed", action="store_true", help="heterogeneous jobs: resources_mixed.{json,md}"
    )
    if parser.parse_args().mixed:  # anything else: argparse's one-line error, nothing written
        mixed_main()
    else:
        main()
