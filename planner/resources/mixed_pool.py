"""A pool's heterogeneous option: its node types as device kinds, its [[fabric]] as the links
between them, the mixed plan (when one beats every kind alone) priced as one more option.

The run cost of a mixed plan is the sum over its kinds of ``energy.run_cost`` for the GPUs of
that kind, all at the plan's step time and steps: GPU-hours and money add, energy adds (each
kind at its own idle and busy power, at the plan's MFU, and its own PUE), carbon adds (each
kind at its own grid). Its nodes are the whole nodes each kind's GPUs fill.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from planner.resources.choose import Option, PlanPoint, meets, mixed_label, objective_value
from planner.resources.energy import RunCost, prediction_busy_share, run_cost, steps_for
from planner.resources.mixed_plan import KindSpec, MixedPlanResult, plan_mixed
from planner.resources.pool import NodeType, Pool
from planner.schema.plan import Plan
from planner.search.mixed.search import RunRate


def pool_kinds(pool: Pool) -> tuple[list[KindSpec], dict[tuple[str, str], tuple[float, float]]]:
    """Every node type as a kind (all its GPUs), and the fabric as (bandwidth, latency)."""
    kinds = [
        KindSpec(t.name, t.profile, t.nodes * t.gpus_per_node, t.gpus_per_node)
        for t in pool.node_types
    ]
    links = {f.between: (f.bandwidth_bytes_per_s, f.latency_s) for f in pool.fabric}
    return kinds, links


def best_single(options: list[Option]) -> dict[str, float]:
    """Each node type's least step time over the options planned for it (inf: none fits)."""
    found: dict[str, float] = {}
    for o in options:
        t = o.point.step_time_s if o.point else float("inf")
        found[o.node.name] = min(found.get(o.node.name, float("inf")), t)
    return found


def summed_run_cost(
    used: list[tuple[NodeType, int]],
    steps: int,
    step_time_s: float,
    busy: float,
    effective_time_fraction: float,
) -> tuple[RunCost, int]:
    """``energy.run_cost`` of each (node type, GPUs) at one step time and busy share, summed
    over the kinds (each on the whole nodes its GPUs fill), and the nodes they occupy."""
    parts, nodes = [], 0
    for t, g in used:
        n = -(-g // t.gpus_per_node)
        nodes += n
        parts.append(run_cost(t, n, g, steps, step_time_s, busy, effective_time_fraction))
    gpus = sum(g for _, g in used)
    total = RunCost(
        steps=steps,
        wall_s=parts[0].wall_s,
        gpu_hours=sum(p.gpu_hours for p in parts),
        cost_usd=sum(p.cost_usd for p in parts),
        gpu_watts=sum(p.gpu_watts * g for p, (_, g) in zip(parts, used)) / gpus,
        energy_kwh=sum(p.energy_kwh for p in parts),
        carbon_kg=sum(p.carbon_kg for p in parts),
    )
    return total, nodes


def mixed_run_cost(
    pool: Pool, plan: Plan, steps: int, effective_time_fraction: float
) -> tuple[RunCost, int]:
    """The summed run cost of a mixed plan over its kinds, and the nodes it occupies."""
    types = {t.name: t for t in pool.node_types}
    used = [(types[k.name], k.gpus) for k in plan.kinds or []]
    busy = prediction_busy_share(plan.predicted)
    return summed_run_cost(used, steps, plan.predicted.step_time_s, busy, effective_time_fraction)


def mixed_node_type(pool: Pool, plan: Plan, nodes: int) -> NodeType:
    """A row for the table and figure: the kinds' names joined, GPU-weighted figures (the
    option's run cost is the exact per-kind sum, not computed from these)."""
    types = {t.name: t for t in pool.node_types}
    used = [(types[k.name], k.gpus) for k in plan.kinds or []]
    gpus = sum(g for _, g in used)

    def avg(field: str) -> float:
        return sum(getattr(t, field) * g for t, g in used) / gpus

    first = used[0][0]
    return replace(
        first,
        name="+".join(t.name for t, _ in used),
        profile="+".join(t.profile for t, _ in used),
        nodes=nodes,
        gpus_per_node=max(1, gpus // nodes),
        price_per_gpu_hour=avg("price_per_gpu_hour"),
        gpu_busy_watts=avg("gpu_busy_watts"),
        gpu_idle_watts=avg("gpu_idle_watts"),
        carbon_g_per_kwh=avg("carbon_g_per_kwh"),
        pue=avg("pue"),
    )


def placement_rate(
    pool: Pool,
    steps: int,
    objective: str,
    deadline_h: float | None = None,
    budget_usd: float | None = None,
) -> RunRate:
    """``summed_run_cost`` per second of step time, for a placement with ``gpus[k]`` GPUs of
    the pool's k-th node type: its wall time, money, energy or carbon, and the longest step
    that meets the deadline and budget. Every term is linear in the step at fixed GPUs and
    busy share, so the run at a one-second step is the rate.

    Time and money are exact. Energy and carbon are priced at busy power, the search's
    ranking (exact where the pool gives no idle draw, an upper bound otherwise: the chosen
    plan is then priced at its own busy share).

    ``per_gpu``, the rate each GPU adds at least (``RunRate``): a kind's whole node alone per
    GPU, since money is linear in GPUs and energy and carbon add a node's power per begun node
    (at least its share per GPU); 0 by wall time, which GPUs do not change."""

    def per_second(gpus: list[int]) -> RunCost:
        used = [(t, g) for t, g in zip(pool.node_types, gpus) if g]
        return summed_run_cost(used, steps, 1.0, 1.0, pool.effective_time_fraction)[0]

    def per_step_s(gpus: list[int]) -> float:
        return objective_value(per_second(gpus), objective)

    def max_step_s(gpus: list[int]) -> float:
        run = per_second(gpus)
        longest = math.inf
        if deadline_h is not None:
            longest = deadline_h / run.wall_h
        if budget_usd is not None and run.cost_usd > 0:
            longest = min(longest, budget_usd / run.cost_usd)
        return longest

    per_gpu = []
    for k, t in enumerate(pool.node_types):
        node = [t.gpus_per_node if i == k else 0 for i in range(len(pool.node_types))]
        per_gpu.append(0.0 if objective == "time" else per_step_s(node) / t.gpus_per_node)
    return RunRate(per_step_s, max_step_s, tuple(per_gpu))


def mixed_option(
    pool: Pool,
    model_file: Any,
    plan_kwargs: dict[str, Any],
    options: list[Option],
    tokens: int | None,
    steps: int | None,
    progress: Any = None,
    objective: str = "time",
    deadline_h: float | None = None,
    budget_usd: float | None = None,
    stage_degrees: bool | None = None,
) -> tuple[Option | None, MixedPlanResult | None]:
    """The pool's mixed option, planned against the single-kind options already priced; None
    when the pool has no fabric or no mixed plan beats every kind alone.

    By time with no deadline or budget: the fastest mixed pipeline, kept when it is faster
    than every kind alone. Otherwise the mixed pipeline of least objective that meets the
    deadline and budget (``placement_rate``), kept when it beats every single-kind option that
    meets them: a slower pipeline over cheaper GPUs can be the cheapest run."""
    if not pool.fabric:
        return None, None
    kinds, links = pool_kinds(pool)
    rate, cutoff = None, math.inf
    priced = [o for o in options if o.point is not None and o.run is not None]
    if (objective != "time" or deadline_h is not None or budget_usd is not None) and priced:
        # every option trains the same global batch: one tokens-per-step for the pool
        k = steps if steps is not None else steps_for(tokens or 0, priced[0].point.tokens_per_step)
        everything = [t.nodes * t.gpus_per_node for t in pool.node_types]
        if placement_rate(pool, k, objective).per_step_s(everything) == 0:
            objective = "time"  # free devices (an owned pool's $0): ties go to the faster
        rate = placement_rate(pool, k, objective, deadline_h, budget_usd)
        met = [
            objective_value(o.run, objective) for o in priced if meets(o, deadline_h, budget_usd)
        ]
        cutoff = min(met, default=math.inf)
    res = plan_mixed(
        model_file,
        kinds,
        links,
        single=best_single(options),
        progress=progress,
        rate=rate,
        objective_cutoff=cutoff,
        stage_degrees=stage_degrees,
        **plan_kwargs,
    )
    plan = res.plan
    if plan is None:
        return None, res
    p = plan.predicted
    per_sample = p.tokens_per_s / p.samples_per_s if p.samples_per_s else 1.0
    tokens_per_step = max(1, round(plan.global_batch_size * per_sample))
    k = steps if steps is not None else steps_for(tokens or 0, tokens_per_step)
    run, nodes = mixed_run_cost(pool, plan, k, pool.effective_time_fraction)
    m = plan.mesh
    kinds_by_stage = "/".join(st.kind or "" for st in plan.stages)
    mesh = f"pp{m.pp} dp{m.dp_label} tp{m.tp_label} ({kinds_by_stage})"
    point = PlanPoint(p.step_time_s, p.mfu, tokens_per_step, mesh, prediction_busy_share(p), plan)
    gpus = sum(k.gpus for k in plan.kinds or [])
    name = mixed_label([st.kind or "" for st in plan.stages], gpus, m.tp_label, m.dp_label)
    node = mixed_node_type(pool, plan, nodes)
    return Option(node, nodes, point, run, name=name, gpu_count=gpus), res
