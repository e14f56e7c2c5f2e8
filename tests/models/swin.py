"""A tiny transformers Swin, as a model no one here wrote: its patch embedding returns
(embeddings, output sizes), and torch.export folds the sizes into constants, so the traced copy
of that module returns the embeddings alone. A pipeline stage that runs the eager module in its
place must hand on that one tensor. Follows the model-file contract."""

from __future__ import annotations

import torch
from torch import nn
from transformers import SwinConfig, SwinForImageClassification

TRAINING = {"global_batch_size": 8, "optimizer": "adamw", "dtype": "bf16", "lr": 3e-4}
IMAGE, CLASSES = 32, 10


def build_model(size: str = "tiny", dtype: str = "float32") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    config = SwinConfig(
        image_size=IMAGE,
        patch_size=4,
        embed_dim=16,
        depths=[1, 1],
        num_heads=[2, 4],
        window_size=4,
        num_labels=CLASSES,
        drop_path_rate=0.0,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.2,
    )
    return SwinForImageClassification(config).to(getattr(torch, dtype))


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7300 + step)
    images = torch.randn(batch_size, 3, IMAGE, IMAGE, generator=g)
    return images, torch.randint(0, CLASSES, (batch_size,), generator=g)
