"""Assemble the plan from the solver's result: stages, blocks, the prediction and the solver's
record with the alternatives and why each lost. Output is deterministic (floats rounded to 12
significant digits) except the solve time, which lives under ``solver``.
"""

from __future__ import annotations

import math
from dataclasses import replace

from planner.cost.error_bars import error_bar
from planner.cost.memory import forward_state_bytes, option_states
from planner.cost.records import Config, CostInputs, StepCost, deferred_reduce, grads_held
from planner.cost.sharding import tied_parameters
from planner.hardware.cluster import Cluster
from planner.schema import (
    SCHEMA,
    Alternative,
    BlockPlan,
    CandidatePoint,
    ClusterInfo,
    Memory,
    Mesh,
    ModelInfo,
    Plan,
    Prediction,
    SolverRecord,
    StagePlan,
)
from planner.schema.plan import Certificate
from planner.search.driver import WORK_LIMITS, Candidate, SearchResult
from planner.training import Training, num_microbatches, replica_counts
from planner.vocab import TPStyle


def _r(x: float) -> float:
    return float(f"{x:.12g}")


def memory_record(mem: dict[str, float]) -> Memory:
    keys = ("params", "grads", "optimizer", "activations", "other", "total")
    return Memory(**{k: _r(mem.get(k, 0.0)) for k in keys})


def candidate_summary(c: Candidate, best: Candidate | None) -> Alternative:
    cost = c.cost
    return Alternative(
        label=c.label(),
        status=c.status,
        mesh=Mesh(c.pp, c.dp, c.tp, c.ep, c.cp),
        micro_batch_size=c.micro_batch_size,
        schedule=c.schedule,
        virtual_stages=c.virtual_stages,
        zero_stage=c.zero,
        why_not=why_lost(c, best),
        lower_bound_step_time_s=_r(c.bound) if math.isfinite(c.bound) else None,
        step_time_s=_r(cost.step_time_s) if cost else None,
        peak_memory_bytes=_r(cost.peak_memory_bytes) if cost else None,
        feasible=cost.feasible if cost else None,
        mfu=_r(cost.mfu) if cost else None,
    )


def why_lost(c: Candidate, best: Candidate | None) -> str:
    if best is not None and c is best:
        return "chosen"
    if c.status == "solved" and c.cost is not None:
        if not c.cost.feasible:
            over = c.cost.peak_memory_bytes - c.cost.capacity_bytes
            return f"does not fit: needs {over / 2**30:.1f} GiB more than the device has"
        if best is not None and best.cost is not None:
            slower = c.cost.step_time_s / best.cost.step_time_s - 1
            cost = c.cost
            if slower <= -1e-3:
                # Only a baseline outside the user's pins can beat the chosen plan.
                return (
                    f"{1 / (1 + slower):.2f}x as fast as the chosen plan, but your pins "
                    "(--tp/--pp/--dp/--zero/...) exclude it; drop them to let the search choose it"
                )
            if slower < 1e-3:
                extra = (cost.peak_memory_bytes - best.cost.peak_memory_bytes) / 2**30
                if extra > 0.05:
                    return f"as fast (within 0.1%) but needs {extra:.1f} GiB more memory"
                return "as fast (within 0.1%); the chosen plan wins the tie on a simpler mesh"
            sync = cost.sync_s - best.cost.sync_s
            work = (
                "compute and tensor-parallel communication"
                if c.tp > 1 or best.tp > 1
                else "compute"
            )
            parts = {
                "pipeline bubble": cost.bubble_s - best.cost.bubble_s,
                "exposed data-parallel communication": cost.dp_exposed_s - best.cost.dp_exposed_s,
                "optimizer step": cost.optimizer_s - best.cost.optimizer_s,
                "offload traffic": cost.offload_s - best.cost.offload_s,
                "BatchNorm statistics synchronization": sync,
                work: (cost.pipeline_s - cost.bubble_s - best.cost.pipeline_s + best.cost.bubble_s)
                - sync,
            }
            worst = max(parts, key=lambda k: parts[k])
            return f"{slower:.1%} slower, mostly {worst}"
    if c.status == "infeasible":
        return "does not fit in memory with any placement and options"
    return c.reason or c.status


def rebase_tp_plan(tp_plan: dict[str, str], rep: list[str], own: list[str]) -> dict[str, str]:
    """Blocks of one class share their options, priced on the class's first block; its module
    paths (``layers.0.mlp.fc1``) are rewritten to this block's (``layers.7.mlp.fc1``)."""
    out = {}
    for fqn, style in tp_plan.items():
        for r, o in zip(rep, own):
            if fqn == r or fqn.startswith(r + "."):
                fqn = o + fqn[len(r) :]
                break
        out[fqn] = style
    return dict(sorted(out.items()))


def block_memory(o, config: Config, training: Training, held: float) -> float:
    """Device bytes one block holds where its rank's activations peak: its model states after
    ZeRO and offload (``forward_state_bytes``), plus its saved activations for the micro-batches'
    worth its stage holds (``chunk_held``)."""
    deferred = deferred_reduce(config, training)
    sm = option_states(o, config.zero_stage, config.mesh.replicas, training, deferred)
    return forward_state_bytes(sm, grads_held(config, training)) + o.act_bytes * held


def build_plan(
    traced,
    cluster: Cluster,
    training: Training,
    result: SearchResult,
    baselines: list[tuple[str, Candidate]],
) -> Plan:
    best = result.best
    assert best is not None and best.config is not None and best.cost is not None
    config: Config = best.config
    mesh = config.mesh
    return Plan(
        schema=SCHEMA,
        model=model_info(traced),
        cluster=ClusterInfo(
            cluster.profile.name, cluster.nodes, cluster.gpus_per_node, cluster.gpus
        ),
        mesh=Mesh(mesh.pp, mesh.dp, mesh.tp, mesh.ep, mesh.cp),
        global_batch_size=training.global_batch_size,
        micro_batch_size=config.micro_batch_size,
        num_microbatches=num_microbatches(training, mesh.dp, config.micro_batch_size),
        schedule=config.schedule,
        virtual_stages=config.virtual_stages,
        zero_stage=config.zero_stage,
        dtype=training.dtype,
        optimizer=training.optimizer,
        lr=training.lr,
        reduce_dtype=training.reduce_dtype,
        stages=stage_records(best, traced.blocks, training, result.inputs[best.key]),
        blocks=block_records(best, result.inputs[best.key], traced.blocks, training),
        predicted=with_error_bar(prediction(best.cost, traced), cluster.profile.name, mesh),
        solver=solver_record(result, baselines),
    )


def with_error_bar(pred: Prediction, profile: str, mesh) -> Prediction:
    """``pred`` with the range of measured steps the published runs' held-out errors allow
    for a layout of ``mesh``'s form on ``profile`` (``cost.error_bars``); unchanged when no
    error-bar file is there."""
    bar = error_bar(profile, mesh.pp, mesh.tp)
    if bar is None:
        return pred
    lo, hi = bar.step_range(pred.step_time_s)
    return replace(
        pred,
        step_time_range_s=[_r(lo), _r(hi)],
        step_time_range_runs=bar.runs,
        step_time_range_scope=bar.scope,
    )


def model_info(traced) -> ModelInfo:
    g = traced.graph.graph
    return ModelInfo(
        file=g["file"],
        sha256=g["sha256"],
        args=g["args"],
        params=traced.params,
        blocks=len(traced.blocks),
        trace=g["method"],
        unread_params=list(g.get("unread_params", [])),
        direct_forward=list(g.get("direct_forward", [])) or None,
        read_outside=sorted(tied_parameters(traced.graph)) or None,
    )


def sends_shards(best: Candidate, inp: CostInputs | None) -> bool:
    """Whether the plan's pipeline sends each TP rank's sequence shard of the stream, as its
    candidate was priced (``driver.stream_training``)."""
    return (
        inp is not None
        and best.stream
        and best.config.mesh.pp > 1
        and inp.training.pipeline_sends_shards
    )


def stage_records(
    best: Candidate, blocks, training: Training, inp: CostInputs | None = None
) -> list[StagePlan]:
    config = best.config
    sends = sends_shards(best, inp)
    mesh = config.mesh

    def counts(pp_rank: int) -> tuple[int, int]:
        return replica_counts(
            training.global_batch_size, mesh.dp_of(pp_rank), config.micro_batch_size
        )

    return [
        StagePlan(
            index=st.index,
            pp_rank=st.pp_rank,
            blocks=[blocks[i].name for i in st.blocks],
            ranks=mesh.stage_ranks(st.pp_rank),
            compute_s=_r(st.compute_s),
            tp_comm_s=_r(st.tp_comm_s),
            p2p_s=_r(st.p2p_s),
            time_per_microbatch_s=_r(st.time_s),
            forward_s=_r(st.fwd_s),
            backward_s=_r(st.bwd_s),
            dp_comm_s=_r(st.dp_comm_s),
            dp_exposed_s=_r(st.dp_exposed_s),
            optimizer_s=_r(st.optimizer_s),
            offload_s=_r(st.offload_s),
            inflight_microbatches=st.inflight,
            local_batch_size=counts(st.pp_rank)[0],
            num_microbatches=counts(st.pp_rank)[1],
            receives_sequence_shard=(sends and st.index > 0) or None,
        )
        for st in best.cost.stages
    ]


def block_records(best: Candidate, inp: CostInputs, blocks, training: Training) -> list[BlockPlan]:
    config = best.config
    stage_held = {i: st.held for st in best.cost.stages for i in st.blocks}
    rep_modules: dict[str, list[str]] = {}
    for blk in blocks:
        rep_modules.setdefault(blk.cls, blk.modules)
    chosen = [inp.options[i][config.choice[i]] for i in range(len(blocks))]
    tps = [config.mesh.tp_of(s % config.mesh.pp) for s in config.stage_of]
    stream = sequence_stream_plan(chosen, tps, config.stage_of, sends_shards(best, inp))
    return [
        replace(
            block_record(
                blk,
                chosen[i],
                config.stage_of[i],
                rep_modules[blk.cls],
                block_memory(chosen[i], config, training, stage_held[i]),
            ),
            takes_sequence_shard=stream[i][0] or None,
            leaves_sequence_shard=stream[i][1] or None,
        )
        for i, blk in enumerate(blocks)
    ]


def sequence_stream_plan(
    chosen: list, tps: list[int], stage_of: list[int], sends: bool
) -> list[tuple[bool, bool]]:
    """Per block, whether the runtime keeps the stream sequence-sharded at its entry and at its
    exit: inside a stage, where the options chosen on both sides were priced so
    (``BlockOption.takes_sequence_shard`` after ``leaves_sequence_shard``); at a pipeline cut,
    where the pipeline sends shards (``sends``, between stages of one TP degree: each rank's
    shard goes to the rank of the same TP index), every sequence-parallel block beside it,
    whatever the other side runs (that side's stage slices or gathers at the cut: the same
    collective the block's own slice or gather was priced as); where it does not, none.
    Elsewhere a block slices and gathers as before."""
    sp = [TPStyle.SP_BLOCK in dict(o.tp_plan).values() for o in chosen]
    edge = []
    for i, (a, b) in enumerate(zip(chosen, chosen[1:])):
        if stage_of[i] == stage_of[i + 1]:
            edge.append((a.leaves_sequence_shard and b.takes_sequence_shard,) * 2)
        else:
            cut = sends and tps[i] == tps[i + 1]
            edge.append((cut and sp[i], cut and sp[i + 1]))
    return [
        (i > 0 and edge[i - 1][1], i < len(chosen) - 1 and edge[i][0]) for i in range(len(chosen))
    ]


def block_record(blk, o, stage: int, rep: list[str], memory: float) -> BlockPlan:
    """One block's row of the plan: its option ``o``, priced on the class's first block (whose
    module paths ``rep`` are rewritten to this block's), on ``stage``, holding ``memory``."""
    return BlockPlan(
        name=blk.name,
        block_class=blk.label,
        modules=blk.modules,
        stage=stage,
        params=blk.params,
        tp_variant=o.variant,
        tp_plan=rebase_tp_plan(dict(o.tp_plan), rep, blk.modules),
        tp_grad_sums=sorted(rebase_tp_plan(dict.fromkeys(o.tp_grad_sums, ""), rep, blk.modules)),
        tp_local_attributes=sorted(
            rebase_tp_plan(dict.fromkeys(o.tp_local_attributes, ""), rep, blk.modules)
        ),
        recompute=o.recompute,
        offload=o.offload,
        time_per_microbatch_s=_r(o.time_s),
        activation_bytes_per_microbatch=_r(o.act_bytes),
        memory_bytes=_r(memory),
    )


def prediction(cost: StepCost, traced) -> Prediction:
    return Prediction(
        step_time_s=_r(cost.step_time_s),
        pipeline_s=_r(cost.pipeline_s),
        bubble_s=_r(cost.bubble_s),
        dp_exposed_s=_r(cost.dp_exposed_s),
        optimizer_s=_r(cost.optimizer_s),
        offload_s=_r(cost.offload_s),
        samples_per_s=_r(cost.samples_per_s),
        tokens_per_s=_r(cost.samples_per_s * _tokens_per_sample(traced)),
        model_flops_per_step=_r(cost.model_flops_per_step),
        mfu=_r(cost.mfu),
        peak_memory_bytes=_r(cost.peak_memory_bytes),
        capacity_bytes=_r(cost.capacity_bytes),
        host_bytes_per_gpu=_r(cost.host_bytes_per_gpu),
        memory_per_stage=[memory_record(mm) for mm in cost.rank_memory],
    )


def solver_record(result: SearchResult, baselines: list[tuple[str, Candidate]]) -> SolverRecord:
    best = result.best
    return SolverRecord(
        status="optimal" if result.gap == 0 else "feasible",
        objective=_r(best.milp_objective),
        gap=_r(result.gap),
        solve_time_s=round(result.solve_time_s, 3),
        candidates_total=result.total,
        candidates_solved=result.solved,
        candidates_pruned=sum(1 for c in result.candidates if c.status.startswith("pruned")),
        alternatives=alternatives(result, baselines),
        bound=_r(result.bound),
        nodes=result.nodes,
        work_limits=dict(WORK_LIMITS),
        certificates=[certificate(c, c is best) for c in result.candidates],
        candidates=[
            CandidatePoint(
                label=c.label(),
                step_time_s=_r(c.cost.step_time_s),
                peak_memory_bytes=_r(c.cost.peak_memory_bytes),
                feasible=c.cost.feasible,
                chosen=c is best,
            )
            for c in result.candidates
            if c.status == "solved" and c.cost is not None
        ],
    )


def certificate(c: Candidate, chosen: bool) -> Certificate:
    """One candidate's status, step time and proven bound (None where it has none)."""
    solved = c.status == "solved" and c.cost is not None
    t = c.cost.step_time_s if solved else None
    bound = c.bound if math.isfinite(c.bound) and c.status != "dominated" else None
    if t is not None and bound is not None:
        bound = min(bound, t)
    gap = max(0.0, (t - bound) / t) if t and bound is not None else None
    return Certificate(
        label=c.label(),
        status="chosen" if chosen else c.status,
        objective=_r(t) if t is not None else None,
        bound=_r(bound) if bound is not None else None,
        gap=_r(gap) if gap is not None else None,
        nodes=c.nodes,
    )


def _tokens_per_sample(traced) -> int:
    """Tokens per sample: the second dimension of an integer (token id) input, else 1."""
    g = traced.graph
    for _, d in g.nodes(data=True):
        if d["op"] == "input" and d["dtypes"] and d["dtypes"][0] in ("int64", "int32"):
            shape = d["shapes"][0] or []
            if len(shape) >= 2:
                return int(shape[1])
    return 1


def alternatives(result: SearchResult, baselines: list[tuple[str, Candidate]]) -> list[Alternative]:
    """The best plan of each mesh shape, then the named baselines, each with why it lost."""
    best = result.best
    by_shape: dict[tuple[int, int, int], Candidate] = {}
    for c in result.candidates:
        if c.status not in ("solved", "infeasible", "pruned-bound", "pruned-memory"):
            continue
        cur = by_shape.get(c.mesh_key)
        if cur is None or _rank(c) < _rank(cur):
            by_shape[c.mesh_key] = c
    rows = [candidate_summary(c, best) for _, c in sorted(by_shape.items())]
    rows.sort(key=lambda r: (r.step_time_s is None, r.step_time_s or 0, r.label))
    for name, c in baselines:
        row = candidate_summary(c, best)
        row.baseline = name
        rows.append(row)
    return rows


def _rank(c: Candidate) -> tuple:
    if c.status == "solved" and c.cost is not None:
        return (0 if c.cost.feasible else 1, c.cost.step_time_s)
    return (2, c.bound)
