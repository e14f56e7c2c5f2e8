"""Run a recommendation plan with TorchRec: one ParameterSharding per table, then
DistributedModelParallel, trained with TorchRec's fused optimizer for the sharded tables and
the same plain SGD for everything else.

    python -m torch.distributed.run --nproc-per-node N -m runtime.recsys \\
        --plans a.json b.json --run-dirs out/a out/b --steps 5 [--dump-params]

Several plans of one world size run one after another in one launch (the tests launch once per
world size). Weights are those of ``torch.manual_seed(seed); build_model()`` whatever the plan:
DistributedModelParallel initialises its shards itself, so each shard is then overwritten with
its slice of those weights. Step k trains on ``make_batch(global_batch_size, step=k)``, rank r
taking samples [r B/N, (r+1) B/N) — dense tensors, labels and every KeyedJaggedTensor cut at the
same samples — as DistributedModelParallel expects each rank's own batch. TorchRec divides the
sharded tables' gradients by the world size (``comm_ops`` gradient division) and DDP averages
the dense ones, so the step is one process's on the global batch's mean loss.

The optimizer is the plan's. ``sgd``: SGD without momentum; TorchRec's fused ``EXACT_SGD``
updates the looked-up rows in the backward with exactly ``w -= lr * g``, which is what
``torch.optim.SGD`` does to a dense table (rows nobody looked up get a zero gradient and stay),
so one process can check it. ``adamw``: torch's AdamW (its defaults) for the dense part; on a GPU
the tables' fused kernels run fbgemm's Adam with decoupled weight decay, which steps only the
looked-up rows (rows outside the batch keep their moments and weights, unlike torch's AdamW); on
a CPU, where fbgemm fuses no Adam, the plan puts the tables on TorchRec's dense kernel and
torch's AdamW steps their shards, which equals one process's AdamW.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor

from planner.errors import MeshplanError, UserInputError
from planner.modelfile import ModelFile, file_sha256, load_model_file
from planner.recsys.plan import ADAMW, is_recplan, load_recplan
from planner.vocab import DenseStrategy
from runtime.stop import exit_worker


def sharding_generators(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """EBC module path -> table -> TorchRec's ParameterSharding generator for the plan's
    choice (``torchrec.distributed.sharding_plan``'s helpers, ranks as the plan says)."""
    from torchrec.distributed.sharding_plan import (
        column_wise,
        data_parallel,
        row_wise,
        table_row_wise,
        table_wise,
    )

    gpn = int(plan["cluster"]["gpus_per_node"])
    out: dict[str, dict[str, Any]] = {}
    for t in plan["tables"]:
        kind, ranks, kernel = t["sharding"], t["ranks"], t["kernel"]
        if kind == "data_parallel":
            gen = data_parallel()
        elif kind == "table_wise":
            gen = table_wise(rank=ranks[0], compute_kernel=kernel)
        elif kind == "column_wise":
            gen = column_wise(ranks=list(ranks), compute_kernel=kernel)
        elif kind == "row_wise":
            gen = row_wise()
        else:  # table_row_wise: the node holding ranks[0]
            gen = table_row_wise(host_index=ranks[0] // gpn)
        out.setdefault(t["module"], {})[t["name"]] = gen
    return out


def build(plan: dict[str, Any], mf: ModelFile, device: torch.device, seed: int):
    """(DistributedModelParallel, combined optimizer, the one-process initial state)."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan
    from torchrec.distributed.types import CacheParams, ShardingPlan
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    torch.manual_seed(seed)
    model = mf.build()
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    lr = float(plan["lr"])
    sharder = EmbeddingBagCollectionSharder(fused_params=fused_params(plan["optimizer"], lr))
    world = dist.get_world_size()
    local = int(plan["cluster"]["gpus_per_node"])
    modules = dict(model.named_modules())
    sharding = ShardingPlan(
        {
            path: construct_module_sharding_plan(
                modules[path],
                gens,
                sharder=sharder,
                local_size=min(local, world),
                world_size=world,
                device_type=device.type,
            )
            for path, gens in sharding_generators(plan).items()
        }
    )
    for t in plan["tables"]:  # host tables: each its own device cache share (UVM caching)
        if t.get("cache_ratio"):
            sharding.plan[t["module"]][t["name"]].cache_params = CacheParams(
                load_factor=float(t["cache_ratio"])
            )
    strategy = plan.get("dense", {}).get("strategy", DenseStrategy.DDP)
    wrapper = fully_shard_dense() if strategy == DenseStrategy.FSDP else None
    dmp = DistributedModelParallel(
        model, device=device, plan=sharding, sharders=[sharder], data_parallel_wrapper=wrapper
    )
    load_full_state(dmp, initial)
    dense = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    opt = CombinedOptimizer(
        [dmp.fused_optimizer, KeyedOptimizerWrapper(dense, dense_optimizer(plan["optimizer"], lr))]
    )
    return dmp, opt, initial


def fully_shard_dense():
    """ZeRO-3 for the dense part, as a TorchRec ``DataParallelWrapper`` (defined here because its
    base class is TorchRec's, imported only when a plan runs)."""
    from torchrec.distributed.model_parallel import (
        DataParallelWrapper,
        DefaultDataParallelWrapper,
    )
    from torchrec.distributed.types import ShardedModule

    class FullyShardDense(DataParallelWrapper):
        """FSDP2's ``fully_shard`` on every child of the model that holds parameters and is no
        sharded table module (the MLPs), so each rank keeps 1/N of their parameters, gradients
        and optimizer states; what is left unsharded (data-parallel tables) goes to TorchRec's
        usual DDP, told to ignore the FSDP parameters."""

        def wrap(self, dmp, env, device) -> None:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            root = dmp._dmp_wrapped_module
            mesh = init_device_mesh(device.type, (env.world_size,))
            taken: list[str] = []
            for name, child in root.named_children():
                params = [f"{name}.{n}" for n, _ in child.named_parameters()]
                if params and not isinstance(child, ShardedModule):
                    fully_shard(child, mesh=mesh)
                    taken += params
            DefaultDataParallelWrapper(params_to_ignore=taken).wrap(dmp, env, device)

    return FullyShardDense()


def fused_params(optimizer: str, lr: float) -> dict[str, Any]:
    """fbgemm's fused optimizer for the tables on a fused kernel: EXACT_SGD (``w -= lr g``) or
    Adam with decoupled weight decay (AdamW, torch's defaults). fbgemm's fused Adam steps only
    the rows the batch looked up; on a CPU it does not exist, and the plan puts Adam's tables
    on the dense kernel, which ``dense_optimizer`` steps instead."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import WeightDecayMode

    if optimizer == "sgd":
        return {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": lr}
    (beta1, beta2), eps, decay = ADAMW["betas"], ADAMW["eps"], ADAMW["weight_decay"]
    return {"optimizer": EmbOptimType.ADAM, "learning_rate": lr, "beta1": beta1,
            "beta2": beta2, "eps": eps, "weight_decay": decay,
            "weight_decay_mode": WeightDecayMode.DECOUPLE}  # fmt: skip


def dense_optimizer(optimizer: str, lr: float):
    """What steps every parameter outside the fused kernels (dense part, data-parallel
    tables, dense-kernel shards): plain SGD, or torch's AdamW with its defaults."""
    if optimizer == "sgd":
        return lambda ps: torch.optim.SGD(ps, lr=lr)
    return lambda ps: torch.optim.AdamW(ps, lr=lr, **ADAMW)


def _plain(name: str) -> str:
    """A DMP state-dict key as the unwrapped model names it."""
    for prefix in ("_dmp_wrapped_module.", "module."):
        name = name.replace(prefix, "")
    return name


def load_full_state(dmp: torch.nn.Module, full: dict[str, torch.Tensor]) -> None:
    """Copy a one-process state dict into the sharded model: each local shard of a
    ShardedTensor gets its slice, every replicated tensor the whole."""
    with torch.no_grad():
        for key, value in dmp.state_dict().items():
            src = full[_plain(key)]
            if hasattr(value, "local_shards"):
                for shard in value.local_shards():
                    (r0, c0), (nr, nc) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                    shard.tensor.copy_(src[r0 : r0 + nr, c0 : c0 + nc])
            elif isinstance(value, DTensor):  # FSDP2's shard of a dense parameter
                mine = distribute_tensor(src.to(value.device), value.device_mesh, value.placements)
                value.to_local().copy_(mine.to_local())
            else:
                value.copy_(src)


def gather_full_state(dmp: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """The whole state dict on rank 0 (sharded tables gathered), None on the other ranks."""
    rank = dist.get_rank()
    out = {}
    for key, value in dmp.state_dict().items():
        if hasattr(value, "local_shards"):
            full = torch.empty(value.size()) if rank == 0 else None
            value.gather(dst=0, out=full)
            out[_plain(key)] = full
        elif isinstance(value, DTensor):  # every rank takes part in the all-gather
            out[_plain(key)] = value.full_tensor().detach().cpu().clone()
        else:
            out[_plain(key)] = value.detach().cpu().clone()
    return out if rank == 0 else None


def slice_batch(inputs: Any, lo: int, hi: int) -> Any:
    """Samples [lo, hi) of a batch: tensors by their first dimension, KeyedJaggedTensors by
    sample (every key's lengths and the values they cover), tuples element by element."""
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(slice_batch(x, lo, hi) for x in inputs)
    if isinstance(inputs, torch.Tensor):
        return inputs[lo:hi]
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    if isinstance(inputs, KeyedJaggedTensor):
        values, lengths = [], []
        for key in inputs.keys():
            jt = inputs[key]
            offsets = jt.offsets()
            values.append(jt.values()[offsets[lo] : offsets[hi]])
            lengths.append(jt.lengths()[lo:hi])
        return KeyedJaggedTensor.from_lengths_sync(
            keys=inputs.keys(), values=torch.cat(values), lengths=torch.cat(lengths)
        )
    raise UserInputError(f"make_batch returned a {type(inputs).__name__}, which cannot be split")


def _to(inputs: Any, device: torch.device) -> Any:
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(_to(x, device) for x in inputs)
    return inputs.to(device)


def train(plan: dict[str, Any], run_dir: Path, steps: int, seed: int, device: torch.device,
          dump_params: bool = False) -> None:  # fmt: skip
    """Train ``steps`` steps of the plan; metrics.jsonl (and params.pt) under ``run_dir``."""
    mf = load_model_file(plan["model"]["file"], plan["model"].get("args", {}))
    dmp, opt, _ = build(plan, mf, device, seed)
    rank, world = dist.get_rank(), dist.get_world_size()
    gbs = int(plan["global_batch_size"])
    lo, hi = rank * gbs // world, (rank + 1) * gbs // world
    # parameters FSDP2 holds as DTensor shards (0 under DDP): the run's record of its strategy
    sharded_dense = sum(isinstance(p, DTensor) for p in dmp.parameters())
    loss_fn = getattr(mf.module, "loss_fn", None)
    if loss_fn is None:
        raise UserInputError(f"{mf.path.name}: a recommendation model file must define loss_fn")
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "metrics.jsonl").write_text("")
    for step in range(steps):
        start = time.perf_counter()
        inputs, targets = mf.module.make_batch(gbs, step=step)
        inputs = _to(slice_batch(tuple(inputs), lo, hi), device)
        loss = loss_fn(dmp(*inputs), targets[lo:hi].to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if rank == 0:
            record = {"step": step, "loss": mean.item() / world,
                      "step_time_s": time.perf_counter() - start,
                      "sharded_dense_params": sharded_dense}  # fmt: skip
            with open(run_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
            print(f"step {step}: loss {record['loss']:.6f} ({record['step_time_s']:.3f} s)")
    state = gather_full_state(dmp)
    if dump_params and state is not None:
        torch.save(state, run_dir / "params.pt")
    dist.barrier()


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="runtime.recsys")
    p.add_argument("--plans", nargs="+", required=True)
    p.add_argument("--run-dirs", nargs="+", required=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dump-params", action="store_true", help="save params.pt (for tests)")
    opts = p.parse_args(argv)
    if len(opts.plans) != len(opts.run_dirs):
        p.error("--plans and --run-dirs need the same number of entries")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse(sys.argv[1:] if argv is None else argv)
    backend = "nccl" if opts.device == "cuda" else "gloo"
    dist.init_process_group(backend)
    device = torch.device(opts.device)
    if opts.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    try:
        for plan_path, run_dir in zip(opts.plans, opts.run_dirs):
            plan = load_recplan(Path(plan_path))
            train(plan, Path(run_dir), opts.steps, opts.seed, device, opts.dump_params)
        # Every rank leaves together: a rank that tore gloo down while its peer still held the
        # connection aborted at exit ("terminate called without an active exception", once in
        # a CI-like run, after all steps had finished).
        dist.barrier()
    except MeshplanError as exc:
        print(f"plan run: error: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        dist.destroy_process_group()
    return 0


def run_recplan(plan_path: Path, opts: argparse.Namespace) -> int:
    """``plan run`` / ``plan MODEL.py --run`` for a recommendation plan: check it and the
    model file, then start torchrun with this module as the worker."""
    import subprocess

    from planner.device import choose_device
    from runtime.launch import worker_env

    plan = load_recplan(plan_path)
    for flag, value in (("--checkpoint-every", getattr(opts, "checkpoint_every", 0)),
                        ("--resume", getattr(opts, "resume", False)),
                        ("--max-restarts", getattr(opts, "max_restarts", 0)),
                        ("--nnodes", (getattr(opts, "nnodes", 1) or 1) > 1)):  # fmt: skip
        if value:
            raise UserInputError(
                f"{flag} is not supported for recommendation plans yet (no checkpoints or "
                "multi-node launch in runtime/recsys.py): run without it"
            )
    model = Path(plan["model"]["file"])
    if not model.is_file() or file_sha256(model) != plan["model"]["sha256"]:
        raise UserInputError(
            f"model file {model} is missing or changed since plan {plan_path} was made: plan again"
        )
    device = choose_device(getattr(opts, "device", None))
    if device == "cpu" and plan["device"] != "cpu":
        raise UserInputError(
            f"plan {plan_path} was made for GPUs (row-wise and host tables need CUDA): plan "
            "again with --device cpu"
        )
    world = int(plan["cluster"]["gpus"])
    if device == "cuda" and world > torch.cuda.device_count():
        raise UserInputError(f"the plan needs {world} GPUs, this node has "
                             f"{torch.cuda.device_count()}")  # fmt: skip
    run_dir = Path(getattr(opts, "run_dir", None) or Path(plan_path).resolve().parent)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={world}", "-m", "runtime.recsys",
           "--plans", str(Path(plan_path).resolve()), "--run-dirs", str(run_dir.resolve()),
           "--steps", str(opts.steps), "--seed", str(opts.seed), "--device", device]  # fmt: skip
    rc = subprocess.run(cmd, env=worker_env(), check=False).returncode
    if rc != 0:
        print(f"plan run: the workers failed (exit status {rc})", file=sys.stderr)
    else:
        print(f"metrics: {run_dir / 'metrics.jsonl'}")
    return rc


__all__ = ["build", "gather_full_state", "is_recplan", "main", "run_recplan", "slice_batch"]

if __name__ == "__main__":
    exit_worker(main())
