"""The sharding ILP's functions (planner/cost/sharding.py) called directly on graphs drawn here,
written for the module's generated mutants (docs/mutation.md): a tiny MLP block (fc1, gelu, fc2,
residual add) whose every strategy combination is priced by ``evaluate`` and solved pinned by
``sharding_milp`` (each combination's objective the same, the infeasible ones refused), the
ILP's optimum against the brute-force minimum, one combination's time and memory by hand, the
resharding table and the collective factors by hand, and each op kind's strategies listed by
hand. The graphs are built per test (the tied-weight sets are kept on the graph)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import networkx as nx
import pytest

from planner.cost import sharding
from planner.cost.sharding import (
    LAMBDAS,
    Operand,
    Strategy,
    build_problem,
    evaluate,
    model_state_bytes,
    op_share,
    reshard,
    sharding_milp,
    strategies_for,
)
from planner.trace.blocks import Block

SPB = 1e-3  # seconds per byte of a collective: 4 KB costs as much as the MLP's compute


def _node(g, name, op, args, shape, module="", ff=0, bf=0, fb=0, bb=0, saved=(), grad=True):
    params = [a["param"] for a in args if isinstance(a, dict) and "param" in a]
    g.add_node(
        name, op=op, args=args, shapes=[shape], dtypes=["float32"], module=module,
        fwd_flops=ff, bwd_flops=bf, fwd_bytes=fb, bwd_bytes=bb, requires_grad=grad,
        saved=list(saved), order=len(g), params=params,
    )  # fmt: skip
    for a in args:
        if isinstance(a, dict) and "node" in a:
            g.add_edge(a["node"], name)


def _block(nodes, params, input_bytes=256, modules=("mlp",)):
    return Block(
        index=0, name="b0", modules=list(modules), cls="c", label="c", nodes=list(nodes),
        params=0, param_names=list(params), fwd_flops=0, bwd_flops=0, fwd_bytes=0,
        bwd_bytes=0, saved_bytes=0, saved_selective_bytes=0, input_bytes=input_bytes,
        output_bytes=0, boundary_bytes=0, transient_bytes=0,
    )  # fmt: skip


LINEAR = "aten.linear.default"
MLP_PARAMS = {"fc1.weight": [16, 8], "fc1.bias": [16], "fc2.weight": [8, 16], "fc2.bias": [8]}


def mlp_graph(tp_modules=("fc1", "fc2")):
    """x [2, 4, 8] -> fc1 (16) -> gelu -> fc2 (8) -> + x: fp32, so x is 256 bytes, the hidden
    512. Rates 1 FLOP/s and 1 B/s: an op's seconds are max(ff, fb) + max(bf, bb)."""
    g = nx.DiGraph()
    _node(g, "x", "input", [], [2, 4, 8])
    x, n = {"node": "x"}, lambda u: {"node": u}
    _node(g, "fc1", LINEAR, [x, {"param": "fc1.weight"}, {"param": "fc1.bias"}], [2, 4, 16],
          "fc1", ff=1000, bf=2000, fb=300, bb=500, saved=[("x", 256)])  # fmt: skip
    _node(g, "act", "aten.gelu.default", [n("fc1")], [2, 4, 16], "act",
          ff=10, bf=10, fb=1024, bb=1536, saved=[("fc1", 512)])  # fmt: skip
    _node(g, "fc2", LINEAR, [n("act"), {"param": "fc2.weight"}, {"param": "fc2.bias"}], [2, 4, 8],
          "fc2", ff=1000, bf=2000, fb=300, bb=500, saved=[("act", 512)])  # fmt: skip
    _node(g, "out", "aten.add.Tensor", [n("fc2"), x], [2, 4, 8], "", ff=0, bf=0, fb=768, bb=512)
    g.graph.update(
        param_shapes=MLP_PARAMS, param_owner={p: p for p in MLP_PARAMS},
        tp_modules=list(tp_modules), outputs=["out"],
    )  # fmt: skip
    return g, _block(["fc1", "act", "fc2", "out"], MLP_PARAMS)


def mlp_problem(tp=2, **kw):
    g, b = mlp_graph(**kw)
    return build_problem(g, b, tp, flops_per_second=1.0, bytes_per_second=1.0)


def pinned(prob, choice):
    """The problem with op i offering strategy choice[i] alone."""
    ops = [replace(op, strategies=(op.strategies[k],)) for op, k in zip(prob.ops, choice)]
    return replace(prob, ops=ops)


def every_choice(prob):
    return itertools.product(*(range(len(op.strategies)) for op in prob.ops))


def objective(ev, base, lam):
    return ev.time_s / base.time_s + lam * ev.memory / base.memory


# --------------------------------------------------------------------------- the problem


def test_the_mlp_problem_lists_each_ops_strategies_costs_and_saved_tensors():
    prob = mlp_problem()
    assert [op.name for op in prob.ops] == ["fc1", "act", "fc2", "out"]
    fc1, act, fc2, out = prob.ops
    assert fc1.strategies == (
        Strategy("R", ("R", "R", "R")),
        Strategy("S2", ("R", "S0", "S0"), "colwise"),
        Strategy("P", ("S2", "S1", "R"), "rowwise"),
        Strategy("S0", ("S0", "R", "R")),
        Strategy("S1", ("S1", "R", "R")),
    )
    assert [s.out for s in act.strategies] == ["R", "S0", "S1", "S2"]
    assert out.strategies == (
        Strategy("R", ("R", "R")),
        Strategy("S0", ("S0", "S0")),
        Strategy("S1", ("S1", "S1")),
        Strategy("S2", ("S2", "S2")),
        Strategy("P", ("P", "P")),
    )
    # seconds: max(1000, 300) + max(2000, 500); max(10, 1024) + max(10, 1536)
    assert (fc1.seconds, act.seconds, out.seconds) == (3000, 2560, 768 + 512)
    assert (fc1.flops, act.flops, fc1.fwd_bytes) == (3000, 20, 300)
    assert (fc1.nbytes, act.nbytes, out.nbytes) == (512, 512, 256)
    assert fc1.saved == (("x", 256),) and not fc1.pinned
    assert prob.external == {"x": (256, True)}
    assert prob.outputs == ["out"]
    assert prob.param_numel == {"fc1.weight": 128, "fc1.bias": 16, "fc2.weight": 128, "fc2.bias": 8}
    assert prob.param_bytes == {p: 4 * n for p, n in prob.param_numel.items()}
    assert prob.owned == list(MLP_PARAMS)
    assert prob.roots == {n: n for n in ("fc1", "act", "fc2", "out")}
    assert prob.core == frozenset()
    assert (prob.input_bytes, prob.flops, prob.fwd_bytes) == (256, 6020, 300 + 1024 + 300 + 768)
    assert prob.block_module == "mlp" and prob.tp == 2


def test_rates_divide_flops_and_bytes_separately():
    g, b = mlp_graph()
    prob = build_problem(g, b, 2, flops_per_second=10.0, bytes_per_second=4.0)
    # fc1: max(100, 75) + max(200, 125); act: max(1, 256) + max(1, 384)
    assert [op.seconds for op in prob.ops[:2]] == [300.0, 640.0]


def test_a_module_no_style_can_shard_keeps_its_weight_whole():
    prob = mlp_problem(tp_modules=("fc2",))
    assert [s.plan for s in prob.ops[0].strategies] == ["", "", ""]
    assert [s.plan for s in prob.ops[2].strategies] == ["", "colwise", "rowwise", "", ""]


def test_degree_one_offers_the_replicated_strategy_alone():
    prob = mlp_problem(tp=1)
    assert all(op.strategies == (op.strategies[0],) for op in prob.ops)
    # the one choice, at time 9840 s and memory 1280 + 16 x 280 bytes, at each lambda
    assert sharding_milp(prob, SPB) == [
        ((0, 0, 0, 0), pytest.approx(9840 + lam * 5760, rel=1e-9)) for lam in LAMBDAS
    ]


# --------------------------------------------------------------------------- by hand


def test_megatron_mlp_time_and_memory_by_hand():
    """fc1 colwise, gelu S2, fc2 rowwise (P), add R: the all-reduce of fc2's 256-byte output
    (factor 2(t-1)/t = 1 at t = 2) forward; backward the all-reduce of x's partial gradient
    (fc1 reads x replicated to compute a shard). Compute: the products and gelu on 1/2, the
    add whole."""
    prob = mlp_problem()
    ev = evaluate(prob, (1, 3, 2, 0), SPB)
    assert ev.feasible
    assert ev.compute_s == pytest.approx(3000 / 2 + 2560 / 2 + 3000 / 2 + 1280)
    assert ev.comm_fwd == [("all_reduce", 256)]
    assert ev.comm_bwd == [("all_reduce", 256)]
    assert ev.time_s == pytest.approx(ev.compute_s + 2 * 256 * SPB)
    # saved: x whole (fc1 reads it R), fc1's and act's outputs sharded
    assert ev.saved_bytes == 256 + 512 / 2 + 512 / 2
    assert ev.saved_selective_bytes == ev.saved_bytes
    assert ev.sharded_params == ["fc1.bias", "fc1.weight", "fc2.weight"]
    assert ev.partial_params == []
    # fc2.bias replicated: 32 bytes; the rest halved
    assert ev.param_bytes == 512 / 2 + 64 / 2 + 512 / 2 + 32
    assert ev.memory == ev.saved_bytes + 16 * (128 / 2 + 16 / 2 + 128 / 2 + 8)


def test_a_sliced_input_and_a_reduce_scatter_by_hand(monkeypatch):
    """(Beyond what torch's styles run.) fc1 row-parallel on a slice of x (its gradient
    all-gathered back, 256 B at (t-1)/t), its partial sums reduce-scattered into gelu's S2
    (512 B forward, all-gathered back), fc2 row-parallel, all-reduced at the exit (256 B)."""
    prob = mlp_problem()
    choice = (2, 3, 2, 0)
    assert not evaluate(prob, choice, SPB).feasible  # the runtime slices nothing
    monkeypatch.setattr(sharding, "RUNTIME_REALIZABLE", False)
    ev = evaluate(prob, choice, SPB)
    assert ev.comm_fwd == [("reduce_scatter", 512), ("all_reduce", 256)]
    assert ev.comm_bwd == [("all_gather", 256), ("all_gather", 512)]
    comm = 512 * 0.5 + 256 * 1.0 + 256 * 0.5 + 512 * 0.5
    assert ev.time_s == pytest.approx((3000 + 2560 + 3000) / 2 + 1280 + comm * SPB)
    assert ev.saved_bytes == (256 + 512 + 512) / 2
    assert ev.sharded_params == ["fc1.weight", "fc2.weight"] and ev.partial_params == []
    assert ev.memory == 640 + 16 * (128 / 2 + 16 + 128 / 2 + 8)


def test_partial_sums_into_a_replicated_input_are_infeasible():
    prob = mlp_problem()
    # fc2 rowwise (P) into an add that wants P of x too: x arrives R, no collective makes P
    assert not evaluate(prob, (1, 3, 2, 4), SPB).feasible
    # fc1 batch-split output read whole by gelu: a gather downstream of no column-parallel op
    assert not evaluate(prob, (3, 0, 0, 0), SPB).feasible
    # gelu S2 from a colwise fc1 left to the exit: gathered midway, not at the module
    assert not evaluate(prob, (1, 3, 0, 3), SPB).feasible


def test_the_replicated_block_costs_its_compute_and_whole_states():
    prob = mlp_problem()
    ev = evaluate(prob, (0, 0, 0, 0), SPB)
    assert ev.time_s == 3000 + 2560 + 3000 + 1280 and ev.comm_fwd == ev.comm_bwd == []
    assert ev.memory == 256 + 512 + 512 + 16 * 280 == model_state_bytes(prob) + 1280
    assert ev.param_bytes == 4 * 280 and ev.sharded_params == []


def test_model_state_bytes_halves_only_the_sharded_parameters():
    prob = mlp_problem(tp=4)
    assert model_state_bytes(prob) == 16 * 280
    assert model_state_bytes(prob, ["fc1.weight", "fc2.bias"]) == 16 * (128 / 4 + 16 + 128 + 8 / 4)
    prob.owned = ["fc1.weight"]
    assert model_state_bytes(prob) == 16 * 128


# --------------------------------------------------------------------------- the ILP


def neighbours(prob, choices):
    """The combinations one op's strategy away from any of ``choices``, not among them."""
    found = set()
    for c in choices:
        for i, op in enumerate(prob.ops):
            found |= {c[:i] + (k,) + c[i + 1 :] for k in range(len(op.strategies))}
    return sorted(found - set(choices))


@pytest.mark.parametrize("realizable,n_feasible,n_near", [(True, 5, 52), (False, 12, 92)])
def test_every_feasible_combination_solves_pinned_to_its_evaluation(
    monkeypatch, realizable, n_feasible, n_near
):
    """Each op pinned to one strategy: the ILP's objective is evaluate's time over T0 plus
    lambda times its memory over M0, and the ILP refuses the infeasible combinations one op
    away from a feasible one (each breaks one rule: a partial sum from a replicated input, a
    gather midway, an output left split). Torch's styles run 5 of the 500 combinations (x
    and the output whole, partial sums only into the add's P from both sides, which x
    cannot give); every reshard allowed, 12."""
    monkeypatch.setattr(sharding, "RUNTIME_REALIZABLE", realizable)
    prob = mlp_problem()
    base = evaluate(prob, (0,) * 4, SPB)
    lam = 0.3
    feasible = [c for c in every_choice(prob) if evaluate(prob, c, SPB).feasible]
    near = neighbours(prob, feasible)
    assert (len(feasible), len(near)) == (n_feasible, n_near)
    for choice in feasible:
        ev = evaluate(prob, choice, SPB)
        solved = sharding_milp(pinned(prob, choice), SPB, (lam,), base.time_s, base.memory)
        assert solved == [((0, 0, 0, 0), pytest.approx(objective(ev, base, lam), rel=1e-7))]
    for choice in near:
        assert sharding_milp(pinned(prob, choice), SPB, (lam,), base.time_s, base.memory) == []


@pytest.mark.parametrize("tp,realizable", [(2, True), (4, True), (2, False), (4, False)])
def test_the_ilp_optimum_is_the_brute_force_minimum_at_each_lambda(monkeypatch, tp, realizable):
    monkeypatch.setattr(sharding, "RUNTIME_REALIZABLE", realizable)
    prob = mlp_problem(tp)
    base = evaluate(prob, (0,) * 4, SPB)
    evs = [(c, evaluate(prob, c, SPB)) for c in every_choice(prob)]
    evs = [(c, ev) for c, ev in evs if ev.feasible]
    solved = sharding_milp(prob, SPB, time_scale=base.time_s, memory_scale=base.memory)
    assert len(solved) == len(LAMBDAS)
    for lam, (choice, value) in zip(LAMBDAS, solved):
        best = min(objective(ev, base, lam) for _, ev in evs)
        assert value == pytest.approx(best, rel=1e-7)
        assert objective(evaluate(prob, choice, SPB), base, lam) == pytest.approx(best, rel=1e-7)
    # the memory-light end is Megatron's pairing
    outs = [op.strategies[k].out for op, k in zip(prob.ops, solved[-1][0])]
    assert outs == ["S2", "S2", "P", "R"]


def test_cheap_collectives_make_megatron_the_fastest():
    prob = mlp_problem()
    spb = 1e-6
    base = evaluate(prob, (0,) * 4, spb)
    (choice, value), *_ = sharding_milp(prob, spb, (1e-4,), base.time_s, base.memory)
    assert choice == (1, 3, 2, 0)
    ev = evaluate(prob, choice, spb)
    assert value == pytest.approx(objective(ev, base, 1e-4), rel=1e-9)


def test_scales_default_to_one():
    prob = mlp_problem()
    (choice, value), *_ = sharding_milp(prob, 1e-6, (1e-4,))
    ev = evaluate(prob, choice, 1e-6)
    assert value == pytest.approx(ev.time_s + 1e-4 * ev.memory, rel=1e-9)


# --------------------------------------------------------------------------- collectives


@pytest.mark.parametrize(
    "src,dst,moves",
    [
        ("R", "R", (None, None)),
        ("S1", "S1", (None, None)),
        ("P", "P", (None, None)),
        ("R", "P", None),
        ("S0", "P", None),
        ("R", "S0", None),  # slicing a replicated tensor: the sequence-parallel family only
        ("S0", "S1", None),
        ("P", "S0", None),
        ("P", "R", ("all_reduce", None)),
        ("S2", "R", ("all_gather", None)),
        ("S0/3", "R", ("all_gather", None)),
    ],
)
def test_reshard_table(src, dst, moves):
    assert reshard(src, dst) == moves


def test_reshard_rules_beyond_the_runtime(monkeypatch):
    monkeypatch.setattr(sharding, "RUNTIME_REALIZABLE", False)
    assert reshard("R", "S0") == (None, "all_gather")
    assert reshard("P", "S1") == ("reduce_scatter", "all_gather")
    assert reshard("S0", "S1") == ("all_to_all", "all_to_all")
    assert reshard("P", "R") == ("all_reduce", None)
    assert reshard("S0", "R") == ("all_gather", None)
    assert reshard("R", "P") is None


@pytest.mark.parametrize("t,ar,ag", [(2, 1.0, 0.5), (4, 1.5, 0.75), (8, 1.75, 0.875)])
def test_ring_factors(t, ar, ag):
    assert sharding._ring("all_reduce", t) == ar
    assert sharding._ring("all_gather", t) == ag
    assert sharding._ring("reduce_scatter", t) == ag
    assert sharding._ring("all_to_all", t) == ag


def test_gathers_midway_only_for_a_shard_no_column_parallel_module_made():
    col = Strategy("S2", ("R", "S0"), "colwise")
    blocks = Strategy("S2/3", ("R", "S0/3"), "colwise_dtensor:3")
    plain = Strategy("S2", ("S2",))
    assert not sharding.gathers_midway(col, "S2", "R")
    assert not sharding.gathers_midway(blocks, "S2/3", "R")
    assert not sharding.gathers_midway(Strategy("S2", ("R", "S1"), "colwise_in_out"), "S2", "R")
    assert sharding.gathers_midway(plain, "S2", "R")
    assert sharding.gathers_midway(Strategy("S2", ("R", "S1"), "rowwise"), "S2", "R")
    assert not sharding.gathers_midway(plain, "S2", "S2")  # no move
    assert not sharding.gathers_midway(plain, "P", "R")  # not a shard
    assert not sharding.gathers_midway(None, "S2", "R")  # a block input


# --------------------------------------------------------------------------- shares


def test_op_share():
    assert op_share("linear", "S1", True, 4) == 0.25
    assert op_share("gelu", "S0", False, 4) == 0.25
    assert op_share("linear", "P", True, 4) == 0.25
    assert op_share("add", "P", False, 4) == 1.0
    assert op_share("add", "R", True, 4) == 1.0
    # the vocabulary-parallel lookup: 2 x 100 output bytes moved whole, a 10 x 5 fp32
    # gradient (200 bytes) in quarters
    assert op_share("embedding", "P", False, 4, (10, 5), 100) == (200 + 50) / (200 + 200)
    assert op_share("embedding", "P", False, 4, None, 100) == 1.0
    assert op_share("embedding", "R", False, 4, (10, 5), 100) == 1.0


def test_node_share_reads_the_table_and_output_of_a_lookup():
    g = nx.DiGraph()
    _node(g, "idx", "input", [], [2, 3], grad=False)
    _node(g, "emb", "aten.embedding.default", [{"param": "wte.weight"}, {"node": "idx"}],
          [2, 3, 5], "wte")  # fmt: skip
    g.graph.update(param_shapes={"wte.weight": [10, 5]}, param_owner={})
    # output 2*3*5 fp32 = 120 bytes, table 10 x 5 fp32 = 200 bytes
    assert sharding.node_share(g, "emb", "P", 2) == (240 + 100) / (240 + 200)
    assert sharding.node_share(g, "emb", "S2", 2) == 0.5
    assert sharding.node_share(g, "emb", "R", 2) == 1.0
    g.nodes["emb"]["fwd_flops"] = 5
    assert sharding.node_share(g, "emb", "P", 2) == 0.5  # a product's partial sums


def test_partial_grads_are_the_replicated_differentiable_operands_of_a_shard():
    prob = mlp_problem()
    fc1, _, _, out = prob.ops
    assert sharding._partial_grads(fc1, fc1.strategies[1]) == [0]  # x, R, for S2 out
    assert sharding._partial_grads(fc1, fc1.strategies[3]) == [1, 2]  # weight and bias
    assert sharding._partial_grads(fc1, fc1.strategies[2]) == []  # P out
    assert sharding._partial_grads(fc1, fc1.strategies[0]) == []
    no_grad = replace(fc1, operands=(replace(fc1.operands[0], grad=False), *fc1.operands[1:]))
    assert sharding._partial_grads(no_grad, fc1.strategies[1]) == []
    assert sharding._partial_grads(out, out.strategies[1]) == []


# --------------------------------------------------------------------------- strategies


def node(name, shape, grad=True):
    return Operand("node", name, tuple(shape), grad)


def param(name, shape):
    return Operand("param", name, tuple(shape), True)


BUF = Operand("buffer", "mask", None, False)


def strategies(op, shape, operands, t=2, args=None, factors=frozenset()):
    if args is None:
        args = [{"node": o.name} if o.kind == "node" else {o.kind: o.name} for o in operands]
    attrs = {"shapes": [list(shape)], "args": args}
    return [
        (s.out, s.req, s.plan) for s in strategies_for(op, attrs, operands, t, frozenset(factors))
    ]


R_ = ("R", "", "")


def test_a_linear_offers_colwise_rowwise_and_its_leading_dims():
    x, w, b = node("x", (4, 6, 8)), param("w", (6, 8)), param("b", (6,))
    assert strategies(LINEAR, (4, 6, 6), [x, w, b], t=2) == [
        ("R", ("R", "R", "R"), ""),
        ("S2", ("R", "S0", "S0"), "colwise"),
        ("P", ("S2", "S1", "R"), "rowwise"),
        ("S0", ("S0", "R", "R"), ""),
        ("S1", ("S1", "R", "R"), ""),
    ]
    # t = 3: only the out features (6) and the sequence (6) divide
    assert strategies(LINEAR, (4, 6, 6), [x, w, b], t=3) == [
        ("R", ("R", "R", "R"), ""),
        ("S2", ("R", "S0", "S0"), "colwise"),
        ("S1", ("S1", "R", "R"), ""),
    ]
    # out features 6 as 3 blocks of 2, each split 2 ways; and by 2 blocks of 3: 3 % 2 != 0
    assert strategies(LINEAR, (4, 6, 6), [x, w, b], t=2, factors={2, 3})[2] == (
        "S2/3",
        ("R", "S0/3", "S0/3"),
        "colwise_dtensor:3",
    )
    assert len(strategies(LINEAR, (4, 6, 6), [x, w, b], t=2, factors={2, 3})) == 6
    assert strategies(LINEAR, (4, 6, 6), [x, w, b], t=1) == [("R", ("R", "R", "R"), "")]
    # a 1-D or shapeless weight: nothing but replicated
    assert strategies(LINEAR, (4, 6, 6), [x, param("w", (6,))], t=2) == [("R", ("R", "R"), "")]
    assert strategies(LINEAR, (4, 6, 6), [x, Operand("param", "w", None, True)]) == [
        ("R", ("R", "R"), "")
    ]
    # a weight that is an activation: a product, not a linear
    assert strategies(LINEAR, (4, 6, 6), [x, node("w", (6, 8))]) == [("R", ("R", "R"), "")]


def test_a_weight_stored_in_out_splits_its_other_dim():
    x, w, b = node("x", (4, 8)), param("w", (8, 6)), param("b", (6,))
    assert strategies("aten.mm.default", (4, 6), [x, w]) == [
        ("R", ("R", "R"), ""),
        ("S1", ("R", "S1"), "colwise_in_out"),
        ("P", ("S1", "S0"), "rowwise_in_out"),
        ("S0", ("S0", "R"), ""),
    ]
    assert strategies("aten.addmm.default", (4, 6), [b, x, w], factors={3}) == [
        ("R", ("R", "R", "R"), ""),
        ("S1", ("S0", "R", "S1"), "colwise_in_out"),
        ("S1/3", ("S0/3", "R", "S1/3"), "colwise_dtensor_in_out:3"),
        ("P", ("R", "S1", "S0"), "rowwise_in_out"),
        ("S0", ("R", "S0", "R"), ""),
    ]
    # addmm's bias must be the weight's out-sized 1-D parameter
    assert strategies("aten.addmm.default", (4, 6), [param("b", (8,)), x, w]) == [
        R_[:1] + (("R", "R", "R"), "")
    ]
    assert not sharding._weight_in_out("mm", [x, node("w", (8, 6))])
    assert not sharding._weight_in_out("mm", [x, param("w", (8, 6, 1))])
    assert not sharding._weight_in_out("mm", [x, Operand("param", "w", None, True)])
    assert not sharding._weight_in_out("addmm", [x, w])
    assert not sharding._weight_in_out("addmm", [node("b", (6,)), x, w])
    assert not sharding._weight_in_out("mm", [param("v", (4, 8)), w])
    assert sharding._weight_in_out("addmm", [b, x, w])


def test_a_transposed_weight_is_pinned_to_its_product():
    w = param("w", (6, 4))
    assert strategies("aten.t.default", (4, 6), [w]) == [
        ("R", ("R",), ""),
        ("S1", ("S0",), "colwise"),
        ("S0", ("S1",), "rowwise"),
    ]
    assert strategies("aten.t.default", (4, 3), [param("w", (3, 4))]) == [
        ("R", ("R",), ""),
        ("S0", ("S1",), "rowwise"),
    ]
    assert strategies("aten.transpose.int", (4, 3), [param("w", (3, 4))], t=3)[1][2] == "colwise"
    assert not sharding._is_transposed_weight("t", [param("w", (3,))])
    assert not sharding._is_transposed_weight("t", [node("w", (3, 4))])
    assert not sharding._is_transposed_weight("t", [])
    assert not sharding._is_transposed_weight("view", [param("w", (3, 4))])


def test_an_embedding_splits_its_hidden_its_vocabulary_or_the_indices():
    w, idx = param("wte", (10, 6)), node("idx", (4, 3), grad=False)
    assert strategies("aten.embedding.default", (4, 3, 6), [w, idx]) == [
        ("R", ("R", "R"), ""),
        ("S2", ("S1", "R"), "colwise"),
        ("P", ("S0", "R"), "rowwise"),
        ("S0", ("R", "S0"), ""),
    ]
    assert strategies("aten.embedding.default", (4, 3, 6), [w, idx], t=3) == [
        ("R", ("R", "R"), ""),
        ("S2", ("S1", "R"), "colwise"),
        ("S1", ("R", "S1"), ""),
    ]
    assert strategies("aten.embedding.default", (4, 3, 6), [param("wte", (10,)), idx]) == [
        ("R", ("R", "R"), "")
    ]


def test_a_product_of_activations():
    a, b = node("a", (2, 4, 6, 8)), node("b", (2, 4, 8, 10))
    assert strategies("aten.matmul.default", (2, 4, 6, 10), [a, b]) == [
        ("R", ("R", "R"), ""),
        ("S0", ("S0", "S0"), ""),
        ("S1", ("S1", "S1"), ""),
        ("S2", ("S2", "R"), ""),
        ("S3", ("R", "S3"), ""),
        ("P", ("S3", "S2"), ""),
    ]
    # b broadcast over the batch: only a splits it; t = 3 divides 6 only (m)
    b3 = node("b", (8, 10))
    assert strategies("aten.matmul.default", (2, 4, 6, 10), [a, b3]) == [
        ("R", ("R", "R"), ""),
        ("S0", ("S0", "R"), ""),
        ("S1", ("S1", "R"), ""),
        ("S2", ("S2", "R"), ""),
        ("S3", ("R", "S1"), ""),
        ("P", ("S3", "S0"), ""),
    ]
    assert strategies("aten.bmm.default", (2, 4, 6, 10), [a, b], t=3) == [
        ("R", ("R", "R"), ""),
        ("S2", ("S2", "R"), ""),
    ]
    assert strategies("aten.matmul.default", (6,), [node("a", (6, 8)), node("b", (8,))]) == [
        ("R", ("R", "R"), "")
    ]


def test_attention_splits_batch_or_heads_and_its_mask_by_broadcast():
    q = node("q", (2, 4, 6, 8))
    k, v = node("k", (2, 4, 5, 8)), node("v", (2, 4, 5, 8))
    sdpa = "aten.scaled_dot_product_attention.default"
    assert strategies(sdpa, (2, 4, 6, 8), [q, k, v]) == [
        ("R", ("R", "R", "R"), ""),
        ("S0", ("S0", "S0", "S0"), ""),
        ("S1", ("S1", "S1", "S1"), ""),
    ]
    mask = node("m", (1, 4, 6, 5))  # batch broadcast, heads full
    assert strategies(sdpa, (2, 4, 6, 8), [q, k, v, mask, BUF]) == [
        ("R", ("R", "R", "R", "R", None), ""),
        ("S0", ("S0", "S0", "S0", "R", None), ""),
        ("S1", ("S1", "S1", "S1", "S1", None), ""),
    ]
    short = node("m", (6, 5))  # [s_q, s_kv]: broadcast over batch and heads
    assert strategies(sdpa, (2, 4, 6, 8), [q, k, v, short])[1:] == [
        ("S0", ("S0", "S0", "S0", "R"), ""),
        ("S1", ("S1", "S1", "S1", "R"), ""),
    ]
    odd = node("m", (2, 3, 6, 5))  # 3 heads in the mask against 4: no head split
    assert strategies(sdpa, (2, 4, 6, 8), [q, k, v, odd])[1:] == [
        ("S0", ("S0", "S0", "S0", "S0"), "")
    ]
    assert strategies(sdpa, (2, 4, 6, 8), [q, k, v], t=4) == [
        ("R", ("R", "R", "R"), ""),
        ("S1", ("S1", "S1", "S1"), ""),
    ]
    assert strategies(sdpa, (2, 6, 8), [node("q", (2, 6, 8)), k, v]) == [("R", ("R", "R", "R"), "")]


def test_elementwise_ops_split_alike_and_pass_partial_sums_where_linear():
    x, y = node("x", (4, 6)), node("y", (4, 6))
    add = "aten.add.Tensor"
    assert strategies(add, (4, 6), [x, y]) == [
        ("R", ("R", "R"), ""),
        ("S0", ("S0", "S0"), ""),
        ("S1", ("S1", "S1"), ""),
        ("P", ("P", "P"), ""),
    ]
    # a bias broadcast along dim 0 and a parameter: R there; a [1, 6] row too
    bias = param("b", (6,))
    assert strategies(add, (4, 6), [x, bias]) == [
        ("R", ("R", "R"), ""),
        ("S0", ("S0", "R"), ""),
        ("S1", ("S1", "S0"), ""),
    ]
    assert strategies("aten.mul.Tensor", (4, 6), [node("s", (4, 1)), x]) == [
        ("R", ("R", "R"), ""),
        ("S0", ("S0", "S0"), ""),
        ("S1", ("R", "S1"), ""),
    ]
    # a split of the parameter alone is no split of the op
    assert strategies(add, (4, 6), [node("c", (1, 6)), bias], t=2) == [
        ("R", ("R", "R"), ""),
        ("S1", ("S1", "S0"), ""),
    ]
    assert strategies(add, (4, 6), [param("a", (4, 6)), bias])[1:] == []
    # x * 2.0 and x / 2 pass partial sums, 2 / x does not, nor x * y
    mul = "aten.mul.Tensor"
    assert ("P", ("P",), "") in strategies(mul, (4, 6), [x], args=[{"node": "x"}, 2.0, {}])
    assert ("P", ("P",), "") in strategies(mul, (4, 6), [x], args=[2.0, {"node": "x"}, {}])
    div = "aten.div.Tensor"
    assert ("P", ("P",), "") in strategies(div, (4, 6), [x], args=[{"node": "x"}, 2, {}])
    assert ("P", ("P",), "") not in strategies(div, (4, 6), [x], args=[2, {"node": "x"}, {}])
    assert ("P", ("P",), "") not in strategies(mul, (4, 6), [x], args=[{"node": "x"}, True, {}])
    assert ("P", ("P", "P"), "") not in strategies(mul, (4, 6), [x, y])
    assert ("P", ("P",), "") not in strategies("aten.gelu.default", (4, 6), [x])
    assert ("P", ("P",), "") in strategies("aten.clone.default", (4, 6), [x])
    assert ("P", ("P",), "") not in strategies(add, (4, 6), [x], args=[{"node": "x"}, 1.0, {}])
    assert ("P", ("P", "P"), "") in strategies(
        add, (4, 6), [x, y], args=[{"node": "x"}, {"node": "y"}, {}]
    )
    assert ("P", ("P", None), "") not in strategies(add, (4, 6), [x, BUF])
    # a cast keeps a block-sharded state
    assert strategies("aten.clone.default", (4, 6), [x], factors={3})[-1] == ("S1/3", ("S1/3",), "")


def test_block_sharded_unary_needs_one_full_size_activation():
    assert sharding._unary_blocks((4, 6), [node("x", (4, 6))], 2, frozenset({2, 3})) == [
        Strategy("S0/2", ("S0/2",)),
        Strategy("S1/3", ("S1/3",)),
    ]
    assert sharding._unary_blocks((4, 6), [node("x", (1, 6))], 2, frozenset({3})) == []
    assert sharding._unary_blocks((4, 6), [param("x", (4, 6))], 2, frozenset({3})) == []
    two = [node("x", (4, 6)), node("y", (4, 6))]
    assert sharding._unary_blocks((4, 6), two, 2, frozenset({3})) == []


def test_reductions_keep_the_dims_they_do_not_reduce():
    x = node("x", (4, 6, 8))
    soft = strategies("aten._softmax.default", (4, 6, 8), [x], args=[{"node": "x"}, -1, False])
    assert soft == [("R", ("R",), ""), ("S0", ("S0",), ""), ("S1", ("S1",), "")]
    norm = strategies(
        "aten.native_layer_norm.default", (4, 6, 8), [x, param("g", (8,))],
        args=[{"node": "x"}, [8], {"param": "g"}],
    )  # fmt: skip
    assert norm == [("R", ("R", "R"), ""), ("S0", ("S0", "R"), ""), ("S1", ("S1", "R"), "")]
    # a sum over dim 1 without keepdim: dim 2 lands at 1
    total = strategies("aten.sum.dim_IntList", (4, 8), [x], args=[{"node": "x"}, [1]])
    assert total == [("R", ("R",), ""), ("S0", ("S0",), ""), ("S1", ("S2",), "")]
    kept = strategies("aten.mean.dim", (4, 1, 8), [x], args=[{"node": "x"}, -2, True])
    assert kept == [("R", ("R",), ""), ("S0", ("S0",), ""), ("S2", ("S2",), "")]
    assert strategies("aten.sum.default", (), [x], args=[{"node": "x"}]) == [("R", ("R",), "")]
    assert strategies("aten.sum.dim_IntList", (), [x], args=[{"node": "x"}, []]) == [
        ("R", ("R",), "")
    ]
    assert strategies("aten.amax.default", (4, 6), [x], args=[{"node": "x"}, {}]) == [
        ("R", ("R",), "")
    ]
    whole = strategies("aten._softmax.default", (4, 6, 8), [x], args=[{"node": "x"}])
    assert whole == [(f"S{d}", (f"S{d}",), "") for d in range(3)][:0] + [
        ("R", ("R",), ""), ("S0", ("S0",), ""), ("S1", ("S1",), ""), ("S2", ("S2",), "")
    ]  # fmt: skip
    assert strategies("aten.rms_norm.default", (4, 6, 8), [x], args=[{"node": "x"}, None])[-1] == (
        "S2",
        ("S2",),
        "",
    )


def test_cat_splits_any_other_dim_and_passes_partial_sums():
    a, b = node("a", (4, 2)), node("b", (4, 4))
    cat = "aten.cat.default"
    assert strategies(cat, (4, 6), [a, b], args=[[{"node": "a"}, {"node": "b"}], 1, {}]) == [
        ("R", ("R", "R"), ""),
        ("P", ("P", "P"), ""),
        ("S0", ("S0", "S0"), ""),
    ]
    # no dim argument: dim 0 (args[1] is read only when a third entry exists)
    out = strategies(cat, (8, 6), [node("a", (4, 6)), node("b", (4, 6))], args=[[], -1])
    assert out == [("R", ("R", "R"), ""), ("P", ("P", "P"), ""), ("S1", ("S1", "S1"), "")]
    assert strategies(cat, (6,), [node("a", (2,)), node("b", (4, 1))], args=[[], 0, {}]) == [
        ("R", ("R", "R"), ""),
        ("P", ("P", "P"), ""),
    ]


def test_norm_dim():
    assert sharding._norm_dim(-1, 3) == 2
    assert sharding._norm_dim(1, 3) == 1
    assert sharding._norm_dim(1.0, 3) == 1
    assert sharding._norm_dim("x", 3) == 0
    assert sharding._norm_dim(-3, 3) == 0


def test_views_move_the_split_dim():
    x = node("x", (4, 6, 8))
    view = strategies("aten.view.default", (4, 6, 2, 4), [x], args=[{"node": "x"}, [4, 6, 2, 4]])
    assert view == [
        ("R", ("R",), ""), ("P", ("P",), ""), ("S0", ("S0",), ""), ("S1", ("S1",), ""),
        ("S2", ("S2",), ""),
    ]  # fmt: skip
    tr = strategies("aten.transpose.int", (4, 8, 6), [x], args=[{"node": "x"}, 1, -1])
    assert tr == [("R", ("R",), ""), ("P", ("P",), ""), ("S0", ("S0",), ""),
                  ("S2", ("S1",), ""), ("S1", ("S2",), "")]  # fmt: skip
    perm = strategies("aten.permute.default", (8, 4, 6), [x], args=[{"node": "x"}, [2, 0, 1]])
    assert perm[2:] == [("S1", ("S0",), ""), ("S2", ("S1",), ""), ("S0", ("S2",), "")]
    sel = strategies("aten.select.int", (4, 8), [x], args=[{"node": "x"}, 1, 0])
    assert sel[2:] == [("S0", ("S0",), ""), ("S1", ("S2",), "")]
    sl = strategies("aten.slice.Tensor", (4, 2, 8), [x], args=[{"node": "x"}, 1, 0, 2])
    assert sl[2:] == [("S0", ("S0",), ""), ("S2", ("S2",), "")]
    ub = strategies("aten.unbind.int", (6, 8), [x], args=[{"node": "x"}])
    assert ub[2:] == [("S0", ("S1",), ""), ("S1", ("S2",), "")]
    al = strategies("aten.alias.default", (4, 6, 8), [x], args=[{"node": "x"}])
    assert al == [
        ("R", ("R",), ""),
        ("S0", ("S0",), ""),
        ("S1", ("S1",), ""),
        ("S2", ("S2",), ""),
        ("P", ("P",), ""),
    ]  # fmt: skip  (an elementwise copy)
    assert sharding._map_view_dim("getitem", (4, 6, 8), (4, 6, 8), 2, [], 2) == 2
    assert sharding._map_view_dim("getitem", (4, 6, 8), (4, 6, 3), 2, [], 2) is None
    assert sharding._map_view_dim("detach", (4, 6, 8), (4, 6), 2, [], 2) is None
    assert sharding._map_view_dim("t", (4, 6), (6, 4), 0, [], 2) == 1
    assert sharding._map_view_dim("t", (4, 6), (6, 4), 1, [], 2) == 0
    assert sharding._map_view_dim("transpose", (4, 6, 8), (4, 8, 6), 0, [{}, 1, 2], 2) == 0
    assert sharding._map_view_dim("permute", (4, 6), (6, 4), 1, [{}, [1]], 2) == 0
    assert sharding._map_view_dim("permute", (4, 6), (6, 4), 0, [{}, [1]], 2) is None
    assert sharding._map_view_dim("narrow", (4, 6), (4, 2), 0, [{}, 1, 0, 2], 2) == 0
    assert sharding._map_view_dim("select", (4, 6, 8), (4, 8), 0, [{}, 1, 0], 2) == 0
    assert sharding._map_view_dim("as_strided", (4, 6), (4, 6), 0, [], 2) is None
    ex = strategies("aten.expand.default", (3, 4, 6, 8), [x], args=[{"node": "x"}, [3, 4, 6, 8]])
    assert ex[2:] == [("S1", ("S0",), ""), ("S2", ("S1",), ""), ("S3", ("S2",), "")]
    # an expand of a size-1 dim hands R on split (the broadcast rule)
    one = node("x", (4, 1, 8))
    ex1 = strategies("aten.expand.default", (4, 6, 8), [one], args=[{"node": "x"}, [4, 6, 8]])
    assert ex1[2:] == [("S0", ("S0",), ""), ("S2", ("S2",), ""), ("S1", ("R",), "")]
    lead = strategies("aten.expand.default", (2, 4, 6, 8), [x], args=[{"node": "x"}, []])
    assert ("S0", ("R",), "") in lead
    assert strategies("aten.view.default", (2,), [Operand("node", "x", None, True)]) == [
        ("R", ("R",), "")
    ]
    assert strategies("aten.view.default", (8,), [param("w", (2, 4))]) == [("R", ("R",), "")]


def test_reshape_dim_maps_a_groups_leading_dim():
    assert sharding.reshape_dim((4, 6, 8), (24, 8), 0, 2) == 0
    assert sharding.reshape_dim((4, 6, 8), (24, 8), 1, 2) is None  # an inner dim
    assert sharding.reshape_dim((4, 6, 8), (4, 48), 2, 2) is None
    assert sharding.reshape_dim((4, 6, 8), (4, 6, 2, 4), 2, 2) == 2
    assert sharding.reshape_dim((4, 6, 8), (4, 6, 2, 4), 2, 4) is None  # 2 % 4
    assert sharding.reshape_dim((1, 6, 8), (6, 8), 1, 2) == 0
    assert sharding.reshape_dim((4, 6), (4, 1, 6), 1, 2) == 2
    assert sharding.reshape_dim((4, 6), (5, 6), 0, 2) is None
    assert sharding._reshape_group((4, 6, 8), (24, 8), 2) == ([2], [1])
    assert sharding._reshape_group((4, 6, 8), (2, 12, 8), 1) == ([0, 1], [0, 1])
    assert sharding._reshape_group((4, 6), (5, 6), 0) is None
    assert sharding._reshape_group((4, 6), (4, 6), 5) is None


def test_sections_and_split_dims():
    assert sharding._sections("split", 10, [{"node": "x"}, 4]) == [(0, 4), (4, 4), (8, 2)]
    assert sharding._sections("split", 10, [{"node": "x"}, 4, -1, {}]) == [(0, 4), (4, 4), (8, 2)]
    assert sharding._sections("split_with_sizes", 10, [{"node": "x"}, [2, 8]]) == [(0, 2), (2, 8)]
    assert sharding._sections("chunk", 10, [{"node": "x"}, 3]) == [(0, 4), (4, 4), (8, 2)]
    assert sharding._sections("chunk", 9, [{"node": "x"}, 3]) == [(0, 3), (3, 3), (6, 3)]
    assert sharding._sections("split", 10, [{"node": "x"}, 0]) is None
    assert sharding._sections("split", 10, [{"node": "x"}]) is None
    assert sharding._sections("split", 10, [{"node": "x"}, 2.0]) is None
    assert sharding._sections("chunk", 10, [{"node": "x"}, 0]) is None
    assert sharding._sections("split_with_sizes", 10, [{"node": "x"}, 5]) is None
    assert sharding._sections("slice", 10, [{"node": "x"}, 5]) is None
    assert sharding._split_dim("split", [{"node": "x"}, 4, -1], 3) == 2
    assert sharding._split_dim("chunk", [{"node": "x"}, 4], 3) == 0
    assert sharding._split_dim("chunk", [{"node": "x"}, 4, {"dim": 1}], 3) == 0
    assert sharding._split_dim("select", [{"node": "x"}, -1, 0], 3) == 2
    assert sharding._split_dim("unbind", [{"node": "x"}], 3) == 0
    assert sharding._positional([1, 2, {}]) == [1, 2]
    assert sharding._positional([1, 2]) == [1, 2]
    assert sharding._positional([]) == []


def test_block_factors_are_the_equal_splits():
    x = {"node": "x"}
    assert sharding.block_factors(
        [
            ("aten.split.Tensor", (4, 24), [x, 8, -1]),  # 3 equal blocks
            ("aten.chunk.default", (4, 10), [x, 2, 1]),  # 2 equal blocks
            ("aten.split.Tensor", (4, 10), [x, 4, 1]),  # 4, 4, 2: unequal
            ("aten.split_with_sizes.default", (6, 4), [x, [6]]),  # one part
            ("aten.view.default", (4, 24), [x, [96]]),
            ("aten.chunk.default", None, [x, 2]),
        ]
    ) == frozenset({2, 3})
    assert sharding.block_factors([]) == frozenset()
    assert sharding.block_factors([("aten.split.Tensor", (5, 4), [x, 5])]) == frozenset()


def test_block_sharded_views():
    qkv = node("qkv", (2, 4, 12))
    x = {"node": "qkv"}
    # split into the 3 blocks: each block's S2
    assert strategies("aten.split.Tensor", (2, 4, 4), [qkv], args=[x, 4, -1], factors={3})[-1] == (
        "S2",
        ("S2/3",),
        "",
    )
    # split into blocks of 6 (2 parts) is not the 3 blocks
    assert ("S2", ("S2/3",), "") not in strategies(
        "aten.split.Tensor", (2, 4, 6), [qkv], args=[x, 6, -1], factors={3}
    )
    # a reshape into (3, 4): the inner dim sharded; into (12,): the blocks kept
    assert strategies("aten.view.default", (2, 4, 3, 4), [qkv], factors={3})[-1] == (
        "S3",
        ("S2/3",),
        "",
    )
    assert sharding._blocks_image("view", (2, 4, 12), (8, 12), 2, 3, [], 2) == "S1/3"
    assert sharding._blocks_image("view", (2, 4, 12), (2, 48), 2, 3, [], 2) is None
    assert sharding._blocks_image("view", (2, 4, 12), (2, 4, 2, 6), 2, 3, [], 2) is None
    assert sharding._blocks_image("view", (2, 4, 12), (2, 4, 3, 3), 2, 3, [], 2) is None
    assert sharding._blocks_image("view", (2, 4, 12), (2, 4, 3, 4), 2, 3, [], 2) == "S3"
    assert sharding._blocks_image("view", (2, 4, 12), (5, 4, 12), 2, 3, [], 2) is None
    assert sharding._blocks_image("transpose", (2, 4, 12), (2, 12, 4), 2, 3, [x, 1, 2], 2) == (
        "S1/3"
    )
    assert sharding._blocks_image("slice", (2, 4, 12), (2, 4, 4), 2, 3, [x, 2, 0, 4], 2) is None
    assert sharding._blocks_image("slice", (2, 4, 12), (2, 2, 12), 2, 3, [x, 1, 0, 2], 2) == (
        "S2/3"
    )
    assert sharding._view_blocks("view", (2, 48), [Operand("node", "q", None, True)], [], 2,
                                 frozenset({3})) == []  # fmt: skip


def test_complex_like_and_copy_views():
    x = node("x", (2, 4, 8, 2))
    # the complex side's last dim (the real side's pairs' dim) is not offered
    assert strategies("aten.view_as_complex.default", (2, 4, 8), [x]) == [
        ("R", ("R",), ""), ("S0", ("S0",), ""), ("S1", ("S1",), ""),
    ]  # fmt: skip
    c = node("c", (2, 4, 8))
    assert strategies("aten.view_as_real.default", (2, 4, 8, 2), [c], t=4) == [
        ("R", ("R",), ""), ("S1", ("S1",), ""), ("S2", ("S2",), ""),
    ]  # fmt: skip
    assert sharding._complex_view((2,), [Operand("node", "x", None, True)], 2) == []
    like = strategies("aten.new_zeros.default", (2, 6), [node("k", (2, 4))])
    assert like == [("R", ("R",), ""), ("S0", ("S0",), "")]
    assert strategies("aten.zeros_like.default", (2, 6), [node("k", (2, 6, 1))]) == [
        ("R", ("R",), "")
    ]
    copy = strategies("aten.copy_.default", (2, 4), [node("d", (2, 4)), node("s", (2, 4))])
    assert copy == [("R", ("R", "R"), ""), ("S0", ("S0", "S0"), ""), ("S1", ("S1", "S1"), "")]
    assert strategies("aten.copy_.default", (2, 4), [node("d", (2, 4)), node("s", (1, 4))]) == [
        ("R", ("R", "R"), ""),
        ("S1", ("S1", "S1"), ""),
    ]


def test_state_helpers():
    assert sharding._dim("S2") == 2 and sharding._dim("S1/3") == 1
    assert sharding._dim("R") is None and sharding._dim("P") is None and sharding._dim(None) is None
    assert sharding._dim("S12") == 12
    assert sharding._factor("S1/3") == 3 and sharding._factor("S1") == 1
    assert sharding._factor("R") == 1 and sharding._factor(None) == 1
    assert sharding._base("aten.linear.default") == "linear" and sharding._base("input") == "input"
    assert sharding._splittable((4, 6, 0, 3), 2) == [0, 1]
    assert sharding._nbytes((2, 3), "bfloat16") == 12
    assert sharding._nbytes((2, 3), "weird") == 24
    assert sharding._nbytes(None, "float32") == 0
    assert sharding._by_blocks(12, 3, 2) and not sharding._by_blocks(12, 1, 2)
    assert not sharding._by_blocks(9, 3, 2)
    assert sharding._rest([BUF, node("x", (2,))], "S0") == [None, "S0"]
    assert sharding._has_split([None, "R", "S1/2"]) and not sharding._has_split(["R", "P", None])
    assert sharding._is_node_ref({"node": "x"}) and not sharding._is_node_ref({"node": "x", "a": 1})
    assert not sharding._is_node_ref("x")


# --------------------------------------------------------------------------- variants


def mlp_variants(tp=2, spb=1e-3, **kw):
    g, b = mlp_graph()
    return sharding.tp_variants(g, b, tp, spb, 1.0, 1.0, **kw)


def test_the_mlp_variants_are_replicated_megatron_and_its_sequence_parallel_form():
    """Megatron (fc1 column-, fc2 row-parallel): compute halved but the add, an all-reduce of
    fc2's output forward and of x's gradient backward. Its sequence-parallel form also runs
    the add on half the tokens; it reduce-scatters fc2's partial output (256 B), gathers x at
    fc1 (and reduce-scatters its gradient), and gathers the output at the exit and x's
    gradient at the entry: six 256-byte collectives at (t-1)/t = 1/2."""
    rep, tp, sp = mlp_variants()
    names = [v.name for v in (rep, tp, sp)]
    assert names == ["tp2-v1", "replicated", "tp2-v1-sp"]
    meg, whole = rep, tp
    assert meg.tp_plan == {"fc1": "colwise", "fc2": "rowwise"}
    assert meg.states == {"fc1": "S2", "act": "S2", "fc2": "P", "out": "R"}
    assert meg.comm_fwd == (("all_reduce", 256),) and meg.comm_bwd == (("all_reduce", 256),)
    assert meg.compute_fraction == pytest.approx(3010 / 6020)
    assert meg.memory_bound_fraction == pytest.approx((150 + 512 + 150 + 768) / 2392)
    assert meg.param_fraction == pytest.approx(576 / 1120)
    assert (meg.saved_bytes, meg.saved_selective_bytes, meg.input_bytes) == (768, 768, 256)
    assert meg.grad_sums == () and meg.tp == 2 and meg.exit_gather == ()
    assert whole.tp_plan == {} and whole.compute_fraction == 1.0 and whole.param_fraction == 1.0
    assert whole.states == dict.fromkeys(("fc1", "act", "fc2", "out"), "R")
    assert (whole.saved_bytes, whole.comm_fwd, whole.comm_bwd) == (1280, (), ())
    assert sp.tp_plan == {"fc1": "colwise_sp", "fc2": "rowwise_sp", "mlp": "sp_block"}
    assert sp.states == {"fc1": "S2", "act": "S2", "fc2": "P", "out": "S1"}
    assert sp.comm_fwd == (("reduce_scatter", 256), ("all_gather", 256), ("all_gather", 256))
    assert sp.comm_bwd == (("all_gather", 256), ("reduce_scatter", 256), ("all_gather", 256))
    assert sp.exit_gather == (("all_gather", 256),)
    assert sp.entry_gather == (("all_gather", 256),)
    assert sp.compute_fraction == pytest.approx(3010 / 6020)
    assert sp.memory_bound_fraction == pytest.approx((150 + 512 + 150 + 384) / 2392)
    assert sp.param_fraction == pytest.approx(576 / 1120)
    assert (sp.saved_bytes, sp.input_bytes) == (768, 128)


def test_templates_price_time_and_memory_by_hand():
    prob = mlp_problem()
    tpls = sharding._templates(prob, 1e-3, 3)
    assert [t.name for t in tpls] == ["tp2-v1", "replicated", "tp2-v1-sp"]
    meg, rep, sp = tpls
    assert meg.time_s == pytest.approx(5560 + 2 * 256 * 1e-3)
    assert meg.memory == 768 + 16 * (64 + 8 + 64 + 8)
    assert rep.time_s == 9840 and rep.memory == 1280 + 16 * 280
    assert sp.time_s == pytest.approx(4920 + 6 * 128 * 1e-3)
    assert sp.memory == 768 + 16 * (64 + 8 + 64 + 8)
    assert meg.choice == (1, 3, 2, 0) and sp.choice == (1, 3, 2, 0) and rep.choice == (0,) * 4
    assert meg.plans == ((0, 1, "colwise"), (2, 1, "rowwise"))
    assert sp.plans == ((0, 1, "colwise_sp"), (2, 1, "rowwise_sp"))
    assert sp.sequence_parallel and not meg.sequence_parallel and not meg.on_dtensors
    assert meg.needs[0] == ("R", "S0", "S0") and meg.states == ("S2", "S2", "P", "R")
    assert sharding._templates(prob, 1e-3, 0) == [rep]
    assert [t.name for t in sharding._templates(mlp_problem(tp=1), 1e-3, 3)] == ["replicated"]


def test_tp_variants_are_memoised_per_block_class_and_rates():
    memo = {}
    first = mlp_variants(memo=memo)
    assert list(memo) == [("c", 2, 1e-3, 1.0, 1.0, 3, False)]
    g, b = mlp_graph()
    memo[("c", 2, 1e-3, 1.0, 1.0, 3, False)] = memo[next(iter(memo))][1:2]
    again = sharding.tp_variants(g, b, 2, 1e-3, 1.0, 1.0, memo=memo)
    assert [v.name for v in again] == ["replicated"]
    pre = {("c", 2, 1e-3, 1.0, 1.0, 3, False): memo.pop(("c", 2, 1e-3, 1.0, 1.0, 3, False))}
    moved = sharding.tp_variants(g, b, 2, 1e-3, 1.0, 1.0, memo=memo, presolved=pre)
    assert [v.name for v in moved] == ["replicated"] and pre == {}
    assert [v.name for v in first] == ["tp2-v1", "replicated", "tp2-v1-sp"]
    # a block of two modules runs no sequence-parallel variant
    b.modules = ["mlp", "other"]
    assert [v.name for v in sharding.tp_variants(g, b, 2, 1e-3, 1.0, 1.0)] == [
        "tp2-v1",
        "replicated",
    ]


def test_sequence_stream_drops_the_edge_gathers():
    *_, sp = mlp_variants()
    both = sharding.sequence_stream(sp, True, True)
    assert both.comm_fwd == sp.comm_fwd[:2] and both.comm_bwd == sp.comm_bwd[:2]
    assert both.takes_sequence_shard and both.leaves_sequence_shard
    takes = sharding.sequence_stream(sp, True, False)
    assert takes.comm_fwd == sp.comm_fwd and takes.comm_bwd == sp.comm_bwd[:2]
    assert takes.takes_sequence_shard and not takes.leaves_sequence_shard
    leaves = sharding.sequence_stream(sp, False, True)
    assert leaves.comm_fwd == sp.comm_fwd[:2] and leaves.comm_bwd == sp.comm_bwd
    assert sharding.sequence_stream(sp, False, False) is sp
    meg = mlp_variants()[0]
    assert sharding.sequence_stream(meg, True, True) is meg


def test_token_dims():
    assert sharding._token_dim((2, 4, 8), (2, 4), 2) == 1
    assert sharding._token_dim((8, 8), (2, 4), 2) == 0
    assert sharding._token_dim((8,), (2, 4), 2) is None
    assert sharding._token_dim((2, 4), (2, 4), 2) is None
    assert sharding._token_dim((2, 4, 8), (2, 4), 3) is None
    assert sharding._token_dim((2, 1, 8), (2, 1), 1) is None
    assert sharding._token_dim((2, 4, 8), (2, 4, 8), 2) is None
    assert sharding._sp_style("colwise_sp", 0) == "colwise_sp_tokens"
    assert sharding._sp_style("colwise_sp", 1) == "colwise_sp"


def test_regroups_tokens_only_flattens_the_token_dims():
    def op(name, shape, src):
        return sharding.Op(name, name, "", shape, (src,), (), 0, 0, 0, 0, True, ())

    assert sharding._regroups_tokens(
        op("aten.view.default", (8, 6), node("x", (2, 4, 6))), (2, 4), 2
    )
    assert sharding._regroups_tokens(
        op("aten.view.default", (2, 4, 6), node("x", (8, 6))), (2, 4), 2
    )
    assert not sharding._regroups_tokens(
        op("aten.view.default", (8, 3, 2), node("x", (2, 4, 6))), (2, 4), 2
    )
    assert not sharding._regroups_tokens(
        op("aten.add.Tensor", (8, 6), node("x", (8, 6))), (2, 4), 2
    )
    assert not sharding._regroups_tokens(
        op("aten.view.default", (8, 6), param("x", (2, 4, 6))), (2, 4), 2
    )
    assert not sharding._regroups_tokens(
        op("aten.view.default", (48,), node("x", (2, 4, 6))), (2, 4), 2
    )


# --------------------------------------------------------------------------- tied weights


def tied_graph(tp_modules=("wte", "head"), max_norm=False):
    """idx [2, 3] -> wte (10 x 4) -> h [2, 3, 4] -> head (x W^T with W the same table)."""
    g = nx.DiGraph()
    _node(g, "idx", "input", [], [2, 3], grad=False)
    _node(g, "emb", "aten.embedding.default", [{"param": "wte.weight"}, {"node": "idx"}],
          [2, 3, 4], "wte", fb=100, bb=300)  # fmt: skip
    _node(g, "logits", LINEAR, [{"node": "emb"}, {"param": "head.weight"}], [2, 3, 10], "head",
          ff=400, bf=800, saved=[("emb", 96)])  # fmt: skip
    g.graph.update(
        param_shapes={"wte.weight": [10, 4]},
        param_owner={"wte.weight": "wte.weight", "head.weight": "wte.weight"},
        tp_modules=list(tp_modules), outputs=["logits"],
        forward_state=["wte.weight"] if max_norm else [],
    )  # fmt: skip
    return g, _block(["emb", "logits"], ["wte.weight"], input_bytes=48, modules=("m",))


def test_a_tied_table_is_split_along_its_vocabulary_in_every_use():
    g, b = tied_graph()
    assert sharding.tied_parameters(g) == frozenset({"wte.weight"})
    assert sharding.vocab_parallel_tied(g, 2) == frozenset({"wte.weight"})
    assert sharding.vocab_parallel_tied(g, 1) == frozenset()
    assert sharding.updated_parameters(g) == frozenset()
    prob = build_problem(g, b, 2, 1.0, 1.0)
    emb, head = prob.ops
    assert emb.strategies == (Strategy("P", ("S0", "R"), "rowwise"),)
    assert head.strategies == (Strategy("S2", ("R", "S0"), "colwise"),)
    assert prob.param_bytes == {"wte.weight": 160}
    variants = sharding.tp_variants(g, b, 2, 1e-3, 1.0, 1.0)
    assert [v.name for v in variants] == ["tp2-tied"]
    (v,) = variants
    # the logits leave the block: the head gathers at its own output
    assert v.tp_plan == {"wte": "rowwise", "head": "colwise_gather"}
    # the lookup's partial sums all-reduced into the head (96 B), the logits gathered (240 B)
    assert v.comm_fwd == (("all_reduce", 96), ("all_gather", 240))
    assert v.param_fraction == 0.5
    # the ILP prices the logits' gather at the block's output as evaluate does
    base = evaluate(prob, (0, 0), SPB)
    assert sharding_milp(prob, SPB, (0.3,), base.time_s, base.memory) == [
        ((0, 0), pytest.approx(1.3, rel=1e-9))
    ]
    assert base.comm_fwd == [("all_reduce", 96), ("all_gather", 240)]
    off = build_problem(g, b, 2, 1.0, 1.0, vocab_tied=False)
    assert [s.out for s in off.ops[0].strategies] == ["R", "S0"]
    assert [s.out for s in off.ops[1].strategies] == ["R", "S0"]  # the batch; 3 % 2


def test_a_tie_no_style_can_split_stays_whole():
    g, b = tied_graph(tp_modules=("wte",))
    assert sharding.vocab_parallel_tied(g, 2) == frozenset()
    prob = build_problem(g, b, 2, 1.0, 1.0)
    assert all(s.req[0] == "R" for s in prob.ops[0].strategies)
    assert all(s.req[1] == "R" for s in prob.ops[1].strategies)
    g, b = tied_graph(max_norm=True)
    assert sharding.updated_parameters(g) == frozenset({"wte.weight"})
    prob = build_problem(g, b, 2, 1.0, 1.0)
    assert all(s.req[0] == "R" for s in prob.ops[0].strategies)


def test_a_weight_read_outside_its_module_is_tied():
    g, _ = mlp_graph()
    assert sharding.tied_parameters(g) == frozenset()
    g.nodes["act"]["args"] = [{"node": "fc1"}, {"param": "fc1.bias"}]
    g.graph.pop("tied_parameters")
    assert sharding.tied_parameters(g) == frozenset({"fc1.bias"})
    g.nodes["act"]["module"] = "fc1"
    g.graph.pop("tied_parameters")
    assert sharding.tied_parameters(g) == frozenset()


def test_keeps_ties_and_runnable():
    col = Strategy("S2", ("R", "S0"), "colwise")
    rep = Strategy("R", ("R", "R"))
    slots = [(1, "w")]
    assert sharding._keeps_ties(col, "m", slots, {"w"}, {"m"})
    assert not sharding._keeps_ties(col, "m", slots, {"w"}, {"other"})
    assert not sharding._keeps_ties(col, "m", slots, set(), {"m"})
    assert sharding._keeps_ties(rep, "m", slots, set(), set())
    assert not sharding._keeps_ties(rep, "m", slots, {"w"}, set())
    ops = [node("x", (2, 4)), param("w", (4, 4))]
    run = sharding._Runnable(frozenset({"w"}), frozenset({"m"}), frozenset({"w"}))
    assert run("m", col, ops) and not run("m", rep, ops)
    free = sharding._Runnable(frozenset(), frozenset({"m"}))
    assert free("m", col, ops) and free("m", rep, ops) and not free("n", col, ops)


def test_operands_resolve_aliases_and_skip_shapeless_nodes():
    g = nx.DiGraph()
    _node(g, "x", "input", [], [2, 3])
    g.add_node("none", shapes=[None])
    g.graph.update(param_owner={"b.w": "a.w"}, param_shapes={"a.w": [3, 3]})
    attrs = {"args": [{"node": "x"}, {"node": "none"}, {"node": "gone"}, {"param": "b.w"},
                      {"param": "c"}, {"buffer": "buf"}, {"const": 2}]}  # fmt: skip
    assert sharding._operands(g, attrs) == [
        Operand("node", "x", (2, 3), True),
        Operand("param", "a.w", (3, 3), True),
        Operand("param", "c", None, True),
        Operand("buffer", "buf", None, False),
        Operand("buffer", 2, None, False),
    ]
    assert sharding._has_tensor(g, "x") and not sharding._has_tensor(g, "none")


# --------------------------------------------------------------------------- derived weights


def scaled_graph():
    """The MLP with gelu replaced by a product with s = scale.w + 1 ([4, 1]: one factor per
    position, broadcast over the hidden), a value of a parameter alone (Gemma's norms)."""
    g, b = mlp_graph()
    g.remove_node("act")
    _node(g, "s", "aten.add.Tensor", [{"param": "scale.w"}, 1.0], [4, 1], "scale", fb=16, bb=16)
    _node(g, "act", "aten.mul.Tensor", [{"node": "fc1"}, {"node": "s"}], [2, 4, 16], "",
          fb=1024, bb=1536, saved=[("fc1", 512), ("s", 16)])  # fmt: skip
    g.add_edge("act", "fc2")
    g.graph["param_shapes"] = {**MLP_PARAMS, "scale.w": [4, 1]}
    g.graph["param_owner"] = {p: p for p in g.graph["param_shapes"]}
    b.nodes = ["fc1", "s", "act", "fc2", "out"]
    b.param_names = list(g.graph["param_shapes"])
    return g, b


def test_a_partial_gradient_of_a_value_of_parameters_is_theirs():
    g, b = scaled_graph()
    prob = build_problem(g, b, 2, 1.0, 1.0)
    assert sharding._derived_params(prob, ["s"]) == {"scale.w"}
    assert sharding._derived_params(prob, ["act"]) == set()  # reads the activation x
    assert sharding._derived_params(prob, ["s", "act", "x"]) == {"scale.w"}
    assert sharding._derived_params(prob, []) == set()
    outs = ["S2", "R", "S2", "P", "R"]
    choice = tuple(
        next(k for k, st in enumerate(op.strategies) if st.out == o and (o != "S2" or st.plan
             or op.name == "act"))
        for op, o in zip(prob.ops, outs)
    )  # fmt: skip
    ev = evaluate(prob, choice, SPB)
    assert ev.feasible
    # s is read whole by a product split along the hidden: its gradient is partial, summed
    # (16 B all-reduced); x's too (fc1 column-parallel), 256 B
    assert ev.comm_bwd == [("all_reduce", 16), ("all_reduce", 256)]
    assert ev.partial_params == ["scale.w"]
    (fast, *_) = sharding.tp_variants(g, b, 2, SPB, 1.0, 1.0)
    assert fast.states == dict(zip(b.nodes, outs))
    assert fast.grad_sums == ("scale",)
    assert fast.tp_plan == {"fc1": "colwise", "fc2": "rowwise"}


def test_a_parameter_read_only_on_gathered_values_is_not_summed():
    g, b = scaled_graph()
    states = {"fc1": "S2", "s": "R", "act": "S2", "fc2": "P", "out": "R"}
    assert sharding._read_sharded(g, b, "scale", states, set())
    assert not sharding._read_sharded(g, b, "scale", states, {"act"})
    assert not sharding._read_sharded(g, b, "scale", dict.fromkeys(states, "R"), set())
    assert not sharding._read_sharded(g, b, "nothing", states, set())
    assert sharding._read_sharded(g, b, "fc2", states, set())


def test_node_share_of_a_computed_table_a_one_flop_op_and_an_op_with_no_output():
    g = nx.DiGraph()
    _node(g, "idx", "input", [], [2, 3], grad=False)
    _node(g, "tab", "input", [], [10, 5])
    _node(g, "emb", "aten.embedding.default", [{"node": "tab"}, {"node": "idx"}], [2, 3, 5])
    g.nodes["emb"]["dtypes"] = ["bfloat16"]
    _node(g, "lk", "aten.embedding.default", [{"param": "wte.weight"}, {"node": "idx"}], [2, 3, 5])
    g.nodes["lk"]["dtypes"] = ["bfloat16"]
    _node(g, "one", "aten.add.Tensor", [{"node": "idx"}, {"node": "idx"}], [2, 3], ff=1)
    g.add_node("chk", op="aten._assert_tensor_metadata.default", args=[], shapes=[],
               dtypes=[], fwd_flops=0)  # fmt: skip
    g.graph.update(param_shapes={"wte.weight": [10, 5]}, param_owner={})
    assert sharding.node_share(g, "emb", "P", 2) == 1.0  # a table that is no weight
    # bf16 output: 2 x 3 x 5 x 2 = 60 bytes; the fp32 table gradient 200 bytes
    assert sharding.node_share(g, "lk", "P", 2) == (120 + 100) / (120 + 200)
    assert sharding.node_share(g, "one", "P", 2) == 0.5  # one FLOP: a product's partial sums
    assert sharding.node_share(g, "chk", "R", 2) == 1.0
    assert sharding.node_share(g, "chk", "S0", 2) == 0.5


def test_plus_sums_coefficients_by_column():
    assert sharding._plus({0: 1.0, 2: 1.0}, {0: 2.0, 1: -1.0}) == {0: 3.0, 2: 1.0, 1: -1.0}
    assert sharding._plus() == {}


def test_saved_tensors_of_every_kind_priced_alike_by_evaluate_and_the_ilp():
    """fc2 also keeps fc1's output (not its operand: it follows fc1's state), a tensor of its
    own making (sharded with fc2) and one from outside the block (always whole), as does the
    add (16 bytes)."""
    g, b = mlp_graph()
    g.nodes["fc2"]["saved"] = [("act", 512), ("fc1", 512), (None, 64), ("elsewhere", 32)]
    g.nodes["out"]["saved"] = [("elsewhere", 16)]
    prob = build_problem(g, b, 2, 1.0, 1.0)
    assert sharding._saved_entries(prob, prob.ops[2]) == [
        ("slot", 0, 512, True), ("node", "fc1", 512, True), ("self", None, 64, True),
        ("const", None, 32, True),
    ]  # fmt: skip
    ev = evaluate(prob, (1, 3, 2, 0), SPB)
    assert ev.saved_bytes == 256 + 256 + 256 + 256 + 32 + 32 + 16
    rep = evaluate(prob, (0, 0, 0, 0), SPB)
    assert rep.saved_bytes == 256 + 512 + 512 + 512 + 64 + 32 + 16
    for choice in [c for c in every_choice(prob) if evaluate(prob, c, SPB).feasible]:
        ev = evaluate(prob, choice, SPB)
        solved = sharding_milp(pinned(prob, choice), SPB, (1.0,), rep.time_s, rep.memory)
        assert solved == [((0, 0, 0, 0), pytest.approx(objective(ev, rep, 1.0), rel=1e-7))]


def test_derived_parameters_follow_chains_of_parameter_values():
    def op(name, *operands):
        return sharding.Op(name, "aten.mul.Tensor", "", (4,), operands, (), 0, 0, 0, 0, True, ())

    ops = [
        op("s", param("a", (4,))),
        op("s2", node("s", (4,)), param("b", (4,))),
        op("y", node("x", (4,)), node("s2", (4,))),
        op("z", node("s2", (4,)), node("y", (4,))),
    ]
    prob = sharding.BlockProblem(
        2, ops, {o.name: i for i, o in enumerate(ops)}, {"x": (16, True)}, ["z"], {}, {}, [],
        {}, frozenset(), 16,
    )  # fmt: skip
    assert sharding._derived_params(prob, ["s2"]) == {"a", "b"}
    assert sharding._derived_params(prob, ["s"]) == {"a"}
    assert sharding._derived_params(prob, ["y"]) == set()
    assert sharding._derived_params(prob, ["z", "s"]) == {"a"}


def test_a_replicated_weight_read_by_a_shard_gets_its_gradient_summed():
    """act = fc1 x g with g a [4, 1] weight broadcast over the hidden fc1 splits: g's gradient
    is partial on each rank, all-reduced (16 bytes at 2(t-1)/t = 1)."""
    g, b = scaled_graph()
    g.remove_node("s")
    g.nodes["act"]["args"] = [{"node": "fc1"}, {"param": "scale.w"}]
    g.nodes["act"]["module"] = "scale"  # its own weight (else a tie, read outside its module)
    g.nodes["act"]["saved"] = [("fc1", 512)]
    b.nodes = ["fc1", "act", "fc2", "out"]
    prob = build_problem(g, b, 2, 1.0, 1.0)
    choice = (1, next(k for k, s in enumerate(prob.ops[1].strategies) if s.out == "S2"), 2, 0)
    ev = evaluate(prob, choice, SPB)
    assert ev.comm_bwd == [("all_reduce", 256), ("all_reduce", 16)]
    assert ev.partial_params == ["scale.w"]
    rep = evaluate(prob, (0,) * 4, SPB)
    assert ev.time_s == pytest.approx(rep.time_s - (3000 + 2560 + 3000) / 2 + 528 * SPB)
    solved = sharding_milp(pinned(prob, choice), SPB, (0.3,), rep.time_s, rep.memory)
    assert solved == [((0,) * 4, pytest.approx(objective(ev, rep, 0.3), rel=1e-9))]


def transposed_graph():
    """y = x @ W.T (Falcon's own forward): W [6, 8] transposed by t, then mm."""
    g = nx.DiGraph()
    _node(g, "x", "input", [], [4, 8])
    _node(g, "wt", "aten.t.default", [{"param": "lin.weight"}], [8, 6], "lin")
    _node(g, "y", "aten.mm.default", [{"node": "x"}, {"node": "wt"}], [4, 6], "lin",
          ff=100, bf=200)  # fmt: skip
    g.graph.update(param_shapes={"lin.weight": [6, 8]}, param_owner={}, tp_modules=["lin"],
                   outputs=["y"])  # fmt: skip
    return g, _block(["wt", "y"], ["lin.weight"], input_bytes=128, modules=("lin",))


def test_a_transposed_weight_is_read_as_it_is_made():
    g, b = transposed_graph()
    prob = build_problem(g, b, 2, 1.0, 1.0)
    wt, y = prob.ops
    assert wt.pinned and not y.pinned
    assert [(s.out, s.req) for s in wt.strategies] == [("R", ("R",)), ("S1", ("S0",)),
                                                       ("S0", ("S1",))]  # fmt: skip
    outs = {(wt.strategies[i].out, y.strategies[j].req): (i, j)
            for i in range(3) for j in range(len(y.strategies))}  # fmt: skip
    # W.T column-split read whole: the runtime never gathers a weight for a product
    assert evaluate(prob, outs[("S1", ("R", "R"))], SPB).feasible is False
    # read as made, but y's split columns then leave the block gathered by no module's style
    assert evaluate(prob, outs[("S1", ("R", "S1"))], SPB).feasible is False
    assert evaluate(prob, outs[("R", ("R", "R"))], SPB).feasible
    base = evaluate(prob, (0, 0), SPB)
    for choice in itertools.product(range(3), range(len(y.strategies))):
        ev = evaluate(prob, choice, SPB)
        solved = sharding_milp(pinned(prob, choice), SPB, (0.3,), base.time_s, base.memory)
        want = [((0, 0), pytest.approx(objective(ev, base, 0.3), rel=1e-7))]
        assert solved == (want if ev.feasible else []), choice


def test_an_infeasible_layout_is_false_not_merely_falsy(monkeypatch):
    prob = mlp_problem()
    assert evaluate(prob, (1, 3, 2, 4), SPB).feasible is False  # a partial x
    assert evaluate(prob, (3, 0, 0, 0), SPB).feasible is False  # gathered midway
    assert evaluate(prob, (1, 3, 0, 3), SPB).feasible is False  # an output left split
    monkeypatch.setattr(sharding, "RUNTIME_REALIZABLE", False)
    # fc2 column-parallel and x sliced into the add's S2: every edge legal, the add's output
    # then gathered by no module's style
    assert evaluate(prob, (0, 0, 1, 3), SPB).feasible is False


def test_a_gathered_shard_read_whole_by_a_shard_reduce_scatters_its_gradient():
    """fc1 column-parallel, gathered at its module's output, read whole by a column-parallel
    fc2: fc2's ranks each leave a partial gradient of fc1's output, which fc1's ranks hold
    split: a reduce-scatter of its 512 bytes, beside the all-reduce of x's 256."""
    g, b = mlp_graph()
    g.remove_node("act")
    g.nodes["fc2"]["args"] = [{"node": "fc1"}, {"param": "fc2.weight"}, {"param": "fc2.bias"}]
    g.nodes["fc2"]["saved"] = [("fc1", 512)]
    g.add_edge("fc1", "fc2")
    b.nodes = ["fc1", "fc2", "out"]
    prob = build_problem(g, b, 2, 1.0, 1.0)
    ev = evaluate(prob, (1, 1, 0), SPB)
    assert ev.comm_fwd == [("all_gather", 512), ("all_gather", 256)]
    assert ev.comm_bwd == [("reduce_scatter", 512), ("all_reduce", 256)]
    base = evaluate(prob, (0, 0, 0), SPB)
    for choice in [c for c in every_choice(prob) if evaluate(prob, c, SPB).feasible]:
        ev = evaluate(prob, choice, SPB)
        solved = sharding_milp(pinned(prob, choice), SPB, (0.3,), base.time_s, base.memory)
        assert solved == [((0, 0, 0), pytest.approx(objective(ev, base, 0.3), rel=1e-7))]


@pytest.mark.parametrize("inside", [False, True])
def test_indices_with_no_gradient_add_nothing_to_the_objective(inside):
    """The tied graph's lookup with its table whole (vocab_tied off), its integer indices a
    block input or an op of the block: the replicated layout (the only one whose logits
    leave the block whole) solves pinned to evaluate's objective, no backward term for the
    indices."""
    g, b = tied_graph()
    if inside:
        b.nodes = ["idx", "emb", "logits"]
    prob = build_problem(g, b, 2, 1.0, 1.0, vocab_tied=False)
    zeros = (0,) * len(prob.ops)
    base = evaluate(prob, zeros, SPB)
    assert [c for c in every_choice(prob) if evaluate(prob, c, SPB).feasible] == [zeros]
    assert sharding_milp(prob, SPB, (0.3,), base.time_s, base.memory) == [
        (zeros, pytest.approx(1.0 + 0.3, rel=1e-9))
    ]


def test_dear_collectives_keep_the_block_whole():
    """At 100 s a byte Megatron's two 256-byte all-reduces cost far more than the compute
    they save: the ILP's optimum at the time end is the replicated block, as brute force
    finds (a consumer reading replicated a producer that could have been split)."""
    prob = mlp_problem()
    base = evaluate(prob, (0,) * 4, 100.0)
    ((choice, value),) = sharding_milp(prob, 100.0, (1e-4,), base.time_s, base.memory)
    assert choice == (0, 0, 0, 0) and value == pytest.approx(1 + 1e-4, rel=1e-9)


# --------------------------------------------------------------------------- helper 54e


def _op(name, op, shape, operands, saved=(), flops=0, nbytes=0, grad=True):
    return sharding.Op(name, op, "", tuple(shape), tuple(operands), (), 0, flops, 0, nbytes,
                       grad, tuple(saved))  # fmt: skip


def test_an_ops_own_saved_copy_is_sharded_when_its_output_is():
    """A copy made inside the op (saved with no producer) follows the op's output: an expand
    handing a replicated input on split (``_broadcast``) splits no operand, yet its copy is
    per device; a layout that splits nothing keeps it whole."""
    op = _op("e", "aten.expand.default", (4, 6), [node("x", (1, 6))], saved=[(None, 96)])
    assert sharding._saved_state_sharded(op, Strategy("S0", ("R",)), "self", None) is True
    assert sharding._saved_state_sharded(op, Strategy("R", ("S0",)), "self", None) is True
    assert sharding._saved_state_sharded(op, Strategy("P", ("P",)), "self", None) is False
    assert sharding._saved_state_sharded(op, Strategy("R", ("R",)), "slot", 0) is False
    assert sharding._saved_state_sharded(op, Strategy("S0", ("S1",)), "slot", 0) is True


def square_graph():
    """a [4, 4] -> h = gelu(a) -> y = h @ h (one producer read twice) -> z = a @ y -> w = a @ z
    -> w + a: a split product reads its other side whole, leaving that side's gradient
    partial: h's in either slot of y (its reduction takes the weak row), y's in z's second
    slot, and a's, a block input sorted before the internal producers."""
    g = nx.DiGraph()
    _node(g, "a", "input", [], [4, 4])
    mm = dict(ff=256, bf=512, fb=192, bb=256)
    _node(g, "h", "aten.gelu.default", [{"node": "a"}], [4, 4], ff=40, bf=80, fb=128, bb=192,
          saved=[("a", 64)])  # fmt: skip
    _node(g, "y", "aten.matmul.default", [{"node": "h"}, {"node": "h"}], [4, 4],
          saved=[("h", 64)], **mm)  # fmt: skip
    _node(g, "z", "aten.matmul.default", [{"node": "a"}, {"node": "y"}], [4, 4],
          saved=[("y", 64), ("a", 64)], **mm)  # fmt: skip
    _node(g, "w", "aten.matmul.default", [{"node": "a"}, {"node": "z"}], [4, 4],
          saved=[("z", 64)], **mm)  # fmt: skip
    _node(g, "out", "aten.add.Tensor", [{"node": "w"}, {"node": "a"}], [4, 4], fb=192, bb=128)
    g.graph.update(param_shapes={}, param_owner={}, tp_modules=[], outputs=["out"])
    return g, _block(["h", "y", "z", "w", "out"], [], input_bytes=64, modules=("sq",))


def test_a_producer_read_twice_sums_its_partial_gradient_once(monkeypatch):
    """Every feasible layout of the square graph (every reshard allowed: the runtime's rules
    keep it whole) solved pinned to evaluate's objective, the infeasible ones a single op away
    refused, and the free optimum the brute-force minimum at each lambda."""
    monkeypatch.setattr(sharding, "RUNTIME_REALIZABLE", False)
    g, b = square_graph()
    prob = build_problem(g, b, 2, 1.0, 1.0)
    assert [(s.out, s.req) for s in prob.ops[1].strategies] == [
        ("R", ("R", "R")), ("S0", ("S0", "R")), ("S1", ("R", "S1")), ("P", ("S1", "S0")),
    ]  # fmt: skip
    base = evaluate(prob, (0,) * 5, SPB)
    feasible = [c for c in every_choice(prob) if evaluate(prob, c, SPB).feasible]
    assert len(feasible) == 12
    gathers = [("all_gather", 64)] * 2
    assert evaluate(prob, (0, 1, 3, 0, 0), SPB).comm_bwd == [*gathers, ("all_reduce", 64)]
    assert evaluate(prob, (0, 0, 1, 3, 0), SPB).comm_bwd == [*gathers, ("all_reduce", 64)]
    for choice in feasible:
        ev = evaluate(prob, choice, SPB)
        solved = sharding_milp(pinned(prob, choice), SPB, (0.3,), base.time_s, base.memory)
        assert solved == [((0,) * 5, pytest.approx(objective(ev, base, 0.3), rel=1e-7))], choice
    for choice in neighbours(prob, feasible):
        assert sharding_milp(pinned(prob, choice), SPB, (0.3,), base.time_s, base.memory) == []
    solved = sharding_milp(prob, SPB, time_scale=base.time_s, memory_scale=base.memory)
    assert len(solved) == len(LAMBDAS)
    for lam, (choice, value) in zip(LAMBDAS, solved):
        best = min(objective(evaluate(prob, c, SPB), base, lam) for c in feasible)
        assert value == pytest.approx(best, rel=1e-7)
        assert objective(evaluate(prob, choice, SPB), base, lam) == pytest.approx(best, rel=1e-7)


def test_share_reads_a_lookups_table_and_output_and_the_ops_flops():
    """``_share`` of a problem's op is ``op_share`` of its kind, its first operand's shape when
    that is a parameter (the table of a lookup), its output bytes and whether it computes:
    a vocabulary-parallel lookup of a 10 x 4 fp32 table (160 B) with a 96-byte output at
    t = 2 moves 2 x 96 B whole and half the table's gradient."""
    table, idx = param("wte", (10, 4)), node("idx", (2, 3), grad=False)
    emb = _op("emb", "aten.embedding.default", (2, 3, 4), [table, idx], nbytes=96)
    assert sharding._share(emb, Strategy("P", ("S0", "R")), 2) == pytest.approx(
        (2 * 96 + 160 / 2) / (2 * 96 + 160)
    )
    assert sharding._share(emb, Strategy("R", ("R", "R")), 2) == 1.0
    # no output bytes given: only the table's gradient moves
    assert sharding.op_share("embedding", "P", False, 2, (10, 4)) == 0.5
    # a partial sum is half the work of a product of one FLOP or more, the whole of none
    mm = [node("a", (4, 4)), node("b", (4, 4))]
    assert (
        sharding._share(
            _op("p", "aten.mm.default", (4, 4), mm, flops=1), Strategy("P", ("S1", "S0")), 2
        )
        == 0.5
    )
    assert (
        sharding._share(
            _op("p", "aten.mm.default", (4, 4), mm, flops=0), Strategy("P", ("S1", "S0")), 2
        )
        == 1.0
    )
    # an activation first: no table read, even for a lookup-like name
    act = _op("e", "aten.embedding.default", (2, 3, 4), [node("t", (10, 4)), idx], nbytes=96)
    assert sharding._share(act, Strategy("P", ("S0", "R")), 2) == 1.0


def test_a_saved_operand_read_through_a_view_is_its_slot():
    """y reads v = view(h) and saves h (the trace names a view's root): the saved tensor is
    y's operand 0 as y sees it (its slot), not h's own output state."""
    g = nx.DiGraph()
    _node(g, "x", "input", [], [4, 6])
    _node(g, "h", "aten.gelu.default", [{"node": "x"}], [4, 6], ff=24, saved=[("x", 96)])
    _node(g, "v", "aten.view.default", [{"node": "h"}, [24]], [24])
    _node(g, "y", "aten.mul.Tensor", [{"node": "v"}, 2.0, {}], [24], ff=24, saved=[("h", 96)])
    g.graph.update(param_shapes={}, param_owner={}, tp_modules=[], outputs=["y"])
    prob = build_problem(g, _block(["h", "v", "y"], [], input_bytes=96), 2, 1.0, 1.0)
    assert prob.roots == {"h": "h", "v": "h", "y": "y"}
    assert sharding._saved_entries(prob, prob.ops[2]) == [("slot", 0, 96, True)]


def test_highs_refusing_to_run_is_an_error_not_an_empty_answer(monkeypatch):
    """A HiGHS whose run reports kError (its thread scheduler refused) raises, naming why;
    an infeasible ILP is the empty list instead."""
    import highspy

    real = sharding.quiet_highs

    class Refusing:
        def __init__(self, h):
            self._h = h

        def __getattr__(self, name):
            return getattr(self._h, name)

        def run(self):
            return highspy.HighsStatus.kError

    monkeypatch.setattr(sharding, "quiet_highs", lambda **kw: Refusing(real(**kw)))
    msg = r"^HiGHS refused the sharding ILP \(its thread scheduler\)$"
    with pytest.raises(RuntimeError, match=msg):
        sharding_milp(mlp_problem(), SPB, (0.3,))


def test_a_block_sharded_mm_has_no_bias_slot():
    """``mm(x, W)`` has two operands: its block-sharded column split names two states (the
    bias slot is addmm's alone)."""
    x, w = node("x", (4, 8)), param("w", (8, 6))
    assert strategies("aten.mm.default", (4, 6), [x, w], factors={3}) == [
        ("R", ("R", "R"), ""),
        ("S1", ("R", "S1"), "colwise_in_out"),
        ("S1/3", ("R", "S1/3"), "colwise_dtensor_in_out:3"),
        ("P", ("S1", "S0"), "rowwise_in_out"),
        ("S0", ("S0", "R"), ""),
    ]


def test_only_an_expand_splitting_a_replicated_input_needs_dtensors():
    """``_splits_replicated``: an expand whose output is split while it reads its input whole
    (``_broadcast``); not one reading a split input, not a whole or partial output, not
    another op reading a replicated input into a split output."""
    exp = _op("e", "aten.expand.default", (4, 6), [node("x", (1, 6))])
    add = _op("a", "aten.add.Tensor", (4, 6), [node("x", (4, 6)), node("b", (1, 6))])
    prob = sharding.BlockProblem(
        2, [exp, add], {"e": 0, "a": 1}, {}, ["a"], {}, {}, [], {}, frozenset(), 0
    )
    whole = Strategy("R", ("R", "R"))
    assert sharding._splits_replicated(prob, [Strategy("S0", ("R",)), whole]) is True
    assert sharding._splits_replicated(prob, [Strategy("S1/2", ("R",)), whole]) is True
    assert sharding._splits_replicated(prob, [Strategy("S1", ("S1",)), whole]) is False
    assert sharding._splits_replicated(prob, [Strategy("R", ("R",)), whole]) is False
    assert sharding._splits_replicated(prob, [Strategy("P", ("P",)), whole]) is False
    assert not sharding._splits_replicated(
        prob, [Strategy("R", ("R",)), Strategy("S0", ("S0", "R"))]
    )


def test_in_out_weights_split_only_the_dims_t_divides():
    """W [8, 6] stored [in, out]: t = 3 divides only its out dim (colwise), t = 4 only its in
    dim (rowwise, on x's split last dim) and x's 4 rows."""
    x, w = node("x", (4, 8)), param("w", (8, 6))
    assert strategies("aten.mm.default", (4, 6), [x, w], t=3) == [
        ("R", ("R", "R"), ""),
        ("S1", ("R", "S1"), "colwise_in_out"),
    ]
    assert strategies("aten.mm.default", (4, 6), [x, w], t=4) == [
        ("R", ("R", "R"), ""),
        ("P", ("S1", "S0"), "rowwise_in_out"),
        ("S0", ("S0", "R"), ""),
    ]


def test_no_weight_is_vocabulary_parallel_at_degree_one_and_shapeless_readers_are_skipped():
    """A tied table no op reads keeps its place at t = 2 (nothing rules it out) but not at
    t = 1, where nothing is split; a reader with no tensor output (an assertion on the
    table) offers no strategies and rules nothing out."""
    g, _ = tied_graph()
    g.remove_nodes_from(["emb", "logits"])
    assert sharding.vocab_parallel_tied(g, 1) == frozenset()
    assert sharding.vocab_parallel_tied(g, 2) == frozenset({"wte.weight"})
    g, _ = tied_graph()
    _node(g, "check", "aten._assert_tensor_metadata.default", [{"param": "wte.weight"}], None)
    assert sharding.vocab_parallel_tied(g, 2) == frozenset({"wte.weight"})


def test_a_shapeless_node_before_the_readers_stops_nothing():
    """The tie no style can split (head not shardable) stays whole even when a tensorless
    node comes first in the graph: every reader is still consulted."""
    g, _ = tied_graph(tp_modules=("wte",))
    first = nx.DiGraph()
    _node(first, "assert", "aten._assert_async.msg", [], None)
    first.add_nodes_from(g.nodes(data=True))
    first.add_edges_from(g.edges)
    first.graph.update(g.graph)
    assert sharding.vocab_parallel_tied(first, 2) == frozenset()


def test_attention_with_a_shapeless_key_or_value_stays_whole():
    q = node("q", (2, 4, 6, 8))
    k, v = node("k", (2, 4, 5, 8)), node("v", (2, 4, 5, 8))
    shapeless = Operand("param", "k", None, True)
    assert sharding._attention((2, 4, 6, 8), [q, shapeless, v], 2) == []
    assert sharding._attention((2, 4, 6, 8), [q, k, shapeless], 2) == []
    assert sharding._attention((2, 4, 6, 8), [shapeless, k, v], 2) == []


def test_a_shapeless_mask_is_handed_on_as_is():
    q, k, v = node("q", (2, 4, 6, 8)), node("k", (2, 4, 5, 8)), node("v", (2, 4, 5, 8))
    mask = Operand("param", "m", None, True)
    assert sharding._attention((2, 4, 6, 8), [q, k, v, mask], 2) == [
        Strategy("S0", ("S0", "S0", "S0", None)),
        Strategy("S1", ("S1", "S1", "S1", None)),
    ]
    # a buffer before the mask: both handed on, each in its place
    short = node("m", (6, 5))
    assert sharding._attention((2, 4, 6, 8), [q, k, v, BUF, short], 2) == [
        Strategy("S0", ("S0", "S0", "S0", None, "R")),
        Strategy("S1", ("S1", "S1", "S1", None, "R")),
    ]


def test_a_graph_naming_no_shardable_module_keeps_its_ties_whole():
    g, _ = tied_graph()
    del g.graph["tp_modules"]
    assert sharding.vocab_parallel_tied(g, 2) == frozenset()


def test_a_batched_product_splits_only_its_batch_dims_alike():
    """bmm [2, 4, 4] @ [2, 4, 6]: a's rows (4) equal b's inner dim (4), yet only the batch
    dim splits both; a shapeless side offers nothing."""
    a, b = node("a", (2, 4, 4)), node("b", (2, 4, 6))
    assert sharding._product((2, 4, 6), [a, b], 2) == [
        Strategy("S0", ("S0", "S0")),
        Strategy("S1", ("S1", "R")),
        Strategy("S2", ("R", "S2")),
        Strategy("P", ("S2", "S1")),
    ]
    shapeless = Operand("node", "b", None, True)
    assert sharding._product((2, 4, 6), [a, shapeless], 2) == []
    assert sharding._product((2, 4, 6), [shapeless, b], 2) == []


def test_a_product_broadcasts_a_short_side_and_splits_its_last_dim_where_t_divides():
    """b [2, 10] against a [2, 4, 6, 2]: b has no batch dims (its first size, 2, is no
    batch); [.., 3, 4, 8] @ [.., 3, 8, 4]: the heads (3) do not split, the columns (4) do."""
    n = node
    assert sharding._product((2, 4, 6, 10), [n("a", (2, 4, 6, 2)), n("b", (2, 10))], 2) == [
        Strategy("S0", ("S0", "R")),
        Strategy("S1", ("S1", "R")),
        Strategy("S2", ("S2", "R")),
        Strategy("S3", ("R", "S1")),
        Strategy("P", ("S3", "S0")),
    ]
    assert sharding._product((2, 3, 4, 4), [n("a", (2, 3, 4, 8)), n("b", (2, 3, 8, 4))], 2) == [
        Strategy("S0", ("S0", "S0")),
        Strategy("S2", ("S2", "R")),
        Strategy("S3", ("R", "S3")),
        Strategy("P", ("S3", "S2")),
    ]


def test_base_of_a_two_part_name_is_its_op():
    assert sharding._base("operator.getitem") == "getitem"
