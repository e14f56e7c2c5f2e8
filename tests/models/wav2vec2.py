"""A tiny transformers Wav2Vec2ForCTC, as a model no one here wrote: raw audio in, a stack of
1-D convolutions (the feature encoder) that shortens it, a transformer over the frames, and a
CTC loss over character targets read from the model's ``CausalLMOutput``. Follows the
model-file contract.

Arguments: ``conv`` ``short`` (3 layers, 1600 samples: 20 frames) or ``full`` (the published
7-layer encoder's kernels and strides, one second at 16 kHz: 49 frames); ``norm`` ``group``
(base), ``layer`` or ``stable`` (the large models' pre-norm encoder); ``mask`` passes an
attention mask beside the audio. SpecAugment's time masks are off: transformers draws them
from numpy's generator, which one process and a plan cannot share."""

from __future__ import annotations

import torch
from torch import nn
from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}
SAMPLES, VOCAB, LABEL_LEN = 1600, 16, 6
_samples: list = [SAMPLES, False]  # what the last build_model call reads: length, mask
# the published feature encoder's kernels and strides (wav2vec 2.0, Baevski et al. 2020)
FULL_CONV = dict(conv_kernel=(10, 3, 3, 3, 3, 2, 2), conv_stride=(5, 2, 2, 2, 2, 2, 2))


def build_model(
    size: str = "tiny", conv: str = "short", norm: str = "group", mask: bool = False
) -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    config = Wav2Vec2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        **(
            dict(conv_dim=(16,) * 7, **FULL_CONV)
            if conv == "full"
            else dict(conv_dim=(16, 16, 16), conv_stride=(5, 4, 4), conv_kernel=(10, 4, 4))
        ),
        feat_extract_norm="layer" if norm == "stable" else norm,
        do_stable_layer_norm=norm == "stable",  # the large models' pre-norm encoder
        conv_bias=norm != "group",
        num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=4,
        mask_time_prob=0.0,  # SpecAugment's masks come from numpy's generator: off
        initializer_range=0.2,
        pad_token_id=0,
        ctc_loss_reduction="mean",
    )
    for key in ("hidden_dropout", "activation_dropout", "attention_dropout", "feat_proj_dropout",
                "final_dropout", "layerdrop"):  # fmt: skip
        setattr(config, key, 0.0)
    config._attn_implementation = "sdpa"
    _samples[0] = 16000 if conv == "full" else SAMPLES  # 49 frames: one second at 16 kHz
    _samples[1] = mask
    return Wav2Vec2ForCTC(config)


def make_batch(batch_size: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw waveforms and character labels (1..VOCAB-1; 0 is CTC's blank)."""
    g = torch.Generator().manual_seed(8900 + step)
    audio = torch.randn(batch_size, _samples[0], generator=g)
    labels = torch.randint(1, VOCAB, (batch_size, LABEL_LEN), generator=g)
    if _samples[1]:  # every sample whole: the attention mask of a padded batch, all ones
        return (audio, torch.ones(batch_size, _samples[0], dtype=torch.long)), labels
    return audio, labels


def loss_fn(outputs, labels: torch.Tensor) -> torch.Tensor:
    """CTC over every frame, per sample normalised by its label length, then the batch mean
    (``nn.CTCLoss``'s ``mean``): a mean over samples."""
    log_probs = nn.functional.log_softmax(outputs.logits, dim=-1).transpose(0, 1)
    frames = torch.full((labels.shape[0],), log_probs.shape[0], dtype=torch.long)
    lengths = torch.full((labels.shape[0],), labels.shape[1], dtype=torch.long)
    return nn.functional.ctc_loss(log_probs, labels, frames, lengths, blank=0, reduction="mean")
