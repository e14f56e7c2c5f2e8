"""Tests written for mutmut's generated mutants of runtime/stages.py (a model cut into pipeline
stages for a plan; benchmarks/generated_mutants.py). One process: a small model of four layers
handed the stream and a no-grad table (HF Llama's shape: the table computed on stage 0 and read
by every layer), a tied head and a parameter the forward never reads, cut into three stages as
a plan says; each stage's modules, tensors and boundaries against the lists written by hand,
and the split model's forward and backward against the model's own. The graph helpers run on
small fx graphs drawn in the test; docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import copy
import operator
import traceback
from datetime import timedelta
from types import SimpleNamespace as NS

import pytest
import torch
import torch.distributed as dist
from forked_gloo import run_ranks
from kept_traces import traced_pipeline_kept
from torch import nn

from planner.errors import UserInputError
from runtime import stages
from runtime.block_calls import module_calls
from runtime.stages import (
    PipelineCutError,
    _ContiguousGrad,
    _flat,
    _input_of,
    _passes_value,
    _replace_at,
    _SequenceLayout,
    _sharded_meta,
    _single_tensor_io,
    _the_traced_output,
    _through,
    _traced_output,
    _traced_value,
    _views_first_argument,
    _writes_first_argument,
    adopt_eager_modules,
    contiguous_boundaries,
    contiguous_grad,
    inline_grad_mode_regions,
    keep_unused_tensors,
    mutated_in_place,
    relay_skip_connections,
    send_sequence_shards,
    sequence_stream_links,
    split_ends,
    split_points,
    stage_module_name,
    traced_pipe,
)

V, D = 11, 6


@pytest.fixture(autouse=True)
def _kept_traces(monkeypatch):
    """torch's split of each model traced once a session (tests/kept_traces.py)."""
    monkeypatch.setattr(stages, "traced_pipeline", traced_pipeline_kept)


class Layer(nn.Module):
    """A residual layer handed the stream and a table (two tensors: its call is rebuilt)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.lin(self.norm(x))) * cos


class Net(nn.Module):
    """Embedding, a no-grad table read by every layer, four layers, a norm and a head tied
    to the embedding; ``unused`` is read nowhere. The output holds the logits, the first
    stage's embeddings and the ids (a model input)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.register_buffer("inv", torch.linspace(0.1, 1.0, D))
        self.layers = nn.ModuleList(Layer() for _ in range(4))
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.embed.weight
        self.unused = nn.Parameter(torch.ones(3))

    def forward(self, ids: torch.Tensor) -> dict:
        e = self.embed(ids)
        with torch.no_grad():
            cos = (torch.arange(ids.shape[1]).float()[:, None] * self.inv).cos()
        h = e
        for layer in self.layers:
            h = layer(h, cos)
        return {"logits": self.head(self.norm(h)), "first": e, "ids": ids}


def _plan(stages: list[list[str]], modules: dict[str, list[str]], seq=()) -> NS:
    """The fields of a plan the cut reads: blocks (modules, TP plan), stages (blocks)."""
    blocks = [
        NS(
            name=b,
            modules=m,
            tp_plan={},
            takes_sequence_shard=False,
            leaves_sequence_shard=False,
        )
        for b, m in modules.items()
    ]
    return NS(
        blocks=blocks,
        stages=[
            NS(index=i, blocks=s, receives_sequence_shard=i in seq) for i, s in enumerate(stages)
        ],
        model=NS(sha256="sha", args={}, file="net.py"),
        micro_batch_size=2,
    )


MODULES = {
    "b0": ["embed", "layers.0"],
    "b1": ["layers.1"],
    "b2": ["layers.2"],
    "b3": ["layers.3", "norm", "head"],
}
STAGES = [["b0"], ["b1", "b2"], ["b3"]]


def _ids() -> torch.Tensor:
    return torch.tensor([[1, 4, 7, 2, 9], [3, 0, 10, 5, 6]])


@pytest.fixture(scope="module")
def traced():
    """One trace of the cut (the slow part), shared: each test takes a private copy."""
    torch.manual_seed(0)
    model = Net()
    ids = _ids()
    calls = module_calls(model, (ids,))
    cache: dict = {}
    plan = _plan(STAGES, MODULES, seq=(1, 2))
    traced_pipe(plan, model, (ids,), cache, calls)
    return model, plan, calls, cache


def _pipe(traced):
    model, plan, calls, cache = traced
    model = copy.deepcopy(model)
    pipe = traced_pipe(plan, model, (_ids(),), cache, calls)
    return model, plan, calls, pipe


def _adopted(traced):
    model, plan, calls, pipe = _pipe(traced)
    one = {n for n, c in calls.items() if c.one_tensor}
    swapped = [
        adopt_eager_modules(
            pipe.get_stage_module(i),
            model,
            split_points(plan, model),
            one,
            pipe.meshplan_block_calls,
        )
        for i in range(pipe.num_stages)
    ]
    return model, plan, pipe, swapped


def _calls(gm) -> list[str]:
    return [n.target for n in gm.graph.nodes if n.op == "call_module"]


def test_the_cut_begins_each_stage_at_its_first_blocks_first_module():
    model = Net()
    plan = _plan(STAGES, MODULES)
    assert split_points(plan, model) == ["layers.1", "layers.3"]
    assert split_ends(plan, model) == ["layers.0", "layers.2"]
    # a block made of the ModuleList: its first child begins it, its last child ends it
    plan = _plan([["a"], ["b"], ["c"]], {"a": ["embed"], "b": ["layers"], "c": ["norm"]})
    assert split_points(plan, model) == ["layers.0", "norm"]
    assert split_ends(plan, model) == ["embed", "layers.3"]
    # a path the model lacks is cut where it says
    plan = _plan([["a"], ["b"]], {"a": ["embed"], "b": ["nowhere"]})
    assert split_points(plan, model) == ["nowhere"]


def test_each_stage_holds_its_blocks_modules_and_the_values_later_stages_read(traced):
    """Stage 0 computes the embeddings and the table; stage 1 takes the stream and the
    table and relays the table; stage 2 returns the logits, the embeddings (relayed from
    stage 0) and the ids (relayed from the model's input)."""
    _, _, _, pipe = _pipe(traced)
    assert pipe.num_stages == 3
    stages = [pipe.get_stage_module(i) for i in range(3)]
    assert _calls(stages[0]) == ["embed", "layers.0"]
    assert _calls(stages[1]) == ["layers.1", "layers.2"]
    assert _calls(stages[2]) == ["layers.3", "norm", "head"]
    outer = pipe.split_gm.graph
    tops = [n for n in outer.nodes if n.op == "call_module"]
    assert [n.target for n in tops] == [stage_module_name(i) for i in range(3)]
    assert [len(n.args) for n in tops] == [1, 4, 4]
    # every stage reads only its neighbour's outputs (or, the first, the model's input)
    for j, node in enumerate(tops[1:], 1):
        for a in node.args:
            assert a.target is operator.getitem and a.args[0] is tops[j - 1]
        # in output order: the producer's i-th output is the consumer's i-th input
        assert [a.args[1] for a in node.args] == list(range(len(node.args)))
    # the last stage returns the model's three leaves, in the output's order
    last_out = next(n for n in stages[2].graph.nodes if n.op == "output").args[0]
    assert len(last_out) == 3
    leaves = pipe.meshplan_outputs
    assert leaves is not None and leaves.constants == {}
    assert pipe.meshplan_block_calls.keys() == {f"layers.{i}" for i in range(4)}


def _run(pipe, model, ids):
    """Every stage in turn, in one autograd graph (``Pipe.__call__`` detaches between stages)."""
    return pipe.meshplan_outputs.rebuild(pipe.split_gm(ids))


def test_the_split_models_forward_and_backward_are_the_models(traced):
    """The stages with the model's eager modules adopted run the model's forward bit for
    bit and put the model's gradients on the model's own parameters."""
    model, _, pipe, swapped = _adopted(traced)
    assert swapped == [
        ["embed", "layers.0"],
        ["layers.1", "layers.2"],
        ["layers.3", "norm", "head"],
    ]
    ref = copy.deepcopy(model)
    ids = _ids()
    want = ref(ids)
    got = _run(pipe, model, ids)
    assert list(got) == ["logits", "first", "ids"]
    for k in ("logits", "first", "ids"):
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0)
    w = torch.linspace(-1, 1, V)
    (want["logits"] * w).sum().backward()
    (got["logits"] * w).sum().backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        if name == "unused":
            assert p.grad is None and q.grad is None
            continue
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7), name


def test_each_stage_holds_the_models_own_modules_and_tensors(traced):
    model, _, pipe, _ = _adopted(traced)
    s0, s1, s2 = (pipe.get_stage_module(i) for i in range(3))
    assert s0.embed is model.embed and s0.layers.get_submodule("0") is model.layers[0]
    assert s1.get_submodule("layers.1") is model.layers[1]
    assert s1.get_submodule("layers.2") is model.layers[2]
    assert s2.head is model.head and s2.norm is model.norm
    assert s2.head.weight is model.embed.weight  # the tie kept inside the last stage
    held = [{n for n, _ in s.named_parameters(remove_duplicate=False)} for s in (s0, s1, s2)]
    # torch's split hands the tied head's name to the stage that reads the table as well
    assert held[0] == {"embed.weight", "head.weight"} | {f"layers.0.{p}" for p in _layer_params()}
    assert s0.get_parameter("head.weight") is model.embed.weight
    assert held[1] == {f"layers.{i}.{p}" for i in (1, 2) for p in _layer_params()}
    assert held[2] == {f"layers.3.{p}" for p in _layer_params()} | {
        "norm.weight",
        "norm.bias",
        "head.weight",
    }
    # the buffer read by the table's code is the model's own tensor, found by path
    assert s0.inv is model.inv
    # a swapped module answers with the traced output's one tensor, hooked once
    assert model.layers[1]._meshplan_one_tensor is True
    assert len(model.layers[1]._forward_hooks) == 1
    assert model.layers[1]._meshplan_traced_output == (torch.float32, (2, 5, D))
    assert model.layers[1]._meshplan_output_leaf == 0
    assert model.embed._meshplan_output_leaf is None


def _layer_params():
    return ("norm.weight", "norm.bias", "lin.weight", "lin.bias")


def test_adopting_twice_hooks_each_module_once(traced):
    model, plan, calls, pipe = _pipe(traced)
    one = {n for n, c in calls.items() if c.one_tensor}
    stage = pipe.get_stage_module(0)
    cuts = split_points(plan, model)
    assert adopt_eager_modules(stage, model, cuts, one, pipe.meshplan_block_calls) == [
        "embed",
        "layers.0",
    ]
    fresh = traced_pipe(plan, model, (_ids(),), traced[3], calls).get_stage_module(0)
    assert adopt_eager_modules(fresh, model, cuts, one, pipe.meshplan_block_calls) == [
        "embed",
        "layers.0",
    ]
    assert len(model.embed._forward_hooks) == 1


def test_a_module_with_a_cut_inside_or_not_called_alone_stays_traced(traced):
    """Cut inside ``layers`` (a cut named ``layers.1``): nothing swapped above it; without
    the kept calls a layer handed two tensors stays traced; a module counted as called with
    more than one tensor (``one_tensor`` lacking it) stays traced too."""
    model, plan, calls, pipe = _pipe(traced)
    stage = pipe.get_stage_module(0)
    assert adopt_eager_modules(stage, model, ["embed.x"], set(), None) == []
    assert type(stage.embed) is not nn.Embedding
    model, plan, calls, pipe = _pipe(traced)
    stage = pipe.get_stage_module(2)
    got = adopt_eager_modules(stage, model, [], None, None)
    assert got == ["layers.3.norm", "layers.3.lin", "norm", "head"]
    assert stage.get_submodule("layers.3.lin") is model.layers[3].lin
    assert stage.get_submodule("layers.3") is not model.layers[3]
    # every tensor is the model's, through the traced layer too
    assert stage.get_submodule("layers.3").norm.weight is model.layers[3].norm.weight
    model, plan, calls, pipe = _pipe(traced)
    stage = pipe.get_stage_module(2)
    got = adopt_eager_modules(stage, model, [], {"norm", "layers.3.lin"}, {})
    assert got == ["layers.3.lin", "norm"]


def test_the_parameters_no_stage_holds_go_to_the_first_as_buffers(traced):
    model, _, pipe, _ = _adopted(traced)
    stages = [pipe.get_stage_module(i) for i in range(3)]
    first = stages[0]
    assert keep_unused_tensors(stages, model, first) == ["unused"]
    assert "unused" in first._buffers and "unused" not in first._parameters
    assert torch.equal(first.unused, model.unused) and not first.unused.requires_grad
    assert "unused" in first.state_dict()
    assert keep_unused_tensors(stages, model, first) == []


def test_a_nested_unread_tensor_is_kept_under_its_own_path():
    """A tied weight held under one name is held under all; a nested unread buffer gets
    holder modules on the way; a tensor the first stage already has is left alone."""
    model = nn.Module()
    model.a = nn.Linear(2, 2)
    model.b = nn.Linear(2, 2)
    model.b.weight = model.a.weight
    model.deep = nn.Module()
    model.deep.inner = nn.Module()
    model.deep.inner.register_buffer("tok", torch.arange(3.0))
    model.register_buffer("temp", torch.ones(1), persistent=False)
    holder = nn.Module()
    holder.a = model.a  # holds a.weight and a.bias
    first = nn.Module()
    first.b = nn.Module()
    first.b.register_buffer("bias", torch.zeros(2))
    assert keep_unused_tensors([holder], model, first) == ["deep.inner.tok"]
    assert torch.equal(first.deep.inner.tok, model.deep.inner.tok)
    assert "deep.inner.tok" in first.state_dict()
    assert not hasattr(first, "temp")
    # b.weight is a.weight (tied): held; b.bias is the first stage's own already
    assert not hasattr(first.b, "weight")
    assert torch.equal(first.b.bias, torch.zeros(2))
    # a stage holding it under a later call's name (``deep@1``) holds it too
    other = nn.Module()
    other.register_module("deep@1", model.deep)
    assert keep_unused_tensors([holder, other], model, nn.Module()) == ["b.bias"]


def test_a_stage_receiving_a_modified_input_copies_it():
    """contiguous_grad: a view (or, for a stage that writes it in place, a copy), whose
    backward hands back a contiguous gradient; a tensor without grad passes as is."""
    x = torch.tensor([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], requires_grad=True)
    v = contiguous_grad(x)
    assert v._base is x and torch.equal(v, x)
    c = contiguous_grad(x, True)
    assert c._base is None and torch.equal(c, x) and c.data_ptr() != x.data_ptr()
    c.add_(1)  # allowed: a copy
    plain = torch.ones(2)
    assert contiguous_grad(plain) is plain
    grad = torch.ones(3, 2).t()
    back, none = _ContiguousGrad.backward(None, grad)
    assert none is None and back.is_contiguous() and torch.equal(back, grad)
    y = contiguous_grad(x)
    (y * torch.ones(3, 2).t()).sum().backward()
    assert x.grad.is_contiguous() and torch.equal(x.grad, torch.ones(2, 3))


def _graph_of(fn, *leaves) -> torch.fx.GraphModule:
    return torch.fx.symbolic_trace(fn)


class _Writes(nn.Module):
    def forward(self, x):
        x.add_(1)
        return x


class _Reads(nn.Module):
    def forward(self, x):
        return x + 1


class _WritesSecond(nn.Module):
    def forward(self, x, y):
        y.mul_(2)
        return x + y


def test_what_writes_or_views_its_first_argument():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    aten = torch.ops.aten
    cases = {
        g.call_method("add_", (x, 1)): (True, False),
        g.call_method("__iadd__", (x, 1)): (False, False),
        g.call_method("view", (x, -1)): (False, True),
        g.call_method("view_as", (x, x)): (False, True),
        g.call_method("expand", (x, 2)): (False, True),
        g.call_method("t", (x,)): (False, True),
        g.call_method("reshape", (x, -1)): (False, False),
        g.call_function(aten.add_.Tensor, (x, x)): (True, False),
        g.call_function(aten.add.Tensor, (x, x)): (False, False),
        g.call_function(aten.transpose.int, (x, 0, 1)): (False, True),
        g.call_function(aten.copy_.default, (x, x)): (True, False),
        g.call_function(torch.add, (x, x)): (False, False),
        g.call_function(aten.rand.default, ([2],)): (False, False),
        g.call_module("m", (x,)): (False, False),
    }
    for node, (writes, views) in cases.items():
        assert _writes_first_argument(node) is writes, node
        assert _views_first_argument(node) is views, node


def _stage_graph(body) -> torch.fx.GraphModule:
    """A stage graph: ``body(graph, x, root)`` adds nodes after the placeholder ``x``."""
    root = nn.Module()
    root.w = _Writes()
    root.r = _Reads()
    root.w2 = _WritesSecond()
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(body(g, x))
    gm = torch.fx.GraphModule(root, g)
    for name in ("w", "r", "w2"):
        sub = torch.fx.symbolic_trace(getattr(root, name))
        setattr(gm, name, sub)
    return gm, x


def test_an_input_modified_in_place_directly_through_a_view_or_by_a_submodule():
    aten = torch.ops.aten
    cases = [
        (lambda g, x: g.call_method("add_", (x, 1)), True),
        (lambda g, x: g.call_method("add", (x, 1)), False),
        (lambda g, x: g.call_method("mul_", (g.call_method("view", (x, -1)), 2)), True),
        (lambda g, x: g.call_method("mul_", (g.call_method("reshape", (x, -1)), 2)), False),
        (lambda g, x: g.call_function(aten.mul_.Tensor, (g.call_method("t", (x,)), x)), True),
        (lambda g, x: g.call_method("add_", (g.call_method("add", (x, 1)), 1)), False),
        (
            lambda g, x: g.call_method(
                "add_", (g.call_method("t", (g.call_method("t", (x,)),)), 1)
            ),
            True,
        ),
        (lambda g, x: g.call_method("add_", (g.placeholder("y"), x)), False),
        (lambda g, x: g.call_module("w", (x,)), True),
        (lambda g, x: g.call_module("r", (x,)), False),
        (lambda g, x: g.call_module("w", (), {"x": x}), True),
        (lambda g, x: g.call_module("w", (), {"z": x}), False),
        # a submodule that writes its second argument, handed x first, or second
        (lambda g, x: g.call_module("w2", (x, g.placeholder("y"))), False),
        (lambda g, x: g.call_module("w2", (g.placeholder("y"), x)), True),
        # a view still to be followed when a submodule handed x is met
        (
            lambda g, x: g.call_method(
                "add_", (g.call_method("view", (x, -1)), g.call_module("r", (x,)))
            ),
            True,
        ),
        (
            lambda g, x: g.call_module("r", (g.call_module("w", (g.call_module("r", (x,)),)),)),
            False,
        ),
    ]
    for i, (body, want) in enumerate(cases):
        gm, x = _stage_graph(body)
        assert mutated_in_place(x, gm) is want, i


def test_a_submodule_without_a_graph_receives_nothing():
    root = nn.Module()
    root.lin = nn.Linear(2, 2)
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_module("lin", (x,)))
    gm = torch.fx.GraphModule(root, g)
    assert mutated_in_place(x, gm) is False


class _Stage0(nn.Module):
    def forward(self, x):
        return x.t(), x * 2


class _Stage1(nn.Module):
    def forward(self, a, b):
        a.add_(1)
        return a + b.t()


def _hand_split():
    """Two stages: the first returns a transposed (non-contiguous) value, the second writes
    its first input in place. An eager module (not a stage graph) runs first, and the traced
    values are float64 (the run's are float32: a receive buffer's dtype is the trace's)."""
    parts = nn.Module()
    parts.add_module("eager", nn.Identity())
    parts.add_module("submod_0", torch.fx.symbolic_trace(_Stage0()))
    parts.add_module("submod_1", torch.fx.symbolic_trace(_Stage1()))
    g = torch.fx.Graph()
    x = g.call_module("eager", (g.placeholder("x"),))
    s0 = g.call_module("submod_0", (x,))
    a, b = (g.call_function(operator.getitem, (s0, i)) for i in range(2))
    g.output(g.call_module("submod_1", (a, b)))
    gm = torch.fx.GraphModule(parts, g)
    assert [name for name, _ in gm.named_children()][0] == "eager"
    sample = torch.arange(6.0, dtype=torch.float64).reshape(2, 3)
    for node, val in zip(gm.submod_1.graph.nodes, (sample.t(), sample * 2)):
        node.meta["val"] = val
    for node in gm.submod_0.graph.nodes:
        if node.op == "call_method":
            node.meta["val"] = sample.t()
        elif node.op == "call_function":
            node.meta["val"] = sample * 2
    return gm


def test_boundaries_send_contiguous_tensors_and_copy_what_is_written_in_place():
    gm = _hand_split()
    x = torch.arange(6.0).reshape(2, 3)
    want = _Stage1()(*[v.clone() for v in _Stage0()(x.clone())])
    contiguous_boundaries(gm)
    s0, s1 = gm.submod_0, gm.submod_1
    out = next(n for n in s0.graph.nodes if n.op == "output").args[0]
    assert [n.target for n in out] == ["contiguous", "contiguous"]
    assert all(n.meta["val"].is_contiguous() for n in out)
    assert [tuple(n.meta["val"].shape) for n in out] == [(3, 2), (2, 3)]
    places = [n for n in s1.graph.nodes if n.op == "placeholder"]
    assert all(p.meta["val"].is_contiguous() for p in places)
    assert [tuple(p.meta["val"].shape) for p in places] == [(3, 2), (2, 3)]
    for n in (*out, places[0]):  # a new traced value: the meta device, the trace's dtype
        assert (n.meta["val"].dtype, n.meta["val"].device.type) == (torch.float64, "meta")
    wraps = [n for n in s1.graph.nodes if n.target is contiguous_grad]
    assert [w.args for w in wraps] == [(places[0], True), (places[1], False)]
    assert [list(p.users) for p in places] == [[wraps[0]], [wraps[1]]]
    xs = x.clone().requires_grad_()
    got = gm(xs)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    got.sum().backward()
    torch.testing.assert_close(xs.grad, torch.full((2, 3), 3.0))


def test_a_no_grad_region_is_inlined_with_its_outputs_detached():
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            with torch.no_grad():
                t = torch.tensor([1.0, 2.0, 3.0])
                a = (x * t).cos()
                b = x.sin()
            return self.lin(x) * a + b, a

    m = M()
    x = torch.linspace(-1, 1, 6).reshape(2, 3)
    gm = torch.export.export(m, (x,), strict=False).module()
    hop = torch.ops.higher_order.wrap_with_set_grad_enabled
    assert any(n.target is hop for n in gm.graph.nodes)
    out = inline_grad_mode_regions(gm)
    assert out is gm
    nodes = list(gm.graph.nodes)
    assert not any(n.target is hop for n in nodes)
    assert not any(n.op == "get_attr" and n.target.startswith("wrap_body") for n in nodes)
    detached = [n for n in nodes if n.target is torch.ops.aten.detach.default]
    assert len(detached) == 2
    assert all("nn_module_stack" not in n.meta or n.meta["nn_module_stack"] for n in detached)
    xs = x.clone().requires_grad_()
    got, a = gm(xs)
    want, wa = m(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(a, wa, rtol=0, atol=0)
    assert not a.requires_grad
    got.sum().backward()
    # no gradient flows through the region: d/dx of lin(x) * a + b is lin's weight times a
    torch.testing.assert_close(xs.grad, (wa @ m.lin.weight).detach())


def _region(enabled: bool, through_getitem: bool) -> torch.fx.GraphModule:
    """A no-grad region drawn by hand: its body reads a constant of its own (``k``) and
    returns (x * k, x + 1); the outer graph reads both outputs by index, or returns the
    region's tuple as it is."""
    body_root = nn.Module()
    body_root.k = torch.tensor([2.0, 3.0])
    bg = torch.fx.Graph()
    bx = bg.placeholder("x")
    k = bg.get_attr("k")
    bg.output((bg.call_function(torch.mul, (bx, k)), bg.call_function(torch.add, (bx, 1))))
    root = nn.Module()
    root.body = torch.fx.GraphModule(body_root, bg)
    g = torch.fx.Graph()
    x = g.placeholder("x")
    ref = g.get_attr("body")
    hop = g.call_function(torch.ops.higher_order.wrap_with_set_grad_enabled, (enabled, ref, x))
    hop.meta["nn_module_stack"] = {"m": ("m", nn.Module)}
    hop.meta["other"] = 1
    hop.meta["stack_trace"] = "model.py, line 3"
    if through_getitem:
        a, b = (g.call_function(operator.getitem, (hop, i)) for i in range(2))
        g.output(g.call_function(torch.add, (g.call_function(torch.mul, (a, x)), b)))
    else:
        g.output(hop)
    return torch.fx.GraphModule(root, g)


def test_a_region_drawn_by_hand_is_inlined_its_constant_hoisted():
    x = torch.tensor([0.5, -1.0], requires_grad=True)
    gm = inline_grad_mode_regions(_region(False, True))
    nodes = list(gm.graph.nodes)
    assert [n.op for n in nodes].count("get_attr") == 1
    const = next(n for n in nodes if n.op == "get_attr")
    assert const.target == "_inlined_body_k" and torch.equal(gm._inlined_body_k, gm.body.k)
    assert const.meta["nn_module_stack"] == {"m": ("m", nn.Module)}
    assert "other" not in const.meta and const.meta["stack_trace"] == "model.py, line 3"
    detached = [n for n in nodes if n.target is torch.ops.aten.detach.default]
    assert len(detached) == 2 and all("nn_module_stack" in n.meta for n in detached)
    assert not any(n.target is operator.getitem for n in nodes)
    got = gm(x)
    k = torch.tensor([2.0, 3.0])
    torch.testing.assert_close(got, x.detach() * k * x.detach() + x.detach() + 1)
    got.sum().backward()
    torch.testing.assert_close(x.grad, x.detach() * k)  # only through ``* x`` outside
    # the region's tuple returned as it is
    gm = inline_grad_mode_regions(_region(False, False))
    a, b = gm(x.detach())
    assert torch.equal(a, x.detach() * k) and torch.equal(b, x.detach() + 1)
    assert not any(n.op == "get_attr" and n.target == "body" for n in gm.graph.nodes), (
        "the region's body reference is erased once unread"
    )


def test_a_region_that_enables_grad_is_refused():
    with pytest.raises(RuntimeError) as err:
        inline_grad_mode_regions(_region(True, True))
    assert str(err.value) == (
        "the model enables grad inside a no-grad region; pipelining cannot trace it"
    )


def test_the_one_traced_tensor_is_picked_from_an_eager_output():
    m = nn.Module()
    t = torch.ones(2, 3)
    assert _the_traced_output(m, (), t) is t
    u, s = torch.zeros(2, 3, dtype=torch.float16), torch.zeros(4)
    m._meshplan_output_leaf = 1
    assert _the_traced_output(m, (), (t, s)) is s
    m._meshplan_output_leaf = None
    assert _the_traced_output(m, (), (t, 7)) is t
    m._meshplan_traced_output = (torch.float32, (2, 3))
    assert _the_traced_output(m, (), (s, t)) is t  # rank
    assert _the_traced_output(m, (), [torch.ones(3, 2), t]) is t  # shape
    assert _the_traced_output(m, (), (u, t)) is t  # dtype
    assert _the_traced_output(m, (), {"a": t, "b": 3}) is t
    # the rank decides; a local shape (TP) or dtype (mixed precision) other than the
    # trace's is kept when it is the only one of that rank, or the only tensor
    local = torch.zeros(2, 5, dtype=torch.bfloat16)
    assert _the_traced_output(m, (), (torch.ones(2, 3, 4), local)) is local
    assert _the_traced_output(m, (), (local, 7)) is local
    other_rank = torch.ones(2, 3, 4)
    assert _the_traced_output(m, (), (other_rank, 7)) is other_rank  # one: no question
    assert _the_traced_output(nn.Module(), (), (t, 7)) is t  # nothing known of it
    with pytest.raises(RuntimeError) as err:
        _the_traced_output(m, (), (t, t.clone()))
    assert str(err.value) == (
        "Module returns 2 tensors where its traced copy returned one, and 2 of them look like "
        "it: this module cannot run eagerly inside a pipeline stage"
    )
    m._meshplan_traced_output = None
    with pytest.raises(RuntimeError, match="returns 2 tensors .* and 2 of them"):
        _the_traced_output(m, (), (t, s))
    with pytest.raises(RuntimeError, match="returns 0 tensors .* and 0 of them"):
        _the_traced_output(m, (), (1, 2))


def test_a_traced_modules_output_and_single_tensor_io():
    gm = torch.fx.symbolic_trace(nn.Linear(3, 2))
    assert _single_tensor_io(gm) is True
    assert _single_tensor_io(nn.Linear(3, 2)) is False
    assert _single_tensor_io(torch.fx.symbolic_trace(_Stage0())) is False
    assert _single_tensor_io(torch.fx.symbolic_trace(_Stage1())) is False
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    assert _traced_output(gm) is None
    out.meta["val"] = torch.empty(4, 2, dtype=torch.bfloat16)
    assert _traced_output(gm) == (torch.bfloat16, (4, 2))


def test_the_value_helpers():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(contiguous_grad, (x, False))
    b = g.call_method("contiguous", (a,))
    c = g.call_function(torch.ops.aten.alias.default, (b,))
    d = g.call_method("clone", (c,))
    e = g.call_function(torch.add, (c, 1))
    assert [_passes_value(n) for n in (x, a, b, c, d, e)] == [False, True, True, True, False, False]
    assert _through(c) is x and _through(d) is d and _through(3) == 3
    assert _flat((1, [2, (3,)], 4)) == [1, 2, 3, 4] and _flat(5) == [5]
    assert _replace_at((1, [2, (3,)], 4), 2, "z") == (1, [2, ("z",)], 4)
    assert _replace_at(7, 0, 8) == 8
    x.meta["val"] = torch.empty(2, 8, 3, dtype=torch.float16)
    _sharded_meta(x, 4)
    v = x.meta["val"]
    assert (tuple(v.shape), v.dtype, v.device.type) == ((2, 2, 3), torch.float16, "meta")


class _Mesh:
    def size(self) -> int:
        return 2


def test_a_stage_receives_and_sends_the_stream_as_sequence_shards(traced):
    """Stages 1 and 2 receive the stream (their first layer's first argument) from the stage
    before as sequence shards: each boundary's traced shape halves along the sequence, and
    where the block does not take or leave the shard itself, a gather or slice is put in."""
    model, plan, pipe, _ = _adopted(traced)
    links = sequence_stream_links(pipe, plan)
    s1 = pipe.get_stage_module(1)
    k = _input_of(s1, "layers.1")
    assert links == {1: (0, k), 2: (0, _input_of(pipe.get_stage_module(2), "layers.3"))}
    assert k is not None
    places = [n for n in s1.graph.nodes if n.op == "placeholder"]
    site = next(n for n in s1.graph.nodes if n.target == "layers.1")
    assert _through(site.args[0]) is places[k]
    assert tuple(places[k].meta["val"].shape) == (2, 5, D)
    send_sequence_shards(s1, plan, 1, _Mesh(), links)
    places = [n for n in s1.graph.nodes if n.op == "placeholder"]
    assert tuple(places[k].meta["val"].shape) == (2, 2, D)  # 5 // 2
    gather = [n for n in s1.graph.nodes if n.target == "meshplan_sequence_gather"]
    assert len(gather) == 1 and gather[0].args == (places[k],)
    assert list(places[k].users) == gather
    assert s1.meshplan_sequence_gather.to_shard is False
    out = next(n for n in s1.graph.nodes if n.op == "output")
    sliced = _flat(out.args[0])[0]
    assert sliced.target == "meshplan_sequence_slice" and s1.meshplan_sequence_slice.to_shard
    assert tuple(sliced.meta["val"].shape) == (2, 2, D)
    others = [n for n in _flat(out.args[0])[1:]]
    assert all(tuple(n.meta["val"].shape) != (2, 2, D) for n in others if "val" in n.meta)
    # a block that takes and leaves the shard itself: only the traced shapes change
    s2 = pipe.get_stage_module(2)
    for b in plan.blocks:
        b.takes_sequence_shard = True
    send_sequence_shards(s2, plan, 2, _Mesh(), links)
    assert not hasattr(s2, "meshplan_sequence_gather")
    places = [n for n in s2.graph.nodes if n.op == "placeholder"]
    assert tuple(places[links[2][1]].meta["val"].shape) == (2, 2, D)
    assert not hasattr(s2, "meshplan_sequence_slice")


def test_a_stream_that_skips_the_stage_before_is_refused(traced):
    model, plan, pipe, _ = _adopted(traced)
    # stage 2's first module now the norm, called with the layer's output, not an input
    plan.blocks[3].modules = ["norm"]
    with pytest.raises(UserInputError) as err:
        sequence_stream_links(pipe, plan)
    assert str(err.value) == (
        "plan sends the stream into stage 2 as sequence shards, but norm's input there does "
        "not come from the stage before: plan again with --pp 1 or without sequence "
        "parallelism"
    )


def _hand_pipe(direct: bool = False, swap: bool = False):
    """Two stages drawn by hand: stage 0 returns (table, stream), stage 1 takes them as
    (table, stream) and calls ``blk(stream, table)``: the stream is output 1 and input 1.
    ``direct``: stage 1 is handed the stage-0 call itself (one output), not an index.
    ``swap``: stage 1 takes them as (stream, table): output 1 is its input 0."""
    meta = {"t": torch.empty(5, 6), "h": torch.empty(2, 8, 6)}
    g0 = torch.fx.Graph()
    x = g0.placeholder("x")
    x.meta["val"] = meta["h"]
    t = g0.call_method("cos", (x,))
    t.meta["val"] = meta["t"]
    h = g0.call_method("sin", (x,))
    h.meta["val"] = meta["h"]
    g0.output(h if direct else (t, h))
    s0 = torch.fx.GraphModule(nn.Module(), g0)
    g1 = torch.fx.Graph()
    if swap:
        ph, pt = g1.placeholder("h"), g1.placeholder("t")
    else:
        pt, ph = g1.placeholder("t"), g1.placeholder("h")
    pt.meta["val"], ph.meta["val"] = meta["t"], meta["h"]
    wrapped = g1.call_function(contiguous_grad, (ph, False))
    root1 = nn.Module()
    root1.blk = nn.Linear(6, 6)
    out = g1.call_module("blk", (wrapped, pt))
    out.meta["val"] = meta["h"]
    g1.output((out, pt))
    s1 = torch.fx.GraphModule(root1, g1)
    top = nn.Module()
    top.add_module(stage_module_name(0), s0)
    top.add_module(stage_module_name(1), s1)
    g = torch.fx.Graph()
    gx = g.placeholder("x")
    c0 = g.call_module(stage_module_name(0), (gx,))
    if direct:
        args = (c0, c0)
    else:
        args = (
            g.call_function(operator.getitem, (c0, 0)),
            g.call_function(operator.getitem, (c0, 1)),
        )
        args = args[::-1] if swap else args
    g.output(g.call_module(stage_module_name(1), args))
    split = torch.fx.GraphModule(top, g)
    return NS(split_gm=split, get_stage_module=lambda i: getattr(split, stage_module_name(i)))


def test_the_stream_link_names_the_output_and_input_that_carry_it():
    plan = _plan([["a"], ["b"]], {"a": ["x"], "b": ["blk"]}, seq=(1,))
    pipe = _hand_pipe()
    links = sequence_stream_links(pipe, plan)
    assert links == {1: (1, 1)}
    # a stage handed the call itself (one output) takes output 0
    assert sequence_stream_links(_hand_pipe(direct=True), plan) == {1: (0, 1)}
    # a stage that does not receive the shard has no link
    assert sequence_stream_links(pipe, _plan([["a"], ["b"]], {"a": ["x"], "b": ["blk"]})) == {}
    s0, s1 = pipe.get_stage_module(0), pipe.get_stage_module(1)
    mesh = _Mesh()
    send_sequence_shards(s0, plan, 0, mesh, links)
    s0.graph.lint()
    assert "meshplan_sequence_slice" in s0.code  # the stage's code regenerated
    assert s0.meshplan_sequence_slice.mesh is mesh and s0.meshplan_sequence_slice.to_shard
    out = next(n for n in s0.graph.nodes if n.op == "output").args[0]
    assert out[0].target == "cos" and out[1].target == "meshplan_sequence_slice"
    assert out[1].args[0].target == "sin"
    assert tuple(out[1].meta["val"].shape) == (2, 4, 6)
    assert tuple(out[1].args[0].meta["val"].shape) == (2, 8, 6)
    assert tuple(out[0].meta["val"].shape) == (5, 6)
    assert not hasattr(s0, "meshplan_sequence_gather")
    send_sequence_shards(s1, plan, 1, mesh, links)
    s1.graph.lint()
    assert "meshplan_sequence_gather" in s1.code
    pt, ph = (n for n in s1.graph.nodes if n.op == "placeholder")
    assert tuple(ph.meta["val"].shape) == (2, 4, 6) and tuple(pt.meta["val"].shape) == (5, 6)
    gather = next(n for n in s1.graph.nodes if n.target == "meshplan_sequence_gather")
    assert gather.args == (ph,) and list(ph.users) == [gather]
    assert ph.next is gather
    wrapped = next(n for n in s1.graph.nodes if n.target is contiguous_grad)
    assert wrapped.args == (gather, False)
    assert s1.meshplan_sequence_gather.mesh is mesh
    assert not hasattr(s1, "meshplan_sequence_slice")
    assert isinstance(s1.meshplan_sequence_gather, _SequenceLayout)
    assert s1.meshplan_sequence_gather.mesh is not None


def test_the_sender_slices_its_output_and_the_receiver_gathers_its_input_by_their_own_index():
    """Output 1 of stage 0 is input 0 of stage 1 (a pipe drawn so: after the relay they
    agree): stage 0 slices its output 1, stage 1 gathers its input 0."""
    plan = _plan([["a"], ["b"]], {"a": ["x"], "b": ["blk"]}, seq=(1,))
    pipe = _hand_pipe(swap=True)
    links = sequence_stream_links(pipe, plan)
    assert links == {1: (1, 0)}
    s0, s1 = pipe.get_stage_module(0), pipe.get_stage_module(1)
    send_sequence_shards(s0, plan, 0, _Mesh(), links)
    out = next(n for n in s0.graph.nodes if n.op == "output").args[0]
    assert [n.target for n in out] == ["cos", "meshplan_sequence_slice"]
    assert tuple(out[0].meta["val"].shape) == (5, 6)
    send_sequence_shards(s1, plan, 1, _Mesh(), links)
    ph, pt = (n for n in s1.graph.nodes if n.op == "placeholder")
    assert tuple(ph.meta["val"].shape) == (2, 4, 6) and tuple(pt.meta["val"].shape) == (5, 6)
    assert [u.target for u in ph.users] == ["meshplan_sequence_gather"]


class _Twice(nn.Module):
    """``shared`` runs twice at the second stage's start: a cut at its beginning cuts at
    both calls (one stage too many); the end of the module before it is met once."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.shared = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)

    def forward(self, x):
        return self.b(self.shared(self.shared(self.a(x))))


def test_a_first_module_called_twice_is_cut_after_the_stage_before():
    torch.manual_seed(0)
    model = _Twice()
    x = torch.linspace(-1, 1, 6).reshape(2, 3)
    plan = _plan([["a"], ["s"]], {"a": ["a"], "s": ["shared", "b"]})
    cache: dict = {}
    pipe = traced_pipe(plan, model, (x,), cache, None)
    assert pipe.num_stages == 2
    assert _calls(pipe.get_stage_module(0)) == ["a"]
    assert pipe.meshplan_outputs is None
    torch.testing.assert_close(pipe(x)[0] if isinstance(pipe(x), tuple) else pipe(x), model(x))
    assert len(cache) == 1
    again = traced_pipe(plan, model, (x,), cache, None)
    assert again is not pipe and again is not next(iter(cache.values()))
    # three stages from a cut that makes two: refused, naming what each cut made
    plan3 = _plan([["a"], ["s"], ["b"]], {"a": ["a"], "s": ["shared"], "b": ["b"]})
    with pytest.raises(RuntimeError) as err:
        traced_pipe(plan3, model, (x,), {}, None)
    assert str(err.value) == (
        "tracing cut the model into 4 at shared, b or 4 at a, shared stages, the plan has 3: "
        "a module where a stage begins or ends is not called once, in forward order"
    )
    # a cut torch refuses at the beginning, and one that makes four stages at the end: the
    # stage count is what is wrong, said as such (not the refusal)
    plan3 = _plan([["a"], ["s"], ["b"]], {"a": ["a"], "s": ["missing", "shared"], "b": ["b"]})
    with pytest.raises(RuntimeError) as err:
        traced_pipe(plan3, model, (x,), {}, None)
    assert type(err.value) is RuntimeError and str(err.value).startswith(
        "tracing cut the model into 4 at a, shared stages, the plan has 3: "
    )


def test_a_cut_torch_refuses_both_ways_is_a_users_error():
    model = _Twice()
    x = torch.ones(2, 3)
    plan = _plan([["a"], ["s"]], {"a": ["nowhere"], "s": ["missing"]})
    with pytest.raises(PipelineCutError) as err:
        traced_pipe(plan, model, (x,), {}, None)
    assert str(err.value) == (
        "torch's pipelining cannot cut net.py into the plan's 2 stages (at missing: "
        "AttributeError: '_Twice' object has no attribute 'missing'; at nowhere: "
        "AttributeError: '_Twice' object has no attribute 'nowhere'): plan it again with --pp 1"
    )


def test_a_cut_torch_refuses_at_the_beginning_is_made_at_the_end_before():
    """The second stage's first module is not the model's: the cut after the first
    stage's last module still makes the plan's two stages."""
    torch.manual_seed(0)
    model = _Twice()
    x = torch.linspace(-1, 1, 6).reshape(2, 3)
    plan = _plan([["a"], ["s"]], {"a": ["a"], "s": ["missing"]})
    pipe = traced_pipe(plan, model, (x,), {}, None)
    assert pipe.num_stages == 2
    assert _calls(pipe.get_stage_module(0)) == ["a"]
    assert _calls(pipe.get_stage_module(1)) == ["shared", "shared@1", "b"]


def test_the_traced_value_of_an_outer_node_is_read_from_the_stage_that_returns_it():
    """The outer graph's getitem of a stage's output records no value: it is read from the
    stage's output node; a stage's one output from its output node; a node that records
    its value (a model input), from itself."""
    pipe = _hand_pipe()
    split = pipe.split_gm
    nodes = {n.name: n for n in split.graph.nodes}
    t, h = (n for n in split.graph.nodes if n.target is operator.getitem)
    assert "val" not in t.meta and "val" not in h.meta
    assert tuple(_traced_value(split, t).shape) == (5, 6)
    assert tuple(_traced_value(split, h).shape) == (2, 8, 6)
    x = nodes["x"]
    x.meta["val"] = torch.empty(3)
    assert _traced_value(split, x) is x.meta["val"]
    one = _hand_pipe(direct=True).split_gm
    call = next(n for n in one.graph.nodes if n.op == "call_module")
    assert tuple(_traced_value(one, call).shape) == (2, 8, 6)


def _sequence_rank(r: int, store_path: str, queue) -> None:  # noqa: ANN001
    """Rank ``r`` of 2: the whole stream sliced to its sequence shard and back, forward and
    backward."""
    try:
        store = dist.FileStore(store_path, 2)
        dist.init_process_group(
            "gloo", store=store, rank=r, world_size=2, timeout=timedelta(seconds=30)
        )
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (2,))
        # each rank's own copy (they agree in a run): a slice is local, no rank's data sent
        whole = (torch.arange(24.0).reshape(2, 4, 3) + 1000 * r).requires_grad_()
        shard = _SequenceLayout(mesh, True)(whole)
        (shard * (r + 1)).sum().backward()
        local = (torch.arange(6.0).reshape(1, 2, 3) + 6 * r + 100).requires_grad_()
        gathered = _SequenceLayout(mesh, False)(local)
        (gathered * torch.arange(4.0)[None, :, None]).sum().backward()
        queue.put(
            (
                r,
                {
                    "shard": shard.tolist(),
                    "contiguous": shard.is_contiguous() and gathered.is_contiguous(),
                    "whole_grad": whole.grad.tolist(),
                    "gathered": gathered.tolist(),
                    "local_grad": local.grad.tolist(),
                },
            )
        )
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        queue.put((r, traceback.format_exc()))


def test_the_stream_is_sliced_to_each_ranks_sequence_shard_and_gathered_back(tmp_path):
    """Two gloo ranks forked from the test: rank r's shard is positions 2r and 2r + 1 of the
    sequence; the slice's backward gathers the gradient (each rank's own part, from the
    rank that holds it), the gather's backward slices it."""

    def a_dict(item: tuple) -> None:
        assert isinstance(item[1], dict), item[1]

    got = dict(run_ranks(_sequence_rank, 2, tmp_path / "store", 2, a_dict))
    whole = torch.arange(24.0).reshape(2, 4, 3)
    locals_ = [torch.arange(6.0).reshape(1, 2, 3) + 6 * r + 100 for r in range(2)]
    for r in range(2):
        out = got[r]
        assert out["shard"] == (whole[:, 2 * r : 2 * r + 2] + 1000 * r).tolist()
        assert out["contiguous"] is True
        grad = torch.zeros(2, 4, 3)
        grad[:, 0:2] = 1.0
        grad[:, 2:4] = 2.0
        assert out["whole_grad"] == grad.tolist()
        assert out["gathered"] == torch.cat(locals_, dim=1).tolist()
        weights = torch.arange(4.0)[None, :, None].expand(1, 4, 3)
        assert out["local_grad"] == weights[:, 2 * r : 2 * r + 2].tolist()


def _graph_module(n_inputs: int, body) -> torch.fx.GraphModule:  # noqa: ANN001
    g = torch.fx.Graph()
    places = [g.placeholder(f"p{i}") for i in range(n_inputs)]
    g.output(body(g, *places))
    return torch.fx.GraphModule(nn.Module(), g)


def _three_stages():
    """Three stages drawn by hand, of model inputs (x, y): stage 0 reads (y, x), in that
    order, and returns (2x, x + y); stage 1 reads 2x and returns the one tensor 6x; stage 2
    reads 6x, x + y (from stage 0: a skip) and x (a model input: a skip) and returns
    6x + (x + y) - x."""
    val = torch.empty(2, 3)

    def s0(g, py, px):  # noqa: ANN001, ANN202
        a = g.call_function(torch.mul, (px, 2))
        b = g.call_function(torch.add, (px, py))
        for n in (py, px, a, b):
            n.meta["val"] = val
        return (a, b)

    def s1(g, pa):  # noqa: ANN001, ANN202
        c = g.call_function(torch.mul, (pa, 3))
        pa.meta["val"] = c.meta["val"] = val
        return c

    def s2(g, pc, pb, px):  # noqa: ANN001, ANN202
        for n in (pc, pb, px):
            n.meta["val"] = val
        return g.call_function(torch.sub, (g.call_function(torch.add, (pc, pb)), px))

    top = nn.Module()
    for i, (k, body) in enumerate(((2, s0), (1, s1), (3, s2))):
        top.add_module(stage_module_name(i), _graph_module(k, body))
    g = torch.fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    x.meta["val"] = y.meta["val"] = val
    c0 = g.call_module(stage_module_name(0), (y, x))
    a, b = (g.call_function(operator.getitem, (c0, i)) for i in range(2))
    c1 = g.call_module(stage_module_name(1), (a,))
    c1.meta["val"] = val
    g.output(g.call_module(stage_module_name(2), (c1, b, x)))
    return torch.fx.GraphModule(top, g)


def test_values_that_skip_stages_are_relayed_through_the_stages_between():
    split = _three_stages()
    x, y = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), torch.full((2, 3), 10.0)
    want = 6 * x + (x + y) - x
    torch.testing.assert_close(split(x, y), want)
    relay_skip_connections(split)
    torch.testing.assert_close(split(x, y), want, rtol=0, atol=0)
    tops = [n for n in split.graph.nodes if n.op == "call_module"]
    x_node, y_node = (n for n in split.graph.nodes if n.op == "placeholder")
    # the first stage takes the model's inputs in the model's order, its placeholders too
    assert tops[0].args == (x_node, y_node)
    s0 = split.get_submodule(stage_module_name(0))
    p0 = [n for n in s0.graph.nodes if n.op == "placeholder"]
    assert [p.name for p in p0] == ["p1", "p0"]
    # each later stage reads only the stage before, output i as input i
    for j in (1, 2):
        assert [a.target for a in tops[j].args] == [operator.getitem] * len(tops[j].args)
        assert all(a.args[0] is tops[j - 1] for a in tops[j].args)
        assert [a.args[1] for a in tops[j].args] == list(range(len(tops[j].args)))
    assert len(tops[1].args) == 3 and len(tops[2].args) == 3
    # every outer node keeps a metadata dict, the one-output stage's index its value
    assert all(isinstance(n.meta, dict) for n in split.graph.nodes)
    firsts = [u for u in tops[1].users if u.args[1] == 0]
    assert len(firsts) == 1 and tuple(firsts[0].meta["val"].shape) == (2, 3)
    # stage 1 returns its own value first, then the two it relays
    s1 = split.get_submodule(stage_module_name(1))
    outs = next(n for n in s1.graph.nodes if n.op == "output").args[0]
    assert len(outs) == 3 and outs[0].target is torch.mul
    assert [o.op for o in outs[1:]] == ["placeholder", "placeholder"]
    # what stage 0 sends: 2x, then the two skips (x + y and x) in stage 2's order
    got = s0(x, y)
    torch.testing.assert_close(got[0], 2 * x)
    mid = s1(*got)
    torch.testing.assert_close(mid[0], 6 * x)
    torch.testing.assert_close(split.get_submodule(stage_module_name(2))(*mid), want)


def test_a_tensor_held_first_under_a_path_the_model_lacks_is_held():
    """A stage that holds the model's module under a path of its own first (a holder torch's
    split or the relay made) and under the model's path after: every name counts, so the
    tensors are held and nothing is kept twice."""
    model = nn.Module()
    model.a = nn.BatchNorm1d(2)  # parameters and buffers
    model.b = nn.Linear(2, 2)
    stage = nn.Module()
    stage.alias = model.a
    stage.a = model.a
    first = nn.Module()
    kept = keep_unused_tensors([stage], model, first)
    assert kept == ["b.weight", "b.bias"]
    assert not hasattr(first, "a")


def test_a_module_inside_a_traced_call_finds_the_stage_input_it_is_handed(traced):
    """Before adoption the traced layer takes (table, stream): its norm is handed the
    layer's second argument, stage 1's input 0 (the stream); its linear, the norm's output
    (no input); the second layer's norm, the first layer's output; a path inside the layer
    that is never called, nothing."""
    _, _, _, pipe = _pipe(traced)
    s1 = pipe.get_stage_module(1)
    assert [n.name for n in s1.graph.nodes if n.op == "placeholder"][0] == "add"
    assert _input_of(s1, "layers.1.norm") == 0
    assert _input_of(s1, "layers.1") == 1  # the traced call's first argument: the table
    for path in ("layers.1.lin", "layers.2.norm", "layers.1.nothing", "norm"):
        assert _input_of(s1, path) is None, path


def test_the_trace_is_kept_per_model_micro_batch_and_cut(traced):
    """One trace for plans of the same model, arguments (in any order), micro-batch and cut;
    another cut is traced anew and cut as its plan says."""
    model, _, calls, _ = traced
    cache: dict = {}
    plan = _plan(STAGES, MODULES)
    plan.model.args = {"a": 1, "b": 2}
    traced_pipe(plan, model, (_ids(),), cache, calls)
    again = _plan(STAGES, MODULES)
    again.model.args = {"b": 2, "a": 1}
    traced_pipe(again, model, (_ids(),), cache, calls)
    assert len(cache) == 1
    two = _plan([["b0", "b1"], ["b2", "b3"]], MODULES)
    two.model.args = {"a": 1, "b": 2}
    pipe = traced_pipe(two, model, (_ids(),), cache, calls)
    assert len(cache) == 2 and pipe.num_stages == 2
    # another model file's hash, or another micro-batch size: another trace
    other = _plan(STAGES, MODULES)
    other.model.args = {"a": 1, "b": 2}
    other.model.sha256 = "another"
    traced_pipe(other, model, (_ids(),), cache, calls)
    assert len(cache) == 3
    other.micro_batch_size = 4
    traced_pipe(other, model, (_ids(),), cache, calls)
    assert len(cache) == 4
    assert _calls(pipe.get_stage_module(1)) == ["layers.2", "layers.3", "norm", "head"]


def _two_stage_outputs(out):  # noqa: ANN001, ANN202
    """Two stages drawn by hand, of the model input x: stage 0 returns (2x, x + 1), stage 1
    (the last) reads 2x and returns (6x, 2x - 1). ``out(nodes)`` picks the outer graph's
    output from the nodes by name (c0, a, b, c1, c, d, x). Each node's traced value is a
    tensor of its own."""

    def s0(g, px):  # noqa: ANN001, ANN202
        a = g.call_function(torch.mul, (px, 2))
        b = g.call_function(torch.add, (px, 1))
        for n in (px, a, b):
            n.meta["val"] = torch.empty(2, 3)
        return (a, b)

    def s1(g, pa):  # noqa: ANN001, ANN202
        c = g.call_function(torch.mul, (pa, 3))
        d = g.call_function(torch.sub, (pa, 1))
        for n in (pa, c, d):
            n.meta["val"] = torch.empty(2, 3)
        return (c, d)

    top = nn.Module()
    top.add_module(stage_module_name(0), _graph_module(1, s0))
    top.add_module(stage_module_name(1), _graph_module(1, s1))
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(2, 3)
    c0 = g.call_module(stage_module_name(0), (x,))
    a, b = (g.call_function(operator.getitem, (c0, i)) for i in range(2))
    c1 = g.call_module(stage_module_name(1), (a,))
    c, d = (g.call_function(operator.getitem, (c1, i)) for i in range(2))
    g.output(out(dict(c0=c0, a=a, b=b, c1=c1, c=c, d=d, x=x)))
    return torch.fx.GraphModule(top, g)


def test_the_last_stage_returns_every_leaf_of_the_models_output_in_order():
    """The model's output {d, k: 5, b, x, c}: d and c the last stage's outputs 1 and 0, 5 a
    constant, b stage 0's output 1 and x the model's input (both relayed to the last
    stage). The last stage returns the four computed leaves in the output's order, the
    constant is kept aside, and the split's output rebuilt is the model's, value for value;
    an output of the last stage's second value alone (one leaf, not a tuple) is taken too."""
    from torch.utils._pytree import tree_flatten

    want_of = lambda x: {"d": 2 * x - 1, "k": 5, "b": x + 1, "x": x, "c": 6 * x}  # noqa: E731
    spec = tree_flatten(want_of(torch.zeros(1)))[1]
    split = _two_stage_outputs(lambda n: (n["d"], 5, n["b"], n["x"], n["c"]))
    layout = stages.gather_model_outputs(split, spec)
    assert layout.constants == {1: 5} and layout.spec == spec
    last = split.get_submodule(stage_module_name(1))
    returned = next(n for n in last.graph.nodes if n.op == "output").args[0]
    assert [n.name for n in returned] == ["sub", "input_1", "input_2", "mul"]
    # the new inputs carry the traced values of what they receive: stage 0's b, the model's x
    s0_out = next(
        n for n in split.get_submodule(stage_module_name(0)).graph.nodes if n.op == "output"
    ).args[0]
    x_node = next(n for n in split.graph.nodes if n.op == "placeholder")
    assert returned[1].meta["val"] is s0_out[1].meta["val"]
    assert returned[2].meta["val"] is x_node.meta["val"]
    out = next(n for n in split.graph.nodes if n.op == "output").args[0]
    assert out[1] == 5 and [o.args[1] for o in (out[0], *out[2:])] == [0, 1, 2, 3]
    assert all(o.args[0].target == stage_module_name(1) for o in (out[0], *out[2:]))
    # each outer index carries the traced value of the leaf it reads
    assert [o.meta["val"] for o in (out[0], *out[2:])] == [n.meta["val"] for n in returned]
    # the last stage's old outputs, unread now, are gone from the outer graph
    tops = [n for n in split.graph.nodes if n.op == "call_module"]
    assert len(tops[1].users) == 4
    relay_skip_connections(split)
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    # the stages in turn, each handed what the one before sends (what a schedule does)
    sent = split.get_submodule(stage_module_name(0))(x)
    got = layout.rebuild(last(*sent))
    whole = split(x)  # the outer graph returns the same leaves, the constant in place
    assert all(a is b or torch.equal(a, b) for a, b in zip(whole, got.values(), strict=True))
    want = want_of(x)
    assert list(got) == list(want) and got["k"] == 5
    for k in ("d", "b", "x", "c"):
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0)
    # one leaf: the last stage's second output
    one = tree_flatten(torch.zeros(1))[1]
    split = _two_stage_outputs(lambda n: n["d"])
    layout = stages.gather_model_outputs(split, one)
    assert layout is not None and layout.constants == {}
    last = split.get_submodule(stage_module_name(1))
    got = layout.rebuild(last(split.get_submodule(stage_module_name(0))(x)[0]))
    torch.testing.assert_close(got, 2 * x - 1, rtol=0, atol=0)


def test_a_cut_whose_signatures_the_export_cannot_keep_is_traced_again_without(monkeypatch):
    """``_split`` traces with the kept signatures first and, where that fails, again without
    them (an empty tuple); with none to keep it traces once; each try is handed the model,
    the inputs and the cut as given."""
    seen = []

    def traced_copy(model, example, spec, preserve):  # noqa: ANN001, ANN202
        seen.append((model, example, spec, preserve))
        if preserve:
            raise RuntimeError("the export cannot keep them")
        return "pipe"

    monkeypatch.setattr(stages, "_traced_copy", traced_copy)
    model, example, spec = nn.Linear(2, 2), (torch.ones(2),), {"a": "cut"}
    assert stages._split(model, example, spec, ("layers.0",)) == "pipe"
    assert seen == [(model, example, spec, ("layers.0",)), (model, example, spec, ())]
    seen.clear()
    assert stages._split(model, example, spec, ()) == "pipe"
    assert seen == [(model, example, spec, ())]


def _pair(reads: str) -> torch.fx.GraphModule:
    """Two stages drawn by hand, of model inputs (x, y): stage 0 returns (2x, x + 1, x - 1)
    (a, b, c); stage 1 is handed the values ``reads`` names, in that order, and returns
    their product; c is indexed only where it is read."""
    val = torch.empty(2, 3)

    def s0(g, px, py):  # noqa: ANN001, ANN202
        a = g.call_function(torch.mul, (px, 2))
        b = g.call_function(torch.add, (px, 1))
        c = g.call_function(torch.sub, (px, 1))
        for i, n in enumerate((px, py, a, b, c)):
            n.meta["val"] = torch.empty(2, 3 + i)
        return (a, b, c)

    def s1(g, *places):  # noqa: ANN001, ANN202
        out = places[0]
        for p in places:
            p.meta["val"] = val
        for p in places[1:]:
            out = g.call_function(torch.mul, (out, p))
        return out

    top = nn.Module()
    top.add_module(stage_module_name(0), _graph_module(2, s0))
    top.add_module(stage_module_name(1), _graph_module(len(reads), s1))
    g = torch.fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    x.meta["val"], y.meta["val"] = torch.empty(2, 3), torch.empty(2, 4)
    c0 = g.call_module(stage_module_name(0), (x, y))
    got = dict(zip("abc", (g.call_function(operator.getitem, (c0, i)) for i in range(3))))
    for i, k in enumerate("abc"):  # as recorded by the producer's outputs: (2, 5) to (2, 7)
        got[k].meta["val"] = torch.empty(2, 5 + i)
    got["y"] = y
    g.output(g.call_module(stage_module_name(1), tuple(got[r] for r in reads)))
    if "c" not in reads:  # torch's split makes no index of an output nothing reads
        g.erase_node(got["c"])
    return torch.fx.GraphModule(top, g)


def test_a_model_input_the_second_stage_reads_comes_through_the_first():
    """Stage 1 reads stage 0's b and a, in that order, and the model's input y. Only the
    first stage receives the model's inputs, so y is relayed through stage 0; stage 0's
    outputs are put in the order stage 1 reads them (output i is input i), the one nothing
    reads (c) last, and the outer graph indexes each output once, in output order, with its
    traced value (torch's stage counts its outputs by those index nodes)."""
    x, y = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), torch.full((2, 3), 10.0)
    for reads, sent_want in (
        ("bay", (x + 1, 2 * x, y, x - 1)),
        ("ab", (2 * x, x + 1, x - 1)),  # in order already; c read by no one
        ("bacy", (x + 1, 2 * x, x - 1, y)),  # every output read, two swapped
    ):
        split = _pair(reads)
        relay_skip_connections(split)
        c0, c1 = (n for n in split.graph.nodes if n.op == "call_module")
        assert [a.args for a in c1.args] == [(c0, i) for i in range(len(reads))]
        index = [u for u in c0.users]
        assert [u.target for u in index] == [operator.getitem] * len(sent_want)
        assert [u.args[1] for u in index] == list(range(len(sent_want)))
        s0 = split.get_submodule(stage_module_name(0))
        returned = next(n for n in s0.graph.nodes if n.op == "output").args[0]
        shapes = [tuple(n.meta["val"].shape) for n in returned]
        assert [tuple(u.meta["val"].shape) for u in index] == shapes
        sent = s0(x, y)
        assert len(sent) == len(sent_want)
        for got, want in zip(sent, sent_want, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        got = split.get_submodule(stage_module_name(1))(*sent[: len(reads)])
        want = torch.prod(torch.stack(sent_want[: len(reads)]), 0)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        torch.testing.assert_close(split(x, y), got, rtol=0, atol=0)


def test_a_stage_that_takes_nothing_receives_a_value_as_its_first_input():
    """A stage whose graph has no placeholder (it reads only its own tensor) handed a value:
    the new placeholder opens its graph, carries the value's traced value, and the stage's
    call passes it; handed the same value again, the stage's placeholder for it is reused."""
    root = nn.Module()
    root.register_buffer("w", torch.ones(2, 3))
    inner = torch.fx.Graph()
    inner.output(inner.call_function(torch.mul, (inner.get_attr("w"), 2)))
    top = nn.Module()
    top.add_module(stage_module_name(0), torch.fx.GraphModule(root, inner))
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(2, 3)
    call = g.output(g.call_module(stage_module_name(0), ())).args[0]
    split = torch.fx.GraphModule(top, g)
    stage = split.get_submodule(stage_module_name(0))
    ph = stages._stage_input(split, call, x)
    assert next(iter(stage.graph.nodes)) is ph and ph.op == "placeholder"
    assert ph.name == "input_0" and ph.meta["val"] is x.meta["val"]
    assert call.args == (x,)
    assert stages._stage_input(split, call, x) is ph and call.args == (x,)
    stage.graph.lint()
    stage.recompile()
    torch.testing.assert_close(stage(torch.zeros(2, 3)), torch.full((2, 3), 2.0))
