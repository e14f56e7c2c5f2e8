"""What every engine's export reads from a plan, derived once: the repeated transformer
layers and how the pipeline cuts them, the layers' recompute and offload, whether TP runs
sequence parallel, and the model's architecture when the plan was made from a Hugging Face
config. Engines speak in layers (``--num-layers``, ``layers.7``), a plan in blocks; this is the
one place that maps between them."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.errors import UserInputError
from planner.export.types import AsRun
from planner.schema.plan import BlockPlan, Plan
from planner.vocab import SEQUENCE_STYLES, Offload, Recompute

# Recompute modes from the most activation memory saved to the least.
RECOMPUTE_STRENGTH = (Recompute.FULL, Recompute.SELECTIVE, Recompute.NONE)
# Offload modes from the most moved to the host to the least.
OFFLOAD_STRENGTH = (Offload.PARAMS, Offload.OPTIMIZER, Offload.NONE)


@dataclass(frozen=True)
class PlanFacts:
    layers: int  # the repeated transformer layers (blocks of the most common class)
    before: int  # blocks ahead of the first layer (embeddings)
    after: int  # blocks after the last layer (final norm, head)
    layers_per_stage: tuple[int, ...]  # per (virtual) stage, in stage order
    layer_recompute: tuple[str, ...]  # per layer, vocab.Recompute
    other_recompute: tuple[str, ...]  # the non-layer blocks'
    layer_offload: tuple[str, ...]  # per layer, vocab.Offload
    other_offload: tuple[str, ...]  # the non-layer blocks'
    sequence_parallel: bool
    hf_config: dict[str, Any] | None  # the config.json the plan's model came from

    @property
    def recompute(self) -> str:
        """The layers' one recompute mode; when they differ, the one saving the most memory
        among them, so that an engine applying one mode to every layer still fits."""
        present = set(self.layer_recompute)
        return next(r for r in RECOMPUTE_STRENGTH if r in present)

    @property
    def recomputed_layers(self) -> int:
        return sum(r != Recompute.NONE for r in self.layer_recompute)

    @property
    def offload(self) -> str:
        """The layers' one offload mode; when they differ, the one moving the most to the
        host among them (an engine offloading all or nothing then still fits in memory)."""
        present = set(self.layer_offload)
        return next(o for o in OFFLOAD_STRENGTH if o in present)

    @property
    def equal_stages(self) -> bool:
        return len(set(self.layers_per_stage)) == 1


def plan_facts(plan: Plan) -> PlanFacts:
    """The facts above; a plan no engine runs (device kinds with their own degrees) is refused."""
    if plan.mesh.uneven:
        raise UserInputError(
            "this plan gives pipeline stages their own TP/DP degrees (a mixed-kind pool): no "
            "engine export expresses that; plan for one device kind to export"
        )
    counts = Counter(b.block_class for b in plan.blocks)
    layer_class = counts.most_common(1)[0][0]
    index = [i for i, b in enumerate(plan.blocks) if b.block_class == layer_class]
    layers = [plan.blocks[i] for i in index]
    others = [b for b in plan.blocks if b.block_class != layer_class]
    per_stage = Counter(b.stage for b in layers)
    return PlanFacts(
        layers=len(layers),
        before=index[0],
        after=len(plan.blocks) - 1 - index[-1],
        layers_per_stage=tuple(per_stage.get(s.index, 0) for s in plan.stages),
        layer_recompute=tuple(b.recompute for b in layers),
        other_recompute=tuple(b.recompute for b in others),
        layer_offload=tuple(b.offload for b in layers),
        other_offload=tuple(b.offload for b in others),
        sequence_parallel=any(_sequence_parallel(b) for b in plan.blocks),
        hf_config=_hf_config(plan),
    )


def as_planned(plan: Plan, facts: PlanFacts) -> AsRun:
    """The plan's own decisions, which each export starts from and changes what its engine
    cannot say."""
    return AsRun(
        mesh=plan.mesh,
        zero_stage=plan.zero_stage,
        schedule=plan.schedule,
        virtual_stages=plan.virtual_stages,
        layers_per_stage=facts.layers_per_stage,
        layer_recompute=facts.layer_recompute,
        other_recompute=facts.other_recompute,
        layer_offload=facts.layer_offload,
        other_offload=facts.other_offload,
        sequence_parallel=facts.sequence_parallel and plan.mesh.tp > 1,
    )


def even_cut(layers: int, stages: int) -> tuple[int, ...]:
    """Layers per stage split as evenly as they go, the first ``layers % stages`` stages one
    more (an engine's even split; Megatron's when the layers divide)."""
    base, extra = divmod(layers, stages)
    return tuple(base + (1 if s < extra else 0) for s in range(stages))


def every(mode: str, count: int) -> tuple[str, ...]:
    """One mode for ``count`` blocks (an engine applying one policy to all)."""
    return (mode,) * count


def _sequence_parallel(block: BlockPlan) -> bool:
    return any(style in SEQUENCE_STYLES for style in block.tp_plan.values())


def _hf_config(plan: Plan) -> dict[str, Any] | None:
    path = Path(plan.model.file)
    if path.suffix != ".json" or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def offload_changes(facts: PlanFacts) -> list[str]:
    """What an engine whose offload is all-or-nothing changes of a plan that offloads some
    layers: it offloads every layer's states (the strongest mode present, applied to all)."""
    modes = set(facts.layer_offload)
    if len(modes) <= 1:
        return []
    some = sum(o != Offload.NONE for o in facts.layer_offload)
    return [
        f"offload of {some} of {facts.layers} layers became offload "
        f"{facts.offload} for the whole model (the engine offloads all states or none)"
    ]


# The config.json keys families use for each dimension (transformers' attribute_map aliases:
# GPT-2's n_layer, T5's d_model...), first match wins.
ARCHITECTURE_KEYS = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "ffn_hidden_size": ("intermediate_size", "n_inner", "ffn_dim", "d_ff"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "num_query_groups": ("num_key_value_heads", "multi_query_group_num"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions"),
    "vocab_size": ("vocab_size",),
}


def hf_architecture(config: dict[str, Any]) -> dict[str, int | None]:
    """The dimensions engines' model arguments need, from a config.json (None: not stated;
    the query groups default to the heads, multi-head attention)."""
    arch = {
        name: next((config[k] for k in keys if isinstance(config.get(k), int)), None)
        for name, keys in ARCHITECTURE_KEYS.items()
    }
    arch["num_query_groups"] = arch["num_query_groups"] or arch["num_attention_heads"]
    return arch
