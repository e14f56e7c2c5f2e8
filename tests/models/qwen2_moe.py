"""A tiny transformers Qwen2-MoE (routed plus shared experts), as a model no one here wrote: the
runtime oracle trains it with expert parallelism. Follows meshplan's model-file contract."""

from __future__ import annotations

import torch
from torch import nn
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

TRAINING = {"global_batch_size": 8, "optimizer": "adamw", "dtype": "bf16", "lr": 3e-4}
SEQ, VOCAB = 32, 128


def build_model(size: str = "tiny") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    config = Qwen2MoeConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=SEQ,
        use_cache=False,
        output_router_logits=False,
        attn_implementation="sdpa",
        experts_implementation="grouped_mm",  # eager experts cannot be traced (nonzero)
    )
    return Qwen2MoeForCausalLM(config)


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2000 + step)
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]
