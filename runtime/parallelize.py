"""Apply a plan's per-block choices to a module with torch.distributed's own implementations.

The same functions serve the whole model (pp == 1) and one pipeline stage module (pp > 1):
pipeline stage modules keep the model's module paths, so the plan's FQNs address both. The
order is torchtitan's: tensor parallel, then activation checkpointing, then data parallel.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed._composable import checkpoint as composable_checkpoint
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from planner.errors import UserInputError

aten = torch.ops.aten
# Selective recompute keeps the outputs of the expensive ops (matrix products, attention) and
# recomputes the cheap element-wise work around them (Korthikanti et al.'s selective recompute).
SAVED_OPS = {
    aten.mm.default,
    aten.addmm.default,
    aten.bmm.default,
    aten.baddbmm.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
}
HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


def find_module(root: nn.Module, fqn: str) -> nn.Module | None:
    try:
        return root.get_submodule(fqn)
    except AttributeError:
        return None


def tp_style(module: nn.Module, style: str, fqn: str, traced_parent: bool = False) -> ParallelStyle:
    """The plan's style name for one nn.Linear / nn.Embedding as a torch ParallelStyle.

    ``traced_parent``: the code around this module is a traced pipeline-stage graph, whose
    shapes were fixed at trace time (HF Llama's ``repeat_kv`` expands to the traced head
    count), so it cannot consume a local shard: a "colwise" output is gathered right away and
    a "rowwise" module takes a replicated input and shards it itself. Same numbers, more
    communication than the plan priced."""
    if not isinstance(module, (nn.Linear, nn.Embedding)):
        raise UserInputError(
            f"plan shards {fqn} ({type(module).__name__}) with tensor parallelism, but only "
            "nn.Linear and nn.Embedding can be sharded: plan again with --tp 1"
        )
    if style == "colwise" and not traced_parent:
        return ColwiseParallel()
    if style in ("colwise", "colwise_gather"):
        return ColwiseParallel(output_layouts=Replicate())
    if isinstance(module, nn.Embedding) or traced_parent:
        # rowwise: an embedding's vocabulary split (ids arrive replicated), or see above
        return RowwiseParallel(input_layouts=Replicate())
    return RowwiseParallel()


def _is_traced(module: nn.Module) -> bool:
    from torch.export.unflatten import InterpreterModule

    return isinstance(module, (InterpreterModule, torch.fx.GraphModule))


def apply_tensor_parallel(root: nn.Module, blocks: list[dict], tp_mesh: DeviceMesh) -> list[str]:
    """parallelize_module with every tp_plan entry whose module lives in ``root``; returns the
    paths whose sharded output had to be gathered because traced code consumes it."""
    if tp_mesh.size() == 1:
        return []
    styles: dict[str, ParallelStyle] = {}
    gathered: list[str] = []
    for block in blocks:
        for fqn, style in block["tp_plan"].items():
            module = find_module(root, fqn)
            if module is None:
                continue
            parent_path = fqn.rpartition(".")[0]
            parent = find_module(root, parent_path) if parent_path else root
            traced = parent is not None and _is_traced(parent) and style != "colwise_gather"
            styles[fqn] = tp_style(module, style, fqn, traced)
            if traced:
                gathered.append(fqn)
    if styles:
        parallelize_module(root, tp_mesh, styles)
    return gathered


def _selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context() -> Any:
    return create_selective_checkpoint_contexts(_selective_policy)


def apply_recompute(root: nn.Module, blocks: list[dict]) -> None:
    """Non-reentrant checkpointing of each module of a recomputed block ("full"), or the same
    with a policy that saves matrix-product outputs ("selective"). The composable ``checkpoint``
    works through hooks, so module paths (and checkpoint keys) do not change."""
    for block in blocks:
        if block["recompute"] == "none":
            continue
        for fqn in block["modules"]:
            module = find_module(root, fqn)
            if module is None:
                continue
            if block["recompute"] == "full":
                composable_checkpoint(module)
            else:
                composable_checkpoint(module, context_fn=selective_context)


def _params_of(modules: list[nn.Module]) -> bool:
    return any(True for m in modules for _ in m.parameters())


def apply_data_parallel(
    root: nn.Module,
    blocks: list[dict],
    plan: dict,
    dp_mesh: DeviceMesh,
    device: torch.device,
) -> nn.Module:
    """ZeRO 0: DDP, or replicate (FSDP2's DDP) with TP, PP or GPU mixed precision;
    1: DDP plus ZeroRedundancyOptimizer; 2: fully_shard per block, parameters kept unsharded
    between forward and backward;
    3: fully_shard per block, resharded after forward. Returns the module to call."""
    zero = plan["zero_stage"]
    on_gpu = device.type == "cuda"
    mp = MixedPrecisionPolicy()
    if on_gpu and plan["dtype"] in HALF:
        mp = MixedPrecisionPolicy(param_dtype=HALF[plan["dtype"]], reduce_dtype=torch.float32)
    has_dtensors = any(isinstance(p, torch.distributed.tensor.DTensor) for p in root.parameters())
    pipelined = plan["mesh"]["pp"] > 1
    if zero == 0 and (has_dtensors or mp.param_dtype is not None or pipelined):
        # DDP can neither hold TP's DTensors nor cast parameters for mixed precision, and a
        # pipeline stage must stay the GraphModule torch's pipelining split out (DDP wraps it).
        return replicate(root, mesh=dp_mesh, mp_policy=mp)
    if zero in (0, 1):
        # Plain DDP otherwise: replicate keeps every parameter as a DTensor, and the optimizer
        # step's per-tensor DTensor dispatch costs several times a plain step on the CPU.
        if zero == 1 and has_dtensors:
            raise UserInputError(
                "ZeRO-1 with tensor parallelism: torch's ZeroRedundancyOptimizer cannot hold "
                "DTensor parameters; plan again with --zero 0, 2 or 3"
            )
        ids = [device.index] if on_gpu else None
        return DistributedDataParallel(root, device_ids=ids, process_group=dp_mesh.get_group())
    reshard = zero == 3
    offloaded = []
    for block in blocks:
        modules = [m for m in (find_module(root, f) for f in block["modules"]) if m is not None]
        modules = [m for m in modules if _params_of([m])]
        if not modules:
            continue
        offload = block["offload"] == "optimizer+params"
        offloaded.append(offload)
        policy = CPUOffloadPolicy(pin_memory=on_gpu) if offload else None
        fully_shard(
            modules if len(modules) > 1 else modules[0],
            mesh=dp_mesh,
            reshard_after_forward=reshard,
            mp_policy=mp,
            **({"offload_policy": policy} if policy else {}),
        )
    root_offload = bool(offloaded) and all(offloaded)
    fully_shard(
        root,
        mesh=dp_mesh,
        reshard_after_forward=reshard,
        mp_policy=mp,
        **({"offload_policy": CPUOffloadPolicy(pin_memory=on_gpu)} if root_offload else {}),
    )
    return root


def make_optimizers(parts: list[nn.Module], plan: dict, dp_mesh: DeviceMesh) -> list:
    """One optimizer per module part; ZeRO-1 shards its states with ZeroRedundancyOptimizer."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from runtime.optim import optimizer_class

    cls = optimizer_class(plan["optimizer"])
    lr = float(plan.get("lr", 3e-4))
    if plan["zero_stage"] == 1:
        return [
            ZeroRedundancyOptimizer(
                list(p.parameters()),
                optimizer_class=cls,
                process_group=dp_mesh.get_group(),
                # One broadcast per bucket after the step, not one per parameter: on gloo each
                # call costs ~0.3 ms, and the cost model prices one all-gather.
                parameters_as_bucket_view=True,
                lr=lr,
            )
            for p in parts
        ]
    return [cls(p.parameters(), lr=lr) for p in parts]


def gradient_sync(parts: list[nn.Module], enabled: bool) -> None:
    """Skip the data-parallel reduction on all but the last micro-batch (pp == 1 only)."""
    from torch.distributed.fsdp import FSDPModule

    for p in parts:
        if isinstance(p, FSDPModule):
            p.set_requires_gradient_sync(enabled)
        elif isinstance(p, DistributedDataParallel):
            p.require_backward_grad_sync = enabled
