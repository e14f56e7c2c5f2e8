"""Tests written for mutmut's generated mutants of runtime/optim.py (the plan's optimizer, built
alike by the runtime and the one-process oracle; benchmarks/generated_mutants.py). One process:
the optimizer's steps against their closed forms. docs/mutation.md names the mutants each test
kills."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from runtime.optim import (
    SGD_MOMENTUM,
    make_optimizer,
    optimizer_class,
    optimizer_kwargs,
    step_kwargs,
)


def test_the_plans_optimizer_names_are_torchs_classes():
    assert optimizer_class("adamw") is torch.optim.AdamW
    assert optimizer_class("sgd") is torch.optim.SGD
    with pytest.raises(KeyError):
        optimizer_class("adam")


def test_sgd_keeps_momentum_and_adamw_torchs_defaults():
    assert SGD_MOMENTUM == 0.9
    assert optimizer_kwargs("sgd", 0.25) == {"lr": 0.25, "momentum": 0.9}
    assert optimizer_kwargs("adamw", 0.25) == {"lr": 0.25}


def _on(device: str):
    return SimpleNamespace(device=torch.device(device))


def test_the_fused_step_only_where_every_parameter_is_on_a_gpu():
    assert step_kwargs([_on("cuda"), _on("cuda")]) == {"fused": True}
    assert step_kwargs([_on("cuda"), _on("cpu")]) == {}
    assert step_kwargs([_on("cpu")]) == {}
    assert step_kwargs([]) == {}


def test_two_sgd_steps_with_momentum_from_a_generator_of_parameters():
    """p = 1, gradient 2 each step, lr 0.1: the momentum buffer is 2 then 0.9 * 2 + 2 = 3.8,
    so p goes 1 - 0.2 = 0.8, then 0.8 - 0.38 = 0.42. The parameters come as a generator
    (``model.parameters()``), read once."""
    w = torch.nn.Parameter(torch.ones(3))
    opt = make_optimizer((p for p in [w]), "sgd", 0.1)
    assert type(opt) is torch.optim.SGD and opt.param_groups[0]["params"] == [w]
    assert not opt.param_groups[0]["fused"]  # gloo ranks: torch's default step
    for _ in range(2):
        w.grad = torch.full((3,), 2.0)
        opt.step()
    assert torch.allclose(w.detach(), torch.full((3,), 0.42))


def test_one_adamw_step_moves_each_weight_by_the_learning_rate():
    """AdamW's first step is lr * sign(g) (bias-corrected m / sqrt(v) = g / |g|) after the
    weight decay's p * (1 - lr * 0.01)."""
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = make_optimizer([w], "adamw", 0.1)
    assert type(opt) is torch.optim.AdamW
    w.grad = torch.tensor([3.0, -0.5])
    opt.step()
    want = torch.tensor([1.0, -2.0]) * (1 - 0.1 * 0.01) - 0.1 * torch.tensor([1.0, -1.0])
    assert torch.allclose(w.detach(), want, atol=1e-6)


def test_gpu_parameters_get_the_fused_step(monkeypatch):
    """No GPU here: parameters that say they are on one, and the optimizer class recorded
    (torch's would refuse stand-ins); make_optimizer passes what step_kwargs gives."""
    import runtime.optim as optim

    made = []
    monkeypatch.setattr(optim, "optimizer_class", lambda name: lambda p, **kw: made.append(kw))
    make_optimizer(iter([_on("cuda"), _on("cuda")]), "adamw", 0.5)
    make_optimizer([_on("cpu")], "sgd", 0.5)
    assert made == [{"lr": 0.5, "fused": True}, {"lr": 0.5, "momentum": 0.9}]
