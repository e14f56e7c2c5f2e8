"""Each block's priced options for one candidate's TP degree and micro-batch, filtered by the
user's pins.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.cost.block_options import block_options
from planner.cost.records import BlockOption
from planner.cost.sharding import sequence_stream
from planner.hardware.cluster import Cluster
from planner.schema.mesh import Mesh
from planner.search.candidates import Pins
from planner.trace.blocks import Block
from planner.trace.stream import stream_cuts
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
) -> list[list[BlockOption]]:
    """Options per block (shared by blocks of one class), filtered by the user's pins.
    ``memo`` keeps priced options across searches of one planning run (the baselines search
    the same space again). ``pipelined``: the candidate splits the model into pipeline
    stages (``variants_of``'s third argument).

    Keyed by the variants themselves (compared by value), not by where they came from: a
    block whose variants are the same pipelined or not, or under the baselines' variant rule,
    is priced once (``block_options`` is a function of its arguments alone)."""
    tp_ranks = list(range(tp))
    ep_ranks = Mesh(1, ep, tp, ep).ep_group(0)
    cp_ranks = Mesh(1, 1, tp, 1, cp).cp_group(0)
    by_class: dict[tuple, list[BlockOption]] = {}
    result = []
    memo = {} if memo is None else memo
    stream = sequence_stream_flags(graph, blocks, tp, pipelined, variants_of)
    first: dict[str, Block] = {}  # a class is priced on its first block (names rebased later)
    for blk, (takes, leaves) in zip(blocks, stream):
        rep = first.setdefault(blk.cls, blk)
        if (blk.cls, takes, leaves) not in by_class:
            variants = [sequence_stream(v, takes, leaves) for v in variants_of(rep, tp, pipelined)]
            key = (blk.cls, tp, mbs, ep, cp, tuple(v.name for v in variants), id(cluster))
            key += (training, takes, leaves)
            kept = memo.get(key)
            if kept is None or kept[0] != variants:  # the value holds the cluster: no id reuse
                opts = block_options(
                    graph,
                    blk,
                    variants,
                    mbs,
                    cluster,
                    tp_ranks,
                    training,
                    ep_ranks=ep_ranks,
                    cp_ranks=cp_ranks,
                )
                kept = memo[key] = (variants, cluster, opts)
            by_class[blk.cls, takes, leaves] = _filter(kept[2], pins)
        result.append(by_class[blk.cls, takes, leaves])
    return result


def sequence_stream_flags(
    graph, blocks: list[Block], tp: int, pipelined: bool, variants_of: Callable
) -> list[tuple[bool, bool]]:
    """Per block, whether its sequence-parallel variant takes the stream's sequence shard from
    the block before and leaves it to the block after: where the stream passes straight
    between them (``stream_cuts``) and both offer a sequence-parallel variant at this TP degree
    (one TP group: a stage's blocks share it). A plan that runs a neighbour otherwise prices
    that edge's gather as saved (``assemble.sequence_stream_plan`` records what runs)."""
    if tp == 1 or len(blocks) < 2:
        return [(False, False)] * len(blocks)
    cuts = graph.graph.get("_stream_cuts")
    if cuts is None or len(cuts) != len(blocks) - 1:
        cuts = graph.graph["_stream_cuts"] = stream_cuts(graph, blocks)
    first: dict[str, Block] = {}
    offers: dict[str, bool] = {}
    for blk in blocks:
        if blk.cls not in offers:
            rep = first.setdefault(blk.cls, blk)
            offers[blk.cls] = any(v.exit_gather for v in variants_of(rep, tp, pipelined))
    sp = [offers[b.cls] for b in blocks]
    chained = [cut and sp[i] and sp[i + 1] for i, cut in enumerate(cuts)]
    return [
        (i > 0 and chained[i - 1], i < len(blocks) - 1 and chained[i]) for i in range(len(blocks))
    ]


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
