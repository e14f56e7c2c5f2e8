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


MLA_CHILD = r"""
import sys
sys.path.insert(0, "tests/models")
import deepseek_v3
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import parallelize_module
from runtime.dtensor_blocks import (
    backward_replication, new_like_locally, register_cpu_attention_sharding, run_on_dtensors,
)
from runtime.parallelize import _sharing_inputs, tp_style


def styled(layer, plan):
    parallelize_module(layer, mesh, {
        fqn: _sharing_inputs(tp_style(layer.get_submodule(fqn), style, fqn))
        for fqn, style in plan.items()
    })


torch.manual_seed(0)
model = deepseek_v3.build_model(dense=True)
layer = model.model.layers[0]
a = "self_attn."
styled(layer, {
    a + "q_b_proj": "colwise_dtensor", a + "kv_b_proj": "colwise_dtensor", a + "o_proj": "rowwise",
    "mlp.gate_proj": "colwise_dtensor", "mlp.up_proj": "colwise_dtensor",
    "mlp.down_proj": "rowwise",
})
register_cpu_attention_sharding()
run_on_dtensors(layer)
x = torch.randn(4, 32, 64, requires_grad=True)
pos = model.model.rotary_emb(x, torch.arange(32)[None].expand(4, -1))
block = type("Block", (), {"tp_plan": {"m": "colwise_dtensor"}})
on_dtensors = type("Plan", (), {"blocks": [block]})
with CommDebugMode() as comm:
    y = layer(x, position_embeddings=pos, attention_mask=None)
    y = y[0] if isinstance(y, tuple) else y
    with backward_replication(on_dtensors):
        y.sum().backward()
out = {
    "collectives": {getattr(k, "__name__", str(k)).split(".")[-1]: v
                    for k, v in comm.get_comm_counts().items()},
    "plain_grad": type(x.grad) is torch.Tensor,
}
keys = DTensor.from_local(torch.zeros(4, 2, 32, 24), mesh, [Shard(1)], run_check=False)
made = new_like_locally(torch.Tensor.new_empty, (keys, 4, 4, 32, 16), {})
out["new_empty"] = [list(made.shape), repr(made.placements[0]), list(made.to_local().shape)]
out["other_dim"] = new_like_locally(torch.Tensor.new_empty, (keys, 4, 8, 32, 16), {}) is None

sys.path.insert(0, "examples")
import llama
llama_layer = llama.build_model("tiny").model.layers[0]
a = "self_attn."
styled(llama_layer, {
    **{a + p: "colwise" for p in ("q_proj", "k_proj", "v_proj")}, a + "o_proj": "rowwise",
    "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise", "mlp.down_proj": "rowwise",
})
x = torch.randn(4, 32, 64, requires_grad=True)
rotary = llama.build_model("tiny").model.rotary_emb
pos = rotary(x, torch.arange(32)[None].expand(4, -1))
with CommDebugMode() as comm:
    y = llama_layer(x, position_embeddings=pos, attention_mask=None)
    (y[0] if isinstance(y, tuple) else y).sum().backward()
out["llama"] = {getattr(k, "__name__", str(k)).split(".")[-1]: v
                for k, v in comm.get_comm_counts().items()}
"""


def test_latent_attention_on_dtensors_runs_the_priced_collectives():
    """A DeepSeek layer split by heads (queries and keys/values from column-parallel
    projections kept DTensors, the shared rotary key broadcast into the heads) runs only
    all-reduces: two in forward (the row-parallel outputs) and four in backward (the inputs
    of q's and the latent's up-projections, of the MLP, and the rotary key). DTensor's own
    new_empty made the keys whole (shape [4, 4, 32, 16] from a [..., 24] tensor: not the same
    shape), so each layer all-gathered its keys to fill them; made like the heads' split they
    stay split. The layer's input gets a plain, whole gradient."""
    out = run_on_fake_pg(MLA_CHILD)
    assert out["collectives"] == {"all_reduce": 6}
    assert out["plain_grad"]
    assert out["new_empty"] == [[4, 4, 32, 16], "Shard(dim=1)", [4, 2, 32, 16]]
    assert out["other_dim"]  # a split dim whose size changes: DTensor decides

    # A Llama layer at TP 2: the projections reading one tensor (q, k, v; gate, up) share one
    # DTensor of it, so their input gradients add up before one all-reduce, Megatron's layout
    # and the plan's price: 2 all-reduces in forward, 2 in backward (torch's styles alone: 5)
    assert out["llama"] == {"all_reduce": 4}
