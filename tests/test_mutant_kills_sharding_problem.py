"""The sharding ILP's problem and strategies (planner/cost/sharding.py: ``build_problem``,
``strategies_for`` and its op kinds, ``_operands``, the tied and updated weights,
``tp_variants``' memo and filters, ``realizable``) and two cases the earlier groups left (a
chain of ties, a partial gradient beside another producer read whole), called directly on
graphs drawn here for the module's generated mutants (docs/mutation.md, helper 56b): each
value by hand, or brute force over the layouts. The graphs are built per test (the
tied-weight sets are kept on the graph)."""

from __future__ import annotations

from dataclasses import replace

import networkx as nx
import pytest
from test_mutant_kills_sharding import (
    BUF,
    LINEAR,
    SPB,
    _block,
    _node,
    every_choice,
    mlp_graph,
    mlp_problem,
    node,
    objective,
    param,
    strategies,
    tied_graph,
)

from planner.cost import sharding
from planner.cost.sharding import (
    LAMBDAS,
    Operand,
    Strategy,
    build_problem,
    evaluate,
    sharding_milp,
)

# --------------------------------------------------------------------------- operands


def test_operands_of_a_graph_with_no_parameter_tables():
    """A graph with no alias or shape table (a model with no tied weights traced bare): names
    as read, no shape; a node that records no requires_grad needs no gradient."""
    g = nx.DiGraph()
    g.add_node("x", shapes=[[2, 3]])
    attrs = {"args": [{"node": "x"}, {"param": "scale"}, {"buffer": "buf"}]}
    assert sharding._operands(g, attrs) == [
        Operand("node", "x", (2, 3), False),
        Operand("param", "scale", None, True),
        Operand("buffer", "buf", None, False),
    ]


# --------------------------------------------------------------------------- tied, updated


def _graph(**tables):
    g = nx.DiGraph()
    g.graph.update(tables)
    return g


def test_a_weight_under_two_paths_is_tied_with_no_reader():
    g = _graph(param_owner={"a.w": "a.w", "b.w": "a.w", "c.w": "c.w"})
    assert sharding.tied_parameters(g) == frozenset({"a.w"})
    assert g.graph["tied_parameters"] == frozenset({"a.w"})


def test_a_tied_weight_read_by_a_third_module_is_named_canonically():
    """A reader outside both holders names the weight by its second path: the tied set holds
    the canonical name alone."""
    g = _graph(param_owner={"a.w": "a.w", "b.w": "a.w"})
    _node(g, "x", "input", [], [2, 4])
    _node(g, "c", "aten.mul.Tensor", [{"node": "x"}, {"param": "b.w"}], [2, 4], "c")
    assert sharding.tied_parameters(g) == frozenset({"a.w"})


def test_a_weight_read_by_its_own_module_is_not_tied_at_any_depth():
    """Nested module paths, a second call of the module (``fc@1``), a root parameter read by
    the root module (no module name), and a graph with no alias table."""
    g = nx.DiGraph()
    _node(g, "x", "input", [], [2, 4])
    _node(g, "a", LINEAR, [{"node": "x"}, {"param": "layers.0.fc.weight"}], [2, 4], "layers.0.fc")
    _node(g, "b", LINEAR, [{"node": "a"}, {"param": "layers.0.fc.weight"}], [2, 4],
          "layers.0.fc@1")  # fmt: skip
    _node(g, "c", "aten.mul.Tensor", [{"node": "b"}, {"param": "scale"}], [2, 4], "")
    _node(g, "d", "aten.mul.Tensor", [{"node": "c"}, {"param": "scale"}], [2, 4], None)
    assert sharding.tied_parameters(g) == frozenset()
    g.graph.pop("tied_parameters")
    g.nodes["c"]["module"] = "layers"
    assert sharding.tied_parameters(g) == frozenset({"scale"})


def test_updated_weights_are_named_canonically():
    """The forward's in-place updates name a tied weight by any of its paths; a buffer it
    updates (a norm's running mean) is no weight; either table may be missing."""
    g = _graph(
        param_owner={"wte.weight": "wte.weight", "head.weight": "wte.weight"},
        param_shapes={"wte.weight": [10, 4]},
        forward_state=["head.weight", "bn.running_mean"],
    )
    assert sharding.updated_parameters(g) == frozenset({"wte.weight"})
    g = _graph(param_shapes={"emb.weight": [10, 4]}, forward_state=["emb.weight", "bn.mean"])
    assert sharding.updated_parameters(g) == frozenset({"emb.weight"})
    g = _graph(param_owner={"emb.weight": "emb.weight"}, forward_state=["emb.weight"])
    assert sharding.updated_parameters(g) == frozenset({"emb.weight"})
    assert sharding.updated_parameters(_graph()) == frozenset()


# --------------------------------------------------------------------------- the problem


def detail_graph():
    """x (bf16, no gradient, outside) -> fc (linear 8 -> 6, its weight bf16 and its bias of
    no known shape) -> v (view) -> v2 (view of the view) and -> parts (split into two halves
    of 3); a tensorless check inside the block, one after v2 outside, and a reader of fc
    outside. The block spans two modules; its param_names hold a weight it never reads."""
    g = nx.DiGraph()
    _node(g, "x", "input", [], [2, 4, 8], grad=False)
    g.nodes["x"]["dtypes"] = ["bfloat16"]
    _node(g, "pos", "aten.arange.default", [8], [8], "blk", grad=False)
    g.nodes["pos"]["dtypes"] = ["int64"]
    _node(g, "xv", "aten.view.default", [{"node": "x"}, [8, 8]], [8, 8], "blk")
    _node(g, "fc", LINEAR, [{"node": "x"}, {"param": "blk.fc.weight"}, {"param": "blk.fc.bias"}],
          [2, 4, 6], "blk.fc", ff=10, bf=20, fb=4, bb=6, saved=[("x", 128.0)])  # fmt: skip
    _node(g, "v", "aten.view.default", [{"node": "fc"}, [8, 6]], [8, 6], "blk")
    del g.nodes["v"]["requires_grad"]
    _node(g, "noop", "aten._assert_tensor_metadata.default", [{"node": "v"}], None, "blk")
    g.nodes["noop"]["shapes"] = [None]
    _node(g, "v2", "aten.view.default", [{"node": "v"}, [48]], [48], "blk")
    _node(g, "parts", "aten.split.Tensor", [{"node": "fc"}, 3, -1], [2, 4, 3], "blk")
    _node(g, "chk", "aten._assert_tensor_metadata.default", [{"node": "v2"}], None, "next")
    g.nodes["chk"]["shapes"] = [None]
    _node(g, "use", "aten.relu.default", [{"node": "fc"}], [2, 4, 6], "next")
    g.graph.update(
        param_shapes={"blk.fc.weight": [6, 8]}, param_dtype_bytes={"blk.fc.weight": 2},
        param_owner={"blk.fc.weight": "blk.fc.weight", "blk.fc.bias": "blk.fc.bias"},
        tp_modules=["blk.fc"], outputs=["parts"],
    )  # fmt: skip
    nodes = ["pos", "xv", "fc", "v", "noop", "v2", "parts"]
    block = _block(nodes, ["blk.fc.weight", "other.weight"], 128.0, ("blk", "blk2"))
    return g, block


def test_the_problem_records_external_inputs_params_roots_and_outputs_by_hand():
    g, b = detail_graph()
    prob = build_problem(g, b, 3, 1.0, 1.0)
    names = ["pos", "xv", "fc", "v", "v2", "parts"]
    assert [op.name for op in prob.ops] == names
    assert prob.index == {n: i for i, n in enumerate(names)}
    # x, read twice: 2 x 4 x 8 bf16 elements, no gradient
    assert prob.external == {"x": (128, False)}
    assert prob.param_numel == {"blk.fc.weight": 48, "blk.fc.bias": 0}
    assert prob.param_bytes == {"blk.fc.weight": 96, "blk.fc.bias": 0}
    assert prob.owned == ["blk.fc.weight"]
    # a view of a view (and a split, a view too) is stored in its first base; a view of an
    # input outside the block in that input; an op with no operand is its own
    assert prob.roots == {"pos": "pos", "xv": "x", "fc": "fc", "v": "fc", "v2": "fc", "parts": "fc"}
    assert prob.ops[0].strategies == (Strategy("R", ()),) and prob.ops[0].operands == ()
    assert prob.ops[0].nbytes == 8 * 8  # int64 positions
    # fc has a reader outside, parts is a graph output; v2's outside reader has no tensor
    assert prob.outputs == ["fc", "parts"]
    assert prob.block_module == "" and prob.input_bytes == 128
    assert type(prob.input_bytes) is int
    _, _, fc, v, _, _ = prob.ops
    assert fc.saved == (("x", 128),) and type(fc.saved[0][1]) is int
    assert (fc.grad, v.grad) == (True, False)
    assert (fc.seconds, fc.flops, fc.fwd_bytes, fc.nbytes) == (30, 30, 4, 192)
    # the split into two equal halves offers fc's weight rows by 2 blocks: 6 = 2 x 3
    assert fc.strategies == (
        Strategy("R", ("R", "R", "R")),
        Strategy("S2", ("R", "S0", "S0"), "colwise"),
        Strategy("S2/2", ("R", "S0/2", "S0/2"), "colwise_dtensor:2"),
    )


def test_a_bare_graph_at_the_default_rates():
    """A graph with none of the trace's tables (no alias, shape, dtype, TP-module, output or
    forward-state table), priced at the defaults: 400 TFLOP/s and 2 TB/s; a parameter of no
    known shape counts no bytes."""
    g = nx.DiGraph()
    _node(g, "x", "input", [], [4, 6])
    _node(g, "m", "aten.mul.Tensor", [{"node": "x"}, {"param": "scale"}], [4, 6], "",
          ff=2400, bf=4800)  # fmt: skip
    _node(g, "r", "aten.relu.default", [{"node": "m"}], [4, 6], "", fb=96, bb=192)
    prob = build_problem(g, _block(["m", "r"], ["scale"], modules=("top",)), 2)
    m, r = prob.ops
    assert m.seconds == 2400 / 400e12 + 4800 / 400e12
    assert r.seconds == 96 / 2e12 + 192 / 2e12
    assert (prob.param_numel, prob.param_bytes, prob.outputs) == ({"scale": 0}, {"scale": 0}, [])
    assert [s.out for s in m.strategies] == ["R", "S0", "S1"]
    assert prob.block_module == "top"


def test_an_updated_weight_stays_whole_though_not_tied():
    """A max-norm embedding (its table renormalised in place by the forward) in a module a
    style could shard: only the indices split."""
    g = nx.DiGraph()
    _node(g, "idx", "input", [], [2, 4], grad=False)
    _node(g, "emb", "aten.embedding.default", [{"param": "wte.weight"}, {"node": "idx"}],
          [2, 4, 4], "wte")  # fmt: skip
    g.graph.update(param_shapes={"wte.weight": [10, 4]}, tp_modules=["wte"],
                   forward_state=["wte.weight"])  # fmt: skip
    (emb,) = build_problem(g, _block(["emb"], ["wte.weight"]), 2, 1.0, 1.0).ops
    assert emb.strategies == (
        Strategy("R", ("R", "R")),
        Strategy("S0", ("R", "S0")),
        Strategy("S1", ("R", "S1")),
    )


def test_param_uses_and_weight_slot():
    prob = mlp_problem()
    assert sharding._param_uses(prob, ["fc2.bias", "fc1.weight"]) == ((2, 2), (0, 1))
    assert sharding._param_uses(prob, []) == ()
    assert [sharding._weight_slot(prob.ops[i]) for i in (0, 2)] == [1, 1]
    g, b = tied_graph()
    emb, head = build_problem(g, b, 2, 1.0, 1.0).ops
    assert (sharding._weight_slot(emb), sharding._weight_slot(head)) == (0, 1)


# --------------------------------------------------------------------------- strategies


def test_an_elementwise_op_reads_past_a_buffer_which_passes_no_partial_sum():
    """A buffer (a mask, a constant) is sliced by each device as needed: no state asked of
    it, the operands after it still split; a sum with a buffer is no sum of partials."""
    x, add = node("x", (4, 6)), "aten.add.Tensor"
    split = [("S0", (None, "S0"), ""), ("S1", (None, "S1"), "")]
    assert strategies(add, (4, 6), [BUF, x]) == [("R", (None, "R"), ""), *split]
    assert strategies(add, (4, 6), [x, BUF]) == [
        ("R", ("R", None), ""),
        ("S0", ("S0", None), ""),
        ("S1", ("S1", None), ""),
    ]


def test_partial_sums_pass_a_difference_but_no_cast_to_another_tensor_or_of_a_weight():
    """x - y of two partial sums is a partial sum, and so is a one-activation cast (linear in
    its input); x.type_as(y) (y read for its dtype) and a copy of a weight pass none."""
    x, y, sub = node("x", (4, 6)), node("y", (4, 6)), "aten.sub.Tensor"
    args = [{"node": "x"}, {"node": "y"}, {}]
    assert ("P", ("P", "P"), "") in strategies(sub, (4, 6), [x, y], args=args)
    assert strategies("aten.type_as.default", (4, 6), [x, y], args=args) == [
        ("R", ("R", "R"), ""),
        ("S0", ("S0", "S0"), ""),
        ("S1", ("S1", "S1"), ""),
    ]
    assert strategies("aten.clone.default", (4, 6), [param("w", (4, 6))]) == [("R", ("R",), "")]
    cast = strategies("aten.to.dtype", (4, 6), [x], args=[{"node": "x"}, "float32", {}])
    assert cast[-1][:2] == ("P", ("P",))


def test_equal_sizes_split_with_sizes_make_blocks():
    x = {"node": "x"}
    ops = [("aten.split_with_sizes.default", (6, 4), [x, [3, 3], {}])]
    assert sharding.block_factors(ops) == frozenset({2})


def test_a_weight_times_an_activation_is_elementwise_not_a_lookup():
    """g * x with g a 1-D weight first (a norm's scale): elementwise, g split with x's last
    dim; only an embedding reads a weight first as a table."""
    g, x = param("g", (6,)), node("x", (4, 6))
    assert strategies("aten.mul.Tensor", (4, 6), [g, x]) == [
        ("R", ("R", "R"), ""),
        ("S0", ("R", "S0"), ""),
        ("S1", ("S0", "S1"), ""),
    ]


def test_a_three_way_select_is_elementwise_not_attention():
    """where(c, a, b) reads three activations, as attention does: it splits any dim alike."""
    c, a, b = node("c", (4, 6), grad=False), node("a", (4, 6)), node("b", (4, 6))
    assert strategies("aten.where.self", (4, 6), [c, a, b]) == [
        ("R", ("R", "R", "R"), ""),
        ("S0", ("S0", "S0", "S0"), ""),
        ("S1", ("S1", "S1", "S1"), ""),
    ]


def test_an_op_of_two_activations_no_rule_knows_stays_whole():
    """gather(x, 1, idx) reads two same-shaped activations, as copy_ does, but picks along
    dim 1 by idx's values: no split is offered (only copy_ splits its two sides alike)."""
    x, idx = node("x", (4, 6)), node("idx", (4, 6), grad=False)
    args = [{"node": "x"}, 1, {"node": "idx"}]
    assert strategies("aten.gather.default", (4, 6), [x, idx], args=args) == [("R", ("R", "R"), "")]


# --------------------------------------------------------------------------- the variants


def test_tp_variants_default_rates_and_keys():
    """The memo's key holds the defaults: 1 / 100 GB/s, 400 TFLOP/s, 2 TB/s, 3 variants, and
    whether a tied weight is split along its vocabulary."""
    g, b = mlp_graph()
    memo = {}
    sharding.tp_variants(g, b, 2, memo=memo)
    assert list(memo) == [("c", 2, 1 / 100e9, 400e12, 2e12, 3, False)]
    g, b = tied_graph()
    memo = {}
    (v,) = sharding.tp_variants(g, b, 2, memo=memo)
    assert list(memo) == [("c", 2, 1 / 100e9, 400e12, 2e12, 3, True)]
    assert v.name == "tp2-tied"


def test_a_memo_entry_wins_over_a_presolved_one():
    g, b = mlp_graph()
    memo = {}
    first = sharding.tp_variants(g, b, 2, 1e-3, 1.0, 1.0, memo=memo)
    (key,) = memo
    pre = {key: memo[key][1:2]}
    again = sharding.tp_variants(g, b, 2, 1e-3, 1.0, 1.0, memo=memo, presolved=pre)
    assert again == first and list(pre) == [key]


def test_no_sharded_variant_when_none_is_asked_for():
    g, b = mlp_graph()
    assert [v.name for v in sharding.tp_variants(g, b, 2, 1e-3, 1.0, 1.0, 0)] == ["replicated"]


def test_a_tie_kept_whole_when_asked_styles_neither_use():
    g, b = tied_graph()
    variants = sharding.tp_variants(g, b, 2, 1e-3, 1.0, 1.0, vocab_tied=False)
    assert variants and all(not v.tp_plan for v in variants)
    assert [v.name for v in variants] == ["replicated"]


# --------------------------------------------------------------------------- realizable


def test_realizable_by_hand():
    """Megatron's fc1 hands its shard on (kept): runnable, on DTensors too. fc1's output
    gathered for a replicated gelu while fc2 reads the shard row-parallel: not runnable. A
    template on DTensors whose column-parallel output is gathered: not runnable."""
    g, b = mlp_graph()
    tpls = sharding._templates(mlp_problem(), 1e-3, 3)
    meg = tpls[0]
    assert sharding.realizable(g, b, meg)
    assert sharding.realizable(g, b, replace(meg, on_dtensors=True))
    # fc1 column-parallel by blocks (a fused projection's), its shard kept as well
    by_blocks = replace(meg, plans=((0, 1, "colwise_dtensor:2"), meg.plans[1]), on_dtensors=True)
    assert sharding.realizable(g, b, by_blocks)
    rep = tpls[1]
    assert sharding.realizable(g, b, rep) and sharding.realizable(g, b, replace(rep, plans=()))
    assert not sharding.realizable(g, b, replace(rep, on_dtensors=True))
    # act also leaves the block: fc1's region is gathered there and read row-parallel by fc2
    g.graph["outputs"] = ["out", "act"]
    assert not sharding.realizable(g, b, meg)


# --------------------------------------------------------------------------- earlier groups


def test_a_chain_of_ties_unties_an_earlier_reader_on_a_second_pass():
    """a's linear reads two tied weights, its weight (also b's, in a module no style shards)
    and its bias (tied under another path): a can split both along dim 0 (column-parallel),
    b cannot take the weight split, so the weight stays whole; a, read before b, is then left
    with no strategy holding its bias split and the weight whole, so the bias stays whole too,
    which only a second pass over the readers finds."""
    g = nx.DiGraph()
    _node(g, "x", "input", [], [2, 4])
    _node(g, "a", LINEAR, [{"node": "x"}, {"param": "a.weight"}, {"param": "a.bias"}], [2, 6],
          "a")  # fmt: skip
    _node(g, "b", LINEAR, [{"node": "x"}, {"param": "b.weight"}], [2, 6], "b")
    g.graph.update(
        param_shapes={"a.weight": [6, 4], "a.bias": [6]},
        param_owner={"a.weight": "a.weight", "b.weight": "a.weight", "a.bias": "a.bias",
                     "c.bias": "a.bias"},
        tp_modules=["a"], outputs=["a", "b"],
    )  # fmt: skip
    assert sharding.tied_parameters(g) == frozenset({"a.weight", "a.bias"})
    assert sharding.vocab_parallel_tied(g, 2) == frozenset()
    a, b = build_problem(g, _block(["a", "b"], ["a.weight", "a.bias"]), 2, 1.0, 1.0).ops
    assert a.strategies == (Strategy("R", ("R", "R", "R")), Strategy("S0", ("S0", "R", "R")))
    assert b.strategies == (Strategy("R", ("R", "R")), Strategy("S0", ("S0", "R")))


def test_a_partial_gradient_beside_another_producer_read_replicated(monkeypatch):
    """v = u * w with u [4, 1] broadcast over w [4, 6]: v split along dim 1 reads u whole, so
    u's gradient is partial (reduced as u is made: all-reduced from R, reduce-scattered from
    S0), while w, v's other operand and another producer in the block, may be read whole from
    either state too (every reshard allowed)."""
    monkeypatch.setattr(sharding, "RUNTIME_REALIZABLE", False)
    g = nx.DiGraph()
    _node(g, "y", "input", [], [4, 1])
    _node(g, "x", "input", [], [4, 6])
    _node(g, "u", "aten.relu.default", [{"node": "y"}], [4, 1], fb=32, bb=48)
    _node(g, "w", "aten.gelu.default", [{"node": "x"}], [4, 6], ff=24, fb=192, bb=288)
    _node(g, "v", "aten.mul.Tensor", [{"node": "u"}, {"node": "w"}], [4, 6], ff=24, fb=208,
          bb=320, saved=[("u", 16), ("w", 96)])  # fmt: skip
    _node(g, "o", LINEAR, [{"node": "v"}, {"param": "o.weight"}], [4, 4], "o", ff=192,
          bf=384, fb=96, bb=192, saved=[("v", 96)])  # fmt: skip
    g.graph.update(param_shapes={"o.weight": [4, 6]}, param_owner={"o.weight": "o.weight"},
                   tp_modules=["o"], outputs=["o"])  # fmt: skip
    block = _block(["u", "w", "v", "o"], ["o.weight"], input_bytes=112)
    prob = build_problem(g, block, 2, 1.0, 1.0)
    assert [(s.out, s.req) for s in prob.ops[2].strategies] == [
        ("R", ("R", "R")), ("S0", ("S0", "S0")), ("S1", ("R", "S1")),
    ]  # fmt: skip
    base = evaluate(prob, (0,) * 4, SPB)
    feasible = [c for c in every_choice(prob) if evaluate(prob, c, SPB).feasible]
    # u and w made whole, or w split along 1 into v's split, gathered by o's rowwise weight
    assert feasible == [(0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 2, 2), (0, 2, 2, 2)]
    # the free optimum, (R, S1, S1, rowwise) at each lambda, against brute force: its all-reduce
    # of u's gradient priced once, no reduce-scatter of u (the state u is not made in)
    solved = sharding_milp(prob, SPB, time_scale=base.time_s, memory_scale=base.memory)
    assert len(solved) == len(LAMBDAS)
    for lam, (choice, value) in zip(LAMBDAS, solved):
        best = min(objective(evaluate(prob, c, SPB), base, lam) for c in feasible)
        assert value == pytest.approx(best, rel=1e-7) and choice == (0, 2, 2, 2)
