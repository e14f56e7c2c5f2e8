"""What selective recompute keeps: one checkpoint policy, shared by the runtime (which runs it)
and calibration (which times its overhead), so the two cannot drift apart."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

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
    # the CPU's flash kernel (CPU/gloo runs keep what a GPU run keeps)
    aten._scaled_dot_product_flash_attention_for_cpu.default,
}
# Composite ops the trace records as one op (torch.export keeps them above the dispatcher) and
# the kernels each runs as: a weight product as addmm (with a bias) or mm on the flattened
# tokens, a product of activations as mm or bmm, einsum as bmm, attention as the fused kernel
# its device picks (SDPA's flash, memory-efficient or cuDNN kernel on a GPU, flash on a CPU).
COMPOSITE_KERNELS = {
    "aten.linear.default": (aten.addmm.default, aten.mm.default),
    "aten.matmul.default": (aten.mm.default, aten.bmm.default),
    "aten.einsum.default": (aten.bmm.default,),
    "aten.scaled_dot_product_attention.default": (
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
    ),
}


def _selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context() -> Any:
    return create_selective_checkpoint_contexts(_selective_policy)


def saved_op_names() -> frozenset[str]:
    """The ops, as a trace names them ("aten.mm.default"), whose outputs the runtime's policy
    keeps: those of ``SAVED_OPS`` and each composite of ``COMPOSITE_KERNELS`` that runs as
    them (the planner prices selective recompute from this set, so it follows the policy)."""
    kept = {str(op) for op in SAVED_OPS}
    kept |= {name for name, kernels in COMPOSITE_KERNELS.items() if set(kernels) <= SAVED_OPS}
    return frozenset(kept)
