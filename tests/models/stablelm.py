"""A tiny transformers StableLM, as a model no one here wrote: its attention reshapes q, k and
v with the module's own head count (``view(bsz, q_len, self.num_heads, head_dim)``), which a
column-parallel shard fails, and rotates only part of each head with rotary tables that are
plain tensors. Under tensor parallelism the planner keeps the block on DTensors
(``colwise_dtensor``), so its backward multiplies DTensor gradients by those plain tables
(``runtime.dtensor_blocks.backward_replication``). Its forward builds position ids, which
transformers' mask code inspects with ``.all()`` unless it sees fake tensors (the planner's
eager probe). Follows the model-file contract."""

from __future__ import annotations

import torch
from torch import nn
from transformers import StableLmConfig, StableLmForCausalLM

TRAINING = {"global_batch_size": 8, "optimizer": "adamw", "dtype": "bf16", "lr": 3e-4}
SEQ, VOCAB = 32, 128


def build_model(size: str = "tiny", layers: int = 2, dtype: str = "float32") -> nn.Module:
    """``dtype``: the parameters' torch dtype (the oracle trains AdamW cases in float64)."""
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    config = StableLmConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        partial_rotary_factor=0.25,
        max_position_embeddings=SEQ,
        initializer_range=0.2,
        tie_word_embeddings=False,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        use_cache=False,
        attn_implementation="sdpa",
    )
    return StableLmForCausalLM(config).to(getattr(torch, dtype))


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(6000 + step)
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]
