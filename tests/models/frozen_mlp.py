"""An MLP whose input projection and first block are frozen (``requires_grad_(False)``, as when
fine-tuning the top of a pretrained network), and whose fourth layer is a frozen weight applied
with ``torch.addmm`` beside a trainable bias: frozen products need no weight gradient, the
layers below the first trainable one no input gradient either, and addmm's added term is not
a multiplied operand. Follows meshplan's model-file contract."""

from __future__ import annotations

import torch
from torch import nn

TRAINING = {"global_batch_size": 8, "optimizer": "adamw", "dtype": "fp32", "lr": 1e-3}
IN, WIDTH, CLASSES = 12, 32, 5


class FrozenAffine(nn.Module):
    """x @ W + b with W frozen and b trained, written as one addmm."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(width, width) / width**0.5, requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.addmm(self.bias, x, self.weight))


def build_model(size: str = "tiny") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    model = nn.Sequential(
        nn.Linear(IN, WIDTH),
        nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()),
        nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()),
        FrozenAffine(WIDTH),
        nn.Linear(WIDTH, CLASSES),
    )
    for module in (model[0], model[1]):
        module.requires_grad_(False)
    return model


def make_batch(batch_size: int, step: int = 0):
    g = torch.Generator().manual_seed(6000 + step)
    x = torch.randn(batch_size, IN, generator=g)
    return x, torch.randint(0, CLASSES, (batch_size,), generator=g)
