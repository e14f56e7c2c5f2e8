"""Each block's priced options for one candidate's TP degree and micro-batch, filtered by the
user's pins.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from planner.cost.block_options import block_options
from planner.cost.records import BlockOption
from planner.cost.sharding import sequence_stream
from planner.hardware.cluster import Cluster
from planner.schema.mesh import Mesh
from planner.search.bound_memo import BoundMemo, priced_key
from planner.search.candidates import Pins
from planner.trace.blocks import Block
from planner.trace.stream import StreamCut, stream_at_cuts
from planner.training import Training
from planner.vocab import Offload, Recompute

AUTO_OFFLOAD = (Offload.NONE.value, Offload.PARAMS.value)


def price_options(
    graph,
    blocks: list[Block],
    tp: int,
    mbs: int,
    cluster: Cluster,
    training: Training,
    pins: Pins,
    variants_of: Callable[[Block, int, bool], list],
    ep: int = 1,
    cp: int = 1,
    memo: dict | None = None,
    pipelined: bool = False,
    stream: bool = False,
    kept: BoundMemo | None = None,
) -> list[list[BlockOption]]:
    """Options per block (shared by blocks of one class), filtered by the user's pins.
    ``memo`` keeps priced options across searches of one planning run (the baselines search
    the same space again). ``pipelined``: the candidate splits the model into pipeline
    stages (``variants_of``'s third argument). ``stream``: Megatron's sequence-sharded
    residual stream (``Candidate.stream``): each block that can pass the stream's shard to or
    from a neighbour (``sequence_stream_flags``) runs its sequence-parallel variants only,
    priced without the gathers the stream saves; without it, every variant as before, each
    sequence-parallel one entered and left replicated.

    Keyed by the variants themselves (compared by value), not by where they came from: a
    block whose variants are the same pipelined or not, or under the baselines' variant rule,
    is priced once (``block_options`` is a function of its arguments alone). ``kept``: a
    bound_memo.BoundMemo holding options priced by earlier plans of this trace. Priced on
    ``pricing_cluster``: the same options at any node count of one node kind."""
    tp_ranks = list(range(tp))
    ep_ranks = Mesh(1, ep, tp, ep).ep_group(0)
    cp_ranks = Mesh(1, 1, tp, 1, cp).cp_group(0)
    cluster = pricing_cluster(cluster, tp_ranks, ep_ranks, cp_ranks)
    by_class: dict[tuple, list[BlockOption]] = {}
    result = []
    memo = {} if memo is None else memo
    flags = [(False, False)] * len(blocks)
    if stream:
        flags = sequence_stream_flags(graph, blocks, tp, pipelined, variants_of)
    first: dict[str, Block] = {}  # a class is priced on its first block (names rebased later)
    for blk, (takes, leaves) in zip(blocks, flags):
        rep = first.setdefault(blk.cls, blk)
        if (blk.cls, takes, leaves) not in by_class:
            variants = variants_of(rep, tp, pipelined)
            if takes or leaves:
                variants = [sequence_stream(v, takes, leaves) for v in variants if v.exit_gather]
            key = (blk.cls, tp, mbs, ep, cp, tuple(v.name for v in variants), cluster)
            key += (training, takes, leaves)
            found = memo.get(key)
            if found is None or found[0] != variants:
                price = functools.partial(
                    block_options, graph, rep, variants, mbs, cluster, tp_ranks, training,
                    ep_ranks=ep_ranks, cp_ranks=cp_ranks,
                )  # fmt: skip
                if kept is None:
                    opts = price()
                else:
                    args = (rep, variants, mbs, tp, ep, cp, cluster, training)
                    opts = kept.options(priced_key(*args), price)
                found = memo[key] = (variants, cluster, opts)
            by_class[blk.cls, takes, leaves] = _filter(found[2], pins)
        result.append(by_class[blk.cls, takes, leaves])
    return result


def pricing_cluster(cluster: Cluster, *groups: list[int]) -> Cluster:
    """``cluster`` cut to the nodes that hold the ranks of ``groups`` (the TP, EP and CP groups
    a block is priced over), which ``block_options`` prices the same: it reads a cluster's
    profile and its links over those groups (``Cluster.link``, ``all_to_all_seconds_per_byte``:
    how many nodes of ``gpus_per_node`` the ranks spread over), never its node count. So a
    pool's plans of one node kind at 1 to 16 nodes, and its pipelines across kinds, price each
    block once (1,731 pricings, each of a distinct cluster, were a quarter of the 320-GPU pool's
    plans by cost). A cluster without room for the groups is kept as it is (pricing raises)."""
    nodes = max(max(g) for g in groups) // cluster.gpus_per_node + 1
    if nodes >= cluster.nodes:
        return cluster
    return _cut(cluster, nodes)


@functools.lru_cache(maxsize=64)
def _cut(cluster: Cluster, nodes: int) -> Cluster:
    """``cluster`` on ``nodes`` nodes, one object per (cluster, nodes): pricing memos compare
    it often."""
    return dataclasses.replace(cluster, nodes=nodes)


def sequence_stream_flags(
    graph, blocks: list[Block], tp: int, pipelined: bool, variants_of: Callable
) -> list[tuple[bool, bool]]:
    """Per block, whether its sequence-parallel variant takes the stream's sequence shard from
    the block before and leaves it to the block after: where the stream passes straight
    between them (``StreamCut.handed_over``) and both offer a sequence-parallel variant at
    this TP degree (one TP group: a stage's blocks share it). Under ``Candidate.stream`` such
    blocks run sequence-parallel only, so both sides of each such edge do."""
    if tp == 1 or len(blocks) < 2:
        return [(False, False)] * len(blocks)
    cuts = _stream_cuts(graph, blocks)
    first: dict[str, Block] = {}
    offers: dict[str, bool] = {}
    for blk in blocks:
        if blk.cls not in offers:
            rep = first.setdefault(blk.cls, blk)
            offers[blk.cls] = any(v.exit_gather for v in variants_of(rep, tp, pipelined))
    sp = [offers[b.cls] for b in blocks]
    chained = [cut.handed_over and sp[i] and sp[i + 1] for i, cut in enumerate(cuts)]
    return [
        (i > 0 and chained[i - 1], i < len(blocks) - 1 and chained[i]) for i in range(len(blocks))
    ]


def _stream_cuts(graph, blocks: list[Block]) -> list[StreamCut]:
    """``stream_at_cuts``, once per traced graph (every candidate asks)."""
    cuts = graph.graph.get("_stream_cuts")
    if cuts is None or len(cuts) != len(blocks) - 1:
        cuts = graph.graph["_stream_cuts"] = stream_at_cuts(graph, blocks)
    return cuts


def cuts_send_shards(graph, blocks: list[Block], flags: list[tuple[bool, bool]]) -> bool:
    """Whether a pipeline cut anywhere in the model, under ``flags`` (``sequence_stream_flags``,
    whose flagged blocks run sequence-parallel only), can send the stream as each TP rank's
    sequence shard (``Training.pipeline_sends_shards``): one stream tensor crosses it and a
    side runs sequence-parallel, the stream in the shard it takes or leaves. Between two such
    blocks the stream passes straight; after another block the sending stage slices it
    (``produced`` or not), before another the receiving stage gathers it. The search does
    not know its cuts when it prices the pipeline's buffers, so every cut must."""
    if len(blocks) < 2:
        return False
    sp = [takes or leaves for takes, leaves in flags]
    for i, cut in enumerate(_stream_cuts(graph, blocks)):
        if cut.tensor is None:
            return False
        if sp[i] and sp[i + 1]:
            ok = cut.handed_over
        elif sp[i]:
            ok = cut.produced
        elif sp[i + 1]:
            ok = cut.read
        else:
            ok = False
        if not ok:
            return False
    return True


def _filter(opts: list[BlockOption], pins: Pins) -> list[BlockOption]:
    keep = opts
    if pins.recompute != "auto":
        wanted = [o for o in keep if o.recompute == pins.recompute]
        keep = wanted or [o for o in keep if o.recompute == Recompute.NONE]
    if pins.offload != "auto":
        wanted = [o for o in keep if o.offload == pins.offload]
        keep = wanted or [o for o in keep if o.offload == Offload.NONE]
    else:  # optimizer-only offload has no torch.distributed implementation to run it with
        keep = [o for o in keep if o.offload in AUTO_OFFLOAD]
    return keep


# --------------------------------------------------------------------------- one candidate
