"""Tests written for mutmut's generated mutants of runtime/block_calls.py (a pipelined block
handed several tensors run as the model's eager module; benchmarks/generated_mutants.py). One
process: the calls one forward makes, counted by hand on a small model; the kept signature of a
block handed a stream, a scale by keyword and a constant; and a two-stage split of that model
whose second stage, its block's call rebuilt and the eager block swapped in, gives the model's
own output. tests/test_block_calls.py does the same on a traced Llama (tens of seconds);
docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import operator
from types import SimpleNamespace

import torch
from torch import nn
from torch.distributed.pipelining import SplitPoint
from torch.distributed.pipelining._IR import annotate_split_points
from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
from torch.export.graph_signature import SymIntArgument, TensorArgument
from torch.utils._pytree import tree_structure

from runtime.block_calls import (
    VALUE_NAME,
    BlockCall,
    ModuleCalls,
    Passed,
    _before,
    _call_sites,
    _refresh,
    _stand_in,
    _value_name,
    block_calls,
    call_eagerly,
    module_calls,
    name_values,
    signature_modules,
)
from runtime.model_outputs import traced_pipeline
from runtime.stages import inline_grad_mode_regions


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, scale: torch.Tensor, power: int = 1) -> torch.Tensor:
        return self.lin(x) * scale**power


class _Last(nn.Module):
    def forward(self, xs: list) -> torch.Tensor:
        return xs[-1] * 2


class _Calls(nn.Module):
    """``a`` once with one tensor, ``b`` twice with one tensor, ``c`` with a tensor and a
    keyword, ``d`` with a list, ``unused`` never."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.unused = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
        self.c, self.d = _Scaled(), _Last()

    def forward(self, x: torch.Tensor, s: torch.Tensor, n: int) -> torch.Tensor:
        h = self.b(self.b(self.a(x)))
        return self.d([h, self.c(h, scale=s)]) * n


def test_each_module_is_counted_and_marked_one_tensor_only_if_every_call_was():
    """On the meta device, the model's own tensors untouched; the hooks gone after."""
    model = _Calls()
    weight = model.a.weight.detach().clone()
    got = module_calls(model, (torch.ones(2, 4), torch.ones(2, 4), 3))
    assert got == {
        "a": ModuleCalls(1, True),
        "b": ModuleCalls(2, True),
        "c": ModuleCalls(1, False),
        "c.lin": ModuleCalls(1, True),
        "d": ModuleCalls(1, False),
    }
    assert torch.equal(model.a.weight, weight) and model.a.weight.device.type == "cpu"
    assert all(not m._forward_pre_hooks for m in model.modules())


class _ReadsAValue(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) if bool(x.sum() > 0) else x


def test_a_forward_the_meta_device_cannot_run_tells_nothing():
    model = _ReadsAValue()
    assert module_calls(model, (torch.ones(1, 2),)) is None
    assert all(not m._forward_pre_hooks for m in model.modules())


def test_signatures_are_kept_for_blocks_called_once_with_more_than_one_tensor():
    calls = {
        "a": ModuleCalls(1, True),
        "b": ModuleCalls(2, False),
        "c": ModuleCalls(1, False),
        "d": ModuleCalls(1, False),
    }
    assert signature_modules(["c", "a", "b", "c", "x", "d"], calls) == ("c", "d")
    assert signature_modules(["c", "a", "c"], None) == ("c", "a")


class _Net(nn.Module):
    """A first layer, then a block handed the stream, a scale by keyword and a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.blk = _Scaled()

    def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.first(x))
        return torch.relu(self.blk(h, scale=s, power=2))


def _example():
    return torch.linspace(-1, 1, 8).reshape(2, 4), torch.linspace(0.5, 2, 8).reshape(2, 4)


def test_the_kept_signature_names_each_tensor_and_keeps_each_constant():
    torch.manual_seed(0)
    model = _Net()
    program = torch.export.export(
        model, _example(), preserve_module_call_signature=("blk", "first")
    )
    got = block_calls(program, ("blk",))
    assert list(got) == ["blk"]
    call = got["blk"]
    h = torch.zeros(2, 4)
    assert call.in_spec == tree_structure(((h,), {"scale": h, "power": 2}))
    values = {n.name for n in program.graph.nodes}
    (x, s, power) = call.leaves
    assert x.name in values and s.name == "s" and x.name != s.name
    assert (x.shape, x.dtype, s.shape, s.dtype) == ((2, 4), torch.float32, (2, 4), torch.float32)
    assert power == Passed(None, 2)
    assert len(call.returned) == 1 and call.returned[0] in values
    assert block_calls(program, ()) == {}


def test_each_exported_node_keeps_its_name_in_its_meta():
    program = torch.export.export(_Net(), _example())
    name_values(program)
    nodes = list(program.graph.nodes)
    assert all(n.meta[VALUE_NAME] == n.name for n in nodes)
    node = nodes[0]
    node.meta[VALUE_NAME] = "kept"
    assert _value_name(node) == "kept"
    del node.meta[VALUE_NAME]
    assert _value_name(node) == node.name


def _split():
    torch.manual_seed(0)
    model = _Net()
    want = model(*_example())
    traced = _Net()
    traced.load_state_dict(model.state_dict())
    annotate_split_points(traced, {"blk": SplitPoint.BEGINNING})
    pipe, _, calls = traced_pipeline(traced, _example(), inline_grad_mode_regions, ("blk",))
    return pipe, model, calls, want


def test_the_rebuilt_call_runs_the_eager_block_as_the_model_called_it():
    """The second stage's call of ``blk`` becomes ``blk(h, scale=s, power=2)``; with the
    model's block swapped in, the pipeline's output is the model's, bit for bit."""
    pipe, model, calls, want = _split()
    stage = pipe.get_stage_module(1)
    assert call_eagerly(stage, "blk", calls["blk"]) == 0
    site = next(n for n in stage.graph.nodes if n.op == "call_module" and n.target == "blk")
    assert len(site.args) == 1 and set(site.kwargs) == {"scale", "power"}
    assert site.kwargs["power"] == 2
    stage.blk = model.blk
    with torch.no_grad():
        got = pipe(*_example())
    got = got[0] if isinstance(got, (tuple, list)) else got
    assert torch.equal(got, want)


def test_a_call_that_cannot_be_rebuilt_is_left_alone():
    """A block this stage does not call (the first stage's ``first`` is not kept), a kept
    call whose returned value the traced code does not read, and one the model passed a
    value the traced call does not take: None, the graph unchanged."""
    pipe, _, calls, _ = _split()
    stage = pipe.get_stage_module(1)
    code = stage.code
    call = calls["blk"]
    assert call_eagerly(pipe.get_stage_module(0), "first", call) is None
    other = BlockCall(call.in_spec, call.leaves, ("elsewhere",))
    assert call_eagerly(stage, "blk", other) is None
    renamed = tuple(Passed("gone", None, p.shape, p.dtype) if p.name else p for p in call.leaves)
    assert call_eagerly(stage, "blk", BlockCall(call.in_spec, renamed, call.returned)) is None
    assert stage.code == code


def test_a_value_the_block_never_reads_is_stood_in_by_zeros():
    """The model passed ``power`` as a tensor that the traced code never hands the block:
    a zero tensor of its traced shape and dtype, on the device of the block's first input."""
    like = torch.ones(3)
    got = _stand_in(like, (2, 5), torch.int64)
    assert got.shape == (2, 5) and got.dtype == torch.int64 and not got.any()
    assert got.device == like.device
    # not the default device: a GPU stage's block is handed its zeros on that GPU
    assert _stand_in(torch.ones(3, device="meta"), (2,), torch.int64).device.type == "meta"


def test_a_node_comes_before_a_later_site_only():
    graph = torch.fx.Graph()
    a = graph.placeholder("a")
    b = graph.call_function(torch.neg, (a,))
    c = graph.call_function(torch.neg, (b,))
    graph.output(c)
    assert _before(graph, a, c) and _before(graph, b, c)
    assert not _before(graph, c, b) and not _before(graph, c, a)
    other = torch.fx.Graph().placeholder("x")
    assert not _before(graph, other, c)


def test_module_calls_hand_the_forward_meta_tensors_and_plain_values_as_they_are():
    """The tensors of the example go to the meta device; the count ``n`` stays an int."""
    seen = []
    model = _Calls()
    model.d.register_forward_pre_hook(lambda _m, args: seen.append(args[0][0].device.type))
    assert module_calls(model, (torch.ones(2, 4), torch.ones(2, 4), 1)) is not None
    assert seen == ["meta"]


class _Tied(nn.Module):
    """``b`` uses ``a``'s weight, and ``c`` holds the model's buffer under a second name."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Module()
        self.b.weight = self.a.weight
        self.register_buffer("shift", torch.ones(4))
        self.c.register_buffer("shift", self.shift)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x)) + self.shift + self.c.shift


def test_a_model_with_tied_weights_and_buffers_is_counted_too():
    """functional_call refuses a tied tensor handed under two names (GPT-2's embedding and
    head), which made the meta forward fail and the count None."""
    model = _Tied()
    got = module_calls(model, (torch.ones(2, 4),))
    assert got == {"a": ModuleCalls(1, True), "b": ModuleCalls(1, True)}
    assert model.b.weight is model.a.weight and model.a.weight.device.type == "cpu"


class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x).relu()


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.outer = _Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(x) * 2


def test_a_block_is_found_in_the_graph_of_the_module_that_calls_it():
    """``outer.block`` is called from ``outer``'s own graph, not the stage's."""
    program = torch.export.export(_Outer(), (torch.ones(1, 2),))
    stage = torch.export.unflatten(program)
    owner, sites = _call_sites(stage, "outer.block")
    assert owner is stage.outer and [n.target for n in sites] == ["block"]
    assert _call_sites(stage, "outer.missing") is None


def test_an_exported_modules_code_is_regenerated_after_its_graph_changed():
    """torch.export's InterpreterModule runs the code ``finalize`` generated (under
    torch.compile, or when told not to interpret): the relu changed to a neg must run."""
    stage = torch.export.unflatten(torch.export.export(_Outer(), (torch.ones(1, 2),)))
    owner = stage.outer
    relu = next(n for n in owner.graph.nodes if "relu" in str(n.target))
    relu.target = torch.ops.aten.neg.default
    _refresh(owner)
    x = torch.randn(3, 2)
    assert torch.equal(owner.graph_module(x), -owner.block(x))


class _Sized(nn.Module):
    """Handed ``extra`` but reads only its static size, so its traced call never takes it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * extra.shape[0]


class _Passes(nn.Module):
    """``blk`` is handed ``e``: with ``reuse``, the stage after the split reads ``e`` after the
    block too, so ``e`` reaches that stage; without, it stays in the first."""

    def __init__(self, reuse: bool) -> None:
        super().__init__()
        self.first, self.blk, self.reuse = nn.Linear(4, 4), _Sized(), reuse

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.first(x))
        e = torch.cos(x)
        out = self.blk(h, extra=e)
        return out + e if self.reuse else out


def _rebuilt(reuse: bool):
    """The second stage of ``_Passes`` with its block's call rebuilt, its call site, the
    eager pipeline's output and the model's."""
    torch.manual_seed(0)
    model = _Passes(reuse)
    x = torch.linspace(-1, 1, 8).reshape(2, 4)
    want = model(x)
    traced = _Passes(reuse)
    traced.load_state_dict(model.state_dict())
    annotate_split_points(traced, {"blk": SplitPoint.BEGINNING})
    pipe, _, calls = traced_pipeline(traced, (x,), inline_grad_mode_regions, ("blk",))
    stage = pipe.get_stage_module(1)
    assert call_eagerly(stage, "blk", calls["blk"]) == 0
    site = next(n for n in stage.graph.nodes if n.op == "call_module" and n.target == "blk")
    stage.blk = model.blk
    with torch.no_grad():
        got = pipe(x)
    return stage, site, got[0] if isinstance(got, (tuple, list)) else got, want


def test_a_value_the_stage_holds_is_handed_to_the_block_as_the_model_passed_it():
    """``e`` reaches the second stage (it is read after the block): the rebuilt call hands the
    block that very value, no stand-in, and the pipeline gives the model's output."""
    stage, site, got, want = _rebuilt(reuse=True)
    extra = site.kwargs["extra"]
    assert isinstance(extra, torch.fx.Node) and extra.op == "placeholder"
    assert not any(n.target is _stand_in for n in stage.graph.nodes)
    assert len(site.args) == 1 and site.kwargs == {"extra": extra}
    assert torch.equal(got, want)


def test_a_value_the_stage_lacks_is_stood_in_by_zeros_beside_the_blocks_first_input():
    """``e`` never reaches the second stage: the rebuilt call hands the block zeros of its
    traced shape and dtype, made from the block's first input's device, and the eager block,
    reading only their size, gives the model's output."""
    stage, site, got, want = _rebuilt(reuse=False)
    extra = site.kwargs["extra"]
    assert isinstance(extra, torch.fx.Node) and extra.target is _stand_in
    assert extra.args == (site.args[0], (2, 4), torch.float32)
    assert torch.equal(got, want)


def test_a_block_under_a_module_without_a_graph_is_found_in_the_graph_above():
    """``torch.fx.symbolic_trace`` calls a leaf by its whole path (``outer.block``) from the
    root's graph and keeps ``outer`` a plain module without a graph: the search passes over
    it to the root. The leaf itself has no graph to rebuild, so ``call_eagerly`` leaves it."""
    stage = torch.fx.symbolic_trace(_Outer())
    assert not hasattr(stage.outer, "graph")
    owner, sites = _call_sites(stage, "outer.block")
    assert owner is stage and [n.target for n in sites] == ["outer.block"]
    code = stage.code
    h = torch.zeros(1, 2)
    call = BlockCall(tree_structure(((h,), {})), (Passed("x", None, (1, 2), h.dtype),), ("x",))
    assert call_eagerly(stage, "outer.block", call) is None
    assert stage.code == code


class _Double(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def _hand_stage(uses: int, kwargs: dict | None = None) -> tuple[torch.fx.GraphModule, BlockCall]:
    """A stage whose graph calls a traced ``blk`` (``x * 2``) ``uses`` times in a row, the
    first call also given ``kwargs``, and the block's kept call: ``blk(x)``."""
    root = nn.Module()
    root.blk = torch.fx.symbolic_trace(_Double())
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    h = x
    for i in range(uses):
        h = graph.call_module("blk", (h,), (kwargs or {}) if i == 0 else {})
    graph.output(h)
    out = next(n for n in root.blk.graph.nodes if n.op == "output").args[0].name
    leaf = Passed("x", None, (2,), torch.float32)
    return torch.fx.GraphModule(root, graph), BlockCall(tree_structure(((h,), {})), (leaf,), (out,))


def test_a_block_handed_every_tensor_it_was_passed_is_rebuilt():
    """The traced call takes each tensor the model passed (no constant, nothing left out):
    rebuilt as ``blk(x)``, the stage still doubles."""
    stage, call = _hand_stage(1)
    assert call_eagerly(stage, "blk", call) == 0
    x = torch.tensor([1.0, -3.0])
    assert torch.equal(stage(x), 2 * x)


def test_a_block_called_twice_or_with_keywords_is_left_alone():
    """Two calls of one block, or a traced call handed a keyword: None, the code unchanged."""
    for stage, call in (_hand_stage(2), _hand_stage(1, {"flag": True})):
        code = stage.code
        assert call_eagerly(stage, "blk", call) is None
        assert stage.code == code


class _Pair(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, x + 1


def test_a_block_whose_traced_code_returns_several_values_is_left_alone():
    """The traced block's output is a tuple, not one value read by its caller: None."""
    root = nn.Module()
    root.blk = torch.fx.symbolic_trace(_Pair())
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    pair = graph.call_module("blk", (x,))
    graph.output(graph.call_function(operator.getitem, (pair, 0)))
    stage = torch.fx.GraphModule(root, graph)
    leaf = Passed("x", None, (2,), torch.float32)
    call = BlockCall(tree_structure(((x,), {})), (leaf,), ("mul", "add"))
    assert call_eagerly(stage, "blk", call) is None


def test_a_call_passing_a_symbolic_size_is_left_out_and_the_others_kept():
    """A program whose ``a`` is handed a symbolic size (a ``SymIntArgument``) and ``b`` a
    tensor: ``a`` stays traced, ``b``'s call is kept."""
    graph = torch.fx.Graph()
    t = graph.placeholder("t")
    t.meta["val"] = torch.zeros(3, 2, dtype=torch.float16)
    n = graph.placeholder("n")
    n.meta["val"] = 3  # stands for the SymInt of a dynamic size
    spec = tree_structure(((t,), {}))
    program = SimpleNamespace(
        graph=graph,
        module_call_graph=[
            ModuleCallEntry("a", ModuleCallSignature([SymIntArgument("n")], [], spec, spec)),
            ModuleCallEntry("b", ModuleCallSignature([TensorArgument("t")], [], spec, spec)),
        ],
    )
    got = block_calls(program, ("a", "b"))
    assert got == {"b": BlockCall(spec, (Passed("t", None, (3, 2), torch.float16),), ())}
