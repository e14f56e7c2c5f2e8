"""Tests written for mutmut's generated mutants of runtime/context_parallel.py (context
parallelism: torch's ring attention, with the CPU flash kernel added to its table;
benchmarks/generated_mutants.py). One process, on a one-rank gloo group and a one-rank cp
mesh: the ring of one rank is the plain attention, so inside ``sequence_chunks`` every form of
``scaled_dot_product_attention`` a model calls (causal or not, a scale, an explicit dropout of
0) must give torch's own outputs and gradients, each through the handlers registered here (the
registration is undone first, so each test makes it again). docs/mutation.md names the mutants
each test kills."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.experimental._context_parallel import _attention

from planner.errors import UserInputError
from runtime.context_parallel import check_model, enable_cpu_ring_attention, sequence_chunks

pytestmark = pytest.mark.usefixtures("gloo_one_rank")  # conftest: a one-rank gloo group
aten = torch.ops.aten
FORWARD = aten._scaled_dot_product_flash_attention_for_cpu.default
BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


@pytest.fixture
def unregistered():
    """torch's ring-attention table without the CPU kernel, as before the first CP run; the
    handlers a test registers are counted as they run."""
    _attention.custom_ops.pop(FORWARD, None)
    _attention.custom_ops.pop(BACKWARD, None)
    yield
    _attention.custom_ops.pop(FORWARD, None)
    _attention.custom_ops.pop(BACKWARD, None)


def _qkv(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 2, 6, 4, generator=g).requires_grad_() for _ in range(3)]


def _attend(chunked: bool, **kwargs) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """SDPA's output and q, k, v gradients (loss: a fixed weighting of the output), inside
    ``sequence_chunks`` on one rank or plainly."""
    q, k, v = _qkv()
    c = torch.linspace(-1.0, 2.0, 2 * 2 * 6 * 4).reshape(2, 2, 6, 4)
    if chunked:
        mesh = init_device_mesh("cpu", (1,))
        x, y = torch.zeros(2, 6), torch.zeros(2, 6, dtype=torch.long)
        with sequence_chunks(mesh, (x,), y):
            out = F.scaled_dot_product_attention(q, k, v, **kwargs)
            (out * c).sum().backward()
    else:
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
        (out * c).sum().backward()
    return out.detach(), [t.grad for t in (q, k, v)]


def _counting() -> dict[str, int]:
    """Wrap the registered handlers so a test sees that the ring ran through them."""
    calls = {"forward": 0, "backward": 0}
    for op, key in ((FORWARD, "forward"), (BACKWARD, "backward")):
        handler = _attention.custom_ops[op]

        def counted(*a, _h=handler, _k=key):
            calls[_k] += 1
            return _h(*a)

        _attention.custom_ops[op] = counted
    return calls


@pytest.mark.parametrize(
    "kwargs",
    [
        {"is_causal": True},
        {},
        {"scale": 0.3},
        {"dropout_p": 0.0, "is_causal": True, "scale": 0.5},
        {"dropout_p": 0.0},
    ],
    ids=["causal", "plain", "scaled", "all-given", "no-dropout"],
)
def test_a_ring_of_one_rank_attends_as_torchs_own_attention(unregistered, kwargs):
    """Each call form reaches the registered handlers (the op's dropout and causal flag
    positional or left to their defaults, the scale a keyword) and gives torch's numbers."""
    enable_cpu_ring_attention()
    calls = _counting()
    out, grads = _attend(True, **kwargs)
    ref_out, ref_grads = _attend(False, **kwargs)
    assert calls == {"forward": 1, "backward": 1}
    torch.testing.assert_close(out, ref_out)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)


def test_the_kernel_is_registered_once_and_kept(unregistered):
    enable_cpu_ring_attention()
    handlers = (_attention.custom_ops[FORWARD], _attention.custom_ops[BACKWARD])
    assert handlers[0] is not handlers[1]
    enable_cpu_ring_attention()
    assert (_attention.custom_ops[FORWARD], _attention.custom_ops[BACKWARD]) == handlers


@pytest.mark.parametrize(
    "mask", [torch.ones(2, 2, 6, 6, dtype=torch.bool), torch.zeros(2, 2, 6, 6)]
)
def test_an_attention_mask_is_refused_by_name(unregistered, mask):
    q, k, v = _qkv()
    mesh = init_device_mesh("cpu", (1,))
    with sequence_chunks(mesh, (torch.zeros(2, 6),), torch.zeros(2, 6, dtype=torch.long)):
        with pytest.raises(UserInputError) as err:
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert str(err.value) == (
        "context parallelism runs causal or unmasked attention only, and this model passes an "
        "attention mask: plan again with --cp 1"
    )


class _Positions(nn.Module):
    def forward(self, x, position_ids=None):
        return x


class _Keywords(nn.Module):
    def forward(self, x, **kwargs):
        return x


class _Plain(nn.Module):
    def forward(self, x, mask=None, *args):
        return x


def test_a_model_must_take_position_ids_by_name_or_keywords():
    check_model(_Positions())
    check_model(_Keywords())
    with pytest.raises(UserInputError) as err:
        check_model(_Plain())
    assert str(err.value) == (
        "context parallelism passes each token's position as position_ids, which "
        "_Plain.forward does not take: plan again with --cp 1"
    )


def _sequence_shards(tensors, mesh) -> list[DTensor]:
    return [DTensor.from_local(t, mesh, [Shard(2)]) for t in tensors]


def test_the_ring_handlers_give_sequence_shards(unregistered):
    """Called as the DTensor dispatcher calls them (the kernel's own op on tensors sharded
    along the sequence), the forward's output and log-sum-exp and the backward's three
    gradients are shards of the sequence dimension, as the next rank's chunk expects."""
    mesh = init_device_mesh("cpu", (1,))
    q, k, v = (t.detach() for t in _qkv())
    with sequence_chunks(mesh, (torch.zeros(2, 6),), torch.zeros(2, 6, dtype=torch.long)):
        out = FORWARD(*_sequence_shards((q, k, v), mesh), 0.0, True)
        assert [o.placements for o in out[:2]] == [(Shard(2),)] * 2
        ref = FORWARD(q, k, v, 0.0, True)
        torch.testing.assert_close(out[0].to_local(), ref[0])
        grad = torch.ones_like(q)
        grads = BACKWARD(*_sequence_shards((grad, q, k, v, ref[0], ref[1]), mesh), 0.0, True)
        assert [g.placements for g in grads] == [(Shard(2),)] * 3
        want = BACKWARD(grad, q, k, v, ref[0], ref[1], 0.0, True)
        for g, w in zip(grads, want, strict=True):
            torch.testing.assert_close(g.to_local(), w)


def test_a_dropout_reaches_the_kernel_which_refuses_it_on_the_cpu(unregistered):
    """torch's CPU flash kernel runs no dropout: a dropout the model asks for must reach it
    (and fail there), not be dropped on the way and train without it."""
    mesh = init_device_mesh("cpu", (1,))
    q, k, v = (t.detach() for t in _qkv())
    with sequence_chunks(mesh, (torch.zeros(2, 6),), torch.zeros(2, 6, dtype=torch.long)):
        for causal in ((), (True,)):
            with pytest.raises(RuntimeError, match="do not support dropout > 0"):
                FORWARD(*_sequence_shards((q, k, v), mesh), 0.5, *causal)
