"""The example model files keep meshplan's model-file contract and have the sizes they claim."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load_example(name: str) -> ModuleType:
    """Load an example by path, as the planner does, with fresh module state each time."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def llama() -> ModuleType:
    pytest.importorskip("transformers")
    return load_example("llama")


@pytest.fixture
def mlp() -> ModuleType:
    return load_example("mlp")


def logits_of(outputs: object) -> torch.Tensor:
    return outputs if isinstance(outputs, torch.Tensor) else outputs.logits


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def assert_deterministic_per_step(module: ModuleType) -> None:
    a, b = module.make_batch(2, step=3), module.make_batch(2, step=3)
    c = module.make_batch(2, step=4)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert not torch.equal(a[0], c[0])


def test_contract_attributes(llama: ModuleType, mlp: ModuleType) -> None:
    for module in (llama, mlp):
        assert callable(module.build_model) and callable(module.make_batch)
        assert {"global_batch_size", "optimizer", "dtype", "lr"} <= set(module.TRAINING)
        with pytest.raises(ValueError, match="unknown size"):
            module.build_model("no-such-size")


def test_llama_tiny_forward_and_loss(llama: ModuleType) -> None:
    torch.manual_seed(0)
    model = llama.build_model("tiny")
    assert model.config.use_cache is False
    assert model.config._attn_implementation == "sdpa"
    inputs, targets = llama.make_batch(2)
    assert inputs.shape == targets.shape == (2, 32)
    assert inputs.dtype == targets.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    logits = logits_of(model(inputs))
    assert logits.shape == (2, 32, 128)
    loss = F.cross_entropy(logits.flatten(0, -2), targets.flatten())
    assert torch.isfinite(loss)
    loss.backward()
    assert model.lm_head.weight.grad is not None


def test_llama_is_causal(llama: ModuleType) -> None:
    torch.manual_seed(0)
    model = llama.build_model("tiny").eval()
    inputs, _ = llama.make_batch(2)
    changed = inputs.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 128
    with torch.no_grad():
        a, b = logits_of(model(inputs)), logits_of(model(changed))
    assert torch.allclose(a[:, :-1], b[:, :-1])
    assert not torch.allclose(a[:, -1], b[:, -1])


def test_llama_make_batch(llama: ModuleType) -> None:
    llama.build_model("tiny", seq_len=16, vocab=50)
    inputs, targets = llama.make_batch(3)
    assert inputs.shape == targets.shape == (3, 16)
    assert int(inputs.max()) < 50
    assert_deterministic_per_step(llama)


def llama_closed_form(cfg) -> int:
    h, v, f, layers = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size, cfg.num_hidden_layers
    head_dim = h // cfg.num_attention_heads
    q = o = h * cfg.num_attention_heads * head_dim
    k = v_proj = h * cfg.num_key_value_heads * head_dim
    mlp = 3 * h * f  # gate, up, down
    norms = 2 * h  # input and post-attention RMSNorm weights
    per_layer = q + k + v_proj + o + mlp + norms
    return v * h + layers * per_layer + h + h * v  # embeddings, layers, final norm, lm_head


def test_llama_param_counts(llama: ModuleType) -> None:
    with torch.device("meta"):
        model = llama.build_model("llama3-8b")
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads) == (32, 4096, 32)
    assert (cfg.num_key_value_heads, cfg.intermediate_size, cfg.vocab_size) == (8, 14336, 128256)
    assert cfg.max_position_embeddings == 8192
    assert cfg.rope_parameters["rope_theta"] == 500000.0
    assert cfg.rms_norm_eps == 1e-5 and cfg.tie_word_embeddings is False
    assert n_params(model) == llama_closed_form(cfg) == 8_030_261_248
    assert llama.make_batch(1)[0].shape == (1, 8192)


def test_mlp_tiny_forward_and_loss(mlp: ModuleType) -> None:
    torch.manual_seed(0)
    model = mlp.build_model("tiny")
    inputs, targets = mlp.make_batch(2)
    assert inputs.shape == (2, 16) and inputs.dtype == torch.float32
    assert targets.shape == (2,) and targets.dtype == torch.int64
    assert int(targets.min()) >= 0 and int(targets.max()) < 10
    logits = logits_of(model(inputs))
    assert logits.shape == (2, 10)
    loss = F.cross_entropy(logits, targets)
    assert torch.isfinite(loss)
    loss.backward()
    assert model.head.weight.grad is not None
    assert not any(isinstance(m, torch.nn.MultiheadAttention) for m in model.modules())


def test_mlp_make_batch(mlp: ModuleType) -> None:
    mlp.build_model("tiny", in_features=8, classes=5)
    inputs, targets = mlp.make_batch(4)
    assert inputs.shape == (4, 8) and targets.shape == (4,)
    assert int(targets.max()) < 5
    assert_deterministic_per_step(mlp)


def mlp_closed_form(layers: int, width: int, in_features: int, classes: int) -> int:
    block = 2 * width + (width * 4 * width + 4 * width) + (4 * width * width + width)
    return (in_features * width + width) + layers * block + 2 * width + (width * classes + classes)


def test_mlp_param_counts(mlp: ModuleType) -> None:
    with torch.device("meta"):
        small = mlp.build_model("small")
        big = mlp.build_model("1b")
    assert len(small.layers) == 8
    assert n_params(small) == mlp_closed_form(8, 256, 64, 100) == 4_251_492
    assert n_params(big) == mlp_closed_form(30, 2048, 1024, 1000)
    assert 0.9e9 < n_params(big) < 1.1e9
