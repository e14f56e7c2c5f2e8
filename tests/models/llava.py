"""A tiny transformers LLaVA (a CLIP vision tower, a projector and a Llama language model;
the image's patch features replace the prompt's image tokens), as a model no one here wrote.
Follows the model-file contract."""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlavaConfig, LlavaForConditionalGeneration

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}
VOCAB, SEQ, IMAGE, PATCH = 64, 12, 16, 8
IMAGE_TOKEN = VOCAB - 1
IMAGE_TOKENS = (IMAGE // PATCH) ** 2  # the "default" feature strategy drops CLS


def build_model(size: str = "tiny") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    config = LlavaConfig(
        vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=4, image_size=IMAGE,
                           patch_size=PATCH, initializer_range=0.2),
        text_config=dict(model_type="llama", vocab_size=VOCAB, hidden_size=32,
                         intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=SEQ,
                         initializer_range=0.2),
        image_token_index=IMAGE_TOKEN,
        image_seq_length=IMAGE_TOKENS,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    config.text_config._attn_implementation = "sdpa"
    config.vision_config._attn_implementation = "sdpa"
    config.use_cache = config.text_config.use_cache = False
    return LlavaForConditionalGeneration(config)


def make_batch(batch_size: int, step: int = 0) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """(ids: the image's tokens, then text; images); targets: the next text token, -100 on
    the image's positions."""
    g = torch.Generator().manual_seed(9100 + step)
    text = torch.randint(0, IMAGE_TOKEN, (batch_size, SEQ - IMAGE_TOKENS + 1), generator=g)
    ids = torch.cat([torch.full((batch_size, IMAGE_TOKENS), IMAGE_TOKEN), text[:, :-1]], 1)
    targets = torch.cat([torch.full((batch_size, IMAGE_TOKENS - 1), -100), text], 1)
    images = torch.randn(batch_size, 3, IMAGE, IMAGE, generator=g)
    return (ids, images), targets
