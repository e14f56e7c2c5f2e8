"""A tiny transformers PatchTST forecaster (a multivariate series cut into patches, a
transformer over each channel's patches, a linear head predicting the next steps), as a
time-series model no one here wrote. The loss is the mean squared error of the
``PatchTSTForPredictionOutput``'s forecast. Follows the model-file contract."""

from __future__ import annotations

import torch
from torch import nn
from transformers import PatchTSTConfig, PatchTSTForPrediction

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}
CONTEXT, HORIZON, CHANNELS = 32, 8, 3


def build_model(size: str = "tiny") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    config = PatchTSTConfig(
        num_input_channels=CHANNELS,
        context_length=CONTEXT,
        prediction_length=HORIZON,
        patch_length=8,
        patch_stride=8,
        d_model=32,
        num_attention_heads=4,
        num_hidden_layers=2,
        ffn_dim=64,
        dropout=0.0,
        attention_dropout=0.0,
        ff_dropout=0.0,
        path_dropout=0.0,
        head_dropout=0.0,
        positional_dropout=0.0,
        scaling="std",
        init_std=0.2,
    )
    return PatchTSTForPrediction(config)


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy sines of random frequency and phase per channel: the past and the next steps."""
    g = torch.Generator().manual_seed(9300 + step)
    t = torch.arange(CONTEXT + HORIZON, dtype=torch.float32)
    freq = torch.rand(batch_size, 1, CHANNELS, generator=g) * 0.5 + 0.1
    phase = torch.rand(batch_size, 1, CHANNELS, generator=g) * 6.28
    series = torch.sin(t[None, :, None] * freq + phase)
    series = series + 0.1 * torch.randn(series.shape, generator=g)
    return series[:, :CONTEXT], series[:, CONTEXT:]


def loss_fn(outputs, future: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(outputs.prediction_outputs, future)
