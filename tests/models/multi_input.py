"""A model of four inputs, as HuggingFace models take ids, a mask and token types: one it never
reads, two of one shape and dtype that its first layer reads in the other order than its
signature's (BERT's embeddings read the token types before the encoder reads the mask), and a
head that takes a list of features and reads the last (DPT's depth head). Its two halves cost
the same, so a two-stage pipeline cuts between them, and the head runs in the second stage.
Follows the model-file contract."""

from __future__ import annotations

import torch
from torch import nn

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}
WIDTH, CLASSES = 512, 10


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.Tanh(), nn.Linear(4 * WIDTH, WIDTH))


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(WIDTH, CLASSES)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        return self.out(features[-1])


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = _mlp()
        self.second = _mlp()
        self.head = Head()

    def forward(
        self, x: torch.Tensor, unused: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor
    ) -> torch.Tensor:
        low = self.first(x + shift) * scale
        high = self.second(low)
        return self.head([low, high])


def build_model(size: str = "tiny", dtype: str = "float32") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    torch.manual_seed(0)
    return Net().to(getattr(torch, dtype))


def make_batch(batch_size: int, step: int = 0) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    g = torch.Generator().manual_seed(7900 + step)
    x, unused, scale, shift = torch.randn(4, batch_size, WIDTH, generator=g)
    return (x, unused, 1 + 0.5 * scale, shift), torch.randint(
        0, CLASSES, (batch_size,), generator=g
    )
