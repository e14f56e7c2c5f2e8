"""Mixtral from HuggingFace transformers, built from a config with nothing downloaded.

The library's mixture-of-experts model unchanged: ``transformers.MixtralForCausalLM`` (Llama's
attention and RMSNorm, every MLP a top-2 router over SwiGLU experts stored as 3-D tensors). As
in examples/llama.py the config sets ``use_cache=False`` and ``attn_implementation="sdpa"``.

``experts_implementation="grouped_mm"`` is the setting that makes the experts traceable and
cheap to plan: the "eager" loop visits the experts hit by the routing (``nonzero``/``where``),
a data-dependent shape that ``torch.export`` cannot trace on the meta device, and "batched_mm"
gathers one copy of an expert's weights per (token, expert) pair, a (tokens*k, 2*ffn, hidden)
tensor. "grouped_mm" sorts the tokens by expert and makes one grouped product per projection,
static shapes whatever the routing: ``aten._grouped_mm`` when traced in bf16, transformers'
``grouped_mm_fallback`` custom op in other dtypes; on a CPU it runs in fp32 and bf16 and matches
"eager". The bf16 meta kernel asks for 16-byte rows: hidden and ffn a multiple of 8.

Router jitter is 0 and ``output_router_logits=False``, so no auxiliary load-balancing loss is
computed and the planner's default cross-entropy on ``.logits`` is the whole loss. Follows
meshplan's model-file contract: ``build_model(**kwargs)``, ``make_batch(batch_size, step=0)``
and ``TRAINING``.

    plan examples/mixtral.py --gpus 64 --model-arg size=mixtral-8x7b
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import MixtralConfig, MixtralForCausalLM

# name: (layers, hidden, heads, kv_heads, ffn, experts, top_k, seq_len, vocab)
SIZES: dict[str, tuple[int, int, int, int, int, int, int, int, int]] = {
    "tiny": (2, 64, 4, 2, 128, 4, 2, 32, 128),
    "mixtral-8x7b": (32, 4096, 32, 8, 14336, 8, 2, 4096, 32000),
    "mixtral-8x22b": (56, 6144, 48, 8, 16384, 8, 2, 4096, 32768),
}

TRAINING = {"global_batch_size": 8, "optimizer": "adamw", "dtype": "bf16", "lr": 3e-4}

_current: dict[str, int] = {"seq_len": SIZES["tiny"][7], "vocab": SIZES["tiny"][8]}


def make_config(
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    experts: int,
    top_k: int,
    seq_len: int,
    vocab: int,
) -> MixtralConfig:
    """The Mixtral recipe at the given dimensions, set up for a cache-free, traceable forward."""
    if hidden % heads:
        raise ValueError(f"hidden size {hidden} is not divisible by {heads} heads")
    if heads % kv_heads:
        raise ValueError(f"{heads} heads are not divisible into {kv_heads} key/value groups")
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k={top_k} must be between 1 and the {experts} experts")
    return MixtralConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        num_local_experts=experts,
        num_experts_per_tok=top_k,
        max_position_embeddings=seq_len,
        rms_norm_eps=1e-5,
        # transformers 5 keeps rope_theta inside rope_parameters.
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=False,
        attention_dropout=0.0,
        router_jitter_noise=0.0,
        output_router_logits=False,
        use_cache=False,
        attn_implementation="sdpa",
        experts_implementation="grouped_mm",
    )


def build_model(
    size: str = "tiny",
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    ffn: int | None = None,
    experts: int | None = None,
    top_k: int | None = None,
    seq_len: int | None = None,
    vocab: int | None = None,
) -> nn.Module:
    """Named size, with any dimension overridden by its own argument."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    given = (layers, hidden, heads, kv_heads, ffn, experts, top_k, seq_len, vocab)
    dims = [v if v is not None else d for v, d in zip(given, SIZES[size])]
    _current["seq_len"], _current["vocab"] = dims[7], dims[8]
    return MixtralForCausalLM(make_config(*dims))


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic token ids per step: the same global batch whatever the parallel plan."""
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, _current["vocab"], (batch_size, _current["seq_len"] + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]
