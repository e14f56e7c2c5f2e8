"""Enumerate (node type, node count) options, plan each, and choose by the objective.

The per-option plan comes from a ``planner`` callable so the choice can be tested against mocked
step times; ``plan_option`` is the real one (``planner.api.plan`` for that kind and count).
Options: every power of two of nodes up to the number available, plus the number available.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from planner.errors import InfeasibleError, UserInputError
from planner.resources.energy import RunCost, prediction_busy_share, run_cost, steps_for
from planner.resources.pool import NodeType, Pool

OBJECTIVES = ("time", "cost", "energy", "carbon")


@dataclass(frozen=True)
class PlanPoint:
    """What the search predicts for one option: enough to price the whole run."""

    step_time_s: float
    mfu: float
    tokens_per_step: int
    mesh: str  # e.g. "pp1 dp8 tp1", for the table
    busy: float = 1.0  # the share of the step the GPUs run kernels (energy.busy_share)
    plan: Any = field(default=None, compare=False, repr=False)  # the schema.Plan, when kept


@dataclass(frozen=True)
class Option:
    """One (kind, count) option and its outcome; ``point``/``run`` are None when nothing fits."""

    node: NodeType
    nodes: int
    point: PlanPoint | None
    run: RunCost | None
    why_not: str = ""  # the planner's one-line reason when nothing fits
    # A label of its own, where "<kind> x<nodes>" would read like another option: a pipeline
    # whose stages all use one kind is named by its GPU count and stage degrees instead
    # (mixed_label), so it is not mistaken for the single-kind option it beats.
    name: str = ""
    gpu_count: int = 0  # where the GPUs used are not nodes x GPUs per node (a mixed option)

    @property
    def gpus(self) -> int:
        return self.gpu_count or self.nodes * self.node.gpus_per_node

    @property
    def label(self) -> str:
        return self.name or f"{self.node.name} x{self.nodes}"


def mixed_label(kinds_by_stage: Sequence[str], gpus: int, tp: str, dp: str) -> str:
    """How a pipeline across kinds is named: ``a100+h100 x<nodes>`` reads fine when its stages
    use several kinds, but when they all use one it is named by what makes it differ from that
    kind's own options: its GPU count and the stages' degrees (``h100 24 GPUs tp 2/1 dp 4``)."""
    kinds = list(dict.fromkeys(kinds_by_stage))
    if len(kinds) != 1:
        return ""
    return f"{kinds[0]} {gpus} GPUs tp {tp} dp {dp}"


Planner = Callable[[NodeType, int], PlanPoint]


def node_counts(available: int) -> list[int]:
    """Powers of two up to ``available``, and ``available`` itself."""
    counts, n = [], 1
    while n <= available:
        counts.append(n)
        n *= 2
    if counts[-1] != available:
        counts.append(available)
    return counts


def objective_value(run: RunCost, objective: str) -> float:
    return {
        "time": run.wall_s,
        "cost": run.cost_usd,
        "energy": run.energy_kwh,
        "carbon": run.carbon_kg,
    }[objective]


def evaluate(
    pool: Pool,
    planner: Planner,
    tokens: int | None = None,
    steps: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Option]:
    """Plan and price every option of the pool; an option that fits no plan is kept, unpriced."""
    if tokens is not None and steps is not None:
        raise UserInputError(
            "with --resources give the training budget once: --tokens N or --steps N, not both"
        )
    if tokens is None and steps is None:
        raise UserInputError("with --resources give the training budget: --tokens N or --steps N")
    options: list[Option] = []
    for node in pool.node_types:
        for n in node_counts(node.nodes):
            if progress:
                progress(f"{node.name} x{n}")
            try:
                point = planner(node, n)
            except InfeasibleError as exc:
                options.append(Option(node, n, None, None, str(exc).split(";")[0]))
                continue
            k = steps if steps is not None else steps_for(tokens or 0, point.tokens_per_step)
            run = run_cost(
                node,
                n,
                n * node.gpus_per_node,
                k,
                point.step_time_s,
                point.busy,
                pool.effective_time_fraction,
            )
            options.append(Option(node, n, point, run))
    return options


def _key(o: Option, objective: str) -> tuple:
    """Objective first; ties go to the faster, then the cheaper, then by name and count."""
    assert o.run is not None
    return (
        objective_value(o.run, objective),
        o.run.wall_s,
        o.run.cost_usd,
        o.node.name,
        o.nodes,
    )


def meets(o: Option, deadline_h: float | None, budget_usd: float | None) -> bool:
    if o.run is None:
        return False
    if deadline_h is not None and o.run.wall_h > deadline_h:
        return False
    return budget_usd is None or o.run.cost_usd <= budget_usd


def choose(
    options: Sequence[Option],
    objective: str,
    deadline_h: float | None = None,
    budget_usd: float | None = None,
) -> Option:
    """The option with the least objective among those that meet the deadline and budget.

    Raises InfeasibleError (exit 3) naming the nearest option and what it lacks when none does."""
    if objective not in OBJECTIVES:
        raise UserInputError(f"--objective must be one of {', '.join(OBJECTIVES)}")
    priced = [o for o in options if o.run is not None]
    if not priced:
        reasons = "; ".join(f"{o.label}: {o.why_not}" for o in options[:3])
        raise InfeasibleError(f"no option of the pool fits the model: {reasons}")
    ok = [o for o in priced if meets(o, deadline_h, budget_usd)]
    if ok:
        return min(ok, key=lambda o: _key(o, objective))
    raise InfeasibleError(infeasible_message(priced, deadline_h, budget_usd))


def infeasible_message(
    priced: Sequence[Option], deadline_h: float | None, budget_usd: float | None
) -> str:
    """Name the option that misses by the smallest factor, and what it would need."""

    def miss(o: Option) -> float:
        assert o.run is not None
        t = o.run.wall_h / deadline_h if deadline_h else 0.0
        c = o.run.cost_usd / budget_usd if budget_usd else 0.0
        return max(t, c)

    best = min(priced, key=lambda o: (miss(o), o.node.name, o.nodes))
    assert best.run is not None
    wants = []
    if deadline_h is not None and best.run.wall_h > deadline_h:
        wants.append(
            f"{best.run.wall_h - deadline_h:,.1f} h more time "
            f"(--deadline {math.ceil(best.run.wall_h * 10) / 10:.1f})"
        )
        if best.nodes == best.node.nodes:
            need = -(-best.nodes * best.run.wall_h // deadline_h)
            wants.append(
                f"or about {int(need)} {best.node.name} nodes instead of the {best.node.nodes} "
                "available (at linear scaling)"
            )
    if budget_usd is not None and best.run.cost_usd > budget_usd:
        wants.append(
            f"${best.run.cost_usd - budget_usd:,.0f} more money "
            f"(--budget {math.ceil(best.run.cost_usd)})"
        )
    limits = " and ".join(
        s
        for s in (
            f"the {deadline_h:g} h deadline" if deadline_h is not None else "",
            f"the ${budget_usd:,.0f} budget" if budget_usd is not None else "",
        )
        if s
    )
    return (
        f"no option of the pool meets {limits}: the nearest is {best.label} "
        f"({best.run.wall_h:,.1f} h, ${best.run.cost_usd:,.0f}), which needs " + ", ".join(wants)
    )


def pareto(options: Sequence[Option]) -> list[Option]:
    """Priced options no other option beats or ties on all of time, cost and carbon."""
    pts = [o for o in options if o.run is not None]

    def vec(o: Option) -> tuple[float, float, float]:
        assert o.run is not None
        return (o.run.wall_s, o.run.cost_usd, o.run.carbon_kg)

    front = []
    for o in pts:
        a = vec(o)
        dominated = any(
            all(x <= y for x, y in zip(vec(q), a, strict=True)) and vec(q) != a for q in pts
        )
        if not dominated:
            front.append(o)
    return front


def why_chosen(chosen: Option, options: Sequence[Option], objective: str, ok: int) -> str:
    """One sentence: the chosen option's objective against the runner-up and the best option of
    every other kind, so a near-tie within one kind does not hide how far the other kinds are."""
    assert chosen.run is not None

    def show(o: Option) -> str:
        assert o.run is not None
        v = objective_value(o.run, objective)
        return {
            "time": f"{v / 3600:,.1f} h",
            "cost": f"${v:,.0f}",
            "energy": f"{v:,.0f} kWh",
            "carbon": f"{v / 1000:,.2f} tCO2",
        }[objective]

    mine = objective_value(chosen.run, objective)
    ranked = sorted(
        (o for o in options if o.run is not None and o is not chosen),
        key=lambda o: _key(o, objective),
    )
    text = f"{chosen.label} has the least {objective} ({show(chosen)}) of the {ok} options "
    text += "that meet the deadline and budget"
    shown = ranked[:1] + [
        next(o for o in ranked if o.node.name == k)
        for k in dict.fromkeys(o.node.name for o in ranked)
        if k != chosen.node.name
    ]
    for o in dict.fromkeys(shown):
        assert o.run is not None
        rel = objective_value(o.run, objective) / mine - 1 if mine > 0 else 0.0
        text += f"; {o.label}: {show(o)} ({rel:+.1%})"
    return text


def plan_option(
    model_file: Any, plan_kwargs: dict[str, Any]
) -> Callable[[NodeType, int], PlanPoint]:
    """The real planner: ``planner.api.plan`` for the node type's profile at that node count."""
    from planner.api import plan

    def run(node: NodeType, nodes: int) -> PlanPoint:
        result = plan(
            model_file,
            nodes * node.gpus_per_node,
            profile=node.profile,
            gpus_per_node=node.gpus_per_node,
            **plan_kwargs,
        )
        p = result.plan
        pred = p.predicted
        per_sample = pred.tokens_per_s / pred.samples_per_s if pred.samples_per_s else 1.0
        m = p.mesh
        return PlanPoint(
            plan=p,
            step_time_s=pred.step_time_s,
            mfu=pred.mfu,
            busy=prediction_busy_share(pred),
            tokens_per_step=max(1, round(p.global_batch_size * per_sample)),
            mesh=f"pp{m.pp} dp{m.dp} tp{m.tp}" + (f" cp{m.cp}" if m.cp > 1 else ""),
        )

    return run
