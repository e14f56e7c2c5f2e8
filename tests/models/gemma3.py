"""A tiny transformers Gemma-3 (text), as a model no one here wrote: its per-head q/k norms
scale by ``1 + weight``, so under tensor parallelism the partial gradient falls on that sum, a
value computed from the weight alone, and the weight's gradient must be summed over the TP
ranks as a plain per-head norm's is. Follows the model-file contract."""

from __future__ import annotations

import torch
from torch import nn
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

TRAINING = {"global_batch_size": 8, "optimizer": "adamw", "dtype": "bf16", "lr": 3e-4}
SEQ, VOCAB = 32, 128


def build_model(size: str = "tiny", dtype: str = "float32", layers: int = 2) -> nn.Module:
    """``layers``: sliding-window and full attention alternate, a sliding one first."""
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    config = Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=8,
        layer_types=[("sliding_attention", "full_attention")[i % 2] for i in range(layers)],
        max_position_embeddings=SEQ,
        initializer_range=0.2,
        attention_dropout=0.0,
        use_cache=False,
        attn_implementation="eager",
    )
    return Gemma3ForCausalLM(config).to(getattr(torch, dtype))


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7500 + step)
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]
