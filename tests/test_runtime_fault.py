"""A rank killed with SIGKILL mid-run: torchrun restarts the workers, they resume from the last
complete checkpoint, and the run ends exactly where an uninterrupted one does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from runs import forced_plan
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from planner.api import plan as make_plan
from planner.schema import write_plan
from planner.search import Pins
from runtime.launch import worker_env

pytestmark = pytest.mark.distributed  # every test here launches processes

STEPS = 8
EVERY = 2


def plan_run(plan: Path, run_dir: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "meshplan", "run", str(plan), "--steps", str(STEPS)]
    cmd += ["--device", "cpu", "--checkpoint-every", str(EVERY), "--run-dir", str(run_dir)]
    cmd += ["--hang-timeout", "240"]
    return subprocess.Popen(
        [*cmd, *extra],
        env={**worker_env(), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def steps_logged(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line being written
    return out


def worker_pids(run_dir: Path) -> list[int]:
    """The runtime.worker processes training into ``run_dir`` (read from /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        launcher = b"torch.distributed.run" in argv  # torchrun names the worker module too
        if b"runtime.worker" in argv and str(run_dir).encode() in argv and not launcher:
            pids.append(int(entry.name))
    return sorted(pids)


def final_state(run_dir: Path, tmp: Path) -> dict:
    """The last checkpoint as one plain state dict (DCP converted offline, no process group)."""
    out = tmp / f"{run_dir.name}.pt"
    dcp_to_torch_save(run_dir / "checkpoints" / f"step_{STEPS:06d}", out)
    return torch.load(out, weights_only=False)


def assert_same(a, b, where: str = "") -> None:
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


@pytest.mark.long  # two torchrun launches and a restart: with the long matrix in CI
def test_sigkill_of_one_rank_restarts_and_ends_identical(tmp_path):
    # paced_gpt makes each step's batch in 0.4 s, so that the kill lands mid-run
    plan = forced_plan(
        "paced_gpt", 2, tmp_path / "plan", tp=1, dp=2, pp=1, zero=3, micro_batch_size=2,
        recompute="none",
    )  # fmt: skip
    clean = plan_run(plan, tmp_path / "clean")
    clean_log, _ = clean.communicate(timeout=400)
    assert clean.returncode == 0, clean_log

    faulty_dir = tmp_path / "faulty"
    faulty = plan_run(plan, faulty_dir, "--max-restarts", "2")
    deadline = time.monotonic() + 300
    killed = None
    while time.monotonic() < deadline and faulty.poll() is None:
        if any(r["step"] >= 3 for r in steps_logged(faulty_dir)):
            pids = worker_pids(faulty_dir)
            if len(pids) == 2:
                killed = pids[-1]
                os.kill(killed, signal.SIGKILL)
                break
        time.sleep(0.05)
    assert killed is not None, "the run ended before a rank could be killed"
    killed_at = max(r["step"] for r in steps_logged(faulty_dir))
    assert killed_at < STEPS
    log, _ = faulty.communicate(timeout=400)
    assert faulty.returncode == 0, log
    assert "resuming from" in log, log

    clean_steps = steps_logged(tmp_path / "clean")
    faulty_steps = steps_logged(faulty_dir)
    assert [r["step"] for r in faulty_steps] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in faulty_steps] == [r["loss"] for r in clean_steps]
    assert_same(final_state(tmp_path / "clean", tmp_path), final_state(faulty_dir, tmp_path))


DIVERGING = """
import torch
from torch import nn

TRAINING = {"global_batch_size": 8, "optimizer": "adamw", "dtype": "fp32", "lr": 1e-3}


def build_model():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def make_batch(batch_size, step=0):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(batch_size, 8, generator=g)
    if step >= 3:
        x = x * float("nan")
    return x, torch.randint(0, 4, (batch_size,), generator=g)
"""


def test_a_diverged_loss_stops_once_and_keeps_the_last_good_checkpoint(tmp_path):
    model = tmp_path / "diverging.py"
    model.write_text(DIVERGING)
    result = make_plan(model, 2, profile="cpu", pins=Pins(dp=2, tp=1, pp=1, zero=0))
    plan = write_plan(result.plan, tmp_path / "plan")
    run = plan_run(plan, tmp_path / "run", "--max-restarts", "2")
    log, _ = run.communicate(timeout=400)
    assert run.returncode == 3, log
    errors = [line for line in log.splitlines() if "error:" in line]
    assert len(errors) == 1 and "at step 3" in errors[0], log
    assert "resuming from" not in log  # a deliberate stop is not retried
    assert [r["step"] for r in steps_logged(tmp_path / "run")] == [1, 2]
    assert (tmp_path / "run" / "checkpoints" / "step_000002").is_dir()
