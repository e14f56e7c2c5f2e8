"""A batch of plans in one launch must not carry one plan's weights into the next.

FSDP2's replicate ties a module and its state into reference cycles: without a collection the
last plan's weights stayed allocated while the next trained (on an H200 a Llama-1B's 6 GB of
fp32 weights sat in every later plan's measured peak, 2026-11-26). ``release`` collects them.
Run in a child process: it starts a process group.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent(
    """
    import gc, os, socket, sys, types, weakref
    import torch
    import torch.distributed as dist
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.device_mesh import init_device_mesh
    from runtime.build import freeze_launch_state, release

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (1,))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    replicate(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    gone = weakref.ref(model)
    built = types.SimpleNamespace(parts=[model], optimizers=[opt], schedule=None)
    del model, opt
    gc.disable()  # as if the collector's object count had not come round
    if sys.argv[1] == "plain":  # what release did before: drop the references only
        built.parts.clear()
        built.optimizers.clear()
    else:
        release(built)
    freed = gone() is None
    if sys.argv[1] == "frozen":  # a second plan after the first's survivors are frozen
        del built
        stray = torch.nn.Linear(2, 2)  # garbage in a cycle when the launch state is frozen
        stray.me, gone_stray = [stray], weakref.ref(stray)
        del stray
        freeze_launch_state()
        frozen = gc.get_freeze_count()
        freed = freed and gone_stray() is None  # collected, not frozen for good
        model = torch.nn.Sequential(torch.nn.Linear(8, 8))
        replicate(model, mesh=mesh)
        model(torch.randn(2, 8)).sum().backward()
        gone = weakref.ref(model)
        built = types.SimpleNamespace(parts=[model], optimizers=[], schedule=None)
        del model
        release(built)
        freed = freed and gone() is None and frozen > 10000
    print("freed" if freed else "held")
    dist.destroy_process_group()
    """
)


def _run(mode: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_release_frees_a_replicated_model_that_dropping_references_does_not():
    assert _run("plain") == "held"  # the cycle is real: references alone do not free it
    assert _run("release") == "freed"


def test_after_the_launch_state_is_frozen_the_next_plan_is_still_freed():
    """``freeze_launch_state`` exempts what outlives a plan (torch, the process group) from
    later collections, so that each walks only the next plan's objects: what was garbage when
    it froze is collected first, and the next plan's cycles are still collected."""
    assert _run("frozen") == "freed"
