"""A tiny transformers DINOv2, as a model no one here wrote: its embeddings own a mask token
that the forward reads only when a mask of patches is passed, and a classification batch
passes none. So a parameter gets no gradient in any step: DDP waited for it and failed the
second step, and a pipeline's stages, which keep what their traced code reads, left it out of
every checkpoint. Follows the model-file contract."""

from __future__ import annotations

import torch
from torch import nn
from transformers import Dinov2Config, Dinov2ForImageClassification

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}
IMAGE, CLASSES = 32, 10


def build_model(size: str = "tiny", dtype: str = "float32") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    config = Dinov2Config(
        image_size=IMAGE,
        patch_size=8,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        mlp_ratio=2,
        qkv_bias=False,  # a key bias gets no gradient (softmax ignores it): SGD cannot move it
        num_labels=CLASSES,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        drop_path_rate=0.0,
        initializer_range=0.2,
    )
    return Dinov2ForImageClassification(config).to(getattr(torch, dtype))


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7400 + step)
    images = torch.randn(batch_size, 3, IMAGE, IMAGE, generator=g)
    return images, torch.randint(0, CLASSES, (batch_size,), generator=g)
