"""A ResNet in plain PyTorch (no torchvision): convolutions, BatchNorm with running statistics,
residual stages of bottleneck blocks and a classifier head, as He et al. 2016 describe it.

Shows that meshplan plans a CNN: convolution FLOPs and saved activations come from the traced
ops, and BatchNorm's running statistics are buffers the plan must keep consistent (data
parallelism synchronizes the batch statistics across replicas, see README). Follows meshplan's
model-file contract: ``build_model(**kwargs)``, ``make_batch(batch_size, step=0)``, ``TRAINING``.

    plan examples/resnet.py --gpus 8 --model-arg size=resnet50
"""

from __future__ import annotations

import torch
from torch import nn

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "bf16", "lr": 0.1}

# name: (blocks per stage, base width, image size, classes)
SIZES: dict[str, tuple[tuple[int, ...], int, int, int]] = {
    "tiny": ((1, 1), 8, 32, 10),
    "resnet50": ((3, 4, 6, 3), 64, 224, 1000),
    "resnet101": ((3, 4, 23, 3), 64, 224, 1000),
    "resnet152": ((3, 8, 36, 3), 64, 224, 1000),
}
SIZES["full"] = SIZES["resnet50"]
EXPANSION = 4

_current = {"image": SIZES["tiny"][2], "classes": SIZES["tiny"][3]}


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand, each with BatchNorm; projection shortcut when the
    shape changes."""

    def __init__(self, inputs: int, width: int, stride: int) -> None:
        super().__init__()
        out = width * EXPANSION
        self.conv1 = nn.Conv2d(inputs, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU()
        self.shortcut = (
            nn.Sequential(nn.Conv2d(inputs, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))
            if stride != 1 or inputs != out
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        return self.relu(self.bn3(self.conv3(y)) + self.shortcut(x))


class Stem(nn.Module):
    """7x7 stride-2 convolution, BatchNorm, ReLU and 3x3 max-pool (a quarter of the image)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(torch.relu(self.bn(self.conv(x))))


class Head(nn.Module):
    """Global average pool and the linear classifier."""

    def __init__(self, inputs: int, classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(inputs, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.mean(dim=(2, 3)))


class ResNet(nn.Module):
    def __init__(self, depths: tuple[int, ...], width: int, classes: int) -> None:
        super().__init__()
        self.stem = Stem(width)
        blocks, inputs = [], width
        for stage, depth in enumerate(depths):
            for i in range(depth):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(Bottleneck(inputs, width * 2**stage, stride))
                inputs = width * 2**stage * EXPANSION
        self.blocks = nn.Sequential(*blocks)
        self.head = Head(inputs, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(images)))


def build_model(size: str = "tiny", layers: int | None = None) -> nn.Module:
    """A named size; ``layers`` overrides the depth of every stage."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    depths, width, image, classes = SIZES[size]
    if layers is not None:
        depths = tuple(layers for _ in depths)
    _current["image"], _current["classes"] = image, classes
    return ResNet(depths, width, classes)


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic images and labels per step: the same global batch whatever the plan."""
    g = torch.Generator().manual_seed(5000 + step)
    size = _current["image"]
    images = torch.randn(batch_size, 3, size, size, generator=g)
    return images, torch.randint(0, _current["classes"], (batch_size,), generator=g)
