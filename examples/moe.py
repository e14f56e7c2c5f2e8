"""A mixture-of-experts GPT in one file: examples/gpt.py with each MLP replaced by routed experts.

Learned positions, pre-LayerNorm and explicit softmax attention as in gpt.py; every layer's MLP
is a Mixtral-style ``MoE``: a linear router, softmax in fp32, top-k experts per token with their
weights renormalised to sum to 1, SwiGLU experts. The experts are dropless and exact (no
capacity factor, no token is dropped or padded), and written so that ``torch.export`` traces
them with static shapes on the meta device: tokens are sorted by expert and each expert's rows
go through meshplan's ``grouped_mm`` custom op, one graph node per projection whose FLOPs do not
depend on the routing. A runtime that shards experts relies on the names ``router``,
``experts``, ``experts.num_experts``, ``experts.gate_up`` and ``experts.down``.

No auxiliary load-balancing loss: the model returns logits only, so the planner's default
cross-entropy is the whole loss (short runs train fine; long ones may want the aux loss back).
Follows meshplan's model-file contract: ``build_model(**kwargs)``, ``make_batch(batch_size,
step=0)`` and ``TRAINING``.

    plan examples/moe.py --gpus 64 --model-arg size=mixtral-8x7b
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from planner.grouped_mm import grouped_mm

# name: (layers, hidden, heads, experts, top_k, ffn, seq_len, vocab)
SIZES: dict[str, tuple[int, int, int, int, int, int, int, int]] = {
    "tiny": (2, 64, 4, 4, 2, 128, 32, 128),
    "tiny-top1": (2, 64, 4, 4, 1, 128, 32, 128),
    "small": (4, 128, 4, 8, 2, 256, 64, 512),
    "mixtral-8x7b": (32, 4096, 32, 8, 2, 14336, 4096, 32000),
    "mixtral-8x22b": (56, 6144, 48, 8, 2, 16384, 4096, 32768),
}

TRAINING = {"global_batch_size": 8, "optimizer": "adamw", "dtype": "bf16", "lr": 3e-4}

_current: dict[str, int] = {"seq_len": SIZES["tiny"][6], "vocab": SIZES["tiny"][7]}


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


class Experts(nn.Module):
    """``num_experts`` SwiGLU MLPs stored as two 3-D weights, so that expert parallelism is a
    slice of the leading dimension: a runtime may replace ``gate_up``/``down`` by experts
    [a, b), set ``num_experts = b - a`` and pass ids in [0, b - a). Everything here reads the
    expert count from ``num_experts``, which must match the weights' leading dimension."""

    def __init__(self, num_experts: int, hidden: int, ffn: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.gate_up = nn.Parameter(torch.empty(num_experts, hidden, 2 * ffn))
        self.down = nn.Parameter(torch.empty(num_experts, ffn, hidden))
        # GPT-2's normal(0, 0.02); nn.init on meta tensors allocates nothing.
        nn.init.normal_(self.gate_up, std=0.02)
        nn.init.normal_(self.down, std=0.02)

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        """(T, d) tokens, (T, k) expert ids and weights -> (T, d), each token the weighted sum
        of its k experts' outputs. Shapes depend on T and k only, never on the routing."""
        t, d = hidden_states.shape
        k = top_k_index.shape[-1]
        # Sort the T*k (token, expert) pairs by expert, stably so that each expert's rows keep
        # token order; grouped_mm then multiplies contiguous row blocks by one expert each.
        sorted_ids, perm = torch.sort(top_k_index.reshape(-1), stable=True)
        rows = hidden_states[perm // k]
        # Row ends per expert without a data-dependent shape (bincount/nonzero have none).
        experts = torch.arange(self.num_experts, device=sorted_ids.device)
        offsets = torch.searchsorted(sorted_ids, experts, right=True)
        gate, up = grouped_mm(rows, self.gate_up, offsets).chunk(2, dim=-1)
        out = grouped_mm(F.silu(gate) * up, self.down, offsets)
        out = out * top_k_weights.reshape(-1)[perm].unsqueeze(-1)
        # Back to (token, slot) order, then the weighted sum over each token's k experts.
        out = torch.zeros_like(out).index_copy(0, perm, out)
        return out.view(t, k, d).sum(1)


class MoE(nn.Module):
    """Mixtral's routing: softmax over all experts in fp32, keep the top k, renormalise."""

    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int, dropout: float) -> None:
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = Experts(experts, hidden, ffn)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        tokens = x.reshape(b * s, d)
        probs = F.softmax(self.router(tokens).float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        return self.drop(self.experts(tokens, ids, weights).view(b, s, d))


class Block(nn.Module):
    def __init__(
        self, hidden: int, heads: int, experts: int, top_k: int, ffn: int, seq_len: int, p: float
    ) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads, seq_len, p)
        self.ln2 = nn.LayerNorm(hidden)
        self.moe = MoE(hidden, ffn, experts, top_k, p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.moe(self.ln2(x))


class MoEGPT(nn.Module):
    def __init__(
        self,
        layers: int,
        hidden: int,
        heads: int,
        experts: int,
        top_k: int,
        ffn: int,
        seq_len: int,
        vocab: int,
        dropout: float,
    ) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not divisible by {heads} heads")
        if not 1 <= top_k <= experts:
            raise ValueError(f"top_k={top_k} must be between 1 and the {experts} experts")
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq_len, hidden)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            Block(hidden, heads, experts, top_k, ffn, seq_len, dropout) for _ in range(layers)
        )
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
    experts: int | None = None,
    top_k: int | None = None,
    ffn: int | None = None,
    seq_len: int | None = None,
    vocab: int | None = None,
    dropout: float = 0.0,
) -> nn.Module:
    """Named size, with any dimension overridden by its own argument."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    given = (layers, hidden, heads, experts, top_k, ffn, seq_len, vocab)
    dims = [v if v is not None else d for v, d in zip(given, SIZES[size])]
    _current["seq_len"], _current["vocab"] = dims[6], dims[7]
    return MoEGPT(*dims, dropout=dropout)


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic token ids per step: the same global batch whatever the parallel plan."""
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, _current["vocab"], (batch_size, _current["seq_len"] + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]
