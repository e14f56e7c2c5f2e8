"""What selective recompute keeps: one checkpoint policy, shared by the runtime (which runs it),
calibration (which times its overhead) and the cost model (which prices it from the same op
names), so the three cannot drift apart. The names are plain strings, so the planner reads
them without importing torch (a warm re-plan imports none); the runtime resolves them to
torch's ops when it builds the policy."""

from __future__ import annotations

from functools import cache
from typing import Any

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


@cache
def saved_ops() -> frozenset[Any]:
    """``SAVED_OP_NAMES`` as torch's op overloads (what a dispatch-level policy compares)."""
    import torch

    ops = set()
    for name in SAVED_OP_NAMES:
        namespace, packet, overload = name.split(".")
        ops.add(getattr(getattr(getattr(torch.ops, namespace), packet), overload))
    return frozenset(ops)


def _selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in saved_ops() else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context() -> Any:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_selective_policy)


def saved_op_names() -> frozenset[str]:
    """The ops, as a trace names them ("aten.mm.default"), whose outputs the runtime's policy
    keeps: ``SAVED_OP_NAMES`` and each composite of ``COMPOSITE_KERNELS`` that runs as them
    (the planner prices selective recompute from this set, so it follows the policy)."""
    kept = set(SAVED_OP_NAMES)
    kept |= {name for name, kernels in COMPOSITE_KERNELS.items() if set(kernels) <= kept}
    return frozenset(kept)
