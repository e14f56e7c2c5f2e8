"""Tests written for mutmut's generated mutants of runtime/batchnorm.py (BatchNorm statistics
over data-parallel replicas; benchmarks/generated_mutants.py). One process: the layer's
collective is torch.distributed.nn's all-reduce over a group of the one-rank gloo group, or a
stand-in for k replicas that all hold the same micro-batch (forward: k times the local sum;
backward: k times the local gradient, as the real all-reduce's backward sums the replicas'
identical gradients). Against one process's ``nn.BatchNorm`` over the k copies stacked: the
same output and input gradient, k times the replica's weight gradient, and the running
statistics of a batch k times as large. docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from runtime import batchnorm
from runtime.batchnorm import GroupBatchNorm, recompute_context, synchronize_batchnorm

pytestmark = pytest.mark.usefixtures("gloo_one_rank")  # conftest: a one-rank gloo group

K = 3  # replicas


class _Replicas(torch.autograd.Function):
    """The sum over K replicas holding the same tensor, both ways."""

    @staticmethod
    def forward(ctx, t):  # noqa: ANN001, ANN205
        return t * K

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        return grad * K


def _stand_in(group: object, calls: list):
    def all_reduce(t: torch.Tensor, group: object = None) -> torch.Tensor:
        calls.append(group)
        return _Replicas.apply(t)

    return all_reduce


def _norm(shape_dims: int, **kwargs) -> nn.Module:
    cls = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d}[shape_dims]
    torch.manual_seed(0)
    bn = cls(3, **kwargs).double()
    if bn.affine:
        with torch.no_grad():
            bn.weight.copy_(torch.tensor([0.5, 2.0, -1.5]))
            bn.bias.copy_(torch.tensor([0.25, -1.0, 3.0]))
    return bn


@pytest.mark.parametrize(
    "shape, kwargs",
    [
        ((4, 3, 5), {}),
        ((2, 3, 2, 2), {"momentum": None}),
        ((5, 3), {"eps": 0.5}),
        ((4, 3, 5), {"affine": False}),
        ((4, 3, 5), {"track_running_stats": False}),
    ],
)
def test_k_replicas_of_one_micro_batch_train_as_one_process_over_their_union(
    monkeypatch, shape, kwargs
):
    """Two training steps (different batches): each step's output and input gradient equal
    one process's BatchNorm over the K copies (its first copy's rows), the weight and bias
    gradients are the K copies' sum (the replicas' gradients before data parallelism sums
    them: K times this one's), and the running statistics (the variance unbiased over the
    union's K n values, and the cumulative average where momentum is None) and the batch
    count are the union's. Each collective names the layer's group."""
    group = dist.new_group([0])
    calls: list = []
    monkeypatch.setattr(batchnorm, "all_reduce", _stand_in(group, calls))
    ref = _norm(len(shape), **kwargs)
    ours = GroupBatchNorm(_norm(len(shape), **kwargs), group)
    weight = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for step in range(2):
        x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(step))
        x = (x * (step + 1) + step).requires_grad_()
        union = torch.cat([x.detach()] * K).requires_grad_()
        y_ref = ref(union)
        (y_ref * torch.cat([weight] * K)).sum().backward()
        y = ours(x)
        (y * weight).sum().backward()
        n = shape[0]
        torch.testing.assert_close(y, y_ref[:n], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(x.grad, union.grad[:n], rtol=1e-10, atol=1e-10)
    assert calls == [group] * 4
    if ref.affine:
        torch.testing.assert_close(ours.weight.grad * K, ref.weight.grad, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ours.bias.grad * K, ref.bias.grad, rtol=1e-12, atol=1e-12)
    else:
        assert ours.weight is None and ours.bias is None
    if ref.track_running_stats:
        torch.testing.assert_close(ours.running_mean, ref.running_mean, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ours.running_var, ref.running_var, rtol=1e-12, atol=1e-12)
        assert int(ours.num_batches_tracked) == int(ref.num_batches_tracked) == 2
    else:
        assert ours.running_mean is None


def test_the_real_all_reduce_over_one_rank_is_one_process_batchnorm():
    """torch.distributed.nn's all-reduce itself, over a one-rank group: one process's
    BatchNorm, output, gradients and statistics."""
    group = dist.new_group([0])
    ref, ours = _norm(3), GroupBatchNorm(_norm(3), group)
    x = torch.randn(4, 3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    (ref(x1) * x).sum().backward()
    (ours(x2) * x).sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.running_var, ref.running_var, rtol=1e-12, atol=1e-12)


def test_the_layer_keeps_the_sources_tensors_and_settings():
    """The optimizer's parameters and the checkpoint's buffers are the source's own tensors;
    eps, momentum, the flags and the mode are copied; an eval-mode layer normalises with the
    running statistics, as the source does (no collective)."""
    src = nn.BatchNorm1d(3, eps=0.25, momentum=0.3).double()
    with torch.no_grad():
        src.running_mean.copy_(torch.tensor([1.0, -2.0, 0.5]))
        src.running_var.copy_(torch.tensor([4.0, 0.25, 9.0]))
    src.eval()
    group = dist.new_group([0])
    ours = GroupBatchNorm(src, group)
    assert ours.weight is src.weight and ours.bias is src.bias
    assert ours.running_mean is src.running_mean and ours.running_var is src.running_var
    assert ours.num_batches_tracked is src.num_batches_tracked
    assert (ours.num_features, ours.eps, ours.momentum) == (3, 0.25, 0.3)
    assert ours.affine and ours.track_running_stats and not ours.training
    assert ours.group is group
    x = torch.arange(6.0, dtype=torch.float64).reshape(2, 3)
    want = (x - src.running_mean) / torch.sqrt(src.running_var + 0.25)
    torch.testing.assert_close(ours(x), want)
    plain = GroupBatchNorm(nn.BatchNorm1d(2, affine=False, track_running_stats=False), group)
    assert not plain.affine and not plain.track_running_stats and plain.training


@pytest.mark.parametrize("training", [True, False])
def test_a_one_dimensional_input_is_refused_in_either_mode(training):
    """As torch's BatchNorm refuses it (training used to fail on ``x.size(1)`` instead)."""
    ours = GroupBatchNorm(nn.BatchNorm1d(3), dist.new_group([0]))
    ours.train(training)
    with pytest.raises(ValueError) as err:
        ours(torch.ones(3))
    assert str(err.value) == "expected at least 2D input (got 1D input)"
    assert ours(torch.ones(2, 3)).shape == (2, 3)


def _net() -> nn.Module:
    net = nn.Module()
    net.bn = nn.BatchNorm1d(3)
    net.body = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.ReLU())
    net.done = nn.SyncBatchNorm(3)
    return net


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_batchnorm_below_the_root_is_swapped_in_place(device):
    """CPU: a GroupBatchNorm over the group; a GPU: torch's SyncBatchNorm over it (built
    only, no GPU needed); at the root's top level and nested; a SyncBatchNorm already there,
    and the root itself, stay."""
    group = dist.new_group([0])
    net = _net()
    tensors = (net.bn.weight, net.body[1].running_mean)
    done = net.done
    synchronize_batchnorm(net, group, torch.device(device))
    want = GroupBatchNorm if device == "cpu" else nn.SyncBatchNorm
    assert type(net.bn) is want and type(net.body[1]) is want
    assert (net.bn.weight, net.body[1].running_mean) == tensors
    if device == "cpu":
        assert net.bn.group is group and net.body[1].group is group
    else:
        assert net.bn.process_group is group
    assert net.done is done and type(net.body[0]) is nn.Linear
    root = nn.BatchNorm1d(2)
    synchronize_batchnorm(root, group, torch.device("cpu"))
    assert type(root) is nn.BatchNorm1d and dict(root.named_children()) == {}


def test_a_swapped_layer_is_left_alone_the_second_time():
    group, other = dist.new_group([0]), dist.new_group([0])
    net = _net()
    synchronize_batchnorm(net, group, torch.device("cpu"))
    first = net.bn
    synchronize_batchnorm(net, other, torch.device("cpu"))
    assert net.bn is first and net.bn.group is group


def _stats(m: nn.Module) -> list[torch.Tensor]:
    return [t.clone() for t in m.buffers()]


def test_a_checkpointed_block_moves_its_running_statistics_once():
    """A block of two BatchNorms (one in eval mode, one without running statistics beside
    them) checkpointed with ``recompute_context``: after forward and backward (the forward
    run twice) the statistics equal one plain forward's, batch count 1."""
    torch.manual_seed(0)

    def block() -> nn.Module:
        torch.manual_seed(0)
        frozen = nn.BatchNorm1d(3)
        frozen.eval()
        return nn.Sequential(
            nn.Linear(3, 3), nn.BatchNorm1d(3), frozen, nn.BatchNorm1d(3, track_running_stats=False)
        )

    plain, ckpt = block(), block()
    x = torch.randn(4, 3)
    plain(x).square().sum().backward()
    out = checkpoint(ckpt, x, use_reentrant=False, context_fn=recompute_context(ckpt))
    out.square().sum().backward()
    for got, want in zip(_stats(ckpt), _stats(plain), strict=True):
        torch.testing.assert_close(got, want)
    assert int(ckpt[1].num_batches_tracked) == 1
    torch.testing.assert_close(ckpt[0].weight.grad, plain[0].weight.grad)


def test_recompute_keeps_the_statistics_and_enters_the_inner_contexts():
    """The inner policy's forward context is handed back as is; its recompute context is
    entered with the statistics kept (restored after, the exit seen by the inner context
    last); without a BatchNorm below, ``inner`` itself (None stays None)."""
    seen: list[str] = []

    @contextmanager
    def named(name: str):
        seen.append(f"enter {name}")
        yield
        seen.append(f"exit {name}")

    forward_ctx = named("forward")

    def inner():
        return forward_ctx, named("recompute")

    no_bn = nn.Linear(2, 2)
    assert recompute_context(no_bn) is None and recompute_context(no_bn, inner) is inner
    bn = nn.BatchNorm1d(2)
    before = _stats(bn)
    forward, recompute = recompute_context(bn, inner)()
    assert forward is forward_ctx
    with recompute:
        bn(torch.tensor([[1.0, 2.0], [3.0, 7.0]]))
        assert int(bn.num_batches_tracked) == 1
        seen.append("ran")
    assert seen == ["enter recompute", "ran", "exit recompute"]
    for got, want in zip(_stats(bn), before, strict=True):
        assert torch.equal(got, want)
    plain_forward, plain_recompute = recompute_context(bn)()
    with plain_forward, plain_recompute:
        bn(torch.tensor([[1.0, 2.0], [3.0, 7.0]]))
    assert int(bn.num_batches_tracked) == 0


def test_statistics_are_restored_even_when_the_recompute_fails():
    bn = nn.BatchNorm1d(2)
    _, recompute = recompute_context(bn)()
    with pytest.raises(RuntimeError), recompute:
        bn(torch.tensor([[1.0, 2.0], [3.0, 7.0]]))
        raise RuntimeError("recompute failed")
    assert int(bn.num_batches_tracked) == 0 and torch.equal(bn.running_mean, torch.zeros(2))
