"""Run under torchrun (2 ranks, gloo) with LAYER_PLAN=<json: the layer's tp_plan, recompute>: one
rank's view of the example Llama's first layer (``tests/test_selective_runtime.py``'s shapes,
bf16) built as the runtime builds a sequence-parallel block, printing from rank 0 the bytes its
checkpoint keeps after the forward and the ops its backward runs.

What it keeps is counted as ``test_selective_runtime`` counts it on one process: a dispatch mode
outside the layer records every storage its ops create; the storages still alive after the
forward, less the layer's output, are what the checkpoint keeps (its copy of the input
included, which it makes inside the layer's call). What its recompute re-runs is the backward's
ops (name, bytes created), with and without the checkpoint."""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import sys
import weakref
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from test_selective_runtime import ARGS, LAYER, S  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from planner.schema.plan import BlockPlan  # noqa: E402
from runtime.parallelize import apply_recompute, apply_tensor_parallel  # noqa: E402


def _plain(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors holding ``t``'s data (a DTensor's local tensor, a collective's)."""
    if type(t) is torch.Tensor or not hasattr(t, "__tensor_flatten__"):
        return [t]
    names, _ = t.__tensor_flatten__()
    inner = [getattr(t, n) for n in names]
    return [p for i in inner if isinstance(i, torch.Tensor) for p in _plain(i)]


def _storages(tree) -> dict:
    found = {}
    for t in tree_flatten(tree)[0]:
        if isinstance(t, torch.Tensor):
            for p in _plain(t):
                found[p.untyped_storage().data_ptr()] = p.untyped_storage()
    return found


class _Storages(TorchDispatchMode):
    """``test_selective_runtime._Storages`` through tensor subclasses: every op run, its name and
    the bytes of the plain storages it created; while ``keep``, weak references to them."""

    def __init__(self) -> None:
        super().__init__()
        self.keep = True
        self.created: list = []
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = _storages((args, kwargs))
        new = {k: s for k, s in _storages(out).items() if k not in inputs}
        self.ops.append((str(func), sum(s.nbytes() for s in new.values())))
        if self.keep:
            self.created += [(weakref.ref(s), s.nbytes()) for s in new.values()]
        return out


def layer_call(tp_plan: dict, recompute: str, mesh):
    """(the layer's call on this rank's input, that input): built as ``runtime.build`` builds
    a block: checkpoint before the TP styles, the styles, then the rest of the recompute."""
    spec = importlib.util.spec_from_file_location("llama", ROOT / "examples" / "llama.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model = module.build_model(**ARGS["llama"]).to(torch.bfloat16).train()
    fqn = LAYER["llama"]
    block = BlockPlan(
        name=fqn, modules=[fqn], stage=0, recompute=recompute, offload="none", tp_plan=tp_plan
    )
    apply_recompute(model, [block], before_tp=True, tp_mesh=mesh)
    apply_tensor_parallel(model, [block], mesh)
    apply_recompute(model, [block])
    layer = model.get_submodule(fqn)
    torch.manual_seed(1)  # the same replicated input on every rank
    x = torch.randn(1, S, ARGS["llama"]["hidden"], dtype=torch.bfloat16, requires_grad=True)
    positions = model.model.rotary_emb(x, torch.arange(S)[None])
    return lambda: layer(x, attention_mask=None, position_embeddings=positions)


def held_bytes(tp_plan: dict, recompute: str, mesh) -> int:
    call = layer_call(tp_plan, recompute, mesh)
    seen = _Storages()
    with seen:
        y = call()
    gc.collect()
    alive = {id(r()): b for r, b in seen.created if r() is not None}
    return sum(alive.values()) - sum(s.nbytes() for s in _storages(y).values())


def backward_ops(tp_plan: dict, recompute: str, mesh) -> list:
    y = layer_call(tp_plan, recompute, mesh)()
    seen = _Storages()
    with seen:
        y.backward(torch.ones_like(y))
    return seen.ops


def main() -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))["tp"]
    spec = json.loads(os.environ["LAYER_PLAN"])
    tp_plan, recompute = spec["tp_plan"], spec["recompute"]
    found = {
        "held": held_bytes(tp_plan, recompute, mesh),
        "held_none": held_bytes(tp_plan, "none", mesh),
        "backward": backward_ops(tp_plan, recompute, mesh),
        "backward_none": backward_ops(tp_plan, "none", mesh),
    }
    if dist.get_rank() == 0:
        print(json.dumps(found), flush=True)
    dist.barrier()
    os._exit(0)  # (see sp_regather.py: gloo's threads can abort a process on its way out)


if __name__ == "__main__":
    main()
