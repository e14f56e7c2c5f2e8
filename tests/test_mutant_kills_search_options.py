"""Each block's priced options for one candidate (planner/search/options.py), written for the
module's generated mutants (docs/mutation.md): the pins' filter on options written here, the
sequence-sharded stream's flags and cuts on cuts written here, and ``price_options`` against
``block_options`` called block by block (the ranks of the candidate's expert- and
context-parallel groups written out, the memo's hits counted)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import networkx as nx
import pytest
from conftest import cluster_of, make_block, make_option

import planner.search.options as options
from planner.cost.block_options import block_options
from planner.search.candidates import Pins
from planner.search.options import (
    AUTO_OFFLOAD,
    cuts_send_shards,
    price_options,
    sequence_stream_flags,
)
from planner.trace.stream import StreamCut
from planner.training import Training

ROOT = Path(__file__).resolve().parent.parent
P = "optimizer+params"  # Offload.PARAMS


def _menu():
    """Every (recompute, offload) pair but selective with offload."""
    return [
        make_option(1.0, 10, 5, rc, off)
        for rc in ("none", "selective", "full")
        for off in ("none", "optimizer", P)
        if not (rc == "selective" and off != "none")
    ]


def _pairs(opts):
    return [(o.recompute, o.offload) for o in opts]


@pytest.mark.parametrize(
    "recompute,offload,expected",
    [
        ("auto", "auto", [(r, o) for r in ("none", "selective", "full") for o in ("none", P)
                          if not (r == "selective" and o != "none")]),
        ("full", "auto", [("full", "none"), ("full", P)]),
        ("selective", "optimizer", [("selective", "none")]),  # none offloaded: the unoffloaded
        ("full", "optimizer", [("full", "optimizer")]),  # a pinned optimizer offload is kept
        ("none", "none", [("none", "none")]),
    ],
)  # fmt: skip
def test_pins_keep_their_options_and_auto_offload_only_what_torch_runs(
    recompute, offload, expected
):
    keep = options._filter(_menu(), Pins(recompute=recompute, offload=offload))
    assert _pairs(keep) == expected
    assert AUTO_OFFLOAD == ("none", P)


def test_a_pin_nothing_offers_falls_back_to_no_recompute_and_no_offload():
    only_none = [o for o in _menu() if o.recompute != "selective"]
    assert _pairs(options._filter(only_none, Pins(recompute="selective"))) == [
        ("none", "none"),
        ("none", P),
    ]
    no_params = [o for o in _menu() if o.offload != P]
    assert _pairs(options._filter(no_params, Pins(recompute="full", offload=P))) == [
        ("full", "none")
    ]
    assert options._filter([], Pins(recompute="full", offload=P)) == []


# ------------------------------------------------------------------ the stream's flags, by hand


def _stream_model(cuts: list[StreamCut], classes: str):
    """Blocks of the given classes (one letter each) over a graph whose cuts are ``cuts``
    (kept where ``_stream_cuts`` reads them); a class offers a sequence-parallel variant
    (one with an exit gather) when its letter is upper case."""
    g = nx.DiGraph()
    g.graph["_stream_cuts"] = cuts
    blocks = [make_block(i, c) for i, c in enumerate(classes)]
    asked = []

    def variants_of(block, tp, pipelined):
        asked.append((block.index, tp, pipelined))
        sp = SimpleNamespace(exit_gather=(("all_gather", 8),) if block.cls.isupper() else ())
        return [SimpleNamespace(exit_gather=()), sp]

    return g, blocks, variants_of, asked


HANDED = StreamCut("x", produced=True, read=True)


def test_blocks_take_and_leave_the_shard_where_the_stream_passes_between_two_sp_blocks():
    cuts = [HANDED, HANDED, StreamCut("y", produced=True), HANDED, HANDED]
    g, blocks, variants_of, asked = _stream_model(cuts, "AABBcA")
    flags = sequence_stream_flags(g, blocks, 2, True, variants_of)
    # cut 0 and 1 chain A-A-B; cut 2 is not handed over; cut 3 meets c, no SP variant
    assert flags == [
        (False, True),
        (True, True),
        (True, False),
        (False, False),
        (False, False),
        (False, False),
    ]
    # each class asked once, on its first block, at the TP degree and pipelined as given
    assert asked == [(0, 2, True), (2, 2, True), (4, 2, True)]


def test_the_shard_passes_through_every_handed_over_cut_of_a_chain_of_sp_blocks():
    g, blocks, variants_of, _ = _stream_model([HANDED], "AA")
    assert sequence_stream_flags(g, blocks, 2, False, variants_of) == [(False, True), (True, False)]
    g, blocks, variants_of, _ = _stream_model([HANDED, HANDED], "AAA")
    assert sequence_stream_flags(g, blocks, 2, False, variants_of) == [
        (False, True), (True, True), (True, False)
    ]  # fmt: skip


@pytest.mark.parametrize("tp,classes", [(1, "AA"), (2, "A")])
def test_no_shard_flows_at_tp_1_or_through_one_block(tp, classes):
    g, blocks, variants_of, asked = _stream_model([HANDED] * (len(classes) - 1), classes)
    assert sequence_stream_flags(g, blocks, tp, False, variants_of) == [(False, False)] * len(
        classes
    )
    assert asked == []


def test_the_cuts_are_found_once_and_again_when_the_blocks_change(monkeypatch):
    g, blocks, variants_of, _ = _stream_model([HANDED], "AA")
    found = []

    def fake(graph, bl):
        found.append(len(bl))
        return [HANDED] * (len(bl) - 1)

    monkeypatch.setattr(options, "stream_at_cuts", fake)
    assert options._stream_cuts(g, blocks) == [HANDED]  # kept: not found again
    three = [*blocks, make_block(2, "A")]
    assert options._stream_cuts(g, three) == [HANDED, HANDED]
    assert g.graph["_stream_cuts"] == [HANDED, HANDED]
    options._stream_cuts(g, three)
    del g.graph["_stream_cuts"]
    options._stream_cuts(g, three)
    assert found == [3, 3]


@pytest.mark.parametrize(
    "cuts,flags,sends",
    [
        # between two flagged blocks the stream must pass straight
        ([HANDED], [(False, True), (True, False)], True),
        ([StreamCut("x", produced=True)], [(False, True), (True, False)], False),
        # after a flagged block the sender slices what it produces
        ([StreamCut("x", produced=True)], [(False, True), (False, False)], True),
        ([StreamCut("x", read=True)], [(True, False), (False, False)], False),
        # before one the receiver gathers what only it reads
        ([StreamCut("x", read=True)], [(False, False), (True, False)], True),
        ([StreamCut("x", produced=True)], [(False, False), (False, True)], False),
        # the first cut, before a flagged block after an unflagged one, then after it
        ([StreamCut("x", read=True), StreamCut("y", produced=True)],
         [(False, False), (True, False), (False, False)], True),
        # neither side sequence-parallel, or no one stream tensor: whole
        ([HANDED], [(False, False), (False, False)], False),
        ([StreamCut(None, True, True)], [(False, True), (True, False)], False),
        # every cut must: the second fails
        ([HANDED, StreamCut("y", read=True)], [(False, True), (True, False), (False, False)],
         False),
        ([HANDED, StreamCut("y", produced=True)], [(False, True), (True, False), (False, False)],
         True),
    ],
)  # fmt: skip
def test_a_cut_sends_shards_only_where_its_sides_can_slice_or_gather_the_stream(cuts, flags, sends):
    g, blocks, _, _ = _stream_model(cuts, "A" * len(flags))
    assert cuts_send_shards(g, blocks, flags) is sends


def test_one_block_has_no_cut_to_send_shards_through():
    g, blocks, _, _ = _stream_model([], "A")
    assert cuts_send_shards(g, blocks, [(True, True)]) is False


# ------------------------------------------------------------------ price_options, block by block


_KEPT: dict = {}  # kept in the module: mutmut's forked children reuse the session's


@pytest.fixture(scope="module")
def moe():
    """The tiny MoE model on 4 nodes of 2 (groups of ranks 0 and 2 cross nodes), and its
    variants with their memo (the sharding ILP solved once a session)."""
    from planner.api import trace, variants_for

    if not _KEPT:
        traced = trace(str(ROOT / "examples" / "moe.py"), {"size": "tiny"},
                       traced_batch_size=1, dtype="bf16")  # fmt: skip
        cluster = cluster_of(8, "h100-sxm", gpus_per_node=2)
        _KEPT["moe"] = traced, cluster, variants_for(traced.graph, cluster, "auto", {})
    return _KEPT["moe"]


@pytest.mark.parametrize(
    "tp,ep,cp,ep_ranks,cp_ranks",
    [(1, 1, 1, [0], [0]), (2, 2, 1, [0, 2], [0]), (1, 2, 2, [0, 1], [0, 1]),
     (2, 1, 2, [0], [0, 2])],
)  # fmt: skip
def test_each_block_gets_its_classs_options_priced_on_the_candidates_groups(
    moe, monkeypatch, tp, ep, cp, ep_ranks, cp_ranks
):
    traced, cluster, variants_of = moe
    graph, blocks = traced.graph, traced.blocks
    training = Training(8, "bf16", "adamw", moe_imbalance=1.5)
    pins = Pins(recompute="full")
    calls = []

    def counted(*args, **kw):
        calls.append(args[1].index)
        return block_options(*args, **kw)

    monkeypatch.setattr(options, "block_options", counted)
    memo: dict = {}
    got = price_options(graph, blocks, tp, 3, cluster, training, pins, variants_of, ep, cp,
                        memo, pipelined=True)  # fmt: skip
    first = {}
    for b in blocks:
        first.setdefault(b.cls, b)
    assert calls == [b.index for b in first.values()]  # a class priced once, on its first block
    assert len(memo) == len(first)
    for b, opts in zip(blocks, got, strict=True):
        rep = first[b.cls]
        want = block_options(graph, rep, variants_of(rep, tp, True), 3, cluster, list(range(tp)),
                             training, ep_ranks=ep_ranks, cp_ranks=cp_ranks)  # fmt: skip
        assert opts == options._filter(want, pins) and opts
        assert {o.recompute for o in opts} == {"full"} or not any(
            o.recompute == "full" for o in want
        )
    # the memo gives the same back without pricing again; another micro-batch is priced
    again = price_options(graph, blocks, tp, 3, cluster, training, pins, variants_of, ep, cp,
                          memo, pipelined=True)  # fmt: skip
    assert again == got and len(calls) == len(first)
    price_options(graph, blocks, tp, 2, cluster, training, pins, variants_of, ep, cp, memo,
                  pipelined=True)  # fmt: skip
    assert len(calls) == 2 * len(first) and len(memo) == 2 * len(first)
    # another training is another key
    price_options(graph, blocks, tp, 3, cluster, replace(training, moe_imbalance=1.25), pins,
                  variants_of, ep, cp, memo, pipelined=True)  # fmt: skip
    assert len(memo) == 3 * len(first)


def test_the_memo_prices_again_when_a_classs_variants_differ_under_the_same_names(moe):
    traced, cluster, variants_of = moe
    graph, blocks = traced.graph, traced.blocks[1:2]
    training = Training(8, "bf16", "adamw")
    memo: dict = {}
    plain = price_options(graph, blocks, 1, 2, cluster, training, Pins(), variants_of, memo=memo)

    def smaller(block, tp, pipelined):
        return [replace(v, saved_bytes=v.saved_bytes // 2) for v in variants_of(block, tp)]

    half = price_options(graph, blocks, 1, 2, cluster, training, Pins(), smaller, memo=memo)
    assert half[0][0].act_bytes == plain[0][0].act_bytes // 2 > 0
    assert half == price_options(graph, blocks, 1, 2, cluster, training, Pins(), smaller)
    # without a memo given, none is kept between calls (a fresh one each time)
    assert price_options(graph, blocks, 1, 2, cluster, training, Pins(), variants_of) == plain
    assert (
        price_options(graph, blocks, 1, 2, cluster, training, Pins(), variants_of, pipelined=False)
        == plain
    )


def test_a_stream_prices_each_layer_by_the_shard_it_takes_and_leaves(monkeypatch):
    """test_sequence_stream's tiny Llama (fp32, TP 2): the stream passes from layer 1 to
    layer 2, so layer 1 leaves the shard and layer 2 takes it; each of them (one class, two
    roles) is priced on its own, with its sequence-parallel variants only, changed by
    ``sequence_stream``; the embedding and the head as without the stream."""
    from planner.api import trace, variants_for
    from planner.cost.sharding import sequence_stream

    if "llama" not in _KEPT:
        traced = trace(str(ROOT / "examples" / "llama.py"), {"size": "tiny"},
                       traced_batch_size=1, dtype="fp32")  # fmt: skip
        cluster = cluster_of(4, "h100-sxm")
        _KEPT["llama"] = traced, cluster, variants_for(traced.graph, cluster, "sequence", {})
    traced, cluster, variants_of = _KEPT["llama"]
    graph, blocks = traced.graph, traced.blocks
    graph.graph.pop("_stream_cuts", None)  # found again here, not kept from another test
    training = Training(8, "fp32", "sgd")
    pins = Pins(offload="none")
    flags = [(False, False), (False, True), (True, False), (False, False)]
    assert sequence_stream_flags(graph, blocks, 2, False, variants_of) == flags
    memo: dict = {}
    got = price_options(graph, blocks, 2, 2, cluster, training, pins, variants_of, memo=memo,
                        stream=True)  # fmt: skip
    assert blocks[1].cls == blocks[2].cls and len(memo) == 4
    for b, (takes, leaves), opts in zip(blocks, flags, got, strict=True):
        rep = blocks[1] if b.cls == blocks[1].cls else b  # a class's first block
        vs = variants_of(rep, 2, False)
        if takes or leaves:
            vs = [sequence_stream(v, takes, leaves) for v in vs if v.exit_gather]
        want = block_options(graph, rep, vs, 2, cluster, [0, 1], training, ep_ranks=[0],
                             cp_ranks=[0])  # fmt: skip
        assert opts == options._filter(want, pins)
        assert {(o.takes_sequence_shard, o.leaves_sequence_shard) for o in opts} == {
            (takes, leaves)
        }
    # pipelined: the flags are asked with the pipeline's variants
    asked = []

    def recording(block, tp, pipelined=False):
        asked.append(pipelined)
        return variants_of(block, tp, pipelined)

    price_options(graph, blocks, 2, 2, cluster, training, pins, recording, pipelined=True,
                  stream=True)  # fmt: skip
    assert set(asked) == {True}
    asked.clear()  # by default: not pipelined, and no stream (every layer entered whole)
    plain = price_options(graph, blocks, 2, 2, cluster, training, pins, recording)
    assert set(asked) == {False}
    assert all(not (o.takes_sequence_shard or o.leaves_sequence_shard) for b in plain for o in b)


def test_the_memo_keeps_each_clusters_options_apart(moe):
    """One memo, two clusters (the same variants): each is priced on its own links."""
    traced, cluster, variants_of = moe
    graph, blocks = traced.graph, traced.blocks[1:2]
    training = Training(8, "bf16", "adamw")
    other = cluster_of(8, "h100-sxm", gpus_per_node=1)  # every rank on a node of its own
    memo: dict = {}
    near = price_options(graph, blocks, 1, 2, cluster, training, Pins(), variants_of, 2,
                         memo=memo)  # fmt: skip
    far = price_options(graph, blocks, 1, 2, other, training, Pins(), variants_of, 2, memo=memo)
    assert far == price_options(graph, blocks, 1, 2, other, training, Pins(), variants_of, 2)
    assert far[0][0].ep_comm_s > near[0][0].ep_comm_s > 0


@pytest.mark.parametrize("tp,ep,cp", [(1, 1, 1), (2, 2, 1), (1, 2, 2), (2, 1, 2), (4, 2, 1)])
def test_a_block_is_priced_alike_at_every_node_count_that_holds_its_groups(moe, tp, ep, cp):
    """pricing_cluster's premise: block_options reads a cluster's profile and how its groups'
    ranks spread over nodes, not how many nodes there are. Each class priced directly on 1
    to 16 nodes of 2 GPUs gives the same options wherever the groups fit (some of them cross
    nodes), and price_options, which prices on the cut cluster, gives each cluster's own."""
    from planner.schema.mesh import Mesh

    traced, _, variants_of = moe
    graph, blocks = traced.graph, traced.blocks
    training = Training(8, "bf16", "adamw", moe_imbalance=1.5)
    groups = list(range(tp)), Mesh(1, ep, tp, ep).ep_group(0), Mesh(1, 1, tp, 1, cp).cp_group(0)
    need = max(max(g) for g in groups) // 2 + 1
    assert options.pricing_cluster(cluster_of(32, gpus_per_node=2), *groups).nodes == need
    for rep in {b.cls: b for b in blocks}.values():
        vs = variants_of(rep, tp, True)
        priced = [
            block_options(
                graph,
                rep,
                vs,
                3,
                cluster_of(2 * n, gpus_per_node=2),
                groups[0],
                training,
                ep_ranks=groups[1],
                cp_ranks=groups[2],
            )  # fmt: skip
            for n in (need, need + 1, 8, 16)
        ]
        assert priced[0] and all(p == priced[0] for p in priced)
    for n in (need, 16):
        cl = cluster_of(2 * n, gpus_per_node=2)
        got = price_options(graph, blocks, tp, 3, cl, training, Pins(), variants_of, ep, cp,
                            pipelined=True)  # fmt: skip
        for b, opts in zip(blocks, got, strict=True):
            rep = next(r for r in blocks if r.cls == b.cls)
            want = block_options(graph, rep, variants_of(rep, tp, True), 3, cl, groups[0],
                                 training, ep_ranks=groups[1], cp_ranks=groups[2])  # fmt: skip
            assert opts == options._filter(want, Pins())


def test_one_kept_memo_prices_a_class_once_for_every_node_count(moe, monkeypatch):
    """A pool's plans of one kind share the options priced on the cut cluster: with one
    BoundMemo kept across clusters of 2, 4 and 8 nodes, each class is priced once."""
    from planner.search.bound_memo import BoundMemo

    traced, _, variants_of = moe
    graph, blocks = traced.graph, traced.blocks
    training = Training(8, "bf16", "adamw")
    calls = []

    def counted(*args, **kw):
        calls.append(args[4])
        return block_options(*args, **kw)

    monkeypatch.setattr(options, "block_options", counted)
    kept, got = BoundMemo(), []
    for n in (2, 4, 8):
        got.append(price_options(graph, blocks, 2, 2, cluster_of(2 * n, gpus_per_node=2),
                                 training, Pins(), variants_of, 2, memo={}, kept=kept))  # fmt: skip
    classes = len({b.cls for b in blocks})
    assert len(calls) == classes and {c.nodes for c in calls} == {2}  # ranks 0..3: two nodes
    assert got[0] == got[1] == got[2]
    # a cluster too small for the groups is left as it is (pricing it raises, as before)
    small = cluster_of(2, gpus_per_node=2)
    assert options.pricing_cluster(small, [0, 1, 2]) is small
