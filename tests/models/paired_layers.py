"""Layers handed two tensors that return two: each layer takes the stream and a table made
outside every layer (as HF Llama's layers take the rotary tables), and passes on a new table
the next layer reads (as T5's layers pass on the position bias). The last layer's table is
read by nobody, so only that layer leaves one tensor: a pipeline stage can run it as the
model's eager module (``runtime.block_calls``), and the others as traced code. Follows the
model-file contract."""

from __future__ import annotations

import torch
from torch import nn

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}
WIDTH, CLASSES, LAYERS = 64, 10, 3


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mix = nn.Linear(WIDTH, WIDTH)
        self.gate = nn.Linear(WIDTH, WIDTH)

    def forward(self, h: torch.Tensor, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        table = torch.tanh(self.gate(table))
        return h + self.mix(h) * table, table


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(WIDTH, WIDTH)
        self.layers = nn.ModuleList([Layer() for _ in range(LAYERS)])
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, table = self.embed(x), torch.sin(x)
        for layer in self.layers:
            h, table = layer(h, table)
        return self.head(h)


def build_model(size: str = "tiny") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    torch.manual_seed(0)
    return Net()


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5100 + step)
    x = torch.randn(batch_size, WIDTH, generator=g)
    return x, torch.randint(0, CLASSES, (batch_size,), generator=g)
