"""A tiny transformers DeepSeek-V3 (multi-head latent attention, a dense first layer, routed
plus shared experts with grouped top-k routing), as a model no one here wrote: the runtime
oracle trains it with expert parallelism. Follows meshplan's model-file contract."""

from __future__ import annotations

import torch
from torch import nn
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

TRAINING = {"global_batch_size": 8, "optimizer": "adamw", "dtype": "bf16", "lr": 3e-4}
SEQ, VOCAB = 32, 128


def build_model(size: str = "tiny", dense: bool = False) -> nn.Module:
    """``dense``: every layer dense, with a low-rank query and value heads narrower than the
    query/key heads (24 against 16), as DeepSeek-V2/V3 have them: multi-head latent attention
    alone, which tensor parallelism splits by heads."""
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    if dense:
        layers = dict(first_k_dense_replace=2, q_lora_rank=24, qk_nope_head_dim=16)
    else:
        layers = dict(first_k_dense_replace=1, q_lora_rank=None, qk_nope_head_dim=8)
    config = DeepseekV3Config(
        **layers,
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        n_shared_experts=1,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        max_position_embeddings=SEQ,
        use_cache=False,
        attn_implementation="sdpa",
        experts_implementation="grouped_mm",
    )
    return DeepseekV3ForCausalLM(config)


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3000 + step)
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]
