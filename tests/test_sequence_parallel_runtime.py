"""The runtime keeps what the cost model prices for sequence parallelism: the input of each
module of column-parallel weights is kept as its sequence shard and gathered again in backward
(Megatron's layout, Korthikanti's sbh(34/t + 5as/(ht))), once per module, not per weight; also
where the module is a Linear on the flattened tokens (OPT's fc1)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import forked_ranks
import pytest
from runs import forced_plan

from runtime.launch import worker_env

pytestmark = pytest.mark.distributed  # every test here launches processes

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("model", ["gpt", "llama", "opt"])
def test_backward_gathers_each_module_input_once_more(model, tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "cache"))
    pins = dict(tp=2, dp=1, pp=1, zero=0, micro_batch_size=2, recompute="none")
    plan_path = forced_plan(model, 2, tmp_path / "run", tp_variant="sequence", **pins)
    env = {**worker_env(), "PLAN": str(plan_path)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += [str(ROOT / "tests" / "scripts" / "sp_regather.py")]
    proc = forked_ranks.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads([x for x in proc.stdout.splitlines() if x.startswith("{")][-1])
    # attention and MLP of 2 layers (OPT's fc1, on its flattened tokens, gathers for the MLP)
    assert found["gathering_modules"] == 4
    assert found["regather"] - found["keep"] == found["gathering_modules"]
