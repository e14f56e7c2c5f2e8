"""A tiny transformers GPT-2, as a model no one here wrote: its output projection is the token
embedding (tied) and its projections are transformers' ``Conv1D`` (weight stored [in, out],
computed with addmm), not ``nn.Linear``. Follows meshplan's model-file contract."""

from __future__ import annotations

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

TRAINING = {"global_batch_size": 8, "optimizer": "adamw", "dtype": "bf16", "lr": 3e-4}
SEQ, VOCAB = 32, 128


def build_model(size: str = "tiny", layers: int = 2, dtype: str = "float32") -> nn.Module:
    """``dtype``: the parameters' torch dtype (the oracle trains AdamW cases in float64)."""
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    config = GPT2Config(
        vocab_size=VOCAB,
        n_embd=64,
        n_layer=layers,
        n_head=4,
        n_positions=SEQ,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
        attn_implementation="sdpa",
    )
    return GPT2LMHeadModel(config).to(getattr(torch, dtype))


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(4000 + step)
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]
