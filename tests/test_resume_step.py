"""A checkpoint records the step it holds, so ``--resume`` trains each step once.

One gloo rank trains steps 1-2 of the tiny MLP with a checkpoint at step 2; the worker then
starts again with ``--resume`` and trains step 3 alone, checkpointing it. Its parameters must
equal the one-process oracle's after step 3: a checkpoint that recorded step 1 would train
step 2 twice and end one AdamW step further. Both runs go through ``runtime.worker.main`` in
one process (one torch import, a process group each), which keeps this in the default suite;
the long suite's restart runs check the same on more plans and ranks."""

from __future__ import annotations

import json
import socket
import sys

import forked_ranks
import pytest
from oracle import (
    checkpoint_model_state,
    parameter_mismatches,
    reference_for_plan,
    unmoved_parameters,
)
from runs import forced_plan, losses_of

from runtime.launch import worker_env

pytestmark = pytest.mark.distributed  # starts a process with a gloo group

RTOL = 1e-4

# Two runs of the worker on a one-rank gloo group, each with a store of its own.
SCRIPT = """
import os
import sys
from runtime.worker import main

plan, run_dir, ports = sys.argv[1], sys.argv[2], sys.argv[3:]
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
runs = [["--steps", "2", "--checkpoint-every", "2"],
        ["--steps", "3", "--checkpoint-every", "1", "--resume"]]
for port, extra in zip(ports, runs):
    os.environ["MASTER_PORT"] = port
    code = main(["--plans", plan, "--run-dirs", run_dir, *extra])
    if code:
        sys.exit(code)
"""


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_a_resume_after_step_2_trains_step_3_once(tmp_path):
    plan = forced_plan(
        "mlp", 1, tmp_path / "one", tp=1, dp=1, pp=1, zero=0, micro_batch_size=4, recompute="none"
    )
    run = tmp_path / "run"
    done = forked_ranks.run(
        [sys.executable, "-c", SCRIPT, str(plan), str(run), _free_port(), _free_port()],
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    ref = reference_for_plan(json.loads(plan.read_text()), 3)
    assert not unmoved_parameters(ref)  # one step more would move every tensor beyond tolerance
    got = checkpoint_model_state(run / "checkpoints" / "step_000003")
    assert parameter_mismatches(got, ref) == [], log[-3000:]
    losses = losses_of(run)
    assert len(losses) == 3
    for g, w in zip(losses, ref.losses, strict=True):
        assert abs(g - w) <= RTOL * abs(w)
    assert "step_000002 (step 2)" in log and "step 3/3" in log and "step 2/3" not in log, log[
        -3000:
    ]
