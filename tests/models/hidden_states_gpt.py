"""examples/gpt.py's layers in a model that reads every layer's hidden states: the head sees
the mean of all of them (as a model returning its hidden states, or a layer-weighted sum,
does). Each layer's output then feeds the next layer and the head, so the residual stream
cannot stay sequence-sharded between the layers (tests/test_sequence_stream.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import nn

_spec = importlib.util.spec_from_file_location(
    "hidden_states_gpt_base", Path(__file__).resolve().parents[2] / "examples" / "gpt.py"
)
_gpt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_gpt)

TRAINING = _gpt.TRAINING
make_batch = _gpt.make_batch


class MeanOfLayers(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.gpt = model

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        g = self.gpt
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = g.drop(g.wte(idx) + g.wpe(pos))
        states = []
        for layer in g.layers:
            x = layer(x)
            states.append(x)
        return g.head(g.ln_f(torch.stack(states).mean(0)))


def build_model(size: str = "tiny", **kwargs) -> nn.Module:
    return MeanOfLayers(_gpt.build_model(size, **kwargs))
