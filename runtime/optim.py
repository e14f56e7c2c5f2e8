"""The optimizer of a plan, built the same way by the runtime and by the one-process oracle."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

# SGD keeps a momentum buffer, as the cost model prices it (one state per parameter,
# planner.training.STATE_BYTES): plain SGD without momentum is rarely what anyone trains with.
SGD_MOMENTUM = 0.9


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """``adamw`` -> AdamW, ``sgd`` -> SGD; ``optimizer_kwargs`` gives their arguments."""
    return {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[name]


def optimizer_kwargs(name: str, lr: float) -> dict[str, Any]:
    """torch's defaults besides the learning rate, and momentum 0.9 for SGD."""
    return {"lr": lr, **({"momentum": SGD_MOMENTUM} if name == "sgd" else {})}


def step_kwargs(params: list[torch.nn.Parameter]) -> dict[str, Any]:
    """torch's fused step (one kernel reads and writes each tensor once) where every parameter
    is on a GPU: a 1.5B Llama's AdamW step took 15.0 ms fused against 34.3 ms for torch's
    default foreach step on one H200 (benchmarks/gpu_accuracy.py probe). Parameters on the
    host (gloo ranks, FSDP2's CPU offload) keep torch's default step, as the cost model prices
    (planner.cost.optimizer.UNFUSED_STEP_ACCESSES)."""
    on_gpu = bool(params) and all(p.device.type == "cuda" for p in params)
    return {"fused": True} if on_gpu else {}


def make_optimizer(params: Iterable[torch.nn.Parameter], name: str, lr: float):
    params = list(params)
    return optimizer_class(name)(params, **optimizer_kwargs(name, lr), **step_kwargs(params))
