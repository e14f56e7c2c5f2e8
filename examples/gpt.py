"""A GPT in one file, written the way Megatron's activation-memory analysis assumes.

Learned positions, pre-LayerNorm, separate Q/K/V projections, explicit softmax attention
(so the scores are materialised and show up in the saved activations), GeLU MLP with
d_ff = 4h and optional dropout. Follows meshplan's model-file contract:
``build_model(**kwargs)``, ``make_batch(batch_size, step=0)`` and ``TRAINING``.

    plan examples/gpt.py --gpus 8 --model-arg size=1.3b
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# name: (layers, hidden, heads, seq_len, vocab)
SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "tiny": (2, 64, 4, 32, 128),
    "small": (4, 128, 4, 64, 512),
    "125m": (12, 768, 12, 2048, 51200),
    "350m": (24, 1024, 16, 2048, 51200),
    "760m": (24, 1536, 16, 2048, 51200),
    "1.3b": (24, 2048, 16, 2048, 51200),
    "2.7b": (32, 2560, 32, 2048, 51200),
    "6.7b": (32, 4096, 32, 2048, 51200),
    "13b": (40, 5120, 40, 2048, 51200),
    "gpt3-175b": (96, 12288, 96, 2048, 51200),
}

TRAINING = {"global_batch_size": 8, "optimizer": "adamw", "dtype": "bf16", "lr": 3e-4}

_current: dict[str, int] = {"seq_len": SIZES["tiny"][3], "vocab": SIZES["tiny"][4]}


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, seq_len: int, dropout: float) -> None:
        super().__init__()
        self.head_dim = hidden // heads
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)
        mask = torch.tril(torch.ones(seq_len, seq_len, dtype=torch.bool))
        self.register_buffer("causal", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: the local head count under tensor parallelism is inferred, not assumed.
        q = self.q(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        scores = scores.masked_fill(~self.causal[:s, :s], float("-inf"))
        probs = self.attn_drop(F.softmax(scores, dim=-1))
        y = (probs @ v).transpose(1, 2).reshape(b, s, -1)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, hidden: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(F.gelu(self.fc1(x))))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, seq_len: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads, seq_len, dropout)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = MLP(hidden, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(
        self, layers: int, hidden: int, heads: int, seq_len: int, vocab: int, dropout: float
    ) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not divisible by {heads} heads")
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq_len, hidden)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(Block(hidden, heads, seq_len, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln_f(x))


def build_model(
    size: str = "tiny",
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    seq_len: int | None = None,
    vocab: int | None = None,
    dropout: float = 0.0,
) -> nn.Module:
    """Named size, with any dimension overridden by its own argument."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    base = SIZES[size]
    dims = [
        v if v is not None else d for v, d in zip((layers, hidden, heads, seq_len, vocab), base)
    ]
    _current["seq_len"], _current["vocab"] = dims[3], dims[4]
    return GPT(*dims, dropout=dropout)


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic token ids per step: the same global batch whatever the parallel plan."""
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, _current["vocab"], (batch_size, _current["seq_len"] + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]
