"""BatchNorm statistics under data parallelism.

Each replica sees a share of the batch, so a plain ``BatchNorm`` normalises with statistics of
that share and each replica moves its running statistics its own way: a different model than
one process trains. A plan's ``batchnorm`` field says which the run does:

* ``synchronized`` (the default): mean and variance over the replicas' micro-batches together,
  as one process would compute them over their union. On GPUs that is torch's
  ``nn.SyncBatchNorm``; torch's refuses CPU tensors, so there the same arithmetic runs through
  ``torch.distributed.nn``'s differentiable all-reduce (two collectives of 2C + 1 numbers per
  layer and micro-batch in forward, one in backward).
* ``per_replica``: every replica keeps its own statistics, as plain DDP does; cheaper, and a
  different model (rank 0's running statistics are the ones checkpointed).

A pipeline normalises each micro-batch by itself under either, as every pipeline does: a
stage never sees the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.nn.functional import all_reduce
from torch.nn.modules.batchnorm import _BatchNorm


class GroupBatchNorm(_BatchNorm):
    """A BatchNorm whose training statistics are summed over ``group`` (CPU-capable)."""

    def __init__(self, source: _BatchNorm, group: dist.ProcessGroup) -> None:
        super().__init__(
            source.num_features,
            source.eps,
            source.momentum,
            source.affine,
            source.track_running_stats,
            device="meta",
        )
        # the source's own tensors, so parameter identity (optimizers, ties) is kept
        self.weight, self.bias = source.weight, source.bias
        self.running_mean = source.running_mean
        self.running_var = source.running_var
        self.num_batches_tracked = source.num_batches_tracked
        self.training = source.training
        self.group = group

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {x.dim()}D input)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)  # as torch's BatchNorm does in both modes
        if not self.training:
            return super().forward(x)
        c = x.size(1)
        dims = [0, *range(2, x.dim())]
        shape = [1, c] + [1] * (x.dim() - 2)
        # two passes (sum, then squared deviations) for one process's rounding, not E[x^2]-E[x]^2
        first = all_reduce(
            torch.cat([x.sum(dims), x.new_tensor([x.numel() // c])]), group=self.group
        )
        count = first[c]
        mean = first[:c] / count
        centred = x - mean.view(shape)
        var = all_reduce(centred.pow(2).sum(dims), group=self.group) / count
        y = centred * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        if self.track_running_stats and self.running_mean is not None:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                momentum = (
                    self.momentum
                    if self.momentum is not None
                    else 1.0 / float(self.num_batches_tracked)
                )
                unbiased = var * (count / (count - 1))
                self.running_mean.lerp_(mean, momentum)
                self.running_var.lerp_(unbiased, momentum)
        return y


def synchronize_batchnorm(root: nn.Module, group: dist.ProcessGroup, device: torch.device) -> None:
    """Replace every BatchNorm below ``root`` by one that sums its statistics over ``group``;
    module paths and tensors stay."""
    found = [
        (name, m)
        for name, m in root.named_modules()
        if name
        and isinstance(m, _BatchNorm)
        and not isinstance(m, (nn.SyncBatchNorm, GroupBatchNorm))
    ]
    for name, m in found:
        if device.type == "cpu":
            new: nn.Module = GroupBatchNorm(m, group)
        else:
            new = nn.SyncBatchNorm.convert_sync_batchnorm(m, process_group=group)
        parent_path, _, attr = name.rpartition(".")
        setattr(root.get_submodule(parent_path) if parent_path else root, attr, new)


def _tracked(module: nn.Module) -> list[_BatchNorm]:
    return [
        m
        for m in module.modules()
        if isinstance(m, _BatchNorm) and m.training and m.running_mean is not None
    ]


@contextmanager
def _statistics_kept(module: nn.Module) -> Iterator[None]:
    """The BatchNorms' running statistics as they were before: a recompute runs the forward
    again, and a BatchNorm in training mode would move its running mean and variance (and
    its batch count) a second time for the same batch, unlike one process."""
    norms = _tracked(module)
    saved = [
        (m.running_mean.clone(), m.running_var.clone(), m.num_batches_tracked.clone())
        for m in norms
    ]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, (mean, var, count) in zip(norms, saved):
                m.running_mean.copy_(mean)
                m.running_var.copy_(var)
                m.num_batches_tracked.copy_(count)


def recompute_context(
    module: nn.Module, inner: Callable[[], tuple[Any, Any]] | None = None
) -> Callable[[], tuple[Any, Any]] | None:
    """A checkpoint ``context_fn`` for ``module``: ``inner``'s contexts (selective recompute's
    policy), with the recompute keeping the running statistics of the BatchNorms below
    ``module`` (looked up when it runs: synchronized ones are swapped in after the
    checkpoint). ``inner`` itself where the module holds no BatchNorm."""
    if not any(isinstance(m, _BatchNorm) for m in module.modules()):
        return inner

    def contexts() -> tuple[Any, Any]:
        forward, recompute = inner() if inner else (nullcontext(), nullcontext())
        return forward, _both(recompute, _statistics_kept(module))

    return contexts


@contextmanager
def _both(first: Any, second: Any) -> Iterator[None]:
    with first, second:
        yield
