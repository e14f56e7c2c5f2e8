"""Gradients reduced and accumulated in the 16-bit compute dtype (``--reduce-dtype bf16``,
FSDP2's MixedPrecisionPolicy(reduce_dtype=param_dtype)): priced at 2 bytes per gradient
element where the fp32 reduction holds 4, recorded in plan.json (old plans load with fp32),
and run by the runtime's own policy on gloo against one process's bf16 arithmetic."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import forked_ranks
import pytest
from runs import forced_plan

from meshplan.cli import main
from planner.cost.memory import state_memory
from planner.errors import UserInputError
from planner.schema import Plan
from planner.training import Training, training_from
from planner.vocab import Offload
from runtime.launch import worker_env

ROOT = Path(__file__).resolve().parent.parent
PARAMS, DP = 3.19e9, 64  # a Llama 3 405B layer (its parameters) over 64 replicas


@pytest.mark.parametrize("half, grad_bytes", [(False, 4), (True, 2)])
def test_deferred_stage_holds_its_whole_gradients_at_the_reduce_width(half, grad_bytes):
    """A deferring pipeline stage (ZeRO-3, m > 1) accumulates whole gradients: 4 bytes per
    parameter reduced in fp32, 2 in bf16; sharded states are unchanged."""
    tr = Training(2048, "bf16", half_grad_reduce=half)
    held = state_memory(PARAMS, 1, DP, Offload.NONE, tr, None, accumulated=True)
    assert held["grads"] == PARAMS * grad_bytes
    assert held["params"] == PARAMS * 2 and held["optimizer"] == PARAMS * 12 / DP
    sharded = state_memory(PARAMS, 3, DP, Offload.NONE, tr)
    assert sharded["grads"] == PARAMS * 4 / DP  # FSDP2 casts the reduced shard back to fp32


def test_reduce_dtype_is_fp32_or_the_training_dtype():
    assert training_from({}, "m.py", reduce_dtype="bf16").reduce_bytes == 2
    assert training_from({}, "m.py").reduce_bytes == 4
    assert training_from({"reduce_dtype": "bf16"}, "m.py").half_grad_reduce
    with pytest.raises(UserInputError, match="reduce_dtype 'bf16' must be fp32 or the training"):
        training_from({}, "m.py", dtype="fp32", reduce_dtype="bf16")


def test_reduce_dtype_other_than_the_training_dtype_is_one_line_exit_2(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    code = main(["examples/mlp.py", "--gpus", "2", "--dtype", "fp32", "--reduce-dtype", "bf16"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "reduce_dtype 'bf16' must be fp32 or the training dtype 'fp32'" in err


def test_plans_without_reduce_dtype_load_with_fp32(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "cache"))
    path = forced_plan("mlp", 1, tmp_path / "p", tp=1, dp=1, pp=1, zero=0, micro_batch_size=8)
    data = json.loads(path.read_text())
    assert data["reduce_dtype"] == "fp32"
    del data["reduce_dtype"]
    assert Plan.from_dict(data).reduce_dtype == "fp32"


@pytest.mark.distributed
def test_runtime_reduces_in_bf16_like_one_process(tmp_path, monkeypatch):
    """The runtime's policy for a bf16 plan with reduce_dtype bf16, on 2 gloo ranks: the
    unsharded gradient held between micro-batches stays bf16 (2 bytes, not an fp32
    accumulator), and the reduced shards equal one process's bf16 sums within one bf16
    rounding step (2**-8 relative)."""
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "cache"))
    path = forced_plan("mlp", 2, tmp_path / "p", tp=1, dp=2, pp=1, zero=3, micro_batch_size=2)
    data = json.loads(path.read_text())
    data.update(dtype="bf16", reduce_dtype="bf16")
    path.write_text(json.dumps(data))
    env = {**worker_env(), "PLAN": str(path)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += [str(ROOT / "tests" / "scripts" / "half_reduce.py")]
    proc = forked_ranks.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads([x for x in proc.stdout.splitlines() if x.startswith("{")][-1])
    assert found["reduce"] == "torch.bfloat16"
    assert found["held"] == ["torch.bfloat16"]
    assert found["gap"] <= 2**-8
