"""The training loop of one plan on this rank, defined to match one-process training
(``reference_run`` in tests/oracle.py).

Step k trains on ``make_batch(global_batch_size, step=k)``; DP rank r takes its contiguous slice
and splits it into contiguous micro-batches; the step loss is the mean of the loss over all
micro-batches of all ranks. Without pipelining the micro-batches run one after another with
gradient accumulation (each loss scaled by 1/m); with it the plan's schedule runs them (and
scales gradients by 1/m itself). Data parallelism averages over ranks.
"""

from __future__ import annotations

import contextlib
import faulthandler
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from planner.errors import MeshplanError
from planner.modelfile import ModelFile
from planner.progress import Bars
from planner.schema import Plan
from runtime.batching import micro_batches, replica_share, throughput_unit
from runtime.build import Built, RuntimeCache, build, release
from runtime.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from runtime.dtensor_blocks import backward_replication
from runtime.metrics import (
    append_metrics,
    format_step,
    peak_memory_bytes,
    peak_reserved_bytes,
    start_metrics,
)
from runtime.parallelize import gradient_sync


class LossNotFinite(MeshplanError):
    """Training diverged: the message says at which step and what to try."""

    exit_code = 3


def _to(obj: Any, device: torch.device) -> Any:
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, obj)


def _local_step(built: Built, mf: ModelFile, step: int, device: torch.device) -> float | None:
    """Forward and backward of this rank's share of step ``step``; its mean micro-batch loss
    when this rank computes losses (the last pipeline stage), else None."""
    plan = built.plan
    pp_rank = built.coords[0]
    local, mbs = plan.stages_of(pp_rank)[0].local_batch_size, plan.micro_batch_size
    share = replica_share(mf.batch(plan.global_batch_size, step=step), plan, dist.get_rank())
    inputs, targets = _to(share, device)
    if built.schedule is None:
        chunks = micro_batches((inputs, targets), local, mbs)
        model, total = built.parts[0], None
        for j, (x, y) in enumerate(chunks):
            gradient_sync(built.parts, j == len(chunks) - 1)
            with _sequence_share(built, x, y) as (x, kwargs, y):
                with _autocast(built, device):
                    loss = mf.loss(model(*x, **kwargs), y, built.gather)
                with backward_replication(plan):
                    (loss / len(chunks)).backward()
            # Summed on the device: an .item() per micro-batch would make the host wait for
            # the GPU each time, and the next micro-batch's kernels start only once it has
            # queued them again.
            total = loss.detach() if total is None else total + loss.detach()
        return float(total) / len(chunks)
    losses: list[torch.Tensor] = []
    args = inputs if built.holds_first else ()
    kwargs: dict[str, Any] = {}
    if built.holds_last:
        kwargs = {"target": targets, "losses": losses}
    with backward_replication(plan):  # the schedule runs the backward inside its step
        built.schedule.step(*args, **kwargs)
    if built.holds_last:
        return sum(float(v.detach()) for v in losses) / len(losses)
    return None


def _autocast(built: Built, device: torch.device):
    """The forward and the loss under torch.autocast where the model's wrapper casts nothing
    (``runtime.parallelize.ddp_autocast_dtype``); backward follows the dtypes it recorded."""
    if built.autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=built.autocast)


@contextlib.contextmanager
def _sequence_share(built: Built, x: tuple, y: Any):
    """This rank's share of a micro-batch: all of it, or under context parallelism its chunk
    of every sequence (with positions) while attention runs as a ring."""
    if built.cp_mesh is None:
        yield x, {}, y
        return
    from runtime.context_parallel import sequence_chunks

    with sequence_chunks(built.cp_mesh, x, y) as share:
        yield share


def _optimizer_step(built: Built) -> None:
    built.sync_gradients()
    for opt in built.optimizers:
        opt.step()
        opt.zero_grad(set_to_none=True)


def arm_watchdog(seconds: float) -> None:
    """Dump every thread's stack and exit if the next step takes longer than ``seconds``
    (0: off). Re-armed after each step: a hung collective ends the run with the place it hung,
    where torch.distributed would wait for its own much longer timeout."""
    if seconds > 0:
        faulthandler.dump_traceback_later(seconds, exit=True)


def train_plan(
    plan: Plan,
    mf: ModelFile,
    device: torch.device,
    *,
    steps: int,
    seed: int,
    run_dir: Path,
    checkpoint_every: int = 0,
    resume: bool = False,
    hang_timeout_s: float = 0.0,
    cache: RuntimeCache | None = None,
) -> list[float]:
    """Train ``steps`` steps (or the rest of them after a checkpoint); every rank returns the
    same per-step losses, and rank 0 logs them to the terminal and ``run_dir/metrics.jsonl``.

    Long because the loop, its checkpoints, metrics and restart share the step's state."""
    rank, world = dist.get_rank(), dist.get_world_size()
    arm_watchdog(hang_timeout_s)
    built = build(plan, mf, device, seed, cache)
    start = 0
    found = latest_checkpoint(run_dir) if resume else None
    if found is not None:
        start = load_checkpoint(built, found[1])
    metrics_path = run_dir / "metrics.jsonl"
    if rank == 0:
        start_metrics(metrics_path, start)
        for note in built.notes:
            print(f"note: {note}", flush=True)
        if found is not None:
            print(f"resuming from {found[1]} (step {start})", flush=True)
    unit, per_sample = throughput_unit(mf.batch(1, step=0)[0])
    losses: list[float] = []
    pp_i, _, tp_i = built.coords
    # every context-parallel rank holds the loss of its chunk: the mean of the dp * cp shares
    # (of the last stage's replicas: stages may differ in DP degree, Mesh.stage_dp)
    replicas = plan.mesh.replicas_of(plan.mesh.pp - 1)
    # Tests pace a run with a pause after each step, so a fault can be injected mid-run.
    if device.type == "cuda":
        # one launch trains several plans in turn: each plan's peak is its own
        torch.cuda.reset_peak_memory_stats(device)
    # rank 0 draws a bar where it may (planner.progress), else prints a line per step
    bars = Bars(quiet=rank != 0).__enter__()
    bar = bars.task("training", total=steps)
    bar.update(completed=start)
    for step in range(start + 1, steps + 1):
        t0 = time.perf_counter()
        local = _local_step(built, mf, step, device)
        _optimizer_step(built)
        # One all-reduce carries the loss (from one TP rank of each DP replica of the last
        # stage, pre-divided by dp) and every rank's peak memory in its own slot.
        vec = torch.zeros(1 + 2 * world, dtype=torch.float64, device=device)
        if local is not None and tp_i == 0:
            vec[0] = local / replicas
        vec[1 + rank] = peak_memory_bytes(device)
        vec[1 + world + rank] = peak_reserved_bytes(device)
        dist.all_reduce(vec)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the step's kernels, not only their launches
        elapsed = time.perf_counter() - t0
        loss = float(vec[0])
        if not math.isfinite(loss):
            raise LossNotFinite(
                f"loss became {loss} at step {step}: lower the learning rate "
                "or check the model's numerics"
            )
        losses.append(loss)
        rate = plan.global_batch_size * per_sample / elapsed
        record = {
            "step": step,
            "loss": loss,
            "step_time_s": elapsed,
            f"{unit}_per_s": rate,
            "peak_memory_bytes": [int(v) for v in vec[1 : 1 + world].tolist()],
        }
        if device.type == "cuda":
            record["peak_reserved_bytes"] = [int(v) for v in vec[1 + world :].tolist()]
        if rank == 0:
            append_metrics(metrics_path, record)
            bar.update(completed=step, info=f"loss {loss:.6f} · {elapsed:.3f} s/step")
            if step == steps:
                bars.__exit__()  # the bar goes; the last step's line stays
            if not bars.enabled or step == steps:
                print(format_step(record, steps), flush=True)
        if checkpoint_every and step % checkpoint_every == 0:
            where = save_checkpoint(built, run_dir, step)
            if rank == 0:
                print(f"checkpoint {where}", flush=True)
        arm_watchdog(hang_timeout_s)
    faulthandler.cancel_dump_traceback_later()
    release(built)  # only on success: after an error, other ranks may be mid-collective
    del pp_i
    return losses
