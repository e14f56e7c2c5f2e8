"""A tiny transformers Qwen3-MoE, as a model no one here wrote: under tensor parallelism its
attention runs on DTensors, where the per-head q/k norms' replicated weights are replicas, so
autograd hands them DTensor gradients, partial over the TP ranks, that must become their plain
sums before the optimizer step. Follows the model-file contract."""

from __future__ import annotations

import torch
from torch import nn
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

TRAINING = {"global_batch_size": 8, "optimizer": "adamw", "dtype": "bf16", "lr": 3e-4}
SEQ, VOCAB = 32, 128


def build_model(
    size: str = "tiny", dtype: str = "float32", layers: int = 2, sparse_step: int = 1
) -> nn.Module:
    """``sparse_step``: experts in every such layer (the others dense), as Qwen2-MoE can."""
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    config = Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=layers,
        decoder_sparse_step=sparse_step,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=SEQ,
        initializer_range=0.2,
        tie_word_embeddings=False,
        attention_dropout=0.0,
        use_cache=False,
        attn_implementation="sdpa",
    )
    return Qwen3MoeForCausalLM(config).to(getattr(torch, dtype))


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7400 + step)
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]
