"""Every transformers family of the zoo (tests/zoo/zoo.py) planned from nothing but a
config.json, as ``plan path/to/config-dir --gpus 4`` would: the config written by the family's
own config class, the model built by ``planner.hf_config`` (no model file), and the plan's
parameter count equal to the family's model class built directly. The task comes from the
config's ``architectures``. The causal-LM families' plans (11) are then exported to
torchtitan, Megatron and DeepSpeed and read back by those engines' own config classes
(tests/test_export.py's readers), their degrees equal to the plan's.

    python -m pytest -q -m zoo tests/zoo/test_hf_families.py     # about 4 minutes on 2 cores
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from zoo import FAMILIES  # noqa: E402

from planner.api import plan  # noqa: E402
from planner.export import export_plan  # noqa: E402
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
    if spec["kind"] == "lm" and mf.args["task"] == "causal-lm":
        check_exports(result.plan, tmp_path / "exports")


def check_exports(plan, directory: Path) -> None:
    """torchtitan's ConfigManager, Megatron-Core's TransformerConfig (from the exported
    architecture flags) and DeepSpeedConfig read the plan's exports."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from test_export import (  # the engines' readers
        DataParallelGroups,
        load_torchtitan,
        megatron_config,
        megatron_kwargs,
        write,
    )

    mesh = plan.mesh
    titan = load_torchtitan(export_plan(plan, "torchtitan"), directory / "torchtitan")
    assert titan.parallelism.tensor_parallel_degree == mesh.tp
    assert titan.parallelism.pipeline_parallel_degree == mesh.pp
    shards = titan.parallelism.data_parallel_shard_degree
    assert shards * titan.parallelism.data_parallel_replicate_degree == mesh.dp
    args = megatron_kwargs(export_plan(plan, "megatron").files["megatron_args.txt"])
    megatron = megatron_config(args, None)
    assert (megatron.tensor_model_parallel_size, megatron.pipeline_model_parallel_size) == (
        mesh.tp, mesh.pp)  # fmt: skip
    assert megatron.num_layers == plan_layers(plan)
    import deepspeed
    import torch.distributed as dist
    from deepspeed.runtime.config import DeepSpeedConfig

    paths = write(export_plan(plan, "deepspeed"), directory / "deepspeed")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
        groups = DataParallelGroups(mesh.dp, mesh.tp, mesh.pp)
        ds = DeepSpeedConfig(str(paths["ds_config.json"]), mpu=groups)
    finally:
        dist.destroy_process_group()
    assert ds.gradient_accumulation_steps == plan.num_microbatches
    assert ds.train_micro_batch_size_per_gpu == plan.micro_batch_size


def plan_layers(plan) -> int:
    from planner.export.facts import plan_facts

    return plan_facts(plan).layers


def test_there_are_at_least_ten_families():
    assert len(HF_FAMILIES) >= 10, HF_FAMILIES
    causal = [
        f for f in HF_FAMILIES if FAMILIES[f]["model"].endswith(("ForCausalLM", "LMHeadModel"))
    ]
    assert len(causal) >= 10, causal  # the families whose exports the engines read back


TINY_BERT = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=128, max_position_embeddings=64)  # fmt: skip
# The other tasks' heads, each from a config alone: (config class, fields, architecture, task)
OTHER_TASKS = {
    "whisper": ("WhisperConfig", dict(
        vocab_size=128, d_model=64, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
        decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=32, max_target_positions=32,
        decoder_start_token_id=1, pad_token_id=0,
    ), "WhisperForConditionalGeneration", "speech-seq2seq"),
    "bert-sequence": ("BertConfig", {**TINY_BERT, "num_labels": 3},
                      "BertForSequenceClassification", "sequence-classification"),
    "bert-token": ("BertConfig", {**TINY_BERT, "num_labels": 5},
                   "BertForTokenClassification", "token-classification"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(OTHER_TASKS))
def test_other_tasks_trace_from_their_configs(case, tmp_path):
    """Speech-to-text and classification heads: the task from ``architectures``, the traced
    parameters the model class's own, and the batch's loss finite and differentiable."""
    from planner.api import trace

    config_cls, fields, arch, task = OTHER_TASKS[case]
    config = getattr(transformers, config_cls)(**fields)
    config.architectures = [arch]
    config.save_pretrained(tmp_path)
    mf = load_model_file(tmp_path)
    assert mf.args["task"] == task
    traced = trace(mf, traced_batch_size=2, dtype="fp32", use_cache=False)
    reference = getattr(transformers, arch)(config)
    assert traced.params == sum(p.numel() for p in reference.parameters())
    model = mf.build()
    inputs, targets = mf.batch(2)
    loss = mf.loss(model(*inputs), targets)
    loss.backward()
    assert loss.isfinite() and loss.item() > 0
