"""The oracle: the training loop every plan must reproduce, in one process, fp32, on the CPU.

Same seed, same ``build_model`` call, same batches (see ``runtime.batching``), the step loss is
the mean of the loss over equal-sized micro-batches, and the optimizer is the plan's, so any
parallel plan's per-step losses must match these up to floating-point reassociation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from planner.modelfile import load_model_file
from runtime.batching import micro_batches
from runtime.optim import make_optimizer


def reference_losses(
    model_path: str | Path,
    model_args: dict[str, Any],
    *,
    steps: int,
    global_batch_size: int,
    micro_batch_size: int,
    optimizer: str = "adamw",
    lr: float = 3e-4,
    seed: int = 0,
) -> list[float]:
    """Per-step losses of one-process training, steps 1..``steps``."""
    mf = load_model_file(model_path, model_args)
    torch.manual_seed(seed)
    model = mf.build()
    model.train()
    opt = make_optimizer(model.parameters(), optimizer, lr)
    losses = []
    for step in range(1, steps + 1):
        batch = mf.batch(global_batch_size, step=step)
        chunks = micro_batches(batch, global_batch_size, micro_batch_size)
        total = 0.0
        for inputs, targets in chunks:
            loss = mf.loss(model(*inputs), targets)
            (loss / len(chunks)).backward()
            total += loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total / len(chunks))
    return losses


def reference_for_plan(plan: dict[str, Any], steps: int, seed: int = 0) -> list[float]:
    """The oracle's losses for a plan's model, batch sizes and optimizer."""
    return reference_losses(
        plan["model"]["file"],
        plan["model"].get("args", {}),
        steps=steps,
        global_batch_size=plan["global_batch_size"],
        micro_batch_size=plan["micro_batch_size"],
        optimizer=plan["optimizer"],
        lr=float(plan.get("lr", 3e-4)),
        seed=seed,
    )
