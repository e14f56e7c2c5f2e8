"""A plan as Megatron-LM / Megatron-Core runs it: the command-line arguments of
``pretrain_gpt.py``, one per line in ``megatron_args.txt``::

    torchrun ... pretrain_gpt.py $(cat megatron_args.txt) --data-path ... --tokenizer-type ...

Each flag's destination is its ``TransformerConfig`` / ``ModelParallelConfig`` field (dashes
to underscores), as Megatron-LM's ``core_transformer_config_from_args`` reads them.
"""

from __future__ import annotations

from dataclasses import replace

from planner.export.facts import (
    PlanFacts,
    as_planned,
    even_cut,
    every,
    hf_architecture,
    offload_changes,
)
from planner.export.types import Export
from planner.schema.plan import Plan
from planner.vocab import DType, Offload, Recompute, Schedule

FILE = "megatron_args.txt"


def export(plan: Plan, facts: PlanFacts) -> Export:
    changes: list[str] = []
    mesh = plan.mesh
    args: list[str] = [
        "--tensor-model-parallel-size", str(mesh.tp),
        "--pipeline-model-parallel-size", str(mesh.pp),
        "--context-parallel-size", str(mesh.cp),
        "--expert-model-parallel-size", str(mesh.ep),
        "--micro-batch-size", str(plan.micro_batch_size),
        "--global-batch-size", str(plan.global_batch_size),
    ]  # fmt: skip
    if facts.sequence_parallel and mesh.tp > 1:
        args.append("--sequence-parallel")
    pipeline_args, cut, schedule = _pipeline(plan, facts, changes)
    recompute_args, layer_recompute = _recompute(facts, cut, changes)
    zero_args, zero = _zero(plan.zero_stage, changes)
    offload_args, offload = _offload(facts, changes)
    args += pipeline_args + recompute_args + zero_args + offload_args
    if mesh.replicas > 1:  # the reduction overlapping the backward, as the plan prices it
        args.append("--overlap-grad-reduce")
    if plan.dtype in (DType.BF16, DType.FP16):
        args.append(f"--{plan.dtype}")
    args += _model(plan, facts, changes)
    text = "\n".join(args) + "\n"
    runs = replace(
        as_planned(plan, facts),
        zero_stage=zero,
        schedule=schedule,
        layers_per_stage=cut,
        layer_recompute=layer_recompute,
        other_recompute=every(Recompute.NONE, len(facts.other_recompute)),
        layer_offload=every(offload, facts.layers),
        other_offload=every(offload, len(facts.other_offload)),
    )
    return Export(
        engine="megatron",
        files={FILE: text},
        changes=changes,
        command="torchrun ... pretrain_gpt.py $(cat megatron_args.txt) --data-path ...",
        runs=runs,
    )


def _pipeline(
    plan: Plan, facts: PlanFacts, changes: list[str]
) -> tuple[list[str], tuple[int, ...], str]:
    """(arguments, layers per stage run, schedule run): virtual stages by layers per virtual
    stage; an unequal cut by the first and last stages' layer counts when only they differ
    (Megatron's uneven pipeline)."""
    pp, v = plan.mesh.pp, plan.virtual_stages
    per = facts.layers_per_stage
    if pp == 1:
        return [], per, plan.schedule
    if plan.schedule == Schedule.INTERLEAVED and v > 1:
        if not facts.equal_stages:
            changes.append(
                f"the interleaved stages' unequal layer counts {list(per)} became "
                f"{facts.layers // (pp * v)} layers per virtual stage"
            )
        args = ["--num-layers-per-virtual-pipeline-stage", str(facts.layers // (pp * v))]
        return args, per if facts.equal_stages else even_cut(facts.layers, pp * v), plan.schedule
    schedule = Schedule.ONE_F_ONE_B
    if plan.schedule == Schedule.GPIPE:
        changes.append("GPipe became Megatron's 1F1B (same bubble, less activation memory)")
    if facts.equal_stages:
        return [], per, schedule
    middle = per[1:-1]
    if len(set(middle)) <= 1:
        out = []
        if not middle or per[0] != middle[0]:
            out += ["--decoder-first-pipeline-num-layers", str(per[0])]
        if not middle or per[-1] != middle[0]:
            out += ["--decoder-last-pipeline-num-layers", str(per[-1])]
        return out, per, schedule
    changes.append(
        f"the stage cut {list(per)} (layers per stage) became Megatron's even split: "
        "only the first and last stage may differ"
    )
    return [], even_cut(facts.layers, pp), schedule


def _recompute(
    facts: PlanFacts, cut: tuple[int, ...], changes: list[str]
) -> tuple[list[str], tuple[str, ...]]:
    """(arguments, each layer's recompute as run on the stages of ``cut``). Selective: the
    attention core (Megatron's and meshplan's selective are both Korthikanti et al.'s), every
    layer. Full: ``block`` recomputes the first k layers of every stage, so a plan recomputing
    k layers on each stage, at their start, is said exactly."""
    mode = facts.recompute
    if any(r != Recompute.NONE for r in facts.other_recompute):
        changes.append("recompute of the embedding/head dropped (Megatron recomputes layers)")
    if mode == Recompute.SELECTIVE:
        if len(set(facts.layer_recompute)) > 1:
            changes.append(
                f"selective recompute of {facts.recomputed_layers} of {facts.layers} layers "
                "became selective recompute of every layer"
            )
        # Megatron's --recompute-granularity spells the modes as plan.json does
        return ["--recompute-granularity", str(Recompute.SELECTIVE)], every(mode, facts.layers)
    full = [r == Recompute.FULL for r in facts.layer_recompute]
    if not any(full):
        return [], every(Recompute.NONE, facts.layers)
    per_stage, start = [], 0
    for count in facts.layers_per_stage:
        stage = full[start : start + count]
        k = sum(stage)
        if stage != [True] * k + [False] * (count - k):
            changes.append(
                "full recompute of layers that are not the first of their stage became "
                "recompute of the first ones (Megatron's block method)"
            )
        per_stage.append(k)
        start += count
    k = max(per_stage)
    if len(set(per_stage)) > 1:
        changes.append(
            f"full recompute of {per_stage} layers per stage became {k} on every stage "
            "(--recompute-num-layers is one number)"
        )
    if all(full):  # every layer: uniform groups of one
        return ["--recompute-granularity", str(Recompute.FULL), "--recompute-method", "uniform",
                "--recompute-num-layers", "1"], every(mode, facts.layers)  # fmt: skip
    run = tuple(Recompute.FULL if i < k else Recompute.NONE for count in cut for i in range(count))
    return ["--recompute-granularity", str(Recompute.FULL), "--recompute-method", "block",
            "--recompute-num-layers", str(k)], run  # fmt: skip


def _zero(zero: int, changes: list[str]) -> tuple[list[str], int]:
    """(arguments, ZeRO stage run): the distributed optimizer is ZeRO-1."""
    if zero == 0:
        return [], 0
    if zero > 1:
        changes.append(
            f"ZeRO-{zero} became Megatron's distributed optimizer (ZeRO-1: full gradient "
            "buffers and weights on every replica)"
        )
    return ["--use-distributed-optimizer"], 1


def _offload(facts: PlanFacts, changes: list[str]) -> tuple[list[str], str]:
    """(arguments, the offload every block runs): the optimizer's, for the whole model."""
    if facts.offload == Offload.NONE:
        return [], Offload.NONE
    if facts.offload == Offload.PARAMS:
        changes.append("parameter offload became optimizer offload (Megatron offloads only the "
                       "optimizer)")  # fmt: skip
    changes += offload_changes(facts)
    return ["--optimizer-cpu-offload", "--use-precision-aware-optimizer"], Offload.OPTIMIZER


def _model(plan: Plan, facts: PlanFacts, changes: list[str]) -> list[str]:
    """The architecture flags from the plan's Hugging Face config (Llama style), or the
    layer count alone for a plan of a model file."""
    config = facts.hf_config
    if config is None:
        changes.append(
            "the model is a model file: only --num-layers is written; add your model's "
            "--hidden-size, --num-attention-heads, --ffn-hidden-size, --seq-length"
        )
        return ["--num-layers", str(facts.layers)]
    arch = hf_architecture(config)
    flags = {
        "--num-layers": arch["num_layers"],
        "--hidden-size": arch["hidden_size"],
        "--ffn-hidden-size": arch["ffn_hidden_size"],  # unstated: Megatron's 4h
        "--num-attention-heads": arch["num_attention_heads"],
        "--seq-length": plan.model.args.get("seq_len"),
        "--max-position-embeddings": arch["max_position_embeddings"],
    }
    out = [item for flag, v in flags.items() if v is not None for item in (flag, str(v))]
    if arch["num_query_groups"] != arch["num_attention_heads"]:
        out += ["--group-query-attention", "--num-query-groups", str(arch["num_query_groups"])]
    if config.get("model_type") in ("llama", "mistral", "qwen2", "qwen3"):
        out += ["--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
                "--disable-bias-linear"]  # fmt: skip
        if not config.get("tie_word_embeddings", False):
            out.append("--untie-embeddings-and-output-weights")
    return out
