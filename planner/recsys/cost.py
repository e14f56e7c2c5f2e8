"""Price every way to run every embedding table, and the dense part, for one training step.

Per table the options are TorchRec's sharding types (Mudigere et al. 2022, "Software-hardware
co-design for fast and scalable training of DLRM models"; TorchRec's planner enumerates the
same ones):

    data_parallel      a replica on every rank, dense kernel; its full gradient joins the
                       dense part's all-reduce, and the optimizer steps the whole table
    table_wise         the whole table on one rank (fused kernel: the optimizer runs inside
                       the backward, no gradient buffer)
    column_wise k      k shards of dim/k columns on k ranks (each shard sees every id)
    row_wise           rows split over all ranks; pooled partial sums reduce-scattered
                       (GPU only: TorchRec's row-wise input distribution needs CUDA)
    table_row_wise     rows split over the ranks of one node (GPU, several nodes)
    host c             table-wise in host memory with a device cache of a share c of the rows
                       (TorchRec's UVM caching kernel; GPU only: on a CPU there is no host
                       memory apart from the device's)

Each option is a set of identical *shards* that go either on ranks chosen by the solver
(table-wise, column-wise, host), on one node (table-row-wise), or on every rank at once
(data-parallel, row-wise), and per shard it costs, per step of global batch B over N ranks:

    lookups   ((1 + 2(1 + s)) B L w e + 2 B L i + 2 B w e) / HBM   forward reads B L rows
                                      of w columns (e bytes each) and their ids (i bytes) and
                                      writes B pooled rows; the fused backward reads the ids
                                      and the pooled gradient and read-modify-writes every
                                      looked-up row and its s optimizer states (SGD: s = 0;
                                      fbgemm's fused Adam: s = 2, and it steps only the rows
                                      the batch looked up)
              CPU with Adam: fbgemm's CPU kernels fuse no Adam, so the shard runs TorchRec's
              dense kernel: a full gradient (memory R w e (2 + s)) and torch's AdamW stepping
              the whole shard every step ((3 + 2 s) R w e / HBM), as a data-parallel table
              host c: misses (1 - h) of the bytes at the host link instead, where
              h = F(c R) is the Zipf law's share of lookups that hit the c R hottest rows
    all-to-all  a (ids + lengths + 2 B w e)   the shard's rank receives the ids of the whole
                                      batch and sends B pooled rows forward and receives their
                                      gradients backward (TorchRec's estimator counts the same
                                      transfers on the shard's rank); a is seconds per byte
                                      through the rank's NIC (``a2a_seconds_per_byte``), not
                                      the ring bus bandwidth
    memory    R w e (1 + s) + 2 B w e on device (s: optimizer state per element; the pooled
              output and its gradient); host c: c R w e on device, R w e (1 + s) on the host

The collective factors c come from ``planner.hardware.collectives.ring_factors`` and the link
from ``Cluster.link``; rates from the profile (HBM x elementwise efficiency, the host link).

The dense part (bottom/top MLPs, interaction) runs on every rank, as DDP or as ZeRO-3 (FSDP2's
``fully_shard`` on each MLP): its products at the profile's matmul rate, its optimizer step and
its gradient collectives, exposed past ``comm_overlap`` of the dense backward. DDP all-reduces
the gradients (2 (n-1)/n of their bytes), keeps parameters, gradients and optimizer states
whole, and steps them all; ZeRO-3 all-gathers the parameters forward and backward and
reduce-scatters the gradients (3 (n-1)/n of their bytes, 1.5x DDP; the forward's all-gather
hides behind the forward, the other two behind the backward), keeps 1/n of the states,
steps 1/n of them, and holds one MLP's whole parameters and gradients while it computes
(the largest, ``RecModel.dense_unit_params``). Data-parallel tables' gradients are
all-reduced by DDP either way (beside FSDP, TorchRec wraps what FSDP does not hold in DDP).
Collectives' latencies are paid by every rank, and their number depends on which sharding types
the plan uses (``collective_latency``): TorchRec runs each sharding type as its own group with
its own input and output distribution, five all-to-alls per step (the input's splits, lengths
and ids; the pooled output forward and its gradient backward), and all-reduces the
data-parallel tables' gradients through a DDP of their own, beside the dense part's. Counted
with torch's profiler on 2 gloo ranks (tiny DLRM, 10 steps): table-wise alone 5 all-to-alls
and 1 all-reduce per step, table-wise with column-wise 10 and 1, data-parallel alone 0 and 2.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from planner.cost.optimizer import OPTIMIZER_OPS
from planner.hardware.cluster import Cluster
from planner.hardware.collectives import ring_factors
from planner.recsys.tables import RecModel, TableBlock
from planner.vocab import DenseStrategy

EMB_BYTES = 4  # TorchRec's tables are fp32 (EmbeddingBagConfig.data_type default)
ID_BYTES = 8  # int64 ids
LENGTH_BYTES = 8  # int64 lengths, one per sample and feature
CW_SHARDS = (2, 4, 8)
CACHE_RATIOS = (0.05, 0.2)
# Optimizer state elements per weight element: TorchRec's fused EXACT_SGD keeps none; Adam two.
STATE_ELEMENTS = {"sgd": 0, "adamw": 2}
# All-to-alls per step of one sharding type's group: splits, lengths and ids in, pooled out
# forward, its gradient back (module docstring).
A2A_PER_SHARDING = 5


@dataclass(frozen=True)
class TableOption:
    """One way to run one table: ``count`` identical shards placed per ``placement``."""

    table: str
    label: str  # "dp", "tw", "cw4", "rw", "twrw", "host0.2"
    sharding: str  # TorchRec ShardingType value
    kernel: str  # TorchRec EmbeddingComputeKernel value
    placement: str  # "rank" (solver picks ranks), "node" (solver picks a node), "all"
    count: int  # shards to place (rank: distinct ranks; node: 1; all: every rank)
    lookup_s: float  # per shard's rank, per step
    comm_s: float  # all-to-all / reduce-scatter share on the shard's rank, per step
    device_bytes: float  # per shard's rank
    host_bytes: float  # per shard's rank
    allreduce_bytes: float = 0.0  # data-parallel: gradient bytes joining the dense all-reduce
    optimizer_s: float = 0.0  # data-parallel: the dense optimizer stepping the whole table
    cache_ratio: float | None = None

    @property
    def time_s(self) -> float:
        """What the option adds to the step of each rank holding one of its shards."""
        return self.lookup_s + self.comm_s + self.optimizer_s


@dataclass(frozen=True)
class DenseCost:
    """The dense part and the constants every rank pays."""

    compute_s: float  # forward + backward of the local batch
    backward_s: float  # the share of compute_s the all-reduce can hide behind
    optimizer_s: float
    allreduce_fixed_s: float  # all-reduce of the dense gradients alone, latency included
    allreduce_s_per_byte: float  # what each more byte (a data-parallel table's) adds
    comm_overlap: float
    a2a_latency_s: float  # one all-to-all's latency over every rank (``collective_latency``)
    dp_allreduce_latency_s: float  # the data-parallel tables' own all-reduce's latency
    device_bytes: float
    params: int
    strategy: str = DenseStrategy.DDP  # vocab.DenseStrategy
    forward_exposed_s: float = 0.0  # ZeRO-3: the forward all-gather past what the forward hides

    @property
    def fixed_s(self) -> float:
        """What every rank pays whatever the tables: products, optimizer step and ZeRO-3's
        exposed forward all-gather (the backward's collectives and the data-parallel tables'
        all-reduce are priced with the tables, ``exposed_allreduce``, and the collectives'
        latencies by the sharding types used, ``collective_latency``)."""
        return self.compute_s + self.optimizer_s + self.forward_exposed_s

    def sharding_latency_s(self, sharding: str) -> float:
        """The latency every rank pays once a table runs with ``sharding`` (TorchRec's value):
        its group's all-to-alls, or for data-parallel tables their own all-reduce."""
        if sharding == "data_parallel":
            return self.dp_allreduce_latency_s
        return A2A_PER_SHARDING * self.a2a_latency_s


def collective_latency(dense: DenseCost, shardings: Iterable[str]) -> float:
    """The collectives' latency of a step whose tables use these sharding types."""
    return sum(dense.sharding_latency_s(s) for s in set(shardings))


@dataclass(frozen=True)
class Costed:
    """Everything the solver needs: options per table, the dense part, capacities."""

    tables: list[TableBlock]
    options: dict[str, list[TableOption]]
    dense: DenseCost
    ranks: int
    gpus_per_node: int
    device_capacity: float  # per rank, after the profile's reserve
    host_capacity: float  # per rank: the node's host memory over its ranks
    device: str  # "cuda" or "cpu": which options TorchRec can run
    global_batch_size: int
    # The dense part's strategies to choose among, each (its cost, the device memory it leaves
    # the tables per rank); empty: ``dense`` is fixed. The solver picks one inside its MILPs
    # (every term a strategy changes is a constant: fixed time, collective bytes, capacity),
    # and then ``device_capacity`` is the largest of theirs, so no option is dropped early.
    dense_choices: tuple[tuple[DenseCost, float], ...] = ()

    def with_dense(self, k: int) -> Costed:
        """These prices with the dense part fixed to choice ``k`` of ``dense_choices``."""
        dense, capacity = self.dense_choices[k]
        return replace(self, dense=dense, device_capacity=capacity, dense_choices=())

    def choosing_dense(self, others: list[Costed]) -> Costed:
        """These prices with the dense part to choose among this one's and ``others``'."""
        choices = tuple((c.dense, c.device_capacity) for c in [self, *others])
        return replace(self, device_capacity=max(cap for _, cap in choices),
                       dense_choices=choices)  # fmt: skip


def zipf_hit_rate(rows: int, zipf: float, cache_rows: float) -> float:
    """Share of lookups landing in the ``cache_rows`` hottest rows when the k-th hottest row
    is drawn with probability ~ k^-s: the continuous Zipf law's CDF at the cache size (the
    law examples/dlrm.py samples from)."""
    if rows <= 0:
        return 1.0
    k = min(max(cache_rows, 0.0), float(rows))
    if zipf == 0:
        return k / rows
    if abs(zipf - 1.0) < 1e-9:
        return math.log1p(k) / math.log1p(rows)
    a = 1.0 - zipf
    return ((1 + k) ** a - 1) / ((1 + rows) ** a - 1)


def kernel_io(ids: float, pooled: float) -> float:
    """Bytes the embedding kernel moves besides the rows: it reads the ``ids`` it looks up in
    the forward and again in the backward (which sorts them to update each row once), writes
    the ``pooled`` output elements in the forward and reads their gradient in the backward.
    Row-wise shards compute partial sums for every sample of the batch, so their ``pooled``
    is the whole batch's even though they look up only their share of the ids."""
    return 2 * ids * ID_BYTES + 2 * pooled * EMB_BYTES


def a2a_seconds_per_byte(cluster: Cluster, n: int) -> float:
    """Seconds per byte a rank sends (and receives) in an all-to-all over the cluster's first
    ``n`` ranks: through its own NIC across nodes (``Cluster.all_to_all_seconds_per_byte``)."""
    return cluster.all_to_all_seconds_per_byte(range(n))


def price(
    model: RecModel,
    cluster: Cluster,
    global_batch_size: int,
    optimizer: str = "sgd",
    dtype: str = "fp32",
    device: str = "cuda",
    memory_fraction: float = 1.0,
    dense_strategy: str = DenseStrategy.DDP,
) -> Costed:
    """Every option of every table and the dense part, on ``cluster`` (see module docstring).

    Long because each table's options are priced term by term, each term beside its source."""
    p = cluster.profile
    n, g, b = cluster.gpus, cluster.gpus_per_node, global_batch_size
    s = STATE_ELEMENTS[optimizer]
    # The fused backward reads and writes each looked-up row and its s optimizer states.
    passes = 1 + 2 * (1 + s)
    # fbgemm's CPU kernels fuse only SGD and Adagrad: Adam's tables on a CPU run TorchRec's
    # dense kernel, a full gradient per shard and torch's AdamW stepping the whole shard.
    unfused = device == "cpu" and s > 0
    hbm = p.memory_bandwidth * p.elementwise_efficiency
    bw, alpha = cluster.link(list(range(n)))
    a2a_s = a2a_seconds_per_byte(cluster, n)
    rs = ring_factors("reduce_scatter", n)[0] if n > 1 else 0.0
    options = {}
    for t in model.tables:
        opts = []
        ids = b * t.pooling_factor * ID_BYTES + b * len(t.features) * LENGTH_BYTES

        def sharded(label, sharding, width, count, kernel="fused", ratio=None, t=t, ids=ids):
            """A rank-placed option whose shards are ``width`` columns wide (``t`` and ``ids``
            bound now: the function is called within this iteration only)."""
            hit = 1.0 if ratio is None else zipf_hit_rate(t.rows, t.zipf, ratio * t.rows)
            read = b * t.pooling_factor * width * EMB_BYTES
            weights = t.rows * width * EMB_BYTES
            buffers = 2 * b * width * EMB_BYTES
            optimizer_s = 0.0
            if unfused:  # rows read forward, gradient rows written backward; then AdamW
                kernel, lookup = "dense", 2 * read / hbm
                dev, host = weights * (2 + s) + buffers, 0.0
                optimizer_s = (3 + 2 * s) * weights / hbm
            else:
                lookup = passes * read * (hit / hbm + (1 - hit) / p.host_bandwidth)
                if ratio is None:
                    dev, host = weights * (1 + s) + buffers, 0.0
                else:
                    dev, host = ratio * weights + buffers, weights * (1 + s)
            lookup += kernel_io(b * t.pooling_factor, b * width) / hbm
            comm = a2a_s * (ids + 2 * b * width * EMB_BYTES)
            return TableOption(
                t.name, label, sharding, kernel, "rank", count, lookup, comm, dev, host,
                optimizer_s=optimizer_s, cache_ratio=ratio,
            )  # fmt: skip

        opts.append(sharded("tw", "table_wise", t.dim, 1))
        for k in CW_SHARDS:
            if k <= n and t.dim % k == 0 and (t.dim // k) % 4 == 0:
                opts.append(sharded(f"cw{k}", "column_wise", t.dim // k, k))
        weights = t.elements * EMB_BYTES
        local = b / n
        opts.append(
            TableOption(
                t.name, "dp", "data_parallel", "dense", "all", n,
                lookup_s=(3 * local * t.pooling_factor * t.dim * EMB_BYTES
                          + kernel_io(local * t.pooling_factor, local * t.dim)) / hbm,
                comm_s=0.0,
                device_bytes=weights * (2 + s) + 2 * local * t.dim * EMB_BYTES,
                host_bytes=0.0,
                allreduce_bytes=weights,
                optimizer_s=(3 + 2 * s) * weights / hbm,
            )
        )  # fmt: skip
        if device == "cuda":
            for ratio in CACHE_RATIOS:
                opts.append(sharded(f"host{ratio:g}", "table_wise", t.dim, 1,
                                    "fused_uvm_caching", ratio))  # fmt: skip
            if n > 1:
                read = b * t.pooling_factor * t.dim * EMB_BYTES
                opts.append(
                    TableOption(
                        t.name, "rw", "row_wise", "fused", "all", n,
                        lookup_s=(passes * read / n + kernel_io(b * t.pooling_factor / n,
                                                           b * t.dim)) / hbm,
                        comm_s=a2a_s * ids / n + 2 * rs * b * t.dim * EMB_BYTES / bw,
                        device_bytes=weights * (1 + s) / n + 2 * b * t.dim * EMB_BYTES,
                        host_bytes=0.0,
                    )
                )  # fmt: skip
            if cluster.nodes > 1 and g > 1:
                read = b * t.pooling_factor * t.dim * EMB_BYTES
                node_bw, _ = cluster.link(list(range(g)))
                rs_g = ring_factors("reduce_scatter", g)[0]
                comm = a2a_s * (ids + 2 * b * t.dim * EMB_BYTES) / g
                comm += 2 * rs_g * b * t.dim * EMB_BYTES / node_bw
                opts.append(
                    TableOption(
                        t.name, "twrw", "table_row_wise", "fused", "node", 1,
                        lookup_s=(passes * read / g + kernel_io(b * t.pooling_factor / g,
                                                           b * t.dim)) / hbm,
                        comm_s=comm,
                        device_bytes=weights * (1 + s) / g + 2 * b * t.dim * EMB_BYTES,
                        host_bytes=0.0,
                    )
                )  # fmt: skip
        options[t.name] = opts
    dense = _dense(model, cluster, global_batch_size, optimizer, dtype, hbm, bw, alpha,
                   dense_strategy)  # fmt: skip
    cap = p.memory_bytes * memory_fraction - p.reserved_bytes - dense.device_bytes
    host = p.host_memory_bytes / g
    return Costed(model.tables, options, dense, n, g, cap, host, device, global_batch_size)


def _dense(
    model, cluster, b, optimizer, dtype, hbm, bw, alpha, strategy: str = DenseStrategy.DDP
) -> DenseCost:
    p = cluster.profile
    s = STATE_ELEMENTS[optimizer]
    n = cluster.gpus
    local = b / n
    rate = p.peak_flops[dtype] * p.matmul_efficiency
    # products at the matmul rate, plus each eager op's host dispatch where the profile prices
    # it (CPU ranks; GPU profiles hold 0: kernels queue ahead of the device)
    fwd = model.dense_flops_per_sample * local / rate + model.dense_forward_ops * p.op_overhead
    bwd = 2 * model.dense_flops_per_sample * local / rate
    bwd += model.dense_backward_ops * p.backward_op_overhead
    e = 4 if dtype == "fp32" else 2
    grad_bytes = model.dense_params * e
    ar_c, ar_d = ring_factors("all_reduce", n) if n > 1 else (0.0, 0.0)
    a2a_d = ring_factors("all_to_all", n)[1] if n > 1 else 0.0
    sync = p.collective_sync if n > 1 else 0.0
    states = model.dense_params * (4 + e + 4 * s)  # fp32 master weights, gradients, states
    acts = model.dense_activations_per_sample * local * e
    pooled = 2 * local * sum(t.dim for t in model.tables) * EMB_BYTES
    gather_c, gather_d = ring_factors("all_gather", n) if n > 1 else (0.0, 0.0)
    forward_exposed = 0.0
    if (
        strategy == DenseStrategy.FSDP and n > 1
    ):  # 2 all-gathers + 1 reduce-scatter, 1/n of the states
        one = gather_c * grad_bytes / bw + gather_d * alpha + sync
        forward_exposed = max(0.0, one - p.comm_overlap * fwd)  # hidden behind the forward
        collectives = 2 * one  # the backward's all-gather and reduce-scatter
        unit = model.dense_unit_params or model.dense_params
        states = states / n + 2 * unit * e  # + the computing MLP's whole parameters, gradients
        optimizer_s = (3 + 2 * s) * model.dense_params * 4 / n / hbm
        optimizer_s += model.dense_tensors * OPTIMIZER_OPS[optimizer] * p.dtensor_op_overhead
    else:
        collectives = (ar_c * grad_bytes / bw + ar_d * alpha + sync) if n > 1 else 0.0
        optimizer_s = (3 + 2 * s) * model.dense_params * 4 / hbm
        optimizer_s += model.dense_tensors * OPTIMIZER_OPS[optimizer] * p.optimizer_op_overhead
    return DenseCost(
        compute_s=fwd + bwd,
        backward_s=bwd,
        optimizer_s=optimizer_s,
        allreduce_fixed_s=collectives,
        allreduce_s_per_byte=ar_c / bw,
        comm_overlap=p.comm_overlap,
        a2a_latency_s=a2a_d * alpha + sync,
        dp_allreduce_latency_s=ar_d * alpha + sync,
        device_bytes=states + acts + pooled,
        params=model.dense_params,
        strategy=strategy if n > 1 else DenseStrategy.DDP,
        forward_exposed_s=forward_exposed,
    )
