"""A tiny transformers Whisper (log-mel features in, a convolutional stem and an encoder, a
decoder over text tokens), as a model no one here wrote. The model file only passes the
decoder's ids positionally, as a user's would; the loss is the default cross-entropy over
the ``Seq2SeqLMOutput``'s logits. Follows the model-file contract."""

from __future__ import annotations

import torch
from torch import nn
from transformers import WhisperConfig, WhisperForConditionalGeneration

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}
VOCAB, MELS, FRAMES, TEXT = 64, 16, 32, 8  # the encoder halves FRAMES (its second conv)


class SpeechToText(nn.Module):
    """Whisper taking (features, decoder ids) positionally."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, features: torch.Tensor, decoder_ids: torch.Tensor):
        return self.model(input_features=features, decoder_input_ids=decoder_ids)


def build_model(size: str = "tiny") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    config = WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=MELS,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_source_positions=FRAMES // 2,
        max_target_positions=TEXT,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
        init_std=0.2,
        use_cache=False,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        mask_time_prob=0.0,
    )
    config._attn_implementation = "sdpa"
    return SpeechToText(WhisperForConditionalGeneration(config))


def make_batch(batch_size: int, step: int = 0) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    g = torch.Generator().manual_seed(9200 + step)
    features = torch.randn(batch_size, MELS, FRAMES, generator=g)
    tokens = torch.randint(3, VOCAB, (batch_size, TEXT + 1), generator=g)
    return (features, tokens[:, :-1]), tokens[:, 1:]
