"""Distributed checkpoints (torch.distributed.checkpoint) that a restarted job resumes from.

Each checkpoint is written to ``step_NNNNNN.tmp`` and renamed to ``step_NNNNNN`` by rank 0 once
every rank has finished, so a directory without the suffix is always complete. Model and
optimizer states are keyed by module path (flattened optimizer state), so stage modules of
different pipeline ranks never collide. ZeRO-1's ZeroRedundancyOptimizer has no distributed
state-dict support; each rank saves its own shard under a key naming its mesh coordinates.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.optim import ZeroRedundancyOptimizer

from runtime.build import Built
from runtime.dtensor_blocks import contiguous_copies, restore_blocks

_DIR = re.compile(r"^step_(\d{6,})$")
_OPTS = StateDictOptions(flatten_optimizer_state_dict=True)


def checkpoint_root(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint (directories still ending in .tmp are ignored)."""
    root = checkpoint_root(run_dir)
    found = []
    if root.is_dir():
        for child in root.iterdir():
            m = _DIR.match(child.name)
            if m and child.is_dir():
                found.append((int(m.group(1)), child))
    return max(found) if found else None


def _zero1(opt: Any) -> bool:
    return isinstance(opt, ZeroRedundancyOptimizer)


def _pairs(built: Built) -> list[tuple[int, Any, Any]]:
    """(index, module part, optimizer) for every optimizer: a part may have two (ZeRO-1 keeps
    expert-parallel experts on a plain optimizer beside its ZeroRedundancyOptimizer)."""
    found = []
    for i, opt in enumerate(built.optimizers):
        ids = {id(p) for g in opt.param_groups for p in g["params"]}
        part = next(m for m in built.parts if any(id(p) in ids for p in m.parameters()))
        found.append((i, part, opt))
    return found


def _zero1_key(built: Built, i: int) -> str:
    pp, dp, tp = built.coords
    cp = f"_cp{built.cp_mesh.get_local_rank()}" if built.cp_mesh is not None else ""
    return f"pp{pp}_dp{dp}{cp}_tp{tp}_part{i}"


def _init_zero1_state(built: Built) -> None:
    """Create the local optimizer's state tensors (a zero-lr step on zero gradients), so that
    loading has tensors to load into."""
    for opt in built.optimizers:
        if not _zero1(opt):
            continue
        inner = opt.optim
        for group in inner.param_groups:
            group["_lr"], group["lr"] = group["lr"], 0.0
            for p in group["params"]:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        inner.step()
        for group in inner.param_groups:
            group["lr"] = group.pop("_lr")
            for p in group["params"]:
                p.grad = None


def _state(built: Built, step: int) -> dict[str, Any]:
    model: dict[str, Any] = {}
    optim: dict[str, Any] = {}
    for part in built.parts:
        model.update(get_model_state_dict(part))
    for first, others in built.aliases.items():  # every name the user's model has for it
        names = (first, *others)
        held = next((n for n in names if n in model), None)
        if held is not None:
            for name in names:
                model.setdefault(name, model[held])
    for i, part, opt in _pairs(built):
        if _zero1(opt):
            optim[_zero1_key(built, i)] = opt.optim.state_dict()
        else:
            optim.update(get_optimizer_state_dict(part, opt, options=_OPTS))
    return {"step": torch.tensor(step), "model": model, "optim": optim}


def save_checkpoint(built: Built, run_dir: Path, step: int) -> Path:
    root = checkpoint_root(run_dir)
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp"
    if dist.get_rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    state = _state(built, step)
    for part in ("model", "optim"):
        contiguous_copies(state[part])
    dcp.save(state, checkpoint_id=str(tmp))
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    dist.barrier()
    return final


def load_checkpoint(built: Built, path: Path) -> int:
    """Load model and optimizer states in place; returns the step the checkpoint was taken at."""
    _init_zero1_state(built)
    state = _state(built, 0)
    blocks = {part: contiguous_copies(state[part]) for part in ("model", "optim")}
    dcp.load(state, checkpoint_id=str(path))
    for part, placements in blocks.items():
        restore_blocks(state[part], placements)
    for part in built.parts:
        names = set(get_model_state_dict(part))
        set_model_state_dict(part, {k: v for k, v in state["model"].items() if k in names})
    for i, part, opt in _pairs(built):
        if _zero1(opt):
            opt.optim.load_state_dict(state["optim"][_zero1_key(built, i)])
        else:
            own = set(get_optimizer_state_dict(part, opt, options=_OPTS))
            set_optimizer_state_dict(
                part, opt, {k: v for k, v in state["optim"].items() if k in own}, options=_OPTS
            )
    return int(state["step"])
