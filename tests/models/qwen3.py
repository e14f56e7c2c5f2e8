"""A tiny transformers Qwen3, as a model no one here wrote: its attention normalizes each head's
queries and keys (``q_norm`` / ``k_norm``, RMSNorm weights shared by every head), so under
tensor parallelism those replicated weights see only the rank's heads and their gradients
must be summed over the TP ranks (``BlockPlan.tp_grad_sums``). Follows the model-file
contract."""

from __future__ import annotations

import torch
from torch import nn
from transformers import Qwen3Config, Qwen3ForCausalLM

TRAINING = {"global_batch_size": 8, "optimizer": "adamw", "dtype": "bf16", "lr": 3e-4}
SEQ, VOCAB = 32, 128


def build_model(size: str = "tiny", layers: int = 2, dtype: str = "float32") -> nn.Module:
    """``dtype``: the parameters' torch dtype (the oracle trains AdamW cases in float64)."""
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=SEQ,
        tie_word_embeddings=False,
        attention_dropout=0.0,
        use_cache=False,
        attn_implementation="sdpa",
    )
    return Qwen3ForCausalLM(config).to(getattr(torch, dtype))


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5000 + step)
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]
