"""A small convolutional classifier (plain PyTorch: strided and 1x1 convolutions, a transposed
convolution, pooling, a linear head), for the convolution FLOP references. No grouped
convolution: torch 2.13's FlopCounterMode counts a grouped convolution's weight gradient as if
it were ungrouped (groups times too many), so it cannot be their reference. Follows meshplan's
model-file contract."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

TRAINING = {"global_batch_size": 4, "optimizer": "sgd", "dtype": "fp32", "lr": 1e-2}
CLASSES = 10


class Stage(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1)
        self.mix = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.point = nn.Conv2d(cout, cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv(x))
        return x + self.point(F.relu(self.mix(x)))


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stages = nn.Sequential(Stage(3, 16, 1), Stage(16, 32, 2), Stage(32, 32, 2))
        self.up = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.head = nn.Linear(16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.up(self.stages(x)))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def build_model(size: str = "tiny") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    return ConvNet()


def make_batch(batch_size: int, step: int = 0):
    g = torch.Generator().manual_seed(5000 + step)
    images = torch.randn(batch_size, 3, 16, 16, generator=g)
    return images, torch.randint(0, CLASSES, (batch_size,), generator=g)
