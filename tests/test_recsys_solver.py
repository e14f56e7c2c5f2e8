"""The table-placement MILP against brute force, and the cost model's terms by hand.

Brute force enumerates every table's every option and every placement of its shards (each
rank for a table-wise shard, each set of distinct ranks for column shards, each node for a
table-row-wise table), evaluates the slowest rank's step and the memory of every rank with
its own loops, and keeps the best that fits. Instances are random, a third with memory that
does not bind, a third where device memory binds and a third where host memory binds.
"""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest

from planner.modelfile import load_model_file
from planner.recsys.cost import (
    Costed,
    DenseCost,
    TableOption,
    a2a_seconds_per_byte,
    collective_latency,
    price,
    zipf_hit_rate,
)
from planner.recsys.milp import solve
from planner.recsys.tables import RecModel, TableBlock, read_model, with_dense_ops
from tests.conftest import cluster_of

ROOT = Path(__file__).resolve().parent.parent


# TorchRec's sharding type of each option label (table-wise tables in host memory too)
SHARDING = {"tw": "table_wise", "cw2": "column_wise", "dp": "data_parallel",
            "host": "table_wise", "twrw": "table_row_wise"}  # fmt: skip


def _instance(seed: int, binds: str) -> Costed:
    rng = random.Random(seed)
    ranks = rng.choice((2, 3, 4))
    per_node = 2 if ranks == 4 and rng.random() < 0.5 else ranks
    tables, options = [], {}
    for k in range(rng.choice((2, 3, 4))):
        name = f"t{k}"
        tables.append(TableBlock(name, "ebc", (f"f{k}",), 100, 8, 1.0, 0.0))
        opts = []
        for label, placement, count in (("tw", "rank", 1), ("cw2", "rank", 2), ("dp", "all", 0),
                                        ("host", "rank", 1), ("twrw", "node", 1)):  # fmt: skip
            if placement == "node" and per_node == ranks or count > ranks:
                continue
            if rng.random() < 0.25 and label != "tw":
                continue
            opts.append(
                TableOption(
                    name, label, SHARDING[label], "fused", placement,
                    ranks if placement == "all" else count,
                    lookup_s=rng.uniform(1, 10) * 1e-3,
                    comm_s=rng.uniform(0, 5) * 1e-3,
                    device_bytes=rng.uniform(1, 10) * 2**30,
                    host_bytes=rng.uniform(1, 10) * 2**30 if label == "host" else 0.0,
                    allreduce_bytes=rng.uniform(0, 4) * 2**20 if label == "dp" else 0.0,
                    optimizer_s=rng.uniform(0, 2) * 1e-3 if label == "dp" else 0.0,
                )
            )  # fmt: skip
        options[name] = opts
    total = sum(min(o.device_bytes for o in v) for v in options.values())
    device_cap = 1e15 if binds == "none" else total / ranks * rng.uniform(1.2, 2.0)
    host_cap = 1e15 if binds != "host" else 2**30 * rng.uniform(6, 12)
    dense = DenseCost(
        compute_s=2e-3, backward_s=1.3e-3, optimizer_s=1e-4, allreduce_fixed_s=1e-3,
        allreduce_s_per_byte=rng.uniform(0.2, 2) * 1e-9, comm_overlap=rng.choice((0.0, 0.5, 1)),
        a2a_latency_s=rng.uniform(0, 1) * 1e-3, dp_allreduce_latency_s=rng.uniform(0, 3) * 1e-3,
        device_bytes=0.0, params=10,
    )  # fmt: skip
    return Costed(tables, options, dense, ranks, per_node, device_cap, host_cap, "cuda", 64)


def brute_force(c: Costed) -> float | None:
    """The slowest rank's best step over every assignment that fits, or None."""
    per_table = []
    for t in c.tables:
        choices = []
        for o in c.options[t.name]:
            if o.placement == "all":
                choices.append((o, tuple(range(c.ranks))))
            elif o.placement == "node":
                for k in range(c.ranks // c.gpus_per_node):
                    span = range(k * c.gpus_per_node, (k + 1) * c.gpus_per_node)
                    choices.append((o, tuple(span)))
            else:
                choices += [(o, rs) for rs in itertools.combinations(range(c.ranks), o.count)]
        per_table.append(choices)
    best = None
    d = c.dense
    for combo in itertools.product(*per_table):
        time = [0.0] * c.ranks
        dev = [0.0] * c.ranks
        host = [0.0] * c.ranks
        extra = 0.0
        for o, rs in combo:
            extra += o.allreduce_bytes
            for r in rs:
                time[r] += o.lookup_s + o.comm_s + o.optimizer_s
                dev[r] += o.device_bytes
                host[r] += o.host_bytes
        if max(dev) > c.device_capacity or max(host) > c.host_capacity:
            continue
        exposed = max(0.0, d.allreduce_fixed_s + d.allreduce_s_per_byte * extra
                      - d.comm_overlap * d.backward_s)  # fmt: skip
        # every sharding type in use: its five all-to-alls; data-parallel tables: one all-reduce
        types = {o.sharding for o, _ in combo}
        latency = 5 * d.a2a_latency_s * len(types - {"data_parallel"})
        latency += d.dp_allreduce_latency_s if "data_parallel" in types else 0.0
        step = d.compute_s + d.optimizer_s + latency + exposed + max(time)
        best = step if best is None else min(best, step)
    return best


@pytest.mark.parametrize("seed", range(36))
def test_milp_equals_brute_force(seed):
    binds = ("none", "device", "host")[seed % 3]
    c = _instance(seed, binds)
    want = brute_force(c)
    got = solve(c, rel_gap=1e-9, node_limit=1_000_000)
    if want is None:
        assert got is None
        return
    assert got is not None
    assert got.step_time_s == pytest.approx(want, rel=1e-6)
    # the assignment it returns is what it claims: every rank within memory
    for cap, attr in ((c.device_capacity, "device_bytes"), (c.host_capacity, "host_bytes")):
        per_rank = [0.0] * c.ranks
        for name, o in got.choice.items():
            for r in got.ranks[name]:
                per_rank[r] += getattr(o, attr)
        assert max(per_rank) <= cap * (1 + 1e-9)
    for name in got.choice:
        assert len(set(got.ranks[name])) == len(got.ranks[name])


def test_some_instances_bind_memory():
    """The memory-binding instances do bind: brute force without the caps is faster."""
    bound = 0
    for seed in range(36):
        binds = ("none", "device", "host")[seed % 3]
        if binds == "none":
            continue
        c = _instance(seed, binds)
        free = Costed(c.tables, c.options, c.dense, c.ranks, c.gpus_per_node, 1e18, 1e18,
                      "cuda", 64)  # fmt: skip
        got, loose = brute_force(c), brute_force(free)
        if got is None or got > loose * (1 + 1e-9):
            bound += 1
    assert bound >= 8


# --------------------------------------------------------------------------- cost terms


def _model(rows=1000, dim=16, pooling=2.0, zipf=0.0) -> RecModel:
    t = TableBlock("t", "ebc", ("f",), rows, dim, pooling, zipf)
    return RecModel([t], dense_params=100, dense_tensors=2, dense_flops_per_sample=200.0,
                    dense_activations_per_sample=20.0)  # fmt: skip


def test_table_wise_terms_by_hand():
    c = cluster_of(4, "h100-sxm")
    p = c.profile
    costed = price(_model(), c, 512, "sgd", "fp32", "cuda")
    tw = next(o for o in costed.options["t"] if o.label == "tw")
    hbm = p.memory_bandwidth * p.elementwise_efficiency
    bw = p.intra_node_bandwidth * p.collective_efficiency
    io = 2 * 512 * 2.0 * 8 + 2 * 512 * 16 * 4  # ids read twice, pooled out and its gradient
    assert tw.lookup_s == pytest.approx((3 * 512 * 2.0 * 16 * 4 + io) / hbm)
    ids = 512 * 2.0 * 8 + 512 * 8
    assert tw.comm_s == pytest.approx(0.75 * (ids + 2 * 512 * 16 * 4) / bw)
    assert tw.device_bytes == pytest.approx(1000 * 16 * 4 + 2 * 512 * 16 * 4)
    cw4 = next(o for o in costed.options["t"] if o.label == "cw4")
    assert cw4.count == 4
    assert cw4.device_bytes == pytest.approx(1000 * 4 * 4 + 2 * 512 * 4 * 4)
    assert cw4.comm_s == pytest.approx(0.75 * (ids + 2 * 512 * 4 * 4) / bw)
    dp = next(o for o in costed.options["t"] if o.label == "dp")
    assert dp.allreduce_bytes == 1000 * 16 * 4
    assert dp.device_bytes == pytest.approx(1000 * 16 * 4 * 2 + 2 * 128 * 16 * 4)


def test_cpu_offers_only_what_torchrec_runs_there():
    costed = price(_model(), cluster_of(4, "cpu"), 512, "sgd", "fp32", "cpu")
    assert {o.sharding for o in costed.options["t"]} == {
        "table_wise", "column_wise", "data_parallel"
    }  # fmt: skip
    assert all(o.kernel != "fused_uvm_caching" for o in costed.options["t"])
    gpu = price(_model(), cluster_of(16, "h100-sxm"), 512, "sgd", "fp32", "cuda")
    assert {o.sharding for o in gpu.options["t"]} >= {"row_wise", "table_row_wise"}


def test_host_option_pays_misses_at_the_host_link():
    c = cluster_of(2, "h100-sxm")
    p = c.profile
    costed = price(_model(rows=10**6, zipf=1.0), c, 512, "sgd", "fp32", "cuda")
    host = next(o for o in costed.options["t"] if o.label == "host0.2")
    h = math.log1p(0.2 * 10**6) / math.log1p(10**6)
    read = 512 * 2.0 * 16 * 4
    hbm = p.memory_bandwidth * p.elementwise_efficiency
    io = 2 * 512 * 2.0 * 8 + 2 * 512 * 16 * 4
    want = 3 * read * (h / hbm + (1 - h) / p.host_bandwidth) + io / hbm
    assert host.lookup_s == pytest.approx(want)
    assert host.host_bytes == pytest.approx(10**6 * 16 * 4)
    assert host.device_bytes == pytest.approx(0.2 * 10**6 * 16 * 4 + 2 * 512 * 16 * 4)


def test_zipf_hit_rate_matches_the_generator():
    """The cache hit rate equals the share of examples/dlrm.py's sampled ids (before hashing)
    that fall in the hottest rows."""
    import torch

    rows, s, cache = 10_000, 1.05, 500
    u = torch.rand(200_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    a = 1 - s
    k = ((1 + u * ((rows + 1) ** a - 1)) ** (1 / a) - 1).long()
    measured = (k < cache).double().mean().item()
    assert zipf_hit_rate(rows, s, cache) == pytest.approx(measured, abs=0.01)
    assert zipf_hit_rate(rows, 0.0, cache) == pytest.approx(cache / rows)


def test_all_to_all_across_nodes_runs_at_the_nic():
    """Across nodes each rank's all-to-all bytes bound for other nodes leave through its own
    NIC: 64 H100s (8 nodes) move 56/64 of every byte at the NIC rate, about g = 8 times
    slower than the ring bus bandwidth that Cluster.link gives all-gathers."""
    c = cluster_of(64, "h100-sxm")
    p = c.profile
    per_byte = a2a_seconds_per_byte(c, 64)
    assert per_byte == pytest.approx(56 / 64 / (p.inter_node_bandwidth * p.collective_efficiency))
    bus, _ = c.link(list(range(64)))
    assert per_byte > 5 * (63 / 64) / bus
    one = cluster_of(4, "h100-sxm")
    assert a2a_seconds_per_byte(one, 4) == pytest.approx(
        0.75 / (p.intra_node_bandwidth * p.collective_efficiency)
    )
    costed = price(_model(), c, 512, "sgd", "fp32", "cuda")
    tw = next(o for o in costed.options["t"] if o.label == "tw")
    ids = 512 * 2.0 * 8 + 512 * 8
    assert tw.comm_s == pytest.approx(per_byte * (ids + 2 * 512 * 16 * 4))


def test_adam_state_is_priced_two_per_element():
    """AdamW keeps two states per weight: on a GPU fbgemm's fused Adam holds them beside the
    rows and its backward reads and writes row and states (7 row passes instead of SGD's 3);
    on a CPU the table runs the dense kernel (a full gradient too) and AdamW steps all of it."""
    c = cluster_of(4, "h100-sxm")
    p = c.profile
    hbm = p.memory_bandwidth * p.elementwise_efficiency
    sgd = {o.label: o for o in price(_model(), c, 512, "sgd", "fp32", "cuda").options["t"]}
    adam = {o.label: o for o in price(_model(), c, 512, "adamw", "fp32", "cuda").options["t"]}
    weights, buffers = 1000 * 16 * 4, 2 * 512 * 16 * 4
    assert adam["tw"].kernel == "fused"
    assert adam["tw"].device_bytes == pytest.approx(3 * weights + buffers)
    read = 512 * 2.0 * 16 * 4
    assert adam["tw"].lookup_s - sgd["tw"].lookup_s == pytest.approx(4 * read / hbm)
    assert adam["dp"].device_bytes == pytest.approx(4 * weights + 2 * 128 * 16 * 4)
    cpu = cluster_of(4, "cpu")
    tw = next(o for o in price(_model(), cpu, 512, "adamw", "fp32", "cpu").options["t"]
              if o.label == "tw")  # fmt: skip
    assert tw.kernel == "dense"
    assert tw.device_bytes == pytest.approx(4 * weights + buffers)
    assert tw.optimizer_s == pytest.approx(
        7 * weights / (cpu.profile.memory_bandwidth * cpu.profile.elementwise_efficiency)
    )


def _dense_model(params: int, unit: int) -> RecModel:
    t = TableBlock("t", "ebc", ("f",), 1000, 16, 2.0, 0.0)
    return RecModel([t], dense_params=params, dense_tensors=4, dense_flops_per_sample=2.0 * params,
                    dense_activations_per_sample=20.0, dense_unit_params=unit)  # fmt: skip


def test_zero3_dense_terms_by_hand():
    """ZeRO-3 keeps 1/n of the states plus the largest MLP whole, moves 1.5x DDP's bytes (two
    all-gathers and a reduce-scatter against one all-reduce) and steps 1/n of the states."""
    c = cluster_of(8, "h100-sxm")
    model = _dense_model(10**9, 4 * 10**8)
    ddp = price(model, c, 512, "adamw", "fp32", "cuda").dense
    fsdp = price(model, c, 512, "adamw", "fp32", "cuda", dense_strategy="fsdp").dense
    assert fsdp.strategy == "fsdp" and ddp.strategy == "ddp"
    states = 10**9 * (4 + 4 + 8)
    assert ddp.device_bytes - fsdp.device_bytes == pytest.approx(
        states - (states / 8 + 2 * 4 * 10**8 * 4)
    )
    bw, _ = c.link(list(range(8)))
    sync = c.profile.collective_sync
    alpha = c.link(list(range(8)))[1]
    one = 7 / 8 * 4e9 / bw + 7 * alpha + sync  # one all-gather (or reduce-scatter)
    assert fsdp.allreduce_fixed_s == pytest.approx(2 * one)  # behind the backward
    fwd = fsdp.compute_s / 3
    assert fsdp.forward_exposed_s == pytest.approx(max(0.0, one - c.profile.comm_overlap * fwd))
    assert ddp.forward_exposed_s == 0.0
    assert ddp.allreduce_fixed_s == pytest.approx(2 * 7 / 8 * 4e9 / bw + 14 * alpha + sync)
    assert fsdp.optimizer_s == pytest.approx(ddp.optimizer_s / 8)


def test_the_dense_strategy_is_chosen_by_the_step_and_by_memory():
    """A small dense part stays DDP (ZeRO-3 only adds bytes to move); one whose AdamW states
    exceed the device (6e9 parameters: 96 GB whole, 22 GB under ZeRO-3 on 8 ranks) runs ZeRO-3."""
    c = cluster_of(8, "h100-sxm")
    for params, want in ((10**6, "ddp"), (6 * 10**9, "fsdp")):
        model = _dense_model(params, params // 5)
        ddp, fsdp = (price(model, c, 512, "adamw", "fp32", "cuda", dense_strategy=st)
                     for st in ("ddp", "fsdp"))  # fmt: skip
        found = solve(ddp.choosing_dense([fsdp]))
        assert found is not None and found.costed.dense.strategy == want
        alone = [solve(ddp), solve(fsdp)]  # each strategy solved on its own
        assert found.step_time_s == pytest.approx(
            min(f.step_time_s for f in alone if f is not None), rel=1e-3
        )
        assert (alone[0] is None) == (want == "fsdp")


def test_collective_latency_counts_torchrec_groups_by_hand():
    """Each sharding type in use runs its own five all-to-alls (splits, lengths and ids in,
    pooled out, its gradient back); data-parallel tables an all-reduce of their own. Counted
    with torch's profiler on 2 gloo ranks: table-wise 5 all-to-alls, table-wise with
    column-wise 10, data-parallel 0 and one all-reduce beside the dense part's."""
    c = cluster_of(4, "h100-sxm")
    d = price(_model(), c, 512, "sgd", "fp32", "cuda").dense
    _, alpha = c.link(list(range(4)))
    sync = c.profile.collective_sync
    a2a = 3 * alpha + sync  # an all-to-all over 4 ranks: 3 steps
    assert collective_latency(d, ["table_wise"]) == pytest.approx(5 * a2a)
    assert collective_latency(d, ["table_wise", "table_wise"]) == pytest.approx(5 * a2a)
    assert collective_latency(d, ["table_wise", "column_wise"]) == pytest.approx(10 * a2a)
    both = collective_latency(d, ["data_parallel", "column_wise"])
    assert both == pytest.approx(5 * a2a + 6 * alpha + sync)  # ring all-reduce: 2 (n - 1) steps
    assert collective_latency(d, []) == 0.0


def test_dense_dispatch_is_priced_where_the_profile_prices_it():
    """The tiny DLRM's dense forward, counted on the meta device: two Linear+ReLU (4 ops), the
    interaction's stack, bmm, triu_indices, index and cat (5), the top Linear, ReLU, Linear
    (3); its transposes and squeeze are views. The CPU profile prices each op's dispatch, the
    H100's none (kernels queue ahead of the device)."""
    mf = load_model_file(ROOT / "examples" / "dlrm.py", {"size": "tiny"})
    rec = with_dense_ops(mf, read_model(mf))
    assert rec.dense_forward_ops == 12
    assert rec.dense_backward_ops > rec.dense_forward_ops
    cpu = cluster_of(2, "cpu")
    p = cpu.profile
    plain = price(read_model(mf), cpu, 256, "sgd", "fp32", "cpu").dense
    counted = price(rec, cpu, 256, "sgd", "fp32", "cpu").dense
    dispatch = 12 * p.op_overhead + rec.dense_backward_ops * p.backward_op_overhead
    assert counted.compute_s - plain.compute_s == pytest.approx(dispatch)
    assert counted.backward_s - plain.backward_s == pytest.approx(
        rec.dense_backward_ops * p.backward_op_overhead
    )
    gpu = cluster_of(2, "h100-sxm")
    assert price(rec, gpu, 256, "sgd", "fp32", "cuda").dense.compute_s == pytest.approx(
        price(read_model(mf), gpu, 256, "sgd", "fp32", "cuda").dense.compute_s
    )
