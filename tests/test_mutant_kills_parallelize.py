"""Tests written for mutmut's generated mutants of runtime/parallelize.py (a plan's TP, FSDP,
recompute and offload applied with torch.distributed; benchmarks/generated_mutants.py). One
process: the pure helpers called directly; torch's styles applied to a one-rank CPU mesh of a
one-rank gloo group made per test (a HashStore, no launch) against the same module on plain
tensors; the wrappers (fully_shard, replicate, DDP, the checkpoints, parallelize_module) stood
in by recorders, so each test reads which module gets which wrapper with which arguments. Two
gloo ranks forked from this process (torch already imported) for what needs a peer: TP 2 of a
small MLP, a sequence gather and a gradient sum against one process's module.
docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import traceback
from datetime import timedelta
from functools import partial
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from forked_gloo import run_ranks
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
)
from torch.distributed.tensor.placement_types import _StridedShard

import runtime.parallelize as pz
from planner.checkpoint_policy import selective_context
from planner.errors import UserInputError
from planner.schema import BlockPlan
from runtime.dtensor_blocks import fsdp_placement
from runtime.selective import resharded_running

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _no_shared_inputs():
    pz._SHARED_INPUTS.clear()
    yield
    pz._SHARED_INPUTS.clear()


def _block(name="b", modules=("m",), recompute="none", offload="none", **kw) -> BlockPlan:
    return BlockPlan(name, list(modules), 0, recompute, offload, **kw)


class _Mesh:
    """A stand-in DeviceMesh of ``n`` ranks: its size and a named group."""

    def __init__(self, n: int, name: str = "g") -> None:
        self.n, self.name = n, name

    def size(self) -> int:
        return self.n

    def get_group(self) -> str:
        return f"group-{self.name}"


# -- module paths ----------------------------------------------------------------------------


def _tree() -> nn.Module:
    root = nn.Module()
    root.a = nn.Linear(2, 2)
    root.layers = nn.ModuleList([nn.Linear(2, 2), nn.ModuleDict({"x": nn.Linear(2, 2)})])
    root.layers[1]["y"] = nn.ModuleList([nn.ReLU()])
    return root


def test_paths_a_block_stands_for():
    root = _tree()
    assert pz.find_module(root, "a") is root.a
    assert pz.find_module(root, "") is root
    assert pz.find_module(root, "b") is None and pz.find_module(root, "a.b") is None
    assert pz.called_paths(root, "a") == ["a"]
    assert pz.called_paths(root, "nope") == []
    assert pz.called_paths(root, "layers") == ["layers.0", "layers.1.x", "layers.1.y.0"]
    assert pz.called_paths(root, "layers.1") == ["layers.1.x", "layers.1.y.0"]
    got = pz.called_modules(root, "layers")
    assert got[0] is root.layers[0] and got[1] is root.layers[1]["x"]
    assert got[2] is root.layers[1]["y"][0] and len(got) == 3


def test_scalar_parameters_less_besides():
    root = nn.Module()
    root.lin = nn.Linear(2, 2)
    root.s = nn.Parameter(torch.tensor(1.0))
    root.lin.t = nn.Parameter(torch.tensor(2.0))
    got = pz.scalar_parameters(root)
    assert [id(p) for p in got] == [id(root.s), id(root.lin.t)]
    assert [id(p) for p in pz.scalar_parameters(root, {root.s})] == [id(root.lin.t)]


def test_dense_embedding_gradients():
    root = nn.Module()
    root.e = nn.Embedding(4, 2, sparse=True)
    root.d = nn.Embedding(4, 2)
    root.inner = nn.Module()
    root.inner.bag = nn.EmbeddingBag(4, 2, sparse=True)
    assert pz.dense_embedding_gradients(root) == ["e", "inner.bag"]
    assert root.e.sparse is False and root.inner.bag.sparse is False and not root.d.sparse
    assert pz.dense_embedding_gradients(root) == []


class _Direct(nn.Module):
    """Calls its layer's forward directly (SqueezeBERT's encoder)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 3)
        self.other = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer.forward(x) + self.other.forward(x)


def test_direct_forwards_go_through_the_hooks():
    torch.manual_seed(0)
    m = _Direct()
    x = torch.randn(2, 3)
    ref = m(x)
    pz.route_direct_forwards(m, ["missing", "layer"])
    assert "forward" in vars(m.layer)  # past the missing path
    pz.route_direct_forwards(m, ["layer"])  # once only
    assert "forward" in vars(m.layer) and "forward" not in vars(m.other)
    assert len(m.layer._forward_pre_hooks) == 1 and len(m.layer._forward_hooks) == 1
    seen = []
    m.layer.register_forward_pre_hook(lambda _m, a: seen.append("layer"))
    m.other.register_forward_pre_hook(lambda _m, a: seen.append("other"))
    assert torch.equal(m(x), ref)
    assert seen == ["layer"]  # "other" stays a direct call
    assert torch.equal(m.layer(x), nn.functional.linear(x, m.layer.weight, m.layer.bias))
    assert seen == ["layer", "layer"]


def test_a_direct_forward_that_raised_still_routes():
    m = nn.Linear(2, 2)
    root = nn.Module()
    root.m = m
    pz.route_direct_forwards(root, ["m"])
    seen = []
    m.register_forward_pre_hook(lambda _m, a: seen.append(1))
    with pytest.raises(RuntimeError):
        m.forward(torch.ones(3, 3))  # wrong shape: raises inside the class's forward
    assert seen == [1]
    m.forward(torch.ones(1, 2))
    assert seen == [1, 1]


# -- torch's styles per plan style ------------------------------------------------------------


LIN, EMB = nn.Linear(2, 2), nn.Embedding(3, 2)


def _layouts(style) -> dict:
    return {k: v for k, v in vars(style).items() if k != "src_data_rank"}


def test_sequence_styles():
    s = pz.tp_style(LIN, "sp_block", "f")
    assert type(s) is PrepareModuleInputOutput
    i, o = s.prepare_module_input, s.prepare_module_output
    assert (i.input_layouts, i.desired_input_layouts, i.use_local_output) == (
        (Replicate(),), (Shard(1),), True)  # fmt: skip
    assert (o.output_layouts, o.desired_output_layouts, o.use_local_output) == (
        (Shard(1),), (Replicate(),), True)  # fmt: skip
    s = pz.tp_style(LIN, "sp_block", "f", stream=(True, False))
    assert s.prepare_module_input.input_layouts == (Shard(1),)
    assert s.prepare_module_output.desired_output_layouts == (Replicate(),)
    s = pz.tp_style(LIN, "sp_block", "f", stream=(False, True))
    assert s.prepare_module_input.input_layouts == (Replicate(),)
    assert s.prepare_module_output.desired_output_layouts == (Shard(1),)
    for name, dim in (("sequence", 1), ("sequence_tokens", 0)):
        s = pz.tp_style(nn.LayerNorm(2), name, "f")
        assert type(s) is SequenceParallel and s.sequence_sharding == (Shard(dim),)
    for name, dim in (("colwise_sp", 1), ("colwise_sp_tokens", 0)):
        s = pz.tp_style(LIN, name, "f")
        assert type(s) is ColwiseParallel
        assert _layouts(s) == {
            "input_layouts": (Shard(dim),),
            "output_layouts": (Shard(-1),),
            "desired_input_layouts": (Replicate(),),
            "use_local_output": True,
        }
    for name, dim in (("rowwise_sp", 1), ("rowwise_sp_tokens", 0)):
        s = pz.tp_style(LIN, name, "f")
        assert type(s) is pz._Rowwise
        assert s.output_layouts == (Shard(dim),) and s.input_layouts == (Shard(-1),)
        assert s.use_local_output


def test_traced_code_refuses_sequence_styles():
    for name in ("sp_block", "sequence", "colwise_sp", "rowwise_sp_tokens"):
        with pytest.raises(UserInputError) as err:
            pz.tp_style(LIN, name, "a.b", traced_parent=True)
        assert str(err.value) == (
            "plan runs a.b sequence-parallel, but a pipeline stage runs its block as traced "
            "code with fixed shapes: plan again with --pp 1, or without sequence parallelism"
        )
    with pytest.raises(UserInputError) as err:
        pz.tp_style(nn.LayerNorm(2), "colwise", "c")
    assert str(err.value) == (
        "plan shards c (LayerNorm) with tensor parallelism, but only nn.Linear and "
        "nn.Embedding can be sharded: plan again with --tp 1"
    )


def _kind(s) -> tuple:
    return (type(s).__name__, s.input_layouts, s.output_layouts, s.use_local_output,
            getattr(s, "blocks", None))  # fmt: skip


R, S0, SL = (Replicate(),), (Shard(0),), (Shard(-1),)


@pytest.mark.parametrize(
    ("module", "style", "traced", "want"),
    [
        (LIN, "colwise", False, ("ColwiseParallel", R, SL, True, None)),
        (LIN, "colwise", True, ("_GatheredColwise", R, R, True, None)),
        (LIN, "colwise_gather", False, ("_GatheredColwise", R, R, True, None)),
        (LIN, "colwise_gather:3", False, ("_BlocksColwise", R, R, True, 3)),
        (LIN, "colwise_gather:3", True, ("_BlocksColwise", R, R, True, 3)),
        (LIN, "colwise_dtensor", False, ("ColwiseParallel", R, SL, False, None)),
        (LIN, "colwise_dtensor", True, ("_GatheredColwise", R, R, True, None)),
        (LIN, "colwise_dtensor:2", False, ("_BlocksColwise", R, SL, False, 2)),
        (LIN, "colwise_dtensor:2", True, ("_BlocksColwise", R, R, True, 2)),
        (LIN, "rowwise", False, ("_Rowwise", SL, R, True, None)),
        (LIN, "rowwise", True, ("_Rowwise", R, R, True, None)),
        (EMB, "rowwise", False, ("_Rowwise", R, R, True, None)),
        (EMB, "colwise", False, ("ColwiseParallel", R, SL, True, None)),
        (nn.ReLU(), "colwise_in_out", False, ("_InOutColwise", R, SL, True, 1)),
        (nn.ReLU(), "colwise_in_out", True, ("_InOutColwise", R, R, True, 1)),
        (nn.ReLU(), "colwise_gather_in_out:3", False, ("_InOutColwise", R, R, True, 3)),
        (nn.ReLU(), "colwise_dtensor_in_out:3", False, ("_InOutColwise", R, SL, False, 3)),
        (nn.ReLU(), "colwise_dtensor_in_out:3", True, ("_InOutColwise", R, R, True, 3)),
        (nn.ReLU(), "rowwise_in_out", False, ("_InOutRowwise", SL, R, True, None)),
        (nn.ReLU(), "rowwise_in_out", True, ("_InOutRowwise", R, R, True, None)),
    ],
)
def test_plan_style_to_torch_style(module, style, traced, want):
    assert _kind(pz.tp_style(module, style, "f", traced)) == want


def test_in_out_styles_directly():
    assert _kind(pz._in_out_style("colwise", False)) == ("_InOutColwise", R, SL, True, 1)
    assert _kind(pz._in_out_style("colwise_dtensor", False, 2)) == (
        "_InOutColwise", R, SL, False, 2)  # fmt: skip
    assert _kind(pz._in_out_style("colwise", True, 2)) == ("_InOutColwise", R, R, True, 2)
    assert _kind(pz._in_out_style("colwise_gather", False, 2)) == (
        "_InOutColwise", R, R, True, 2)  # fmt: skip
    assert pz._InOutColwise().blocks == 1
    assert _kind(pz._in_out_style("colwise", True)) == ("_InOutColwise", R, R, True, 1)


def test_small_placement_helpers():
    assert pz._sharded_dim("colwise_sp") == 1 and pz._sharded_dim("sequence_tokens") == 0
    assert pz._output_split(1, 1) == Shard(1)
    assert pz._output_split(0, 3) == _StridedShard(0, split_factor=3)
    assert pz._output_split(2, 2) == _StridedShard(2, split_factor=2)
    assert pz.in_module("a.b", "") and pz.in_module("a", "a") and pz.in_module("a.b", "a")
    assert not pz.in_module("ab", "a") and not pz.in_module("a", "a.b")
    assert pz.is_sequence_parallel(_block(tp_plan={"x": "colwise", "b": "sp_block"}))
    assert not pz.is_sequence_parallel(_block(tp_plan={"x": "sequence"}))


def test_column_styles_share_their_input():
    c, r = pz._sharing_inputs(ColwiseParallel()), pz._sharing_inputs(RowwiseParallel())
    assert c._prepare_input_fn is pz._shared_input
    assert "_prepare_input_fn" not in vars(r)


def test_one_dtensor_per_input_tensor(one_rank):
    x, y = torch.ones(2, 4), torch.ones(2, 4)
    a = pz._shared_input(R, R, None, (x,), one_rank)
    assert isinstance(a, DTensor) and a.placements == R and a.to_local().data_ptr() == x.data_ptr()
    assert pz._shared_input(R, R, None, (x,), one_rank) is a
    assert pz._shared_input(R, R, None, (y,), one_rank) is not a
    b = pz._shared_input(SL, SL, None, (x,), one_rank)  # other layouts: its own
    assert b is not a and b.placements == (Shard(1),)
    assert pz._shared_input(R, R, None, (a,), one_rank) is a  # a DTensor passes through
    got = pz._shared_input(R, SL, None, (x,), one_rank)
    assert got.placements == (Shard(1),) and torch.equal(got.full_tensor(), x)
    assert pz._shared_input(R, R, None, (x,), one_rank) is a
    # a tensor whose DTensor is gone gets a new one
    pz._SHARED_INPUTS[(id(x), id(one_rank), R)] = (pz._SHARED_INPUTS[(id(x), id(one_rank), R)][0],
                                                   lambda: None)  # fmt: skip
    assert pz._shared_input(R, R, None, (x,), one_rank) is not a
    # a new tensor at the id of a gone one gets a new one
    z = torch.ones(1)
    key = (id(z), id(one_rank), R)
    pz._SHARED_INPUTS[key] = (lambda: None, lambda: a)
    assert pz._shared_input(R, R, None, (z,), one_rank) is not a


def test_the_shared_inputs_forget_gone_tensors_past_4096(one_rank):
    x, keep = torch.ones(2), torch.ones(2)
    keep_d = DTensor.from_local(keep, one_rank, R)
    pz._SHARED_INPUTS.clear()
    gone = lambda: None  # noqa: E731
    for i in range(4095):
        pz._SHARED_INPUTS[("dead", i)] = (gone, lambda: keep_d) if i % 2 else (lambda: x, gone)
    pz._SHARED_INPUTS[("live",)] = (lambda: keep, lambda: keep_d)
    pz._SHARED_INPUTS[("live2",)] = (lambda: x, lambda: keep_d)
    assert len(pz._SHARED_INPUTS) == 4097
    pz._shared_input(R, R, None, (x,), one_rank)
    assert set(pz._SHARED_INPUTS) == {("live",), ("live2",), (id(x), id(one_rank), R)}
    pz._SHARED_INPUTS.pop((id(x), id(one_rank), R))
    pz._SHARED_INPUTS[("dead",)] = (gone, gone)
    assert len(pz._SHARED_INPUTS) == 3
    for i in range(4093):
        pz._SHARED_INPUTS[("d", i)] = (gone, gone)
    assert len(pz._SHARED_INPUTS) == 4096  # not past 4096: nothing forgotten
    pz._shared_input(R, R, None, (x,), one_rank)
    assert len(pz._SHARED_INPUTS) == 4097


# -- the output conversions on one rank ------------------------------------------------------


def _dt(mesh, t, placements):
    return DTensor.from_local(t, mesh, placements, run_check=False)


def test_rowwise_output_is_its_own_tensor(one_rank):
    t = torch.ones(2, 3, requires_grad=True)
    out = pz._Rowwise._prepare_output_fn(R, True, None, _dt(one_rank, t, R), one_rank)
    assert not isinstance(out, DTensor) and torch.equal(out, t)
    assert out.data_ptr() != t.data_ptr()
    out += 1  # in place: allowed on a copy
    out.sum().backward()
    assert torch.equal(t.grad, torch.ones(2, 3))
    d = _dt(one_rank, torch.ones(2, 3), R)
    assert pz._Rowwise._prepare_output_fn(R, False, None, d, one_rank) is d


def test_gathered_output_copies_only_a_gathered_local_output(one_rank):
    t = torch.arange(6.0).view(2, 3)
    out = pz._gathered_output(R, True, None, _dt(one_rank, t, R), one_rank)
    assert not isinstance(out, DTensor) and torch.equal(out, t) and out.data_ptr() != t.data_ptr()
    out = pz._gathered_output(SL, True, None, _dt(one_rank, t, SL), one_rank)
    assert out.data_ptr() == t.data_ptr()  # a shard: no copy
    d = _dt(one_rank, t, R)
    assert pz._gathered_output(R, False, None, d, one_rank) is d


def test_blocks_output_keeps_a_split_by_blocks(one_rank):
    t = torch.arange(6.0).view(1, 6)
    ss = (_StridedShard(1, split_factor=3),)
    d = _dt(one_rank, t, ss)
    assert pz._blocks_output(SL, False, None, d, one_rank) is d
    loc = pz._blocks_output(SL, True, None, d, one_rank)
    assert not isinstance(loc, DTensor) and loc.data_ptr() == t.data_ptr()
    out = pz._blocks_output(R, True, None, d, one_rank)  # asked replicated: gathered, own copy
    assert torch.equal(out, t) and out.data_ptr() != t.data_ptr()
    c = _dt(one_rank, t, SL)  # contiguous shard: torch's conversion
    assert pz._blocks_output(SL, True, None, c, one_rank).data_ptr() == t.data_ptr()


class _Conv1D(nn.Module):
    """transformers' Conv1D: weight [in, out], x @ W + b."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out))
        self.bias = nn.Parameter(torch.randn(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight + self.bias


def test_own_styles_place_each_weight(one_rank):
    torch.manual_seed(1)
    x = torch.randn(2, 4)
    lin = nn.Linear(4, 6)
    ref = lin(x)
    pz._BlocksColwise(3, output_layouts=Replicate())._apply(lin, one_rank)
    assert lin.weight.placements == (_StridedShard(0, split_factor=3),)
    assert lin.bias.placements == (_StridedShard(0, split_factor=3),)
    assert torch.allclose(lin(x), ref) and not isinstance(lin(x), DTensor)
    conv = _Conv1D(4, 6)
    ref = conv(x)
    pz._InOutColwise(3, use_local_output=False)._apply(conv, one_rank)
    assert conv.weight.placements == (_StridedShard(1, split_factor=3),)
    assert conv.bias.placements == (_StridedShard(0, split_factor=3),)
    out = conv(x)
    assert isinstance(out, DTensor) and torch.allclose(out.full_tensor(), ref)
    conv = _Conv1D(4, 6)
    conv.weight.requires_grad_(False)
    ref = conv(x)
    pz._InOutColwise()._apply(conv, one_rank)
    assert conv.weight.placements == (Shard(1),) and conv.bias.placements == (Shard(0),)
    assert not conv.weight.requires_grad and conv.bias.requires_grad
    assert torch.allclose(conv(x), ref)
    conv = _Conv1D(4, 6)
    ref = conv(x)
    style = pz._InOutRowwise()
    style._apply(conv, one_rank)
    assert style.desired_input_layouts == (Shard(-1),)
    assert conv.weight.placements == (Shard(0),) and conv.bias.placements == (Replicate(),)
    assert torch.allclose(conv(x), ref)


# -- gradients summed over TP ----------------------------------------------------------------


def _traced_tree() -> nn.Module:
    """root -> stage (traced) -> mlp (eager) -> fc1, fc2; stage -> head; root -> side -> lin."""
    root = nn.Module()
    stage = torch.fx.GraphModule(nn.Module(), torch.fx.Graph())
    mlp = nn.Module()
    mlp.fc1, mlp.fc2, mlp.norm = nn.Linear(2, 2), nn.Linear(2, 2), nn.LayerNorm(2)
    stage.add_submodule("mlp", mlp)
    stage.add_submodule("head", nn.Linear(2, 2))
    root.stage = stage
    root.side = nn.Module()
    root.side.lin = nn.Linear(2, 2)
    return root


def test_where_traced_code_runs():
    root = _traced_tree()
    assert pz.is_traced(root.stage) and not pz.is_traced(root.stage.mlp)
    assert pz._traced_scope(root, "stage.mlp.fc1") == "stage.mlp"
    assert pz._traced_scope(root, "stage.mlp") == "stage.mlp"
    assert pz._traced_scope(root, "stage.head") == "stage.head"
    assert pz._traced_scope(root, "side.lin") is None
    assert pz._traced_scope(root, "nope.x") is None
    assert pz._traced_scope(root.stage, "head") == "head"  # the root itself traced
    both = {"stage.mlp.fc1": "colwise", "stage.mlp.fc2": "rowwise"}
    assert not pz._meets_traced_code(root, "stage.mlp.fc1", both)
    assert not pz._meets_traced_code(root, "stage.mlp.fc2", both)
    assert pz._meets_traced_code(root, "stage.mlp.fc1", {"stage.mlp.fc1": "colwise"})
    assert pz._meets_traced_code(root, "stage.mlp.fc2", {"stage.mlp.fc2": "rowwise"})
    blocks_of = {"stage.mlp.fc1": "colwise_dtensor:2", "stage.mlp.fc2": "rowwise_in_out"}
    assert not pz._meets_traced_code(root, "stage.mlp.fc1", blocks_of)
    assert not pz._meets_traced_code(root, "stage.mlp.fc2", blocks_of)
    two_col = {"stage.mlp.fc1": "colwise", "stage.mlp.fc2": "colwise"}
    assert pz._meets_traced_code(root, "stage.mlp.fc1", two_col)
    assert pz._meets_traced_code(root, "stage.head", {"stage.head": "colwise"})
    assert not pz._meets_traced_code(root, "side.lin", {"side.lin": "colwise"})
    assert not pz._meets_traced_code(root, "side.lin", {})
    # the partner must sit inside the scope, not merely share its prefix
    root.stage.add_submodule("mlp2", nn.Linear(2, 2))
    assert pz._meets_traced_code(root, "stage.mlp.fc1",
                                 {"stage.mlp.fc1": "colwise", "stage.mlp2": "rowwise"})  # fmt: skip


def test_grad_sum_modules():
    root = _traced_tree()
    plan = {"stage.mlp.fc1": "colwise", "stage.mlp.fc2": "rowwise"}
    blocks = [
        _block(tp_plan=plan, tp_grad_sums=["stage.mlp.norm", "missing", "side.lin"]),
        _block(tp_plan={"stage.head": "colwise"}, tp_grad_sums=["stage.head"]),
    ]
    got = pz.grad_sum_modules(root, blocks)
    assert got == [root.stage.mlp.norm, root.side.lin]
    got = pz.grad_sum_modules(root, blocks, ["stage.mlp.fc1"])  # gathered in its subtree
    assert got == [root.side.lin]
    assert pz.grad_sum_modules(root, blocks, ["stage.head", "side.lin"]) == got[:0] + [
        root.stage.mlp.norm,
        root.side.lin,
    ]


def test_sum_partial_gradients(one_rank, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda t, group: calls.append((t, group)))
    tp1 = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    dp1 = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    plain, none, child = nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2)
    plain.add_module("child", child)
    plain.weight.grad, plain.bias.grad = torch.ones(2, 2), torch.ones(2)
    child.weight.grad = torch.ones(2, 2)
    holder = nn.Module()
    holder.tp_w = nn.Parameter(distribute_tensor(torch.ones(2), tp1, R))
    holder.tp_w.grad = distribute_tensor(torch.ones(2), tp1, R)
    holder.read = nn.Parameter(torch.ones(2))
    holder.read.grad = distribute_tensor(torch.ones(2), dp1, R)
    holder.dp_w = nn.Parameter(distribute_tensor(torch.ones(2), dp1, R))
    g = torch.full((2,), 3.0)
    holder.dp_w.grad = distribute_tensor(g, dp1, R)
    pz.sum_partial_gradients([plain, none, holder], _Mesh(1))
    assert calls == []
    pz.sum_partial_gradients([plain, none, holder], _Mesh(2, "tp"))
    assert [c[1] for c in calls] == ["group-tp"] * 3
    assert calls[0][0] is plain.weight.grad and calls[1][0] is plain.bias.grad
    assert not isinstance(calls[2][0], DTensor) and calls[2][0].data_ptr() == g.data_ptr()


# -- a sequence gathered before a module -----------------------------------------------------


class _Squares(nn.Module):
    """sum(c * x * x + y) on DTensors (the gathered input saved twice) or their local tensors."""

    def __init__(self, local: bool) -> None:
        super().__init__()
        self.local = local
        self.seen: list = []

    def forward(self, x, y=None, z=None):  # noqa: ANN001, ANN201
        self.seen.append((x.placements, y.placements if y is not None else None, z))
        out = (x.to_local() * x.to_local() * 3) if self.local else (x * x * 3).to_local()
        return out.sum() + (y.to_local().sum() if y is not None else 0)


def _redistributions(monkeypatch) -> list:
    calls = []
    real = DTensor.redistribute

    def counted(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        calls.append(torch.is_grad_enabled())
        return real(self, *a, **k)

    monkeypatch.setattr(DTensor, "redistribute", counted)
    return calls


@pytest.mark.parametrize("local", [True, False])
@pytest.mark.parametrize("regather", [True, False])
def test_gather_sequence_on_one_rank(one_rank, monkeypatch, local, regather):
    base = torch.arange(6.0).view(1, 6).requires_grad_()
    ybase = torch.ones(1, 6, requires_grad=True)
    m = _Squares(local)
    pz.gather_sequence(m, regather_in_backward=regather)
    calls = _redistributions(monkeypatch)
    x = _dt(one_rank, base * 1, (Shard(1),))
    y = _dt(one_rank, ybase * 1, (Shard(1),))
    out = m(x, y=y, z=5)
    assert m.seen == [(R, R, 5)]
    assert calls == [True, True]  # x and y gathered once each
    out.backward()
    assert torch.equal(base.grad, 6 * base.detach())
    assert torch.equal(ybase.grad, torch.ones(1, 6))
    # kept as the shard, gathered again once in backward (x only: y's sum saves nothing)
    assert calls == [True, True] + ([False] if regather else [])
    # no gradient: nothing saved, no hooks left behind
    del calls[:]
    with torch.no_grad():
        m(_dt(one_rank, base.detach(), (Shard(1),)))
    assert calls == [False]
    out = m(_dt(one_rank, base * 1, R))  # a replicated input: not gathered
    assert calls == [False] and m.seen[-1][0] == R
    out.backward()
    assert calls == [False]


class _Saves(nn.Module):
    """Saves the gathered input at an offset (a slice), a plain weight and a 0-dim scale."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.full((1, 6), 3.0))
        self.s = nn.Parameter(torch.tensor(1.0))

    def forward(self, x):  # noqa: ANN001, ANN201
        xl = x.to_local()
        return (xl * xl * self.w).sum() * self.s + (xl[:, 2:] * xl[:, 2:]).sum()


def _saves_grad(base: torch.Tensor) -> torch.Tensor:
    want = 6 * base.detach()
    want[:, 2:] += 2 * base.detach()[:, 2:]
    return want


def test_gather_sequence_regathers_each_backward_once(one_rank, monkeypatch):
    """The saved full tensor (twice, once at an offset) is kept as the shard and gathered once
    per backward, again in the next step's backward of the same shard; by default nothing is
    regathered."""
    base = torch.arange(6.0).view(1, 6).requires_grad_()
    x = _dt(one_rank, base * 1, (Shard(1),))
    plain = _Saves()
    pz.gather_sequence(plain)
    calls = _redistributions(monkeypatch)
    plain(x).backward(retain_graph=True)
    assert calls == [True] and torch.equal(base.grad, _saves_grad(base))
    m = _Saves()
    pz.gather_sequence(m, regather_in_backward=True)
    base.grad = None
    for step in (1, 2):
        m(x).backward(retain_graph=True)
        assert torch.equal(base.grad, step * _saves_grad(base))
    assert calls == [True, True, False, True, False]
    assert torch.equal(m.w.grad, 2 * base.detach() ** 2)


def test_gather_sequence_leaves_no_hooks_after_the_module(one_rank):
    m = _Squares(True)
    pz.gather_sequence(m, regather_in_backward=True)
    base = torch.arange(6.0).view(1, 6).requires_grad_()
    out = m(_dt(one_rank, base * 1, (Shard(1),)))
    after = base * base  # outside the module: saved as is
    assert after.grad_fn._saved_self is not None
    (out + after.sum()).backward()
    assert torch.equal(base.grad, 6 * base.detach() + 2 * base.detach())


# -- tensor parallel wiring (parallelize_module recorded) -------------------------------------


class _Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.o = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)


def _tp_model() -> nn.Module:
    root = nn.Module()
    root.layers = nn.ModuleList([_Attn(), _Attn()])
    root.alias = root.layers[0]  # held twice: named_modules reaches it as layers.0
    root.embed = nn.Embedding(5, 4)
    root.extra = nn.Linear(4, 4)
    return root


def _record_tp(monkeypatch) -> dict:
    rec = {k: [] for k in ("parallelize", "run_on", "gather", "local", "retie")}
    rec["registered"] = 0

    def parallelize(root, mesh, styles):  # noqa: ANN001, ANN202
        rec["parallelize"].append((root, mesh, styles))

    def register():  # noqa: ANN202
        rec["registered"] += 1

    def gather(m, regather_in_backward=False):  # noqa: ANN001, ANN202
        rec["gather"].append((m, regather_in_backward))

    def local(root, blocks, tp, gathered):  # noqa: ANN001, ANN202
        rec["local"].append((root, blocks, tp, list(gathered)))

    monkeypatch.setattr(pz, "parallelize_module", parallelize)
    monkeypatch.setattr(pz, "run_on_dtensors", lambda m: rec["run_on"].append(m))
    monkeypatch.setattr(pz, "register_cpu_attention_sharding", register)
    monkeypatch.setattr(pz, "gather_sequence", gather)
    monkeypatch.setattr(pz, "set_local_attributes", local)
    monkeypatch.setattr(pz, "retie", lambda root, ties: rec["retie"].append((root, ties)))
    return rec


def test_tensor_parallel_styles_by_path(monkeypatch):
    rec = _record_tp(monkeypatch)
    root = _tp_model()
    blocks = [
        _block("b0", ["alias"], "none", tp_plan={
            "alias.norm": "sp_gather", "alias.q": "colwise_dtensor", "alias.k": "colwise",
            "alias.o": "rowwise", "gone": "colwise"}),
        _block("b1", ["layers.1"], "full", tp_plan={
            "layers.1.q": "colwise_sp_tokens", "layers.1.k": "colwise_gather:2",
            "layers.1.norm": "sp_block", "layers.1.o": "rowwise_sp"},
            takes_sequence_shard=True, leaves_sequence_shard=True),
        _block("b3", ["extra"], "none", tp_plan={"extra": "colwise_sp_tokens"}),
        _block("b2", ["embed"], tp_plan={"embed": "rowwise"}),
    ]  # fmt: skip
    mesh = _Mesh(2)
    assert pz.apply_tensor_parallel(root, blocks, mesh) == []
    ((got_root, got_mesh, styles),) = rec["parallelize"]
    assert got_root is root and got_mesh is mesh
    assert sorted(styles) == [
        "embed",
        "extra",
        "layers.0.k",
        "layers.0.o",
        "layers.0.q",
        "layers.1.k",
        "layers.1.norm",
        "layers.1.o",
        "layers.1.q",
    ]
    assert _kind(styles["layers.0.q"]) == ("ColwiseParallel", R, SL, False, None)
    assert _kind(styles["layers.0.k"]) == ("ColwiseParallel", R, SL, True, None)
    assert styles["layers.0.q"]._prepare_input_fn is pz._shared_input
    assert _kind(styles["layers.0.o"]) == ("_Rowwise", SL, R, True, None)
    assert _kind(styles["layers.1.q"]) == ("ColwiseParallel", S0, SL, True, None)
    assert _kind(styles["layers.1.k"]) == ("_BlocksColwise", R, R, True, 2)
    n = styles["layers.1.norm"]
    assert n.prepare_module_input.input_layouts == (Shard(1),)
    assert n.prepare_module_output.desired_output_layouts == (Shard(1),)
    assert _kind(styles["embed"]) == ("_Rowwise", R, R, True, None)
    assert rec["gather"] == [(root.layers[0].norm, True), (root.layers[1].q, False),
                             (root.extra, True)]  # fmt: skip
    assert rec["run_on"] == [root.layers[0]] and rec["registered"] == 1
    assert rec["retie"] == [(root, pz.tied_groups(root))] and rec["retie"][0][1]
    assert rec["local"] == [(root, blocks, 2, [])]


def test_tensor_parallel_of_one_rank_does_nothing(monkeypatch):
    rec = _record_tp(monkeypatch)
    root = _tp_model()
    assert pz.apply_tensor_parallel(root, [_block(tp_plan={"layers.0.q": "colwise"})],
                                    _Mesh(1)) == []  # fmt: skip
    assert all(not v for v in rec.values())


def test_tensor_parallel_nothing_to_shard(monkeypatch):
    rec = _record_tp(monkeypatch)
    root = _tp_model()
    blocks = [_block(tp_plan={"gone": "colwise", "layers.0.norm": "sp_gather"}, recompute="full")]
    assert pz.apply_tensor_parallel(root, blocks, _Mesh(4)) == []
    assert rec["parallelize"] == [] and rec["retie"] == [] and rec["run_on"] == []
    assert rec["gather"] == [(root.layers[0].norm, False)]
    assert rec["local"] == [(root, blocks, 4, [])]


def test_tensor_parallel_under_traced_code(monkeypatch):
    rec = _record_tp(monkeypatch)
    root = _traced_tree()
    blocks = [
        _block("b0", ["stage.mlp.fc2", "stage.mlp.fc1"],
               tp_plan={"stage.mlp.fc1": "colwise_dtensor", "stage.mlp.fc2": "rowwise"}),
        _block("b1", ["stage.head"], tp_plan={"stage.head": "colwise"}),
        _block("b2", ["side"], tp_plan={"side.lin": "colwise_dtensor"}),
    ]  # fmt: skip
    assert pz.apply_tensor_parallel(root, blocks, _Mesh(2)) == ["stage.head"]
    styles = rec["parallelize"][0][2]
    assert _kind(styles["stage.head"]) == ("_GatheredColwise", R, R, True, None)
    assert _kind(styles["stage.mlp.fc1"]) == ("ColwiseParallel", R, SL, False, None)
    assert _kind(styles["stage.mlp.fc2"]) == ("_Rowwise", SL, R, True, None)
    assert rec["run_on"] == [root.side, root.stage.mlp]  # sorted by path
    assert rec["local"][0][3] == ["stage.head"]
    # a gathered style is never traced-gathered; a lone colwise is
    rec = _record_tp(monkeypatch)
    blocks = [_block("b", ["stage.mlp"], tp_plan={"stage.mlp.fc1": "colwise_gather"})]
    assert pz.apply_tensor_parallel(root, blocks, _Mesh(2)) == []
    rec = _record_tp(monkeypatch)
    blocks = [_block("b", ["stage.mlp"], tp_plan={"stage.mlp.fc1": "colwise"})]
    assert pz.apply_tensor_parallel(root, blocks, _Mesh(2)) == ["stage.mlp.fc1"]
    # an sp_block is traced only where the module itself is traced code
    rec = _record_tp(monkeypatch)
    blocks = [_block("b", ["stage.head"], tp_plan={"stage.head": "sp_block"})]
    assert pz.apply_tensor_parallel(root, blocks, _Mesh(2)) == []
    with pytest.raises(UserInputError, match="runs stage sequence-parallel"):
        pz.apply_tensor_parallel(root, [_block("b", ["stage"], tp_plan={"stage": "sp_block"})],
                                 _Mesh(2))  # fmt: skip
    for bad in ("stage.head", "stage"):
        with pytest.raises(UserInputError, match=f"runs {bad} sequence-parallel"):
            pz.apply_tensor_parallel(root, [_block(tp_plan={bad: "sp_gather"})], _Mesh(2))
    with pytest.raises(UserInputError, match=r"shards stage\.mlp\.norm \(LayerNorm\)"):
        pz.apply_tensor_parallel(root, [_block(tp_plan={"stage.mlp.norm": "colwise"})], _Mesh(2))


def test_a_block_outside_traced_code_runs_on_dtensors_from_its_module(monkeypatch):
    rec = _record_tp(monkeypatch)
    root = _tp_model()
    blocks = [_block("b", ["embed", "layers.1"], tp_plan={"layers.1.q": "colwise_dtensor:2"}),
              _block("c", [], tp_plan={"embed": "colwise_dtensor"})]  # fmt: skip
    pz.apply_tensor_parallel(root, blocks, _Mesh(2))
    assert rec["run_on"] == [root, root.layers[1]]  # "" (no block module holds it), layers.1


def test_retie_points_every_path_at_the_sharded_weight(one_rank):
    root = nn.Module()
    root.embed, root.head = nn.Embedding(4, 2), nn.Linear(2, 4, bias=False)
    root.keep = nn.Module()
    root.head.weight = root.embed.weight
    root.keep.w = root.embed.weight
    ties = pz.tied_groups(root)
    assert ties == {"embed.weight": ["embed.weight", "head.weight", "keep.w"]}
    pz.retie(root, ties)  # one tensor already: unchanged
    assert root.head.weight is root.embed.weight
    a = nn.Parameter(distribute_tensor(root.embed.weight.detach(), one_rank, S0))
    b = nn.Parameter(distribute_tensor(root.embed.weight.detach(), one_rank, S0))
    root.embed.weight, root.head.weight = a, b
    pz.retie(root, ties)
    assert root.embed.weight is a and root.head.weight is a and root.keep.w is a
    c = nn.Parameter(distribute_tensor(a.full_tensor().detach(), one_rank, R))
    root.head.weight = c
    message = (
        "the plan shards the tied weight embed.weight (embed.weight, head.weight, keep.w) "
        "differently in its modules, which would train two tensors: plan again with this "
        "version of meshplan (it splits a tied weight along its first dimension everywhere or "
        "nowhere) or with --tp 1"
    )
    with pytest.raises(UserInputError) as err:
        pz.retie(root, ties)
    assert str(err.value) == message
    top = nn.Module()
    top.a = nn.Parameter(torch.ones(2))  # a tie already one tensor, before the one to retie
    top.w = nn.Parameter(torch.ones(2))
    top.inner = nn.Module()
    top.inner.w, top.inner.a = top.w, top.a
    t = pz.tied_groups(top)
    assert list(t) == ["a", "w"]
    top.w = nn.Parameter(distribute_tensor(torch.ones(2), one_rank, R))
    pz.retie(top, t)
    assert top.inner.w is top.w


# -- recompute ----------------------------------------------------------------------------------


def _record_recompute(monkeypatch) -> list:
    rec = []
    monkeypatch.setattr(pz, "composable_checkpoint", lambda m, **kw: rec.append(("ckpt", m, kw)))
    monkeypatch.setattr(pz, "checkpoint_holding_shard",
                        lambda m, mesh, ctx: rec.append(("shard", m, mesh, ctx)))  # fmt: skip
    monkeypatch.setattr(pz, "track_resharded", lambda ms: rec.append(("track", ms)))
    monkeypatch.setattr(pz, "recompute_context", lambda m, inner: ("ctx", m, inner))
    return rec


def _rc_model() -> nn.Module:
    root = nn.Module()
    root.layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
    root.a, root.b, root.c = nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2)
    return root


def test_recompute_without_sequence_parallel(monkeypatch):
    rec = _record_recompute(monkeypatch)
    root = _rc_model()
    blocks = [_block("n", ["c"], "none"), _block("f", ["layers"], "full"),
              _block("s", ["a", "b"], "selective")]  # fmt: skip
    pz.apply_recompute(root, blocks, before_tp=True, tp_mesh=_Mesh(2))
    assert rec == []
    pz.apply_recompute(root, blocks)
    L = root.layers
    assert rec == [
        ("ckpt", L[0], {"context_fn": ("ctx", L[0], None)}),
        ("ckpt", L[1], {"context_fn": ("ctx", L[1], None)}),
        ("ckpt", root.a, {"context_fn": ("ctx", root.a, selective_context)}),
        ("ckpt", root.b, {"context_fn": ("ctx", root.b, selective_context)}),
    ]


def test_a_checkpoint_without_context_gets_none(monkeypatch):
    rec = _record_recompute(monkeypatch)
    monkeypatch.setattr(pz, "recompute_context", lambda m, inner: None)
    pz._checkpoint(LIN, "full", False, None)
    assert rec == [("ckpt", LIN, {})]


def test_recompute_of_sequence_parallel_blocks(monkeypatch):
    rec = _record_recompute(monkeypatch)
    root = _rc_model()
    tp = _Mesh(2)
    sp = {"a": "sp_block", "b": "rowwise_sp", "c": "rowwise_sp_tokens", "layers.0": "colwise_sp"}
    blocks = [_block("s", ["a"], "selective", tp_plan=sp),
              _block("f", ["b"], "full", tp_plan={"b": "sp_block"}, takes_sequence_shard=True),
              _block("n", ["c"], "none", tp_plan={"c": "sp_block"})]  # fmt: skip
    with pytest.raises(ValueError, match="checkpointing sequence-parallel s needs its TP mesh"):
        pz.apply_recompute(root, blocks, before_tp=True)
    del rec[:]
    pz.apply_recompute(root, blocks, before_tp=True, tp_mesh=tp)
    (kind, m, mesh, ctx), (kind2, m2, kw2) = rec
    assert (kind, m, mesh) == ("shard", root.a, tp) and ctx[:2] == ("ctx", root.a)
    inner = ctx[2]
    assert isinstance(inner, partial) and inner.func is selective_context
    assert inner.args == (resharded_running,) and not inner.keywords
    assert (kind2, m2, kw2) == ("ckpt", root.b, {"context_fn": ("ctx", root.b, None)})
    del rec[:]
    pz.apply_recompute(root, blocks)  # after TP: the selective one learns its resharded modules
    assert rec == [("track", [root.b, root.c])]


# -- data-parallel units -----------------------------------------------------------------------


def _dp_model() -> nn.Module:
    root = nn.Module()
    root.embed = nn.Embedding(4, 2)
    root.layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
    root.frozen = nn.Linear(2, 2).requires_grad_(False)
    root.head = nn.Linear(2, 4, bias=False)
    root.head.weight = root.embed.weight
    root.out = nn.Linear(2, 2)
    root.both = nn.Module()
    root.both.e, root.both.h = nn.Embedding(4, 2), nn.Linear(2, 4, bias=False)
    root.both.h.weight = root.both.e.weight
    return root


def test_trained_and_units():
    root = _dp_model()
    assert pz._trained(root.layers[0]) and not pz._trained(root.frozen)
    assert not pz._trained(nn.ReLU())
    mixed = nn.Module()
    mixed.f, mixed.t = nn.Linear(1, 1).requires_grad_(False), nn.Linear(1, 1)
    assert pz._trained(mixed)
    blocks = [_block("e", ["embed"]), _block("l", ["layers", "frozen"]),
              _block("h", ["head", "out"]), _block("z", ["frozen"]), _block("both", ["both"]),
              _block("x", ["missing"])]  # fmt: skip
    units = pz.block_units(root, blocks)
    L = root.layers
    assert units == [[L[0], L[1]], [root.out], [root.both]]
    units = pz.block_units(root, blocks, keep_empty=True)
    assert units == [[], [L[0], L[1]], [root.out], [], [root.both], []]
    units = pz.block_units(root, blocks, read_outside=frozenset({"out.weight", "layers"}))
    assert units == [[L[0], L[1]], [root.both]]
    assert pz._unit([L[0]]) is L[0] and pz._unit([L[0], L[1]]) == [L[0], L[1]]


def _plan(zero=0, pp=1, dtype="fp32", reduce="fp32", trace="export", unread=(), outside=None):  # noqa: ANN001, ANN202
    model = SimpleNamespace(read_outside=outside, unread_params=list(unread), trace=trace)
    return SimpleNamespace(model=model, zero_stage=zero, mesh=SimpleNamespace(pp=pp, dp=4),
                           dtype=dtype, reduce_dtype=reduce, optimizer="sgd", lr=0.5)  # fmt: skip


class _FakeDDP:
    ignored: list = []

    def __init__(self, root, **kw) -> None:  # noqa: ANN001
        self.root, self.kw = root, kw

    @staticmethod
    def _set_params_and_buffers_to_ignore_for_model(root, names) -> None:  # noqa: ANN001
        _FakeDDP.ignored.append((root, names))


def _record_dp(monkeypatch) -> list:
    rec = []
    monkeypatch.setattr(pz, "replicate", lambda m, **kw: rec.append(("replicate", m, kw)) or "R")
    monkeypatch.setattr(pz, "fully_shard", lambda m, **kw: rec.append(("shard", m, kw)))
    _FakeDDP.ignored = []
    monkeypatch.setattr(pz, "DistributedDataParallel", _FakeDDP)
    return rec


def _simple() -> nn.Module:
    root = nn.Module()
    root.a, root.b = nn.Linear(2, 2), nn.Linear(2, 2)
    return root


def test_one_replica_wraps_nothing(monkeypatch):
    rec = _record_dp(monkeypatch)
    root = _simple()
    blocks = [_block("a", ["a"])]
    for zero in (0, 1):
        assert pz.apply_data_parallel(root, blocks, _plan(zero), _Mesh(1), CPU) is root
    assert pz.apply_data_parallel(root, blocks, _plan(0, dtype="bf16"), _Mesh(1), CPU) is root
    assert rec == [] and _FakeDDP.ignored == []


def test_zero0_replicates_per_block_under_gpu_mixed_precision(monkeypatch):
    rec = _record_dp(monkeypatch)
    root = _simple()
    blocks = [_block("a", ["a"]), _block("b", ["b"])]
    mesh = _Mesh(1)
    plan = _plan(0, dtype="bf16", reduce="fp32")
    assert pz.apply_data_parallel(root, blocks, plan, mesh, torch.device("cuda", 0)) == "R"
    assert [(k, m) for k, m, _ in rec] == [("replicate", root.a), ("replicate", root.b),
                                          ("replicate", root)]  # fmt: skip
    for _, _, kw in rec:
        assert kw["mesh"] is mesh and kw["ignored_params"] is None
        assert kw["mp_policy"].param_dtype == torch.bfloat16
        assert kw["mp_policy"].reduce_dtype == torch.float32


def test_zero0_replicates_with_tp_or_pp(one_rank, monkeypatch):
    rec = _record_dp(monkeypatch)
    root = _simple()
    blocks = [_block("ab", ["a", "b"])]
    mesh = _Mesh(2)
    ign = {root.b.bias}
    assert pz.apply_data_parallel(root, blocks, _plan(0, pp=2), mesh, CPU, ign) == "R"
    assert [(k, m) for k, m, _ in rec] == [("replicate", [root.a, root.b]), ("replicate", root)]
    assert all(kw["ignored_params"] == ign and kw["mp_policy"].param_dtype is None
               for *_, kw in rec)  # fmt: skip
    del rec[:]
    root.a.weight = nn.Parameter(distribute_tensor(torch.ones(2, 2), one_rank, R))
    got = pz.apply_data_parallel(root, blocks, _plan(0), mesh, CPU, {root.a.weight})
    assert isinstance(got, _FakeDDP) and rec == []  # DTensors only among the ignored: DDP
    assert pz.apply_data_parallel(root, blocks, _plan(0), mesh, CPU) == "R"
    with pytest.raises(UserInputError) as err:
        pz.apply_data_parallel(root, blocks, _plan(1), mesh, CPU)
    assert str(err.value) == (
        "ZeRO-1 with tensor parallelism: torch's ZeroRedundancyOptimizer cannot hold "
        "DTensor parameters; plan again with --zero 0, 2 or 3"
    )
    del rec[:]  # a weight read outside its module leaves that module to the root's unit
    pz.apply_data_parallel(root, blocks, _plan(0, outside=["b.weight"]), mesh, CPU)
    assert [m for _, m, _ in rec] == [root.a, root]


def test_zero0_and_1_plain_ddp(monkeypatch):
    rec = _record_dp(monkeypatch)
    root = _simple()
    blocks = [_block("ab", ["a", "b"])]
    mesh = _Mesh(2, "dp")
    got = pz.apply_data_parallel(root, blocks, _plan(1, unread=["a.bias"]), mesh, CPU,
                                 {root.b.weight})  # fmt: skip
    assert rec == [] and isinstance(got, _FakeDDP) and got.root is root
    assert got.kw == {"device_ids": None, "process_group": "group-dp",
                      "find_unused_parameters": False}  # fmt: skip
    assert _FakeDDP.ignored == [(root, ["a.bias", "b.weight"])]
    _FakeDDP.ignored = []
    got = pz.apply_data_parallel(root, blocks, _plan(0, trace="hooks"), mesh,
                                 torch.device("cuda", 1))  # fmt: skip
    assert got.kw["device_ids"] == [1] and got.kw["find_unused_parameters"] is True
    assert _FakeDDP.ignored == []


def test_zero2_and_3_shard_per_block(monkeypatch):
    rec = _record_dp(monkeypatch)
    root = _simple()
    root.c = nn.Linear(2, 2).requires_grad_(False)
    blocks = [_block("c", ["c"]), _block("a", ["a"], offload="optimizer+params"),
              _block("b", ["b"])]  # fmt: skip
    mesh = _Mesh(2)
    for zero in (2, 3):
        del rec[:]
        assert pz.apply_data_parallel(root, blocks, _plan(zero), mesh, CPU) is root
        assert [(k, m) for k, m, _ in rec] == [("shard", root.a), ("shard", root.b),
                                              ("shard", root)]  # fmt: skip
        for _, _, kw in rec:
            assert kw["mesh"] is mesh and kw["reshard_after_forward"] is (zero == 3)
            assert kw["ignored_params"] is None and kw["shard_placement_fn"] is fsdp_placement
            assert kw["mp_policy"].param_dtype is None
        off = rec[0][2]["offload_policy"]
        assert off.pin_memory is False
        assert "offload_policy" not in rec[1][2] and "offload_policy" not in rec[2][2]
    blocks = [_block("a", ["a"], offload="optimizer+params"),
              _block("b", ["b"], offload="optimizer+params")]  # fmt: skip
    del rec[:]
    pz.apply_data_parallel(root, blocks, _plan(3), mesh, torch.device("cuda", 0), {root.a.bias})
    assert all(kw["offload_policy"].pin_memory is True for *_, kw in rec)
    assert all(kw["ignored_params"] == {root.a.bias} for *_, kw in rec)
    del rec[:]
    pz.apply_data_parallel(root, [_block("c", ["c"], offload="optimizer+params")], _plan(3),
                           mesh, CPU)  # fmt: skip
    assert [(k, m) for k, m, _ in rec] == [("shard", root)] and "offload_policy" not in rec[0][2]
    del rec[:]
    pz.apply_data_parallel(root, blocks, _plan(2, outside=["b.weight"]), mesh, CPU)
    assert [m for _, m, _ in rec] == [root.a, root]


def test_mixed_precision_and_autocast():
    cuda, plan = torch.device("cuda", 0), _plan(dtype="bf16", reduce="bf16")
    mp = pz.mixed_precision(plan, cuda)
    assert (mp.param_dtype, mp.reduce_dtype) == (torch.bfloat16, torch.bfloat16)
    mp = pz.mixed_precision(_plan(dtype="fp16", reduce="fp32"), cuda)
    assert (mp.param_dtype, mp.reduce_dtype) == (torch.float16, torch.float32)
    for p, d in ((plan, CPU), (_plan(dtype="fp32"), cuda)):
        mp = pz.mixed_precision(p, d)
        assert (mp.param_dtype, mp.reduce_dtype) == (None, None)
    ddp = object.__new__(pz.DistributedDataParallel)
    assert pz.ddp_autocast_dtype(ddp, plan, cuda) == torch.bfloat16
    assert pz.ddp_autocast_dtype(ddp, _plan(dtype="fp16"), cuda) == torch.float16
    assert pz.ddp_autocast_dtype(nn.Linear(1, 1), plan, cuda) is None
    assert pz.ddp_autocast_dtype(ddp, plan, CPU) is None
    assert pz.ddp_autocast_dtype(ddp, _plan(dtype="fp32"), cuda) is None


def test_shard_experts(monkeypatch):
    rec = []

    def fake(m, **kw):  # noqa: ANN001, ANN003, ANN202
        rec.append(("shard", m, kw))
        m.set_force_sum_reduction_for_comms = lambda v: rec.append(("force", m, v))
        m.set_gradient_divide_factor = lambda f: rec.append(("divide", m, f))

    monkeypatch.setattr(pz, "fully_shard", fake)
    root = nn.Module()
    root.experts = nn.Module()
    root.experts.w1 = nn.Parameter(torch.ones(2))
    root.experts.inner = nn.Linear(2, 2)
    root.router = nn.Linear(2, 2)
    root.box = nn.Module()  # holds experts, none of its own: no unit
    root.box.e = nn.Linear(2, 2)
    experts_box = [root.box.e.weight, root.box.e.bias]
    experts = [root.experts.w1, root.experts.inner.weight, root.experts.inner.bias, *experts_box]
    mesh = _Mesh(2)
    for zero, edp, ex in ((1, 2, experts), (3, 1, experts), (3, 2, [])):
        assert pz.shard_experts(root, ex, _Mesh(edp), _plan(zero), CPU) is ex
    assert rec == []
    assert pz.shard_experts(root, experts, mesh, _plan(2), CPU) == []
    E, Inn = root.experts, root.experts.inner
    assert [r[:2] for r in rec] == [
        (k, m) for m in (E, Inn, root.box.e) for k in ("shard", "force", "divide")
    ]
    assert rec[1][2] is True and rec[2][2] == 4.0 and isinstance(rec[2][2], float)
    kw = rec[0][2]
    assert kw["mesh"] is mesh and kw["reshard_after_forward"] is False
    assert kw["mp_policy"].param_dtype is None
    del rec[:]
    pz.shard_experts(root, experts, mesh, _plan(3, dtype="bf16"), torch.device("cuda"))
    assert rec[0][2]["reshard_after_forward"] is True
    assert rec[0][2]["mp_policy"].param_dtype == torch.bfloat16


def test_make_optimizers(one_rank):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    a, b = nn.Linear(2, 2), nn.Linear(2, 3)
    opts = pz.make_optimizers([a, b], _plan(2), one_rank)
    assert [type(o) for o in opts] == [torch.optim.SGD] * 2
    assert [p for g in opts[1].param_groups for p in g["params"]] == list(b.parameters())
    assert opts[0].defaults["lr"] == 0.5 and opts[0].defaults["momentum"] == 0.9
    assert not opts[0].defaults.get("fused")
    assert pz.make_optimizers([nn.ReLU()], _plan(2), one_rank) == []
    experts = [b.weight]
    opts = pz.make_optimizers([a, b], _plan(1), one_rank, experts)
    assert [type(o) for o in opts] == [torch.optim.SGD, ZeroRedundancyOptimizer,
                                       ZeroRedundancyOptimizer]  # fmt: skip
    assert [p for g in opts[0].param_groups for p in g["params"]] == [b.weight]
    assert opts[2]._all_params == [b.bias] and opts[1]._all_params == list(a.parameters())
    assert opts[1].parameters_as_bucket_view and opts[1].process_group is one_rank.get_group()
    assert opts[1].defaults["lr"] == 0.5 and opts[0].defaults["momentum"] == 0.9
    assert opts[1].optim.defaults["momentum"] == 0.9
    opts = pz.make_optimizers([a], _plan(1), one_rank)
    assert [type(o) for o in opts] == [ZeroRedundancyOptimizer]


class _OnGpu(nn.Parameter):
    """A parameter that says it lives on a GPU (its data stays on the host): which optimizer
    group it joins and whether that group steps fused read only ``device.type``."""

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", 0)


def test_one_optimizer_per_device(one_rank):
    """A part with parameters on the GPU and on the host (FSDP2's CPU offload): the GPU's
    group first, stepping fused, then the host's with torch's default step."""
    part = nn.Linear(2, 2)
    part.weight = _OnGpu(part.weight.detach())
    opts = pz.make_optimizers([part], _plan(2), one_rank)
    assert [[p for g in o.param_groups for p in g["params"]] for o in opts] == [
        [part.weight],
        [part.bias],
    ]
    assert opts[0].defaults["fused"] is True and not opts[1].defaults.get("fused")


def test_zero1_steps_fused_when_every_parameter_is_on_the_gpu(one_rank, monkeypatch):
    """ZeRO-1's optimizer gets the fused step exactly when every parameter of every part is on
    a GPU (ZeroRedundancyOptimizer recorded: its bucket views would allocate on the device)."""
    import torch.distributed.optim as dopt

    made = []
    monkeypatch.setattr(dopt, "ZeroRedundancyOptimizer", lambda params, **kw: made.append(kw))
    gpu, host = nn.Linear(2, 2), nn.Linear(2, 2)
    gpu.weight, gpu.bias = _OnGpu(gpu.weight.detach()), _OnGpu(gpu.bias.detach())
    pz.make_optimizers([gpu], _plan(1), one_rank)
    pz.make_optimizers([gpu, host], _plan(1), one_rank)
    assert [kw.get("fused") for kw in made] == [True, None, None]
    assert made[0]["optimizer_class"] is torch.optim.SGD and made[0]["lr"] == 0.5


def test_gradient_sync(monkeypatch):
    class Rep:
        def set_requires_gradient_sync(self, v: bool) -> None:
            self.sync = v

    class Ddp:
        require_backward_grad_sync = None

    monkeypatch.setattr(pz, "ReplicateModule", Rep)
    monkeypatch.setattr(pz, "DistributedDataParallel", Ddp)
    r, d, other = Rep(), Ddp(), SimpleNamespace()
    for flag in (False, True):
        pz.gradient_sync([r, d, other], flag)
        assert r.sync is flag and d.require_backward_grad_sync is flag
    assert vars(other) == {}


# -- two ranks ------------------------------------------------------------------------------------


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.gate, self.down = nn.Linear(4, 6), nn.Linear(4, 6), nn.Linear(6, 4)
        self.norm = nn.LayerNorm(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)) * self.gate(x))


def _mlp_reference() -> tuple:
    torch.manual_seed(0)
    m = _MLP()
    x = torch.randn(3, 4, requires_grad=True)
    m(x).pow(2).sum().backward()
    return m, x


def _two_rank_body(r: int) -> dict:
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    m, x = _mlp_reference()
    torch.manual_seed(0)
    tp = _MLP()
    blocks = [_block("mlp", [""], tp_plan={"up": "colwise", "gate": "colwise", "down": "rowwise"})]
    assert pz.apply_tensor_parallel(tp, blocks, mesh) == []
    xin = x.detach().clone().requires_grad_()
    out = tp(xin)
    out.pow(2).sum().backward()
    got = {"out": torch.allclose(out, m(x)), "xgrad": torch.allclose(xin.grad, x.grad, atol=1e-6)}
    for name in ("up", "gate", "down"):
        w = getattr(tp, name).weight
        got[name] = torch.allclose(w.grad.full_tensor(), getattr(m, name).weight.grad, atol=1e-6)
    # a replicated weight whose gradient each rank holds a share of
    extra = nn.Linear(2, 2)
    extra.weight.grad = torch.full((2, 2), float(r + 1))
    extra.bias.grad = None
    pz.sum_partial_gradients([extra], mesh)
    got["summed"] = extra.weight.grad.tolist()
    # a sequence shard gathered before a module, kept as the shard for backward
    full = torch.arange(8.0).view(1, 8)
    shard = full[:, 4 * r : 4 * r + 4].clone().requires_grad_()
    sq = _Squares(True)
    pz.gather_sequence(sq, regather_in_backward=True)
    y = sq(DTensor.from_local(shard, mesh, (Shard(1),)))
    y.backward()
    got["seq"] = (float(y), shard.grad.tolist())
    # weights seeded per rank: each rank's shard is rank 0's (torch's src_data_rank)
    torch.manual_seed(r)
    conv = _Conv1D(4, 6)
    pz._InOutColwise()._apply(conv, mesh)
    torch.manual_seed(0)
    ref = _Conv1D(4, 6)
    cols = slice(3 * r, 3 * r + 3)
    got["colwise_in_out"] = torch.equal(conv.weight.to_local(), ref.weight.detach()[:, cols])
    # a row-parallel Conv1D takes the input's last dim as its shard
    conv = _Conv1D(6, 4)
    ref = _Conv1D(6, 4)
    ref.load_state_dict(conv.state_dict())
    pz._InOutRowwise()._apply(conv, mesh)
    xs = torch.arange(12.0).view(2, 6) / 10
    got["rowwise_in_out"] = torch.allclose(conv(xs[:, cols].contiguous()), ref(xs), atol=1e-6)
    # ZeRO-1 over a one-rank dp group inside the two-rank world: its own group
    dp = init_device_mesh("cpu", (2, 1), mesh_dim_names=("tp", "dp"))["dp"]
    (opt,) = pz.make_optimizers([nn.Linear(2, 2)], _plan(1), dp)
    got["zero_world"] = opt.world_size
    return got


def _two_ranks(r: int, store_path: str, queue) -> None:  # noqa: ANN001
    try:
        store = dist.FileStore(store_path, 2)
        dist.init_process_group("gloo", store=store, rank=r, world_size=2,
                                timeout=timedelta(seconds=30))  # fmt: skip
        queue.put((r, _two_rank_body(r)))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        queue.put((r, traceback.format_exc()))


def test_two_ranks_against_one_process(tmp_path):
    def body_is_a_dict(item: tuple) -> None:
        assert isinstance(item[1], dict), item[1]

    got = dict(run_ranks(_two_ranks, 2, tmp_path / "store", 2, body_is_a_dict))
    full = torch.arange(8.0)
    for r in (0, 1):
        g = got[r]
        assert g["out"] and g["xgrad"] and g["up"] and g["gate"] and g["down"], g
        assert g["summed"] == [[3.0, 3.0], [3.0, 3.0]]
        assert g["colwise_in_out"] and g["rowwise_in_out"] and g["zero_world"] == 1
        value, grad = g["seq"]
        assert value == pytest.approx(float((3 * full * full).sum()))
        assert grad == (6 * full[4 * r : 4 * r + 4]).view(1, 4).tolist()


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.lin(x) * scale


def test_a_direct_forward_keeps_its_keywords():
    """Called directly and through ``__call__``, with a keyword argument: the same output."""
    root = nn.Module()
    root.m = _Scaled()
    x = torch.ones(1, 2)
    ref = root.m(x, scale=3.0)
    pz.route_direct_forwards(root, ["m"])
    seen = []
    root.m.register_forward_pre_hook(lambda _m, a: seen.append(1))
    assert torch.equal(root.m.forward(x, scale=3.0), ref)
    assert torch.equal(root.m(x, scale=3.0), ref)
    assert seen == [1, 1]
