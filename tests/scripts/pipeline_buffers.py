"""Run under torchrun (2 processes, gloo) with RELEASE=0/1 and M=<micro-batches>: a 2-stage
1F1B pipeline of a small MLP (torch's PipelineStage and Schedule1F1B), two steps, with or
without ``runtime.pipeline_buffers.release_consumed_buffers``. Before and after every
forward and backward of a micro-batch, counts the distinct boundary-sized tensors (one micro-batch's
activation or its gradient, b bytes) the stage's own records hold: receive buffers and their
gradients, the outputs its forward cache keeps for backward, the backward cache.
Prints, from rank 0 as one JSON list by rank, the most each held in the second step (in
units of b) and the losses."""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from runtime.pipeline_buffers import release_consumed_buffers

WIDTH, ROWS = 32, 4


def held_boundaries(stage) -> int:
    """Distinct storages of boundary shape held by the stage's records."""
    seen: set[int] = set()

    def add(t) -> None:
        if isinstance(t, torch.Tensor) and not t.is_meta and t.shape == (ROWS, WIDTH):
            seen.add(t.untyped_storage().data_ptr())
            if t.grad is not None:
                add(t.grad)
        elif isinstance(t, (list, tuple)):
            for x in t:
                add(x)

    for infos in (*stage.args_recv_info.values(), *stage.grad_recv_info.values()):
        for info in infos:
            add(getattr(info, "buffer", None))
    for output, _inputs in stage.fwd_cache.values():  # inputs: received (above) or the model's
        add(output)
    for grads in stage.bwd_cache.values():
        add(grads)
    return len(seen)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    m = int(os.environ["M"])
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(4)]
    part = nn.Sequential(*layers[2 * rank : 2 * rank + 2])
    stage = PipelineStage(part, rank, 2, torch.device("cpu"))
    if os.environ["RELEASE"] == "1":
        release_consumed_buffers(stage)
    peak = [0]
    for name in ("forward_one_chunk", "backward_one_chunk"):
        inner = getattr(stage, name)

        def counted(*args, _inner=inner, **kwargs):
            peak[0] = max(peak[0], held_boundaries(stage))
            out = _inner(*args, **kwargs)
            peak[0] = max(peak[0], held_boundaries(stage))
            return out

        setattr(stage, name, counted)
    schedule = Schedule1F1B(stage, n_microbatches=m, loss_fn=lambda y, t: ((y - t) ** 2).mean())
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _step in range(2):
        x, target = (
            torch.randn(m * ROWS, WIDTH, generator=gen),
            torch.randn(m * ROWS, WIDTH, generator=gen),
        )
        peak[0] = 0
        out: list = []
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=target, losses=out)
            losses.append([float(v) for v in out])
        with torch.no_grad():
            for p in part.parameters():
                p -= 0.1 * p.grad
                p.grad = None
    rows = [None, None]
    dist.all_gather_object(rows, {"rank": rank, "held": peak[0], "losses": losses})
    if rank == 0:  # one line: the two ranks' prints could interleave
        print(json.dumps(rows))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
