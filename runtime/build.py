"""Build this rank's share of a plan: the mesh, the modules it holds, its optimizers, and the
pipeline schedule when there is one.

Weights are identical whatever the plan: every rank seeds, calls ``build_model`` on the CPU in
fp32, and only then shards or moves them.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from planner.modelfile import ModelFile, parameter_names
from planner.schema import Mesh, Plan
from planner.vocab import BatchNormStats, Offload, Schedule
from runtime.batching import dp_slice, micro_batches
from runtime.batchnorm import synchronize_batchnorm
from runtime.capability import check_runnable
from runtime.dtensor_blocks import whole_gradients
from runtime.expert_parallel import apply_expert_parallel, sync_expert_grads
from runtime.model_outputs import OutputLayout
from runtime.parallelize import (
    apply_data_parallel,
    apply_recompute,
    apply_tensor_parallel,
    ddp_autocast_dtype,
    dense_embedding_gradients,
    grad_sum_modules,
    make_optimizers,
    route_direct_forwards,
    scalar_parameters,
    shard_experts,
    sum_partial_gradients,
)
from runtime.pipeline_buffers import release_consumed_buffers
from runtime.tied import TiedGrads, tied_grads, untie_between
from runtime.uneven_tp import stage_meshes, uneven_stage


@dataclass
class RuntimeCache:
    """What a worker keeps between the plans of one launch: device meshes by shape (each
    creates process groups, which a batch of plans reuses) and traced pipelines by model and
    cut (tracing is the slow part of building a pipeline)."""

    meshes: dict[tuple, DeviceMesh] = field(default_factory=dict)
    pipes: dict[str, Any] = field(default_factory=dict)
    groups: dict[tuple, Any] = field(default_factory=dict)  # process groups by members


def expert_mesh(
    device: torch.device, pp: int, dp: int, ep: int, tp: int, cache: RuntimeCache
) -> DeviceMesh:
    """(pp, edp, ep, tp): the dp dimension split into dp / ep copies of ep consecutive ranks,
    the same ranks as ``device_mesh``'s, so that ``ep`` groups the ranks that share one copy
    of the experts and ``edp`` the ranks that hold the same experts."""
    key = (device.type + "-ep", pp, dp, ep, tp)
    if key not in cache.meshes:
        cache.meshes[key] = init_device_mesh(
            device.type, (pp, dp // ep, ep, tp), mesh_dim_names=("pp", "edp", "ep", "tp")
        )
    return cache.meshes[key]


def device_mesh(device: torch.device, plan_mesh: Mesh, cache: RuntimeCache) -> DeviceMesh:
    """The (pp, dp, tp) mesh, rank = (pp_i * dp + dp_i) * tp + tp_i; with context parallelism
    (pp, dp, cp, tp), rank = ((pp_i * dp + dp_i) * cp + cp_i) * tp + tp_i and a flattened
    "dp_cp" dimension: the replicas gradients reduce over. With a TP degree per stage
    (``Mesh.stage_tp``), the rank's own stage's mesh, its "pp" dimension of one rank. Cached
    per shape, because each mesh creates process groups and a batch of plans reuses them."""
    pp, dp, tp, cp = plan_mesh.pp, plan_mesh.dp, plan_mesh.tp, plan_mesh.cp
    by_stage = (plan_mesh.stage_tp, plan_mesh.stage_dp) if plan_mesh.uneven else None
    key = (device.type, pp, dp, tp, cp, by_stage)
    if key not in cache.meshes:
        if plan_mesh.uneven:
            # no (pp, dp, tp) grid: this rank's stage's own (1, dp, tp_i) mesh
            mine = plan_mesh.coords(dist.get_rank())[0]
            cache.meshes[key] = stage_meshes(device.type, plan_mesh)[mine]
        elif cp == 1:
            cache.meshes[key] = init_device_mesh(
                device.type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp")
            )
        else:
            mesh = init_device_mesh(
                device.type, (pp, dp, cp, tp), mesh_dim_names=("pp", "dp", "cp", "tp")
            )
            mesh["dp", "cp"]._flatten("dp_cp")
            cache.meshes[key] = mesh
    return cache.meshes[key]


def replica_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The dimension data-parallel wrappers reduce gradients over: dp, or dp x cp."""
    names = mesh.mesh_dim_names or ()
    return mesh["dp_cp"] if "cp" in names else mesh["dp"]


@dataclass
class Built:
    """What this rank runs: ``parts`` hold its parameters (the model, or its stage modules)."""

    plan: Plan
    mesh: DeviceMesh
    parts: list[nn.Module]
    optimizers: list
    schedule: Any = None
    stage_indices: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    expert_params: list = field(default_factory=list)  # sharded over ep: own gradient sync
    edp_group: Any = None
    tied: TiedGrads = field(default_factory=TiedGrads)  # copies of tied weights on stages
    # canonical parameter name -> its other names (RoBERTa's lm_head.bias is lm_head.decoder's):
    # a pipeline stage's traced module registers one, a checkpoint writes them all
    aliases: dict[str, list[str]] = field(default_factory=dict)
    tp_grad_sums: list = field(default_factory=list)  # modules: see sum_partial_gradients
    # (0-dim parameters, their replicas' group): no wrapper takes them (scalar_parameters)
    scalars: list = field(default_factory=list)
    autocast: torch.dtype | None = None  # the forward's torch.autocast dtype (ddp_autocast_dtype)
    gather: Any = None  # loss_fn's gather over the replicas (runtime/gather.py); None: one

    def sync_gradients(self) -> None:
        """What the data-parallel wrappers leave to do before the optimizer step."""
        sum_partial_gradients(self.tp_grad_sums, self.mesh["tp"])
        whole_gradients(self.parts)  # after: the sums above skip DTensor gradients
        if self.expert_params:
            sync_expert_grads(self.expert_params, self.edp_group, self.plan.mesh.dp)
        for params, group in self.scalars:  # summed over their replicas, averaged as DP does
            sync_expert_grads(params, group, dist.get_world_size(group))
        self.tied.sum_gradients(self.parts)

    @property
    def coords(self) -> tuple[int, int, int]:
        """(pp_i, dp_i, tp_i) of this rank, from the plan's mesh (the one rank formula)."""
        pp_i, dp_i, _, tp_i = self.plan.mesh.coords(dist.get_rank())
        return pp_i, dp_i, tp_i

    @property
    def cp_mesh(self) -> DeviceMesh | None:
        return self.mesh["cp"] if "cp" in (self.mesh.mesh_dim_names or ()) else None

    @property
    def holds_first(self) -> bool:
        return self.schedule is None or 0 in self.stage_indices

    @property
    def holds_last(self) -> bool:
        return self.schedule is None or len(self.plan.stages) - 1 in self.stage_indices


def _first_names(names: list[str]) -> str:
    """The first three of ``names`` for a note, and " ..." when there are more."""
    return ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")


def _notes(plan: Plan, device: torch.device) -> list[str]:
    notes = []
    if device.type == "cpu" and plan.dtype != "fp32":
        notes.append(
            f"dtype {plan.dtype}: the CPU run trains in fp32 (mixed precision is GPU-only)"
        )
    offloads = {b.offload for b in plan.blocks} - {"none"}
    if "optimizer" in offloads:
        notes.append(
            "offload 'optimizer': torch's FSDP2 offloads parameters and optimizer states "
            "together only, so optimizer-only offload is not applied"
        )
    if Offload.PARAMS in offloads and plan.zero_stage < 2:
        notes.append("offload 'optimizer+params' needs ZeRO 2 or 3 (FSDP2); not applied")
    return notes


def build(
    plan: Plan, mf: ModelFile, device: torch.device, seed: int, cache: RuntimeCache | None = None
) -> Built:
    """This rank's share of ``plan``; ``cache`` keeps meshes and traces for the next plan."""
    cache = RuntimeCache() if cache is None else cache
    mesh_cfg = plan.mesh
    cp = mesh_cfg.cp
    mesh = device_mesh(device, mesh_cfg, cache)
    torch.manual_seed(seed)
    model = mf.build()
    model.train()
    blocks = plan.blocks
    notes = _notes(plan, device)
    sparse = dense_embedding_gradients(model)
    if sparse:
        notes.append(
            f"{_first_names(sparse)}: sparse=True "
            "embeddings train with dense gradients (the same numbers, zeros where no sample "
            "looked up a row): FSDP2 and DTensor hold no sparse gradients"
        )
    check_runnable(plan)  # plan run checked it before launching; a batch of plans did not
    ep = mesh_cfg.ep
    if mesh_cfg.pp == 1:
        # (not in a pipeline: its stages run the traced graph, where a direct call is inlined;
        # torch's split points also replace the forward of the modules where stages begin)
        route_direct_forwards(model, plan.model.direct_forward or [])
        model.to(device)
        experts, edp_group = [], None
        if ep > 1:
            emesh = expert_mesh(device, 1, mesh_cfg.dp, ep, mesh_cfg.tp, cache)
            experts = apply_expert_parallel(model, emesh["ep"])
            edp_group = emesh["edp"].get_group()
        _batchnorm(model, plan, mesh, device)
        apply_recompute(model, blocks, before_tp=True, tp_mesh=mesh["tp"])
        apply_tensor_parallel(model, blocks, mesh["tp"])
        grad_sums = grad_sum_modules(model, blocks)
        apply_recompute(model, blocks)
        if cp > 1:
            from runtime.context_parallel import check_model

            check_model(model)
        replicas = replica_mesh(mesh)
        if ep > 1:
            experts = shard_experts(model, experts, emesh["edp"], plan, device)
        scalars = scalar_parameters(model, set(experts))
        model = apply_data_parallel(
            model, blocks, plan, replicas, device, set(experts) | set(scalars)
        )
        autocast = ddp_autocast_dtype(model, plan, device)
        parts = [model]
        optimizers = make_optimizers(parts, plan, replicas, experts)
        return Built(
            plan,
            mesh,
            parts,
            optimizers,
            gather=_gather(mf, mesh),
            notes=notes,
            expert_params=experts,
            edp_group=edp_group,
            tp_grad_sums=grad_sums,
            autocast=autocast,
            scalars=[(scalars, replicas.get_group())] if scalars else [],
        )
    return _build_pipeline(plan, mf, model, mesh, device, notes, cache)


def _build_pipeline(
    plan: Plan,
    mf: ModelFile,
    model: nn.Module,
    mesh: DeviceMesh,
    device: torch.device,
    notes,
    cache: RuntimeCache,
) -> Built:
    """This rank's pipeline stages and their schedule from the plan's cut. Long because torch's
    pipelining needs the traced pipe, each stage's wrapping (TP, recompute, data parallelism)
    and the schedule built in this order over shared state."""
    from torch.distributed.pipelining import (
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )
    from torch.distributed.pipelining._IR import _modify_graph_op_device

    from runtime.block_calls import module_calls
    from runtime.stages import (
        adopt_eager_modules,
        keep_unused_tensors,
        send_sequence_shards,
        sequence_stream_links,
        split_points,
        stage_module_name,
        traced_pipe,
    )

    inputs, _ = mf.batch(plan.global_batch_size, step=0)
    first = plan.stages_of(0)[0]
    example = micro_batches(
        dp_slice(inputs, 0, first.local_batch_size), first.local_batch_size, plan.micro_batch_size
    )[0]
    calls = module_calls(model, example)
    pipe = traced_pipe(plan, model, example, cache.pipes, calls)
    pp_rank = plan.mesh.coords(dist.get_rank())[0]
    indices = [st.index for st in plan.stages if st.pp_rank == pp_rank]
    blocks = plan.blocks
    parts, stages = [], []
    mesh_cfg = plan.mesh
    ep = mesh_cfg.ep
    experts: list = []
    scalars: list = []  # (a stage's 0-dim parameters, its replicas' group)
    edp_group = None
    stage_mods = [pipe.get_stage_module(i) for i in indices]
    one_tensor = None if calls is None else {n for n, c in calls.items() if c.one_tensor}
    # every stage, this rank's or not: the stream's links read each stage's calls as they run
    for i in range(pipe.num_stages):
        adopt_eager_modules(
            pipe.get_stage_module(i),
            model,
            split_points(plan, model),
            one_tensor,
            pipe.meshplan_block_calls,
        )
    links = sequence_stream_links(pipe, plan)
    if 0 in indices:
        every = [pipe.get_stage_module(i) for i in range(pipe.num_stages)]
        kept = keep_unused_tensors(every, model, stage_mods[indices.index(0)])
        if kept:
            notes.append(
                f"stage 0 keeps {_first_names(kept)}: "
                "the forward reads them nowhere, so no stage's code holds them; they are "
                "checkpointed as they are"
            )
    untie_between(stage_mods)
    names = parameter_names(model)
    tied = tied_grads(names, stage_mods, plan.mesh, cache.groups)
    grad_sums: list[nn.Module] = []
    for i, stage_mod in zip(indices, stage_mods):
        stage_mod.to(device)
        stage_experts: list = []
        if ep > 1:
            emesh = expert_mesh(device, mesh_cfg.pp, mesh_cfg.dp, ep, mesh_cfg.tp, cache)
            stage_experts = apply_expert_parallel(stage_mod, emesh["ep"], eager_only=True)
            edp_group = emesh["edp"].get_group()
        if device.type != "cpu":
            _modify_graph_op_device(stage_mod, device)
        _batchnorm(stage_mod, plan, mesh, device)
        apply_recompute(stage_mod, blocks, before_tp=True, tp_mesh=mesh["tp"])
        gathered = apply_tensor_parallel(stage_mod, blocks, mesh["tp"])
        send_sequence_shards(stage_mod, plan, i, mesh["tp"], links)
        grad_sums += grad_sum_modules(stage_mod, blocks, gathered)
        if gathered:
            notes.append(
                f"stage {i}: {', '.join(gathered)} run with replicated activations: the code "
                "around them is traced with fixed shapes, so it cannot take local shards"
            )
        apply_recompute(stage_mod, blocks)
        if ep > 1:
            experts += shard_experts(stage_mod, stage_experts, emesh["edp"], plan, device)
        stage_scalars = scalar_parameters(stage_mod, set(experts))
        if stage_scalars:
            scalars.append((stage_scalars, mesh["dp"].get_group()))
        wrapped = apply_data_parallel(
            stage_mod, blocks, plan, mesh["dp"], device, set(experts) | set(stage_scalars)
        )
        if ddp_autocast_dtype(wrapped, plan, device) is not None:
            notes.append(
                f"stage {i}: ZeRO-1 holds it in DDP, which casts nothing, and the pipeline's "
                "schedule runs backward beside forward, where torch.autocast does not belong: "
                "it trains in fp32, not the plan's 16-bit dtype (plan with ZeRO 0, 2 or 3)"
            )
        pipe.split_gm.register_module(stage_module_name(i), wrapped)
        stage = release_consumed_buffers(pipe.build_stage(i, device, group=mesh["pp"].get_group()))
        if plan.mesh.uneven:
            own = plan.stages_of(pp_rank)[0]
            step_microbatches = own.num_microbatches * plan.mesh.dp_of(pp_rank)
            stage = uneven_stage(stage, plan.mesh, step_microbatches)
        stages.append(stage)
        parts.append(wrapped)
    loss = _loss_fn(mf, pipe.meshplan_outputs, _gather(mf, mesh))
    m = plan.stages_of(pp_rank)[0].num_microbatches
    if plan.schedule == Schedule.INTERLEAVED:
        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=loss)
    else:
        cls = ScheduleGPipe if plan.schedule == Schedule.GPIPE else Schedule1F1B
        schedule = cls(stages[0], n_microbatches=m, loss_fn=loss)
    optimizers = make_optimizers(parts, plan, mesh["dp"], experts)
    aliases = {first: others[1:] for first, others in names.items() if others[1:]}
    return Built(
        plan,
        mesh,
        parts,
        optimizers,
        schedule,
        indices,
        notes,
        experts,
        edp_group,
        tied,
        aliases,
        grad_sums,
        scalars=scalars,
    )


def _batchnorm(root: nn.Module, plan: Plan, mesh: DeviceMesh, device: torch.device) -> None:
    """Synchronized BatchNorm statistics over the replicas, where the plan asks for them."""
    replicas = replica_mesh(mesh)
    if plan.batchnorm == BatchNormStats.SYNCHRONIZED and replicas.size() > 1:
        synchronize_batchnorm(root, replicas.get_group(), device)


def _gather(mf: ModelFile, mesh: DeviceMesh) -> Any:
    """``gather`` for a ``loss_fn`` that takes it, over this rank's data-parallel replicas."""
    if not mf.loss_gathers or mesh["dp"].size() == 1:
        return None
    from runtime.gather import batch_gather

    return batch_gather(mesh["dp"].get_group())


def _loss_fn(mf: ModelFile, layout: OutputLayout | None, gather: Any = None):
    """The model file's loss on the last stage, handed the model's output object as one
    process's forward returns it (rebuilt from what the stage returns: ``layout``)."""

    def loss(outputs: Any, targets: Any) -> torch.Tensor:
        outputs = layout.rebuild(outputs) if layout is not None else outputs
        return mf.loss(outputs, targets, gather)

    return loss


def release(built: Built) -> None:
    """Drop a plan's modules before the next plan of a batch (meshes are kept).

    FSDP2's and replicate's hooks tie a module and its state into reference cycles, which only
    the cycle collector frees, and it runs on object counts, not bytes: without a collection the
    last plan's weights stayed on the GPU while the next plan trained (an H200 held a Llama-1B's
    6 GB of fp32 weights into the next plan's peak, 2026-11-26)."""
    built.parts.clear()
    built.optimizers.clear()
    built.schedule = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    dist.barrier()


def freeze_launch_state() -> None:
    """Exempt what outlives a plan of a batch from every later collection (``gc.freeze``).

    ``release`` runs a full collection after each plan, and a full collection walks every
    tracked object: with torch and transformers imported, some 400,000, 0.2-0.3 s a plan, a
    fifth of a tiny model's whole run on the CPU. Called between plans, once a plan and its
    modules are dropped and collected, what is still alive lives until the launch ends
    (imports, meshes and process groups, traced pipelines in ``RuntimeCache``): frozen, each
    later collection walks only what the next plan made. What was alive here and becomes
    garbage later is never freed: a model file's module, executed again for the file's next
    plan (over 30 zoo plans, 15,440 objects, no tensor). On 30 plans of two ranks: 27.2 s to
    19.4 s."""
    gc.collect()
    gc.freeze()
