"""The local split of a block-sharded tensor (runtime.dtensor_blocks): each rank's slice of
q | k | v handed on as its own heads, with no collective, where DTensor's own split gathers.
Runs in a child process on torch's fake process group (two ranks' layout, this rank's data),
so no process group is left behind in the test session."""

from __future__ import annotations

import pytest
from conftest import run_on_fake_pg

pytestmark = pytest.mark.distributed

CHILD = r"""
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import _StridedShard
from torch.distributed.tensor.debug import CommDebugMode
from runtime.dtensor_blocks import _SplitBlocksLocally

local = torch.arange(12.0).view(1, 1, 12)  # rank 0's [q_0 | k_0 | v_0], 4 each
x = DTensor.from_local(local, mesh, [_StridedShard(2, split_factor=3)], run_check=False)
out = {"shape": list(x.shape)}
for name, call in (("split", lambda: x.split(8, dim=2)), ("chunk", lambda: x.chunk(3, dim=-1)),
                   ("other", lambda: x.split(12, dim=2))):
    with CommDebugMode() as comm, _SplitBlocksLocally():
        parts = call()
    out[name] = {
        "placements": [repr(p.placements[0]) for p in parts],
        "collectives": comm.get_total_counts(),
        "local": [p.to_local().flatten().tolist() for p in parts],
    }
with CommDebugMode() as comm:
    x.split(8, dim=2)
out["dtensor_split_collectives"] = comm.get_total_counts()
"""


def test_split_into_the_blocks_is_local_and_keeps_each_ranks_heads():
    out = run_on_fake_pg(CHILD)
    assert out["shape"] == [1, 1, 24]  # 3 blocks of 8, each split over 2 ranks
    for how in ("split", "chunk"):
        got = out[how]
        assert got["collectives"] == 0
        assert got["placements"] == ["Shard(dim=2)"] * 3
        assert got["local"] == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0, 10.0, 11.0]]
    # a split that is not into the blocks is left to DTensor, which gathers (correct, not local)
    assert out["other"]["collectives"] >= 1
    assert out["dtensor_split_collectives"] >= 1  # why the runtime splits locally
