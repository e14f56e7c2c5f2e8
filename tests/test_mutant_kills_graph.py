"""planner/trace/graph.py's answers on graphs drawn by hand, for its generated mutants
(benchmarks/generated_mutants.py): the attention-like core selective recompute drops, the
references in an op's arguments, the parameters' bytes, the missing attributes and why torch's
pipelining would refuse a model. Each graph is small enough that its answer is read off the
drawing in the test's docstring; one tiny attention model is also traced (no cache: the tracer
runs in the test) and its core named op by op."""

from __future__ import annotations

import networkx as nx
import pytest

from planner.trace.graph import (
    OP_NODE_KEYS,
    OpGraph,
    arg_refs,
    as_op_graph,
    check_op_graph,
    core_nodes,
    core_of,
    param_bytes_of,
    pipeline_refusal,
)

MM = "aten.mm.default"
BMM = "aten.bmm.default"


def _graph(nodes: list[tuple], cls=nx.DiGraph) -> nx.DiGraph:
    """``nodes``: (name, op, params, inputs) in execution order; the inputs are both the
    node's argument references and its incoming edges."""
    g = cls()
    for order, (name, op, params, inputs) in enumerate(nodes):
        g.add_node(
            name,
            op=op,
            order=order,
            params=list(params),
            args=[{"node": i} for i in inputs] + [{"param": p} for p in params],
        )
        g.add_edges_from((i, name) for i in inputs)
    return g


# An attention layer: q, k, v are products with weights; s = q k^T and o = p v are products of
# activations; the mask, softmax and dropout between them are weight-free; out = o W_o. The
# weight W_o is read through a view (wo_t = W_o^T), so out uses a parameter too.
ATTENTION = [
    ("x", "input", [], []),
    ("q", MM, ["wq"], ["x"]),
    ("k", MM, ["wk"], ["x"]),
    ("v", MM, ["wv"], ["x"]),
    ("kt", "aten.transpose.int", [], ["k"]),
    ("s", BMM, [], ["q", "kt"]),
    ("m", "aten.masked_fill.Scalar", [], ["s"]),
    ("p", "aten._softmax.default", [], ["m"]),
    ("d", "aten.native_dropout.default", [], ["p"]),
    ("o", BMM, [], ["d", "v"]),
    ("wo_t", "aten.t.default", ["wo"], []),
    ("out", MM, [], ["o", "wo_t"]),
    ("r", "aten.relu.default", [], ["out"]),
]


def test_the_core_runs_from_the_first_activation_product_to_before_the_second():
    """s (itself a product of activations, with one downstream) through the dropout: the mask,
    softmax and dropout lie between s and o; o has no activation product after it; kt has none
    before it (k is a weight product); out reads W_o through its view; r follows out."""
    g = _graph(ATTENTION)
    assert core_nodes(g) == {"s", "m", "p", "d"}


def test_a_block_without_two_activation_products_has_no_core():
    """An MLP: products with weights only; and one activation product alone (s, no second)."""
    mlp = _graph([("x", "input", [], []), ("h", MM, ["w1"], ["x"]),
                  ("a", "aten.gelu.default", [], ["h"]), ("y", MM, ["w2"], ["a"])])  # fmt: skip
    assert core_nodes(mlp) == set()
    one = _graph(ATTENTION[:9])  # up to the dropout: no product after s
    assert core_nodes(one) == set()


def test_a_view_of_a_view_of_a_weight_still_reads_the_weight():
    """w2 = view(view(W)): the product y = a w2 reads a weight, so between s and y nothing is
    dropped; with y a product of activations (w2 a view of an activation), a is core."""
    nodes = [
        ("x", "input", [], []),
        ("s", BMM, [], ["x", "x"]),
        ("a", "aten.relu.default", [], ["s"]),
        ("w1", "aten.t.default", ["w"], []),
        ("w2", "aten.view.default", [], ["w1"]),
        ("y", MM, [], ["a", "w2"]),
    ]
    assert core_nodes(_graph(nodes)) == set()
    nodes[3] = ("w1", "aten.t.default", [], ["x"])  # an activation's view: weight-free
    assert core_nodes(_graph(nodes)) == {"s", "a"}


def test_an_op_is_core_only_on_a_path_between_the_products():
    """A side branch b = relu(x) joins the dropout's output (e = d + b): b has no activation
    product upstream; a branch f = exp(s) read only by the last weight product lies after s but
    before no activation product."""
    nodes = [
        *ATTENTION[:9],
        ("b", "aten.relu.default", [], ["x"]),
        ("e", "aten.add.Tensor", [], ["d", "b"]),
        ("f", "aten.exp.default", [], ["s"]),
        ("o", BMM, [], ["e", "v"]),
        ("out", MM, ["wo"], ["o", "f"]),
    ]
    assert core_nodes(_graph(nodes)) == {"s", "m", "p", "d", "e"}


def test_the_core_follows_execution_order_not_insertion_order():
    """The same attention with its nodes inserted in reverse: the walk sorts by ``order``."""
    g = _graph(ATTENTION)
    reversed_g = nx.DiGraph()
    for n in reversed(list(g.nodes)):
        reversed_g.add_node(n, **g.nodes[n])
    reversed_g.add_edges_from(g.edges)
    assert core_nodes(reversed_g) == {"s", "m", "p", "d"}


def test_an_op_graph_keeps_its_core_and_a_plain_graph_computes_it():
    op_graph = _graph(ATTENTION, OpGraph)
    assert core_of(op_graph) == {"s", "m", "p", "d"}
    op_graph.remove_node("m")  # cached: the OpGraph's core is computed once
    assert core_of(op_graph) == {"s", "m", "p", "d"}
    plain = _graph(ATTENTION)
    assert core_of(plain) == {"s", "m", "p", "d"}
    plain.remove_node("m")
    assert core_of(plain) == set()  # s no longer reaches o


def test_as_op_graph_keeps_an_op_graph_and_wraps_a_plain_one():
    op_graph = OpGraph()
    assert as_op_graph(op_graph) is op_graph
    plain = _graph(ATTENTION)
    wrapped = as_op_graph(plain)
    assert type(wrapped) is OpGraph and wrapped is not plain
    assert sorted(wrapped.nodes) == sorted(plain.nodes)


def test_parameter_bytes_by_shape_dtype_and_alias():
    """w: 3 x 4 fp32 (48 bytes, 4 the default); e: 10 x 2 bf16 (40); the alias lm.w of e gets
    e's bytes; an alias of an unknown owner none; a name both listed and aliased keeps its own."""
    g = nx.DiGraph(
        param_shapes={"w": [3, 4], "e": [10, 2], "b": [5]},
        param_dtype_bytes={"e": 2, "b": 1},
        param_owner={"lm.w": "e", "ghost": "nobody", "b": "w"},
    )
    assert param_bytes_of(g) == {"w": 48, "e": 40, "b": 5, "lm.w": 40}
    assert param_bytes_of(nx.DiGraph()) == {}


def test_argument_references_are_found_however_nested_and_only_those():
    args = [
        {"node": "a"},
        [{"param": "w"}, ({"k": {"buffer": "bn.mean"}})],
        {"const": 3},
        {"node": "b", "extra": 1},  # not a reference: a dict with more than "node"
        {"x": [{"node": "c"}]},
        "node",
        7,
    ]
    assert list(arg_refs(args)) == [
        {"node": "a"},
        {"param": "w"},
        {"buffer": "bn.mean"},
        {"const": 3},
        {"node": "c"},
    ]
    assert list(arg_refs({"node": "z"})) == [{"node": "z"}]
    assert list(arg_refs({"param": "p", "shape": [2]})) == [{"param": "p", "shape": [2]}]
    assert list(arg_refs(({"node": "t"},))) == []  # a tuple is not a serialised list


def test_the_core_reads_only_node_references():
    """kt made a view of a weight: s reads a weight through it, so nothing has an activation
    product upstream but o, and nothing after o is one: no core. With s's second argument
    {"node": "kt", "dim": 1}, not a node reference, the weight behind it is not seen."""
    g = _graph(ATTENTION)
    g.nodes["kt"]["params"] = ["wk"]
    assert core_nodes(g) == set()
    g.nodes["s"]["args"] = [{"node": "q"}, {"node": "kt", "dim": 1}]
    assert core_nodes(g) == {"s", "m", "p", "d"}


def test_a_node_lacking_attributes_is_named_with_each_key():
    g = nx.DiGraph()
    g.add_node("part", **{k: 0 for k in OP_NODE_KEYS if k not in ("saved", "op")})
    g.add_node("other", **{k: 0 for k in OP_NODE_KEYS if k != "mm_inner"})
    g.add_node("full", **{k: 0 for k in OP_NODE_KEYS})
    assert check_op_graph(g) == ["part: op", "part: saved", "other: mm_inner"]
    g.remove_nodes_from(["part", "other"])
    assert check_op_graph(g) == []
    assert OP_NODE_KEYS[:3] == ("op", "module", "order") and len(OP_NODE_KEYS) == 15


@pytest.mark.parametrize(
    "facts, refusal",
    [
        ({"method": "export"}, ""),
        ({}, ""),
        (
            {"method": "hooks"},
            "torch.export could not trace the model (its note says why), and torch's "
            "pipelining cuts a model into stages by tracing it with torch.export",
        ),
        (
            {"method": "export", "shared_modules": [["a.x", "b.x"], ["c", "d"]]},
            "the model lists one module under several names (a.x, b.x), and torch.export's "
            "unflatten, with which torch's pipelining cuts stages, refuses such a model",
        ),
        (
            {"method": "export", "custom_backward": ["Fn", "Gn"]},
            "the model applies Fn, Gn, a torch.autograd.Function with a backward of its own, "
            "which torch's pipelining does not keep (its stages run the exported forward and "
            "differentiate its ops instead)",
        ),
        (  # the first reason that applies
            {"method": "hooks", "shared_modules": [["a", "b"]], "custom_backward": ["Fn"]},
            "torch.export could not trace the model (its note says why), and torch's "
            "pipelining cuts a model into stages by tracing it with torch.export",
        ),
        (
            {"shared_modules": [["a", "b"]], "custom_backward": ["Fn"]},
            "the model lists one module under several names (a, b), and torch.export's "
            "unflatten, with which torch's pipelining cuts stages, refuses such a model",
        ),
        ({"shared_modules": None, "custom_backward": None}, ""),
    ],
)
def test_pipelining_is_refused_for_the_first_reason_that_applies(facts, refusal):
    assert pipeline_refusal(nx.DiGraph(**facts)) == refusal


ATTENTION_MODEL = """
import torch
from torch import nn

TRAINING = {"global_batch_size": 2, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24, bias=False)
        self.out = nn.Linear(8, 8, bias=False)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        s = torch.bmm(q, k.transpose(1, 2))
        p = torch.softmax(s * 0.5, dim=-1)
        return self.out(torch.bmm(p, v))


def build_model():
    return Attention()


def make_batch(batch_size, step=0):
    g = torch.Generator().manual_seed(step)
    return torch.randn(batch_size, 4, 8, generator=g), torch.randn(batch_size, 4, 8, generator=g)


def loss_fn(out, y):
    return ((out - y) ** 2).mean()
"""


def test_a_traced_attentions_core_is_its_scores_scale_and_softmax(tmp_path):
    """Traced with no cache: the first bmm (the scores), the scaling and the softmax; not the
    projections, the chunks, the transpose of k or the second bmm."""
    from planner.api import trace

    path = tmp_path / "attention.py"
    path.write_text(ATTENTION_MODEL)
    g = trace(path, traced_batch_size=1, dtype="fp32", use_cache=False).graph
    core = sorted(g.nodes[n]["op"] for n in core_of(g))
    assert core == ["aten.bmm.default", "aten.mul.Tensor", "aten.softmax.int"]
