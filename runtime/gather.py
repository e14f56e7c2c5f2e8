"""``gather``: a loss over the whole batch (in-batch negatives) kept exact under data
parallelism, where the model file's ``loss_fn`` asks for it.

A contrastive loss compares each sample with every other one of its batch; a data-parallel
replica alone sees only its share, so its loss is another one (the planner notes this and
offers the pin that keeps one process's loss). A ``loss_fn(outputs, targets, gather)`` gets
``gather(t)``: ``t``'s rows of every replica, concatenated in replica order (the global
batch's order), as open_clip gathers image and text features. Every replica then computes
the same loss, over the whole batch.

Gradients: the backward of ``gather`` sums the gradient every replica computed for the
gathered tensor and keeps this replica's rows. Every replica's loss is the same L, so that is
``dp`` times dL/d(own rows); the data-parallel wrappers average over ``dp`` replicas, which
leaves sum over replicas of dL/d(rows) d(rows)/d(theta) = dL/d(theta), one process's gradient.
A tensor outside the gather (a logit scale) gets dL/d(scale) on every replica, averaged to
itself. So with one micro-batch per replica, a plan trains on one process's loss of the whole
batch; with several, ``gather`` joins the replicas' j-th micro-batches (the oracle's rounds).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:  # noqa: ANN001
        ctx.group, ctx.rows = group, t.shape[0]
        ctx.rank = dist.get_rank(group)
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, t.contiguous(), group=group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        total = grad.contiguous().clone()
        dist.all_reduce(total, group=ctx.group)
        return total[ctx.rank * ctx.rows : (ctx.rank + 1) * ctx.rows], None


def batch_gather(group: dist.ProcessGroup) -> Callable[[torch.Tensor], torch.Tensor]:
    """``gather`` over the data-parallel replicas of ``group`` (see the module docstring)."""

    def gather(t: torch.Tensor) -> torch.Tensor:
        return _GatherRows.apply(t, group)

    return gather
