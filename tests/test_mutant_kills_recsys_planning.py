"""Tests written for mutmut's generated mutants of planner/recsys/planning.py (a recommendation
model planned: the request checked, the fit checked, the smallest cluster suggested, the plan
dict assembled; benchmarks/generated_mutants.py). The plan dict is worked field by field from
prices written here; the fit checks and the suggested cluster from options sized by hand; whole
plans of small model files written here are compared with test_recsys_solver's brute force
over every option and placement. docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import highspy
import pytest
import torchrec  # noqa: F401  (no skip: the README's test command installs the recsys extra)

from planner.errors import InfeasibleError, UserInputError
from planner.hardware.cluster import Cluster
from planner.hardware.profiles import load_profile
from planner.modelfile import ModelFile, load_model_file
from planner.recsys.cost import Costed, DenseCost, TableOption, price
from planner.recsys.milp import Assignment
from planner.recsys.planning import (
    GIB,
    MAX_GPUS,
    assemble,
    check_fits,
    dense_strategies,
    plan_recsys,
    smallest_cluster,
)
from planner.recsys.tables import RecModel, TableBlock, read_model
from planner.training import Training
from tests.conftest import cluster_of
from tests.test_recsys_solver import brute_force


@pytest.fixture(autouse=True)
def _own_highs_scheduler():
    """mutmut forks a child per mutant from the process that ran the clean tests; HiGHS's task
    scheduler's threads do not come with a fork (planner/search/overlap.py), and the recsys
    MILP (cvxpy's HiGHS) would wait on them forever: each test starts it afresh."""
    highspy.Highs.resetGlobalScheduler(False)


H100 = load_profile("h100-sxm")
ROOT = Path(__file__).resolve().parent.parent


def option(table, label, sharding, placement, count, dev, host=0.0, **kw) -> TableOption:
    return TableOption(table, label, sharding, "fused", placement, count, 0.0, 0.0, dev, host, **kw)


def costed(options, ranks=2, per_node=2, cap=10.0, host=10.0, tables=None) -> Costed:
    """Prices whose only figures are the options' bytes (in GiB) and the capacities."""
    dense = DenseCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5 * GIB, 1)
    opts = {name: [replace(o, device_bytes=o.device_bytes * GIB,
                           host_bytes=o.host_bytes * GIB) for o in os_]
            for name, os_ in options.items()}  # fmt: skip
    return Costed(tables or [], opts, dense, ranks, per_node, cap * GIB, host * GIB, "cuda", 8)


# --------------------------------------------------------------------------- assemble


def test_the_plan_dict_field_by_field():
    """Two tables on 2 H100s: "a" table-wise on rank 1, "b" data-parallel on both. Exposed
    all-reduce: 1e-3 + 1e-9 x 2e6 - 0.5 x 4e-3 = 1e-3; latency: table-wise's 5 all-to-alls of
    1e-4 plus the data-parallel all-reduce's 3e-4 = 8e-4; fixed: 1e-2 + 2e-3 + 5e-4 + 1e-3 +
    8e-4 = 1.43e-2. Rank 0 holds b, rank 1 holds a and b."""
    cluster = cluster_of(2, "h100-sxm")
    ta = TableBlock("a", "ebc", ("fa", "fb"), 100, 8, 1.5, 0.25)
    tb = TableBlock("b", "top.ebc", ("fc",), 50, 4, 2.0, 0.0)
    model = RecModel([ta, tb], dense_params=321, dense_tensors=4, dense_flops_per_sample=1.0,
                     dense_activations_per_sample=1.0)  # fmt: skip
    oa = TableOption("a", "host0.2", "table_wise", "fused_uvm_caching", "rank", 1,
                     lookup_s=1e-3, comm_s=2e-3, device_bytes=3e6, host_bytes=4e6,
                     optimizer_s=0.0, cache_ratio=0.2)  # fmt: skip
    ob = TableOption("b", "dp", "data_parallel", "dense", "all", 2, lookup_s=5e-3,
                     comm_s=0.0, device_bytes=6e6, host_bytes=0.0, allreduce_bytes=2e6,
                     optimizer_s=7e-4)  # fmt: skip
    dense = DenseCost(compute_s=1e-2, backward_s=4e-3, optimizer_s=2e-3, allreduce_fixed_s=1e-3,
                      allreduce_s_per_byte=1e-9, comm_overlap=0.5, a2a_latency_s=1e-4,
                      dp_allreduce_latency_s=3e-4, device_bytes=9e6, params=321,
                      strategy="fsdp", forward_exposed_s=5e-4)  # fmt: skip
    c = Costed([ta, tb], {"a": [oa], "b": [ob]}, dense, 2, 2, 1e10, 1e10, "cuda", 16)
    found = Assignment({"a": oa, "b": ob}, {"a": [1], "b": [0, 1]}, 0.0222, "feasible", 0.0125,
                       1.5, 77, c)  # fmt: skip
    mf = ModelFile(Path("/m/rec.py"), "abc123", "", {"size": "tiny"})
    training = Training(16, dtype="bf16", optimizer="adamw", lr=0.02)
    notes = ["one", "two"]
    doc = assemble(mf, model, c, cluster, found, training, "cuda", notes)
    fixed = 1e-2 + 2e-3 + 5e-4 + 1e-3 + 8e-4
    base = 9e6 + H100.reserved_bytes
    rank0 = {"rank": 0, "step_s": fixed + 5e-3 + 7e-4, "lookup_s": 5e-3, "comm_s": 0.0,
             "optimizer_s": 7e-4, "device_bytes": base + 6e6, "host_bytes": 0.0}  # fmt: skip
    rank1 = {"rank": 1, "step_s": fixed + 6e-3 + 2e-3 + 7e-4, "lookup_s": 6e-3, "comm_s": 2e-3,
             "optimizer_s": 7e-4, "device_bytes": base + 9e6, "host_bytes": 4e6}  # fmt: skip
    want = {
        "schema": "meshplan.recplan/1",
        "model": {
            "file": "/m/rec.py",
            "sha256": "abc123",
            "args": {"size": "tiny"},
            "embedding_params": 1000,
            "dense_params": 321,
            "tables": 2,
        },  # fmt: skip
        "cluster": {"profile": "h100-sxm", "nodes": 1, "gpus_per_node": 2, "gpus": 2},
        "device": "cuda",
        "global_batch_size": 16,
        "optimizer": "adamw",
        "lr": 0.02,
        "dtype": "bf16",
        "dense": {
            "strategy": "fsdp",
            "params": 321,
            "compute_s": 1e-2,
            "optimizer_s": 2e-3,
            "allreduce_exposed_s": 1e-3,
            "collective_latency_s": 8e-4,
            "forward_exposed_s": 5e-4,
            "device_bytes": 9e6,
        },  # fmt: skip
        "tables": [
            {
                "name": "a",
                "module": "ebc",
                "features": ["fa", "fb"],
                "rows": 100,
                "dim": 8,
                "pooling_factor": 1.5,
                "zipf": 0.25,
                "option": "host0.2",
                "sharding": "table_wise",
                "kernel": "fused_uvm_caching",
                "ranks": [1],
                "cache_ratio": 0.2,
                "lookup_s": 1e-3,
                "comm_s": 2e-3,
                "optimizer_s": 0.0,
                "device_bytes": 3e6,
                "host_bytes": 4e6,
            },
            {
                "name": "b",
                "module": "top.ebc",
                "features": ["fc"],
                "rows": 50,
                "dim": 4,
                "pooling_factor": 2.0,
                "zipf": 0.0,
                "option": "dp",
                "sharding": "data_parallel",
                "kernel": "dense",
                "ranks": [0, 1],
                "cache_ratio": None,
                "lookup_s": 5e-3,
                "comm_s": 0.0,
                "optimizer_s": 7e-4,
                "device_bytes": 6e6,
                "host_bytes": 0.0,
            },
        ],  # fmt: skip
        "ranks": [rank0, rank1],
        "predicted": {
            "step_time_s": 0.0222,
            "samples_per_s": 16 / 0.0222,
            "peak_device_bytes": base + 9e6,
            "peak_host_bytes": 4e6,
            "device_capacity_bytes": H100.memory_bytes,
        },  # fmt: skip
        "solver": {"status": "feasible", "gap": 0.0125, "solve_time_s": 1.5, "variables": 77},
        "notes": ["one", "two"],
    }
    assert _close(doc, want)
    assert list(doc) == list(want)
    assert doc["notes"] is not notes  # a copy: later notes do not change a plan's


def _close(got, want, path="doc") -> bool:
    """Equal, floats to 1e-12 relative, dicts with the same keys, lists in the same order."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), path
        return all(_close(got[k], want[k], f"{path}.{k}") for k in want)
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), path
        return all(_close(g, w, f"{path}[{i}]") for i, (g, w) in enumerate(zip(got, want)))
    if isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-12, abs=0), path
        return True
    assert type(got) is type(want) and got == want, path
    return True


# --------------------------------------------------------------------------- fits


def test_two_ranks_and_more_may_shard_the_dense_part():
    assert dense_strategies(cluster_of(1)) == ("ddp",)
    assert dense_strategies(cluster_of(2)) == ("ddp", "fsdp")
    assert dense_strategies(cluster_of(16)) == ("ddp", "fsdp")


def check(c: Costed, model_tables, cluster=None, costed_for=None) -> str | None:
    model = RecModel(model_tables, 0, 0, 0.0, 0.0)
    cluster = cluster or Cluster(H100, 1, 2)
    try:
        check_fits(model, c, cluster, costed_for or (lambda _: c))
    except InfeasibleError as exc:
        return str(exc)
    return None


T = [TableBlock("a", "ebc", ("f",), 1_000_000, 16, 1.0, 0.0)]
T2 = [*T, TableBlock("b", "ebc", ("g",), 5, 4, 1.0, 0.0)]


def test_an_option_that_fills_a_rank_exactly_fits():
    """Device and host bytes each equal to the capacity: fits (and on 2 ranks, 2 x 10 GiB of
    least memory fills them exactly)."""
    c = costed({"a": [option("a", "tw", "table_wise", "rank", 1, 10.0, 10.0)],
                "b": [option("b", "tw", "table_wise", "rank", 1, 10.0)]})  # fmt: skip
    assert check(c, T2) is None


def test_the_dense_part_alone_over_the_memory_is_said():
    opts = {"a": [option("a", "tw", "table_wise", "rank", 1, 5.0)]}
    c = replace(costed(opts, cap=0.0), dense=replace(costed({}).dense, device_bytes=3.25 * GIB))
    assert check(c, T) == (
        "the dense part alone needs 3.2 GiB per rank, more than h100-sxm's memory: use a "
        "profile with more memory"
    )
    assert check(replace(c, device_capacity=-1.0), T).startswith("the dense part alone")
    assert check(replace(c, device_capacity=1.0), T).startswith("table 'a'")  # 1 byte left


@pytest.mark.parametrize(
    "opts, why",
    [
        ([option("a", "tw", "table_wise", "rank", 1, 10.5)], "device"),
        ([option("a", "host", "table_wise", "rank", 1, 1.0, 10.5)], "host"),
        (
            [
                option("a", "tw", "table_wise", "rank", 1, 12.0),
                option("a", "h", "table_wise", "rank", 1, 1.0, 11.0),
            ],
            "each",
        ),  # fmt: skip
    ],
)
def test_a_table_that_fits_no_rank_names_its_smallest_shard_and_a_cluster(opts, why):
    """The smallest shard's device bytes, the capacity and the suggestion (here none: the
    costed_for of every cluster is the same, and nothing grows the capacity)."""
    c = costed({"a": opts})
    smallest = min(o.device_bytes for o in opts)
    assert check(c, T) == (
        f"table 'a' (1,000,000 rows x 16) fits no rank even sharded: its smallest shard needs "
        f"{smallest:.1f} GiB of the 10.0 GiB free per h100-sxm; try a profile with more memory "
        "per device (no cluster of this one holds it)"
    )


def test_tables_that_fit_one_by_one_but_not_together_are_said():
    """6.4 GiB a rank. a: 6 GiB table-wise; b: 4 GiB on each of a node's 2 ranks (8 GiB) or
    7 GiB on one rank (which no rank holds): least 6 + 7 = 13 > 2 x 6.4 GiB. The smallest
    cluster: 3 ranks (19.2 GiB)."""
    opts = {"a": [option("a", "tw", "table_wise", "rank", 1, 6.0)],
            "b": [option("b", "twrw", "table_row_wise", "node", 1, 4.0),
                  option("b", "tw", "table_wise", "rank", 1, 7.0)]}  # fmt: skip
    c = costed(opts, cap=6.4)

    def costed_for(cl: Cluster) -> Costed:
        return replace(c, ranks=cl.gpus, gpus_per_node=cl.gpus_per_node)

    assert check(c, T2, Cluster(H100, 1, 2), costed_for) == (
        "the 2 tables need more memory than 2 x h100-sxm hold; try --gpus 3 (the smallest "
        "cluster of h100-sxm that fits)"
    )
    # counted per node: b's node option holds 4 GiB on each of the node's 2 ranks, 6 + 8 > 2 x
    # 6.9 GiB; on nodes of one rank 6 + 4 fits
    c2 = costed({"a": opts["a"], "b": opts["b"][:1]}, cap=6.9)
    assert check(c2, T2, Cluster(H100, 1, 2), costed_for).startswith("the 2 tables need more")
    assert check(replace(c2, gpus_per_node=1), T2) is None


def stepped(need_gib: float, profile=H100, start: int = 1):
    """The cluster smallest_cluster suggests for a table whose row-wise shard needs
    ``need_gib`` x 8 / n GiB on each of n ranks, 1 GiB free per rank; and the clusters it tried."""
    tried = []

    def costed_for(cl: Cluster) -> Costed:
        tried.append((cl.gpus, cl.nodes, cl.gpus_per_node))
        shard = option("a", "rw", "row_wise", "all", cl.gpus, need_gib * 8 / cl.gpus)
        return costed({"a": [shard]}, ranks=cl.gpus, per_node=cl.gpus_per_node, cap=1.0)

    start_cluster = Cluster(profile, 1, start)
    return smallest_cluster(start_cluster, costed_for, "a"), tried


def test_the_smallest_cluster_counts_single_ranks_then_whole_nodes_then_doubles():
    """8-GPU nodes: 2, 3, ... ranks inside one node, then 16, 24, ... whole nodes to 64, then
    doubling (128, 256, ...). A table needing n >= 5 fits 5 ranks; n >= 20: 24; n >= 100: 128."""
    got, tried = stepped(5 / 8)
    assert got == "--gpus 5 (the smallest cluster of h100-sxm that fits)"
    assert tried == [(2, 1, 2), (3, 1, 3), (4, 1, 4), (5, 1, 5)]
    got, tried = stepped(20 / 8)
    assert got == "--gpus 24 (the smallest cluster of h100-sxm that fits)"
    assert [t[0] for t in tried] == [2, 3, 4, 5, 6, 7, 8, 16, 24]
    assert tried[-3:] == [(8, 1, 8), (16, 2, 8), (24, 3, 8)]
    got, tried = stepped(100 / 8)
    assert got == "--gpus 128 (the smallest cluster of h100-sxm that fits)"
    assert [t[0] for t in tried][-4:] == [48, 56, 64, 128]
    assert tried[-1] == (128, 16, 8)
    got, tried = stepped(64 / 8, start=8)  # 64 exactly: fits at 64 after 16, 24, ... 56
    assert got == "--gpus 64 (the smallest cluster of h100-sxm that fits)"
    assert [t[0] for t in tried] == [16, 24, 32, 40, 48, 56, 64]


def test_the_search_gives_up_past_the_largest_cluster():
    got, tried = stepped(MAX_GPUS * 2 / 8)
    assert got == "a profile with more memory per device (no cluster of this one holds it)"
    assert tried[-1][0] <= MAX_GPUS and tried[-1][0] * 2 > MAX_GPUS
    assert MAX_GPUS == 65536
    got, _ = stepped(MAX_GPUS / 8)  # exactly the largest: found
    assert got == "--gpus 65536 (the smallest cluster of h100-sxm that fits)"


def test_the_smallest_cluster_also_needs_every_table_and_the_dense_part_to_fit():
    """Without a table named: every table must fit somewhere; a cluster whose dense part
    leaves no memory (here below 4 ranks) or whose tables' least total overflows is skipped."""
    per_rank = 1.0

    def costed_for(cl: Cluster) -> Costed:
        cap = -1.0 if cl.gpus < 4 else per_rank
        a = option("a", "rw", "row_wise", "all", cl.gpus, 2 / cl.gpus)
        b = option("b", "tw", "table_wise", "rank", 1, 0.9 if cl.gpus > 5 else 1.5)
        return costed({"a": [a], "b": [b]}, ranks=cl.gpus, per_node=cl.gpus_per_node, cap=cap)

    assert smallest_cluster(Cluster(H100, 1, 1), costed_for) == (
        "--gpus 6 (the smallest cluster of h100-sxm that fits)"
    )
    # with the table named, b's fit does not matter: a fits at 4 (0.5 GiB, total 2 + 1.5 < 4)
    assert smallest_cluster(Cluster(H100, 1, 1), costed_for, "a") == (
        "--gpus 4 (the smallest cluster of h100-sxm that fits)"
    )


def test_the_smallest_cluster_needs_memory_left_and_the_tables_least_total():
    """Three tables of 6 GiB, 6.4 GiB a rank: each fits a rank of 2, together they need 3.
    A cluster with no memory left (0 bytes) is skipped even for tables of 0 bytes; one byte
    left is memory left."""

    def three(cl: Cluster) -> Costed:
        opts = {n: [option(n, "tw", "table_wise", "rank", 1, 6.0)] for n in "abc"}
        return costed(opts, ranks=cl.gpus, per_node=cl.gpus_per_node, cap=6.4)

    found = "--gpus {} (the smallest cluster of h100-sxm that fits)"
    assert smallest_cluster(Cluster(H100, 1, 1), three) == found.format(3)

    def empty(cap_of):
        def costed_for(cl: Cluster) -> Costed:
            opts = {"a": [option("a", "tw", "table_wise", "rank", 1, 0.0)]}
            return costed(opts, ranks=cl.gpus, per_node=cl.gpus_per_node, cap=cap_of(cl.gpus))

        return costed_for

    assert smallest_cluster(Cluster(H100, 1, 1), empty(lambda n: 0.0 if n < 3 else 1.0)) == (
        found.format(3)
    )
    assert smallest_cluster(Cluster(H100, 1, 1), empty(lambda n: 1 / GIB)) == found.format(2)


# --------------------------------------------------------------------------- plan_recsys

MODEL = """
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}
NAMES = NAMES_HERE


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name=n, embedding_dim=DIM, num_embeddings=ROWS, feature_names=[n])
            for n in NAMES
        ])
        self.head = torch.nn.Linear(DIM * len(NAMES), 1)

    def forward(self, sparse):
        return self.head(self.ebc(sparse).values()).squeeze(1)


def build_model():
    return M()


def embedding_stats():
    return {n: {"pooling_factor": 1.0 + i, "zipf": 0.5 * i} for i, n in enumerate(NAMES)}


def make_batch(batch_size, step=0):
    lengths = torch.ones(batch_size * len(NAMES), dtype=torch.long)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=list(NAMES), values=torch.zeros(int(lengths.sum()), dtype=torch.long),
        lengths=lengths)
    return kjt, torch.zeros(batch_size)


def loss_fn(out, y):
    return torch.nn.functional.binary_cross_entropy_with_logits(out, y)
"""


def model_file(tmp_path, names=("a", "b"), dim=8, rows=64, name="rec.py") -> ModelFile:
    path = tmp_path / name
    text = MODEL.replace("NAMES_HERE", repr(tuple(names)))
    path.write_text(text.replace("DIM", str(dim)).replace("ROWS", str(rows)))
    return load_model_file(path)


def test_only_sgd_and_adamw_train_tables(tmp_path):
    with pytest.raises(UserInputError) as info:
        plan_recsys(
            model_file(tmp_path), 2, profile="h100-sxm", training=Training(8, "fp32", "adam")
        )
    assert str(info.value) == (
        "rec.py: recommendation models train with --optimizer one of ('sgd', 'adamw') "
        "(TorchRec's fused EXACT_SGD or Adam for the tables), not 'adam'"
    )


def test_a_batch_that_does_not_split_over_the_ranks_is_refused(tmp_path):
    with pytest.raises(UserInputError) as info:
        plan_recsys(
            model_file(tmp_path), 3, profile="h100-sxm", training=Training(8, "fp32", "sgd")
        )
    assert str(info.value) == (
        "global batch 8 does not split over 3 ranks: use a multiple of 3 (--global-batch-size)"
    )


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_a_plan_is_the_brute_force_optimum_over_options_placements_and_dense_strategies(
    tmp_path, optimizer
):
    """Two tables on 2 H100s: the plan's step is the least step of every assignment that fits
    under either dense strategy (test_recsys_solver's brute force over each's prices), and the
    plan's strategy is that one's; everything else of the plan is assemble's."""
    mf = model_file(tmp_path)
    training = Training(8, dtype="fp32", optimizer=optimizer, lr=0.5)
    doc, notes = plan_recsys(mf, 2, profile="h100-sxm", training=training, memory_fraction=0.9)
    cluster = cluster_of(2, "h100-sxm")
    model = read_model(mf)
    prices = {
        st: price(model, cluster, 8, optimizer, "fp32", "cuda", 0.9, st) for st in ("ddp", "fsdp")
    }
    # the brute force's step leaves out ZeRO-3's exposed forward all-gather (its instances
    # have none): a constant of the strategy, added here
    best = {st: brute_force(c) + c.dense.forward_exposed_s for st, c in prices.items()}
    want = min(best.values())
    assert want <= doc["predicted"]["step_time_s"] <= want * (1 + 1e-3)
    assert doc["dense"]["strategy"] == min(best, key=best.get)
    assert doc["optimizer"] == optimizer
    assert (doc["lr"], doc["dtype"], doc["global_batch_size"], doc["device"]) == (
        0.5,
        "fp32",
        8,
        "cuda",
    )
    assert doc["cluster"] == {"profile": "h100-sxm", "nodes": 1, "gpus_per_node": 2, "gpus": 2}
    assert doc["model"]["embedding_params"] == 2 * 64 * 8
    pooling = {t["name"]: (t["pooling_factor"], t["zipf"]) for t in doc["tables"]}
    assert pooling == {"a": (1.0, 0.0), "b": (2.0, 0.5)}
    assert notes == ["2 GPUs fill part of one 8-GPU node: planning 1 node of 2"]
    assert doc["notes"] == notes


def test_the_dense_strategy_followed_is_the_one_the_solver_chose(tmp_path):
    """One rank: DDP only, and its capacity is the profile's at memory_fraction 0.5 less the
    reserve and the dense part (its predicted peak stays within it)."""
    doc, _ = plan_recsys(
        model_file(tmp_path), 1, profile="h100-sxm", training=Training(8, "fp32", "sgd"),
        memory_fraction=0.5,
    )  # fmt: skip
    assert doc["dense"]["strategy"] == "ddp"
    assert doc["cluster"]["gpus"] == 1
    assert doc["predicted"]["peak_device_bytes"] <= 0.5 * H100.memory_bytes


def test_the_cluster_flags_reach_the_cluster(tmp_path):
    mf = model_file(tmp_path)
    training = Training(8, "fp32", "sgd")
    doc, _ = plan_recsys(mf, None, profile="h100-sxm", nodes=1, training=training)
    assert doc["cluster"] == {"profile": "h100-sxm", "nodes": 1, "gpus_per_node": 8, "gpus": 8}
    doc, notes = plan_recsys(mf, 4, profile="h100-sxm", gpus_per_node=2, training=training)
    assert doc["cluster"] == {"profile": "h100-sxm", "nodes": 2, "gpus_per_node": 2, "gpus": 4}
    doc, notes = plan_recsys(mf, 2, profile="a100-80g", training=training)
    assert doc["cluster"]["profile"] == "a100-80g"


def test_on_cpu_the_gpu_only_options_are_said_and_the_dense_dispatch_priced(tmp_path):
    """The cpu profile prices host dispatch per op: the dense part's ops are counted (a
    Linear and a squeeze forward), so its compute exceeds the same model's without them."""
    mf = model_file(tmp_path)
    training = Training(8, "fp32", "sgd")
    doc, notes = plan_recsys(mf, 2, profile="cpu", training=training, device="cpu")
    assert notes[-1] == (
        "device cpu: row-wise, table-row-wise and host-memory tables are not offered "
        "(TorchRec runs them on CUDA only)"
    )
    assert {t["sharding"] for t in doc["tables"]} <= {"table_wise", "column_wise", "data_parallel"}
    cluster = cluster_of(2, "cpu")
    bare = price(read_model(mf), cluster, 8, "sgd", "fp32", "cpu", 1.0, doc["dense"]["strategy"])
    assert doc["dense"]["compute_s"] > bare.dense.compute_s
    doc, notes = plan_recsys(mf, 2, profile="h100-sxm", training=training, device="cpu")
    assert notes[-1].startswith("device cpu:")
    assert doc["dense"]["compute_s"] == price(read_model(mf), cluster_of(2, "h100-sxm"), 8,
                                              "sgd", "fp32", "cpu", 1.0,
                                              doc["dense"]["strategy"]).dense.compute_s  # fmt: skip


def test_tables_that_fit_but_admit_no_placement_are_infeasible_naming_a_cluster(tmp_path):
    """Three tables of dim 4 on 2 CPU ranks (no column-wise split of 4 columns, data-parallel
    holds each table twice): each table-wise shard S fits, 3 S fits in 2 ranks' 1.75 S each,
    but a placement puts two on one rank (2 S). Three ranks hold them."""
    rows = 100_000_000
    mf = model_file(tmp_path, ("a", "b", "c"), dim=4, rows=rows)
    training = Training(6, "fp32", "sgd")
    cpu = load_profile("cpu")
    shard = rows * 4 * 4 + 2 * 6 * 4 * 4  # the table's rows, then the pooled buffers
    at_one = price(read_model(mf), cluster_of(2, "cpu"), 6, "sgd", "fp32", "cpu", 1.0, "ddp")
    used = cpu.memory_bytes - at_one.device_capacity  # the reserve and the dense part
    fraction = (1.75 * shard + used) / cpu.memory_bytes
    with pytest.raises(InfeasibleError) as info:
        plan_recsys(mf, 2, profile="cpu", training=training, device="cpu", memory_fraction=fraction)
    assert str(info.value) == (
        "no placement of the 3 tables fits the memory of 2 x cpu; try --gpus 3 (the smallest "
        "cluster of cpu that fits)"
    )
    # a table that fits nowhere at that memory is said before solving, with the same capacity
    big = model_file(tmp_path, ("a",), dim=4, rows=2 * rows, name="big.py")
    with pytest.raises(InfeasibleError) as info:
        plan_recsys(
            big, 2, profile="cpu", training=training, device="cpu", memory_fraction=fraction
        )
    free = 1.75 * shard / GIB
    assert str(info.value).startswith(
        f"table 'a' (200,000,000 rows x 4) fits no rank even sharded: its smallest shard needs "
        f"{(2 * rows * 16 + 2 * 6 * 16) / GIB:.1f} GiB of the {free:.1f} GiB free per cpu; try "
    )


@pytest.mark.parametrize("forward, backward", [(2e-5, 0.0), (0.0, 3e-5)])
def test_either_dispatch_overhead_has_the_dense_ops_counted(tmp_path, forward, backward):
    """A profile pricing only the forward's dispatch, or only the backward's: the dense
    part's ops are counted either way (its compute exceeds the price of the uncounted
    model by the ops times the overhead it prices)."""
    text = (ROOT / "profiles" / "cpu.toml").read_text()
    text = re.sub(r"(?m)^op_overhead_s = \S+", f"op_overhead_s = {forward!r}", text)
    text = re.sub(
        r"(?m)^backward_op_overhead_s = \S+", f"backward_op_overhead_s = {backward!r}", text
    )
    path = tmp_path / "half.toml"
    path.write_text(text)
    mf = model_file(tmp_path)
    doc, _ = plan_recsys(
        mf, 2, profile=str(path), training=Training(8, "fp32", "sgd"), device="cpu"
    )
    cluster = Cluster(load_profile(str(path)), 1, 2)
    strategy = doc["dense"]["strategy"]
    bare = price(read_model(mf), cluster, 8, "sgd", "fp32", "cpu", 1.0, strategy).dense.compute_s
    assert doc["dense"]["compute_s"] > bare


def test_a_model_without_embedding_stats_says_its_pooling_was_measured(tmp_path):
    path = tmp_path / "measured.py"
    path.write_text(
        MODEL.replace("NAMES_HERE", "('a', 'b')").replace("DIM", "8").replace("ROWS", "64")
        .replace("def embedding_stats():", "def _unused_stats():")
    )  # fmt: skip
    mf = load_model_file(path)
    doc, notes = plan_recsys(mf, 2, profile="h100-sxm", training=Training(8, "fp32", "sgd"))
    assert notes == [
        "2 GPUs fill part of one 8-GPU node: planning 1 node of 2",
        "pooling factors measured on make_batch(256); ids priced as uniform (define "
        "embedding_stats() in the model file to give their skew)",
    ]
    assert doc["notes"] == notes
