"""meshplan's recommendation planner against TorchRec's EmbeddingShardingPlanner.

    python benchmarks/recsys.py [--tables 500] [--gpus 64] [--batch 65536] [--profile h100-sxm]

Both plan the same DLRM tables (examples/dlrm.py's production mix, ``--tables`` of them) on the
same topology: TorchRec's ``Topology`` gets the profile's device memory (less its reserve), host
memory per GPU, HBM, host-link and NVLink/NIC bandwidths, and per-table pooling factors as
``ParameterConstraints``. Each plan is then scored twice:

- under meshplan's cost model (``planner.recsys.milp.step_time``, with the dense strategy
  meshplan chose, the same for both plans): TorchRec's per-table choice
  mapped to the same option (table-wise, column-wise k, row-wise, table-row-wise, data-parallel,
  host caching at the nearest cache ratio) on the ranks TorchRec chose;
- under TorchRec's estimator: the shards of TorchRec's own enumerated options (perf from
  ``EmbeddingPerfEstimator``), placed on each plan's ranks, summed per rank; the slowest rank,
  as TorchRec's ``NoopPerfModel`` scores a plan.

``--device-only`` keeps every table in device memory in both planners: TorchRec's estimator
prices its UVM caching kernel at a tenth of the blended HBM/host bandwidth and takes the cache
ratio for the hit rate, whatever the ids' skew, while meshplan prices a cached table's misses
from the Zipf law of its ids, so a host table is where the two models disagree most (16 tables
on 16 H100s: meshplan's one host table is its slowest rank under TorchRec's estimator).

It also times both planners (the model already built and imported), times meshplan alone on
``--scale-tables`` (1,000) tables on the same topology (TorchRec's planner is not run there: at
120 tables it already takes minutes), and writes ``reports/benchmarks/recsys.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.hardware.cluster import make_cluster  # noqa: E402
from planner.modelfile import load_model_file  # noqa: E402
from planner.recsys.cost import price  # noqa: E402
from planner.recsys.milp import solve, step_time  # noqa: E402
from planner.recsys.tables import read_model  # noqa: E402

MS = 1e3  # TorchRec's planner counts bandwidth in bytes per millisecond and perf in ms


def torchrec_setup(model, cluster, batch: int, device_only: bool = False):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.types import ParameterConstraints, Topology

    p = cluster.profile
    topology = Topology(
        world_size=cluster.gpus,
        compute_device="cuda",
        hbm_cap=int(p.memory_bytes - p.reserved_bytes),
        ddr_cap=int(p.host_memory_bytes / cluster.gpus_per_node),
        local_world_size=cluster.gpus_per_node,
        hbm_mem_bw=p.memory_bandwidth / MS,  # TorchRec's bandwidths are bytes per ms
        ddr_mem_bw=p.host_memory_bandwidth / MS,
        hbm_to_ddr_mem_bw=p.host_bandwidth / MS,
        intra_host_bw=p.intra_node_bandwidth / MS,
        inter_host_bw=p.inter_node_bandwidth / MS,
    )
    constraints = {
        t.name: ParameterConstraints(
            pooling_factors=[t.pooling_factor / len(t.features)] * len(t.features),
            compute_kernels=["fused", "dense"] if device_only else None,
        )  # fmt: skip
        for t in model.tables
    }
    sharder = EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}
    )
    return topology, constraints, sharder


def torchrec_plan(module, topology, constraints, sharder, local_batch: int):
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    planner = EmbeddingShardingPlanner(
        topology=topology, batch_size=local_batch, constraints=constraints, debug=False
    )
    start = time.perf_counter()
    plan = planner.plan(module, [sharder])
    return plan, time.perf_counter() - start


def as_assignment(tr_plan, costed, module_path: str = "ebc"):
    """TorchRec's plan in meshplan's terms: per table the same option and ranks."""
    choice, ranks, unmatched = {}, {}, []
    for name, ps in tr_plan.plan[module_path].items():
        opts = {o.label: o for o in costed.options[name]}
        k = len(ps.ranks or [])
        if ps.sharding_type == "data_parallel":
            label = "dp"
        elif ps.sharding_type == "row_wise":
            label = "rw"
        elif ps.sharding_type == "table_row_wise":
            label = "twrw"
        elif ps.sharding_type == "column_wise" and k > 1:
            label = f"cw{k}"
        elif ps.compute_kernel == "fused_uvm_caching":
            ratio = ps.cache_params.load_factor if ps.cache_params else None
            hosts = [o for o in opts.values() if o.cache_ratio is not None]
            label = min(hosts, key=lambda o: abs(o.cache_ratio - (ratio or 0.2))).label
        else:
            label = "tw"
        if label not in opts:
            unmatched.append(f"{name}: {ps.sharding_type} x{k} {ps.compute_kernel}")
            label = "tw"
        choice[name] = opts[label]
        if choice[name].placement == "all":
            ranks[name] = list(range(costed.ranks))
        elif choice[name].placement == "node":
            g = costed.gpus_per_node
            node = ps.ranks[0] // g
            ranks[name] = list(range(node * g, (node + 1) * g))
        else:
            ranks[name] = list(ps.ranks[: choice[name].count])
    return choice, ranks, unmatched


def torchrec_estimate(module, topology, constraints, sharder, local_batch, tables):
    """Per table and (sharding, kernel, shards): TorchRec's enumerated options with perf.
    TorchRec enumerates one column-wise split per table (shards of ``min_partition``
    columns), so it is enumerated once per split meshplan uses (dim / k for k = 2, 4, 8)."""
    from dataclasses import replace as dc_replace

    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import (
        EmbeddingPerfEstimator,
        EmbeddingStorageEstimator,
    )

    found: dict[tuple, object] = {}
    for k in (None, 2, 4, 8):
        cons = constraints
        if k is not None:
            dims = {t.name: t.dim for t in tables}
            cons = {n: dc_replace(c, min_partition=max(4, dims[n] // k))
                    for n, c in constraints.items()}  # fmt: skip
        enum = EmbeddingEnumerator(
            topology=topology,
            batch_size=local_batch,
            constraints=cons,
            estimator=[
                EmbeddingPerfEstimator(topology=topology, constraints=cons),
                EmbeddingStorageEstimator(topology=topology, constraints=cons),
            ],
        )
        for so in enum.enumerate(module, [sharder]):
            found.setdefault((so.name, so.sharding_type, so.compute_kernel, len(so.shards)), so)
    return found


def score_torchrec(found, placement: dict[str, tuple[str, str, list[int]]], world: int):
    """The slowest rank's summed shard perf (seconds), or None and the tables not enumerated."""
    per_rank = [0.0] * world
    missing = []
    for name, (sharding, kernel, ranks) in placement.items():
        so = found.get((name, sharding, kernel, len(ranks)))
        if so is None:
            missing.append(f"{name}: {sharding} x{len(ranks)} {kernel}")
            continue
        for shard, r in zip(so.shards, ranks):
            per_rank[r] += shard.perf.total / MS  # TorchRec's perf is in milliseconds
    return max(per_rank), missing


def time_meshplan(tables: int, cluster, batch: int, device_only: bool = False):
    """(model file, tables, prices, meshplan's plan, seconds from reading the model to the
    plan) for the production mix of ``tables`` tables, the file already imported."""
    mf = load_model_file(ROOT / "examples" / "dlrm.py", {"size": "production", "tables": tables})
    _ = mf.module
    start = time.perf_counter()
    model = read_model(mf)
    ddp, fsdp = (price(model, cluster, batch, device="cuda", dense_strategy=st)
                 for st in ("ddp", "fsdp"))  # fmt: skip
    if device_only:  # no table in host memory (TorchRec's UVM caching kernel)
        ddp, fsdp = (replace(c, options={n: [o for o in opts if o.cache_ratio is None]
                                         for n, opts in c.options.items()})
                     for c in (ddp, fsdp))  # fmt: skip
    ours = solve(ddp.choosing_dense([fsdp]))  # as ``plan`` does: the dense part chosen too
    elapsed = time.perf_counter() - start
    if ours is None:
        raise SystemExit(f"meshplan found no plan for {tables} tables")
    return mf, model, ours.costed, ours, elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, default=500)
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--batch", type=int, default=65536, help="global batch")
    ap.add_argument("--profile", default="h100-sxm")
    ap.add_argument("--out", default=str(ROOT / "reports" / "benchmarks" / "recsys.json"))
    ap.add_argument("--only-meshplan", action="store_true", help="time meshplan alone")
    ap.add_argument("--device-only", action="store_true",
                    help="every table stays in device memory (no UVM caching)")  # fmt: skip
    ap.add_argument("--scale-tables", type=int, default=1000,
                    help="also time meshplan alone on this many tables (0: skip)")  # fmt: skip
    args = ap.parse_args(argv)
    import torch

    cluster, _ = make_cluster(args.gpus, args.profile)
    mf, model, costed, ours, ours_time = time_meshplan(args.tables, cluster, args.batch,
                                                       args.device_only)  # fmt: skip
    if args.only_meshplan:
        print(json.dumps({"tables": args.tables, "gpus": args.gpus, "plan_time_s": ours_time,
                          "status": ours.status, "gap": ours.gap,
                          "solve_time_s": ours.solve_time_s}, indent=2))  # fmt: skip
        return 0
    with torch.device("meta"):
        module = mf.build()
    local = args.batch // args.gpus
    topology, constraints, sharder = torchrec_setup(model, cluster, args.batch, args.device_only)
    tr_plan, tr_time = torchrec_plan(module, topology, constraints, sharder, local)
    tr_choice, tr_ranks, unmatched = as_assignment(tr_plan, costed)
    found = torchrec_estimate(module, topology, constraints, sharder, local, model.tables)
    tr_place = {
        n: (ps.sharding_type, ps.compute_kernel, list(ps.ranks))
        for n, ps in tr_plan.plan["ebc"].items()
    }
    our_place = {
        n: (o.sharding, o.kernel, ours.ranks[n] if o.placement == "rank" else list(range(
            args.gpus)) if o.placement == "all" else ours.ranks[n])
        for n, o in ours.choice.items()
    }  # fmt: skip
    tr_est, tr_missing = score_torchrec(found, tr_place, args.gpus)
    our_est, our_missing = score_torchrec(found, our_place, args.gpus)
    result = {
        "tables": args.tables,
        "gpus": args.gpus,
        "global_batch": args.batch,
        "profile": args.profile,
        "device_only": args.device_only,
        "meshplan": {
            "plan_time_s": ours_time,
            "solver": {"status": ours.status, "gap": ours.gap, "solve_time_s": ours.solve_time_s},
            "our_cost_model_step_s": ours.step_time_s,
            "torchrec_estimator_s": our_est,
            "not_in_torchrec_enumeration": our_missing,
            "options": _count(o.label for o in ours.choice.values()),
        },
        "torchrec": {
            "plan_time_s": tr_time,
            "our_cost_model_step_s": step_time(costed, tr_choice, tr_ranks),
            "torchrec_estimator_s": tr_est,
            "mapped_as_table_wise": unmatched,
            "options": _count(o.label for o in tr_choice.values()),
        },
    }
    if args.scale_tables:
        *_, big, big_time = time_meshplan(args.scale_tables, cluster, args.batch)
        result["meshplan_scale"] = {
            "tables": args.scale_tables,
            "plan_time_s": big_time,
            "solver": {"status": big.status, "gap": big.gap, "solve_time_s": big.solve_time_s},
            "our_cost_model_step_s": big.step_time_s,
        }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


def _count(labels) -> dict[str, int]:
    out: dict[str, int] = {}
    for label in labels:
        out[label] = out.get(label, 0) + 1
    return dict(sorted(out.items()))


if __name__ == "__main__":
    sys.exit(main())
