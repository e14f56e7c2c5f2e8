"""A plan as DeepSpeed runs it: ``ds_config.json`` (ZeRO stage, offload, batch sizes, mixed
precision, activation checkpointing, AutoTP degree) and, with a pipeline, the stage cut in
``deepspeed_partition.json`` (layer boundaries for ``PipelineModule``'s ``parts``)::

    deepspeed train.py --deepspeed --deepspeed_config ds_config.json
"""

from __future__ import annotations

import json
from dataclasses import replace

from planner.export.facts import PlanFacts, as_planned, every, offload_changes
from planner.export.types import Export
from planner.schema.plan import Plan
from planner.vocab import DType, Offload, Recompute, Schedule

FILE = "ds_config.json"
PARTITION_FILE = "deepspeed_partition.json"


def export(plan: Plan, facts: PlanFacts) -> Export:
    """The plan as a DeepSpeed config, with what DeepSpeed cannot express said in ``changes``.

    Long because each config section sits beside the change it forces, in the order
    DeepSpeed's config documents them; split, a change would drift from its section."""
    changes: list[str] = []
    mesh = plan.mesh
    zero = plan.zero_stage
    if mesh.pp > 1 and zero > 1:
        changes.append(f"ZeRO-{zero} became ZeRO-1: DeepSpeed's pipeline engine takes ZeRO 0 or 1")
        zero = 1
    config: dict = {
        "train_batch_size": plan.global_batch_size,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.num_microbatches,
        "zero_optimization": {"stage": zero},
        "bf16": {"enabled": plan.dtype == DType.BF16},
        "fp16": {"enabled": plan.dtype == DType.FP16},
    }
    offload = Offload.NONE
    if facts.offload != Offload.NONE:
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        offload = Offload.OPTIMIZER
        if facts.offload == Offload.PARAMS:
            if zero == 3:
                config["zero_optimization"]["offload_param"] = {"device": "cpu"}
                offload = Offload.PARAMS
            else:
                changes.append(
                    "parameter offload dropped: DeepSpeed offloads parameters at ZeRO-3 only, "
                    f"this plan is ZeRO-{zero}"
                )
        changes += offload_changes(facts)
    if zero in (1, 2) and mesh.pp == 1 and mesh.replicas > 1:
        # the reduction overlapping the backward, as the plan is priced (DeepSpeed turns
        # overlap_comm on by itself at ZeRO-3 only)
        config["zero_optimization"]["overlap_comm"] = True
    if mesh.tp > 1:
        config["tensor_parallel"] = {"autotp_size": mesh.tp}
        changes.append(
            "tensor parallelism is DeepSpeed's AutoTP: it chooses the sharding of each linear "
            "layer itself (the plan's per-module styles are not passed)"
        )
        if facts.sequence_parallel:
            changes.append(
                "sequence parallelism dropped: AutoTP shards the linear layers only, so the "
                "activations between them are whole on every TP rank"
            )
    if mesh.cp > 1 or mesh.ep > 1:
        changes.append(
            "context/expert parallel degrees are not ds_config fields: set them in the model "
            "(Ulysses sequence parallel, DeepSpeed-MoE's ep_size)"
        )
    files: dict[str, str] = {}
    runs = replace(
        as_planned(plan, facts),
        zero_stage=zero,
        layer_offload=every(offload, facts.layers),
        other_offload=every(offload, len(facts.other_offload)),
        sequence_parallel=False,
    )
    if facts.recompute != Recompute.NONE:
        config["activation_checkpointing"] = {
            "partition_activations": False,
            "contiguous_memory_optimization": False,
            "number_checkpoints": facts.recomputed_layers,
        }
        changes.append(
            f"recompute ({facts.recompute}, {facts.recomputed_layers} of {facts.layers} "
            "layers) needs the model to call deepspeed.checkpointing.checkpoint on those "
            "layers: DeepSpeed recomputes what the model's code wraps"
        )
    if mesh.pp > 1:
        config["pipeline"] = {"stages": mesh.pp, "partition": "parameters"}
        bounds = [0]
        for count in facts.layers_per_stage:
            bounds.append(bounds[-1] + count)
        if plan.virtual_stages > 1:  # one stage per rank: an even cut
            bounds = [round(i * facts.layers / mesh.pp) for i in range(mesh.pp + 1)]
        files[PARTITION_FILE] = json.dumps({"parts": bounds, "layers": facts.layers}) + "\n"
        cut = tuple(b - a for a, b in zip(bounds, bounds[1:]))
        runs = replace(runs, virtual_stages=1, schedule=Schedule.ONE_F_ONE_B, layers_per_stage=cut)
        if plan.virtual_stages > 1:
            changes.append("interleaved stages became one stage per rank (DeepSpeed's pipeline "
                           "has no interleaving)")  # fmt: skip
        elif plan.schedule == Schedule.GPIPE:
            changes.append("GPipe became DeepSpeed's TrainSchedule (1F1B)")
    files[FILE] = json.dumps(config, indent=2) + "\n"
    return Export(
        engine="deepspeed",
        files=files,
        changes=changes,
        command="deepspeed train.py --deepspeed --deepspeed_config ds_config.json",
        runs=runs,
    )
