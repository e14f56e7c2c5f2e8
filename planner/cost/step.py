"""A configuration's step: every stage's cost and the step's time, memory, MFU and
throughput (``evaluate``), the function the solver optimizes and the one a user calls to score
a configuration by hand. Everything is derived from the traced blocks and the cluster's
profile; the published formulas are test oracles, never inputs."""

from __future__ import annotations

from planner.cost.data_parallel import dp_comm, stage_sync_time, tied_sync_time
from planner.cost.memory import rank_memory
from planner.cost.optimizer import offload_allowed, offload_time, optimizer_time
from planner.cost.pipeline import (
    chunk_held,
    forward_backward_split,
    inflight_microbatches,
    pipeline_time,
    stage_time_parts,
)
from planner.cost.records import Config, CostInputs, StageCost, StepCost
from planner.training import num_microbatches


def evaluate(inp: CostInputs, config: Config) -> StepCost:
    """Step time and per-device memory of ``config`` under the cost model.

    Step = pipeline + exposed DP communication + optimizer step + offload traffic (the last
    three: the slowest pipeline rank's) + tied weights' gradient sum; see ``pipeline_time`` and
    ``rank_memory``."""
    mesh, training = config.mesh, inp.training
    p = mesh.pp
    stages = stage_costs(inp, config)
    m = num_microbatches(training, mesh.dp, config.micro_batch_size)
    pipeline, bubble = pipeline_time(stages, config, m)
    memory, host = rank_memory(inp, config, stages)
    profile = inp.cluster.profile
    capacity = profile.memory_bytes * inp.memory_fraction
    peak = max(mm["total"] for mm in memory)
    dp_exposed = max(st.dp_exposed_s for st in stages)
    opt_s = max(sum(st.optimizer_s for st in stages[r::p]) for r in range(p))
    off_s = max(sum(st.offload_s for st in stages[r::p]) for r in range(p))
    step = pipeline + dp_exposed + opt_s + off_s + tied_sync_time(inp, config)
    flops = sum(b.fwd_flops + b.bwd_flops for b in inp.blocks) * (
        training.global_batch_size / inp.traced_mbs
    )
    peak_flops = profile.peak_flops[training.dtype]
    host_capacity = profile.host_memory_bytes / max(profile.gpus_per_node, 1)
    return StepCost(
        step_time_s=step,
        pipeline_s=pipeline,
        bubble_s=bubble,
        dp_exposed_s=dp_exposed,
        optimizer_s=opt_s,
        offload_s=off_s,
        stages=stages,
        rank_memory=memory,
        peak_memory_bytes=peak,
        capacity_bytes=capacity,
        model_flops_per_step=flops,
        mfu=flops / (step * mesh.size * peak_flops) if step > 0 else 0.0,
        samples_per_s=training.global_batch_size / step if step > 0 else 0.0,
        feasible=peak <= capacity
        and host <= host_capacity
        and all(
            offload_allowed(inp.options[i][k].offload, config.zero_stage)
            for i, k in enumerate(config.choice)
        ),
        host_bytes_per_gpu=host,
        sync_s=m * max(sum(st.sync_s for st in stages[r::p]) for r in range(p)),
    )


def stage_costs(inp: CostInputs, config: Config) -> list[StageCost]:
    """Every (virtual) stage's times per micro-batch and per step."""
    mesh = config.mesh
    p, v = mesh.pp, config.virtual_stages
    m = num_microbatches(inp.training, mesh.dp, config.micro_batch_size)
    n_stages = p * v
    stage_blocks: list[list[int]] = [[] for _ in range(n_stages)]
    for i, s in enumerate(config.stage_of):
        stage_blocks[s].append(i)
    stages: list[StageCost] = []
    for s in range(n_stages):
        r = s % p
        opts = [inp.options[i][config.choice[i]] for i in stage_blocks[s]]
        sync = stage_sync_time(inp, opts, config, s)
        compute, tp_comm, p2p = stage_time_parts(inp, opts, config, s, sync)
        dp_total, dp_exposed = dp_comm(inp, opts, config, r)
        fwd, bwd = forward_backward_split(opts, compute + tp_comm + p2p, p2p)
        stages.append(
            StageCost(
                index=s,
                pp_rank=r,
                blocks=stage_blocks[s],
                compute_s=compute,
                tp_comm_s=tp_comm,
                p2p_s=p2p,
                time_s=compute + tp_comm + p2p,
                fwd_s=fwd,
                bwd_s=bwd,
                dp_comm_s=dp_total,
                dp_exposed_s=dp_exposed,
                optimizer_s=optimizer_time(inp, opts, config),
                offload_s=offload_time(inp, opts, config, m),
                inflight=inflight_microbatches(config.schedule, m, p, v, r),
                held=chunk_held(config.schedule, m, p, v, r),
                sync_s=sync,
            )
        )
    return stages
