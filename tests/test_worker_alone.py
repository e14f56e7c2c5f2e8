"""A rank whose own pipeline stage raises a MeshplanError while its peers wait for its messages
(a stage-only error: rank 0 never reaches the closing barrier) ends the run with that one line.

Before, rank 0 alone spoke: the erring ranks waited at a barrier rank 0 never reached, and
``plan run`` hung until it was killed, with nothing said (a PP 2 x TP 2 plan whose last stage
could not shard a module)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.launch import worker_env
from runtime.stop import ENV as STOP_ENV
from runtime.stop import read_stop

pytestmark = pytest.mark.distributed  # launches processes

MESSAGE = "stage 1 cannot shard its module: plan again with --tp 1"

SCRIPT = f"""
import sys
import time
import types
import torch
import torch.distributed as dist
import runtime.worker as w
from planner.errors import UserInputError

mesh = types.SimpleNamespace(pp=2, dp_label=1, ep=1, cp=1, tp_label=1)
w.load_plan = lambda path: types.SimpleNamespace(
    mesh=mesh, schedule="gpipe", zero_stage=0, model=types.SimpleNamespace(file="m", args={{}})
)
w.load_model_file = lambda file, args: None
w.ALONE_AFTER_S = 3.0
WAIT = sys.argv.pop(1)


def train_plan(*args, **kwargs):
    if dist.get_rank() == 1:
        raise UserInputError({MESSAGE!r})
    if WAIT == "recv":  # waits for a message of the last stage (gloo: ends when it closes)
        dist.recv(torch.zeros(1), src=1, tag=77)
    else:  # a wait that never notices (NCCL's, until its own timeout)
        time.sleep(600)


w.train_plan = train_plan
w.exit_worker(w.main())
"""


@pytest.mark.parametrize("wait", ["recv", "sleep"])
def test_a_rank_that_errs_alone_ends_the_run_with_its_line(tmp_path: Path, wait: str) -> None:
    script = tmp_path / "alone.py"
    script.write_text(SCRIPT)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone"]
    cmd += [str(script), wait, "--plans", "p.json", "--run-dirs", str(run_dir)]
    start = time.monotonic()
    done = subprocess.run(
        cmd, env={**worker_env(), STOP_ENV: "1"}, capture_output=True, text=True, timeout=240
    )
    elapsed = time.monotonic() - start
    stopped = read_stop(run_dir)
    assert stopped is not None, done.stderr[-2000:]
    assert str(stopped) == MESSAGE and stopped.exit_code == 2
    # every worker left cleanly (the launcher ends with the stop file's line), well before
    # gloo's own 30-minute timeout
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert elapsed < 120
