"""The sweep: 83 more families no one here tuned for, at tiny size only, for the zoo's four
training forms (``test_zoo.py``): transformers models from their configs, and plain-torch
models with the shapes a planner trips on (frozen weights beside adapters, a parametrized
weight, a cell called once per position, one layer applied three times). The zoo's model file
builds them (``zoo.build_model``); this one only adds their configs. Each family's tiny config
moves its weights far enough in 5 SGD steps for the oracle to tell (init range 0.2). Follows
meshplan's model-file contract.

    plan tests/zoo/sweep.py --gpus 2 --tp 2 --model-arg family=stablelm
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch
from torch import nn

_spec = importlib.util.spec_from_file_location(
    "meshplan_zoo_for_sweep", Path(__file__).with_name("zoo.py")
)
zoo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zoo)

TRAINING = zoo.TRAINING
VOCAB, SEQ, CLASSES = zoo.VOCAB, zoo.SEQ, zoo.CLASSES
EAGER = {"common": {"attn_implementation": "eager"}}  # families without an SDPA path

_LM = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=SEQ,
)
_GQA = dict(_LM, num_key_value_heads=2)
_S2S = dict(
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
)
_ENCODER = dict(
    vocab_size=VOCAB,
    embedding_size=32,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=SEQ,
)
_WIDE_POSITIONS = dict(_ENCODER, max_position_embeddings=2 * SEQ)  # positions past padding_idx


def _family(config: str, model: str, tiny: dict, kind: str = "lm", **extra: Any) -> dict:
    return {"config": config, "model": model, "tiny": {**tiny, "initializer_range": 0.2},
            "full": {}, "kind": kind, **extra}  # fmt: skip


class LSTMLM(nn.Module):
    """An LSTM language model: no repeated container, a module returning a tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.rnn = nn.LSTM(64, 64, num_layers=2, batch_first=True)
        self.head = nn.Linear(64, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # scaled so that the embedding's sparse rows move far enough for the oracle
        return self.head(self.rnn(self.embed(x) * 10.0)[0])


class GroupConvNet(nn.Module):
    """Depthwise and grouped convolutions with GroupNorm, then nn.MultiheadAttention."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.blocks = nn.Sequential(
            *[
                nn.Sequential(
                    nn.Conv2d(32, 32, 3, padding=1, groups=32),
                    nn.GroupNorm(4, 32),
                    nn.Conv2d(32, 64, 1),
                    nn.GELU(),
                    nn.Conv2d(64, 32, 1),
                )
                for _ in range(3)
            ]
        )
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.head = nn.Linear(32, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.blocks(self.stem(x)).flatten(2).transpose(1, 2)
        t = t + self.attn(t, t, t, need_weights=False)[0]
        return self.head(t.mean(1))


class LoRANet(nn.Module):
    """Frozen embedding and base projections, trainable low-rank adapters beside them."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64).requires_grad_(False)
        self.layers = nn.ModuleList(
            [nn.Sequential(nn.LayerNorm(64), LoRALinear(64), nn.GELU()) for _ in range(3)]
        )
        self.head = nn.Linear(64, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = h + layer(h)
        return self.head(h)


class LoRALinear(nn.Module):
    def __init__(self, width: int, rank: int = 4) -> None:
        super().__init__()
        self.base = nn.Linear(width, width).requires_grad_(False)
        self.a = nn.Parameter(torch.randn(rank, width) * 0.3)
        self.b = nn.Parameter(torch.randn(width, rank) * 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.a.t()) @ self.b.t()


class WeightNormNet(nn.Module):
    """Linear layers under torch's weight_norm parametrization (weight = g * v / |v|)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.layers = nn.ModuleList(
            [nn.utils.parametrizations.weight_norm(nn.Linear(64, 64)) for _ in range(3)]
        )
        self.head = nn.Linear(64, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = h + torch.tanh(layer(h))
        return self.head(h)


class UnrolledGRU(nn.Module):
    """A GRU cell called once per position, its state made without naming a device."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.cell = nn.GRUCell(32, 32)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.embed(x) * 5.0
        h = torch.zeros(x.shape[0], 32)
        states = []
        for t in range(x.shape[1]):
            h = self.cell(e[:, t], h)
            states.append(h)
        return self.head(torch.stack(states, 1))


class SharedBlocks(nn.Module):
    """One encoder layer applied three times between two others (a universal transformer)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.first, self.shared, self.last = (
            nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True) for _ in range(3)
        )
        self.head = nn.Linear(64, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(self.embed(x))
        for _ in range(3):
            h = self.shared(h)
        return self.head(self.last(h))


def _llama_own_checkpointing() -> nn.Module:
    """transformers Llama with tied embeddings and its own gradient checkpointing on."""
    import transformers

    config = transformers.LlamaConfig(
        **_GQA, initializer_range=0.2, tie_word_embeddings=True, **zoo.COMMON
    )
    model = transformers.LlamaForCausalLM(config)
    # transformers 5 renames gradient_checkpointing_enable (deprecated, kept until v6)
    enable = getattr(model, "activation_checkpointing_enable", None)
    (enable or model.gradient_checkpointing_enable)()
    return model


def _granitemoe_float64() -> nn.Module:
    """GraniteMoE in float64. In fp32 its TP 2 run ends 3-4x the oracle's tolerance from one
    process after 5 steps (embeddings and layer 0's attention most), with all four experts
    chosen too, so no routing flip; the same plan in float64 matches: the tiny config's
    attention (multiplier 1.0 on 16-wide heads, init range 0.2) amplifies the rounding of the
    sharded products' other summation order. float64 takes transformers' batched_mm experts:
    the trace of its default grouped_mm path asked for 16-bit inputs."""
    import transformers

    config = transformers.GraniteMoeConfig(
        **_GQA, num_local_experts=4, num_experts_per_tok=2, initializer_range=0.2,
        attention_dropout=0.0, use_cache=False, experts_implementation="batched_mm",
    )  # fmt: skip
    return transformers.GraniteMoeForCausalLM(config).double()


def _torch(builder: Any, kind: str = "lm") -> dict[str, Any]:
    return {"builder": builder, "config": "torch", "tiny": {}, "full": {}, "kind": kind}


SWEEP: dict[str, dict[str, Any]] = {
    "phi3": _family("Phi3Config", "Phi3ForCausalLM", dict(_GQA, pad_token_id=0)),
    "bigcode_mqa": _family("GPTBigCodeConfig", "GPTBigCodeForCausalLM", dict(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=SEQ, multi_query=True)),
    "bloom": _family("BloomConfig", "BloomForCausalLM",
                     dict(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4), **EAGER),
    "gptj": _family("GPTJConfig", "GPTJForCausalLM", dict(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=SEQ, rotary_dim=8)),
    "gpt_neo": _family("GPTNeoConfig", "GPTNeoForCausalLM", dict(
        vocab_size=VOCAB, hidden_size=64, num_layers=2, num_heads=4, max_position_embeddings=SEQ,
        attention_types=[[["global", "local"], 1]], window_size=8), **EAGER),
    "gemma2": _family("Gemma2Config", "Gemma2ForCausalLM", dict(_GQA, head_dim=16), **EAGER),
    "qwen2_moe": _family("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(
        _GQA, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=64)),
    "qwen3_moe": _family("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        _GQA, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)),
    "olmoe": _family("OlmoeConfig", "OlmoeForCausalLM",
                     dict(_GQA, num_experts=4, num_experts_per_tok=2)),
    "deepseek_v3": _family("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(
        _LM, num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=4,
        num_experts_per_tok=2, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_group=1, topk_group=1)),
    "olmo2": _family("Olmo2Config", "Olmo2ForCausalLM", _GQA),
    "stablelm": _family("StableLmConfig", "StableLmForCausalLM", _GQA),
    "cohere": _family("CohereConfig", "CohereForCausalLM", _GQA),
    "granite": _family("GraniteConfig", "GraniteForCausalLM", _GQA),
    "granitemoe": _torch(_granitemoe_float64),
    # gpt-oss's MLP returns (output, router scores) and its layer reads the output alone
    "gpt_oss": _family("GptOssConfig", "GptOssForCausalLM", dict(
        _GQA, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"]), **EAGER),
    "starcoder2": _family("Starcoder2Config", "Starcoder2ForCausalLM", _GQA),
    "mpt": _family("MptConfig", "MptForCausalLM", dict(
        vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, max_seq_len=SEQ), **EAGER),
    "mamba": _family("MambaConfig", "MambaForCausalLM", dict(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, state_size=8, expand=2), **EAGER),
    "albert": _family("AlbertConfig", "AlbertForMaskedLM", _ENCODER),
    "electra": _family("ElectraConfig", "ElectraForMaskedLM", _ENCODER),
    "distilbert": _family("DistilBertConfig", "DistilBertForMaskedLM", dict(
        vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
        max_position_embeddings=SEQ)),
    "mbart": _family("MBartConfig", "MBartForConditionalGeneration", _S2S, "seq2seq"),
    "pegasus": _family("PegasusConfig", "PegasusForConditionalGeneration", _S2S, "seq2seq"),
    "swin": _family("SwinConfig", "SwinForImageClassification", dict(
        image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4],
        window_size=4, num_labels=CLASSES), "image"),
    "convnext": _family("ConvNextConfig", "ConvNextForImageClassification", dict(
        image_size=32, hidden_sizes=[16, 32], depths=[1, 1], num_stages=2,
        num_labels=CLASSES), "image", **EAGER),
    "deit": _family("DeiTConfig", "DeiTForImageClassification", dict(
        image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, num_labels=CLASSES), "image"),
    "gemma3": _family("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        _GQA, head_dim=16, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"]), **EAGER),
    "jamba": _family("JambaConfig", "JambaForCausalLM", dict(
        _GQA, num_experts=4, num_experts_per_tok=2, expert_layer_period=2,
        expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1, mamba_d_state=8,
        mamba_expand=2, use_mamba_kernels=False), **EAGER),
    "falcon_new": _family("FalconConfig", "FalconForCausalLM", dict(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_kv_heads=2, new_decoder_architecture=True, max_position_embeddings=SEQ)),
    "funnel": _family("FunnelConfig", "FunnelForMaskedLM", dict(
        vocab_size=VOCAB, block_sizes=[1, 1], d_model=64, n_head=4, d_head=16, d_inner=128,
        max_position_embeddings=SEQ), **EAGER),
    "umt5": _family("UMT5Config", "UMT5ForConditionalGeneration", dict(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
        num_heads=4, decoder_start_token_id=0, pad_token_id=0), "seq2seq", **EAGER),
    "xlm_roberta": _family("XLMRobertaConfig", "XLMRobertaForMaskedLM", dict(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=SEQ + 2, pad_token_id=1)),
    "nemotron": _family("NemotronConfig", "NemotronForCausalLM", dict(_GQA, head_dim=16)),
    "glm4": _family("Glm4Config", "Glm4ForCausalLM", dict(_GQA, head_dim=16, pad_token_id=0)),
    "helium": _family("HeliumConfig", "HeliumForCausalLM", dict(_GQA, head_dim=16)),
    "smollm3": _family("SmolLM3Config", "SmolLM3ForCausalLM", dict(_GQA, pad_token_id=0)),
    "falcon_mamba": _family("FalconMambaConfig", "FalconMambaForCausalLM", dict(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, state_size=8, expand=2,
        use_mambapy=True), **EAGER),
    "bigbird": _family("BigBirdConfig", "BigBirdForMaskedLM", dict(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=SEQ, attention_type="original_full"),
        **EAGER),
    "lstm": _torch(LSTMLM),
    "groupconv_mha": _torch(GroupConvNet, "image"),
    "lora": _torch(LoRANet),
    "weightnorm": _torch(WeightNormNet),
    "gru_unrolled": _torch(UnrolledGRU),
    "shared_blocks": _torch(SharedBlocks),
    "llama_own_checkpointing": _torch(_llama_own_checkpointing),
    # the fifth sweep
    "diffllama": _family("DiffLlamaConfig", "DiffLlamaForCausalLM", dict(_GQA)),
    "codegen": _family("CodeGenConfig", "CodeGenForCausalLM", dict(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=SEQ, rotary_dim=8,
        n_ctx=SEQ)),
    "persimmon": _family("PersimmonConfig", "PersimmonForCausalLM", dict(_LM), **EAGER),
    "xglm": _family("XGLMConfig", "XGLMForCausalLM", dict(
        vocab_size=VOCAB, d_model=64, num_layers=2, attention_heads=4, ffn_dim=128,
        max_position_embeddings=SEQ), **EAGER),
    "biogpt": _family("BioGptConfig", "BioGptForCausalLM", dict(_LM)),
    "cohere2": _family("Cohere2Config", "Cohere2ForCausalLM", dict(
        _GQA, sliding_window=8, layer_types=["sliding_attention", "full_attention"])),
    "exaone4": _family("Exaone4Config", "Exaone4ForCausalLM", dict(_GQA)),
    "deepseek_v2": _family("DeepseekV2Config", "DeepseekV2ForCausalLM", dict(
        _LM, num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=4,
        num_experts_per_tok=2, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_group=1, topk_group=1)),
    "minicpm3": _family("MiniCPM3Config", "MiniCPM3ForCausalLM", dict(
        _LM, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=16)),
    "olmo": _family("OlmoConfig", "OlmoForCausalLM", dict(_GQA)),
    "seed_oss": _family("SeedOssConfig", "SeedOssForCausalLM", dict(_GQA, head_dim=16)),
    "apertus": _family("ApertusConfig", "ApertusForCausalLM", dict(_GQA)),
    "arcee": _family("ArceeConfig", "ArceeForCausalLM", dict(_GQA)),
    "ernie45_moe": _family("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM", dict(
        _GQA, moe_num_experts=4, moe_k=2, moe_intermediate_size=32)),
    "llama4": _family("Llama4TextConfig", "Llama4ForCausalLM", dict(
        _GQA, head_dim=16, num_local_experts=4, num_experts_per_tok=1, intermediate_size_mlp=128,
        interleave_moe_layer_step=2, attention_chunk_size=8)),
    "rwkv": _family("RwkvConfig", "RwkvForCausalLM", dict(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, attention_hidden_size=64,
        intermediate_size=128, context_length=SEQ), **EAGER),
    "mamba2": _family("Mamba2Config", "Mamba2ForCausalLM", dict(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, state_size=8, expand=2,
        n_groups=1, head_dim=16, num_heads=8, chunk_size=8), **EAGER),
    "lfm2": _family("Lfm2Config", "Lfm2ForCausalLM", dict(_GQA)),
    "doge": _family("DogeConfig", "DogeForCausalLM", dict(_GQA)),
    "bitnet": _family("BitNetConfig", "BitNetForCausalLM", dict(_GQA)),
    "olmo3": _family("Olmo3Config", "Olmo3ForCausalLM", dict(_GQA)),
    "hunyuan_dense": _family("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM",
                             dict(_GQA, head_dim=16)),
    "nanochat": _family("NanoChatConfig", "NanoChatForCausalLM", dict(_GQA)),
    "glm": _family("GlmConfig", "GlmForCausalLM", dict(_GQA, head_dim=16, pad_token_id=0)),
    "ministral": _family("MinistralConfig", "MinistralForCausalLM", dict(_GQA, head_dim=16)),
    "ernie45": _family("Ernie4_5Config", "Ernie4_5ForCausalLM", dict(_GQA, head_dim=16)),
    "ctrl": _family("CTRLConfig", "CTRLLMHeadModel", dict(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, dff=128, n_positions=SEQ)),
    "glm4_moe": _family("Glm4MoeConfig", "Glm4MoeForCausalLM", dict(
        _GQA, head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1)),
    "exaone_moe": _family("ExaoneMoeConfig", "ExaoneMoeForCausalLM", dict(
        _GQA, head_dim=16, num_experts=4, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, num_shared_experts=1, n_shared_experts=1,
        first_k_dense_replace=1, n_group=1, topk_group=1)),
    "blenderbot": _family("BlenderbotConfig", "BlenderbotForConditionalGeneration", _S2S,
                          "seq2seq"),
    "plbart": _family("PLBartConfig", "PLBartForConditionalGeneration", _S2S, "seq2seq"),
    "modernbert": _family("ModernBertConfig", "ModernBertForMaskedLM",
                          dict(_ENCODER, pad_token_id=0)),
    "deberta_v2": _family("DebertaV2Config", "DebertaV2ForMaskedLM", _WIDE_POSITIONS, **EAGER),
    "mpnet": _family("MPNetConfig", "MPNetForMaskedLM", _WIDE_POSITIONS, **EAGER),
    "roformer": _family("RoFormerConfig", "RoFormerForMaskedLM", _WIDE_POSITIONS, **EAGER),
    "megatron_bert": _family("MegatronBertConfig", "MegatronBertForMaskedLM", _WIDE_POSITIONS,
                             **EAGER),
    "vaultgemma": _family("VaultGemmaConfig", "VaultGemmaForCausalLM", dict(_GQA, head_dim=16),
                          **EAGER),
}  # fmt: skip
zoo.FAMILIES.clear()
zoo.FAMILIES.update(SWEEP)


def build_model(family: str = "stablelm", size: str = "tiny") -> nn.Module:
    """``family`` at tiny size (the sweep plans and trains nothing larger)."""
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; the sweep has only 'tiny'")
    return zoo.build_model(family, "tiny")


def make_batch(batch_size: int, step: int = 0) -> tuple[Any, torch.Tensor]:
    return zoo.make_batch(batch_size, step)
