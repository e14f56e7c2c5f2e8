"""A small MLP whose forward raises once it runs under torch.distributed (never while meshplan
traces it): stands for a bug that shows only in the runtime, which must end ``plan run`` in one
line, not in every rank's traceback. Follows the model-file contract."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}
WIDTH, CLASSES = 64, 10


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if dist.is_initialized():
            raise RuntimeError("the model's own failure under torch.distributed")
        return self.head(torch.tanh(self.body(x)))


def build_model(size: str = "tiny") -> nn.Module:
    torch.manual_seed(0)
    return Net()


def make_batch(batch_size: int, step: int = 0) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    g = torch.Generator().manual_seed(8100 + step)
    return (torch.randn(batch_size, WIDTH, generator=g),), torch.randint(
        0, CLASSES, (batch_size,), generator=g
    )
