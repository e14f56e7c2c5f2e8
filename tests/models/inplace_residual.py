"""A residual network that adds its shortcut in place, as RegNet and ResNet-style vision models
do (``hidden_state += residual``), with a second input read only at the head. Its two branches
cost the same, so a two-stage pipeline begins its second stage at the shortcut: that stage adds
into the tensor it received from the first stage in place, and reads both model inputs (the
shortcut's, which the first stage reads too, and the head's, which it does not and which comes
first in the model's signature). Follows the
model-file contract."""

from __future__ import annotations

import torch
from torch import nn

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}
WIDTH, CLASSES = 512, 10


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.Tanh(), nn.Linear(4 * WIDTH, WIDTH))


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = _mlp()
        self.shortcut = _mlp()
        self.activation = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x
        hidden = self.layer(x)
        residual = self.shortcut(residual)
        hidden += residual
        return self.activation(hidden)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.residual = Residual()
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, offset: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.residual(x) + offset)


def build_model(size: str = "tiny", dtype: str = "float32") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    torch.manual_seed(0)
    return Net().to(getattr(torch, dtype))


def make_batch(batch_size: int, step: int = 0) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    g = torch.Generator().manual_seed(7800 + step)
    x, offset = torch.randn(2, batch_size, WIDTH, generator=g)
    return (offset, x), torch.randint(0, CLASSES, (batch_size,), generator=g)
