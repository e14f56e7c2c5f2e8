"""A small language model that keeps a frozen teacher layer updated in its own forward by an
exponential moving average of a weight of its first block (``teacher.weight.mul_(0.99).add_(
...)`` under ``no_grad``, as self-distillation and momentum-encoder models do): code outside the
block reads the block's weight without a gradient, and a weight changes in place in forward.
Follows the model-file contract."""

from __future__ import annotations

import torch
from torch import nn

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}
VOCAB, WIDTH, SEQ, LAYERS = 256, 64, 16, 2


class EmaTeacherLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(),
                          nn.Linear(4 * WIDTH, WIDTH))
            for _ in range(LAYERS)
        )  # fmt: skip
        self.norm = nn.LayerNorm(WIDTH)
        self.teacher = nn.Linear(WIDTH, WIDTH).requires_grad_(False)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = h + layer(h)
        with torch.no_grad():
            self.teacher.weight.mul_(0.99).add_(self.layers[0][1].weight[:WIDTH] * 0.01)
        return self.head(self.norm(h) + 0.1 * self.teacher(h).detach())


def build_model(size: str = "tiny") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    torch.manual_seed(0)
    return EmaTeacherLM()


def make_batch(batch_size: int, step: int = 0) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    g = torch.Generator().manual_seed(9800 + step)
    ids = torch.randint(0, VOCAB, (batch_size, SEQ + 1), generator=g)
    return (ids[:, :-1],), ids[:, 1:]


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
