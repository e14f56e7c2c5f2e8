"""A tiny transformers CANINE, as a model no one here wrote: its character embeddings, the
local character encoder and the downsampling convolution have no repeated container around
them, so they trace into one block of several modules, and the character encoder's attention
reshapes with the head count fixed (view(batch, -1, heads, head_dim)). The eager probe ran
blocks of one module only, so that attention split its heads on local shards and every
worker crashed. Follows the model-file contract."""

from __future__ import annotations

import torch
from torch import nn
from transformers import CanineConfig, CanineForSequenceClassification

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}
CHARS, CLASSES = 32, 10


class Classifier(nn.Module):
    """The logits alone (transformers returns an output object)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=ids).logits


def build_model(size: str = "tiny", dtype: str = "float32") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    config = CanineConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        num_hash_functions=4,
        num_hash_buckets=64,
        downsampling_rate=4,
        local_transformer_stride=8,
        max_position_embeddings=64,
        num_labels=CLASSES,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.2,
    )
    return Classifier(CanineForSequenceClassification(config)).to(getattr(torch, dtype))


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7600 + step)
    ids = torch.randint(3, 1000, (batch_size, CHARS), generator=g)
    return ids, torch.randint(0, CLASSES, (batch_size,), generator=g)
