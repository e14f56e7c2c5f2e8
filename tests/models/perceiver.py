"""A tiny transformers Perceiver (masked LM), as a model no one here wrote: its decoder
multiplies by the input embedding's weight, handed the embedding module as an argument (a
weight shared across modules under one path), and its learned latents, expanded over the
batch and normed, feed the cross-attention's column-parallel queries. Follows the model-file
contract."""

from __future__ import annotations

import torch
from torch import nn
from transformers import PerceiverConfig, PerceiverForMaskedLM

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}
VOCAB, SEQ = 128, 16


class MaskedLM(nn.Module):
    """The logits alone (transformers returns an output object)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.m(inputs=inputs).logits


def build_model(size: str = "tiny", dtype: str = "float32") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    config = PerceiverConfig(
        num_latents=8,
        d_latents=64,
        d_model=32,
        num_blocks=1,
        num_self_attends_per_block=2,
        num_self_attention_heads=4,
        num_cross_attention_heads=4,
        vocab_size=VOCAB,
        max_position_embeddings=SEQ,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.2,
    )
    return MaskedLM(PerceiverForMaskedLM(config)).to(getattr(torch, dtype))


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7500 + step)
    tokens = torch.randint(3, VOCAB, (batch_size, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]
