"""Llama 3 from HuggingFace transformers, built from a config with nothing downloaded.

Shows that meshplan plans an off-the-shelf library model, not only hand-written ones: this is
``transformers.LlamaForCausalLM`` unchanged (RMSNorm, rotary positions, grouped-query attention,
SwiGLU MLP, untied embeddings). The config sets ``use_cache=False`` so that ``model(input_ids)``
alone is a training forward, and ``attn_implementation="sdpa"`` so attention is one
``scaled_dot_product_attention`` call that ``torch.export`` traces on the meta device. The
``CausalLMOutputWithPast`` it returns is reduced to ``.logits`` by the planner. Follows meshplan's
model-file contract: ``build_model(**kwargs)``, ``make_batch(batch_size, step=0)`` and
``TRAINING``.

    plan examples/llama.py --gpus 64 --model-arg size=llama3-70b
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

# name: (layers, hidden, heads, kv_heads, ffn, seq_len, vocab)
SIZES: dict[str, tuple[int, int, int, int, int, int, int]] = {
    "tiny": (2, 64, 4, 2, 128, 32, 128),
    "llama3-8b": (32, 4096, 32, 8, 14336, 8192, 128256),
    "llama3-70b": (80, 8192, 64, 8, 28672, 8192, 128256),
    "llama3-405b": (126, 16384, 128, 8, 53248, 8192, 128256),
}

TRAINING = {"global_batch_size": 8, "optimizer": "adamw", "dtype": "bf16", "lr": 3e-4}

_current: dict[str, int] = {"seq_len": SIZES["tiny"][5], "vocab": SIZES["tiny"][6]}


def make_config(
    layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, seq_len: int, vocab: int
) -> LlamaConfig:
    """The Llama 3 recipe at the given dimensions, set up for a cache-free, traceable forward."""
    if hidden % heads:
        raise ValueError(f"hidden size {hidden} is not divisible by {heads} heads")
    if heads % kv_heads:
        raise ValueError(f"{heads} heads are not divisible into {kv_heads} key/value groups")
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=seq_len,
        rms_norm_eps=1e-5,
        # transformers 5 keeps rope_theta inside rope_parameters.
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        tie_word_embeddings=False,
        attention_dropout=0.0,
        use_cache=False,
        attn_implementation="sdpa",
    )


def build_model(
    size: str = "tiny",
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    ffn: int | None = None,
    seq_len: int | None = None,
    vocab: int | None = None,
) -> nn.Module:
    """Named size, with any dimension overridden by its own argument."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    given = (layers, hidden, heads, kv_heads, ffn, seq_len, vocab)
    dims = [v if v is not None else d for v, d in zip(given, SIZES[size])]
    _current["seq_len"], _current["vocab"] = dims[5], dims[6]
    return LlamaForCausalLM(make_config(*dims))


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic token ids per step: the same global batch whatever the parallel plan."""
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, _current["vocab"], (batch_size, _current["seq_len"] + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]
