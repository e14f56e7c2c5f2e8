"""Pipeline buffers as the runtime holds them, counted on gloo against the cost model's
``held_boundaries``: torch's stage keeps a receive buffer per micro-batch each way, so what it
holds grows with m; with ``runtime.pipeline_buffers.release_consumed_buffers`` (what meshplan's
runtime runs) a stage holds its in-flight outputs and one buffer each way whatever m, and
trains the same losses."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import forked_ranks
import pytest

from planner.cost.memory import held_boundaries
from planner.cost.pipeline import chunk_held
from planner.vocab import Schedule
from runtime.launch import worker_env

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "pipeline_buffers.py"


def counted(m: int, release: bool) -> dict[int, dict]:
    env = {**worker_env(), "M": str(m), "RELEASE": "1" if release else "0"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += [str(SCRIPT)]
    proc = forked_ranks.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = json.loads([x for x in proc.stdout.splitlines() if x.startswith("[")][-1])
    return {r["rank"]: r for r in rows}


@pytest.mark.parametrize("m", [4, 8])
def test_stage_holds_what_the_cost_model_prices(m):
    sender = chunk_held(Schedule.ONE_F_ONE_B, m, 2, 1, 0)  # stage 0's in-flight outputs
    receiver = chunk_held(Schedule.ONE_F_ONE_B, m, 2, 1, 1)  # stage 1's in-flight inputs
    runs = {release: counted(m, release) for release in (False, True)}
    for release, found in runs.items():
        assert found[0]["held"] == held_boundaries(m, sender, False, True, release)
        assert found[1]["held"] - receiver == held_boundaries(m, receiver, True, False, release)
    assert runs[True][1]["losses"] == runs[False][1]["losses"]  # the same training, bit for bit
    assert held_boundaries(m, sender, False, True, True) == 3  # two outputs, one gradient
