"""Plan one job over several device kinds: each kind alone through the planner's own search,
then the mixed search with the best single kind's step time as its cutoff, and the winner
written as an ordinary plan.json plus the kind of every stage and rank.

A mixed plan is one (pp, dp, tp) mesh, with ``stage_tp`` and ``stage_dp`` each stage's own TP
and DP degree when they differ (``Mesh.stage_tp``, ``stage_dp``: stage j on the dp_j t_j ranks
after those of stages < j, its replicas taking the step's micro-batches in turns); with one
degree for all it is the plain mesh, written as before. Its stages' numbers are the cost
model's under each stage's variant (its kind's own ``evaluate`` at its degree), the hops
between kinds priced on the pool's fabric, and the step time the mixed MILP's
(``mixed_cost.step_time``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.api import plan, trace, variants_for
from planner.assemble import (
    _r,
    _tokens_per_sample,
    block_memory,
    block_record,
    memory_record,
    model_info,
    with_error_bar,
)
from planner.cost.eager_probe import EagerShardProbe
from planner.cost.records import Config
from planner.cost.step import evaluate
from planner.cost.variant_cache import load_variants, save_variants
from planner.errors import InfeasibleError, UserInputError
from planner.hardware.cluster import Cluster
from planner.hardware.profiles import load_profile
from planner.modelfile import ModelFile, load_model_file
from planner.schema import SCHEMA
from planner.schema.mesh import Mesh
from planner.schema.plan import (
    ClusterInfo,
    KindInfo,
    Plan,
    Prediction,
    SolverRecord,
    StagePlan,
)
from planner.search import Pins
from planner.search.bound_memo import kept_bounds
from planner.search.memo import SearchMemo
from planner.search.milp.candidate import segments
from planner.search.mixed.cost import pipeline_time, step_time
from planner.search.mixed.search import Kind, MixedCandidate, MixedResult, RunRate, search_mixed
from planner.training import Training, num_microbatches, on_devices, replica_counts, training_from


@dataclass(frozen=True)
class KindSpec:
    """A device kind on offer: a profile (name or .toml path) and how many GPUs."""

    name: str
    profile: str
    gpus: int
    gpus_per_node: int | None = None


@dataclass
class MixedPlanResult:
    single: dict[str, float]  # kind -> best step time alone (inf when nothing fits)
    single_plans: dict[str, dict]  # kind -> its plan (as planner.api.plan returns it)
    search: MixedResult
    plan: Plan | None  # the mixed plan, when one beats every kind alone
    notes: list[str] = field(default_factory=list)

    @property
    def best_single(self) -> tuple[str, float]:
        name = min(self.single, key=lambda k: (self.single[k], k))
        return name, self.single[name]


def plan_mixed(
    model_file: str | Path | ModelFile,
    kinds: list[KindSpec],
    links: dict[tuple[str, str], tuple[float, float]],
    *,
    model_args: dict[str, Any] | None = None,
    training: Training | None = None,
    global_batch_size: int | None = None,
    dtype: str | None = None,
    optimizer: str | None = None,
    lr: float | None = None,
    pins: Pins | None = None,
    use_cache: bool = True,
    progress: Any = None,
    single: dict[str, float] | None = None,
    rate: RunRate | None = None,
    objective_cutoff: float = math.inf,
    stage_degrees: bool | None = None,
    bounds: dict | None = None,
) -> MixedPlanResult:
    """The fastest plan over ``kinds``: a mixed pipeline when one beats every kind alone.
    With ``rate`` (``mixed.RunRate``), the mixed pipeline of least objective instead, when it
    is below ``objective_cutoff`` (the best single-kind option's objective).

    ``links``: (kind, kind) -> (bandwidth B/s per GPU, latency s) of the fabric between them;
    two kinds without a link never share a pipeline. ``single``: each kind's best step time
    alone when the caller planned them already (a pool's options); else each kind is planned
    here on all its GPUs. ``pins`` default to no offload: the runtime cannot offload on CPU
    ranks, and a mixed pipeline is for when more devices, not host memory, are the gain.
    ``stage_degrees``: search_mixed's (stages with TP and DP degrees of their own: True,
    False, or None, where that search is small); the plan's notes say when it was left out.
    ``training`` as api.plan's (built from the model file and the flags when None).
    ``bounds``: api.plan's (the caller's BoundMemo per trace, saved by the caller): the
    search prices options through it, taking those the kinds' own plans priced.

    Long because it composes, in the order they run, the kinds alone, the trace, the kinds'
    clusters, the fabric and the search, a few lines each."""
    if len(kinds) < 2 or len({k.name for k in kinds}) != len(kinds):
        raise UserInputError("a mixed plan needs at least two device kinds with distinct names")
    mf = (
        model_file
        if isinstance(model_file, ModelFile)
        else load_model_file(model_file, model_args or {})
    )
    pins = pins or Pins(offload="none")
    gpus_only = all(load_profile(k.profile).device == "gpu" for k in kinds)
    if training is None:
        training = training_from(
            mf.training,
            mf.path.name,
            global_batch_size=global_batch_size,
            dtype=dtype,
            optimizer=optimizer,
            lr=lr,
        )
    settings, training = training, on_devices(training, gpus_only)
    single_plans: dict[str, dict] = {}
    notes: list[str] = []
    given = single is not None
    single = dict(single or {})
    for k in [] if given else kinds:
        try:
            res = plan(
                mf,
                k.gpus,
                profile=k.profile,
                gpus_per_node=k.gpus_per_node,
                training=settings,
                pins=pins,
                use_cache=use_cache,
                bounds=bounds,
            )
            single[k.name] = float(res.plan.predicted.step_time_s)
            single_plans[k.name] = res.plan
        except InfeasibleError as exc:
            single[k.name] = math.inf
            notes.append(f"{k.name} alone: {str(exc).split(';')[0]}")
    traced = trace(mf, traced_batch_size=1, dtype=training.dtype, use_cache=use_cache)
    total = sum(k.gpus for k in kinds)
    built: list[Kind] = []
    for k in kinds:
        prof = load_profile(k.profile)
        gpn = k.gpus_per_node or prof.gpus_per_node
        built.append(Kind(k.name, Cluster(prof, -(-total // gpn), gpn), k.gpus))
    index = {k.name: i for i, k in enumerate(kinds)}
    pairs: dict[tuple[int, int], tuple[float, float]] = {}
    for (a, b), link in links.items():
        if a not in index or b not in index:
            raise UserInputError(f"a fabric names {a!r} and {b!r}: not both kinds of this job")
        pairs[index[a], index[b]] = pairs[index[b], index[a]] = link
    # the sharding ILP's solutions kept from earlier plans of this trace (each kind's own plan
    # above left its own), as api.plan reads them: a warm pool plan solves none again
    memo = SearchMemo(variants=load_variants(traced.cache_key) if use_cache else {})
    known = len(memo.variants)
    probe = EagerShardProbe(mf, training.dtype, traced.cache_key if use_cache else None)
    variants = [
        variants_for(traced.graph, k.cluster, pins.tp_variant, memo.variants, probe) for k in built
    ]
    cutoff = min(single.values()) if rate is None else objective_cutoff
    result = search_mixed(
        traced.graph,
        traced.blocks,
        training,
        built,
        pairs,
        variants,
        cutoff,
        pins,
        progress,
        rate,
        stage_degrees,
        kept_bounds(bounds, traced.cache_key) if use_cache and bounds is not None else None,
    )
    if use_cache and len(memo.variants) > known:
        save_variants(traced.cache_key, memo.variants)
    doc = None
    if result.best is not None:
        doc = mixed_plan_record(traced, training, result)
    return MixedPlanResult(single, single_plans, result, doc, notes + result.notes)


def counts_to_config(
    cand_config: Config,
    blocks,
    counts: list[list[list[int]]],
    variant_of_stage: list[int],
    meshes: list[Mesh],
) -> tuple[list[int], list[int], list[Config]]:
    """Blocks in model order: (stage of each block, option of each under its stage's variant,
    and per variant a Config at its own mesh whose blocks on that variant's stages carry their
    options; blocks on other variants' stages carry option 0 there, which only those other
    stages' numbers read)."""
    segs = segments(blocks)
    stage_of, choice = [0] * len(blocks), [0] * len(blocks)
    nxt = [first for first, _ in segs]
    for j, per_seg in enumerate(counts):
        for s, per_opt in enumerate(per_seg):
            for o, c in enumerate(per_opt):
                for _ in range(c):
                    stage_of[nxt[s]], choice[nxt[s]] = j, o
                    nxt[s] += 1
    configs = []
    for v, mesh in enumerate(meshes):
        mine = [choice[i] if variant_of_stage[stage_of[i]] == v else 0 for i in range(len(blocks))]
        configs.append(
            Config(
                mesh,
                cand_config.micro_batch_size,
                cand_config.schedule,
                1,
                cand_config.zero_stage,
                stage_of,
                mine,
            )
        )
    return stage_of, choice, configs


def plan_mesh(pp: int, dp: int, tps: list[int], dps: list[int] | None = None) -> Mesh:
    """The plan's mesh: each stage's TP degree in ``stage_tp`` and DP degree (``dp`` times its
    multiple in ``dps``) in ``stage_dp`` when they differ, else the plain (pp, dp, tp) mesh, so
    a uniform plan's file is what it was before per-stage degrees."""
    dps = [dp * r for r in dps] if dps else [dp] * pp
    stage_tp = tuple(tps) if len(set(tps)) > 1 else None
    stage_dp = tuple(dps) if len(set(dps)) > 1 else None
    return Mesh(pp, max(dps), max(tps), stage_tp=stage_tp, stage_dp=stage_dp)


def mixed_plan_record(traced, training: Training, result: MixedResult) -> Plan:
    """The mixed search's best candidate as a Plan: the usual records, each stage's from its
    variant's evaluation, plus the kinds and the rank-to-kind map.

    Long because each record of the plan is filled field by field from its variant's evaluation."""
    best: MixedCandidate | None = result.best
    assert best is not None and best.solution is not None and best.problem is not None
    c, sol, mp = best.cand, best.solution, best.problem
    mesh = plan_mesh(c.pp, c.dp, sol.tps, sol.dps)
    base = Config(mesh, c.micro_batch_size, c.schedule, 1, c.zero, [], [])
    blocks = traced.blocks
    meshes = [Mesh(c.pp, c.dp * r, t) for _, t, r in mp.variants]
    stage_of, choice, configs = counts_to_config(base, blocks, sol.counts, sol.variants, meshes)
    ins = [result.inputs[k, t, c.micro_batch_size] for k, t, _ in mp.variants]
    costs = {v: evaluate(ins[v], configs[v]) for v in set(sol.variants)}
    step = step_time(mp, sol.variants, sol.counts)
    rep: dict[str, list[str]] = {}
    for b in blocks:
        rep.setdefault(b.cls, b.modules)
    stages, memory, times = [], [], []
    for j, (v, k) in enumerate(zip(sol.variants, sol.kinds, strict=True)):
        st = costs[v].stages[j]
        hop = float(mp.hop[j][v][sol.variants[j + 1]]) if j < c.pp - 1 else 0.0
        t = st.compute_s + st.tp_comm_s + hop
        times.append(t)
        memory.append(memory_record(costs[v].rank_memory[j]))
        local, per_replica = replica_counts(
            training.global_batch_size, mesh.dp_of(j), c.micro_batch_size
        )
        stages.append(
            StagePlan(
                index=j,
                pp_rank=j,
                blocks=[blocks[i].name for i in st.blocks],
                ranks=mesh.stage_ranks(j),
                compute_s=_r(st.compute_s),
                tp_comm_s=_r(st.tp_comm_s),
                p2p_s=_r(hop),
                time_per_microbatch_s=_r(t),
                forward_s=_r(st.fwd_s - st.p2p_s / 2 + hop / 2),
                backward_s=_r(st.bwd_s - st.p2p_s / 2 + hop / 2),
                dp_comm_s=_r(st.dp_comm_s),
                dp_exposed_s=_r(st.dp_exposed_s),
                optimizer_s=_r(st.optimizer_s),
                offload_s=_r(st.offload_s),
                inflight_microbatches=st.inflight,
                local_batch_size=local,
                num_microbatches=per_replica,
                kind=result.kinds[k].name,
            )
        )
    rows = []
    for i, blk in enumerate(blocks):
        v = sol.variants[stage_of[i]]
        o = ins[v].options[i][choice[i]]
        held = costs[v].stages[stage_of[i]].held
        memory_i = block_memory(o, configs[v], training, held)
        rows.append(block_record(blk, o, stage_of[i], rep[blk.cls], memory_i))
    used = [0] * len(result.kinds)
    for j, k in enumerate(sol.kinds):
        used[k] += len(mesh.stage_ranks(j))
    kinds = [
        KindInfo(kd.name, kd.cluster.profile.name, kd.cluster.gpus_per_node, used[k])
        for k, kd in enumerate(result.kinds)
        if used[k]
    ]
    peak_flops = sum(
        len(mesh.stage_ranks(j)) * result.kinds[k].cluster.profile.peak_flops[training.dtype]
        for j, k in enumerate(sol.kinds)
    )
    flops = costs[sol.variants[0]].model_flops_per_step
    m = num_microbatches(training, mesh.dp, c.micro_batch_size)  # the widest stage's
    pipeline = pipeline_time(mp, sol.variants, times)
    peaks = [mm.total for mm in memory]
    caps = [mp.per_variant[v].capacity for v in sol.variants]
    worst = max(range(c.pp), key=lambda j: (peaks[j] / caps[j], j))
    gpn = min(kd.cluster.gpus_per_node for kd in result.kinds)
    samples = training.global_batch_size / step
    out = Plan(
        schema=SCHEMA,
        model=model_info(traced),
        cluster=ClusterInfo(
            "+".join(k.profile for k in kinds), -(-mesh.size // gpn), gpn, mesh.size
        ),
        mesh=mesh,
        global_batch_size=training.global_batch_size,
        micro_batch_size=c.micro_batch_size,
        num_microbatches=m,
        schedule=c.schedule,
        virtual_stages=1,
        zero_stage=c.zero,
        dtype=training.dtype,
        optimizer=training.optimizer,
        lr=training.lr,
        stages=stages,
        blocks=rows,
        predicted=Prediction(
            step_time_s=_r(step),
            peak_memory_bytes=_r(peaks[worst]),
            capacity_bytes=_r(caps[worst]),
            mfu=_r(flops / (step * peak_flops)),
            memory_per_stage=memory,
            pipeline_s=_r(pipeline),
            bubble_s=_r(sum(times) - max(times)),
            samples_per_s=_r(samples),
            tokens_per_s=_r(samples * _tokens_per_sample(traced)),
            model_flops_per_step=_r(flops),
        ),
        solver=SolverRecord(
            status="optimal" if result.proven else "feasible",
            objective=_r(sol.objective),
            solve_time_s=_r(result.solve_time_s),
            candidates_total=len(result.candidates),
            candidates_solved=result.solved,
            candidates_pruned=sum(1 for x in result.candidates if x.status == "pruned-bound"),
        ),
        kinds=kinds,
        rank_kinds=[result.kinds[sol.kinds[mesh.coords(r)[0]]].name for r in range(mesh.size)],
    )
    # several chips: no cell of one chip's runs, so the spread of every published run
    out.predicted = with_error_bar(out.predicted, out.cluster.profile, mesh)
    return out
