"""How a step's global batch is cut up, so every plan and the one-process oracle see the same data.

Step ``k`` (1-based) trains on ``make_batch(global_batch_size, step=k)``. Data-parallel rank ``r``
takes the ``r``-th contiguous slice (or, in a pipeline whose stages differ in DP degree, its
turns of the step's micro-batches: ``replica_share``), and micro-batches are contiguous slices of
that; the step
loss is the mean of ``loss_fn`` over all micro-batches of all ranks. With equal-sized
micro-batches this makes the gradient of any plan equal to the one-process gradient, for a loss
that is a mean over samples (the planner checks, ``planner.trace.loss_samples``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map

from planner.modelfile import slice_tree
from planner.schema import Plan


def dp_slice(batch: Any, dp_rank: int, local_batch_size: int) -> Any:
    """Data-parallel rank ``dp_rank``'s contiguous share of the global batch, ``local_batch_size``
    rows (the plan's ``StagePlan.local_batch_size``)."""
    return slice_tree(batch, dp_rank * local_batch_size, (dp_rank + 1) * local_batch_size)


def replica_share(batch: Any, plan: Plan, rank: int) -> Any:
    """The rows ``rank``'s replica runs, in the order it runs them: its contiguous DP share,
    or, where the stages' DP degrees differ (``Mesh.round_robin``), its turns of the step's
    micro-batches put one after another (the schedule then cuts them back apart). The counts
    are the plan's own (``StagePlan.local_batch_size``, ``num_microbatches``)."""
    mesh, mbs = plan.mesh, plan.micro_batch_size
    pp_i, dp_i, _, _ = mesh.coords(rank)
    stage = plan.stages_of(pp_i)[0]
    if not mesh.round_robin:
        return dp_slice(batch, dp_i, stage.local_batch_size)
    n = stage.num_microbatches * mesh.dp_of(pp_i)  # the step's micro-batches
    rows = [
        r
        for k in range(stage.num_microbatches)
        for g in (mesh.local_micro_batch(rank, k, n),)
        for r in range(g * mbs, (g + 1) * mbs)
    ]
    index = torch.tensor(rows)
    return tree_map(
        lambda t: (
            t.index_select(0, index.to(t.device))
            if isinstance(t, torch.Tensor) and t.dim() > 0
            else t
        ),
        batch,
    )


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
