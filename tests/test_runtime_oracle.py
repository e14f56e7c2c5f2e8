"""The runtime's oracle: every plan trains like one process.

For tiny GPT, tiny Llama (HF LlamaForCausalLM) and the tiny residual MLP, and the tiny
mixture-of-experts models (examples/moe.py, HF MixtralForCausalLM) under expert parallelism,
each plan below is forced with Pins, trained for 5 steps on CPU/gloo, and its per-step losses
must match ``runtime.reference`` (one process, fp32) to 1e-4 relative. Plans of one world size
run in ONE torchrun launch (``runtime.worker --plans ...``) to keep the suite within CI's budget.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planner.api import plan as make_plan
from planner.plan import write_plan
from planner.search import Pins
from runtime.launch import torchrun_command, worker_env
from runtime.reference import reference_for_plan

ROOT = Path(__file__).resolve().parent.parent
STEPS = 5
RTOL = 1e-4
MODELS = ("gpt", "llama", "mlp")

# (id, world, pins, models): every model runs every configuration with and without recompute
# (full or selective, alternating over configurations). MESHPLAN_RUNTIME_QUICK=1 runs only the
# models listed (the MLP where its structure adds something; the 8-rank 3-D mesh, the slowest
# launch on two cores, with our GPT: every rank of a Llama plan imports transformers) and the
# recompute twin for one of them: a third less time, for local iteration.
ALL = MODELS
NO_MLP = ("gpt", "llama")
THREE_D = dict(tp=2, dp=2, pp=2, zero=0, schedule="1f1b", micro_batch_size=2)
PP4_V2 = dict(
    tp=1,
    dp=1,
    pp=4,
    zero=0,
    schedule="interleaved_1f1b",
    virtual_stages=2,
    micro_batch_size=2,
    layers=6,
)
CONFIGS: list[tuple[str, int, dict, tuple[str, ...]]] = [
    ("tp2", 2, dict(tp=2, dp=1, pp=1, zero=0, micro_batch_size=4), ALL),
    (
        "tp2-sp",
        2,
        dict(tp=2, dp=1, pp=1, zero=0, micro_batch_size=4, tp_variant="sequence"),
        NO_MLP,
    ),
    ("pp2-gpipe", 2, dict(tp=1, dp=1, pp=2, zero=0, schedule="gpipe", micro_batch_size=2), ALL),
    ("pp2-1f1b", 2, dict(tp=1, dp=1, pp=2, zero=0, schedule="1f1b", micro_batch_size=2), ALL),
    (
        "pp2-interleaved-v2",
        2,
        dict(
            tp=1,
            dp=1,
            pp=2,
            zero=0,
            schedule="interleaved_1f1b",
            virtual_stages=2,
            micro_batch_size=2,
        ),
        ALL,
    ),
    ("dp4", 4, dict(tp=1, dp=4, pp=1, zero=0, micro_batch_size=1), ALL),
    ("zero1-dp4", 4, dict(tp=1, dp=4, pp=1, zero=1, micro_batch_size=1), ALL),
    ("zero2-dp4", 4, dict(tp=1, dp=4, pp=1, zero=2, micro_batch_size=1), ALL),
    ("zero3-dp4", 4, dict(tp=1, dp=4, pp=1, zero=3, micro_batch_size=1), ALL),
    ("tp4", 4, dict(tp=4, dp=1, pp=1, zero=0, micro_batch_size=4), NO_MLP),
    (
        "pp4-gpipe",
        4,
        dict(tp=1, dp=1, pp=4, zero=0, schedule="gpipe", micro_batch_size=2),
        NO_MLP,
    ),
    ("pp4-1f1b", 4, dict(tp=1, dp=1, pp=4, zero=0, schedule="1f1b", micro_batch_size=2), ALL),
    ("dp2xtp2", 4, dict(tp=2, dp=2, pp=1, zero=0, micro_batch_size=2), NO_MLP),
    # Sequence parallel (Megatron-style, torch's SequenceParallel) where a block allows it.
    (
        "dp2xtp2-sp",
        4,
        dict(tp=2, dp=2, pp=1, zero=3, micro_batch_size=2, tp_variant="sequence"),
        NO_MLP,
    ),
    (
        "pp2xdp2",
        4,
        dict(tp=1, dp=2, pp=2, zero=0, schedule="1f1b", micro_batch_size=2),
        ALL,
    ),
    (
        "pp2xtp2",
        4,
        dict(tp=2, dp=1, pp=2, zero=0, schedule="1f1b", micro_batch_size=2),
        NO_MLP,
    ),
    # Interleaved 1F1B over 4 ranks needs 8 blocks: 6-layer tiny models.
    ("pp4-interleaved-v2", 4, PP4_V2, NO_MLP),
    ("pp2xdp2xtp2", 8, THREE_D, ("gpt",)),
]
# Mixture-of-experts (examples/moe.py): expert parallelism alone, beside DP (two copies of each
# expert), under every ZeRO stage, and composed with a pipeline and with TP. Their own models
# list: the dense models have no experts.
EP2 = dict(tp=1, dp=2, pp=1, zero=0, ep=2, micro_batch_size=2)
EP2_DP4 = dict(tp=1, dp=4, pp=1, zero=0, ep=2, micro_batch_size=1)
CP2 = dict(tp=1, dp=1, pp=1, zero=0, cp=2, micro_batch_size=4)
MOE_CONFIGS: list[tuple[str, int, dict, tuple[str, ...]]] = [
    ("ep2", 2, EP2, ("moe",)),
    ("ep2xdp2", 4, EP2_DP4, ("moe",)),
]
# Single extra plans (no recompute twin): (id, model, world, pins).
EXTRA: list[tuple[str, str, int, dict]] = [
    *(
        (
            "zero3-offload-dp4",
            m,
            4,
            dict(tp=1, dp=4, pp=1, zero=3, micro_batch_size=1, offload="optimizer+params"),
        )
        for m in MODELS
    ),
    ("ep2xdp2-zero1", "moe", 4, {**EP2_DP4, "zero": 1}),
    ("ep2xdp2-zero3", "moe", 4, {**EP2_DP4, "zero": 3}),
    ("pp2xep2", "moe", 4, {**EP2, "pp": 2, "schedule": "1f1b"}),
    ("tp2xep2", "moe", 4, {**EP2, "tp": 2}),
    ("ep2", "mixtral", 2, EP2),
    # transformers MoE models beyond Mixtral (tests/models/): shared experts, MLA, grouped top-k
    ("ep2", "qwen2_moe", 2, EP2),
    ("ep2", "deepseek_v3", 2, EP2),
    # Context parallelism (ring attention over sequence chunks) needs fused attention: the
    # HF Llama (SDPA); our GPT's explicit softmax(QK^T)V has no ring to run, the planner
    # refuses --cp for it.
    ("cp2", "llama", 2, CP2),
    ("cp2-full", "llama", 2, {**CP2, "recompute": "full"}),
    ("cp2xdp2-zero3", "llama", 4, {**CP2, "dp": 2, "zero": 3, "micro_batch_size": 2}),
    ("cp2xtp2", "llama", 4, {**CP2, "tp": 2}),
]


def _cases(full: bool) -> list[tuple[str, str, int, dict]]:
    """Every configuration for every model, with and without recompute (``full``); otherwise
    each configuration's listed models without, and one of them (rotating) with."""
    cases = []
    for i, (cid, world, pins, models) in enumerate(CONFIGS + MOE_CONFIGS):
        models = MODELS if full and i < len(CONFIGS) else models
        for j, model in enumerate(models):
            cases.append((f"{model}-{cid}", model, world, {**pins, "recompute": "none"}))
            # Selective recompute only differs from none where attention materialises its
            # scores (our GPT); the planner pins Llama (SDPA) and the MLP to "none" for it.
            rc = "selective" if i % 2 == 1 and model == "gpt" else "full"
            if full or j == i % len(models):
                cases.append((f"{model}-{cid}-{rc}", model, world, {**pins, "recompute": rc}))
    for cid, model, world, pins in EXTRA:
        cases.append((f"{model}-{cid}", model, world, {"recompute": "none", **pins}))
    return cases


CASES = _cases(os.environ.get("MESHPLAN_RUNTIME_QUICK") != "1")


def forced_plan(model: str, world: int, out: Path, layers: int | None = None, **pins) -> Path:
    """A plan.json with the mesh, schedule, ZeRO stage and recompute pinned (fp32, batch 8), of
    the tiny model (with ``layers`` layers when given)."""
    pins.setdefault("offload", "none")
    if pins.get("tp", 1) > 1:
        pins.setdefault("tp_variant", "sharded")
    path = ROOT / "examples" / f"{model}.py"
    if not path.exists():
        path = ROOT / "tests" / "models" / f"{model}.py"
    result = make_plan(
        path,
        world,
        model_args={"size": "tiny", **({"layers": layers} if layers else {})},
        profile="cpu",
        global_batch_size=8,
        dtype="fp32",
        pins=Pins(**pins),
    )
    return write_plan(result.plan, out)


def launch(plans: list[Path], run_dirs: list[Path], world: int, *extra: str) -> tuple[int, str]:
    args = ["--plans", *map(str, plans), "--run-dirs", *map(str, run_dirs), "--steps", str(STEPS)]
    env = worker_env()
    env["MESHPLAN_HANG_TIMEOUT_S"] = "240"  # a hung collective fails the test, not CI
    proc = subprocess.run(
        torchrun_command(world, [*args, *extra]),
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    return proc.returncode, proc.stdout + proc.stderr


def losses_of(run_dir: Path) -> list[float]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["loss"] for line in path.read_text().splitlines()]


def ref_key(model: str, plan: dict) -> str:
    """Plans of one model, arguments and micro-batch size share one one-process reference."""
    args = json.dumps(plan["model"].get("args", {}), sort_keys=True)
    return f"{model}-{args}-{plan['micro_batch_size']}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Every case planned, then one torchrun launch per world size."""
    os.environ.setdefault("MESHPLAN_CACHE", str(tmp_path_factory.mktemp("cache")))
    base = tmp_path_factory.mktemp("oracle")
    by_world: dict[int, list[tuple[str, Path, Path]]] = {}
    for cid, model, world, pins in CASES:
        run_dir = base / cid
        path = forced_plan(model, world, run_dir, **pins)
        by_world.setdefault(world, []).append((cid, path, run_dir))
    logs, walls = {}, {}
    for world, items in sorted(by_world.items()):
        t0 = time.perf_counter()
        rc, log = launch([p for _, p, _ in items], [d for _, _, d in items], world)
        walls[world] = time.perf_counter() - t0
        (base / f"launch-world{world}.log").write_text(log)
        for cid, _, _ in items:
            logs[cid] = (rc, log)
    print(f"\nruntime oracle launches (world: seconds): {walls}", file=sys.stderr)
    refs: dict[str, list[float]] = {}
    for cid, model, _, _ in CASES:
        plan = json.loads((base / cid / "plan.json").read_text())
        key = ref_key(model, plan)
        if key not in refs:
            refs[key] = reference_for_plan(plan, STEPS)
    return {"base": base, "logs": logs, "refs": refs}


@pytest.mark.parametrize("cid,model,world,pins", CASES, ids=[c[0] for c in CASES])
def test_plan_matches_one_process(runs, cid, model, world, pins):
    run_dir = runs["base"] / cid
    plan = json.loads((run_dir / "plan.json").read_text())
    want = {k: pins.get(k, 1) for k in ("pp", "dp", "tp", "ep", "cp")}
    assert plan["mesh"] == want
    assert pins["recompute"] in {b["recompute"] for b in plan["blocks"]}
    if pins.get("tp_variant") == "sequence" and model in ("gpt", "llama"):
        assert any("sp_block" in b["tp_plan"].values() for b in plan["blocks"])
    got = losses_of(run_dir)
    rc, log = runs["logs"][cid]
    assert len(got) == STEPS, f"{cid}: no metrics (torchrun exit {rc})\n{log[-6000:]}"
    want = runs["refs"][ref_key(model, plan)]
    for step, (g, w) in enumerate(zip(got, want), start=1):
        assert abs(g - w) <= RTOL * abs(w), f"{cid} step {step}: {g} vs one-process {w}"
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for r in records:
        assert r["step_time_s"] > 0
        assert len(r["peak_memory_bytes"]) == world
        assert all(m > 0 for m in r["peak_memory_bytes"])
