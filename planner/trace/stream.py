"""The residual stream at each cut between blocks (the trace graph's structure alone): where
Megatron's sequence parallelism can keep it sequence-sharded, between two sequence-parallel
blocks (no gather at the first's exit, no slice at the second's entry) and across a pipeline
cut (the stage sends each TP rank's shard)."""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from planner.trace.blocks import Block


@dataclass(frozen=True)
class StreamCut:
    """The one tensor carrying a gradient that crosses a cut between blocks i and i + 1, if
    exactly one does (tensors without a gradient, masks and rotary tables, may cross too: they
    are not the stream). ``produced``: block i's one module returns it and nothing in block
    i reads it after; ``read``: only block i + 1's one module reads it."""

    tensor: str | None
    produced: bool = False
    read: bool = False

    @property
    def handed_over(self) -> bool:
        """Block i's output is block i + 1's input and nothing else: no code between them, no
        later block or model output reading it (as a model collecting hidden states does)."""
        return self.produced and self.read


def stream_at_cuts(graph: nx.DiGraph, blocks: list[Block]) -> list[StreamCut]:
    """Per cut i (between blocks i and i + 1), the stream crossing it."""
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
    cuts = []
    for i in range(n - 1):
        if len(crossing[i]) != 1:
            cuts.append(StreamCut(None))
            continue
        u = crossing[i][0]
        readers = list(graph.successors(u))
        after = set(blocks[i + 1].nodes)
        produced = (
            len(blocks[i].modules) == 1
            and block_of[u] == i
            and _inside(graph, u, blocks[i].modules[0])
            and all(block_of.get(v, n) > i for v in readers)
            and u not in outputs
        )
        read = (
            len(blocks[i + 1].modules) == 1
            and bool(readers)
            and u not in outputs
            and all(v in after and _inside(graph, v, blocks[i + 1].modules[0]) for v in readers)
        )
        cuts.append(StreamCut(u, produced, read))
    return cuts


def _inside(graph: nx.DiGraph, u: str, module: str) -> bool:
    owner = graph.nodes[u].get("module") or ""
    return owner == module or owner.startswith(module + ".")
