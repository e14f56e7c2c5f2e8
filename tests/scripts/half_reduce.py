"""Run under torchrun (2 processes, gloo) with PLAN=<a bf16 plan with reduce_dtype bf16>: the
runtime's mixed-precision policy for that plan on a GPU (``runtime.parallelize.
mixed_precision``), applied by FSDP2 to a small MLP on CPU ranks, through two micro-batches
accumulated without sync and one reduce-scatter, as a deferring pipeline stage runs them.
Prints, as JSON, the dtype of the unsharded gradient held between the micro-batches and the
largest gap of the reduced shards from one process's bf16 arithmetic (its relative unit of
bf16 rounding: 2**-8)."""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from planner.schema import load_plan
from runtime.parallelize import mixed_precision

WIDTH, MICRO, ROWS = 16, 2, 4


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 1))


def batches(world: int) -> torch.Tensor:
    """[rank, micro-batch, rows, width] inputs, the same on every process."""
    return torch.randn(world, MICRO, ROWS, WIDTH, generator=torch.Generator().manual_seed(1))


def reference(xs: torch.Tensor) -> list[torch.Tensor]:
    """One process: each rank's micro-batch gradients of the bf16 model, summed in bf16 over
    micro-batches, then over ranks, then averaged: what FSDP2 computes with reduce_dtype bf16."""
    model = build().to(torch.bfloat16)
    per_rank = []
    for r in range(xs.shape[0]):
        model.zero_grad(set_to_none=True)
        for mb in range(MICRO):
            model(xs[r, mb].to(torch.bfloat16)).sum().backward()  # bf16 .grad accumulates
        per_rank.append([p.grad.clone() for p in model.parameters()])
    total = [sum(gs[1:], gs[0]) for gs in zip(*per_rank)]
    return [(g / xs.shape[0]).float() for g in total]


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    plan = load_plan(os.environ["PLAN"])
    policy = mixed_precision(plan, torch.device("cuda"))  # the policy a GPU rank runs
    model = build()
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)), mp_policy=policy)
    model.set_force_sum_reduction_for_comms(True)  # gloo has no pre-scaled sum
    model.set_gradient_divide_factor(float(world))
    xs = batches(world)
    model.set_requires_gradient_sync(False)
    model(xs[rank, 0]).sum().backward()
    held = {
        str(fp._unsharded_param.grad.dtype)
        for fp in model._get_fsdp_state()._fsdp_param_group.fsdp_params
    }
    model.set_requires_gradient_sync(True)
    model(xs[rank, 1]).sum().backward()
    want = reference(xs)
    gap = 0.0
    for p, w in zip(model.parameters(), want):
        shard = p.grad.full_tensor()
        gap = max(gap, float(((shard - w).abs() / w.abs().clamp_min(1e-3)).max()))
    if rank == 0:
        print(json.dumps({"held": sorted(held), "reduce": str(policy.reduce_dtype), "gap": gap}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
