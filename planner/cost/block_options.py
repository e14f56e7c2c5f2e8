"""A block's options: every (tensor-parallel variant x recompute x offload) way to run one
block, each priced in time and memory from the traced graph (``block_options``), with what
selective recompute keeps, mixture-of-experts dispatch and the batch statistics a BatchNorm
synchronises."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from planner.cost.compute import (
    NodeTimes,
    block_node_times,
    node_times,
    op_counts,
    overhead_times,
    ring_attention_times,
    tp_exposed,
    tp_shares,
)
from planner.cost.records import BlockOption
from planner.hardware.cluster import Cluster
from planner.hardware.collectives import collective_time
from planner.trace.blocks import Block, cached_core_nodes, product_share
from planner.training import FP32_BYTES, Training
from planner.vocab import OFFLOAD, RECOMPUTE, Offload, Recompute, SelectivePolicy, TPStyle

if TYPE_CHECKING:
    from planner.cost.sharding import TPVariant


def block_options(
    graph,
    block: Block,
    variants: list,
    micro_batch_size: int,
    cluster: Cluster,
    tp_ranks: list[int],
    training: Training,
    offload_allowed: bool = True,
    ep_ranks: list[int] | None = None,
    cp_ranks: list[int] | None = None,
) -> list[BlockOption]:
    """Every (TP variant x recompute x offload) option of a block, priced. ``ep_ranks``: the
    expert-parallel group a mixture-of-experts block's experts are spread over; ``cp_ranks``:
    the context-parallel group each sample's sequence is split over (every token-local op and
    every query's attention run on 1/cp of the tokens, plus the ring of key/value chunks).

    Long because every option of a block shares the same per-op sums; computing them once here keeps
    each option a few lines.
    """
    traced_mbs = graph.graph["traced_batch_size"]
    cp = len(cp_ranks) if cp_ranks else 1
    scale = micro_batch_size / traced_mbs / cp
    kernels = {
        "fp8": training.fp8_linears,
        "native": training.native_attention,
        "legacy": training.legacy_attention,
        "fused": training.fused_elementwise,
    }
    times = block_node_times(graph, block, scale, cluster, training.dtype, None, **kernels)
    # compute-bound time outside the per-op sums (ring attention, the busiest expert rank's
    # excess), shrinking with the block's compute fraction
    ring_f, ring_b = ring_attention_times(graph, block, scale, cluster, training, cp_ranks)
    more_f, more_b = ring_f, ring_b
    counts = op_counts(graph, block)
    ep = len(ep_ranks) if ep_ranks else 1
    moe = block.extra.get("moe")
    expert_total = float(moe["expert_params"]) if moe else 0.0
    a2a_f = a2a_b = 0.0
    if moe:
        # The busiest expert rank computes ``factor`` times the mean routed rows.
        factor = training.moe_capacity_factor * (training.moe_imbalance if ep > 1 else 1.0)
        experts = expert_nodes(graph, block)
        e_fwd, e_bwd, _ = node_times(
            graph, block, scale, cluster, training.dtype, experts, **kernels
        )
        more_f += e_fwd * (factor - 1)
        more_b += e_bwd * (factor - 1)
        # dispatch + combine in forward, their gradients in backward
        buffer = dispatch_bytes(moe, scale, training) if ep > 1 else 0.0
        one = collective_time("all_to_all", buffer, cluster, ep_ranks or [0])
        a2a_f = a2a_b = 2 * one
    policy = selective_ops(graph, block, training)
    norms = batch_norm_channels(graph, block)
    products = product_share(graph, block)
    core = [n for n in block.nodes if n in cached_core_nodes(graph)]
    compute_only = NodeTimes(ops={n: (fc, 0.0, bc, 0.0) for n, (fc, _, bc, _) in times.ops.items()})
    options: list[BlockOption] = []
    for v in variants:
        cf = v.compute_fraction
        ovh_f, ovh_b, ovh_sel = overhead_times(counts, v.tp_plan, len(tp_ranks), cluster)
        shares = tp_shares(v, times, graph)
        if shares is None:  # the block's average fractions
            mbf = v.memory_bound_fraction
            ops_f = times.fwd_compute * cf + times.fwd_memory * mbf
            ops_b = times.bwd_compute * cf + times.bwd_memory * mbf
            gemm_f, gemm_b = times.fwd_compute * cf, times.bwd_compute * cf
            core_f = times.core_fwd * cf
        else:
            ops_f, ops_b = times.sharded(shares)
            gemm_f, gemm_b = compute_only.sharded(shares)
            core_f = times.sharded(shares, core)[0]
        fwd = ops_f + more_f * cf + ovh_f + a2a_f
        bwd = ops_b + more_b * cf + ovh_b + a2a_b
        comm_f = sum(collective_time(k, b * scale, cluster, tp_ranks) for k, b in v.comm_fwd)
        comm_b = sum(collective_time(k, b * scale, cluster, tp_ranks) for k, b in v.comm_bwd)
        if training.tp_overlap:
            comm_f, comm_b = tp_exposed(
                comm_f, comm_b, gemm_f + more_f * cf, gemm_b + more_b * cf, cluster,
                cluster.profile.async_tp_overlap if training.tp_overlap_async else 1.0,
            )  # fmt: skip
        # Experts are not split by TP (a grouped product has no sharding rule), but by EP.
        params = block.params * v.param_fraction - expert_total * (1 - 1 / ep)
        sel_bytes, sel_fwd, sel_comm = selective_price(
            graph, block, v, policy, training, times, shares, core_f, scale, cluster, tp_ranks
        )
        full_kept = full_recompute_kept(v)
        for rc in RECOMPUTE:
            if rc == Recompute.SELECTIVE and sel_bytes >= v.saved_bytes:
                continue  # nothing to drop: identical to "none"
            if rc == Recompute.FULL and full_kept >= v.saved_bytes:
                continue
            extra = {
                Recompute.NONE: 0.0,
                Recompute.SELECTIVE: sel_fwd + ovh_sel + sel_comm,
                Recompute.FULL: fwd + comm_f,
            }[rc]
            ep_comm = a2a_f + a2a_b + (a2a_f if rc == Recompute.FULL else 0.0)
            act = {
                Recompute.NONE: v.saved_bytes,
                Recompute.SELECTIVE: sel_bytes,
                Recompute.FULL: full_kept,
            }[rc]
            # (full: the forward's collectives again; a sequence-parallel block's exit
            # all-gather, not re-run, stands for its input's all-gather, the same bytes a layer)
            recompute_comm = {
                Recompute.NONE: 0.0,
                Recompute.SELECTIVE: sel_comm,
                Recompute.FULL: comm_f,
            }[rc]
            recompute_peak = {
                Recompute.NONE: 0.0,
                Recompute.SELECTIVE: v.saved_bytes - sel_bytes,
                Recompute.FULL: v.saved_bytes,
            }[rc]
            for off in OFFLOAD if (offload_allowed and block.params > 0) else (Offload.NONE,):
                options.append(
                    BlockOption(
                        variant=v.name,
                        recompute=rc,
                        offload=off,
                        fwd_s=fwd + comm_f,
                        bwd_s=bwd + extra + comm_b,
                        tp_comm_s=comm_f + comm_b + recompute_comm,
                        params=params,
                        param_tensors=len(block.param_names),
                        product_params=params * products,
                        act_bytes=act * scale,
                        recompute_peak_bytes=recompute_peak * scale,
                        transient_bytes=block.transient_bytes * scale * cf,
                        tp_plan=tuple(sorted(v.tp_plan.items())),
                        tp_grad_sums=v.grad_sums,
                        tp_local_attributes=v.local_attributes,
                        ep=ep,
                        expert_params=expert_total / ep,
                        ep_comm_s=ep_comm,
                        norm_channels=norms,
                        takes_sequence_shard=v.takes_sequence_shard,
                        leaves_sequence_shard=v.leaves_sequence_shard,
                    )
                )
    return options


def selective_price(
    graph,
    block: Block,
    v: TPVariant,
    policy: tuple[set[str], list[str]] | None,
    training: Training,
    times: NodeTimes,
    shares: dict[str, float] | None,
    core_f: float,
    scale: float,
    cluster: Cluster,
    tp_ranks: list[int],
) -> tuple[float, float, float]:
    """(bytes kept per traced micro-batch, forward re-run, collectives re-run) of selective
    recompute of ``block`` run as variant ``v``. Megatron's "core" policy (``policy`` None):
    the traced ``saved_selective_bytes`` and the core's forward. torchtitan's: the traced
    block's kept share, applied to the variant's saved bytes (exact without TP; with TP it
    assumes the kept tensors shard as the saved ones do); the runtime's: one rank's kept
    tensors as the variant shards them, and the collectives its recompute adds."""
    if policy is None:
        return v.saved_selective_bytes, core_f, 0.0
    saved, recomputed = policy
    comm = 0.0
    if training.selective_policy == SelectivePolicy.RUNTIME_OP:
        kept, recomputed = runtime_selective(graph, block, saved, v)
        share = kept / v.saved_bytes if v.saved_bytes else 0.0
        comm = sum(
            collective_time(k, b * scale, cluster, tp_ranks) for k, b in recompute_collectives(v)
        )
    else:
        kept = kept_bytes(graph, block, saved)
        share = kept / block.saved_bytes if block.saved_bytes else 0.0
    if shares is None:
        re_f = sum(times.ops[n][0] + times.ops[n][1] for n in recomputed if n in times.ops)
        re_f *= v.compute_fraction
    else:
        re_f = times.sharded(shares, recomputed)[0]
    return v.saved_bytes * min(share, 1.0), re_f, comm


def full_recompute_kept(v: TPVariant) -> float:
    """Bytes a fully recomputed block keeps per traced micro-batch on one TP rank: its input,
    of a sequence-parallel variant the input's sequence shard (Korthikanti et al.'s 2sbh/t:
    Megatron-Core and torchtitan checkpoint inside the sequence-sharded stream; meshplan's
    runtime keeps the shard it takes from the stream (``sharding.sequence_stream``) or the
    shard of the replicated input it receives, ``runtime.selective``)."""
    return float(v.input_bytes)


def _batch_statistics_input(d: dict) -> list[int] | None:
    """The input shape of a BatchNorm op that normalises with the batch's statistics (training
    mode; eval-mode and frozen ones use running statistics), else None."""
    from planner.trace.opcost import BATCH_NORM_OPS

    args = d.get("args") or []
    if d["op"] in BATCH_NORM_OPS and len(args) > 5 and args[5] is True and d.get("shapes"):
        return list(d["shapes"][0])
    return None


def batch_norm_channels(graph, block: Block) -> tuple[int, ...]:
    """Channels (dimension 1 of the input) of each BatchNorm of ``block`` that normalises with
    the batch's statistics (eval-mode and frozen ones synchronize nothing)."""
    shapes = [_batch_statistics_input(graph.nodes[n]) for n in block.nodes]
    return tuple(int(s[1]) if len(s) > 1 else 1 for s in shapes if s is not None)


def batch_statistics_shapes(graph) -> list[list[int]]:
    """Input shapes of the model's BatchNorms that normalise with the batch's statistics."""
    shapes = (_batch_statistics_input(d) for _, d in graph.nodes(data=True))
    return [s for s in shapes if s is not None]


def batch_statistics_floor(graph) -> int:
    """Samples the statistics of every training-mode BatchNorm must span together: 2 where one
    normalises a single value per channel per sample (a [batch, features] input, or one left
    1 x 1 by pooling), since one value has no variance and torch refuses it; else 1. A
    synchronized BatchNorm spans the data-parallel replicas' micro-batches together."""
    shapes = batch_statistics_shapes(graph)
    return 2 if any(math.prod(shape[2:]) == 1 for shape in shapes) else 1


def selective_kept(
    graph, block: Block, training: Training, variant: TPVariant | None = None
) -> tuple[float, list[str]] | None:
    """(bytes kept for backward per traced micro-batch, ops recomputed) under
    ``Training.selective_policy``, or None for Megatron's "core" policy (the traced
    ``saved_selective_bytes`` and the core's forward).

    With a TP ``variant``, "runtime-op" gives one rank's bytes and re-run ops
    (``runtime_selective``).

    Both op policies are torch selective-checkpoint policies: the checkpoint keeps the block's
    input to re-run it, must-saves the outputs of the ops the policy names and recomputes
    everything else. "runtime-op" is meshplan's runtime's (``planner.checkpoint_policy``): every
    op that runs as a kernel of its ``SAVED_OP_NAMES`` (matrix products of weights and of
    activations, the attention kernels). "torchtitan-op" is torchtitan's per-op selective
    activation checkpointing (torchtitan/models/llama3/parallelize_llama.py,
    ``_apply_ac_to_transformer_block`` at commit b5bcd76, the version of its published
    benchmarks): the ops in its save list (``aten.mm``, the flash and memory-efficient attention
    kernels, reduce-scatter, ``aten.max``) except every second ``aten.mm`` of the block. FP8
    linears call ``aten._scaled_mm``, which neither list names, so with them no weight product
    is saved."""
    ops = selective_ops(graph, block, training)
    if ops is None:
        return None
    saved, recomputed = ops
    if variant is not None and training.selective_policy == SelectivePolicy.RUNTIME_OP:
        return runtime_selective(graph, block, saved, variant)
    return kept_bytes(graph, block, saved), recomputed


def is_sequence_parallel(v: TPVariant) -> bool:
    return TPStyle.SP_BLOCK in v.tp_plan.values()


def runtime_selective(
    graph, block: Block, saved: set[str], v: TPVariant
) -> tuple[float, list[str]]:
    """(bytes one TP rank keeps per traced micro-batch, ops its recompute re-runs) under the
    runtime's policy (``planner.checkpoint_policy``), the block run as variant ``v``.

    A kept output sharded over the group is 1/t of it, a replicated one whole. Without
    sequence parallelism, a row-parallel product's output is its whole partial sum (saved
    before its all-reduce) and the block's input is whole. In a sequence-parallel block, the
    products inside ``RESHARDED_STYLES`` modules are re-run and their reduce-scattered output
    kept (1/t), and the checkpoint keeps the input's sequence shard (``runtime.selective``)."""
    from planner.checkpoint_policy import RESHARDED_STYLES
    from planner.trace.blocks import in_modules

    input_bytes, resharded = float(block.input_bytes), set()
    if is_sequence_parallel(v):
        input_bytes = float(v.input_bytes)
        modules = [fqn for fqn, style in v.tp_plan.items() if style in RESHARDED_STYLES]
        resharded = {n for n in saved if in_modules(graph.nodes[n]["module"], modules)}
    kept_saved = saved - resharded
    kept = kept_bytes(graph, block, kept_saved, v.states, v.tp, input_bytes)
    kept += sum(kernel_output_bytes(graph.nodes[n]) / v.tp for n in resharded)
    recomputed = _before_last_save(graph, block, [n for n in block.nodes if n not in kept_saved])
    return kept, recomputed


def recompute_collectives(v: TPVariant) -> list[tuple[str, float]]:
    """(kind, whole buffer bytes per traced micro-batch) of the collectives the runtime's
    selective recompute adds to a variant's backward: a sequence-parallel block's checkpoint
    all-gathers the input's shards back into the replicated input its recompute re-enters the
    block with. (The column-parallel modules' all-gathers it re-runs stand in for the
    backward's own gathers of their inputs, which ``comm_bwd`` prices; the reduce-scatters'
    outputs are kept, so none is re-run.) A block that takes the stream's shard
    (``TPVariant.takes_sequence_shard``) is entered with it and re-run from it: no gather."""
    if not is_sequence_parallel(v) or v.takes_sequence_shard:
        return []
    return [("all_gather", float(v.input_bytes * v.tp))]


def selective_ops(graph, block: Block, training: Training) -> tuple[set[str], list[str]] | None:
    """(ops whose outputs the policy saves, ops it re-runs) of ``selective_kept``'s policy, or
    None for "core": what does not depend on a TP variant, found once per block."""
    if training.selective_policy == SelectivePolicy.CORE:
        return None
    if training.selective_policy == SelectivePolicy.RUNTIME_OP:
        saved = _runtime_saved(graph, block, training)
    elif training.selective_policy == SelectivePolicy.TORCHTITAN_OP:
        saved = _torchtitan_saved(graph, block, training)
    else:
        raise ValueError(f"unknown selective recompute policy {training.selective_policy!r}")
    recomputed = [n for n in block.nodes if n not in saved]
    if training.selective_policy == SelectivePolicy.RUNTIME_OP:
        recomputed = _before_last_save(graph, block, recomputed)
    return saved, recomputed


def kept_bytes(
    graph,
    block: Block,
    saved: set[str],
    states: dict | None = None,
    tp: int = 1,
    input_bytes: float | None = None,
) -> float:
    """The block's input (``input_bytes`` where it is not the traced block's) and the
    ``saved`` ops' kernel outputs, on one rank of a variant with ``states`` and degree ``tp``
    (see ``runtime_selective``)."""
    states = states or {}
    held = float(block.input_bytes) if input_bytes is None else input_bytes
    return held + sum(
        kernel_output_bytes(graph.nodes[n]) / (tp if states.get(n, "R")[0] == "S" else 1)
        for n in saved
    )


def _before_last_save(graph, block: Block, recomputed: list[str]) -> list[str]:
    """The recomputed ops the recompute reaches: torch's non-reentrant checkpoint stops
    re-running the block once every tensor the forward saved for backward is saved again
    (``torch.utils.checkpoint``'s early stop), so the ops after the block's last saving op (an
    op keeping a traced tensor or a parameter: the final residual add) are not re-run, nor
    that op itself unless it keeps its own output: autograd saves an op's inputs before
    running it (a last product, keeping its input and weight, stops the recompute before it)."""
    last, own = -1, False
    for i, n in enumerate(block.nodes):
        d = graph.nodes[n]
        if d["saved"] or d.get("params"):
            last, own = i, any(name == n for name, _ in d["saved"])
    position = {n: i for i, n in enumerate(block.nodes)}
    return [n for n in recomputed if position[n] < last or (position[n] == last and own)]


def kernel_output_bytes(d: dict) -> int:
    """Bytes a saved op's kernel returns: its output, and for a fused attention kernel (flash,
    memory-efficient, cuDNN) also its fp32 log-sum-exp per head and query."""
    from planner.trace.opcost import ATTENTION_OPS

    if d["op"] not in ATTENTION_OPS:
        return d["out_bytes"]
    shape = d["shapes"][0] or []
    lse = math.prod(shape[:-1]) * FP32_BYTES if len(shape) >= 2 else 0
    return d["out_bytes"] + lse


def _is_fp8_product(d: dict, training: Training) -> bool:
    """A weight product that FP8 linears run as ``aten._scaled_mm``."""
    from planner.trace.opcost import MATMUL_OPS

    return training.fp8_linears and d["op"] in MATMUL_OPS and bool(d.get("params"))


def _runtime_saved(graph, block: Block, training: Training) -> set[str]:
    """The block's ops whose outputs meshplan's runtime's policy must-saves."""
    from planner.checkpoint_policy import saved_op_names

    names = saved_op_names()
    return {
        n
        for n in block.nodes
        if graph.nodes[n]["op"] in names and not _is_fp8_product(graph.nodes[n], training)
    }


def _torchtitan_saved(graph, block: Block, training: Training) -> set[str]:
    """The block's ops whose outputs torchtitan's per-op policy must-saves: the attention
    kernels and the 1st, 3rd, ... weight products."""
    from planner.trace.opcost import ATTENTION_OPS, MATMUL_OPS

    saved: set[str] = set()
    products = 0
    for n in block.nodes:
        d = graph.nodes[n]
        if d["op"] in ATTENTION_OPS:
            saved.add(n)
        elif d["op"] in MATMUL_OPS and d.get("params") and not _is_fp8_product(d, training):
            products += 1
            if products % 2 == 1:
                saved.add(n)
    return saved


def expert_nodes(graph, block: Block) -> list[str]:
    """The block's ops that run inside its expert modules (their compute scales with the
    routed rows each expert rank receives)."""
    from planner.trace.blocks import in_modules

    mods = block.extra.get("moe", {}).get("modules", [])
    return [n for n in block.nodes if in_modules(graph.nodes[n]["module"], mods)]


def dispatch_bytes(moe: dict, scale: float, training: Training) -> float:
    """One rank's buffer of one expert-parallel all-to-all (a dispatch or a combine, in one
    pass): its routed rows (tokens x top-k, times the capacity factor and, under expert
    parallelism, the imbalance) x width x activation bytes. The ring formula sends
    (ep - 1)/ep of it to other ranks: Switch Transformer Sec. 5.4's E * C * d per direction,
    C the per-expert capacity."""
    act = 2 if training.mixed else 4
    rows = moe["routed_rows"] * scale * training.moe_capacity_factor * training.moe_imbalance
    return rows * moe["width"] * act
