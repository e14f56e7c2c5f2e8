"""Layers that repeat with a pattern, and layers that depend on their index: what the
block-deduplicated trace (planner/trace/repeats.py) must group by their real differences.

``pattern="every3"``: every third layer (by ``layer_idx``) adds a gate product with its own
weight, so the layers repeat with period 3. ``pattern="one_off"``: layer 5 alone scales its
input, from its index in control flow (no parameter tells it apart). ``pattern="skip"``: each
layer adds the output of the layer two before it (code between the layers: the container is
traced in full). ``pattern="plain"``: identical layers.
Follows meshplan's model-file contract.
"""

from __future__ import annotations

import torch
from torch import nn

TRAINING = {"global_batch_size": 4, "optimizer": "adamw", "dtype": "bf16", "lr": 1e-3}
HIDDEN, SEQ, VOCAB = 32, 8, 64


class Layer(nn.Module):
    def __init__(self, layer_idx: int, pattern: str) -> None:
        super().__init__()
        self.layer_idx, self.pattern = layer_idx, pattern
        self.norm = nn.LayerNorm(HIDDEN)
        self.up = nn.Linear(HIDDEN, 2 * HIDDEN)
        self.down = nn.Linear(2 * HIDDEN, HIDDEN)
        self.gate = nn.Linear(HIDDEN, 2 * HIDDEN) if self._gated() else None

    def _gated(self) -> bool:
        return self.pattern == "every3" and self.layer_idx % 3 == 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        if self.pattern == "one_off" and self.layer_idx == 5:
            h = h * 0.5
        u = torch.relu(self.up(h))
        if self.gate is not None:
            u = u * torch.sigmoid(self.gate(h))
        return x + self.down(u)


class Model(nn.Module):
    def __init__(self, layers: int, pattern: str) -> None:
        super().__init__()
        self.pattern = pattern
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Layer(i, pattern) for i in range(layers))
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        seen = [x]
        for layer in self.layers:
            x = layer(x)
            if self.pattern == "skip" and len(seen) >= 2:
                x = x + seen[-2]
            seen.append(x)
        return self.head(x)


def build_model(layers: int = 12, pattern: str = "plain") -> nn.Module:
    return Model(layers, pattern)


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]
