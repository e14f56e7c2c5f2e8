"""The recommendation plan (``"schema": "meshplan.recplan/1"``): write it, read it back, check it.

A separate schema from ``meshplan.plan/1`` because its unit is the embedding table, not the
pipeline stage: per table its TorchRec sharding type, compute kernel, ranks and cache ratio
(what the runtime turns into one ``ParameterSharding``), plus the dense part's strategy, the
per-rank prediction and the solver's record. This module imports neither torch nor the
solver, so the runtime reads plans through it.

    {"schema": "meshplan.recplan/1",
     "model": {"file", "sha256", "args", "embedding_params", "dense_params"},
     "cluster": {"profile", "nodes", "gpus_per_node", "gpus"}, "device": "cpu" | "cuda",
     "global_batch_size", "optimizer", "lr", "dtype",
     "dense": {"strategy": "ddp" | "fsdp", "params", "compute_s", "allreduce_exposed_s",
               "collective_latency_s", ...},
     "tables": [{"name", "module", "features", "rows", "dim", "pooling_factor", "zipf",
                 "option", "sharding", "kernel", "ranks", "cache_ratio",
                 "lookup_s", "comm_s", "device_bytes", "host_bytes"}],
     "ranks": [{"rank", "step_s", "lookup_s", "comm_s", "device_bytes", "host_bytes"}],
     "predicted": {"step_time_s", "samples_per_s", "peak_device_bytes", "peak_host_bytes"},
     "solver": {"status", "gap", "solve_time_s", "variables", "objective_s"},
     "notes": [...]}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from planner.atomic import write_text_atomic
from planner.errors import UserInputError
from planner.vocab import DENSE_STRATEGIES, DenseStrategy

SCHEMA = "meshplan.recplan/1"
SHARDINGS = ("data_parallel", "table_wise", "column_wise", "row_wise", "table_row_wise")
KERNELS = ("dense", "fused", "fused_uvm_caching")
# Sharding types TorchRec 1.8 runs on CPU/gloo (row-wise input distribution needs CUDA).
CPU_SHARDINGS = ("data_parallel", "table_wise", "column_wise")
# sgd: fbgemm's fused EXACT_SGD (plain SGD); adamw: fbgemm's fused Adam with decoupled weight
# decay on a GPU, torch's AdamW over TorchRec's dense kernel on a CPU; torch's AdamW defaults.
OPTIMIZERS = ("sgd", "adamw")
# The dense part: DDP, or ZeRO-3 (FSDP2's fully_shard on each MLP beside TorchRec's sharding).
ADAMW = {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}


def write_recplan(plan: dict[str, Any], out_dir: Path) -> Path:
    """plan.json under ``out_dir``, written atomically."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "plan.json"
    write_text_atomic(path, json.dumps(plan, indent=2, sort_keys=False) + "\n")
    return path


def is_recplan(path: Path) -> bool:
    """Whether ``path`` holds a recommendation plan (read cheaply, without validating)."""
    try:
        return json.loads(Path(path).read_text()).get("schema") == SCHEMA
    except (OSError, ValueError, AttributeError):
        return False


def load_recplan(path: Path) -> dict[str, Any]:
    """Read and check a recommendation plan; a problem is a one-line UserInputError."""
    try:
        plan = json.loads(Path(path).read_text())
    except OSError as exc:
        raise UserInputError(f"cannot read plan {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise UserInputError(f"plan {path} is not valid JSON: {exc}") from exc
    check_recplan(plan, str(path))
    return plan


def check_recplan(plan: Any, where: str = "plan") -> None:
    """Every field the runtime reads, with its type and range."""

    def bad(msg: str) -> UserInputError:
        return UserInputError(f"{where}: {msg}; plan again with `plan MODEL.py`")

    if not isinstance(plan, dict) or plan.get("schema") != SCHEMA:
        raise bad(f"schema is not {SCHEMA!r}")
    for key in ("model", "cluster", "tables", "global_batch_size", "lr", "optimizer", "device"):
        if key not in plan:
            raise bad(f"missing {key!r}")
    world = plan["cluster"].get("gpus")
    if not isinstance(world, int) or world < 1:
        raise bad("cluster.gpus must be a positive integer")
    gbs = plan["global_batch_size"]
    if not isinstance(gbs, int) or gbs < 1 or gbs % world:
        raise bad(f"global_batch_size {gbs!r} must be a positive multiple of {world} ranks")
    if plan["optimizer"] not in OPTIMIZERS:
        raise bad(f"optimizer {plan['optimizer']!r} is not one of {OPTIMIZERS}")
    strategy = (plan.get("dense") or {}).get("strategy", DenseStrategy.DDP)
    if strategy not in DENSE_STRATEGIES:
        raise bad(f"dense strategy {strategy!r} is not one of {DENSE_STRATEGIES}")
    names = set()
    for t in plan["tables"]:
        name = t.get("name")
        if name in names:
            raise bad(f"table {name!r} appears twice")
        names.add(name)
        if t.get("sharding") not in SHARDINGS:
            raise bad(f"table {name!r}: sharding {t.get('sharding')!r} is not one of {SHARDINGS}")
        if t.get("kernel") not in KERNELS:
            raise bad(f"table {name!r}: kernel {t.get('kernel')!r} is not one of {KERNELS}")
        ranks = t.get("ranks")
        if (
            not isinstance(ranks, list)
            or not ranks
            or not all(isinstance(r, int) and 0 <= r < world for r in ranks)
        ):
            raise bad(f"table {name!r}: ranks must be a non-empty list of ranks below {world}")
        if plan["device"] == "cpu" and (
            t["sharding"] not in CPU_SHARDINGS or t["kernel"] == "fused_uvm_caching"
        ):
            raise bad(
                f"table {name!r}: {t['sharding']} with kernel {t['kernel']} needs a GPU "
                "(TorchRec runs table-wise, column-wise and data-parallel on CPU)"
            )
        if plan["device"] == "cpu" and plan["optimizer"] == "adamw" and t["kernel"] != "dense":
            raise bad(
                f"table {name!r}: kernel {t['kernel']} with adamw needs a GPU (fbgemm's CPU "
                "kernels fuse SGD and Adagrad only; on CPU Adam's tables use kernel dense)"
            )
