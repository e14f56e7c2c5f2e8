"""Recompute of a sequence-parallel block that keeps what Megatron's layout keeps per TP rank.

Two things would otherwise make a sequence-parallel block's checkpoint keep more than no
recompute at TP 8: the selective policy's saved products include the row-parallel ones, whose
outputs are whole-sequence partial sums (s x h, before their reduce-scatter), and the
checkpoint, entered before the block's slice-at-entry (so that its recompute slices the same
replicated input again), holds that whole replicated input. Here the policy keeps the
reduce-scatter's output instead inside such modules (``track_resharded``), and the checkpoint
holds the input as this rank's sequence shard, gathering it again when its recompute runs
(``checkpoint_holding_shard``): 1/t of both, for one all-gather of the input per recompute
and a re-run of the row-parallel product."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.checkpoint import _checkpoint_without_reentrant_generator

# the sequence dimension of a block's (batch, sequence, ...) activations: the runtime's
# sequence parallelism shards it (``runtime.parallelize.tp_style``, Shard(1))
SEQUENCE_DIM = 1


# how many modules of ``RESHARDED_STYLES`` are running in this process now (one forward runs
# at a time: pipeline schedules run their stages' forwards one after another)
_RESHARDED_RUNNING = [0]


def resharded_running() -> bool:
    """Whether a module ``track_resharded`` hooked is running (the selective policy asks)."""
    return _RESHARDED_RUNNING[0] > 0


def track_resharded(modules: list[nn.Module]) -> None:
    """Hooks on ``modules`` that count them running for ``resharded_running``; registered after
    their TP styles, so that the count lasts until the style's reduce-scatter has run."""

    def enter(_m: nn.Module, _args: tuple) -> None:
        _RESHARDED_RUNNING[0] += 1

    def leave(_m: nn.Module, _args: tuple, _out: Any) -> None:
        _RESHARDED_RUNNING[0] = max(_RESHARDED_RUNNING[0] - 1, 0)

    for module in modules:
        module.register_forward_pre_hook(enter)
        module.register_forward_hook(leave, always_call=True)


def _shardable(x: object, tp: int) -> bool:
    return type(x) is torch.Tensor and x.dim() > SEQUENCE_DIM and x.size(SEQUENCE_DIM) % tp == 0


def checkpoint_holding_shard(
    module: nn.Module, tp_mesh: DeviceMesh, context_fn: Callable[[], tuple] | None = None
) -> None:
    """Non-reentrant checkpointing of ``module`` through its forward hooks, as torch's composable
    ``checkpoint`` does, registered before the module's sequence-parallel styles (the recompute
    enters the slice-at-entry again with the same replicated input, so the ops it re-runs are
    those of the forward, which a selective policy's cache requires), except that it keeps its
    first input, when a whole (batch, sequence, ...) tensor, as this rank's sequence shard and
    all-gathers it over ``tp_mesh`` when the recompute runs (outside the policy's dispatch
    modes: the forward ran no such op). Other inputs are kept as given."""
    tp, rank = tp_mesh.size(), tp_mesh.get_local_rank()
    state: dict[str, Any] = {"generator": None, "recomputing": False}

    def contexts() -> tuple:
        return context_fn() if context_fn is not None else (nullcontext(), nullcontext())

    def rerun(*args: Any, **kwargs: Any) -> Any:
        state["recomputing"] = True
        try:
            return module(*args, **kwargs)
        finally:
            state["recomputing"] = False

    def gathering(requires_grad: bool) -> Callable[..., Any]:
        def rerun_gathered(shard: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            with _disable_current_modes(), torch.no_grad():
                pieces = shard.new_empty((tp * shard.size(0), *shard.shape[1:]))
                torch.distributed.all_gather_into_tensor(
                    pieces, shard.contiguous(), group=tp_mesh.get_group()
                )
                whole = torch.cat(pieces.chunk(tp), dim=SEQUENCE_DIM)
            return rerun(whole.requires_grad_(requires_grad), *args, **kwargs)

        return rerun_gathered

    def pre(_m: nn.Module, args: tuple, kwargs: dict) -> None:
        if state["recomputing"] or not torch.is_grad_enabled():
            return
        if args and _shardable(args[0], tp):
            x = args[0]
            piece = x.detach().chunk(tp, dim=SEQUENCE_DIM)[rank]
            shard = piece.clone(memory_format=torch.contiguous_format)
            fn, held = gathering(x.requires_grad), (shard, *args[1:])
        else:
            fn, held = rerun, args
        generator = _checkpoint_without_reentrant_generator(
            fn, True, contexts, "default", False, True, *held, **kwargs
        )
        next(generator)
        state["generator"] = generator

    def post(_m: nn.Module, _args: tuple, _out: Any) -> None:
        if state["recomputing"]:
            return
        generator, state["generator"] = state["generator"], None
        if generator is None:
            return
        try:
            next(generator)
        except StopIteration:
            return
        raise RuntimeError("the checkpoint of a sequence-parallel block did not close")

    module.register_forward_pre_hook(pre, with_kwargs=True)
    module.register_forward_hook(post, prepend=True, always_call=True)
