"""Tests written for mutmut's generated mutants of runtime/batching.py (how a step's batch is
cut into replicas' shares and micro-batches, and what a step's rate counts;
benchmarks/generated_mutants.py). One process, no process group: the rows each rank takes are
written out by hand from the plan's counts (a plan stand-in with a real ``Mesh``), on a batch
whose rows are their own indices. docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.overrides import TorchFunctionMode

from planner.schema import Mesh
from runtime.batching import dp_slice, micro_batches, replica_share, throughput_unit


def _batch(rows: int) -> dict:
    """Row i of ``x`` is [3i, 3i+1, 3i+2], of ``y`` i; a 0-d scale and a Python number stay."""
    return {
        "x": torch.arange(rows * 3).reshape(rows, 3),
        "y": torch.arange(rows),
        "scale": torch.tensor(2.5),
        "n": 7,
    }


def _plan(mesh: Mesh, mbs: int, stages: dict[int, tuple[int, int]]):
    """A plan as replica_share reads it: pipeline rank -> (local_batch_size, num_microbatches)
    of its first stage; a last, other stage on the same rank is never read."""
    stage = {
        i: [SimpleNamespace(local_batch_size=b, num_microbatches=m), None]
        for i, (b, m) in stages.items()
    }
    return SimpleNamespace(mesh=mesh, micro_batch_size=mbs, stages_of=lambda i: stage[i])


def _rows(share: dict) -> list[int]:
    assert torch.equal(share["x"], share["y"][:, None] * 3 + torch.arange(3))
    assert share["scale"].item() == 2.5 and share["n"] == 7
    return share["y"].tolist()


def test_dp_slice_is_the_ranks_contiguous_rows():
    assert _rows(dp_slice(_batch(12), 2, 3)) == [6, 7, 8]
    assert _rows(dp_slice(_batch(12), 0, 4)) == [0, 1, 2, 3]


def test_a_replica_of_one_dp_degree_takes_its_contiguous_share():
    """dp 4 (tp 2: ranks 4 and 5 are replica 2), 3 rows a replica."""
    plan = _plan(Mesh(pp=1, dp=4, tp=2), 1, {0: (3, 3)})
    assert _rows(replica_share(_batch(12), plan, 4)) == [6, 7, 8]
    assert _rows(replica_share(_batch(12), plan, 5)) == [6, 7, 8]
    assert _rows(replica_share(_batch(12), plan, 1)) == [0, 1, 2]


@pytest.mark.parametrize(
    "rank,rows",
    [
        (0, [0, 1, 4, 5, 8, 9, 12, 13]),  # stage 0, replica 0: micro-batches 0, 2, 4, 6
        (1, [2, 3, 6, 7, 10, 11, 14, 15]),  # replica 1: micro-batches 1, 3, 5, 7
        (2, list(range(16))),  # stage 1, its one replica: all 8 in order
    ],
)
def test_stages_of_different_dp_take_micro_batches_in_turn(rank, rows):
    """Stage DP degrees 2 and 1, micro-batches of 2 rows, 8 a step: stage 0's replicas take
    every other micro-batch (4 each), stage 1's one replica all 8."""
    plan = _plan(Mesh(pp=2, dp=2, tp=1, stage_dp=(2, 1)), 2, {0: (8, 4), 1: (16, 8)})
    assert _rows(replica_share(_batch(16), plan, rank)) == rows


def test_micro_batches_are_contiguous_slices_of_their_size():
    parts = micro_batches(_batch(6), 6, 2)
    assert [_rows(p) for p in parts] == [[0, 1], [2, 3], [4, 5]]
    assert [_rows(p) for p in micro_batches(_batch(6), 6, 3)] == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize(
    "inputs,unit",
    [
        ((torch.zeros(2, 5, dtype=torch.long),), ("tokens", 5)),
        ((torch.zeros(2, 5, 7, dtype=torch.int32),), ("tokens", 5)),
        ((torch.zeros(2, dtype=torch.long),), ("samples", 1)),
        ((torch.zeros(2, 5),), ("samples", 1)),
        ((torch.zeros(2, 5), torch.zeros(2, 9, dtype=torch.long)), ("samples", 1)),
    ],
    ids=["ids", "ids-3d", "labels-1d", "features", "features-first"],
)
def test_a_step_counts_tokens_of_integer_ids_else_samples(inputs, unit):
    """Tokens per sample are the second dimension of integer ids of 2 or more dimensions,
    read from the first input only."""
    got = throughput_unit(inputs)
    assert got == unit and type(got[1]) is int


class _IndexDevices(TorchFunctionMode):
    """Records (tensor's device, index's device) of each ``index_select``."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if func is torch.Tensor.index_select:
            self.seen.append((args[0].device.type, args[2].device.type))
        return func(*args, **(kwargs or {}))


def test_the_round_robin_index_goes_to_each_tensors_device():
    """A batch on a GPU needs its row index there (index_select refuses a host index for a
    device tensor); here the batch is on the meta device, which the CPU can show."""
    plan = _plan(Mesh(pp=2, dp=2, tp=1, stage_dp=(2, 1)), 2, {0: (8, 4), 1: (16, 8)})
    batch = {"x": torch.zeros(16, 3, device="meta"), "y": torch.arange(16)}
    with _IndexDevices() as mode:
        share = replica_share(batch, plan, 1)
    assert mode.seen == [("meta", "meta"), ("cpu", "cpu")]
    assert share["x"].shape == (8, 3) and share["y"].tolist() == [2, 3, 6, 7, 10, 11, 14, 15]
