"""Tests written for mutmut's generated mutants of runtime/dtensor_blocks.py (blocks run on
DTensors, fused projections sharded by blocks, their checkpoint copies;
benchmarks/generated_mutants.py). One process for what one rank shows (a one-rank gloo group
made per test: a HashStore, no launch; DTensor on a one-rank CPU mesh, against the same module
on plain tensors), and four gloo ranks forked from this process (torch already imported) for
the layouts of TP 2 and FSDP 2 x TP 2, each rank's slices against the whole tensor cut by hand.
tests/test_dtensor_blocks.py runs the split on torch's fake process group, and the runtime's
torchrun tests train such plans; docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import traceback
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from forked_gloo import run_ranks
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.experimental import implicit_replication
from torch.distributed.tensor.placement_types import _StridedShard

import runtime.dtensor_blocks as db

WORLD = 4
FULL = torch.arange(24.0)  # 3 blocks of 8: q | k | v


# -- what one rank shows ---------------------------------------------------------------------


def test_a_mask_follows_the_split_unless_it_broadcasts_there():
    assert db._mask_placement(None, 1) is None
    assert db._mask_placement(0.5, 1) == Replicate()  # no shape
    assert db._mask_placement(torch.ones(2, 4, 4), 1) == Replicate()  # 3 dims
    assert db._mask_placement(torch.ones(2, 1, 4, 4), 1) == Replicate()
    assert db._mask_placement(torch.ones(2, 1, 4, 4), 0) == Shard(0)
    assert db._mask_placement(torch.ones(1, 3, 4, 4), 1) == Shard(1)
    assert db._mask_placement(torch.ones(1, 3, 4, 4), 0) == Replicate()


def _strategies(monkeypatch):
    """The two strategy functions the registration hands torch, by op."""
    got = {}
    monkeypatch.setattr(db, "_registered", [])
    monkeypatch.setattr(db, "register_sharding", lambda op: lambda f: got.setdefault(op, f))
    db.register_cpu_attention_sharding()
    db.register_cpu_attention_sharding()  # once only
    assert db._registered == [True]
    aten = torch.ops.aten
    return (
        got.pop(aten._scaled_dot_product_flash_attention_for_cpu.default),
        got.pop(aten._scaled_dot_product_flash_attention_for_cpu_backward.default),
        got,
    )


def test_the_attention_strategies_split_batch_or_heads_alike(monkeypatch):
    fwd, bwd, rest = _strategies(monkeypatch)
    assert rest == {}
    R, S0, S1 = Replicate(), Shard(0), Shard(1)
    q = torch.ones(2, 3, 4, 5)
    assert fwd(q, q, q) == [
        ([R, R], [R, R, R, None, None, None, None]),
        ([S0, S0], [S0, S0, S0, None, None, None, None]),
        ([S1, S1], [S1, S1, S1, None, None, None, None]),
    ]
    mask = torch.ones(2, 1, 4, 4)  # broadcast over heads
    assert fwd(q, q, q, 0.0, False, mask) == [
        ([R, R], [R, R, R, None, None, R, None]),
        ([S0, S0], [S0, S0, S0, None, None, S0, None]),
        ([S1, S1], [S1, S1, S1, None, None, R, None]),
    ]
    assert bwd(q, q, q, q, q, q, 0.0, False) == [
        ([R] * 3, [R] * 6 + [None, None, None, None]),
        ([S0] * 3, [S0] * 6 + [None, None, None, None]),
        ([S1] * 3, [S1] * 6 + [None, None, None, None]),
    ]
    assert bwd(q, q, q, q, q, q, 0.0, False, mask) == [
        ([R] * 3, [R] * 6 + [None, None, R, None]),
        ([S0] * 3, [S0] * 6 + [None, None, S0, None]),
        ([S1] * 3, [S1] * 6 + [None, None, R, None]),
    ]


def test_cpu_attention_on_head_sharded_dtensors_equals_torchs(one_rank):
    """The registered strategy runs SDPA's CPU kernel on DTensors (forward and backward)."""
    db.register_cpu_attention_sharding()
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8, requires_grad=True) for _ in range(3))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    want.sum().backward()
    dq = [DTensor.from_local(t.detach(), one_rank, [Shard(1)]).requires_grad_() for t in (q, k, v)]
    got = F.scaled_dot_product_attention(*dq, is_causal=True)
    assert got.placements == (Shard(1),)
    torch.testing.assert_close(got.to_local(), want)
    got.to_local().sum().backward()
    for d, t in zip(dq, (q, k, v)):
        torch.testing.assert_close(d.grad.to_local(), t.grad)


@pytest.mark.parametrize(
    "func,args,kwargs,want",
    [
        (torch.Tensor.split, ("x", 8), {}, (8, 0)),
        (torch.Tensor.split, ("x", 8, 2), {}, (8, 2)),
        (torch.Tensor.split, ("x",), {"split_size": 8, "dim": -1}, (8, -1)),
        (torch.split, ("x",), {"split_size_or_sections": [8, 8], "dim": 1}, ([8, 8], 1)),
        (torch.Tensor.chunk, ("x",), {"chunks": 3}, (3, 0)),
        (torch.Tensor.split, ("x",), {"sections": 3}, (3, 0)),
        (torch.Tensor.split, ("x",), {}, (None, 0)),
    ],
)
def test_a_split_calls_size_and_dim_in_every_form(func, args, kwargs, want):
    assert db._split_args(func, args, kwargs) == want


def _blocks_one_rank(mesh, k=3, dim=0):
    return DTensor.from_local(FULL.view(1, 24) if dim else FULL, mesh,
                              [_StridedShard(dim, split_factor=k)], run_check=False)  # fmt: skip


def test_a_split_into_the_blocks_on_one_rank_is_the_blocks(one_rank):
    x = _blocks_one_rank(one_rank, dim=1)
    for call in (
        lambda: db.split_blocks_locally(torch.Tensor.split, (x, 8, 1), {}),
        lambda: db.split_blocks_locally(torch.Tensor.split, (x, [8, 8, 8], -1), {}),
        lambda: db.split_blocks_locally(torch.chunk, (x, 3), {"dim": 1}),
        lambda: db.split_blocks_locally(torch.Tensor.chunk, (x,), {"chunks": 3, "dim": 1}),
    ):
        parts = call()
        assert len(parts) == 3
        for b, p in enumerate(parts):
            assert type(p) is DTensor and p.placements == (Shard(1),)
            assert p.to_local().tolist() == [FULL[8 * b : 8 * b + 8].tolist()]


def test_every_other_call_is_left_to_dtensor(one_rank):
    x = _blocks_one_rank(one_rank, dim=1)
    split = torch.Tensor.split
    none = [
        (torch.Tensor.expand, (x, 1, 24), {}),  # not a split
        (split, (FULL.view(1, 24), 8, 1), {}),  # not a DTensor
        (split, (), {}),
        (split, (x, 12, 1), {}),  # not the blocks
        (split, (x, [8, 16], 1), {}),
        (split, (x, 8, 0), {}),  # another dim
        (torch.chunk, (x, 2, 1), {}),
        (torch.chunk, (x, 8, 1), {}),  # a chunk count of the split's size
        (split, (x, 3, 1), {}),  # a split size of the chunk count
        (split, (x, 8, "1"), {}),  # dim not an int
        (split, (DTensor.from_local(FULL.view(1, 24), one_rank, [Shard(1)]), 8, 1), {}),
        (split, (_blocks_one_rank(one_rank, k=5, dim=1), 8, 1), {}),  # 24 % 5
    ]
    for func, args, kwargs in none:
        assert db.split_blocks_locally(func, args, kwargs) is None, (func, args)


def test_a_blocks_split_on_a_two_dim_mesh_is_left_to_dtensor(monkeypatch):
    class Mesh:
        ndim = 2

    x = SimpleNamespace(device_mesh=Mesh())
    monkeypatch.setattr(db, "DTensor", SimpleNamespace)
    assert db.split_blocks_locally(torch.Tensor.split, (x, 8, 1), {}) is None
    assert db.new_like_locally(torch.Tensor.new_zeros, (x, 2, 3), {}) is None


def test_new_like_on_one_rank_in_every_size_form(one_rank):
    x = DTensor.from_local(torch.ones(2, 6), one_rank, [Shard(1)])
    for args, kwargs in (((2, 6), {}), (((2, 6),), {}), (([2, 6],), {"dtype": torch.float64})):
        got = db.new_like_locally(torch.Tensor.new_zeros, (x, *args), kwargs)
        assert type(got) is DTensor and got.placements == (Shard(1),)
        assert got.shape == (2, 6) and got.stride() == (6, 1)
        assert got.to_local().tolist() == [[0.0] * 6] * 2
        assert got.dtype == kwargs.get("dtype", torch.float32)
    ones = db.new_like_locally(torch.Tensor.new_ones, (x, 2, 6), {})
    assert ones.to_local().tolist() == [[1.0] * 6] * 2


def test_new_like_leaves_every_other_call_to_dtensor(one_rank):
    x = DTensor.from_local(torch.ones(2, 6), one_rank, [Shard(1)])
    rep = DTensor.from_local(torch.ones(2, 6), one_rank, [Replicate()])
    for func, args in (
        (torch.Tensor.new_full, (x, (2, 6), 1.0)),
        (torch.Tensor.new_zeros, (torch.ones(2, 6), 2, 6)),
        (torch.Tensor.new_zeros, ()),
        (torch.Tensor.new_zeros, (x, 2, 5)),  # another size along the split dim
        (torch.Tensor.new_zeros, (x, 2, 6, 1)),  # another rank
        (torch.Tensor.new_zeros, (x, 2.0, 6)),
        (torch.Tensor.new_zeros, (rep, 2, 6)),
        (torch.Tensor.new_zeros, (_blocks_one_rank(one_rank, dim=1), 1, 24)),
    ):  # fmt: skip
        assert db.new_like_locally(func, args, {}) is None, args


def test_under_the_mode_an_expand_sums_its_plain_inputs_gradient(one_rank):
    """A plain tensor expanded and met by a DTensor gets a plain gradient (its full tensor)."""
    w = DTensor.from_local(torch.tensor([[2.0], [3.0]]), one_rank, [Replicate()]).requires_grad_()
    x = torch.tensor([1.0, 5.0], requires_grad=True)
    with implicit_replication(), db._SplitBlocksLocally():
        y = (x.expand(2, 2) * w).to_local()
        made = torch.ones(2, 6).new_zeros(2, 3)
    with implicit_replication():
        y.sum().backward()
    assert type(x.grad) is torch.Tensor and x.grad.tolist() == [5.0, 5.0]
    assert made.shape == (2, 3) and type(made) is torch.Tensor


def test_under_the_mode_only_an_expands_plain_input_gets_its_gradient_made_whole(one_rank):
    """The expand's plain input is hooked wherever it stands in the later product (here the
    second operand); a plain tensor that meets a DTensor without an expand keeps DTensor's
    own gradient (its full tensor would be a collective the plan did not price: an
    all-reduce of a partial gradient on TP 2)."""
    w = DTensor.from_local(torch.tensor([[2.0], [3.0]]), one_rank, [Replicate()]).requires_grad_()
    x = torch.tensor([1.0, 5.0], requires_grad=True)
    z = torch.tensor([1.0, 5.0], requires_grad=True)
    with implicit_replication(), db._SplitBlocksLocally():
        y = (w * x.expand(2, 2)).to_local() + (z * w).to_local()
    with implicit_replication():
        y.sum().backward()
    assert type(x.grad) is torch.Tensor and x.grad.tolist() == [5.0, 5.0]
    assert isinstance(z.grad, DTensor) and z.grad.to_local().tolist() == [5.0, 5.0]


def test_the_mode_hands_blocks_and_new_tensors_and_other_calls(one_rank):
    x = _blocks_one_rank(one_rank, dim=1)
    s = DTensor.from_local(torch.ones(2, 6), one_rank, [Shard(1)])
    with db._SplitBlocksLocally():
        parts = x.split(8, dim=1)
        new = s.new_zeros(2, 6)
        plain = torch.arange(4.0).split(2)
        wider = s.new_zeros(3, 6)  # DTensor's own rule: whole, for another shape
        sums = torch.arange(4.0).view(2, 2).sum(dim=1)
    assert [p.placements for p in parts] == [(Shard(1),)] * 3
    assert new.placements == (Shard(1),) and new.to_local().shape == (2, 6)
    assert [t.tolist() for t in plain] == [[0.0, 1.0], [2.0, 3.0]]
    assert wider.placements == (Shard(1),) and wider.to_local().shape == (3, 6)
    assert sums.tolist() == [1.0, 5.0]  # a call passed on keeps its keywords


def test_whole_makes_a_dtensor_gradient_plain(one_rank):
    g = DTensor.from_local(torch.tensor([1.0, 2.0]), one_rank, [Partial()])
    got = db._whole(g)
    assert type(got) is torch.Tensor and got.tolist() == [1.0, 2.0]
    t = torch.ones(2)
    assert db._whole(t) is t


def test_plain_gradients_hooks_plain_tensors_that_need_a_gradient_only(one_rank):
    hooked = []

    class T(torch.Tensor):
        pass

    a = torch.ones(2, requires_grad=True)
    b = torch.ones(2)
    d = DTensor.from_local(torch.ones(2), one_rank, [Replicate()]).requires_grad_()
    for t in (a, b, d):
        t.register_hook = lambda f, t=t: hooked.append((t, f))
    db.plain_gradients({"x": [a, (b, 3)], "d": d})
    assert len(hooked) == 1 and hooked[0][0] is a and hooked[0][1] is db._whole


class _Inner(torch.nn.Module):
    def forward(self, x, w):
        return x * w


class _Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Inner()

    def forward(self, x, w, *, bias):
        return self.inner(x, w) + x + self.inner(bias, w)


def test_a_block_run_on_dtensors_mixes_plain_tensors_and_gives_them_plain_gradients(one_rank):
    """Against the same module on plain tensors: outputs and gradients; after the call the
    mode and the implicit replication are left (a mixed op fails again)."""
    m = _Outer()
    db.run_on_dtensors(m)
    wl = torch.tensor([2.0, 3.0])
    w = DTensor.from_local(wl, one_rank, [Replicate()]).requires_grad_()
    x = torch.tensor([1.0, 5.0], requires_grad=True)
    bias = torch.tensor([0.5, 0.25], requires_grad=True)
    out = m(x, w, bias=bias)
    with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
        x * w
    x0, w0, b0 = (t.detach().clone().requires_grad_() for t in (x, wl, bias))
    want = _Outer()(x0, w0, bias=b0)
    assert type(out) is DTensor and out.to_local().tolist() == want.tolist()
    with db.backward_replication(SimpleNamespace(blocks=[_block("colwise_dtensor")])):
        out.to_local().sum().backward()
    want.sum().backward()
    for got, ref in ((x, x0), (bias, b0)):
        assert type(got.grad) is torch.Tensor and got.grad.tolist() == ref.grad.tolist()
    assert w.grad.to_local().tolist() == w0.grad.tolist()


def test_a_submodules_plain_output_gets_a_plain_gradient(one_rank):
    """A submodule's plain output (a style's local tensor) is hooked too: the parameter that
    made it gets a plain gradient, the one-process one."""

    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.s = torch.nn.Parameter(torch.tensor([2.0, 4.0]))

        def forward(self, x):
            return x * self.s

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = Plain()

        def forward(self, x, w):
            return self.p(x) * w

    m = Block()
    db.run_on_dtensors(m)
    w = DTensor.from_local(torch.tensor([2.0, 3.0]), one_rank, [Replicate()])
    out = m(torch.tensor([1.0, 5.0]), w)
    with implicit_replication():
        out.to_local().sum().backward()
    assert type(m.p.s.grad) is torch.Tensor and m.p.s.grad.tolist() == [2.0, 15.0]


def test_a_failed_call_leaves_the_mode_too(one_rank):
    class Bad(torch.nn.Module):
        def forward(self, x):
            raise ValueError("model code")

    m = Bad()
    db.run_on_dtensors(m)
    with pytest.raises(ValueError):
        m(torch.ones(1))
    w = DTensor.from_local(torch.ones(2), one_rank, [Replicate()])
    with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
        torch.ones(2) * w


def _block(*styles):
    return SimpleNamespace(tp_plan={f"m{i}": s for i, s in enumerate(styles)})


def test_backward_replication_only_where_a_block_keeps_dtensors(one_rank):
    w = DTensor.from_local(torch.ones(2), one_rank, [Replicate()])
    plain = SimpleNamespace(blocks=[_block("colwise", "rowwise"), _block()])
    kept = SimpleNamespace(blocks=[_block("colwise"), _block("colwise_dtensor", "rowwise")])
    with db.backward_replication(kept):
        assert (torch.ones(2) * w).to_local().tolist() == [1.0, 1.0]
    with db.backward_replication(plain), pytest.raises(RuntimeError, match="mixed"):
        torch.ones(2) * w


def test_whole_gradients_makes_plain_parameters_gradients_plain(one_rank):
    lin = torch.nn.Linear(2, 1)
    lin.weight.grad = DTensor.from_local(torch.tensor([[1.0, 2.0]]), one_rank, [Partial()])
    lin.bias.grad = torch.tensor([3.0])
    other = torch.nn.Module()
    other.p = torch.nn.Parameter(DTensor.from_local(torch.ones(2), one_rank, [Replicate()]))
    other.p.grad = DTensor.from_local(torch.ones(2), one_rank, [Replicate()])
    db.whole_gradients([other, lin])
    assert type(lin.weight.grad) is torch.Tensor and lin.weight.grad.tolist() == [[1.0, 2.0]]
    assert lin.bias.grad.tolist() == [3.0] and type(other.p.grad) is DTensor


def test_the_blocks_dim_is_the_last_strided_shard_of_its_tensor_dim():
    S, SS = Shard, _StridedShard
    assert db._blocks_dim((SS(0, split_factor=3),)) == 0
    assert db._blocks_dim((Shard(0),)) is None
    assert db._blocks_dim((Replicate(), SS(1, split_factor=3))) == 1
    assert db._blocks_dim((SS(0, split_factor=2), SS(0, split_factor=3))) == 1
    assert db._blocks_dim((SS(0, split_factor=3), S(0))) is None
    assert db._blocks_dim((SS(0, split_factor=3), S(1))) == 0
    assert db._blocks_dim((SS(0, split_factor=3), Replicate())) == 0
    assert db._blocks_dim(()) is None


def test_the_fsdp_dim_is_the_first_earlier_one_on_the_same_tensor_dim():
    S, SS = Shard, _StridedShard
    assert db._fsdp_dim((S(0), SS(0, split_factor=3)), 1) == 0
    assert db._fsdp_dim((SS(0, split_factor=2), SS(0, split_factor=3)), 1) == 0
    assert db._fsdp_dim((S(1), SS(0, split_factor=3)), 1) is None
    assert db._fsdp_dim((Replicate(), SS(0, split_factor=3)), 1) is None
    assert db._fsdp_dim((S(0), S(0), Replicate(), SS(0, split_factor=3)), 3) == 0
    assert db._fsdp_dim((Replicate(), S(0), SS(0, split_factor=3)), 2) == 1


def test_full_to_blocks_cuts_each_ranks_slice_of_every_block():
    full = FULL.view(1, 24).repeat(2, 1)  # along dim 1
    for rank in (0, 1):
        want = [x for b in range(3) for x in range(8 * b + 4 * rank, 8 * b + 4 * rank + 4)]
        got = db._full_to_blocks(full, rank, 2, 1, 3)
        assert got.tolist() == [[float(x) for x in want]] * 2
    got = db._full_to_blocks(FULL, 1, 4, 0, 2)  # 2 blocks of 12, 4 ranks: slices of 3
    assert got.tolist() == [3.0, 4.0, 5.0, 15.0, 16.0, 17.0]


def test_tp_shape_is_the_shape_and_stride_of_one_tp_slice(one_rank):
    v = DTensor.from_local(torch.ones(4, 6), one_rank, [Replicate()])
    assert db._tp_shape(v, 1, 2) == (torch.Size([4, 3]), (3, 1))
    assert db._tp_shape(v, 0, 4) == (torch.Size([1, 6]), (6, 1))


def test_on_one_rank_a_blocks_copy_is_its_tensor_and_comes_back(one_rank):
    v = _blocks_one_rank(one_rank)
    state = {"w": v, "b": DTensor.from_local(torch.ones(2), one_rank, [Shard(0)]), "n": 3}
    found = db.contiguous_copies(state)
    assert found == {"w": v.placements}
    assert state["w"].placements == (Shard(0),) and state["w"].to_local().tolist() == FULL.tolist()
    assert state["n"] == 3 and state["b"].placements == (Shard(0),)
    db.restore_blocks(state, found)
    assert state["w"].placements == v.placements
    assert state["w"].to_local().tolist() == FULL.tolist()


def test_fsdp_shards_a_weight_split_by_blocks_along_dim_0_along_dim_1(one_rank):
    mesh2 = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    SS = _StridedShard
    w = DTensor.from_local(torch.ones(6, 2), one_rank, [SS(0, split_factor=3)], run_check=False)
    assert db.fsdp_placement(w) == Shard(1)
    assert db.fsdp_placement(torch.ones(6, 2)) is None
    b = DTensor.from_local(torch.ones(6), one_rank, [SS(0, split_factor=3)], run_check=False)
    assert db.fsdp_placement(b) is None  # one dim
    w1 = DTensor.from_local(torch.ones(2, 6), one_rank, [SS(1, split_factor=3)], run_check=False)
    assert db.fsdp_placement(w1) is None  # blocks along dim 1
    w2 = DTensor.from_local(torch.ones(6, 2), one_rank, [Shard(0)])
    assert db.fsdp_placement(w2) is None
    w3 = DTensor.from_local(torch.ones(6, 2), mesh2, [Replicate(), SS(0, split_factor=3)],
                            run_check=False)  # fmt: skip
    assert db.fsdp_placement(w3) == Shard(1)


# -- four forked gloo ranks: TP 2, and FSDP 2 x TP 2 -----------------------------------------


def _tp_slice(full: torch.Tensor, tp_i: int, k: int = 3, tp: int = 2) -> torch.Tensor:
    """TP rank ``tp_i``'s slice of each of the k blocks of ``full`` (dim 0), by index."""
    n = full.shape[0] // k // tp
    rows = [b * tp * n + tp_i * n + j for b in range(k) for j in range(n)]
    return full[rows]


def _rank_body(r: int) -> dict:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tp_mesh = mesh["tp"]
    dp_i, tp_i = r // 2, r % 2
    SS = _StridedShard
    out = {}
    # the split of q | k | v (24 along dim 1) into its blocks, locally
    x = DTensor.from_local(_tp_slice(FULL, tp_i).view(1, 12), tp_mesh, [SS(1, split_factor=3)],
                           run_check=False)  # fmt: skip
    with db._SplitBlocksLocally():
        parts = x.split(8, dim=1)
        chunks = torch.chunk(x, 3, -1)
    out["parts"] = [(p.to_local().tolist(), list(p.shape), repr(p.placements)) for p in parts]
    out["chunks_full"] = [c.full_tensor().tolist() for c in chunks]
    # a tensor made like a split one: this rank's part only
    s = DTensor.from_local(torch.ones(2, 3), tp_mesh, [Shard(1)])
    with db._SplitBlocksLocally():
        new = s.new_empty(2, 6)
    out["new"] = (list(new.to_local().shape), list(new.shape), list(new.stride()))
    # the whole tensor from the TP slices
    out["to_full"] = db._blocks_to_full(_tp_slice(FULL, tp_i), tp_mesh, 0, 3).tolist()
    # a bias sharded by blocks over TP, then FSDP over the same dim: checkpoint copy and back
    bias_pl = (Shard(0), SS(0, split_factor=3))
    bias_local = torch.chunk(_tp_slice(FULL, tp_i), 2)[dp_i]
    bias = DTensor.from_local(bias_local, mesh, bias_pl, run_check=False, shape=(24,),
                              stride=(1,))  # fmt: skip
    copy = db.contiguous_copy(bias)
    out["bias_copy"] = (copy.to_local().tolist(), repr(copy.placements), list(copy.shape))
    out["bias_copy_full"] = copy.full_tensor().tolist()
    back = db.blocks_copy(copy, bias_pl)
    out["bias_back"] = (back.to_local().tolist(), repr(back.placements), list(back.shape))
    # a weight sharded by blocks along dim 0 over TP, by FSDP along dim 1: a redistribution
    wfull = torch.arange(48.0).view(24, 2)
    w_pl = (Shard(1), SS(0, split_factor=3))
    w_local = _tp_slice(wfull, tp_i)[:, dp_i : dp_i + 1]
    w = DTensor.from_local(w_local, mesh, w_pl, run_check=False, shape=(24, 2), stride=(2, 1))
    wcopy = db.contiguous_copy(w)
    out["w_copy"] = (wcopy.to_local().tolist(), repr(wcopy.placements))
    wback = db.blocks_copy(wcopy, w_pl)
    out["w_back"] = (wback.to_local().tolist(), repr(wback.placements))
    return out


def _rank(r: int, store_path: str, queue) -> None:  # noqa: ANN001
    try:
        store = dist.FileStore(store_path, WORLD)
        dist.init_process_group(
            "gloo", store=store, rank=r, world_size=WORLD, timeout=timedelta(seconds=30)
        )
        queue.put((r, _rank_body(r)))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        queue.put((r, traceback.format_exc()))


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    """Each rank's results of ``_rank_body``, by rank."""

    def body_is_a_dict(item: tuple) -> None:
        assert isinstance(item[1], dict), item[1]

    store = tmp_path_factory.mktemp("store") / "store"
    return dict(run_ranks(_rank, WORLD, store, WORLD, body_is_a_dict))


def _one_rank_2d():
    """A 1 x 1 (dp, tp) mesh of the one-rank group: the FSDP x TP code paths, each degree 1
    (every slice is the whole tensor). Called in each four-rank test too, so that mutmut's
    record (it sees this process only, not the forked ranks) ties those tests to the code."""
    return init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))


def test_on_one_rank_fsdp_and_tp_copies_are_the_whole_tensor(one_rank):
    mesh = _one_rank_2d()
    SS = _StridedShard
    assert db._submesh(mesh, 1) is not mesh and db._submesh(mesh, 1).mesh_dim_names == ("tp",)
    assert db._submesh(mesh, 0).mesh_dim_names == ("dp",) and db._submesh(one_rank, 0) is one_rank
    assert db._blocks_to_full(FULL.view(3, 8), mesh["tp"], 1, 2).tolist() == FULL.view(
        3, 8).tolist()  # fmt: skip
    pl = (Shard(0), SS(0, split_factor=3))
    v = DTensor.from_local(FULL, mesh, pl, run_check=False, shape=(24,), stride=(1,))
    copy = db.contiguous_copy(v)
    assert copy.placements == (Shard(0), Shard(0)) and copy.to_local().tolist() == FULL.tolist()
    back = db.blocks_copy(copy, pl)
    assert back.placements == pl and back.to_local().tolist() == FULL.tolist()


def test_tp_ranks_split_their_blocks_locally_into_the_whole_blocks(four_ranks, one_rank):
    test_on_one_rank_fsdp_and_tp_copies_are_the_whole_tensor(one_rank)
    for r, out in four_ranks.items():
        tp_i = r % 2
        for b, (local, shape, placements) in enumerate(out["parts"]):
            start = 8 * b + 4 * tp_i
            assert local == [FULL[start : start + 4].tolist()]
            assert shape == [1, 8] and placements == "(Shard(dim=1),)"
        assert out["chunks_full"] == [[FULL[8 * b : 8 * b + 8].tolist()] for b in range(3)]
        assert out["new"] == ([2, 3], [2, 6], [6, 1])
        assert out["to_full"] == FULL.tolist()


def test_a_bias_under_fsdp_and_tp_is_copied_contiguous_and_back(four_ranks, one_rank):
    test_on_one_rank_fsdp_and_tp_copies_are_the_whole_tensor(one_rank)
    for r, out in four_ranks.items():
        dp_i, tp_i = r // 2, r % 2
        start = 12 * dp_i + 6 * tp_i
        assert out["bias_copy"] == (
            FULL[start : start + 6].tolist(),
            "(Shard(dim=0), Shard(dim=0))",
            [24],
        )
        assert out["bias_copy_full"] == FULL.tolist()
        local, placements, shape = out["bias_back"]
        assert local == torch.chunk(_tp_slice(FULL, tp_i), 2)[dp_i].tolist()
        assert placements == "(Shard(dim=0), _StridedShard(dim=0, sf=3))" and shape == [24]


def test_a_weight_under_fsdp_on_another_dim_is_redistributed_and_back(four_ranks, one_rank):
    mesh = _one_rank_2d()
    w_pl = (Shard(1), _StridedShard(0, split_factor=3))
    w = DTensor.from_local(torch.ones(24, 2), mesh, w_pl, run_check=False)
    assert db.contiguous_copy(w).placements == (Shard(1), Shard(0))
    assert db.blocks_copy(db.contiguous_copy(w), w_pl).placements == w_pl
    wfull = torch.arange(48.0).view(24, 2)
    for r, out in four_ranks.items():
        dp_i, tp_i = r // 2, r % 2
        local, placements = out["w_copy"]
        assert local == wfull[12 * tp_i : 12 * tp_i + 12, dp_i : dp_i + 1].tolist()
        assert placements == "(Shard(dim=1), Shard(dim=0))"
        local, placements = out["w_back"]
        assert local == _tp_slice(wfull, tp_i)[:, dp_i : dp_i + 1].tolist()
        assert placements == "(Shard(dim=1), _StridedShard(dim=0, sf=3))"
