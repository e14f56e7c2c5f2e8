"""Tests written for mutmut's generated mutants of runtime/recsys.py that need two ranks:
``train`` on two gloo ranks forked from the test process (tests/forked_gloo.py; no launch),
against one process's SGD. Its own file: tests/test_mutant_kills_recsys.py holds a one-rank
gloo group for its module, and a rank forked from a process holding a group hangs leaving it.
docs/mutation.md names the mutants it kills."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
from forked_gloo import run_ranks
from test_mutant_kills_recsys import DLRM, SGD, STEPS, _check, _plan

import runtime.recsys as recsys
from planner.modelfile import load_model_file


def _model() -> torch.nn.Module:
    return load_model_file(DLRM, {"size": "tiny"}).build()


def _two_rank_body(plan: dict, run_dir: Path, r: int, store_path: str, queue) -> None:  # noqa: ANN001
    """Rank ``r`` of two forked gloo ranks trains ``plan``."""
    import traceback
    from datetime import timedelta

    try:
        # inline, not on the intra-op pool the parent may have started: a pool's threads do
        # not survive a fork, and a rank waiting on them hangs
        torch.set_num_threads(1)
        store = recsys.dist.FileStore(store_path, 2)
        recsys.dist.init_process_group(
            "gloo", store=store, rank=r, world_size=2, timeout=timedelta(seconds=60)
        )
        recsys.train(plan, run_dir, STEPS, 0, torch.device("cpu"), dump_params=True)
        mf = load_model_file(plan["model"]["file"], plan["model"]["args"])
        dmp, _, initial = recsys.build(plan, mf, torch.device("cpu"), 0)
        state = recsys.gather_full_state(dmp)
        if r == 0:
            assert sorted(state) == sorted(initial)
            for name, value in initial.items():
                assert torch.equal(state[name], value), name
        else:
            assert state is None
        queue.put((r, "done"))
        recsys.dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - the test reads the rank's traceback
        queue.put((r, traceback.format_exc()))


def test_two_ranks_train_each_its_half_of_the_batch_like_one_process(tmp_path):
    """Two forked gloo ranks, the tables table-wise on rank 1, column-wise over both ranks,
    data-parallel and table-wise on rank 0, the MLPs under FSDP2: rank r trains samples
    [16 r, 16 (r + 1)) of each global batch; the losses averaged over both ranks and the
    parameters gathered on rank 0 are one process's SGD on the whole batches. Then a fresh
    build gathered: rank 0 gets the whole initial state (the tables' shards and the MLPs'
    halves put back together), rank 1 nothing."""
    plan = _plan(SGD, "fused", "fsdp")
    for t, ranks in zip(plan["tables"], ([1], [0, 1], [0], [0]), strict=True):
        t["ranks"] = ranks

    def done(item: tuple) -> None:
        assert item[1] == "done", item[1]

    run = tmp_path / "run"
    body = functools.partial(_two_rank_body, plan, run)
    assert sorted(run_ranks(body, 2, tmp_path / "store", 2, done)) == [(0, "done"), (1, "done")]
    lines = (run / "metrics.jsonl").read_text().splitlines()
    mlp = sum(1 for n, _ in _model().named_parameters() if "embedding" not in n)
    _check(torch.load(run / "params.pt"), [json.loads(x) for x in lines], SGD, mlp)
