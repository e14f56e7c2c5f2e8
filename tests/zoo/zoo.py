"""The model zoo: transformers families (and torch.nn.Transformer) built from their configs, as
models no one here wrote. One model file for all of them: ``build_model(family, size)`` builds
the family at ``tiny`` size (CPU tests) or at its published ``full`` size (planning only), and
``make_batch`` gives the inputs that family's forward takes (token ids; encoder and decoder ids
for encoder-decoders; images for ViT). Follows meshplan's model-file contract.

    plan tests/zoo/zoo.py --gpus 8 --model-arg family=t5 --model-arg size=full

Every model is the library's class unchanged; encoder-decoders are wrapped only to take their
decoder ids positionally (``Seq2Seq``), which is what a user's model file would do.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

TRAINING = {"global_batch_size": 8, "optimizer": "adamw", "dtype": "bf16", "lr": 3e-4}
SEQ, VOCAB, IMAGE, CLASSES = 32, 128, 32, 10

# The tiny shape every family shares where its config allows: 2 layers, width 64, 4 heads.
TINY = dict(hidden=64, layers=2, heads=4, ffn=128)


def _causal(config_cls: str, model_cls: str, tiny: dict, full: dict) -> dict[str, Any]:
    return {"config": config_cls, "model": model_cls, "tiny": tiny, "full": full, "kind": "lm"}


def _llama_like(**extra: Any) -> dict[str, Any]:
    """Config keys of the Llama-style families (Llama, Mistral, Qwen2, Gemma, Mixtral)."""
    return dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
        **extra,
    )


# family: config class, model class, tiny config, published full-size config (its source), kind
FAMILIES: dict[str, dict[str, Any]] = {
    "gpt2": _causal(
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=SEQ),
        # GPT-2 XL (1.5B): Radford et al. 2019, Table 2
        dict(vocab_size=50257, n_embd=1600, n_layer=48, n_head=25, n_positions=1024),
    ),
    "opt": _causal(
        "OPTConfig",
        "OPTForCausalLM",
        dict(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            ffn_dim=128,
            num_attention_heads=4,
            max_position_embeddings=SEQ,
            word_embed_proj_dim=64,
        ),
        # OPT-13B: Zhang et al. 2022, Table 1
        dict(
            vocab_size=50272,
            hidden_size=5120,
            num_hidden_layers=40,
            ffn_dim=20480,
            num_attention_heads=40,
            max_position_embeddings=2048,
            word_embed_proj_dim=5120,
        ),
    ),  # fmt: skip
    "bert": {
        "config": "BertConfig",
        "model": "BertForMaskedLM",
        "tiny": dict(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=SEQ,
            initializer_range=0.2,
        ),
        # BERT-large: Devlin et al. 2019, Sec. 3
        "full": dict(
            vocab_size=30522,
            hidden_size=1024,
            num_hidden_layers=24,
            num_attention_heads=16,
            intermediate_size=4096,
            max_position_embeddings=512,
        ),
        "kind": "lm",
    },  # fmt: skip
    "roberta": {
        "config": "RobertaConfig",
        "model": "RobertaForMaskedLM",
        # RoBERTa offsets positions by padding_idx + 1
        "tiny": dict(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=SEQ + 2,
            pad_token_id=1,
            initializer_range=0.2,
        ),
        # RoBERTa-large: Liu et al. 2019 (BERT-large shape, 50K BPE vocabulary)
        "full": dict(
            vocab_size=50265,
            hidden_size=1024,
            num_hidden_layers=24,
            num_attention_heads=16,
            intermediate_size=4096,
            max_position_embeddings=514,
            pad_token_id=1,
        ),
        "kind": "lm",
    },  # fmt: skip
    "t5": {
        "config": "T5Config",
        "model": "T5ForConditionalGeneration",
        "tiny": dict(
            vocab_size=VOCAB,
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            decoder_start_token_id=0,
            pad_token_id=0,
        ),
        # T5-large (770M): Raffel et al. 2020, Sec. 3.7
        "full": dict(
            vocab_size=32128,
            d_model=1024,
            d_kv=64,
            d_ff=4096,
            num_layers=24,
            num_decoder_layers=24,
            num_heads=16,
            decoder_start_token_id=0,
            pad_token_id=0,
        ),
        "kind": "seq2seq",
    },  # fmt: skip
    "bart": {
        "config": "BartConfig",
        "model": "BartForConditionalGeneration",
        "tiny": dict(
            vocab_size=VOCAB,
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            max_position_embeddings=SEQ,
            init_std=0.2,
        ),
        # BART-large: Lewis et al. 2020, Sec. 3.1 (12 + 12 layers, width 1024)
        "full": dict(
            vocab_size=50265,
            d_model=1024,
            encoder_layers=12,
            decoder_layers=12,
            encoder_attention_heads=16,
            decoder_attention_heads=16,
            encoder_ffn_dim=4096,
            decoder_ffn_dim=4096,
            max_position_embeddings=1024,
        ),
        "kind": "seq2seq",
    },  # fmt: skip
    "vit": {
        "config": "ViTConfig",
        "model": "ViTForImageClassification",
        "tiny": dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            image_size=IMAGE,
            patch_size=8,
            num_labels=CLASSES,
        ),
        # ViT-Huge/14: Dosovitskiy et al. 2021, Table 1
        "full": dict(
            hidden_size=1280,
            num_hidden_layers=32,
            num_attention_heads=16,
            intermediate_size=5120,
            image_size=224,
            patch_size=14,
            num_labels=1000,
        ),
        "kind": "image",
    },  # fmt: skip
    "llama": _causal(
        "LlamaConfig",
        "LlamaForCausalLM",
        _llama_like(),
        # Llama-3-8B: Meta's model card
        dict(
            vocab_size=128256,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=8192,
        ),
    ),  # fmt: skip
    "mistral": _causal(
        "MistralConfig",
        "MistralForCausalLM",
        _llama_like(),
        # Mistral-7B: Jiang et al. 2023, Table 1
        dict(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=8192,
        ),
    ),  # fmt: skip
    "qwen2": _causal(
        "Qwen2Config",
        "Qwen2ForCausalLM",
        _llama_like(),
        # Qwen2-7B: Yang et al. 2024, Table 1
        dict(
            vocab_size=152064,
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            max_position_embeddings=4096,
        ),
    ),  # fmt: skip
    "qwen3": _causal(
        "Qwen3Config",
        "Qwen3ForCausalLM",
        _llama_like(head_dim=16, tie_word_embeddings=False),
        # Qwen3-8B: Qwen3 Technical Report (Yang et al. 2025), Table 1; per-head q/k norms
        dict(
            vocab_size=151936,
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
        ),
    ),  # fmt: skip
    "gemma": _causal(
        "GemmaConfig",
        "GemmaForCausalLM",
        _llama_like(head_dim=16, initializer_range=0.2),
        # Gemma-7B: Gemma Team 2024, Table 1 (head_dim 256, multi-head)
        dict(
            vocab_size=256000,
            hidden_size=3072,
            intermediate_size=24576,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=16,
            head_dim=256,
            max_position_embeddings=8192,
        ),
    ),  # fmt: skip
    "phi": _causal(
        "PhiConfig",
        "PhiForCausalLM",
        dict(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=SEQ,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            initializer_range=0.2,
        ),
        # Phi-2 (2.7B): Microsoft's model card
        dict(
            vocab_size=51200,
            hidden_size=2560,
            intermediate_size=10240,
            num_hidden_layers=32,
            num_attention_heads=32,
            max_position_embeddings=2048,
        ),
    ),  # fmt: skip
    "gpt_neox": _causal(
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        dict(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=SEQ,
            hidden_dropout=0.0,
        ),
        # GPT-NeoX-20B: Black et al. 2022, Table 1
        dict(
            vocab_size=50432,
            hidden_size=6144,
            intermediate_size=24576,
            num_hidden_layers=44,
            num_attention_heads=64,
            max_position_embeddings=2048,
        ),
    ),  # fmt: skip
    "falcon": _causal(
        "FalconConfig",
        "FalconForCausalLM",
        dict(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            multi_query=True,
            parallel_attn=True,
            bias=False,
            hidden_dropout=0.0,
        ),
        # Falcon-7B: TII's model card (71 heads, multi-query)
        dict(
            vocab_size=65024,
            hidden_size=4544,
            num_hidden_layers=32,
            num_attention_heads=71,
            multi_query=True,
            parallel_attn=True,
            bias=False,
        ),
    ),  # fmt: skip
    "mixtral": _causal(
        "MixtralConfig",
        "MixtralForCausalLM",
        _llama_like(num_local_experts=4, num_experts_per_tok=2),
        # Mixtral-8x7B: Jiang et al. 2024, Table 1
        dict(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=32768,
            num_local_experts=8,
            num_experts_per_tok=2,
        ),
    ),  # fmt: skip
    "nn_transformer": {
        "config": None,
        "model": "torch.nn.Transformer",
        "tiny": dict(d_model=64, nhead=4, layers=2, ffn=128, vocab=VOCAB),
        # Transformer base: Vaswani et al. 2017, Table 3 (37K shared BPE vocabulary)
        "full": dict(d_model=512, nhead=8, layers=6, ffn=2048, vocab=37000),
        "kind": "seq2seq",
    },
}
# What every family's config gets: no dropout (the oracle compares with one process, and
# dropout's random masks differ between layouts), a cache-free forward, SDPA attention.
COMMON = dict(use_cache=False, attn_implementation="sdpa")
NO_DROPOUT = (
    "dropout", "attention_dropout", "activation_dropout", "attn_pdrop", "resid_pdrop",
    "embd_pdrop", "hidden_dropout_prob", "attention_probs_dropout_prob", "dropout_rate",
    "hidden_dropout", "classifier_dropout", "attention_dropout_prob", "drop_path_rate",
    "residual_dropout",
)  # fmt: skip

_current: dict[str, Any] = {"family": "llama", "seq": SEQ, "vocab": VOCAB, "image": IMAGE}


class Seq2Seq(nn.Module):
    """An encoder-decoder taking (encoder ids, decoder ids) positionally, returning logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits


class TorchTransformer(nn.Module):
    """torch.nn.Transformer with token embeddings and an output projection (batch first)."""

    def __init__(self, d_model: int, nhead: int, layers: int, ffn: int, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.transformer = nn.Transformer(
            d_model=d_model,
            nhead=nhead,
            num_encoder_layers=layers,
            num_decoder_layers=layers,
            dim_feedforward=ffn,
            dropout=0.0,
            batch_first=True,
        )
        self.head = nn.Linear(d_model, vocab)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return self.head(self.transformer(self.embed(src), self.embed(tgt)))


def build_model(family: str = "llama", size: str = "tiny", layers: int | None = None) -> nn.Module:
    """``family`` at ``tiny`` or published ``full`` size; ``layers`` overrides the depth."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    if size not in ("tiny", "full"):
        raise ValueError(f"unknown size {size!r}; choose tiny or full")
    spec = FAMILIES[family]
    dims = dict(spec[size])
    _current["family"] = family
    if "builder" in spec:  # a plain-torch model (the sweep's)
        _current["vocab"], _current["seq"], _current["image"] = VOCAB, SEQ, IMAGE
        return spec["builder"]()
    if spec["config"] is None:
        if layers is not None:
            dims["layers"] = layers
        _current["vocab"], _current["seq"] = dims["vocab"], SEQ if size == "tiny" else 512
        return TorchTransformer(**dims)
    import transformers

    # "common": what a family needs instead (eager attention where it has no SDPA path)
    config = getattr(transformers, spec["config"])(**dims, **{**COMMON, **spec.get("common", {})})
    for key in NO_DROPOUT:
        if hasattr(config, key):
            setattr(config, key, 0.0)
    if layers is not None:
        for key in ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers"):
            if key in dims:
                setattr(config, key, layers)
        for key in ("encoder_layers", "decoder_layers"):
            if key in dims:
                setattr(config, key, layers)
    _current["vocab"] = getattr(config, "vocab_size", VOCAB)
    positions = [
        dims.get(k) for k in ("max_position_embeddings", "n_positions") if dims.get(k) is not None
    ]
    _current["seq"] = SEQ if size == "tiny" else min([2048, *positions])
    _current["image"] = dims.get("image_size", IMAGE)
    model = getattr(transformers, spec["model"])(config)
    return Seq2Seq(model) if spec["kind"] == "seq2seq" else model


def make_batch(batch_size: int, step: int = 0) -> tuple[Any, torch.Tensor]:
    """The same global batch, whatever the plan: token ids (shifted targets), encoder and
    decoder ids (targets the decoder's next ids), or images with class labels."""
    g = torch.Generator().manual_seed(7000 + step)
    kind = FAMILIES[_current["family"]]["kind"]
    seq, vocab = _current["seq"], _current["vocab"]
    if kind == "image":
        size = _current["image"]
        images = torch.randn(batch_size, 3, size, size, generator=g)
        return images, torch.randint(0, CLASSES, (batch_size,), generator=g)
    tokens = torch.randint(3, vocab, (batch_size, seq + 1), generator=g)
    if kind == "seq2seq":
        source = torch.randint(3, vocab, (batch_size, seq), generator=g)
        return (source, tokens[:, :-1]), tokens[:, 1:]
    return tokens[:, :-1], tokens[:, 1:]
