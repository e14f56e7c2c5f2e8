"""A Hugging Face model with no model file (planner/hf_config.py): configs written by
transformers' own config classes (no network), checked against the models transformers builds
from them directly, against torch's cross-entropy, and against the published Llama-3.1-8B."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers

from meshplan.cli import main
from planner.api import plan
from planner.hf_config import IGNORED, MAX_DEFAULT_SEQ_LEN, Task, load_config_model
from planner.modelfile import file_sha256, load_model_file
from planner.search import Pins

ROOT = Path(__file__).resolve().parent.parent
LLAMA_31_8B = ROOT / "examples" / "hf" / "llama-3.1-8b"
TINY_LLAMA = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
)


def write_config(directory: Path, config_cls: str, model_cls: str | None, **fields) -> Path:
    """A config.json as transformers writes it (``save_pretrained``)."""
    config = getattr(transformers, config_cls)(**fields)
    config.architectures = [model_cls] if model_cls else None
    config.save_pretrained(directory)
    return directory


@pytest.fixture()
def tiny_llama(tmp_path) -> Path:
    return write_config(tmp_path / "tiny-llama", "LlamaConfig", "LlamaForCausalLM", **TINY_LLAMA)


def test_a_config_directory_is_the_architecture_transformers_builds(tiny_llama):
    """Same parameters, by name and shape, as LlamaForCausalLM(config) built directly; the
    task is the architecture's and the sequence the config's context."""
    mf = load_model_file(tiny_llama)
    assert mf.path == (tiny_llama / "config.json").resolve()
    assert mf.sha256 == file_sha256(mf.path)
    assert mf.args == {"task": "causal-lm", "seq_len": 32}
    with torch.device("meta"):
        ours = mf.build()
    reference = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY_LLAMA))
    assert {k: v.shape for k, v in ours.named_parameters()} == {
        k: v.shape for k, v in reference.named_parameters()
    }
    inputs, targets = mf.batch(3, step=1)
    assert inputs[0].shape == (3, 32) and targets.shape == (3, 32)
    assert torch.equal(inputs[0][:, 1:], targets[:, :-1])  # next-token targets
    again, _ = mf.batch(3, step=1)
    assert torch.equal(again[0], inputs[0])  # deterministic per step


def test_the_masked_lm_loss_is_cross_entropy_over_the_masked_share_only(tmp_path):
    """BERT: targets are -100 outside about 15% of positions, and the loss equals torch's
    cross-entropy over exactly the predicted positions."""
    directory = write_config(
        tmp_path / "bert", "BertConfig", "BertForMaskedLM", vocab_size=128, hidden_size=64,
        num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=64,
    )  # fmt: skip
    mf = load_model_file(directory)
    assert mf.args["task"] == Task.MASKED_LM and mf.args["seq_len"] == 64
    inputs, targets = mf.batch(16)
    predicted = targets != IGNORED
    assert 0.10 < predicted.float().mean().item() < 0.20
    assert torch.equal(targets[predicted], inputs[0][predicted])
    logits = torch.randn(16, 64, 128, generator=torch.Generator().manual_seed(0))
    expected = F.cross_entropy(logits[predicted], targets[predicted])
    assert mf.loss(logits, targets).item() == pytest.approx(expected.item(), rel=1e-6)


def test_task_and_sequence_flags_and_config_overrides(tiny_llama):
    model = load_config_model(
        tiny_llama, {"task": "sequence-classification", "seq_len": 16, "num_hidden_layers": 3}
    )
    assert model.task is Task.SEQUENCE_CLASSIFICATION and model.seq_len == 16
    assert model.config.num_hidden_layers == 3
    with torch.device("meta"):
        built = model.build_model()
    assert type(built).__name__ == "LlamaForSequenceClassification"
    assert len(built.model.layers) == 3
    inputs, targets = model.make_batch(4)
    assert inputs.shape == (4, 16) and targets.shape == (4,)


def test_the_shipped_llama_31_8b_config_is_the_published_model():
    """examples/hf/llama-3.1-8b: the published 8,030,261,248 parameters (Meta's model card:
    8.03B), llama3 rope scaling read by transformers, and a 131,072-token context that the
    default sequence caps at 8,192."""
    model = load_config_model(LLAMA_31_8B)
    assert model.seq_len == MAX_DEFAULT_SEQ_LEN == 8192
    assert model.config.max_position_embeddings == 131072
    assert model.config.rope_parameters["rope_type"] == "llama3"
    assert model.config.rope_parameters["rope_theta"] == 500000.0
    with torch.device("meta"):
        built = model.build_model()
    assert sum(p.numel() for p in built.parameters()) == 8_030_261_248


def test_a_config_plans_and_the_plan_rebuilds_the_same_model(tiny_llama, tmp_path):
    """The plan records the config's path, hash and resolved args; loading them back (what
    ``plan run`` does) gives the same model file."""
    mf = load_model_file(tiny_llama, {"seq_len": 16})
    result = plan(mf, 2, profile="cpu", dtype="fp32", use_cache=False, pins=Pins(pp=1))
    recorded = result.plan.model
    assert recorded.file == str(mf.path) and recorded.sha256 == mf.sha256
    assert recorded.args == {"task": "causal-lm", "seq_len": 16}
    assert recorded.params == 90432  # LlamaForCausalLM(tiny): as torch counts it
    rebuilt = load_model_file(recorded.file, recorded.args)
    assert rebuilt.sha256 == mf.sha256 and rebuilt.args == mf.args


BAD = {
    "unknown_model_type": (
        {"model_type": "no-such-family", "hidden_size": 8},
        [],
        "cannot read this config",
    ),
    "unknown_task": (None, ["--task", "poetry"], "invalid choice"),
    "task_without_model": (None, ["--task", "image-classification"], "no image-classification"),
    # a base model (an embedding model's config): no head, so no task to train
    "no_task": ({"model_type": "llama", "architectures": ["LlamaModel"]}, [], "pass --task"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_configs_are_one_line_and_exit_2(case, tiny_llama, capsys):
    raw, flags, needle = BAD[case]
    if raw is not None:
        (tiny_llama / "config.json").write_text(json.dumps(raw))
    code = main([str(tiny_llama), "--graph", *flags])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and needle in err, err


def test_an_offline_miss_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    """HF_HUB_OFFLINE with an empty cache: the Hub is never asked, and the user is told."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    code = main(["hf:meta-llama/Llama-3.1-8B", "--graph"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "not in the Hugging Face cache" in err


def test_task_flags_with_a_model_file_are_refused(capsys):
    code = main(["examples/mlp.py", "--graph", "--seq-len", "8"])
    err = capsys.readouterr().err
    assert code == 2 and "--seq-len is for a Hugging Face config" in err
