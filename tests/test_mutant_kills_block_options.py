"""A block's options (planner/cost/block_options.py) at numbers worked by hand, written for the
module's generated mutants (docs/mutation.md): the all-to-all buffer of an expert-parallel
block, the BatchNorms that synchronise batch statistics and the batch they need, on graphs
and dictionaries written here."""

from __future__ import annotations

import networkx as nx
import pytest
from conftest import make_block

from planner.cost.block_options import (
    batch_norm_channels,
    batch_statistics_floor,
    batch_statistics_shapes,
    dispatch_bytes,
)
from planner.training import Training

BN = "aten.native_batch_norm.default"


@pytest.mark.parametrize(
    "dtype,imbalance,expected",
    [
        # 64 routed rows x micro-batch scale 2 x capacity 1.25 x imbalance 1.5 = 240 rows of 32
        ("bf16", 1.5, 240 * 32 * 2),
        ("fp32", 1.5, 240 * 32 * 4),  # fp32 activations: 4 bytes
        ("fp32", 1.0, 160 * 32 * 4),
    ],
)
def test_an_all_to_all_buffer_is_the_routed_rows_padded_times_width_and_bytes(
    dtype, imbalance, expected
):
    training = Training(8, dtype, "adamw", moe_capacity_factor=1.25, moe_imbalance=imbalance)
    moe = {"routed_rows": 64, "width": 32}
    assert dispatch_bytes(moe, 2, training) == expected


def _bn_graph() -> tuple[nx.DiGraph, list]:
    """Two blocks: block 0 a training-mode BatchNorm over [8, 16, 4, 4] (args[5] True), an
    eval-mode one (False) and a product; block 1 a training-mode BatchNorm1d over [8, 32] and
    one over a [8, 24, 1, 1] pooled map."""
    g = nx.DiGraph()

    def bn(name, shape, training=True):
        args = [{"node": "x"}, None, None, None, None, training, 0.1, 1e-5]
        g.add_node(name, op=BN, args=args, shapes=[shape])

    bn("bn0", [8, 16, 4, 4])
    bn("bn_eval", [8, 64, 4, 4], training=False)
    g.add_node("mm", op="aten.mm.default", args=[None] * 8, shapes=[[8, 16]])
    bn("bn1", [8, 32])
    bn("bn_pooled", [8, 24, 1, 1])
    b0, b1 = make_block(0, "a"), make_block(1, "b")
    b0.nodes, b1.nodes = ["bn0", "bn_eval", "mm"], ["bn1", "bn_pooled"]
    return g, [b0, b1]


def test_only_batch_norms_in_training_mode_synchronise_their_channels():
    g, (b0, b1) = _bn_graph()
    assert batch_norm_channels(g, b0) == (16,)
    assert batch_norm_channels(g, b1) == (32, 24)
    assert batch_statistics_shapes(g) == [[8, 16, 4, 4], [8, 32], [8, 24, 1, 1]]
    g.add_node("bn_flat", op=BN, args=[None] * 5 + [True], shapes=[[8]])
    b1.nodes.append("bn_flat")
    assert batch_norm_channels(g, b1) == (32, 24, 1)  # no channel dimension: one channel


def test_one_value_a_channel_needs_two_samples_and_a_map_needs_one():
    g, _ = _bn_graph()
    assert batch_statistics_floor(g) == 2  # [8, 32] and the 1 x 1 map: one value a channel
    g.remove_nodes_from(["bn1", "bn_pooled"])
    assert batch_statistics_floor(g) == 1  # a 4 x 4 map has 16 values a channel a sample
    g.add_node("tall", op=BN, args=[None] * 5 + [True], shapes=[[8, 16, 4, 1]])
    assert batch_statistics_floor(g) == 1  # a 4 x 1 map: 4 values
    g.remove_node("tall")
    g.remove_node("bn0")
    assert batch_statistics_shapes(g) == []
    assert batch_statistics_floor(g) == 1
    # one map of 1 x 1 alone
    g.add_node("p", op=BN, args=[None] * 5 + [True], shapes=[[8, 24, 1, 1]])
    assert batch_statistics_floor(g) == 2


S, H, HEADS = 64, 256, 8  # tests/test_selective_runtime.py's Llama layer
LLAMA = dict(
    size="tiny", layers=2, hidden=H, heads=HEADS, kv_heads=2, ffn=512, seq_len=S, vocab=1000
)


@pytest.fixture(scope="module")
def llama():
    from pathlib import Path

    from planner.api import trace

    root = Path(__file__).resolve().parent.parent
    return trace(str(root / "examples" / "llama.py"), LLAMA, traced_batch_size=1, dtype="bf16")


def test_selective_kept_of_a_tp_variant_is_one_ranks_bytes_under_the_runtimes_policy(llama):
    """test_selective_runtime's per-rank count: the Llama layer's sequence-parallel TP 2
    variant keeps o and down as their reduce-scattered shards and the input as its shard
    (128 a token each), q, k, v, gate and up halved, SDPA's output and fp32 log-sum-exp
    halved: 2 x 64 x (128 + 128 + 32 + 32 + 128 + 128 + 256 + 256 + 128) + 4 x 4 x 64 bytes.
    torchtitan's policy does not price per rank: a variant changes nothing there."""
    from dataclasses import replace

    from planner.cost.block_options import runtime_selective, selective_kept, selective_ops
    from planner.cost.sharding import tp_variants

    layer = llama.blocks[1]
    sp = next(v for v in tp_variants(llama.graph, layer, 2) if v.name == "tp2-v1-sp")
    runtime = Training(8, "bf16", "adamw")
    kept, recomputed = selective_kept(llama.graph, layer, runtime, sp)
    per_token = 128 + 128 + 32 + 32 + 128 + 128 + 256 + 256 + 128
    assert kept == 2 * S * per_token + 4 * (HEADS // 2) * S
    saved, _ = selective_ops(llama.graph, layer, runtime)
    assert recomputed == runtime_selective(llama.graph, layer, saved, sp)[1]
    # torchtitan's: the whole input, q, v, gate and down (the 1st, 3rd, 5th and 7th weight
    # products), SDPA's output and log-sum-exp, with or without the variant
    titan = replace(runtime, selective_policy="torchtitan-op")
    whole = 2 * S * (256 + 256 + 64 + 256 + 512 + 256) + 4 * HEADS * S
    assert selective_kept(llama.graph, layer, titan)[0] == whole
    assert selective_kept(llama.graph, layer, titan, sp)[0] == whole
