"""A tiny transformers Qwen2-VL (a vision transformer over flattened image patches with 2-D
rotary positions, a patch merger, a Qwen2 language model with multimodal 3-D rotary positions;
the merged patch features replace the prompt's image tokens), as a model no one here wrote.
The model file takes the patches batch first ([batch, patches, features]) and flattens them,
as Qwen2-VL's processor concatenates them, so the runtime's row slices cut whole images.
Follows the model-file contract."""

from __future__ import annotations

import torch
from torch import nn
from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}
VOCAB, SEQ, PATCH, MERGE, GRID = 64, 12, 4, 2, 4  # a 16x16 image: a 4x4 grid of patches
IMAGE_TOKEN, VISION_START = VOCAB - 1, VOCAB - 2
IMAGE_TOKENS = GRID * GRID // (MERGE * MERGE)
PATCH_FEATURES = 3 * 2 * PATCH * PATCH  # channels x temporal patch (2) x patch x patch


class ImagePrompt(nn.Module):
    """Qwen2-VL taking (ids, patches [batch, patches, features], positions [batch, 3, seq])
    positionally."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, patches: torch.Tensor, positions: torch.Tensor):
        grid = torch.tensor([1, GRID, GRID], device=ids.device).expand(ids.shape[0], 3)
        return self.model(input_ids=ids, pixel_values=patches.flatten(0, 1), image_grid_thw=grid,
                          position_ids=positions.transpose(0, 1))  # fmt: skip


def build_model(size: str = "tiny") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    config = Qwen2VLConfig(
        vision_config=dict(depth=2, embed_dim=32, hidden_size=32, num_heads=4, mlp_ratio=2,
                           patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=2,
                           in_channels=3, initializer_range=0.2),
        text_config=dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=SEQ * 4, rope_scaling={"type": "mrope",
                         "mrope_section": [2, 1, 1]}, initializer_range=0.2, use_cache=False),
        image_token_id=IMAGE_TOKEN,
        vision_start_token_id=VISION_START,
        use_cache=False,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    return ImagePrompt(Qwen2VLForConditionalGeneration(config))


def make_batch(batch_size: int, step: int = 0) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """(ids: vision start, the image's tokens, then text; patches); targets: the next text
    token, -100 on the image's positions."""
    g = torch.Generator().manual_seed(9400 + step)
    text_len = SEQ - IMAGE_TOKENS - 1
    text = torch.randint(0, VISION_START, (batch_size, text_len + 1), generator=g)
    start = torch.full((batch_size, 1), VISION_START)
    image = torch.full((batch_size, IMAGE_TOKENS), IMAGE_TOKEN)
    ids = torch.cat([start, image, text[:, :-1]], 1)
    targets = torch.cat([torch.full((batch_size, IMAGE_TOKENS), -100), text], 1)
    patches = torch.randn(batch_size, GRID * GRID, PATCH_FEATURES, generator=g)
    return (ids, patches, mrope_positions(batch_size)), targets


def mrope_positions(batch_size: int) -> torch.Tensor:
    """Qwen2-VL's multimodal rotary positions ([batch, 3: time, height, width, seq]), as its
    processor's ``get_rope_index`` makes them for this prompt: the vision start at 0, the
    image's merged patches at 1 + (t, row, column), the text on from the largest plus one. A
    data pipeline computes them (transformers' own loop reads token values a trace has not)."""
    side = GRID // MERGE
    image = [(1, 1 + k // side, 1 + k % side) for k in range(IMAGE_TOKENS)]
    start = max(max(p) for p in image) + 1
    text = [(start + i,) * 3 for i in range(SEQ - IMAGE_TOKENS - 1)]
    rows = torch.tensor([(0, 0, 0), *image, *text]).T  # [3, seq]
    return rows.expand(batch_size, 3, SEQ).clone()
