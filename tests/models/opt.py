"""A tiny transformers OPT, as a model no one here wrote: its output projection is the token
embedding (tied), its positions a learned embedding with its own forward, its attention
transposes before the output projection. Follows meshplan's model-file contract."""

from __future__ import annotations

import torch
from torch import nn
from transformers import OPTConfig, OPTForCausalLM

TRAINING = {"global_batch_size": 8, "optimizer": "adamw", "dtype": "bf16", "lr": 3e-4}
SEQ, VOCAB = 32, 128


def build_model(size: str = "tiny", layers: int = 2, dtype: str = "float32") -> nn.Module:
    """``dtype``: the parameters' torch dtype (the oracle trains AdamW cases in float64)."""
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    config = OPTConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=layers,
        ffn_dim=128,
        num_attention_heads=4,
        max_position_embeddings=SEQ,
        word_embed_proj_dim=64,
        dropout=0.0,
        attention_dropout=0.0,
        pad_token_id=1,
        bos_token_id=2,
        eos_token_id=2,
        use_cache=False,
        attn_implementation="sdpa",
    )
    return OPTForCausalLM(config).to(getattr(torch, dtype))


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3000 + step)
    tokens = torch.randint(3, VOCAB, (batch_size, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]
