"""How a step's global batch is cut up, so every plan and the one-process oracle see the same data.

Step ``k`` (1-based) trains on ``make_batch(global_batch_size, step=k)``. Data-parallel rank ``r``
takes the ``r``-th contiguous slice, and micro-batches are contiguous slices of that; the step
loss is the mean of ``loss_fn`` over all micro-batches of all ranks. With equal-sized
micro-batches this makes the gradient of any plan equal to the one-process gradient, for a loss
that is a mean over samples (the planner checks, ``planner.trace.loss_samples``).
"""

from __future__ import annotations

from typing import Any

import torch

from planner.modelfile import slice_tree


def dp_slice(batch: Any, dp_rank: int, dp: int, global_batch_size: int) -> Any:
    """Data-parallel rank ``dp_rank``'s contiguous share of the global batch."""
    per = global_batch_size // dp
    return slice_tree(batch, dp_rank * per, (dp_rank + 1) * per)


def micro_batches(batch: Any, batch_size: int, micro_batch_size: int) -> list[Any]:
    """Contiguous micro-batches of ``micro_batch_size`` rows each."""
    return [
        slice_tree(batch, i, i + micro_batch_size) for i in range(0, batch_size, micro_batch_size)
    ]


def throughput_unit(inputs: tuple[torch.Tensor, ...]) -> tuple[str, int]:
    """("tokens", tokens per sample) when the first input is integer ids of shape (batch, seq),
    else ("samples", 1): what ``tokens/s`` or ``samples/s`` counts."""
    first = inputs[0]
    if not first.is_floating_point() and first.dim() >= 2:
        return "tokens", int(first.shape[1])
    return "samples", 1
