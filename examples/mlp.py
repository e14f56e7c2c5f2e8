"""A deep residual MLP classifier: proof that meshplan is not transformer-only.

No attention, no sequence dimension, no embeddings: an input projection, a stack of pre-LayerNorm
residual blocks (Linear to 4x width, GeLU, Linear back), a final LayerNorm and a class head. The
inputs are 2-D (batch, features), so the default loss (cross-entropy over the last dim) applies
to (batch, classes) logits and integer targets. Targets come from a fixed random linear teacher,
so the task is learnable and a short run shows the loss going down. Follows meshplan's
model-file contract: ``build_model(**kwargs)``, ``make_batch(batch_size, step=0)`` and
``TRAINING``.

    plan examples/mlp.py --gpus 8 --model-arg size=1b
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# name: (layers, width, in_features, classes)
SIZES: dict[str, tuple[int, int, int, int]] = {
    "tiny": (4, 32, 16, 10),
    "small": (8, 256, 64, 100),
    "1b": (30, 2048, 1024, 1000),
}

TRAINING = {"global_batch_size": 32, "optimizer": "adamw", "dtype": "fp32", "lr": 1e-3}

_current: dict[str, int] = {"in_features": SIZES["tiny"][2], "classes": SIZES["tiny"][3]}


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class ResidualMLP(nn.Module):
    def __init__(self, layers: int, width: int, in_features: int, classes: int) -> None:
        super().__init__()
        self.proj = nn.Linear(in_features, width)
        self.layers = nn.ModuleList(Block(width) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def build_model(
    size: str = "tiny",
    layers: int | None = None,
    width: int | None = None,
    in_features: int | None = None,
    classes: int | None = None,
) -> nn.Module:
    """Named size, with any dimension overridden by its own argument."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    given = (layers, width, in_features, classes)
    dims = [v if v is not None else d for v, d in zip(given, SIZES[size])]
    _current["in_features"], _current["classes"] = dims[2], dims[3]
    return ResidualMLP(*dims)


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic inputs per step, labelled by a fixed teacher (the same for every step)."""
    n_in, n_cls = _current["in_features"], _current["classes"]
    teacher = torch.randn(n_in, n_cls, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1000 + step)
    inputs = torch.randn(batch_size, n_in, generator=g)
    return inputs, (inputs @ teacher).argmax(dim=-1)
