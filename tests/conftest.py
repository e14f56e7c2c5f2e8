"""Shared helpers: synthetic blocks and options, so cost-model and solver tests can state their
instances directly and compare with formulas and brute force."""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# The tests trace into their own cache, never the user's: a fresh directory per run, or
# MESHPLAN_TEST_CACHE when a caller shares one between runs (benchmarks/mutants.py; the trace
# key holds a hash of the tracer's code, so a changed tracer never reads an old trace). The
# directory is named in MESHPLAN_TEST_CACHE before pytest-xdist starts its workers, which
# inherit the environment: the two workers of a run share one cache, so a model one of them
# traced and searched is warm for the other (entries are written atomically). A directory made
# here is removed when the process that made it exits, not at the end of a pytest session:
# mutmut's forked children run sessions of their own in the same directory, side by side.


def _remove_own_cache(path: str, maker: int) -> None:
    if os.getpid() == maker:  # forked children inherit the handler, not the directory
        shutil.rmtree(path, ignore_errors=True)


if not os.environ.get("MESHPLAN_TEST_CACHE"):
    os.environ["MESHPLAN_TEST_CACHE"] = tempfile.mkdtemp(prefix="meshplan-test-cache-")
    atexit.register(_remove_own_cache, os.environ["MESHPLAN_TEST_CACHE"], os.getpid())
os.environ["MESHPLAN_CACHE"] = os.environ["MESHPLAN_TEST_CACHE"]

# The session's heap is large (torch, transformers, hypothesis, some 3,600 collected tests, the
# modules' fixtures), and the cycle collector's full passes walk all of it: at Python's default
# thresholds a tenth of the CPU of the tracing, training and drawing tests went to some 30 full
# passes of 0.3-1.3 s in one process. Young collections a fourteenth as often (10,000 objects,
# not 700) leave half as many full passes; what is alive once the tests are collected is frozen
# (pytest_collection_finish), so that the passes left, and the runtime's own collection after
# each plan (runtime.build.release), walk only what the tests made. Measured on eight of the
# heaviest files in one process: 16.8 s to 8.1 s in the collector (one run each).
gc.set_threshold(10_000, 10, 10)

from planner.cost.records import BlockOption  # noqa: E402
from planner.hardware.cluster import Cluster  # noqa: E402
from planner.hardware.profiles import load_profile  # noqa: E402
from planner.trace.blocks import Block  # noqa: E402


def make_block(i: int, cls: str, params: int = 1000, boundary: int = 4096, out: int = 4096):
    return Block(
        index=i,
        name=f"b{i}",
        modules=[f"m{i}"],
        cls=cls,
        label=cls,
        nodes=[],
        params=params,
        param_names=[],
        fwd_flops=10**9,
        bwd_flops=2 * 10**9,
        fwd_bytes=0,
        bwd_bytes=0,
        saved_bytes=10**6,
        saved_selective_bytes=5 * 10**5,
        input_bytes=4096,
        output_bytes=out,
        boundary_bytes=boundary,
        transient_bytes=1000,
    )


def make_option(
    time_s: float, params: float, act: float, recompute: str = "none", offload: str = "none"
):
    return BlockOption(
        variant="replicated",
        recompute=recompute,
        offload=offload,
        fwd_s=time_s / 3,
        bwd_s=2 * time_s / 3,
        tp_comm_s=0.0,
        params=params,
        act_bytes=act,
        recompute_peak_bytes=0.0,
        transient_bytes=0.0,
    )


def cluster_of(gpus: int, profile: str = "h100-sxm", gpus_per_node: int = 8, **overrides):
    prof = load_profile(profile)
    if overrides:
        prof = replace(prof, **overrides)
    per_node = min(gpus, gpus_per_node)
    return Cluster(prof, max(1, gpus // per_node), per_node)


# A child process on torch's fake process group: two ranks' layout, this rank's data, and no
# process group left behind in the test session. The body sees ``torch``, ``dist`` and a
# two-rank CPU ``mesh``, and leaves its findings in the dict ``out``.
_FAKE_PG_HEAD = """
import json, torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.distributed.device_mesh import init_device_mesh

dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
mesh = init_device_mesh("cpu", (2,))
"""
_FAKE_PG_TAIL = """
print(json.dumps(out))
dist.destroy_process_group()
"""


def run_on_fake_pg(body: str) -> dict:
    """Run ``body`` on a fake two-rank process group in a child process (forked from the
    session's pre-imported one, tests/forked_ranks.py); its ``out``."""
    import forked_ranks

    code = _FAKE_PG_HEAD + body + _FAKE_PG_TAIL
    proc = forked_ranks.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# One node type of a resource pool file, every field given (tests of pool files vary it).
POOL_NODE = {
    "name": "n",
    "profile": "h100-sxm",
    "nodes": 2,
    "price_per_gpu_hour": 2.0,
    "gpu_busy_watts": 700,
    "node_watts": 4600,
    "carbon_g_per_kwh": 390,
    "pue": 1.5,
}


def pytest_collection_finish(session):
    """Freeze what the imports and the collection left alive (above) until the session's
    process exits: no later pass walks it (tests/frozen_heap.py)."""
    from frozen_heap import freeze_until_exit

    freeze_until_exit()


@pytest.fixture
def thawed_collector():
    """For a test of what is frozen: nothing frozen while it runs; after it, the session's
    freeze again, what it left collected first."""
    from runtime.build import freeze_launch_state

    gc.unfreeze()
    yield
    gc.unfreeze()
    freeze_launch_state()


def pytest_sessionfinish(session, exitstatus):
    """End the forkserver of the forked ranks (tests/forked_ranks.py) and wait for it, so that
    the CPU time of the ranks it started counts with this process's."""
    forked = sys.modules.get("forked_ranks")
    if forked is not None:
        forked.stop_forkserver()


@contextlib.contextmanager
def _one_rank_group():
    """Rank 0 of a one-rank gloo group in this process, destroyed after."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def gloo_one_rank():
    """A one-rank group torn down after the module: for the runtime's functions that ask the
    default process group but need no peer (a test module takes it with
    ``pytestmark = pytest.mark.usefixtures("gloo_one_rank")``)."""
    with _one_rank_group():
        yield


@pytest.fixture
def one_rank():
    """A one-rank gloo group per test and its 1-D CPU mesh (the kill files' DTensor checks)."""
    from torch.distributed.device_mesh import init_device_mesh

    with _one_rank_group():
        yield init_device_mesh("cpu", (1,))
