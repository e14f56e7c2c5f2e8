"""A tiny transformers CLIP (text and vision towers, a contrastive loss over in-batch
negatives), as a model no one here wrote: its forward returns a ``CLIPOutput`` holding nested
``ModelOutput``s, and its loss reads the output's fields by name, as a user's would. Follows the
model-file contract.

The loss is over the micro-batch's own negatives: a plan that splits the batch trains with the
same micro-batches as one process does with them (the oracle's), and the planner notes that
this is not one process's loss on the whole batch."""

from __future__ import annotations

import torch
from torch import nn
from transformers import CLIPConfig, CLIPModel

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}
VOCAB, SEQ, IMAGE = 64, 8, 16


def build_model(size: str = "tiny") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    tower = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, initializer_range=0.2)  # fmt: skip
    config = CLIPConfig(
        text_config=dict(
            tower,
            vocab_size=VOCAB,
            max_position_embeddings=SEQ,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),  # 2: pool at the largest id
        vision_config=dict(tower, image_size=IMAGE, patch_size=8),
        projection_dim=16,
        initializer_factor=4.0,  # moves every weight far enough in 5 steps for the oracle
    )
    config._attn_implementation = "sdpa"
    return CLIPModel(config)


def make_batch(batch_size: int, step: int = 0) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """(token ids, images); the targets are each pair's index (the loss uses positions)."""
    g = torch.Generator().manual_seed(8800 + step)
    ids = torch.randint(1, VOCAB, (batch_size, SEQ), generator=g)
    images = torch.randn(batch_size, 3, IMAGE, IMAGE, generator=g)
    return (ids, images), torch.arange(batch_size)


def loss_fn(outputs, targets: torch.Tensor) -> torch.Tensor:
    """CLIP's symmetric contrastive loss: each image's own caption among the micro-batch's."""
    labels = torch.arange(outputs.logits_per_image.shape[0])
    image_loss = nn.functional.cross_entropy(outputs.logits_per_image, labels)
    text_loss = nn.functional.cross_entropy(outputs.logits_per_text, labels)
    return (image_loss + text_loss) / 2
