"""A plan as Hugging Face Accelerate runs it with FSDP 2: the ``accelerate launch`` config
file (``accelerate_config.yaml``)::

    accelerate launch --config_file accelerate_config.yaml train.py

ZeRO-3 is FSDP resharding after forward, ZeRO-2 without; ZeRO-0 is DDP (``MULTI_GPU``); the
auto-wrap unit is the plan's repeated layer class; TP and CP degrees go in Accelerate's
``parallelism_config``. Accelerate has no pipeline parallelism.
"""

from __future__ import annotations

from dataclasses import replace

from planner.export.facts import PlanFacts, as_planned, every, offload_changes
from planner.export.types import Export
from planner.schema.mesh import Mesh
from planner.schema.plan import Plan
from planner.vocab import DType, Offload, Recompute, Schedule

FILE = "accelerate_config.yaml"
MIXED_PRECISION = {DType.BF16: "bf16", DType.FP16: "fp16", DType.FP32: "no"}


def export(plan: Plan, facts: PlanFacts, layer_class: str) -> Export:
    """The plan as an Accelerate (FSDP2) config, with what Accelerate cannot express said in
    ``changes``.

    Long because each config key sits beside the change it forces, in the order of
    Accelerate's config file; split, a change would drift from its key."""
    changes: list[str] = []
    mesh = plan.mesh
    dp = mesh.dp
    if mesh.pp > 1:
        dp *= mesh.pp
        changes.append(
            f"the {mesh.pp}-stage pipeline became {mesh.pp}x more data parallelism "
            "(Accelerate has no pipeline parallelism): more memory per device than planned"
        )
    zero = plan.zero_stage
    fsdp = zero > 0 and dp > 1
    if zero == 1 and fsdp:
        changes.append("ZeRO-1 became FSDP without resharding after forward (ZeRO-2)")
    if mesh.ep > 1:
        changes.append("the expert-parallel degree is not an Accelerate setting (ep dropped)")
    config: dict = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP" if fsdp else "MULTI_GPU",
        "mixed_precision": MIXED_PRECISION[DType(plan.dtype)],
        "num_machines": plan.cluster.nodes,
        "num_processes": plan.cluster.gpus,
        "machine_rank": 0,
        "main_training_function": "main",
        "rdzv_backend": "c10d" if plan.cluster.nodes > 1 else "static",
        "same_network": True,
        "use_cpu": False,
    }
    if fsdp:
        config["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": zero == 3,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_transformer_layer_cls_to_wrap": layer_class,
            "fsdp_activation_checkpointing": facts.recompute != Recompute.NONE,
            "fsdp_offload_params": facts.offload != Offload.NONE,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,
        }
        if facts.offload == Offload.OPTIMIZER:
            changes.append("optimizer offload became FSDP 2's CPU offload of parameters, "
                           "gradients and optimizer states")  # fmt: skip
        changes += offload_changes(facts)
    elif facts.offload != Offload.NONE:
        changes.append("offload dropped: without FSDP, Accelerate offloads nothing")
    if mesh.tp > 1 and facts.sequence_parallel:
        changes.append(
            "sequence parallelism dropped: Accelerate's TP applies the model's own "
            "tensor-parallel plan (transformers' tp_plan), whose activations between the "
            "linear layers are whole on every TP rank"
        )
    if mesh.tp > 1 or mesh.cp > 1:
        config["parallelism_config"] = {
            "parallelism_config_dp_replicate_size": 1 if fsdp else dp,
            "parallelism_config_dp_shard_size": dp if fsdp else 1,
            "parallelism_config_tp_size": mesh.tp,
            "parallelism_config_cp_size": mesh.cp,
        }
    _recompute_changes(facts, fsdp, changes)
    recompute = Recompute.FULL if fsdp and facts.recompute != Recompute.NONE else Recompute.NONE
    offload = Offload.PARAMS if fsdp and facts.offload != Offload.NONE else Offload.NONE
    runs = replace(
        as_planned(plan, facts),
        mesh=Mesh(1, dp, mesh.tp, 1, mesh.cp),
        zero_stage=(2 if zero == 1 else zero) if fsdp else 0,
        schedule=Schedule.ONE_F_ONE_B,
        virtual_stages=1,
        layers_per_stage=(facts.layers,),
        layer_recompute=every(recompute, facts.layers),
        other_recompute=every(Recompute.NONE, len(facts.other_recompute)),
        layer_offload=every(offload, facts.layers),
        other_offload=every(offload, len(facts.other_offload)),
        sequence_parallel=False,
    )
    return Export(
        engine="accelerate",
        files={FILE: _yaml(config)},
        changes=changes,
        command="accelerate launch --config_file accelerate_config.yaml train.py",
        runs=runs,
    )


def _recompute_changes(facts: PlanFacts, fsdp: bool, changes: list[str]) -> None:
    if facts.recompute == Recompute.NONE:
        return
    if not fsdp:
        changes.append("recompute dropped: Accelerate checkpoints activations through FSDP only")
    elif facts.recompute == Recompute.SELECTIVE:
        changes.append("selective recompute became full recompute of every wrapped layer "
                       "(FSDP's activation checkpointing)")  # fmt: skip
    elif len(set(facts.layer_recompute)) > 1:
        changes.append(
            f"recompute of {facts.recomputed_layers} of {facts.layers} layers became recompute "
            "of every layer (FSDP checkpoints every wrapped layer)"
        )


def _yaml(config: dict, indent: int = 0) -> str:
    """The flat YAML Accelerate writes (scalars and one level of mappings)."""
    lines = []
    for key, value in config.items():
        if isinstance(value, dict):
            lines.append(" " * indent + f"{key}:")
            lines.append(_yaml(value, indent + 2).rstrip("\n"))
        else:
            lines.append(" " * indent + f"{key}: {_scalar(value)}")
    return "\n".join(lines) + "\n"


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
