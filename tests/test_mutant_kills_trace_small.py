"""Tests written for mutmut's generated mutants of planner/trace/value_checks.py and
planner/trace/randomness.py (benchmarks/generated_mutants.py): a small fx graph drawn by hand
with value checks on ``item`` reads, and graphs of op records drawn by hand for the random
draws. docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import operator
from types import SimpleNamespace

import networkx as nx
import numpy as np
import pytest
import torch

from planner.trace.randomness import numpy_draws, random_draws
from planner.trace.value_checks import ASSERT, ITEM, drop_value_checks

aten = torch.ops.aten


def _graph():
    """x -> sum -> item u0, checked twice (two messages) and, with u1, once more; an assertion
    of a flag (no value read); u2 checked too but also multiplied into the output."""
    g = torch.fx.Graph()
    x, flag = g.placeholder("x"), g.placeholder("flag")
    s = g.call_function(aten.sum.default, (x,))
    u0 = g.call_function(ITEM, (s,), name="u0")
    u1 = g.call_function(ITEM, (g.call_function(aten.mean.default, (x,)),), name="u1")
    u2 = g.call_function(ITEM, (g.call_function(aten.amax.default, (x,), name="amax"),), name="u2")
    ge = g.call_function(operator.ge, (u0, 0))
    g.call_function(ASSERT, (ge, "u0 >= 0"), name="first")
    g.call_function(ASSERT, (g.call_function(operator.le, (u0, 9)), "u0 <= 9"), name="second")
    both = g.call_function(operator.eq, (g.call_function(operator.add, (u0, u1)), u0))
    g.call_function(ASSERT, (both,), name="bare")  # no message: named by its node
    g.call_function(ASSERT, (flag, "flag"), name="on_flag")
    g.call_function(ASSERT, (g.call_function(operator.gt, (u2, 0)), "u2 > 0"), name="third")
    g.output(g.call_function(aten.mul.Tensor, (x, u2), name="mul"))
    return SimpleNamespace(graph_module=torch.fx.GraphModule(torch.nn.Module(), g))


def test_value_checks_and_the_ops_only_they_read_are_dropped():
    exported = _graph()
    lines = drop_value_checks(exported)
    assert lines == ["u0: u0 >= 0", "u1: bare", "u2: u2 > 0"]
    left = [n.name for n in exported.graph_module.graph.nodes]
    assert left == ["x", "flag", "amax", "u2", "on_flag", "mul", "output"]
    assert "u2" in exported.graph_module.code  # recompiled: the code is the graph's


def test_a_graph_without_value_checks_is_left_alone():
    g = torch.fx.Graph()
    x, flag = g.placeholder("x"), g.placeholder("flag")
    g.call_function(aten.sum.default, (x,), name="total")  # dead, but no check was dropped: kept
    g.call_function(ASSERT, (flag, "flag"), name="check")
    g.output(x)
    exported = SimpleNamespace(graph_module=torch.fx.GraphModule(torch.nn.Module(), g))
    assert drop_value_checks(exported) == []
    assert [n.name for n in g.nodes] == ["x", "flag", "total", "check", "output"]


def _ops(*records: dict) -> nx.DiGraph:
    g = nx.DiGraph()
    for i, r in enumerate(records):
        g.add_node(i, **r)
    return g


def test_random_draws_one_per_op_and_module_at_its_first_nodes_order():
    g = _ops(
        {"op": "aten.uniform_.default", "module": "router", "order": 5},
        {"op": "aten.dropout.default", "args": ["x", 0.0, True], "module": "off", "order": 0},
        {"op": "aten", "module": "a", "order": 0},  # no op name after the namespace
        {"op": "aten.rand", "module": "packet", "order": 11},  # a name without its overload
        {"op": "aten.native_dropout.default", "args": ["x", 0.1, True], "module": "at", "order": 3},
        {"op": "aten.dropout.default", "args": ["x", 0.1, None], "module": "mlp", "order": 4},
        {"op": "aten.uniform.default", "module": "router", "order": 1},
        {"op": "aten.randn_like.default", "order": 2},
        {"op": "aten.mm.default", "module": "mlp", "order": 0},
        {"op": "prims.uniform.default", "module": "p", "order": 0},
        {"op": "uniform", "module": "bare", "order": 0},
        {"op": "aten.bernoulli_.float", "module": "drop", "order": 9},
        {"op": "aten.feature_dropout.default", "args": ["x"], "module": "f", "order": 6},
        {"op": "aten.dropout.default", "args": None, "module": "none", "order": 7},
        {"op": "aten.alpha_dropout.default", "args": ["x", 1e-9], "module": "tiny", "order": 8},
        {"op": "aten.rrelu_with_noise.default", "order": 10, "module": ""},
    )  # fmt: skip
    assert random_draws(g) == [
        ("randn_like", "(root)"), ("dropout", "at"), ("dropout", "mlp"), ("uniform", "router"),
        ("dropout", "f"), ("dropout", "none"), ("dropout", "tiny"), ("bernoulli", "drop"),
        ("rrelu_with_noise", "(root)"), ("rand", "packet"),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "args", [["x", 0.0, True], ["x", 0.1, False], ["x", 0, True], ["x", "p", True], ["x", -0.5]]
)
def test_dropout_that_is_off_draws_nothing(args):
    g = _ops({"op": "aten.dropout.default", "args": args, "module": "m", "order": 0})
    assert random_draws(g) == []


def test_an_op_without_an_order_comes_first():
    g = _ops(
        {"op": "aten.rand.default", "module": "a", "order": 1},
        {"op": "aten.randn.default", "module": "b"},
        {"op": "aten.randint.low", "module": "c", "order": -1},
    )
    assert random_draws(g) == [("randint", "c"), ("randn", "b"), ("rand", "a")]


def test_numpy_draws_are_recorded_and_the_functions_restored():
    rand, choice = np.random.rand, np.random.choice
    found: list[str] = []
    with numpy_draws(found):
        assert np.random.randint(0, 5, size=3).shape == (3,)
        assert 0 <= np.random.choice(4, p=[0, 0, 1, 0]) == 2
        assert np.random.rand(2, 3).shape == (2, 3)
    assert found == ["numpy.random.randint", "numpy.random.choice", "numpy.random.rand"]
    assert np.random.rand is rand and np.random.choice is choice
    with pytest.raises(ValueError), numpy_draws(found):
        np.random.shuffle(np.arange(3))
        raise ValueError
    assert found[-1] == "numpy.random.shuffle" and np.random.shuffle.__module__ != __name__
    np.random.permutation(3)
    assert len(found) == 4


def test_a_value_read_under_many_residual_layers_is_found_once_per_node():
    """Residual layers make diamonds (h + f(h)): 40 of them are 2^40 paths from the check to
    the value, so each node is visited once or the search never ends."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    u0 = g.call_function(ITEM, (g.call_function(aten.sum.default, (x,)),), name="u0")
    h = g.call_function(aten.mul.Tensor, (x, u0))
    for _ in range(40):
        h = g.call_function(aten.add.Tensor, (h, g.call_function(aten.relu.default, (h,))))
    g.call_function(ASSERT, (g.call_function(aten.sum.default, (h,)), "deep"))
    g.output(x)
    exported = SimpleNamespace(graph_module=torch.fx.GraphModule(torch.nn.Module(), g))
    assert drop_value_checks(exported) == ["u0: deep"]
    assert [n.name for n in g.nodes] == ["x", "output"]
