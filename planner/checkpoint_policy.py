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
}


def _selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context() -> Any:
    return create_selective_checkpoint_contexts(_selective_policy)
