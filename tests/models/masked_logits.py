"""A small language model that writes into its head's output in place, as Chameleon masks the
logits of its image tokens (``logits[:, :, image_ids] = finfo.min``): under tensor parallelism
the head's gathered output must be a tensor the model may write into. Follows the model-file
contract."""

from __future__ import annotations

import torch
from torch import nn

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}
VOCAB, WIDTH, SEQ = 512, 256, 16
BANNED = (3, 5, 7)  # token ids the model never predicts


class MaskedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.body = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        x = x + self.body(x)
        logits = self.head(self.norm(x))
        logits[:, :, list(BANNED)] = torch.finfo(logits.dtype).min
        return logits


def build_model(size: str = "tiny") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    torch.manual_seed(0)
    return MaskedLM()


def make_batch(batch_size: int, step: int = 0) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    g = torch.Generator().manual_seed(9100 + step)
    ids = torch.randint(0, VOCAB, (batch_size, SEQ + 1), generator=g)
    return (ids[:, :-1],), ids[:, 1:]


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
