"""A small language model whose token embedding is built with ``sparse=True`` (its weight's
gradient is a sparse tensor, as in recommendation and word2vec-style models), trained with
SGD, the optimizer that takes such gradients. Follows the model-file contract."""

from __future__ import annotations

import torch
from torch import nn

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}
VOCAB, WIDTH, SEQ, LAYERS = 256, 64, 16, 2


class SparseLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH, sparse=True)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(),
                          nn.Linear(4 * WIDTH, WIDTH))
            for _ in range(LAYERS)
        )  # fmt: skip
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids) * 4.0  # scaled so that the looked-up rows move far enough
        for layer in self.layers:
            h = h + layer(h)
        return self.head(h)


def build_model(size: str = "tiny") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    torch.manual_seed(0)
    return SparseLM()


def make_batch(batch_size: int, step: int = 0) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    g = torch.Generator().manual_seed(9400 + step)
    ids = torch.randint(0, VOCAB, (batch_size, SEQ + 1), generator=g)
    return (ids[:, :-1],), ids[:, 1:]


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
