"""A tiny transformers ConvNeXt, as a model no one here wrote: each stage is a downsampling
``nn.Sequential`` and a ``ModuleList`` of layers, so with one layer per stage the tracer's block
is the ModuleList itself, which is never called: FSDP's and the checkpoint's hooks must go on
its children, and a pipeline must cut at its first child. Follows the model-file contract."""

from __future__ import annotations

import torch
from torch import nn
from transformers import ConvNextConfig, ConvNextForImageClassification

TRAINING = {"global_batch_size": 8, "optimizer": "adamw", "dtype": "bf16", "lr": 3e-4}
IMAGE, CLASSES = 32, 10


def build_model(size: str = "tiny", dtype: str = "float32") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    config = ConvNextConfig(
        image_size=IMAGE,
        num_stages=2,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        num_labels=CLASSES,
        drop_path_rate=0.0,
        initializer_range=0.2,
    )
    return ConvNextForImageClassification(config).to(getattr(torch, dtype))


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7100 + step)
    images = torch.randn(batch_size, 3, IMAGE, IMAGE, generator=g)
    return images, torch.randint(0, CLASSES, (batch_size,), generator=g)
