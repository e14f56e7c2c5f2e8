"""Vision-language models trace: transformers' image-token count check reads tensor values
(``item``), which the meta-device trace cannot; the planner drops such input checks from the
graph it prices and says so (``planner/trace/value_checks.py``), and training runs them.
``tests/zoo`` trains LLaVA and Qwen2-VL in four forms against one process."""

from __future__ import annotations

from pathlib import Path

import torch

from planner.api import trace
from planner.modelfile import load_model_file

LLAVA = Path(__file__).resolve().parent / "models" / "llava.py"


def test_llava_traces_with_its_image_token_check_dropped_and_noted():
    mf = load_model_file(LLAVA, {})
    traced = trace(mf, dtype="fp32")
    assert traced.params == sum(p.numel() for p in mf.build().parameters())
    assert "input check" in traced.note and "image-token" in traced.note
    names = [b.name for b in traced.blocks]
    # the vision tower's layers and the language model's are blocks of their own
    assert "model.vision_tower.encoder.layers.1" in names
    assert "model.language_model.layers.0" in names


def test_the_check_still_runs_on_a_real_batch():
    mf = load_model_file(LLAVA, {})
    torch.manual_seed(0)
    model = mf.build()
    (ids, images), _ = mf.batch(2)
    ids = ids.clone()
    ids[0, 0] = 5  # one image token fewer than the image has features
    try:
        model(ids, images)
    except ValueError as exc:
        assert "Image features and image tokens do not match" in str(exc)
    else:
        raise AssertionError("transformers' check did not run")


def test_qwen2_vl_is_refused_in_one_line_saying_why():
    """Qwen2-VL's vision attention splits its patches per image by sizes read from the image
    grid (``lengths.tolist()``): no meta-device trace can size that; the refusal says so."""
    import pytest

    from planner.errors import UserInputError

    mf = load_model_file(LLAVA.with_name("qwen2_vl.py"), {})
    with pytest.raises(UserInputError) as refused:
        trace(mf, dtype="fp32", use_cache=False)
    message = str(refused.value)
    assert "\n" not in message
    assert "decides what to do from tensor values" in message
