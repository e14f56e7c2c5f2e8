"""Where the residual stream passes from one block straight into the next (the trace graph's
structure alone): the cuts at which Megatron's sequence parallelism can keep the stream
sequence-sharded between two sequence-parallel blocks, with no gather at the first's exit and
no slice at the second's entry."""

from __future__ import annotations

import networkx as nx

from planner.trace.blocks import Block


def stream_cuts(graph: nx.DiGraph, blocks: list[Block]) -> list[bool]:
    """Per cut i (between blocks i and i + 1), whether exactly one tensor that carries a
    gradient crosses it, produced by block i's one module and read only by block i + 1's one
    module: the block's output is the next block's input and nothing else (no code between
    them, no later block or model output reading it, as a model that collects each layer's
    hidden states does). Tensors without a gradient (masks, rotary tables) may cross too:
    they are not the stream."""
    n = len(blocks)
    block_of = {u: b.index for b in blocks for u in b.nodes}
    outputs = set(graph.graph.get("outputs", []))
    crossing: list[list[str]] = [[] for _ in range(max(n - 1, 0))]
    for u in graph.nodes:
        if u not in block_of or not graph.nodes[u].get("requires_grad", False):
            continue
        src = block_of[u]
        last = max((block_of.get(v, src) for v in graph.successors(u)), default=src)
        if u in outputs:
            last = n - 1
        for i in range(src, min(last, n - 1)):
            crossing[i].append(u)
    return [
        len(crossing[i]) == 1 and _hands_over(graph, crossing[i][0], blocks[i], blocks[i + 1])
        for i in range(n - 1)
    ]


def _inside(graph: nx.DiGraph, u: str, module: str) -> bool:
    owner = graph.nodes[u].get("module") or ""
    return owner == module or owner.startswith(module + ".")


def _hands_over(graph: nx.DiGraph, u: str, block: Block, after: Block) -> bool:
    if len(block.modules) != 1 or len(after.modules) != 1 or u not in block.nodes:
        return False
    readers = list(graph.successors(u))
    nodes = set(after.nodes)
    return (
        _inside(graph, u, block.modules[0])
        and bool(readers)
        and all(v in nodes and _inside(graph, v, after.modules[0]) for v in readers)
    )
