"""The optimizer of a plan, built the same way by the runtime and by the one-process oracle."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """``adamw`` -> AdamW, ``sgd`` -> SGD, both with torch's defaults besides the learning rate."""
    return {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[name]


def make_optimizer(params: Iterable[torch.nn.Parameter], name: str, lr: float):
    return optimizer_class(name)(params, lr=lr)
