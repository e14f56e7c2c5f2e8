"""The exported plan priced as the engine will run it: the engine's decisions where its export
changed the plan's (``Export.runs``: its ZeRO stage, recompute, offload, stage cut, mesh) under
the engine's memory and time semantics (``planner.cost.engines``), by the cost model the plan
was solved with (``planner.cost.step.evaluate``). So the line printed beside meshplan's own
prediction is for what the user will run, not for what meshplan planned.

The caller hands in what the plan was priced from (``PlanModel``: the trace, cluster,
meshplan's training settings and sharding variants); ``planner.engine_prices`` builds it from
a saved plan, ``plan MODEL --export`` has it from planning.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from planner.cost.engines import engine_training
from planner.cost.records import Config, CostInputs, StepCost
from planner.cost.step import evaluate
from planner.errors import UserInputError
from planner.export.facts import as_planned, plan_facts
from planner.export.types import AsRun, Export
from planner.hardware.cluster import Cluster
from planner.schema.plan import Plan
from planner.search.candidates import Pins
from planner.search.options import price_options
from planner.trace.blocks import Block
from planner.training import Training

GIB = 2**30
MESHPLAN = "meshplan"  # the price of the plan as planned, under meshplan's runtime
SEQUENCE_SUFFIX = "-sp"  # a sequence-parallel TP variant's name ends so (api.variants_for)


@dataclass
class PlanModel:
    """What a plan is priced from: its model's trace, the cluster, meshplan's training
    settings (as the planner priced the plan) and the sharding variants per block class."""

    graph: Any  # the traced OpGraph (networkx DiGraph)
    blocks: list[Block]
    traced_batch_size: int
    cluster: Cluster
    training: Training
    variants_of: Callable
    memo: dict = dataclasses.field(default_factory=dict)  # priced options, across engines


@dataclass(frozen=True)
class EnginePrice:
    """One engine's (or meshplan's) predicted step and peak memory per GPU for a plan."""

    engine: str
    step_time_s: float
    peak_memory_bytes: float
    capacity_bytes: float
    fits: bool

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def line(self, planned: EnginePrice | None = None) -> str:
        """``predicted 0.2412 s/step, 24.1 GiB peak of 80.0 GiB per GPU (+3.8% vs meshplan)``."""
        fits = "" if self.fits else ", does not fit"
        text = (
            f"predicted {self.step_time_s:.4g} s/step, {self.peak_memory_bytes / GIB:.1f} GiB "
            f"peak of {self.capacity_bytes / GIB:.1f} GiB per GPU{fits}"
        )
        if planned is not None and planned.step_time_s > 0:
            change = self.step_time_s / planned.step_time_s - 1
            text += f" ({change:+.1%} step vs meshplan's)"
        return text


def block_stages(plan: Plan, runs: AsRun) -> list[int]:
    """Each block's (virtual) stage as run: the plan's own where the engine keeps its cut; else
    the layers cut by ``runs.layers_per_stage``, each other block on the stage of the layer
    before it (the first layer's stage for blocks ahead of it)."""
    if runs.layers_per_stage == plan_facts(plan).layers_per_stage:
        return [b.stage for b in plan.blocks]
    layer_class = Counter(b.block_class for b in plan.blocks).most_common(1)[0][0]
    layer_stage = [s for s, n in enumerate(runs.layers_per_stage) for _ in range(n)]
    stages, seen = [], 0
    for block in plan.blocks:
        if block.block_class == layer_class:
            stages.append(layer_stage[seen])
            seen += 1
        else:
            stages.append(layer_stage[max(seen - 1, 0)])
    return stages


def block_modes(plan: Plan, runs: AsRun) -> list[tuple[str, str]]:
    """Each block's (recompute, offload) as run, in block order."""
    layer_class = Counter(b.block_class for b in plan.blocks).most_common(1)[0][0]
    layers = iter(zip(runs.layer_recompute, runs.layer_offload))
    others = iter(zip(runs.other_recompute, runs.other_offload))
    return [next(layers if b.block_class == layer_class else others) for b in plan.blocks]


def variant_choice(found: list, planned: str, sequence_parallel: bool) -> int:
    """The option of the plan's sharding variant; where the engine runs TP without sequence
    parallelism, the same sharding's variant without it (``-sp`` is the sequence-parallel
    variants' suffix, ``cost.sharding``); the fastest option where the block has neither."""
    wanted = planned if sequence_parallel else planned.removesuffix(SEQUENCE_SUFFIX)
    same = [k for k, o in enumerate(found) if o.variant == wanted]
    if not same and not sequence_parallel:
        same = [k for k, o in enumerate(found) if not o.variant.endswith(SEQUENCE_SUFFIX)]
    return min(same or range(len(found)), key=lambda k: found[k].time_s)


def price_as_run(plan: Plan, runs: AsRun, training: Training, model: PlanModel) -> StepCost:
    """The cost model's StepCost of ``plan`` with ``runs``' decisions under ``training``: each
    block's option is the plan's sharding variant (where the block still has it) with the
    recompute and offload it runs."""
    mesh = runs.mesh
    replicas = mesh.dp
    if plan.global_batch_size % (replicas * plan.micro_batch_size):
        raise UserInputError(
            f"the global batch {plan.global_batch_size} does not split into micro-batches of "
            f"{plan.micro_batch_size} over {replicas} data-parallel replicas as the engine runs"
        )
    opts, choice = [], []
    # a class's options are its first block's, as the planner prices them (``price_options``)
    first = {}
    for block in model.blocks:
        first.setdefault(block.cls, block)
    for block, planned, (recompute, offload) in zip(
        model.blocks, plan.blocks, block_modes(plan, runs)
    ):
        pins = Pins(tp=mesh.tp, recompute=recompute, offload=offload)
        (found,) = price_options(
            model.graph, [first[block.cls]], mesh.tp, plan.micro_batch_size, model.cluster,
            training, pins, model.variants_of, mesh.ep, mesh.cp, model.memo,
            pipelined=mesh.pp > 1,
        )  # fmt: skip
        opts.append(found)
        choice.append(variant_choice(found, planned.tp_variant, runs.sequence_parallel))
    config = Config(
        mesh,
        plan.micro_batch_size,
        runs.schedule,
        runs.virtual_stages,
        runs.zero_stage,
        block_stages(plan, runs),
        choice,
    )
    inputs = CostInputs(model.blocks, opts, model.traced_batch_size, model.cluster, training)
    return evaluate(inputs, config)


def _price(engine: str, cost: StepCost) -> EnginePrice:
    return EnginePrice(
        engine, cost.step_time_s, cost.peak_memory_bytes, cost.capacity_bytes, cost.feasible
    )


def planned_price(plan: Plan, model: PlanModel) -> EnginePrice:
    """The plan as planned under meshplan's runtime: the prediction plan.json holds, priced
    again by the same functions that price the engines (so their difference is the engine's)."""
    runs = as_planned(plan, plan_facts(plan))
    return _price(MESHPLAN, price_as_run(plan, runs, model.training, model))


def engine_price(plan: Plan, export: Export, model: PlanModel) -> EnginePrice:
    """The plan as ``export.engine`` runs it (``export.runs``) under that engine's semantics."""
    runs = export.runs
    if runs is None:
        raise ValueError(f"the {export.engine} export says nothing of how it runs the plan")
    mesh = runs.mesh
    tp_params = sum(b.params for b in model.blocks) / mesh.tp / mesh.pp
    training = engine_training(
        model.training,
        export.engine,
        tp=mesh.tp,
        pp=mesh.pp,
        virtual_stages=runs.virtual_stages,
        zero=runs.zero_stage,
        microbatches=plan.global_batch_size // (mesh.dp * plan.micro_batch_size),
        sequence_parallel=runs.sequence_parallel,
        profile=model.cluster.profile.name,
        rank_params=tp_params,
    )
    return _price(export.engine, price_as_run(plan, runs, training, model))
