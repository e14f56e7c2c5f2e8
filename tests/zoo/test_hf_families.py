"""Every transformers family of the zoo (tests/zoo/zoo.py) planned from nothing but a
config.json, as ``plan path/to/config-dir --gpus 4`` would: the config written by the family's
own config class, the model built by ``planner.hf_config`` (no model file), and the plan's
parameter count equal to the family's model class built directly. The task comes from the
config's ``architectures``.

    python -m pytest -q -m zoo tests/zoo/test_hf_families.py     # about 2 minutes on 2 cores
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from zoo import FAMILIES  # noqa: E402

from planner.api import plan  # noqa: E402
from planner.modelfile import load_model_file  # noqa: E402

pytestmark = pytest.mark.zoo

HF_FAMILIES = sorted(f for f, spec in FAMILIES.items() if spec["config"])  # all but torch.nn
TASK_OF_KIND = {"lm": {"causal-lm", "masked-lm"}, "seq2seq": {"seq2seq-lm"}, "image": {
    "image-classification"}}  # fmt: skip


@pytest.mark.parametrize("family", HF_FAMILIES)
def test_a_family_plans_from_its_config_alone(family, tmp_path):
    spec = FAMILIES[family]
    config = getattr(transformers, spec["config"])(**spec["tiny"])
    config.architectures = [spec["model"]]
    config.save_pretrained(tmp_path)
    mf = load_model_file(tmp_path)
    assert mf.args["task"] in TASK_OF_KIND[spec["kind"]]
    reference = getattr(transformers, spec["model"])(config)
    result = plan(mf, 4, profile="cpu", dtype="bf16", use_cache=False)
    assert result.plan.model.params == sum(p.numel() for p in reference.parameters())
    assert result.plan.mesh.size == 4
    assert result.plan.predicted.step_time_s > 0


def test_there_are_at_least_ten_families():
    assert len(HF_FAMILIES) >= 10, HF_FAMILIES
