"""Tests written for mutmut's generated mutants of runtime/gather.py (``gather``: a loss over the
whole batch under data parallelism; benchmarks/generated_mutants.py). Three gloo ranks forked
from this process (torch already imported: no launch), the gather over the group of ranks 0
and 2 (a data-parallel group beside a TP rank, as under TP 2), against the closed form: the
gathered rows in the group's order, and each rank's gradient ``dp`` times its own rows' share
of the one loss. tests/test_runtime_oracle.py trains the same under ZeRO-3 at DP 2;
docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
from forked_gloo import run_ranks

from runtime.gather import batch_gather

WORLD, GROUP = 3, [0, 2]
# A collective left waiting (a gather over the wrong group: a peer never joins) fails in the
# rank after this long, rather than hanging the test until the queue's wait runs out
COLLECTIVE_TIMEOUT = timedelta(seconds=30)


def _rows(r: int) -> torch.Tensor:
    """Global rank ``r``'s 2 x 3 rows: 10 r + 0 .. 5, non-contiguous (a transpose)."""
    return (torch.arange(6.0) + 10 * r).reshape(3, 2).t()


def _rank(r: int, store_path: str, out) -> None:  # noqa: ANN001
    try:
        store = dist.FileStore(store_path, WORLD)
        dist.init_process_group(
            "gloo", store=store, rank=r, world_size=WORLD, timeout=COLLECTIVE_TIMEOUT
        )
        group = dist.new_group(GROUP)
        if r in GROUP:
            t = _rows(r).requires_grad_()
            got = batch_gather(group)(t)
            weights = torch.arange(1.0, 13.0).reshape(4, 3)
            (weights * got.square()).sum().backward()
            out.put(
                (r, got.tolist(), t.grad.tolist())
            )  # lists: a tensor's shared fd dies with the rank
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        out.put((r, traceback.format_exc(), None))


def test_gather_joins_the_groups_rows_and_gives_each_rank_dp_times_its_rows_gradient(tmp_path):
    """Ranks 0 and 2 (group ranks 0 and 1) each hold 2 rows; both see the 4 rows in group
    order, and their one loss sum(w * g^2) gives rows i the gradient 2 w_i g_i on each of
    the 2 replicas, summed: 4 w_i g_i, of which each keeps its own 2 rows."""

    def grad_came_back(item: tuple) -> None:
        assert item[2] is not None, item[1]

    got = {
        r: (torch.tensor(rows), torch.tensor(grad))
        for r, rows, grad in run_ranks(_rank, WORLD, tmp_path / "store", len(GROUP), grad_came_back)
    }
    whole = torch.cat([_rows(0), _rows(2)])
    weights = torch.arange(1.0, 13.0).reshape(4, 3)
    full_grad = 2 * 2 * weights * whole
    assert torch.equal(got[0][0], whole) and torch.equal(got[2][0], whole)
    assert torch.equal(got[0][1], full_grad[:2])
    assert torch.equal(got[2][1], full_grad[2:])
