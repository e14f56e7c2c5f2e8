"""Each block's priced options for one candidate's TP degree and micro-batch, filtered by the
user's pins.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.cost.block_options import block_options
from planner.cost.records import BlockOption
from planner.hardware.cluster import Cluster
from planner.schema.mesh import Mesh
from planner.search.candidates import Pins
from planner.trace.blocks import Block
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
    by_class: dict[str, list[BlockOption]] = {}
    result = []
    memo = {} if memo is None else memo
    for blk in blocks:
        if blk.cls not in by_class:
            variants = variants_of(blk, tp, pipelined)
            key = (blk.cls, tp, mbs, ep, cp, tuple(v.name for v in variants), id(cluster))
            key += (training,)
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
            by_class[blk.cls] = _filter(kept[2], pins)
        result.append(by_class[blk.cls])
    return result


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
