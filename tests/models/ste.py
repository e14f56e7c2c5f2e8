"""A small network quantized with a straight-through estimator: ``torch.autograd.Function``
whose backward passes the gradient through the rounding (autograd of round would give zero).
Applied inside a module of one tensor in and one out, which a pipeline stage runs eagerly, so
the function's own backward must survive the pipeline. Follows the model-file contract."""

from __future__ import annotations

import torch
from torch import nn

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}
WIDTH, CLASSES = 32, 10


class RoundSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return torch.round(x * 8) / 8

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return grad


class Quantize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return RoundSTE.apply(x)


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.quant = Quantize()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.quant(torch.tanh(self.fc(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(4))
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def build_model(size: str = "tiny", dtype: str = "float32") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    torch.manual_seed(0)
    return Net().to(getattr(torch, dtype))


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7700 + step)
    return torch.randn(batch_size, WIDTH, generator=g), torch.randint(
        0, CLASSES, (batch_size,), generator=g
    )
