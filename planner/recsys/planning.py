"""Plan a recommendation model: read its tables, price them, solve, and write the plan dict.

The one entry point the CLI calls for a model holding an EmbeddingBagCollection; a request no
placement satisfies raises InfeasibleError (exit 3) naming the table that fits nowhere and the
smallest cluster of the same profile that holds it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from planner.errors import InfeasibleError, UserInputError
from planner.hardware.cluster import Cluster, cluster_to_dict, make_cluster
from planner.modelfile import ModelFile
from planner.recsys.cost import Costed, TableOption, price
from planner.recsys.milp import (
    Assignment,
    choice_latency,
    exposed_allreduce,
    rank_loads,
    solve,
)
from planner.recsys.plan import OPTIMIZERS, SCHEMA
from planner.recsys.tables import RecModel, read_model, with_dense_ops
from planner.training import Training
from planner.vocab import DenseStrategy

GIB = 2.0**30
MAX_GPUS = 1 << 16


def plan_recsys(
    mf: ModelFile,
    gpus: int | None,
    *,
    profile: str | None = None,
    gpus_per_node: int | None = None,
    nodes: int | None = None,
    training: Training,
    device: str = "cuda",
    memory_fraction: float = 1.0,
) -> tuple[dict[str, Any], list[str]]:
    """(plan dict of ``planner.recsys.plan``, notes for the user)."""
    if training.optimizer not in OPTIMIZERS:
        raise UserInputError(
            f"{mf.path.name}: recommendation models train with --optimizer one of {OPTIMIZERS} "
            f"(TorchRec's fused EXACT_SGD or Adam for the tables), not {training.optimizer!r}"
        )
    cluster, notes = make_cluster(gpus, profile, gpus_per_node, nodes)
    gbs = training.global_batch_size
    if gbs % cluster.gpus:
        raise UserInputError(
            f"global batch {gbs} does not split over {cluster.gpus} ranks: use a multiple of "
            f"{cluster.gpus} (--global-batch-size)"
        )
    model = read_model(mf)
    notes += model.notes
    if device == "cpu":
        notes.append(
            "device cpu: row-wise, table-row-wise and host-memory tables are not offered "
            "(TorchRec runs them on CUDA only)"
        )

    def priced(c: Cluster, strategy: str) -> Costed:
        return price(model, c, gbs, training.optimizer, training.dtype, device,
                     memory_fraction, strategy)  # fmt: skip

    def costed_for(c: Cluster) -> Costed:
        """The prices under the dense strategy that leaves the tables the most memory (what
        decides whether they fit at all)."""
        return max((priced(c, st) for st in dense_strategies(c)),
                   key=lambda x: x.device_capacity)  # fmt: skip

    check_fits(model, costed_for(cluster), cluster, costed_for)
    if cluster.profile.op_overhead > 0 or cluster.profile.backward_op_overhead > 0:
        model = with_dense_ops(mf, model)  # a profile pricing host dispatch (CPU ranks)
    first, *others = [priced(cluster, st) for st in dense_strategies(cluster)]
    found = solve(first.choosing_dense(others) if others else first)
    if found is None:
        raise InfeasibleError(
            f"no placement of the {len(model.tables)} tables fits the memory of {cluster.gpus} "
            f"x {cluster.profile.name}; try {smallest_cluster(cluster, costed_for)}"
        )
    doc = assemble(mf, model, found.costed or first, cluster, found, training, device, notes)
    return doc, notes


def dense_strategies(cluster: Cluster) -> tuple[str, ...]:
    """DDP, and ZeRO-3 (FSDP2) where there is more than one rank to shard over."""
    return (DenseStrategy.DDP, DenseStrategy.FSDP) if cluster.gpus > 1 else (DenseStrategy.DDP,)


def _fits_somewhere(costed: Costed, name: str) -> bool:
    return any(
        o.device_bytes <= costed.device_capacity and o.host_bytes <= costed.host_capacity
        for o in costed.options[name]
    )


def _total_fits(costed: Costed) -> bool:
    """A necessary condition: the least memory each table can take, summed, fits the ranks."""
    need = sum(
        min(_ranks_used(costed, o) * o.device_bytes for o in opts)
        for opts in costed.options.values()
    )
    return need <= costed.ranks * costed.device_capacity


def _ranks_used(costed: Costed, o: TableOption) -> int:
    """How many ranks hold a shard of ``o`` (a table-row-wise table: every rank of a node)."""
    return costed.gpus_per_node if o.placement == "node" else o.count


def check_fits(model: RecModel, costed: Costed, cluster: Cluster, costed_for) -> None:
    """A table that fits no rank under any option, or tables that together exceed every rank's
    memory, end here with the smallest cluster of this profile that would hold them."""
    if costed.device_capacity <= 0:
        raise InfeasibleError(
            f"the dense part alone needs {costed.dense.device_bytes / GIB:.1f} GiB per rank, "
            f"more than {cluster.profile.name}'s memory: use a profile with more memory"
        )
    for t in model.tables:
        if not _fits_somewhere(costed, t.name):
            smallest = min(o.device_bytes for o in costed.options[t.name])
            raise InfeasibleError(
                f"table {t.name!r} ({t.rows:,} rows x {t.dim}) fits no rank even sharded: its "
                f"smallest shard needs {smallest / GIB:.1f} GiB of the "
                f"{costed.device_capacity / GIB:.1f} GiB free per {cluster.profile.name}; "
                f"try {smallest_cluster(cluster, costed_for, t.name)}"
            )
    if not _total_fits(costed):
        raise InfeasibleError(
            f"the {len(model.tables)} tables need more memory than {cluster.gpus} x "
            f"{cluster.profile.name} hold; try {smallest_cluster(cluster, costed_for)}"
        )


def smallest_cluster(cluster: Cluster, costed_for, table: str | None = None) -> str:
    """The fewest devices of this profile (whole nodes past one node) where ``table`` (or
    every table) has an option that fits and the tables' least memory fits in total."""
    g = cluster.profile.gpus_per_node
    n = cluster.gpus + 1
    while n <= MAX_GPUS:
        size = n if n < g else -(-n // g) * g
        c = replace(cluster, nodes=max(1, size // g), gpus_per_node=min(size, g))
        costed = costed_for(c)
        if costed.device_capacity > 0 and _total_fits(costed):
            names = [table] if table else list(costed.options)
            if all(_fits_somewhere(costed, name) for name in names):
                return f"--gpus {c.gpus} (the smallest cluster of {cluster.profile.name} that fits)"
        n = size + 1 if size < 64 else size * 2
    return "a profile with more memory per device (no cluster of this one holds it)"


def assemble(
    mf: ModelFile,
    model: RecModel,
    costed: Costed,
    cluster: Cluster,
    found: Assignment,
    training: Training,
    device: str,
    notes: list[str],
) -> dict[str, Any]:
    """The plan dict (schema in planner.recsys.plan) from the solver's assignment.

    Long because the plan dict is written field by field."""
    d = costed.dense
    exposed = exposed_allreduce(costed, found.choice)
    latency = choice_latency(costed, found.choice)
    fixed = d.fixed_s + exposed + latency
    loads = rank_loads(costed, found.choice, found.ranks)
    base_dev = d.device_bytes + cluster.profile.reserved_bytes
    tables = []
    for t in model.tables:
        o = found.choice[t.name]
        tables.append({
            "name": t.name, "module": t.module, "features": list(t.features),
            "rows": t.rows, "dim": t.dim, "pooling_factor": t.pooling_factor, "zipf": t.zipf,
            "option": o.label, "sharding": o.sharding, "kernel": o.kernel,
            "ranks": found.ranks[t.name], "cache_ratio": o.cache_ratio,
            "lookup_s": o.lookup_s, "comm_s": o.comm_s, "optimizer_s": o.optimizer_s,
            "device_bytes": o.device_bytes, "host_bytes": o.host_bytes,
        })  # fmt: skip
    ranks = [
        {
            "rank": r,
            "step_s": fixed + v["lookup_s"] + v["comm_s"] + v["optimizer_s"],
            "lookup_s": v["lookup_s"],
            "comm_s": v["comm_s"],
            "optimizer_s": v["optimizer_s"],
            "device_bytes": base_dev + v["device"],
            "host_bytes": v["host"],
        }
        for r, v in enumerate(loads)
    ]
    gbs = training.global_batch_size
    return {
        "schema": SCHEMA,
        "model": {
            "file": str(mf.path),
            "sha256": mf.sha256,
            "args": mf.args,
            "embedding_params": model.embedding_params,
            "dense_params": model.dense_params,
            "tables": len(model.tables),
        },
        "cluster": cluster_to_dict(cluster),
        "device": device,
        "global_batch_size": gbs,
        "optimizer": training.optimizer,
        "lr": training.lr,
        "dtype": training.dtype,
        "dense": {
            "strategy": d.strategy,
            "params": d.params,
            "compute_s": d.compute_s,
            "optimizer_s": d.optimizer_s,
            "allreduce_exposed_s": exposed,
            "collective_latency_s": latency,
            "forward_exposed_s": d.forward_exposed_s,
            "device_bytes": d.device_bytes,
        },
        "tables": tables,
        "ranks": ranks,
        "predicted": {
            "step_time_s": found.step_time_s,
            "samples_per_s": gbs / found.step_time_s,
            "peak_device_bytes": max(r["device_bytes"] for r in ranks),
            "peak_host_bytes": max(r["host_bytes"] for r in ranks),
            "device_capacity_bytes": cluster.profile.memory_bytes,
        },
        "solver": {
            "status": found.status,
            "gap": found.gap,
            "solve_time_s": found.solve_time_s,
            "variables": found.variables,
        },
        "notes": list(notes),
    }
