"""transformers GPT-2 (Conv1D projections, fused QKV) and OPT (nn.Linear, separate q/k/v) at one
shape, Megatron's 22B GPT (Narayanan et al. 2021, Table 1: hidden 6144, 48 layers, 64 heads,
sequence 2048), for comparing how meshplan prices the two weight layouts and attention forms."""

import torch

TRAINING = {"global_batch_size": 8, "optimizer": "adamw", "dtype": "bf16"}
SEQ = 2048
VOCAB = 51200


def build_model(
    kind: str = "gpt2",
    layers: int = 48,
    attn: str = "sdpa",
    hidden: int = 6144,
    heads: int = 64,
    activation: str = "relu",
) -> torch.nn.Module:
    """``kind``: gpt2 or opt; ``attn``: sdpa or eager (transformers' attn_implementation).
    GPT-2's activation defaults to OPT's ReLU, so that the two differ in weight layout only
    (GPT-2's own is ``gelu_new``: eight elementwise ops where ReLU is one)."""
    import transformers

    common = dict(vocab_size=VOCAB, attn_implementation=attn, use_cache=False)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(
            n_embd=hidden,
            n_layer=layers,
            n_head=heads,
            n_positions=SEQ,
            activation_function=activation,
            **common,
        )
        return transformers.GPT2LMHeadModel(cfg)
    if kind == "opt":
        cfg = transformers.OPTConfig(
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            ffn_dim=4 * hidden,
            max_position_embeddings=SEQ,
            word_embed_proj_dim=hidden,
            **common,
        )
        return transformers.OPTForCausalLM(cfg)
    raise ValueError(f"unknown kind {kind!r}; choose gpt2 or opt")


def make_batch(batch_size: int, step: int = 0) -> tuple:
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, VOCAB, (batch_size, SEQ), generator=g)
    return (ids,), ids
