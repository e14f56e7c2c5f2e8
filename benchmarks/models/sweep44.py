"""The families of stop 44's sweeps of models no one here wrote (``benchmarks/sweep.py`` runs
them through the zoo's four training forms): transformers families from their configs at tiny
size, and plain-torch models with the idioms a planner trips on (a sparse or max-norm
embedding, 0-dim parameters, one block listed twice, a hand-made tie read in the model's own
forward, an EMA teacher updated in the forward...). Built by the zoo's model file
(``tests/zoo/zoo.py``); follows meshplan's model-file contract.

    python benchmarks/sweep.py --families squeezebert,manual_tie
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch
from torch import nn

_spec = importlib.util.spec_from_file_location(
    "meshplan_sweep_for_stop44", Path(__file__).resolve().parents[2] / "tests" / "zoo" / "sweep.py"
)
sw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sw)
zoo = sw.zoo
_f, _LM, _GQA, _S2S, EAGER = sw._family, sw._LM, sw._GQA, sw._S2S, sw.EAGER
VOCAB, SEQ, CLASSES = sw.VOCAB, sw.SEQ, sw.CLASSES
ENC = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
           intermediate_size=128, max_position_embeddings=SEQ)  # fmt: skip
IMG = dict(image_size=32, num_labels=CLASSES)


class SparseEmb(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64, sparse=True)
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(3))
        self.head = nn.Linear(64, VOCAB)

    def forward(self, x):
        h = self.embed(x) * 10
        for layer in self.layers:
            h = h + torch.tanh(layer(h))
        return self.head(h)


class MaxNormEmb(SparseEmb):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64, max_norm=1.0)


class BagNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(VOCAB, 64, mode="mean")
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(3))
        self.head = nn.Linear(64, VOCAB)

    def forward(self, x):
        h = self.bag(x) * 10
        for layer in self.layers:
            h = h + torch.tanh(layer(h))
        return self.head(h)[:, None, :].expand(-1, x.shape[1], -1)


class NormFirst(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.enc = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(
                64, 4, 128, dropout=0.0, batch_first=True, norm_first=True, activation="gelu"
            ),
            3,
            enable_nested_tensor=False,
        )
        self.norm = nn.LayerNorm(64, elementwise_affine=False)
        self.head = nn.Linear(64, VOCAB)

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.head(self.norm(self.enc(self.embed(x), mask=mask, is_causal=True)))


class ModuleDictNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.blocks = nn.ModuleDict(
            {
                f"b{i}": nn.Sequential(
                    nn.LayerNorm(64), nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)
                )
                for i in range(3)
            }
        )
        self.head = nn.Linear(64, VOCAB)

    def forward(self, x):
        h = self.embed(x)
        for k in ["b2", "b0", "b1"]:  # not in registration order
            h = h + self.blocks[k](h)
        return self.head(h)


class FunctionalWeights(nn.Module):
    """weights used via F.linear with a parameter of the parent"""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.w = nn.ParameterList(nn.Parameter(torch.randn(64, 64) * 0.1) for _ in range(3))
        self.head = nn.Linear(64, VOCAB)

    def forward(self, x):
        h = self.embed(x)
        for w in self.w:
            h = h + torch.tanh(nn.functional.linear(h, w))
        return self.head(h)


class ScalarGate(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(3))
        self.gates = nn.ParameterList(nn.Parameter(torch.tensor(0.5)) for _ in range(3))
        self.temp = nn.Parameter(torch.tensor(1.0))
        self.head = nn.Linear(64, VOCAB)

    def forward(self, x):
        h = self.embed(x)
        for layer, g in zip(self.layers, self.gates):
            h = h + g * torch.tanh(layer(h))
        return self.head(h) * self.temp


class Adapter(nn.Module):
    def __init__(self):
        super().__init__()
        self.base = nn.Linear(64, 64).to(torch.bfloat16).requires_grad_(False)
        self.a = nn.Linear(64, 8, bias=False)
        self.b = nn.Linear(8, 64, bias=False)
        nn.init.normal_(self.b.weight, std=0.3)

    def forward(self, x):
        return self.base(x.to(torch.bfloat16)).float() + self.b(self.a(x))


class MixedDtype(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.layers = nn.ModuleList(Adapter() for _ in range(2))
        self.head = nn.Linear(64, VOCAB)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = h + torch.tanh(layer(h))
        return self.head(h)


class MhaKdim(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.mem = nn.Embedding(VOCAB, 32)
        self.attn = nn.ModuleList(
            nn.MultiheadAttention(64, 4, kdim=32, vdim=32, batch_first=True) for _ in range(2)
        )
        self.head = nn.Linear(64, VOCAB)

    def forward(self, x):
        h = self.embed(x)
        m = self.mem(x)
        for a in self.attn:
            h = h + a(h, m, m, need_weights=False)[0]
        return self.head(h)


class RnnTanh(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.rnn = nn.RNN(32, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, x):
        return self.head(self.rnn(self.embed(x) * 5)[0])


class OddSizes(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 63)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(63, 127), nn.GELU(), nn.Linear(127, 63)) for _ in range(3)
        )
        self.head = nn.Linear(63, VOCAB)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = h + layer(h)
        return self.head(h)


class FrozenBN(nn.Module):
    """image model keeping its BatchNorms in eval mode (train() overridden)"""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.blocks = nn.Sequential(
            *[
                nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
                for _ in range(2)
            ]
        )
        self.head = nn.Linear(16, CLASSES)

    def train(self, mode=True):
        super().train(mode)
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eval()
        return self

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(64)
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 64)

    def forward(self, h):
        return h + self.down(torch.tanh(self.up(self.norm(h))))


class RepeatedInstance(nn.Module):
    """one block instance listed three times in a ModuleList"""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        blk = Block()
        self.layers = nn.ModuleList([Block(), blk, blk, blk, Block()])
        self.head = nn.Linear(64, VOCAB)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


class IdentityGaps(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.layers = nn.ModuleList([Block(), nn.Identity(), Block(), nn.Identity(), Block()])
        self.head = nn.Linear(64, VOCAB)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


class CausalConvLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.convs = nn.ModuleList(nn.Conv1d(64, 64, 3, padding=2, dilation=1) for _ in range(3))
        self.mlps = nn.ModuleList(nn.Linear(64, 64) for _ in range(3))
        self.head = nn.Linear(64, VOCAB)

    def forward(self, x):
        h = self.embed(x)
        for c, m in zip(self.convs, self.mlps):
            y = c(h.transpose(1, 2))[..., : h.shape[1]].transpose(1, 2)
            h = h + torch.tanh(m(y))
        return self.head(h)


class EmaTeacher(nn.Module):
    """a frozen teacher copy updated by EMA in forward (no_grad, in place)"""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.layers = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(64, VOCAB)
        self.teacher = nn.Linear(64, 64).requires_grad_(False)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        with torch.no_grad():
            self.teacher.weight.mul_(0.99).add_(self.layers[0].up.weight[:64, :] * 0.01)
        return self.head(h + 0.1 * self.teacher(h).detach())


class TransformerDecoderLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.mem = nn.Embedding(VOCAB, 64)
        self.dec = nn.TransformerDecoder(
            nn.TransformerDecoderLayer(64, 4, 128, dropout=0.0, batch_first=True), 2
        )
        self.head = nn.Linear(64, VOCAB)

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.head(
            self.dec(self.embed(x), self.mem(x.flip(1)), tgt_mask=mask, tgt_is_causal=True)
        )


class LstmProj(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.rnn = nn.LSTM(32, 48, proj_size=32, batch_first=True)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, x):
        return self.head(self.rnn(self.embed(x) * 5)[0])


class UnusedBranch(nn.Module):
    """a module registered but never called (dead head), and a layer used twice"""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.layers = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(64, VOCAB)
        self.aux_head = nn.Linear(64, 10)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        h = self.layers[0](h)
        return self.head(h)


class ManualTie(nn.Module):
    """logits from the embedding's weight read in the root's forward (nanoGPT-style manual tie)"""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.layers = nn.ModuleList(Block() for _ in range(2))
        self.norm = nn.LayerNorm(64)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.norm(h) @ self.embed.weight.t()


TORCH = {
    "sparse_emb": SparseEmb, "maxnorm_emb": MaxNormEmb, "bag": BagNet, "norm_first": NormFirst,
    "moduledict_order": ModuleDictNet, "functional_weights": FunctionalWeights,
    "scalar_gate": ScalarGate, "mixed_dtype": MixedDtype, "mha_kdim": MhaKdim,
    "rnn_tanh": RnnTanh, "odd_sizes": OddSizes, "frozen_bn": (FrozenBN, "image"),
    "repeated_instance": RepeatedInstance, "identity_gaps": IdentityGaps,
    "causal_conv": CausalConvLM, "ema_teacher": EmaTeacher, "tdec": TransformerDecoderLM,
    "lstm_proj": LstmProj, "unused_branch": UnusedBranch, "manual_tie": ManualTie,
}  # fmt: skip
SWEEP: dict[str, dict[str, Any]] = {
    "phimoe": _f(
        "PhimoeConfig", "PhimoeForCausalLM", dict(_GQA, num_local_experts=4, num_experts_per_tok=2)
    ),
    "jetmoe": _f(
        "JetMoeConfig",
        "JetMoeForCausalLM",
        dict(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            num_key_value_heads=4,
            kv_channels=16,
            intermediate_size=128,
            max_position_embeddings=SEQ,
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
    ),
    "bamba": _f(
        "BambaConfig",
        "BambaForCausalLM",
        dict(
            _GQA,
            mamba_d_state=8,
            mamba_n_heads=8,
            mamba_d_head=16,
            mamba_chunk_size=8,
            attn_layer_indices=[1],
        ),
        **EAGER,
    ),
    "recurrent_gemma": _f(
        "RecurrentGemmaConfig",
        "RecurrentGemmaForCausalLM",
        dict(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            lru_width=64,
            attention_window_size=8,
            block_types=["recurrent", "attention"],
        ),
        **EAGER,
    ),
    "switch": _f(
        "SwitchTransformersConfig",
        "SwitchTransformersForConditionalGeneration",
        dict(
            vocab_size=VOCAB,
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            num_experts=4,
            encoder_sparse_step=2,
            decoder_sparse_step=2,
            decoder_start_token_id=0,
            pad_token_id=0,
        ),
        "seq2seq",
        **EAGER,
    ),
    "longt5": _f(
        "LongT5Config",
        "LongT5ForConditionalGeneration",
        dict(
            vocab_size=VOCAB,
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            local_radius=4,
            decoder_start_token_id=0,
            pad_token_id=0,
        ),
        "seq2seq",
        **EAGER,
    ),
    "m2m100": _f("M2M100Config", "M2M100ForConditionalGeneration", _S2S, "seq2seq"),
    "xlnet": _f(
        "XLNetConfig",
        "XLNetLMHeadModel",
        dict(vocab_size=VOCAB, d_model=64, n_layer=2, n_head=4, d_inner=128),
        **EAGER,
    ),
    "fnet": _f(
        "FNetConfig",
        "FNetForMaskedLM",
        dict(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            intermediate_size=128,
            max_position_embeddings=SEQ,
            use_tpu_fourier_optimizations=False,
        ),
        **EAGER,
    ),
    "mobilebert": _f(
        "MobileBertConfig",
        "MobileBertForMaskedLM",
        dict(
            vocab_size=VOCAB,
            hidden_size=64,
            embedding_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            intra_bottleneck_size=32,
            true_hidden_size=32,
            num_feedforward_networks=2,
            max_position_embeddings=SEQ,
        ),
        **EAGER,
    ),
    "squeezebert": _f(
        "SqueezeBertConfig",
        "SqueezeBertForMaskedLM",
        dict(
            vocab_size=VOCAB,
            hidden_size=64,
            embedding_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=SEQ,
        ),
        **EAGER,
    ),
    "esm": _f(
        "EsmConfig",
        "EsmForMaskedLM",
        dict(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=SEQ + 2,
            position_embedding_type="rotary",
            pad_token_id=1,
            mask_token_id=2,
        ),
    ),
    "regnet": _f(
        "RegNetConfig",
        "RegNetForImageClassification",
        dict(
            embedding_size=16,
            hidden_sizes=[16, 32],
            depths=[1, 1],
            groups_width=8,
            num_labels=CLASSES,
        ),
        "image",
        **EAGER,
    ),
    "granitemoehybrid": _f(
        "GraniteMoeHybridConfig",
        "GraniteMoeHybridForCausalLM",
        dict(
            _GQA,
            num_local_experts=4,
            num_experts_per_tok=2,
            shared_intermediate_size=64,
            layer_types=["mamba", "attention"],
            mamba_d_state=8,
            mamba_n_heads=8,
            mamba_d_head=16,
            mamba_chunk_size=8,
        ),
        **EAGER,
    ),
    "qwen3_next": _f(
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        dict(
            _GQA,
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            linear_num_value_heads=4,
            linear_num_key_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            layer_types=["linear_attention", "full_attention"],
        ),
        **EAGER,
    ),
    "t5gemma": _f(
        "T5GemmaConfig",
        "T5GemmaForConditionalGeneration",
        dict(encoder=dict(_GQA, head_dim=16), decoder=dict(_GQA, head_dim=16), vocab_size=VOCAB),
        "seq2seq",
        **EAGER,
    ),
    "bert_generation": _f(
        "BertGenerationConfig", "BertGenerationDecoder", dict(ENC, is_decoder=True)
    ),
    "data2vec_text": _f(
        "Data2VecTextConfig",
        "Data2VecTextForMaskedLM",
        dict(ENC, max_position_embeddings=SEQ + 2, pad_token_id=1),
    ),
    "ibert": _f(
        "IBertConfig",
        "IBertForMaskedLM",
        dict(ENC, max_position_embeddings=SEQ + 2, pad_token_id=1),
        **EAGER,
    ),
    "nystromformer": _f(
        "NystromformerConfig",
        "NystromformerForMaskedLM",
        dict(ENC, max_position_embeddings=SEQ + 2, num_landmarks=4, segment_means_seq_len=SEQ),
        **EAGER,
    ),
    "rembert": _f(
        "RemBertConfig",
        "RemBertForMaskedLM",
        dict(ENC, input_embedding_size=32, output_embedding_size=32),
        **EAGER,
    ),
    "xlm": _f(
        "XLMConfig",
        "XLMWithLMHeadModel",
        dict(vocab_size=VOCAB, emb_dim=64, n_layers=2, n_heads=4, max_position_embeddings=SEQ),
        **EAGER,
    ),
    "led": _f(
        "LEDConfig",
        "LEDForConditionalGeneration",
        dict(
            _S2S,
            max_encoder_position_embeddings=SEQ,
            max_decoder_position_embeddings=SEQ,
            attention_window=[4, 4],
        ),
        "seq2seq",
        **EAGER,
    ),
    "marian": _f("MarianConfig", "MarianMTModel", dict(_S2S, decoder_vocab_size=VOCAB), "seq2seq"),
    "fsmt": _f(
        "FSMTConfig",
        "FSMTForConditionalGeneration",
        dict(
            langs=["en", "de"],
            src_vocab_size=VOCAB,
            tgt_vocab_size=VOCAB,
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            max_position_embeddings=SEQ + 4,
            decoder_start_token_id=2,
            pad_token_id=1,
        ),
        "seq2seq",
        **EAGER,
    ),
    "beit": _f(
        "BeitConfig",
        "BeitForImageClassification",
        dict(
            IMG,
            patch_size=8,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            use_relative_position_bias=True,
        ),
        "image",
        **EAGER,
    ),
    "poolformer": _f(
        "PoolFormerConfig",
        "PoolFormerForImageClassification",
        dict(
            IMG,
            hidden_sizes=[16, 32],
            depths=[1, 1],
            num_encoder_blocks=2,
            patch_sizes=[7, 3],
            strides=[4, 2],
            padding=[2, 1],
            pool_size=3,
        ),
        "image",
        **EAGER,
    ),
    "mobilevit": _f(
        "MobileViTConfig",
        "MobileViTForImageClassification",
        dict(
            IMG,
            hidden_sizes=[16, 24, 32],
            neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 48],
            num_attention_heads=2,
        ),
        "image",
        **EAGER,
    ),
    "convnextv2": _f(
        "ConvNextV2Config",
        "ConvNextV2ForImageClassification",
        dict(IMG, hidden_sizes=[16, 32], depths=[1, 1], num_stages=2),
        "image",
        **EAGER,
    ),
    "focalnet": _f(
        "FocalNetConfig",
        "FocalNetForImageClassification",
        dict(IMG, patch_size=4, embed_dim=16, depths=[1, 1]),
        "image",
        **EAGER,
    ),
    "pvt_v2": _f(
        "PvtV2Config",
        "PvtV2ForImageClassification",
        dict(
            IMG,
            hidden_sizes=[16, 32],
            depths=[1, 1],
            num_encoder_blocks=2,
            num_attention_heads=[1, 2],
            sr_ratios=[2, 1],
            patch_sizes=[7, 3],
            strides=[4, 2],
            mlp_ratios=[2, 2],
        ),
        "image",
        **EAGER,
    ),
}
for _name, _cls in TORCH.items():
    SWEEP[_name] = sw._torch(*_cls) if isinstance(_cls, tuple) else sw._torch(_cls)
zoo.FAMILIES.clear()
zoo.FAMILIES.update(SWEEP)
TRAINING = zoo.TRAINING


def build_model(family: str = "squeezebert", size: str = "tiny") -> nn.Module:
    """``family`` at tiny size (the sweep trains nothing larger)."""
    if size != "tiny":
        raise ValueError(f"unknown size {size!r}; the sweep has only 'tiny'")
    torch.manual_seed(0)
    return zoo.build_model(family, "tiny")


def make_batch(batch_size: int, step: int = 0) -> tuple[Any, torch.Tensor]:
    return zoo.make_batch(batch_size, step)
