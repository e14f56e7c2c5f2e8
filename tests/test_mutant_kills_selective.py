"""Tests written for mutmut's generated mutants of runtime/selective.py (the recompute of a
sequence-parallel block holding its input as this rank's sequence shard;
benchmarks/generated_mutants.py). One process: a block checkpointed with
``checkpoint_holding_shard`` against the same block run without a checkpoint (its output and
every gradient), on TP rank 1 of 2, where the all-gather of the kept shard is a stand-in that
puts this rank's shard beside the other rank's (the other chunk of the same replicated input,
which that rank holds), so a shard cut or put back in the wrong place changes the numbers.
tests/test_selective_runtime.py runs it under TP on gloo ranks; docs/mutation.md names the
mutants each test kills."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from runtime import selective
from runtime.selective import (
    _shardable,
    checkpoint_holding_shard,
    resharded_running,
    track_resharded,
)

TP, RANK = 2, 1


class _TpMesh:
    """What the checkpoint asks of a TP DeviceMesh: its size, this rank and its group."""

    group = "tp-group"

    def size(self) -> int:
        return TP

    def get_local_rank(self) -> int:
        return RANK

    def get_group(self) -> str:
        return self.group


class _Block(nn.Module):
    """A block reading its whole sequence (a running sum along it), a second input and a
    keyword; it counts its forwards and records whether each ran with gradients."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(3, 3).double()
        self.calls: list[bool] = []

    def forward(self, x: torch.Tensor, bias: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        self.calls.append(torch.is_grad_enabled())
        return torch.tanh(self.lin(x) * scale).cumsum(1) + bias  # tanh saves what scale made


def _gather(whole: torch.Tensor, seen: list):
    """all_gather_into_tensor over the TP group: this rank's shard at its place, the other
    rank's chunk of the same input at its."""

    def all_gather_into_tensor(out: torch.Tensor, shard: torch.Tensor, group: object) -> None:
        seen.append((shard.clone(), group, torch.is_grad_enabled()))
        parts = list(whole.detach().chunk(TP, dim=1))
        parts[RANK] = shard
        out.copy_(torch.cat(parts, dim=0))

    return all_gather_into_tensor


def _inputs(requires_grad: bool = True):
    x = torch.linspace(-1, 1, 3 * 4 * 3, dtype=torch.float64).reshape(3, 4, 3)
    bias = torch.linspace(0, 1, 3 * 4 * 3, dtype=torch.float64).reshape(3, 4, 3)
    return x.requires_grad_(requires_grad), bias.requires_grad_()


def _reference(requires_grad: bool, weight: torch.Tensor):
    block = _Block()
    x, bias = _inputs(requires_grad)
    (block(x, bias, scale=0.5) * weight).sum().backward()
    return block, x, bias


@pytest.mark.parametrize("requires_grad", [True, False])
def test_a_checkpointed_block_keeps_its_shard_and_trains_as_without_a_checkpoint(
    monkeypatch, requires_grad
):
    """Forward then backward: the output, the input's, the second input's and the weights'
    gradients are those of the block without a checkpoint; the forward ran twice (the
    recompute in backward); the one all-gather, outside the recompute's autograd, was handed
    rank 1's half of the sequence over the TP group."""
    seen: list = []
    weight = torch.linspace(-2, 3, 36, dtype=torch.float64).reshape(3, 4, 3)
    ref, x_ref, bias_ref = _reference(requires_grad, weight)
    x, bias = _inputs(requires_grad)
    monkeypatch.setattr(dist, "all_gather_into_tensor", _gather(x, seen))
    block = _Block()
    checkpoint_holding_shard(block, _TpMesh())
    y = block(x, bias, scale=0.5)
    torch.testing.assert_close(y, ref(x_ref.detach(), bias_ref.detach(), scale=0.5))
    assert seen == []
    (y * weight).sum().backward()
    assert len(seen) == 1
    shard, group, grad_on = seen[0]
    assert torch.equal(shard, x.detach().chunk(TP, dim=1)[RANK]) and shard.is_contiguous()
    assert group == "tp-group" and not grad_on
    assert block.calls == [True, True]
    if requires_grad:
        torch.testing.assert_close(x.grad, x_ref.grad)
    else:
        assert x.grad is None
    torch.testing.assert_close(bias.grad, bias_ref.grad)
    torch.testing.assert_close(block.lin.weight.grad, ref.lin.weight.grad)
    # a second step checkpoints again: its forward recomputed, its shard gathered once more
    block(x, bias, scale=0.5).sum().backward()
    assert block.calls == [True] * 4 and len(seen) == 2


def test_an_input_that_cannot_be_sharded_is_held_whole(monkeypatch):
    """A sequence of 3 does not split over TP 2: a plain checkpoint of the inputs as given,
    no all-gather; the same numbers."""
    seen: list = []
    monkeypatch.setattr(dist, "all_gather_into_tensor", _gather(torch.zeros(1), seen))
    weight = torch.ones(2, 3, 3, dtype=torch.float64)
    ref = _Block()
    x_ref = torch.linspace(-1, 1, 18, dtype=torch.float64).reshape(2, 3, 3).requires_grad_()
    (ref(x_ref, torch.zeros(1, dtype=torch.float64)) * weight).sum().backward()
    block = _Block()
    checkpoint_holding_shard(block, _TpMesh())
    x = x_ref.detach().clone().requires_grad_()
    (block(x, torch.zeros(1, dtype=torch.float64)) * weight).sum().backward()
    assert seen == [] and block.calls == [True, True]
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(block.lin.weight.grad, ref.lin.weight.grad)


def test_without_gradients_the_block_runs_once_and_holds_nothing(monkeypatch):
    seen: list = []
    x, bias = _inputs()
    monkeypatch.setattr(dist, "all_gather_into_tensor", _gather(x, seen))
    block = _Block()
    checkpoint_holding_shard(block, _TpMesh())
    with torch.no_grad():
        y = block(x, bias)
    assert block.calls == [False] and seen == [] and not y.requires_grad
    y = block(x, bias)  # a checkpointed call after it works as usual
    y.sum().backward()
    assert block.calls == [False, True, True] and len(seen) == 1


def test_the_policys_contexts_wrap_the_forward_and_the_recompute(monkeypatch):
    """``context_fn``'s first context is entered around the forward, its second around the
    recompute (selective recompute's policy caches there)."""
    seen: list = []
    x, bias = _inputs()
    monkeypatch.setattr(dist, "all_gather_into_tensor", _gather(x, seen))
    log: list[str] = []

    @contextmanager
    def named(name: str):
        log.append(f"enter {name}")
        try:
            yield
        finally:  # the recompute stops early, by an exception, once it has what it needs
            log.append(f"exit {name}")

    block = _Block()
    checkpoint_holding_shard(block, _TpMesh(), lambda: (named("forward"), named("recompute")))
    y = block(x, bias)
    assert log == ["enter forward", "exit forward"]
    y.sum().backward()
    assert log == ["enter forward", "exit forward", "enter recompute", "exit recompute"]


@pytest.mark.parametrize(
    "value, tp, want",
    [
        (torch.zeros(2, 4, 3), 2, True),
        (torch.zeros(2, 4), 4, True),
        (torch.zeros(2, 3, 3), 2, False),  # 3 does not split in 2
        (torch.zeros(4), 2, False),  # no sequence dim
        (torch.zeros(2, 1, 3), 1, True),
        (nn.Parameter(torch.zeros(2, 4, 3)), 2, False),  # only a plain tensor
        ([torch.zeros(2, 4, 3)], 2, False),
    ],
)
def test_only_a_plain_tensor_whose_sequence_splits_is_sharded(value, tp, want):
    assert _shardable(value, tp) is want


def test_a_dtensor_is_not_sharded(gloo_one_rank):  # noqa: ARG001
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate

    mesh = init_device_mesh("cpu", (1,))
    t = DTensor.from_local(torch.zeros(2, 4, 3), mesh, [Replicate()])
    assert not _shardable(t, 1)


def test_a_tracked_module_counts_as_running_inside_its_call_only():
    """Nested: the count is 1 inside the outer module, 2 inside the inner one, 1 after the
    inner returns; 0 again after, also after a forward that raised; a pre-hook raising
    before the count's (so its leave runs without its enter) does not take the count below
    0."""
    selective._RESHARDED_RUNNING[0] = 0
    seen: list = []
    running: list = []

    class Probe(nn.Module):
        def __init__(self, inner: nn.Module | None = None, fail: bool = False) -> None:
            super().__init__()
            self.inner, self.fail = inner, fail

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(selective._RESHARDED_RUNNING[0])
            running.append(resharded_running())
            if self.fail:
                raise ValueError("forward failed")
            if self.inner is None:
                return x
            y = self.inner(x)
            seen.append(selective._RESHARDED_RUNNING[0])
            running.append(resharded_running())
            return y

    inner = Probe()
    outer = Probe(inner)
    track_resharded([outer, inner])
    assert not resharded_running()
    outer(torch.zeros(1))
    # the outer's count, the inner's, the outer's again after the inner returned
    assert seen == [1, 2, 1] and running == [True, True, True] and not resharded_running()
    failing = Probe(fail=True)
    track_resharded([failing])
    with pytest.raises(ValueError):
        failing(torch.zeros(1))
    assert seen[-1] == 1 and selective._RESHARDED_RUNNING[0] == 0

    refused = Probe()
    refused.register_forward_pre_hook(lambda *_: (_ for _ in ()).throw(KeyError("no")))
    track_resharded([refused])
    with pytest.raises(KeyError):
        refused(torch.zeros(1))
    assert selective._RESHARDED_RUNNING[0] == 0
    inner(torch.zeros(1))
    assert seen[-1] == 1 and resharded_running() is False


def test_the_first_input_is_sharded_whatever_the_second_is(monkeypatch):
    """A whole first input beside a second that cannot be split (a bias of one element):
    the first is held as its shard and gathered once."""
    seen: list = []
    x, _ = _inputs()
    monkeypatch.setattr(dist, "all_gather_into_tensor", _gather(x, seen))
    block = _Block()
    checkpoint_holding_shard(block, _TpMesh())
    block(x, torch.zeros(1, dtype=torch.float64)).sum().backward()
    assert len(seen) == 1


class _Dropped(_Block):
    def forward(self, x: torch.Tensor, bias: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return nn.functional.dropout(super().forward(x, bias, scale), 0.5)


def test_the_recompute_draws_the_forwards_dropout_mask(monkeypatch):
    """The random state is kept for the recompute: the same mask, so the same gradients as
    the block without a checkpoint under the same seed."""
    seen: list = []
    x, bias = _inputs()
    monkeypatch.setattr(dist, "all_gather_into_tensor", _gather(x, seen))
    ref = _Dropped()
    x_ref = x.detach().clone().requires_grad_()
    torch.manual_seed(5)
    ref(x_ref, bias.detach()).sum().backward()
    block = _Dropped()
    checkpoint_holding_shard(block, _TpMesh())
    torch.manual_seed(5)
    block(x, bias.detach()).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(block.lin.weight.grad, ref.lin.weight.grad)


def test_a_forward_that_raises_closes_its_checkpoint(monkeypatch):
    """The checkpoint's saved-tensor hooks end with a forward that raised: a product computed
    after it, outside the block, backpropagates as usual, and the block trains again."""
    seen: list = []
    x, bias = _inputs()
    monkeypatch.setattr(dist, "all_gather_into_tensor", _gather(x, seen))
    block = _Block()
    checkpoint_holding_shard(block, _TpMesh())
    with pytest.raises(TypeError):
        block(x, bias, scale="no")
    a = torch.tensor([2.0, 3.0], requires_grad=True)
    (a * a).sum().backward()
    assert torch.equal(a.grad, torch.tensor([4.0, 6.0]))
    block(x, bias).sum().backward()
    assert len(seen) == 1
