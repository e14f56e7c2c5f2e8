"""A small language model whose encoder calls each layer's ``forward`` directly
(``layer.forward(h)``), not the layer itself, as transformers' SqueezeBERT does: the layer's
hooks never fire, and FSDP2's gathers, the composable checkpoint and sequence parallelism all
live in hooks. Follows the model-file contract."""

from __future__ import annotations

import torch
from torch import nn

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}
VOCAB, WIDTH, SEQ, LAYERS = 256, 64, 16, 3


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.down(torch.tanh(self.up(self.norm(h))))


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            h = layer.forward(h)  # the point of this model: no __call__, no hooks
        return h


class DirectLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.encoder = Encoder()
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(ids)))


def build_model(size: str = "tiny") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    torch.manual_seed(0)
    return DirectLM()


def make_batch(batch_size: int, step: int = 0) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    g = torch.Generator().manual_seed(9300 + step)
    ids = torch.randint(0, VOCAB, (batch_size, SEQ + 1), generator=g)
    return (ids[:, :-1],), ids[:, 1:]


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
