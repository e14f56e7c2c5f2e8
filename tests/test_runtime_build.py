"""The runtime applies what the plan says, in one process.

The oracle (test_runtime_oracle.py) proves that plans train like one process; it cannot see
choices that change memory and not numbers: whether ZeRO-3 reshards after forward, whether a
block is recomputed or offloaded, how far a weight is sharded. Here each plan is built on rank
0 of a world of N under torch's "fake" process group (no other process, no communication), and
what rank 0 holds is compared with the plan: the weights it keeps between steps equal the
plan's predicted parameter memory, every block the plan recomputes is checkpointed and no
other, ZeRO-3 reshards after forward and ZeRO-2 does not, offloaded blocks carry FSDP's CPU
offload policy, and the optimizer is the plan's.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from runs import forced_plan
from torch.distributed._composable.contract import _get_registry
from torch.distributed._composable.replicate_with_fsdp import ReplicateModule
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from planner.modelfile import load_model_file
from planner.schema import load_plan

WORLD = 4
CASES = [
    ("gpt-zero3-full", "gpt", dict(dp=4, zero=3, micro_batch_size=1, recompute="full")),
    ("gpt-zero2-selective", "gpt", dict(dp=4, zero=2, micro_batch_size=1, recompute="selective")),
    ("llama-tp2xdp2-zero3", "llama", dict(tp=2, dp=2, zero=3, micro_batch_size=2)),
    ("llama-tp4", "llama", dict(tp=4, dp=1, zero=0, micro_batch_size=4)),
    ("gpt-tp2xdp2-zero0", "gpt", dict(tp=2, dp=2, zero=0, micro_batch_size=2)),
    (
        "mlp-zero3-offload",
        "mlp",
        dict(dp=4, zero=3, micro_batch_size=1, offload="optimizer+params"),
    ),
    ("gpt-zero1", "gpt", dict(dp=4, zero=1, micro_batch_size=1)),
    ("mlp-zero0-sgd", "mlp", dict(dp=4, zero=0, micro_batch_size=1)),
    ("gpt-pp2xdp2", "gpt", dict(pp=2, dp=2, zero=0, schedule="1f1b", micro_batch_size=2)),
    ("moe-ep2xdp4-zero3", "moe", dict(dp=4, ep=2, zero=3, micro_batch_size=1)),
]


@pytest.fixture(scope="module")
def fake_world():
    """Rank 0 of WORLD under the fake process group, torn down after the module."""
    dist.init_process_group("fake", rank=0, world_size=WORLD, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def built_plan(case_id: str, model: str, pins: dict, tmp_path):
    from runtime.build import build

    pins = {"tp": 1, "pp": 1, "recompute": "none", **pins}
    optimizer = "sgd" if case_id.endswith("sgd") else None
    path = forced_plan(model, WORLD, tmp_path / case_id, optimizer=optimizer, lr=0.25, **pins)
    plan = load_plan(path)
    mf = load_model_file(plan.model.file, plan.model.args)
    return plan, build(plan, mf, torch.device("cpu"), seed=0)


def local_numel(p: torch.Tensor) -> int:
    return (p.to_local() if isinstance(p, DTensor) else p).numel()


@pytest.mark.parametrize("case_id,model,pins", CASES, ids=[c[0] for c in CASES])
def test_rank_zero_holds_what_the_plan_says(fake_world, case_id, model, pins, tmp_path):
    plan, built = built_plan(case_id, model, pins, tmp_path)
    parts = built.parts
    zero = plan.zero_stage
    # weights between steps: the plan's predicted parameter memory of pipeline rank 0 (fp32);
    # ZeRO-2 keeps the shard at rest and the whole weights from forward to backward, which is
    # the peak the plan counts
    held = sum(local_numel(p) for part in parts for p in part.parameters()) * 4
    predicted = plan.predicted.memory_per_stage[0].params
    if zero == 2:
        held *= plan.mesh.dp
    if {b.offload for b in plan.blocks} == {"optimizer+params"}:
        predicted = plan.model.params * 4 / plan.mesh.dp  # the host's, on a CPU
    assert held == pytest.approx(predicted, rel=0.02), f"{case_id}: {held} vs {predicted}"
    # recompute: exactly the modules of the blocks the plan recomputes are checkpointed
    owned = {name for part in parts for name, _ in part.named_modules()}
    for block in plan.blocks:
        for fqn in block.modules:
            found = [m for part in parts for n, m in part.named_modules() if n == fqn]
            if fqn not in owned or not found:
                continue
            checkpointed = "checkpoint" in (_get_registry(found[0]) or {})
            assert checkpointed == (block.recompute != "none"), f"{case_id}: {fqn}"
    # ZeRO 2/3: FSDP units, resharded after forward under ZeRO-3 only; offload where planned
    units = [
        m
        for part in parts
        for m in part.modules()
        if isinstance(m, FSDPModule) and not isinstance(m, ReplicateModule)
    ]
    assert bool(units) == (zero >= 2)
    offloaded = {b.offload for b in plan.blocks} == {"optimizer+params"}
    for unit in units:
        group = unit._get_fsdp_state()._fsdp_param_group
        if group is None:
            continue
        assert (group.post_forward_mesh_info is not None) == (zero == 3), case_id
        assert isinstance(group.offload_policy, CPUOffloadPolicy) == offloaded, case_id
    # tensor parallelism: a sharded block's weights are split over tp, as its tp_plan says
    if plan.mesh.tp > 1:
        sharded = [fqn for b in plan.blocks for fqn in b.tp_plan]
        assert sharded
        for fqn in sharded:
            weight = parts[0].get_submodule(fqn).weight
            assert isinstance(weight, DTensor)
            assert local_numel(weight) * plan.mesh.tp <= weight.numel()
    # the optimizer is the plan's, with its learning rate (and SGD's momentum)
    for opt in built.optimizers:
        inner = opt.optim if isinstance(opt, ZeroRedundancyOptimizer) else opt
        want = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[plan.optimizer]
        assert isinstance(inner, want)
        assert inner.defaults["lr"] == pytest.approx(plan.lr)
        if plan.optimizer == "sgd":
            assert inner.defaults["momentum"] == 0.9
    assert any(isinstance(o, ZeroRedundancyOptimizer) for o in built.optimizers) == (zero == 1)
    # experts keep their own gradient sync only where no FSDP unit reduces them
    ep = plan.mesh.ep
    assert bool(built.expert_params) == (ep > 1 and (zero < 2 or ep == plan.mesh.dp))


def test_ddp_runs_a_16_bit_gpu_plan_under_autocast():
    """ZeRO-1 on a GPU is DDP, which casts nothing (FSDP2's MixedPrecisionPolicy does the rest):
    the forward runs under torch.autocast in the plan's dtype, else it trains in fp32 while the
    cost model priced 16-bit products. Elsewhere nothing changes."""
    from types import SimpleNamespace

    import torch
    from torch.nn.parallel import DistributedDataParallel

    from runtime.parallelize import ddp_autocast_dtype
    from runtime.train import _autocast

    ddp = DistributedDataParallel.__new__(DistributedDataParallel)  # isinstance is all it reads
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    bf16, fp32 = SimpleNamespace(dtype="bf16"), SimpleNamespace(dtype="fp32")
    assert ddp_autocast_dtype(ddp, bf16, gpu) == torch.bfloat16
    assert ddp_autocast_dtype(ddp, SimpleNamespace(dtype="fp16"), gpu) == torch.float16
    assert ddp_autocast_dtype(torch.nn.Linear(2, 2), bf16, gpu) is None  # FSDP2 / plain casts
    assert ddp_autocast_dtype(ddp, fp32, gpu) is None
    assert ddp_autocast_dtype(ddp, bf16, cpu) is None  # the CPU trains in fp32 (a run note)
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with _autocast(SimpleNamespace(autocast=torch.bfloat16), cpu):
        assert lin(x).dtype == torch.bfloat16
    with _autocast(SimpleNamespace(autocast=None), cpu):
        assert lin(x).dtype == torch.float32
    assert lin.weight.dtype == torch.float32  # the parameters stay the fp32 master weights
