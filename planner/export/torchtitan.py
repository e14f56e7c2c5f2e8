"""A plan as torchtitan (0.3.x) runs it: a config-registry module whose ``meshplan()`` returns
torchtitan's ``Trainer.Config`` with the plan's parallelism, batch and checkpointing set.

torchtitan 0.3 configures a job by a Python function (``--module M --config F``), so the
export is one: it starts from the built-in config of the same model where torchtitan has one
(the Llama 3 flavours, matched by the plan's exact parameter count) and sets every field the
plan decides. Run it with::

    PYTHONPATH=DIR torchrun --nproc-per-node 8 -m torchtitan.train \\
        --module torchtitan_meshplan --config meshplan
"""

from __future__ import annotations

from dataclasses import replace

from planner.export.facts import PlanFacts, as_planned, every, offload_changes
from planner.export.types import Export
from planner.schema.plan import Plan
from planner.vocab import DType, Offload, Recompute, Schedule

FILE = "torchtitan_meshplan.py"
SCHEDULES = {
    Schedule.GPIPE: "GPipe",
    Schedule.ONE_F_ONE_B: "1F1B",
    Schedule.INTERLEAVED: "Interleaved1F1B",
}
# torchtitan's built-in configs by their model's parameter count (untied embeddings, vocab
# 128,256): Llama 3 8B, 70B and 405B as Meta publishes them (model cards: 8.03B, 70.6B, 406B).
BASE_CONFIGS = {
    8_030_261_248: ("llama3", "llama3_8b"),
    70_553_706_496: ("llama3", "llama3_70b"),
    405_853_388_800: ("llama3", "llama3_405b"),
}
# The small config every torchtitan model file offers, for a model torchtitan does not ship.
FALLBACK_BASE = ("llama3", "llama3_debugmodel")
PARAM_DTYPES = {DType.BF16: "bfloat16", DType.FP32: "float32"}
# torchtitan's module names around the layers (torchtitan/models/common/decoder.py).
EMBEDDING_FQNS = ["tok_embeddings"]
HEAD_FQNS = ["norm", "output"]


def export(plan: Plan, facts: PlanFacts) -> Export:
    changes: list[str] = []
    module, base = BASE_CONFIGS.get(plan.model.params, FALLBACK_BASE)
    if (module, base) == FALLBACK_BASE:
        changes.append(
            f"torchtitan has no built-in model of {plan.model.params:,} parameters: the config "
            f"starts from {base}; set config.model_spec to your model"
        )
    mesh = plan.mesh
    replicate, shard, reshard = _data_parallel(plan.zero_stage, mesh.dp, changes)
    zero = 2 if plan.zero_stage == 1 and mesh.dp > 1 else plan.zero_stage
    parallelism = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": reshard,
        "tensor_parallel_degree": mesh.tp,
        "enable_sequence_parallel": facts.sequence_parallel and mesh.tp > 1,
        "context_parallel_degree": mesh.cp,
        "expert_parallel_degree": mesh.ep,
        "pipeline_parallel_degree": mesh.pp,
    }
    if mesh.pp > 1:
        parallelism.update(
            pipeline_parallel_schedule=SCHEDULES[Schedule(plan.schedule)],
            pipeline_parallel_microbatch_size=plan.micro_batch_size,
            module_fqns_per_model_part=module_fqns_per_part(facts),
        )
    local_batch = plan.global_batch_size // mesh.dp
    if mesh.pp == 1:  # no pipeline: torchtitan accumulates local batches of one micro-batch
        local_batch = plan.micro_batch_size
    training = {
        "local_batch_size": local_batch,
        "global_batch_size": plan.global_batch_size,
        "mixed_precision_param": _param_dtype(plan.dtype, changes),
        "enable_cpu_offload": facts.offload != Offload.NONE,
        # torchtitan's CUDA graphs refuse a pipeline (Trainer.Config._validate_cuda_graphs)
        "disable_cuda_graphs": True if mesh.pp > 1 else None,
    }
    if facts.hf_config is not None:
        training["seq_len"] = plan.model.args.get("seq_len")
    if facts.offload == Offload.OPTIMIZER:
        changes.append(
            "optimizer offload became FSDP CPU offload of parameters, gradients and optimizer "
            "states (torchtitan's only offload)"
        )
    changes += offload_changes(facts)
    ac = _activation_checkpoint(facts, changes)
    text = _render(module, base, parallelism, training, ac, plan)
    # FSDP's CPU offload moves every parameter with its gradient and optimizer states
    offload = Offload.PARAMS if facts.offload != Offload.NONE else Offload.NONE
    runs = replace(
        as_planned(plan, facts),
        zero_stage=zero,
        layer_recompute=every(facts.recompute, facts.layers),
        other_recompute=every(Recompute.NONE, len(facts.other_recompute)),
        layer_offload=every(offload, facts.layers),
        other_offload=every(offload, len(facts.other_offload)),
    )
    return Export(engine="torchtitan", files={FILE: text}, changes=changes, runs=runs)


def _data_parallel(zero: int, dp: int, changes: list[str]) -> tuple[int, int, str]:
    """(replicate degree, shard degree, fsdp_reshard_after_forward) for a ZeRO stage."""
    if dp == 1:
        return 1, 1, "default"
    if zero == 0:
        return dp, 1, "default"  # DDP over the replicas
    if zero == 1:
        changes.append(
            "ZeRO-1 became FSDP without resharding after forward (ZeRO-2's memory): "
            "torchtitan has no optimizer-only sharding"
        )
    return 1, dp, "always" if zero == 3 else "never"


def _param_dtype(dtype: str, changes: list[str]) -> str:
    if dtype in PARAM_DTYPES:
        return PARAM_DTYPES[DType(dtype)]
    changes.append(f"{dtype} mixed precision became bfloat16 (torchtitan's FSDP takes bf16/fp32)")
    return PARAM_DTYPES[DType.BF16]


def _activation_checkpoint(facts: PlanFacts, changes: list[str]) -> str:
    """The config expression of the layers' recompute (one policy for every layer)."""
    mode = facts.recompute
    if len(set(facts.layer_recompute)) > 1:
        changes.append(
            f"recompute of {facts.recomputed_layers} of {facts.layers} layers became "
            f"{mode} for every layer (torchtitan applies one policy to all layers)"
        )
    if any(r != Recompute.NONE for r in facts.other_recompute):
        changes.append("recompute of the embedding/head dropped (torchtitan checkpoints layers)")
    if mode == Recompute.FULL:
        return "FullAC.Config()"
    if mode == Recompute.SELECTIVE:
        changes.append(
            "selective recompute (the attention core) became torchtitan's per-op selective "
            "checkpointing (saves matmul and attention outputs, recomputes the rest)"
        )
        return "SelectiveAC.Config()"
    return "None"


def module_fqns_per_part(facts: PlanFacts) -> list[list[str]]:
    """torchtitan's module names per pipeline part, in the plan's stage order: the
    embedding with the first part, the final norm and head with the last."""
    parts, start = [], 0
    for count in facts.layers_per_stage:
        parts.append([f"layers.{i}" for i in range(start, start + count)])
        start += count
    parts[0] = EMBEDDING_FQNS + parts[0]
    parts[-1] = parts[-1] + HEAD_FQNS
    return parts


def _render(module: str, base: str, parallelism: dict, training: dict, ac: str, plan: Plan) -> str:
    lines = [
        f'"""torchtitan config written by meshplan from a plan of {plan.model.file}',
        f"({plan.mesh.pp} pp x {plan.mesh.dp} dp x {plan.mesh.cp} cp x {plan.mesh.tp} tp, "
        f"predicted {plan.predicted.step_time_s:.4g} s/step).",
        "",
        "    torchrun ... -m torchtitan.train --module torchtitan_meshplan --config meshplan",
        '"""',
        "",
        "from torchtitan.config import ParallelismConfig",
        "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC",
        f"from torchtitan.models.{module}.config_registry import {base} as base",
        "",
        "__all__ = ['meshplan', 'FullAC', 'SelectiveAC']",
        "",
        "",
        "def meshplan():",
        "    config = base()",
        "    config.parallelism = ParallelismConfig(",
        *(f"        {k}={v!r}," for k, v in parallelism.items()),
        "    )",
        *(f"    config.training.{k} = {v!r}" for k, v in training.items() if v is not None),
        f"    config.activation_checkpoint = {ac}",
        "    return config",
        "",
    ]
    return "\n".join(lines)
