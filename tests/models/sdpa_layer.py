"""One causal self-attention layer through ``scaled_dot_product_attention`` (fused attention),
a grouped-query variant (fewer key/value heads, ``enable_gqa``) and a masked cross-attention
of a second, shorter sequence, followed by an MLP: the attention forms the FLOP and saved-bytes
references check. Follows meshplan's model-file contract."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

TRAINING = {"global_batch_size": 4, "optimizer": "adamw", "dtype": "fp32", "lr": 1e-3}
SEQ, MEMORY, WIDTH, HEADS, KV_HEADS, VOCAB = 24, 8, 48, 6, 2, 64


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head_dim = WIDTH // HEADS
        self.norm = nn.LayerNorm(WIDTH)
        self.q = nn.Linear(WIDTH, WIDTH)
        self.kv = nn.Linear(WIDTH, 2 * KV_HEADS * self.head_dim)
        self.cross_q = nn.Linear(WIDTH, WIDTH, bias=False)
        self.cross_kv = nn.Linear(WIDTH, 2 * WIDTH, bias=False)
        self.out = nn.Linear(WIDTH, WIDTH)
        self.fc1 = nn.Linear(WIDTH, 2 * WIDTH)
        self.fc2 = nn.Linear(2 * WIDTH, WIDTH)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return x.view(b, s, -1, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        k, v = self.kv(h).chunk(2, dim=-1)
        y = F.scaled_dot_product_attention(
            self.heads(self.q(h)), self.heads(k), self.heads(v), is_causal=True, enable_gqa=True
        )
        x = x + self.out(y.transpose(1, 2).flatten(2))
        ck, cv = self.cross_kv(memory).chunk(2, dim=-1)
        keep = torch.ones(x.shape[1], memory.shape[1], dtype=torch.bool, device=x.device).tril(4)
        y = F.scaled_dot_product_attention(
            self.heads(self.cross_q(x)), self.heads(ck), self.heads(cv), attn_mask=keep
        )
        x = x + y.transpose(1, 2).flatten(2)
        return x + self.fc2(F.gelu(self.fc1(x)))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(Layer() for _ in range(2))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, memory)
        return self.head(x)


def build_model(size: str = "tiny") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    return Model()


def make_batch(batch_size: int, step: int = 0):
    g = torch.Generator().manual_seed(4000 + step)
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ + 1), generator=g)
    memory = torch.randn(batch_size, MEMORY, WIDTH, generator=g)
    return (tokens[:, :-1], memory), tokens[:, 1:]
