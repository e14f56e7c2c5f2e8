"""examples/gpt.py, paced: every step's batch takes 0.4 s to make, so that a test can kill a
rank in the middle of a run (tests/test_runtime_fault.py). Follows meshplan's model-file
contract by handing on examples/gpt.py's own functions."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "paced_gpt_base", Path(__file__).resolve().parents[2] / "examples" / "gpt.py"
)
_gpt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_gpt)

TRAINING = _gpt.TRAINING
build_model = _gpt.build_model
PACE_S = 0.4


def make_batch(batch_size: int, step: int = 0):
    if step > 0:  # the planner's trace asks for step 0 and needs no pace
        time.sleep(PACE_S)
    return _gpt.make_batch(batch_size, step)
