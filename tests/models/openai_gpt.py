"""transformers' OpenAI GPT (GPT-1, ``OpenAIGPTLMHeadModel``) built from its config, tiny: a
model torch's pipelining cannot cut at its layers (torch.export's unflatten refuses the split
module it makes), so a pipelined plan of it must end in one line. Follows the model-file
contract."""

from __future__ import annotations

import torch
import transformers

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}
SEQ, VOCAB = 32, 128


def build_model(size: str = "tiny", layers: int = 2) -> torch.nn.Module:
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; this test model has only 'tiny'")
    torch.manual_seed(0)
    config = transformers.OpenAIGPTConfig(
        vocab_size=VOCAB, n_embd=64, n_layer=layers, n_head=4, n_positions=SEQ,
        attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
    )  # fmt: skip
    return transformers.OpenAIGPTLMHeadModel(config)


def make_batch(batch_size: int, step: int = 0) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    g = torch.Generator().manual_seed(7000 + step)
    tokens = torch.randint(3, VOCAB, (batch_size, SEQ + 1), generator=g)
    return (tokens[:, :-1],), tokens[:, 1:]
