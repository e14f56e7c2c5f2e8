"""A GPT at any published shape, for benchmarks/published.py: the decoder the GPT-family rows
(MPT, BLOOM, Megatron GPT) ran, with the dimensions they state.

Pre-LayerNorm, fused Q/K/V projection, GeLU MLP of width ``ffn`` (4h unless the row says
otherwise), learned positions, token embedding tied to the output projection (MPT, BLOOM and
Megatron's GPT tie them; under TP one table split along its vocabulary serves the lookup and
the head, as meshplan plans it; ``tied=False`` with a pipeline, where the last stage keeps its
own copy of the embedding, as an untied model does). ``attention`` picks the kernel the source
ran: ``"flash"`` is one fused causal ``scaled_dot_product_attention`` (FlashAttention:
llm-foundry's MPT, Megatron-Core), ``"fused"`` materialises the scores through one softmax
kernel (Megatron-DeepSpeed's FusedScaleMaskSoftmax, which BLOOM's 2022 runs used: the full
s x s product, no causal skipping). Follows meshplan's model-file contract.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

TRAINING = {"global_batch_size": 8, "optimizer": "adamw", "dtype": "bf16", "lr": 3e-4}

_current: dict[str, int] = {"seq_len": 32, "vocab": 128}


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, attention: str, kv_heads: int) -> None:
        super().__init__()
        self.head_dim = hidden // heads
        self.attention = attention
        self.kv_heads = kv_heads
        self.group = heads // kv_heads
        self.qkv = nn.Linear(hidden, (heads + 2 * kv_heads) * self.head_dim)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        if self.group > 1:
            # Grouped-query attention in Megatron's layout, per key/value group [q x group, k,
            # v] (megatron/core/transformer/attention.py, get_query_key_value_tensors): a
            # column shard of the projection is then whole groups
            qkv = self.qkv(x).view(b, s, self.kv_heads, self.group + 2, self.head_dim)
            q = qkv[:, :, :, : self.group].reshape(b, s, -1, self.head_dim).transpose(1, 2)
            k, v = (qkv[:, :, :, i].transpose(1, 2) for i in (self.group, self.group + 1))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return self.proj(y.transpose(1, 2).reshape(b, s, -1))
        # Megatron's fused-QKV layout, per head [q k v]: its ParallelAttention views the
        # projection's output as (s, b, heads, 3 * head_dim) and splits the last dimension
        # (Megatron-LM / Megatron-DeepSpeed megatron/model/transformer.py). A column shard of
        # the projection is then whole heads, so tensor parallelism splits the attention core
        # by heads; a [q | k | v] layout would cut across q, k and v instead.
        qkv = self.qkv(x).view(b, s, -1, 3, self.head_dim)
        q, k, v = qkv.permute(3, 0, 2, 1, 4)
        if self.attention == "flash":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            # the scale rides on q (FusedScaleMaskSoftmax applies it inside its one kernel):
            # the s x s scores are written once by the product and once by the softmax
            scores = (q * (1.0 / math.sqrt(self.head_dim))) @ k.transpose(-2, -1)
            y = F.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int, attention: str, kv_heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads, attention, kv_heads)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = MLP(hidden, ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(
        self,
        layers: int,
        hidden: int,
        heads: int,
        ffn: int,
        seq_len: int,
        vocab: int,
        attention: str,
        tied: bool,
        kv_heads: int,
    ) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not divisible by {heads} heads")
        if heads % kv_heads:
            raise ValueError(f"{heads} heads are not divisible into {kv_heads} key/value groups")
        if kv_heads != heads and attention != "flash":
            raise ValueError("grouped-query attention is built with the flash kernel only")
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq_len, hidden)
        self.layers = nn.ModuleList(
            Layer(hidden, heads, ffn, attention, kv_heads) for _ in range(layers)
        )
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        if tied:
            self.head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln_f(x))


def build_model(
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    ffn: int | None = None,
    seq_len: int = 32,
    vocab: int = 128,
    attention: str = "flash",
    tied: bool = True,
    kv_heads: int | None = None,
) -> nn.Module:
    if attention not in ("flash", "fused"):
        raise ValueError(f"attention must be 'flash' or 'fused', got {attention!r}")
    _current["seq_len"], _current["vocab"] = seq_len, vocab
    return GPT(
        layers, hidden, heads, ffn or 4 * hidden, seq_len, vocab, attention, tied, kv_heads or heads
    )


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, _current["vocab"], (batch_size, _current["seq_len"] + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]
