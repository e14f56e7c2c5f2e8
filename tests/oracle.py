"""The oracle: the training loop every plan must reproduce, in one process, fp32, on the CPU.

Same seed, same ``build_model`` call, same batches (see ``runtime.batching``), the step loss is
the mean of the loss over equal-sized micro-batches, and the optimizer is the plan's, so any
parallel plan's per-step losses and final parameters must match these up to floating-point
reassociation.

Losses alone cannot tell training from not training: on the tiny language models' random
tokens five steps move the loss by well under 1%, and AdamW hides any constant factor on a
gradient. So the oracle also keeps every parameter before and after, and what a plan ends with
is compared tensor by tensor, with a tolerance scaled to how far that tensor moved
(``parameter_mismatches``), after checking that every tensor that receives a gradient moved
far beyond that tolerance (``unmoved_parameters``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils._pytree import tree_map

from planner.modelfile import load_model_file, parameter_names
from runtime.batching import micro_batches
from runtime.optim import make_optimizer

# |theta_plan - theta_ref| <= RTOL * |theta_ref - theta_0| + ATOL * sqrt(numel), per tensor
# (Frobenius norms): the relative term absorbs reassociation, the absolute one only what
# does not move at all (buffers, untrained rows).
PARAM_RTOL = 1e-3
PARAM_ATOL = 1e-7
# Every tensor that receives a gradient must move by this many times its own tolerance, so a
# frozen tensor, or one trained with a gradient off by a constant factor, cannot pass.
MOVES_BY = 100.0


@dataclass
class Reference:
    losses: list[float]
    initial: dict[str, torch.Tensor]  # state_dict before step 1 (tied aliases included)
    final: dict[str, torch.Tensor]  # and after the last step
    trained: set[str] = field(default_factory=set)  # names that receive a gradient (below)
    # How far AdamW may move a tensor that receives no gradient (its update normalises
    # rounding noise to about lr per element per step): steps * lr; 0 for SGD.
    noise_step: float = 0.0
    parameters: set[str] = field(default_factory=set)  # every parameter name (not buffers)


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread inside, as each rank of a launch runs (``runtime.launch.worker_env``
    sets OMP_NUM_THREADS=1). A tiny model gains nothing from a second thread, and beside a
    launch's ranks (or another pytest-xdist worker) on 2 cores the OpenMP threads spin-wait for
    each other: the oracle's 54 references took 170 s of CPU on 2 threads, 9 s on one (a
    machine loaded by other jobs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict(keep_vars=False).items()}


@one_thread()
def reference_run(
    model_path: str | Path,
    model_args: dict[str, Any],
    *,
    steps: int,
    global_batch_size: int,
    micro_batch_size: int,
    optimizer: str = "adamw",
    lr: float = 3e-4,
    seed: int = 0,
    synchronized_replicas: int = 1,
    gathered_replicas: int = 1,
) -> Reference:
    """One-process training, steps 1..``steps``: losses, and the state before and after.

    ``synchronized_replicas``: a model with BatchNorm whose statistics a plan synchronizes
    over that many replicas normalises each of their micro-batch rounds together: here the
    rounds' rows, gathered from every replica's slice, form one micro-batch."""
    mf = load_model_file(model_path, model_args)
    torch.manual_seed(seed)
    model = mf.build()
    model.train()
    rounds = 1
    if any(isinstance(m, _BatchNorm) for m in model.modules()):
        rounds = synchronized_replicas
    if mf.loss_gathers:
        rounds = gathered_replicas
    initial = _snapshot(model)
    params = dict(model.named_parameters())
    aliases = {id(params[first]): names for first, names in parameter_names(model).items()}
    opt = make_optimizer(model.parameters(), optimizer, lr)
    losses, trained = [], set()
    for step in range(1, steps + 1):
        batch = _by_rounds(mf.batch(global_batch_size, step=step), global_batch_size, rounds,
                           micro_batch_size)  # fmt: skip
        chunks = micro_batches(batch, global_batch_size, micro_batch_size * rounds)
        total = 0.0
        for inputs, targets in chunks:
            loss = mf.loss(model(*inputs), targets)
            (loss / len(chunks)).backward()
            total += loss.item()
        trained.update(_receiving_gradient(model, aliases))
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total / len(chunks))
    noise = steps * lr if optimizer == "adamw" else 0.0
    names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    return Reference(losses, initial, _snapshot(model), trained, noise, names)


def _by_rounds(batch: Any, global_batch_size: int, replicas: int, micro_batch_size: int) -> Any:
    """The batch's rows reordered so that micro-batch round j of every replica (contiguous
    slices, ``runtime.batching``) sits together, replica by replica."""
    if replicas == 1:
        return batch
    per = global_batch_size // replicas
    order = torch.tensor([
        r * per + j + i
        for j in range(0, per, micro_batch_size)
        for r in range(replicas)
        for i in range(micro_batch_size)
    ])  # fmt: skip
    return tree_map(lambda t: t[order] if isinstance(t, torch.Tensor) and t.dim() > 0 else t, batch)


def _synchronized_replicas(plan: dict[str, Any]) -> int:
    mesh = plan["mesh"]
    if plan.get("batchnorm", "synchronized") != "synchronized":
        return 1
    return mesh["dp"] * mesh.get("cp", 1)


def reference_key(plan: dict[str, Any]) -> str:
    """Plans with one key share one reference: same model, arguments, batch sizes, optimizer,
    learning rate and BatchNorm rounds."""
    fields = ("global_batch_size", "micro_batch_size", "optimizer", "lr")
    return json.dumps(
        [plan["model"]["file"], plan["model"].get("args", {}), _synchronized_replicas(plan)]
        + [plan.get(f) for f in fields]
        + [_gathered_replicas(plan)]
    )


def _gathered_replicas(plan: dict[str, Any]) -> int:
    """The replicas a ``loss_fn`` taking ``gather`` joins (1 for every other loss)."""
    mf = load_model_file(plan["model"]["file"], plan["model"].get("args", {}))
    return plan["mesh"]["dp"] if mf.has_loss_fn and mf.loss_gathers else 1


def reference_for_plan(plan: dict[str, Any], steps: int, seed: int = 0) -> Reference:
    """The oracle for a plan's model, batch sizes, optimizer and learning rate."""
    return reference_run(
        plan["model"]["file"],
        plan["model"].get("args", {}),
        steps=steps,
        global_batch_size=plan["global_batch_size"],
        micro_batch_size=plan["micro_batch_size"],
        optimizer=plan["optimizer"],
        lr=float(plan.get("lr", 3e-4)),
        seed=seed,
        synchronized_replicas=_synchronized_replicas(plan),
        gathered_replicas=_gathered_replicas(plan),
    )


# A tensor receives a gradient when its gradient's RMS is at least this share of the whole
# model's: an attention key's bias has an exactly zero gradient in exact arithmetic (softmax
# ignores a shift shared by all keys), and rounding leaves ~1e-10 of it.
GRADIENT_SHARE = 1e-6


def _receiving_gradient(model: torch.nn.Module, aliases: dict[int, list[str]]) -> set[str]:
    grads = [  # (a sparse=True embedding's gradient is sparse)
        (p, p.grad.to_dense() if p.grad.is_sparse else p.grad)
        for p in model.parameters()
        if p.grad is not None
    ]
    if not grads:
        return set()
    total = sum(float(g.double().pow(2).sum()) for _, g in grads)
    count = sum(g.numel() for _, g in grads)
    floor = GRADIENT_SHARE * math.sqrt(total / count)
    found: set[str] = set()
    for p, g in grads:
        if float(g.double().pow(2).mean().sqrt()) >= floor:
            found.update(aliases[id(p)])
    return found


def tolerance(ref: Reference, name: str) -> float:
    moved = float(torch.linalg.vector_norm(ref.final[name].double() - ref.initial[name].double()))
    return PARAM_RTOL * moved + PARAM_ATOL * math.sqrt(ref.final[name].numel())


def unmoved_parameters(ref: Reference) -> list[str]:
    """Tensors that received a gradient but moved less than ``MOVES_BY`` times their own
    tolerance: the oracle could not tell a plan that froze them from one that trained them."""
    found = []
    for name in sorted(ref.trained):
        moved = float(
            torch.linalg.vector_norm(ref.final[name].double() - ref.initial[name].double())
        )
        if moved < MOVES_BY * tolerance(ref, name):
            found.append(f"{name}: moved {moved:.3g}, tolerance {tolerance(ref, name):.3g}")
    return found


def parameter_mismatches(got: dict[str, torch.Tensor], ref: Reference) -> list[str]:
    """Every tensor of the one-process state (parameters under each name, persistent buffers)
    that the plan's final state lacks, or holds farther from the reference than its tolerance
    (under AdamW, a parameter that receives no gradient may also move by its noise step)."""
    problems = []
    params = ref.trained | ref.parameters
    for name, want in ref.final.items():
        if name not in got:
            problems.append(f"{name}: missing from the plan's checkpoint")
            continue
        have = got[name]
        if tuple(have.shape) != tuple(want.shape):
            problems.append(f"{name}: shape {tuple(have.shape)}, one process {tuple(want.shape)}")
            continue
        off = float(torch.linalg.vector_norm(have.double() - want.double()))
        tol = tolerance(ref, name)
        if name not in ref.trained and name in params:
            tol += ref.noise_step * math.sqrt(want.numel())
        if not off <= tol:
            problems.append(f"{name}: |plan - one process| = {off:.3g} > tolerance {tol:.3g}")
    return problems


def checkpoint_model_state(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The model part of a distributed checkpoint, as full tensors (read offline: no process
    group; DTensor shards and pipeline stages come back as whole tensors under their paths)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    _load_state_dict(
        state,
        storage_reader=FileSystemReader(str(checkpoint)),
        planner=_EmptyStateDictLoadPlanner(),
        no_dist=True,
    )
    return {k: v for k, v in state["model"].items() if isinstance(v, torch.Tensor)}


def references_for(plan_paths: list[Path], steps: int) -> dict[str, Reference]:
    """One reference per ``reference_key`` among the plans (plans that share it share one)."""
    refs: dict[str, Reference] = {}
    for path in plan_paths:
        plan = json.loads(Path(path).read_text())
        key = reference_key(plan)
        if key not in refs:
            refs[key] = reference_for_plan(plan, steps)
    return refs
