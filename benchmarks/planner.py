"""The plan meshplan picks against the plans people write by hand, all scored by one cost model.

    python -u benchmarks/planner.py            # writes reports/planner/planner.{json,md,png}
    python benchmarks/planner.py --render      # redraws .md and .png from planner.json

Six cases on H100 SXM (profiles/h100-sxm.toml): GPT 1.3B on 8 GPUs, Llama-3-70B on 64,
GPT-3 175B on 1024, Llama-3-405B on 8192, a Mixtral-8x7B-shaped MoE (examples/moe.py) on 64
and Llama-3-8B with 131,072-token sequences on 8. For each, the predicted step time, MFU and
peak memory per device of:

- meshplan: ``planner.api.plan`` with nothing pinned;
- pure data parallel (tp 1, pp 1, ZeRO-0) and FSDP (tp 1, pp 1, ZeRO-3), recompute and offload
  left to the solver: solved again here (to report their recompute and offload choices, and
  why a baseline cannot be formed at all) and checked against the same baselines that
  ``planner.api`` puts in ``plan["solver"]["alternatives"]``;
- Megatron's rule (Narayanan et al. 2021, Sec. 3.3): tensor parallel 8 within a node (every
  block that can be sharded is), the fewest pipeline stages (a divisor of the node count) with
  which the model fits, data parallel over the rest with the distributed optimizer (ZeRO-1),
  full recompute, no offload; micro-batch size and schedule left to the solver;
- the best plan without offload (``Pins(offload="none")``), to show what offload buys.

A configuration that does not fit in memory is reported as such, with the memory it would need
(the fastest solved candidate's peak, or the lower bound of model states when none was solved).
Every score comes from the same cost model (planner/costmodel.py), so this compares choices, not
cost models; docs and README may quote reports/planner/planner.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

# This file is named like the package: run as a script, its folder comes first on sys.path and
# ``import planner`` would find this file. Put the repository root there instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from planner.api import PlanResult, plan, variants_for  # noqa: E402
from planner.errors import MeshplanError  # noqa: E402
from planner.search import Candidate, Pins, search  # noqa: E402
from planner.search.candidates import divisors  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "reports" / "planner"
PROFILE = "h100-sxm"
CASES = [  # (label, model file, model args, GPUs, global batch size in sequences)
    ("GPT 1.3B / 8", "examples/gpt.py", {"size": "1.3b"}, 8, 512),
    ("Llama-3-70B / 64", "examples/llama.py", {"size": "llama3-70b"}, 64, 1024),
    ("GPT-3 175B / 1024", "examples/gpt.py", {"size": "gpt3-175b"}, 1024, 1536),
    ("Llama-3-405B / 8192", "examples/llama.py", {"size": "llama3-405b"}, 8192, 2048),
    # mixture of experts: expert parallelism; 128K-token sequences: context parallelism
    ("Mixtral-8x7B / 64", "examples/moe.py", {"size": "mixtral-8x7b"}, 64, 256),
    ("Llama-3-8B 128K / 8", "examples/llama.py", {"size": "llama3-8b", "seq_len": 131072}, 8, 8),
]
STRATEGIES = ("meshplan", "pure DP", "FSDP (ZeRO-3)", "Megatron rule", "best without offload")
# planner.api's own baselines in plan["solver"]["alternatives"], used to cross-check ours
API_BASELINES = {"pure DP": "pure data parallel", "FSDP (ZeRO-3)": "FSDP (ZeRO-3)"}
GIB = 2**30
_t0 = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - _t0:7.1f} s] {message}", flush=True)


def row_from_plan(doc: dict[str, Any]) -> dict[str, Any]:
    pred = doc["predicted"]
    mesh = doc["mesh"]
    offload = sorted({b["offload"] for b in doc["blocks"]} - {"none"})
    recompute = sorted({b["recompute"] for b in doc["blocks"]})
    extra = "".join(f" {k}{mesh[k]}" for k in ("ep", "cp") if mesh.get(k, 1) > 1)
    label = (
        f"pp{mesh['pp']} dp{mesh['dp']}{extra} tp{mesh['tp']}, mbs {doc['micro_batch_size']}, "
        f"{doc['schedule'] if mesh['pp'] > 1 else 'no pipeline'}"
        + (f" x{doc['virtual_stages']}" if doc["virtual_stages"] > 1 else "")
        + f", ZeRO-{doc['zero_stage']}, recompute {'+'.join(recompute)}"
        + (f", offload {'+'.join(offload)}" if offload else "")
    )
    return {
        "fits": True,
        "config": label,
        "tp": mesh["tp"],
        "step_time_s": pred["step_time_s"],
        "mfu": pred["mfu"],
        "peak_memory_bytes": pred["peak_memory_bytes"],
        "capacity_bytes": pred["capacity_bytes"],
        "offload": bool(offload),
        "terms": step_terms(pred),
    }


def row_from_candidate(c: Candidate | None, res=None, note: str = "") -> dict[str, Any]:
    """A solved candidate's scores; its recompute and offload choices read from ``res``."""
    if c is None or c.cost is None:
        return {
            "fits": False,
            "config": note or "nothing forms",
            "step_time_s": None,
            "mfu": None,
            "peak_memory_bytes": None,
        }
    cost = c.cost
    label = c.label()
    if res is not None and c.config is not None:
        opts = res.inputs[c.key].options
        chosen = [opts[i][k] for i, k in enumerate(c.config.choice)]
        label += ", recompute " + "+".join(sorted({o.recompute for o in chosen}))
        offload = sorted({o.offload for o in chosen} - {"none"})
        if offload:
            label += ", offload " + "+".join(offload)
    return {
        "fits": bool(cost.feasible),
        "config": label + (f"; {note}" if note else ""),
        "tp": c.tp,
        "step_time_s": cost.step_time_s,
        "mfu": cost.mfu,
        "peak_memory_bytes": cost.peak_memory_bytes,
        "capacity_bytes": cost.capacity_bytes,
        "terms": step_terms(vars(cost)),
    }


# The step's terms, as evaluate() splits them: what a slower strategy spends more time on.
COMPUTE = "compute (with recompute) and TP communication"
TERMS = {
    COMPUTE: lambda t: t["pipeline_s"] - t["bubble_s"],
    "pipeline bubble": lambda t: t["bubble_s"],
    "exposed data-parallel communication": lambda t: t["dp_exposed_s"],
    "optimizer step": lambda t: t["optimizer_s"],
    "offload traffic": lambda t: t["offload_s"],
}


def step_terms(values: dict[str, Any]) -> dict[str, float]:
    return {name: float(f(values)) for name, f in TERMS.items()}


def versus(row: dict[str, Any], best: dict[str, Any]) -> str:
    """How much slower than meshplan's plan a strategy is, and the term that differs most."""
    if not row.get("fits") or not best.get("fits") or "terms" not in row or "terms" not in best:
        return "-"
    ratio = row["step_time_s"] / best["step_time_s"]
    if abs(ratio - 1) < 1e-3:
        return "same step time"
    gaps = {k: row["terms"][k] - best["terms"].get(k, 0.0) for k in row["terms"]}
    term = max(gaps, key=lambda k: gaps[k] if ratio > 1 else -gaps[k])
    if term == COMPUTE and not any(r.get("tp", 1) > 1 for r in (row, best)):
        term = "compute (with recompute)"  # no TP in either: nothing to communicate
    return f"{ratio:.2f}x meshplan's step; most of the difference: {term}"


def best_of(res) -> Candidate | None:
    """The chosen candidate, or (nothing fits) the fastest solved one, to show what it needs."""
    if res.best is not None:
        return res.best
    solved = [c for c in res.candidates if c.status == "solved" and c.cost is not None]
    return min(solved, key=lambda c: c.cost.step_time_s, default=None)


def solve_pinned(result: PlanResult, pins: Pins, variants_of) -> tuple[dict[str, Any], Any]:
    """The best plan under ``pins`` as a table row; when none fits, what the closest needs."""
    traced = result.traced
    try:
        res = search(
            traced.graph, traced.blocks, result.cluster, result.training, pins, variants_of
        )
    except MeshplanError as exc:  # no candidate forms (e.g. batch smaller than the ranks)
        gbs, why = result.training.global_batch_size, str(exc)
        if pins.tp and pins.pp:
            dp = result.cluster.gpus // (pins.tp * pins.pp)
            if gbs % dp:
                why = f"the global batch {gbs} does not split over {dp} data-parallel ranks"
        return {
            "fits": False,
            "config": f"cannot be formed: {why}",
            "step_time_s": None,
            "mfu": None,
            "peak_memory_bytes": None,
        }, None
    found = best_of(res)
    if found is not None:
        return row_from_candidate(found, res), res
    need = min(c.min_memory for c in res.candidates)
    capacity = result.cluster.profile.memory_bytes * pins.memory_fraction
    why = (
        "model states alone exceed memory on every shape"
        if need > capacity
        else "no placement fits its activations in memory on any shape"
    )
    return {
        "fits": False,
        "config": why,
        "step_time_s": None,
        "mfu": None,
        "peak_memory_bytes": need if need > capacity else None,
    }, res


def megatron(result: PlanResult, variants_of) -> dict[str, Any]:
    """TP 8 in the node, the fewest pipeline stages (dividing the node count) that fit, ZeRO-1
    data parallel, full recompute, no offload."""
    cluster, traced = result.cluster, result.traced
    tp = min(8, cluster.gpus_per_node)
    last: dict[str, Any] | None = None
    for pp in divisors(cluster.nodes):
        if pp > len(traced.blocks):
            break
        dp = cluster.gpus // (tp * pp)
        pins = Pins(
            tp=tp,
            pp=pp,
            zero=1 if dp > 1 else 0,
            recompute="full",
            offload="none",
            tp_variant="sharded",
            ep=1,
            cp=1,
        )
        row, _ = solve_pinned(result, pins, variants_of)
        if row["fits"]:
            if pp > 1:
                row["config"] += "; fewest stages that fit"
            return row
        if row["step_time_s"] is not None or last is None:
            last = row
    assert last is not None
    last["config"] += "; no pipeline depth fits"
    return last


def run_case(label: str, path: str, args: dict, gpus: int, gbs: int) -> dict[str, Any]:
    start = time.perf_counter()
    log(f"{label}: tracing and planning")
    result = plan(ROOT / path, gpus, model_args=args, global_batch_size=gbs, profile=PROFILE)
    plan_s = time.perf_counter() - start
    doc = result.plan.to_dict()
    cached = "cached trace" if result.traced.from_cache else "cold trace"
    log(f"{label}: planned in {plan_s:.1f} s ({cached})")
    rows: dict[str, dict[str, Any]] = {"meshplan": row_from_plan(doc)}
    auto = variants_for(result.traced.graph, result.cluster, "auto")
    alts = {a.get("baseline"): a for a in doc["solver"]["alternatives"] if a.get("baseline")}
    for name, pins in (
        # by hand: every expert and every whole sequence on each data-parallel rank
        ("pure DP", Pins(tp=1, pp=1, zero=0, ep=1, cp=1)),
        ("FSDP (ZeRO-3)", Pins(tp=1, pp=1, zero=3, ep=1, cp=1)),
    ):
        t = time.perf_counter()
        rows[name], _ = solve_pinned(result, pins, auto)
        api = alts.get(API_BASELINES[name])
        if api is not None and api["step_time_s"] != rows[name]["step_time_s"]:
            if not math.isclose(api["step_time_s"], rows[name]["step_time_s"] or 0, rel_tol=1e-9):
                log(f"{label}: warning: {name} differs from planner.api's baseline {api}")
        log(f"{label}: {name} scored in {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    rows["Megatron rule"] = megatron(
        result, variants_for(result.traced.graph, result.cluster, "sharded")
    )
    log(f"{label}: Megatron rule scored in {time.perf_counter() - t:.1f} s")
    for name in ("pure DP", "FSDP (ZeRO-3)", "Megatron rule"):
        rows[name]["vs_meshplan"] = versus(rows[name], rows["meshplan"])
    if not rows["meshplan"]["offload"]:
        rows["best without offload"] = {**rows["meshplan"], "config": "same as meshplan's plan"}
    else:
        t = time.perf_counter()
        rows["best without offload"], _ = solve_pinned(result, Pins(offload="none"), auto)
        log(f"{label}: best without offload in {time.perf_counter() - t:.1f} s")
    return {
        "case": label,
        "model": path,
        "args": args,
        "gpus": gpus,
        "global_batch_size": gbs,
        "profile": PROFILE,
        "params": result.traced.params,
        "capacity_bytes": doc["predicted"]["capacity_bytes"],
        "plan_s": round(plan_s, 1),
        "total_s": round(time.perf_counter() - start, 1),
        "trace_cached": result.traced.from_cache,
        "strategies": rows,
    }


# --------------------------------------------------------------------------- output


def fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.0f} ms"


def markdown(cases: list[dict[str, Any]]) -> str:
    lines = [
        "| case | strategy | configuration | step time | MFU | peak memory / GPU | vs meshplan |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for case in cases:
        cap = case["capacity_bytes"] / GIB
        for name in STRATEGIES:
            r = case["strategies"][name]
            mem = r["peak_memory_bytes"]
            mem_text = "-" if mem is None else f"{mem / GIB:.1f} GiB"
            if r["fits"]:
                time_text, mfu_text = fmt_time(r["step_time_s"]), f"{r['mfu']:.1%}"
            elif r["config"].startswith("cannot be formed"):
                time_text, mfu_text = "cannot form", "-"
            else:
                time_text, mfu_text = "does not fit", "-"
                if mem is not None:
                    bound = "≥ " if r["step_time_s"] is None else ""
                    mem_text = f"{bound}{mem / GIB:.1f} GiB (> {cap:.0f})"
            vs = r.get("vs_meshplan", "-") if name != "meshplan" else "-"
            cells = (case["case"], name, r["config"], time_text, mfu_text, mem_text, vs)
            lines.append("| " + " | ".join(cells) + " |")
    notes = [
        "",
        f"Profile `{PROFILE}`; global batch (sequences): "
        + ", ".join(f"{c['case']}: {c['global_batch_size']}" for c in cases)
        + ". All rows scored by meshplan's cost model. Time of `plan` on the 2-core "
        "development machine: "
        + ", ".join(
            f"{c['case']}: {c['plan_s']:.0f} s"
            + (" (trace from cache)" if c["trace_cached"] else " (cold trace included)")
            for c in cases
        )
        + ".",
    ]
    return "\n".join(lines + notes) + "\n"


def figure(cases: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = ["#2b6cb0", "#a0aec0", "#718096", "#dd6b20", "#38a169"]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True)
    width = 0.16
    cap = cases[0]["capacity_bytes"] / GIB
    top = 1.6 * cap  # bars above are clipped and labelled with their value
    for i, name in enumerate(STRATEGIES):
        for j, case in enumerate(cases):
            r = case["strategies"][name]
            x = j + (i - 2) * width
            if r["fits"]:
                ax1.bar(x, 100 * r["mfu"], width, color=colors[i], label=name if j == 0 else None)
                ax1.text(x, 100 * r["mfu"] + 0.5, f"{100 * r['mfu']:.0f}", ha="center", fontsize=7)
            else:
                ax1.bar(x, 0, width, color=colors[i], label=name if j == 0 else None)
                text = "n/a" if r["config"].startswith("cannot be formed") else "no fit"
                ax1.text(x, 0.5, text, ha="center", rotation=90, fontsize=7, color="#c53030")
            mem = r["peak_memory_bytes"]
            if mem is not None:
                shown = min(mem / GIB, top)
                edge = "#c53030" if not r["fits"] else colors[i]
                ax2.bar(
                    x,
                    shown,
                    width,
                    color=colors[i],
                    hatch=None if r["fits"] else "//",
                    edgecolor=edge,
                )
                if mem / GIB > top:
                    ax2.text(
                        x,
                        top * 0.97,
                        f"{mem / GIB:.0f}",
                        ha="center",
                        va="top",
                        rotation=90,
                        fontsize=7,
                        color="#c53030",
                    )
    ax2.axhline(cap, color="#c53030", lw=1, ls="--")
    ax2.text(
        len(cases) - 0.55,
        cap * 1.03,
        f"{cap:.0f} GiB capacity",
        color="#c53030",
        fontsize=8,
        ha="right",
    )
    ax2.set_ylim(0, top)
    ax1.set_ylabel("predicted MFU (%)")
    ax1.set_title(f"meshplan vs hand-written plans, one cost model ({PROFILE})")
    ax1.legend(fontsize=8, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.02), frameon=False)
    ax2.set_ylabel("peak memory per GPU (GiB)")
    ax2.set_xticks(range(len(cases)), [c["case"] for c in cases])
    ax2.set_xlabel(
        "hatched: does not fit (at least this much memory needed); n/a: cannot be formed"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument(
        "--render", action="store_true", help="redraw the table and figure from planner.json"
    )
    render = parser.parse_args().render  # anything else: argparse's one-line error
    OUT.mkdir(parents=True, exist_ok=True)
    if render:
        cases = json.loads((OUT / "planner.json").read_text())
    else:
        only = os.environ.get("PLANNER_BENCH_CASES")  # e.g. "0,1" to rerun a subset
        picked = [CASES[int(i)] for i in only.split(",")] if only else CASES
        cases = []
        for case in picked:
            cases.append(run_case(*case))
            (OUT / "planner.json").write_text(json.dumps(cases, indent=2, default=_json) + "\n")
    md = markdown(cases)
    (OUT / "planner.md").write_text(md)
    figure(cases, OUT / "planner.png")
    print(md)
    names = ("planner.json", "planner.md", "planner.png")
    log("wrote " + ", ".join(str((OUT / n).relative_to(ROOT)) for n in names))


def _json(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return str(x)


if __name__ == "__main__":
    main()
