"""Helpers of the tests that launch plans: a plan with everything pinned, one torchrun launch
for a batch of plans, and what a run wrote."""

from __future__ import annotations

import json
from pathlib import Path

import forked_ranks

from planner.api import plan as make_plan
from planner.schema import write_plan
from planner.search import Pins
from runtime.launch import torchrun_command, worker_env

ROOT = Path(__file__).resolve().parent.parent
SOLVED: dict = {}  # planner.api.plan's sharding solutions, by traced model, for every forced plan


def cpu_profile(tmp: Path, name: str, peak_flops_fp32: str = "", capacity_bytes: int = 0) -> str:
    """profiles/cpu.toml as a kind of its own, ``name``, with another fp32 peak and memory
    where given (the shipped 1.0e11 FLOP/s and 8 GiB otherwise); the path of its copy."""
    text = (ROOT / "profiles" / "cpu.toml").read_text()
    edits = [('name = "cpu"', f'name = "{name}"')]
    if peak_flops_fp32:
        edits.append(("peak_flops_fp32 = 1.0e11", f"peak_flops_fp32 = {peak_flops_fp32}"))
    if capacity_bytes:
        edits.append(("capacity_bytes = 8589934592", f"capacity_bytes = {capacity_bytes}"))
    for old, new in edits:
        assert old in text, f"profiles/cpu.toml no longer has {old!r}"
        text = text.replace(old, new, 1)
    path = tmp / f"{name}.toml"
    path.write_text(text)
    return str(path)


def model_path(model: str) -> Path:
    """examples/<model>.py, else tests/models/<model>.py (models no one here tuned for)."""
    path = ROOT / "examples" / f"{model}.py"
    return path if path.exists() else ROOT / "tests" / "models" / f"{model}.py"


def forced_plan(
    model: str | Path,
    world: int,
    out: Path,
    layers: int | None = None,
    optimizer: str | None = None,
    lr: float | None = None,
    model_args: dict | None = None,
    **pins,
) -> Path:
    """A plan.json with the mesh, schedule, ZeRO stage and recompute pinned (fp32, batch 8), of
    the tiny model (with ``layers`` layers when given; ``model`` a name or a model file's path,
    ``model_args`` more arguments for its build_model). Planned without baselines, and with
    the sharding solutions of the session's earlier plans of the model (``SOLVED``)."""
    pins.setdefault("offload", "none")
    if pins.get("tp", 1) > 1:
        pins.setdefault("tp_variant", "sharded")
    result = make_plan(
        model if isinstance(model, Path) else model_path(model),
        world,
        model_args={"size": "tiny", **(model_args or {}), **({"layers": layers} if layers else {})},
        profile="cpu",
        global_batch_size=8,
        dtype="fp32",
        optimizer=optimizer,
        lr=lr,
        pins=Pins(**pins),
        compare_baselines=False,  # the runs need the plan alone
        solved=SOLVED,
    )
    return write_plan(result.plan, out)


def launch(
    plans: list[Path],
    run_dirs: list[Path],
    world: int,
    *extra: str,
    steps: int = 5,
    timeout: int = 400,
) -> tuple[int, str]:
    """One torchrun launch training each plan in turn, its ranks forked from the session's
    pre-imported process (tests/forked_ranks.py); (exit status, everything printed)."""
    args = ["--plans", *map(str, plans), "--run-dirs", *map(str, run_dirs), "--steps", str(steps)]
    args += ["--hang-timeout", "240"]  # a hung collective fails the test, not CI
    env = worker_env()
    proc = forked_ranks.run(
        torchrun_command(world, [*args, *extra]),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc.returncode, proc.stdout + proc.stderr


def losses_of(run_dir: Path) -> list[float]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["loss"] for line in path.read_text().splitlines()]


def selected(request, name: str, kind: type) -> set[str]:
    """The ids of the ``kind`` parameters (named ``name``) of the tests this session runs, so
    that a session fixture launches only the plans ``-k`` selects."""
    return {
        item.callspec.params[name].id
        for item in request.session.items
        if getattr(item, "callspec", None) and isinstance(item.callspec.params.get(name), kind)
    }
