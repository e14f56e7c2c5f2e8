"""Tests written for mutmut's generated mutants of runtime/model_outputs.py (the model's output
object rebuilt on a pipeline's last stage; benchmarks/generated_mutants.py). One process: the
layout rebuilt from outputs written by hand, and ``traced_pipeline`` on a model of two small
layers (an export of a second or so). tests/test_model_outputs.py runs a split model's stages
against its forward; docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.pipelining import SplitPoint
from torch.distributed.pipelining._IR import annotate_split_points
from torch.utils._pytree import tree_flatten, tree_structure

from runtime.block_calls import VALUE_NAME
from runtime.model_outputs import OutputLayout, traced_pipeline
from runtime.stages import inline_grad_mode_regions


def test_the_returned_tensors_fill_the_leaves_the_constants_do_not():
    """{"a": t0, "n": 3, "b": (t1, "s")}: leaves 1 and 3 are constants, the stage returns
    (t0, t1), as a tuple or a list."""
    t0, t1 = torch.tensor([1.0]), torch.tensor([2.0, 3.0])
    spec = tree_structure({"a": t0, "n": 3, "b": (t1, "s")})
    layout = OutputLayout(spec, {1: 3, 3: "s"})
    for returned in ((t0, t1), [t0, t1]):
        got = layout.rebuild(returned)
        assert list(got) == ["a", "n", "b"] and got["n"] == 3 and got["b"][1] == "s"
        assert got["a"] is t0 and got["b"][0] is t1 and isinstance(got["b"], tuple)


def test_one_returned_tensor_is_one_leaf():
    t = torch.tensor([5.0])
    assert OutputLayout(tree_structure(t)).rebuild(t) is t
    got = OutputLayout(tree_structure({"x": t, "k": 2}), {1: 2}).rebuild(t)
    assert got == {"x": t, "k": 2}
    assert OutputLayout(tree_structure(t)).constants == {}


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * scale


class _Net(nn.Module):
    """A first layer, then a block handed the stream and a scale by keyword; the output a
    dict holding a tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.blk = _Scaled()

    def forward(self, x: torch.Tensor, s: torch.Tensor) -> dict:
        h = torch.tanh(self.first(x))
        out = self.blk(h, scale=s)
        return {"out": out, "mid": (h,)}


def _traced(preserve: tuple[str, ...]):
    torch.manual_seed(0)
    model = _Net()
    example = (torch.randn(2, 4), torch.randn(2, 4))
    want = model(*example)
    annotate_split_points(model, {"blk": SplitPoint.BEGINNING})
    pipe, spec, calls = traced_pipeline(model, example, inline_grad_mode_regions, preserve)
    return pipe, spec, calls, want


def _value_names(pipe) -> set[str]:
    """The exported names kept in the meta of every node of every stage's graphs (the
    stage's own and its unflattened modules')."""
    return {
        n.meta[VALUE_NAME]
        for i in range(pipe.num_stages)
        for m in pipe.get_stage_module(i).modules()
        if isinstance(getattr(m, "graph", None), torch.fx.Graph)
        for n in m.graph.nodes
        if VALUE_NAME in n.meta
    }


def test_the_pipeline_keeps_the_output_structure_of_its_one_export():
    """Without signatures to keep: torch's own export, two stages, the dict-of-a-tuple spec,
    no call kept and no value named."""
    pipe, spec, calls, want = _traced(())
    assert pipe.num_stages == 2
    assert spec == tree_structure(want) and spec.num_leaves == 2
    assert calls == {} and _value_names(pipe) == set()


def test_a_kept_signature_holds_the_blocks_call_as_the_model_made_it():
    """``blk`` kept: its call is ((h,), {"scale": s}), two graph values of the traced shapes
    and dtypes, returning one value; every stage's nodes carry their exported names."""
    pipe, spec, calls, want = _traced(("blk",))
    assert spec == tree_structure(want)
    assert list(calls) == ["blk"]
    call = calls["blk"]
    h, s = torch.zeros(2, 4), torch.zeros(2, 4)
    assert call.in_spec == tree_structure(((h,), {"scale": s}))
    assert [(p.shape, p.dtype) for p in call.leaves] == [((2, 4), torch.float32)] * 2
    assert all(p.name is not None for p in call.leaves) and len(call.returned) == 1
    names = _value_names(pipe)
    assert {p.name for p in call.leaves} <= names and call.returned[0] in names
    leaves, _ = tree_flatten(want)
    assert len(leaves) == spec.num_leaves


def test_the_split_policy_is_handed_the_traced_graph():
    """The policy (the runtime's inlines grad-mode regions before the split) runs on the
    exported graph; here one that records it and returns it unchanged."""
    seen: list = []

    def policy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        seen.append(type(gm))
        return inline_grad_mode_regions(gm)

    model = _Net()
    annotate_split_points(model, {"blk": SplitPoint.BEGINNING})
    pipe, _, _ = traced_pipeline(model, (torch.randn(2, 4), torch.randn(2, 4)), policy)
    assert seen and all(issubclass(t, torch.fx.GraphModule) for t in seen)
    assert pipe.num_stages == 2
