"""What selective recompute keeps: one checkpoint policy, shared by the runtime (which runs it),
calibration (which times its overhead) and the cost model (which prices it from the same op
names), so the three cannot drift apart. The names are plain strings, so the planner reads
them without importing torch (a warm re-plan imports none); the runtime resolves them to
torch's ops when it builds the policy."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, partial
from typing import Any

from planner.vocab import TPStyle

# Selective recompute keeps the outputs of the expensive ops (matrix products, attention) and
# recomputes the cheap element-wise work around them (Korthikanti et al.'s selective recompute),
# named as torch's dispatcher and a trace name them.
SAVED_OP_NAMES = frozenset(
    {
        "aten.mm.default",
        "aten.addmm.default",
        "aten.bmm.default",
        "aten.baddbmm.default",
        "aten._scaled_dot_product_flash_attention.default",
        "aten._scaled_dot_product_efficient_attention.default",
        "aten._scaled_dot_product_cudnn_attention.default",
        # the CPU's flash kernel (CPU/gloo runs keep what a GPU run keeps)
        "aten._scaled_dot_product_flash_attention_for_cpu.default",
    }
)
# Composite ops the trace records as one op (torch.export keeps them above the dispatcher) and
# the kernels each runs as: a weight product as addmm (with a bias) or mm on the flattened
# tokens, a product of activations as mm or bmm, einsum as bmm, attention as the fused kernel
# its device picks (SDPA's flash, memory-efficient or cuDNN kernel on a GPU, flash on a CPU).
COMPOSITE_KERNELS = {
    "aten.linear.default": ("aten.addmm.default", "aten.mm.default"),
    "aten.matmul.default": ("aten.mm.default", "aten.bmm.default"),
    "aten.einsum.default": ("aten.bmm.default",),
    "aten.scaled_dot_product_attention.default": (
        "aten._scaled_dot_product_flash_attention.default",
        "aten._scaled_dot_product_efficient_attention.default",
        "aten._scaled_dot_product_cudnn_attention.default",
        "aten._scaled_dot_product_flash_attention_for_cpu.default",
    ),
}


# Inside a module of these styles (a row-parallel product whose partial sums are
# reduce-scattered to the sequence shard: sequence parallelism) the policy keeps only what the
# reduce-scatter returns, 1/t of the product's partial-sum output (the whole sequence), and
# re-runs the product: at TP t the partial sums would outweigh every other kept tensor.
RESHARDED_STYLES = frozenset({TPStyle.ROWWISE_SP, TPStyle.ROWWISE_SP_TOKENS})
# the functional collective DTensor's redistribution from partial sums to the sequence shard
# runs, as a dispatch-level policy sees it on the local tensors
RESHARD_OP_NAMES = frozenset({"_c10d_functional.reduce_scatter_tensor.default"})


def _ops(names: frozenset[str]) -> frozenset[Any]:
    import torch

    ops = set()
    for name in names:
        namespace, packet, overload = name.split(".")
        ops.add(getattr(getattr(getattr(torch.ops, namespace), packet), overload))
    return frozenset(ops)


@cache
def saved_ops() -> frozenset[Any]:
    """``SAVED_OP_NAMES`` as torch's op overloads (what a dispatch-level policy compares)."""
    return _ops(SAVED_OP_NAMES)


@cache
def reshard_ops() -> frozenset[Any]:
    """``RESHARD_OP_NAMES`` as torch's op overloads."""
    return _ops(RESHARD_OP_NAMES)


def _selective_policy(
    inside_resharded: Callable[[], bool] | None, ctx: Any, op: Any, *args: Any, **kwargs: Any
) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    if inside_resharded is not None and inside_resharded():
        keep = op in reshard_ops()
    else:
        keep = op in saved_ops()
    return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context(inside_resharded: Callable[[], bool] | None = None) -> Any:
    """Torch's selective-checkpoint contexts for the policy. ``inside_resharded``: whether a
    module of ``RESHARDED_STYLES`` is running now (the runtime's hooks on those modules tell)."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(partial(_selective_policy, inside_resharded))


def saved_op_names() -> frozenset[str]:
    """The ops, as a trace names them ("aten.mm.default"), whose outputs the runtime's policy
    keeps: ``SAVED_OP_NAMES`` and each composite of ``COMPOSITE_KERNELS`` that runs as them
    (the planner prices selective recompute from this set, so it follows the policy)."""
    kept = set(SAVED_OP_NAMES)
    kept |= {name for name, kernels in COMPOSITE_KERNELS.items() if set(kernels) <= kept}
    return frozenset(kept)
