"""The tiny CLIP of ``clip.py`` trained as open_clip trains it: its loss compares every image
with every caption of the whole global batch, and asks the runtime to ``gather`` the
features of the data-parallel replicas (``runtime/gather.py``), so a plan with data
parallelism trains on one process's loss of the whole batch. The model returns the features
and the logit scale, as open_clip's does. Follows the model-file contract."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import nn

_spec = importlib.util.spec_from_file_location("meshplan_clip", Path(__file__).with_name("clip.py"))
clip = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(clip)

TRAINING = clip.TRAINING


class Features(nn.Module):
    """CLIP returning (image features, text features, logit scale), normalised."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.clip = model

    def forward(self, ids: torch.Tensor, images: torch.Tensor) -> dict:
        out = self.clip(input_ids=ids, pixel_values=images)
        scale = self.clip.logit_scale.exp()
        return {"image": out.image_embeds, "text": out.text_embeds, "scale": scale}


def build_model(size: str = "tiny") -> nn.Module:
    return Features(clip.build_model(size))


def make_batch(batch_size: int, step: int = 0) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    return clip.make_batch(batch_size, step)


def loss_fn(outputs: dict, targets: torch.Tensor, gather=None) -> torch.Tensor:
    """CLIP's symmetric contrastive loss over the whole batch: ``gather`` joins every
    replica's features (the identity in one process)."""
    image, text = gather(outputs["image"]), gather(outputs["text"])
    logits = outputs["scale"] * image @ text.T
    labels = torch.arange(logits.shape[0])
    image_loss = nn.functional.cross_entropy(logits, labels)
    return (image_loss + nn.functional.cross_entropy(logits.T, labels)) / 2
