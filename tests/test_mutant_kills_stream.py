"""Tests written for mutmut's generated mutants of planner/trace/stream.py (the residual stream at
each cut between blocks, benchmarks/generated_mutants.py). Each graph is written by hand (a few
nodes, their blocks, modules and gradients), so the stream each cut carries, and whether the
first block produces it and the second reads it, is read off the drawing in its docstring.
docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

from dataclasses import replace

import networkx as nx
import pytest
from conftest import make_block

from planner.trace.stream import StreamCut, stream_at_cuts

# Three blocks (modules l0, l1, l2). The stream: a0 -> a1 (block 0, a1 in l0.sub) -> b0 -> b1
# (block 1) -> c0 (block 2, the model's output). A mask without a gradient, made in block 0,
# is read in blocks 1 and 2; "x" (no block) feeds a0.
NODES = {
    "x": (None, "", False),
    "a0": (0, "l0", True),
    "a1": (0, "l0.sub", True),
    "mask": (0, "l0", False),
    "b0": (1, "l1.attn", True),
    "b1": (1, "l1", True),
    "c0": (2, "l2", True),
}
EDGES = [("x", "a0"), ("a0", "a1"), ("a1", "b0"), ("b0", "b1"), ("b1", "c0"),
         ("mask", "b0"), ("mask", "c0")]  # fmt: skip


def _cuts(edges=EDGES, nodes=None, outputs=("c0",), modules=None):
    nodes = {**NODES, **(nodes or {})}
    g = nx.DiGraph(outputs=list(outputs))
    for u, (_, module, grad) in nodes.items():
        g.add_node(u, module=module, requires_grad=grad)
    g.add_edges_from(edges)
    n = 1 + max(b for b, _, _ in nodes.values() if b is not None)
    blocks = [
        replace(
            make_block(i, "L"),
            modules=(modules or {}).get(i, [f"l{i}"]),
            nodes=[u for u, (b, _, _) in nodes.items() if b == i],
        )
        for i in range(n)
    ]
    return stream_at_cuts(g, blocks)


def test_a_chain_hands_its_stream_over_at_each_cut():
    """a1 crosses cut 0 alone (the mask has no gradient; a0 stays in block 0), b1 cut 1: each
    made by its block's module (l0.sub is inside l0), read only by the next block's."""
    cuts = _cuts()
    assert cuts == [StreamCut("a1", True, True), StreamCut("b1", True, True)]
    assert [c.handed_over for c in cuts] == [True, True]


def test_a_tensor_read_two_blocks_later_crosses_both_cuts():
    """c0 also reads a1: a1 crosses cuts 0 and 1; cut 1 then carries a1 and b1 (no one
    stream); at cut 0 block 0 still produces a1 (its readers are all later), block 1 is not
    its only reader."""
    cuts = _cuts(EDGES + [("a1", "c0")])
    assert cuts == [StreamCut("a1", True, False), StreamCut(None)]
    assert not cuts[0].handed_over and not cuts[1].handed_over


def test_a_model_output_crosses_every_later_cut_and_is_neither_produced_nor_read():
    """a1 is also an output of the model (a collected hidden state): it lives to the last
    block, so cut 1 carries a1 and b1; at cut 0 a1 is the one stream, but the model reads it
    after: not produced, not read."""
    cuts = _cuts(outputs=("c0", "a1"))
    assert cuts == [StreamCut("a1", False, False), StreamCut(None)]


def test_a_block_of_two_modules_produces_nothing_and_reads_nothing():
    assert _cuts(modules={0: ["l0", "l0b"]}) == [
        StreamCut("a1", False, True),
        StreamCut("b1", True, True),
    ]
    assert _cuts(modules={1: ["l1", "l1b"]}) == [
        StreamCut("a1", True, False),
        StreamCut("b1", False, True),
    ]


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        # made outside block 0's module (a sibling whose name begins with l0)
        ({"a1": (0, "l0x", True)}, [StreamCut("a1", False, True), StreamCut("b1", True, True)]),
        # a node without a module: not inside l0
        ({"a1": (0, None, True)}, [StreamCut("a1", False, True), StreamCut("b1", True, True)]),
        # read outside block 1's module
        ({"b0": (1, "l1x", True)}, [StreamCut("a1", True, False), StreamCut("b1", True, True)]),
        # made by the module itself, read by the module itself
        ({"a1": (0, "l0", True), "b0": (1, "l1", True)},
         [StreamCut("a1", True, True), StreamCut("b1", True, True)]),
    ],
)  # fmt: skip
def test_the_stream_must_be_made_and_read_inside_the_blocks_modules(nodes, expected):
    assert _cuts(nodes=nodes) == expected


def test_a_tensor_read_by_its_own_block_and_the_next_is_not_produced():
    """b0 is read by b1 (block 1) and by c0 (block 2), and b1 also goes to c0: cut 1 carries
    b0 and b1 (two streams). At cut 0 a1 is also read back by a0's block (a node "a2" in block
    0): block 0 reads its own output after, so it does not just produce it, nor is block 1 its
    only reader."""
    nodes = {"a2": (0, "l0", True)}
    cuts = _cuts(EDGES + [("a1", "a2")], nodes=nodes)
    assert cuts == [StreamCut("a1", False, False), StreamCut("b1", True, True)]
    assert _cuts(EDGES + [("b0", "c0")]) == [StreamCut("a1", True, True), StreamCut(None)]


def test_a_tensor_read_only_outside_the_blocks_crosses_no_cut():
    """b1 read only by a node outside every block (a head): it stays in block 1, so cut 1
    carries no gradient-carrying tensor; a1, also read by that head, is still produced by block
    0 (the head counts as after it) but not read only by block 1."""
    edges = [e for e in EDGES if e != ("b1", "c0")] + [("b1", "head"), ("a1", "head")]
    cuts = _cuts(edges, nodes={"head": (None, "head", True)})
    assert cuts == [StreamCut("a1", True, False), StreamCut(None)]


def test_tensors_without_a_gradient_are_not_the_stream():
    """The mask gets a gradient: cut 0 then carries a1 and the mask, cut 1 b1 and the mask.
    A node with no requires_grad attribute counts as without one."""
    assert _cuts(nodes={"mask": (0, "l0", True)}) == [StreamCut(None), StreamCut(None)]
    g = nx.DiGraph(outputs=["c0"])
    g.add_node("p", module="l0")
    g.add_node("q", module="l1", requires_grad=True)
    g.add_edge("p", "q")
    blocks = [replace(make_block(i, "L"), modules=[f"l{i}"], nodes=[u]) for i, u in
              enumerate(("p", "q"))]  # fmt: skip
    assert stream_at_cuts(g, blocks) == [StreamCut(None)]


def test_no_cut_without_two_blocks_and_the_defaults_are_not_handed_over():
    g = nx.DiGraph(outputs=[])
    g.add_node("p", module="l0", requires_grad=True)
    assert stream_at_cuts(g, [replace(make_block(0, "L"), modules=["l0"], nodes=["p"])]) == []
    assert stream_at_cuts(nx.DiGraph(), []) == []
    assert StreamCut("t") == StreamCut("t", False, False)
    assert [StreamCut("t", p, r).handed_over for p in (False, True) for r in (False, True)] == [
        False,
        False,
        False,
        True,
    ]


def test_a_node_without_a_module_belongs_to_the_root_module():
    """The tracer's nodes at the model's top level carry no module; a block that is the root
    module itself (FQN "") owns them: a1 there is produced by block 0."""
    cuts = _cuts(nodes={"a1": (0, None, True)}, modules={0: [""]})
    assert cuts == [StreamCut("a1", True, True), StreamCut("b1", True, True)]
