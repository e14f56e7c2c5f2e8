"""A tiny transformers Pegasus, as a model no one here wrote: its positions are a frozen
sinusoidal table, and the block after the encoder joins the encoder's final norm (whose output
every decoder layer reads) with the decoder's embeddings. Under ZeRO-3 a unit of several
modules gets FSDP's pre-backward hook on its last module's output only, which carries no
gradient when that module is frozen; frozen modules therefore stay with the root unit.
Follows the model-file contract."""

from __future__ import annotations

import torch
from torch import nn
from transformers import PegasusConfig, PegasusForConditionalGeneration

TRAINING = {"global_batch_size": 8, "optimizer": "adamw", "dtype": "bf16", "lr": 3e-4}
SEQ, VOCAB = 32, 128


class Seq2Seq(nn.Module):
    """Takes (encoder ids, decoder ids) positionally and returns the logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits


def build_model(size: str = "tiny", dtype: str = "float32") -> nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    config = PegasusConfig(
        vocab_size=VOCAB,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_position_embeddings=SEQ,
        decoder_start_token_id=2,
        pad_token_id=1,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        init_std=0.2,
        use_cache=False,
        attn_implementation="sdpa",
    )
    return Seq2Seq(PegasusForConditionalGeneration(config)).to(getattr(torch, dtype))


def make_batch(batch_size: int, step: int = 0) -> tuple[tuple, torch.Tensor]:
    g = torch.Generator().manual_seed(7200 + step)
    source = torch.randint(3, VOCAB, (batch_size, SEQ), generator=g)
    tokens = torch.randint(3, VOCAB, (batch_size, SEQ + 1), generator=g)
    return (source, tokens[:, :-1]), tokens[:, 1:]
