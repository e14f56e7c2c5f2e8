"""Tests written for mutmut's generated mutants of runtime/expert_parallel.py (expert
parallelism: experts sharded over the ``ep`` ranks, tokens dispatched to them and back with
all-to-alls; benchmarks/generated_mutants.py). In one process, on a one-rank gloo group: the
refusals, each message whole; the module's own forward against the dispatching one at ep 1
(outputs and every gradient); the expert gradients' average over one replica. Then two forked
gloo ranks at ep 2 (tests/scripts/expert_ranks.py), against one process's module over both
ranks' tokens: each rank's outputs and gradients, its shards' gradients (the other rank's
tokens included), and the average over an edp group of two. docs/mutation.md names the
mutants each test kills."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import forked_ranks
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

from planner.errors import UserInputError
from runtime.expert_parallel import apply_expert_parallel, sync_expert_grads
from runtime.launch import worker_env

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "scripts"))
import expert_ranks  # noqa: E402
from expert_ranks import Experts, Holder, loss_weights, tokens  # noqa: E402


class _Mesh:
    """A stand-in mesh of ``n`` ranks: the refusals read only its size, before any sharding."""

    def __init__(self, n: int) -> None:
        self.n = n

    def size(self) -> int:
        return self.n


def _one_rank_mesh():
    return init_device_mesh("cpu", (1,))


def test_a_count_of_experts_the_ranks_cannot_split_is_refused():
    with pytest.raises(UserInputError) as err:
        apply_expert_parallel(Holder(), _Mesh(3))
    assert str(err.value) == (
        "moe has 4 experts, which 3 expert-parallel ranks cannot split evenly: plan again "
        "with an --ep that divides the expert count"
    )


def test_an_experts_module_without_its_count_is_refused():
    model = Holder()
    model.moe.num_experts = 3
    with pytest.raises(UserInputError) as err:
        apply_expert_parallel(model, _Mesh(2))
    assert str(err.value) == (
        "moe (Experts) has no num_experts attribute equal to its 4 experts, which expert "
        "parallelism sets to the local count: add it, or plan again with --ep 1"
    )
    del model.moe.num_experts
    with pytest.raises(UserInputError, match="moe \\(Experts\\) has no num_experts"):
        apply_expert_parallel(model, _Mesh(2))


def test_a_model_without_experts_is_refused_but_a_stage_without_them_is_not():
    plain = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(UserInputError) as err:
        apply_expert_parallel(plain, _Mesh(2))
    assert str(err.value) == (
        "plan uses expert parallelism but the model has no experts module (parameters "
        "stacked per expert): plan again with --ep 1"
    )
    assert apply_expert_parallel(plain, _Mesh(2), eager_only=True) == []


def _traced_experts() -> torch.fx.GraphModule:
    """Experts as a pipeline stage's traced code holds them: a graph module with the same 3-D
    weight and bias (a graph reading both)."""
    graph = torch.fx.Graph()
    graph.output((graph.get_attr("weight"), graph.get_attr("bias")))
    return torch.fx.GraphModule(Experts(), graph)


def test_a_pipeline_stage_running_its_experts_as_traced_code_is_refused():
    model = Holder()
    model.moe = _traced_experts()
    with pytest.raises(UserInputError) as err:
        apply_expert_parallel(model, _Mesh(2), eager_only=True)
    assert str(err.value) == (
        "moe: a pipeline stage runs it as traced code, where expert parallelism cannot "
        "route tokens: plan again with --ep 1 or --pp 1"
    )


def _reference(ranks: list[int]):
    """One process: the whole experts module over the tokens of ``ranks``, each rank's loss
    sum(c * out) summed; the outputs, the tokens' and the module's gradients."""
    module = Experts()
    rows = [tokens(r) for r in ranks]
    hidden = torch.cat([h for h, _, _ in rows]).requires_grad_()
    ids = torch.cat([i for _, i, _ in rows])
    weights = torch.cat([w for _, _, w in rows]).requires_grad_()
    out = module(hidden, ids, weights)
    c = torch.cat([loss_weights(len(i)) for _, i, _ in rows])
    (out * c).sum().backward()
    return out, hidden.grad, weights.grad, {n: p.grad for n, p in module.named_parameters()}


@pytest.mark.usefixtures("gloo_one_rank")
def test_one_rank_runs_the_modules_own_forward_on_every_token():
    """At ep 1 every token stays: the dispatching forward over a (1, T, d) batch gives the
    module's own outputs (in the batch's shape), and the same gradients for the tokens, the
    routing weights and each expert parameter (DTensors sharded on dim 0 over one rank)."""
    model = Holder()
    params = apply_expert_parallel(model, _one_rank_mesh())
    assert [n for n, _ in model.moe.named_parameters()] == ["weight", "bias"]
    assert params == [model.moe.weight, model.moe.bias]
    assert all(isinstance(p, DTensor) and p.placements == (Shard(0),) for p in params)
    assert model.moe.num_experts == 4 and type(model.moe.num_experts) is int
    full = Experts()
    assert torch.equal(params[0].full_tensor(), full.weight)
    assert torch.equal(params[1].full_tensor(), full.bias)
    hidden, ids, weights = tokens(0)
    hidden = hidden.unsqueeze(0).requires_grad_()
    weights.requires_grad_()
    out = model.moe(hidden, ids.unsqueeze(0), weights.unsqueeze(0))
    assert out.shape == (1, 5, 3) and out.dtype == torch.float64
    (out[0] * loss_weights(5)).sum().backward()
    ref_out, ref_hidden, ref_weights, ref_params = _reference([0])
    torch.testing.assert_close(out[0], ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(hidden.grad[0], ref_hidden, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(weights.grad, ref_weights)
    for name, p in model.moe.named_parameters():
        torch.testing.assert_close(p.grad.full_tensor(), ref_params[name], rtol=1e-12, atol=1e-12)
    # the module's own parameters are back after the call (the local shards only stood in)
    assert model.moe.weight is params[0] and model.moe.bias is params[1]


@pytest.mark.usefixtures("gloo_one_rank")
def test_only_the_experts_modules_own_stacked_parameters_are_sharded():
    """A sub-module's parameters (a norm inside the experts module) stay as they are: they
    are not stacked per expert, and the module's own forward reads them whole."""
    model = Holder()
    model.moe.norm = nn.LayerNorm(3)
    params = apply_expert_parallel(model, _one_rank_mesh())
    assert params == [model.moe.weight, model.moe.bias]
    assert not isinstance(model.moe.norm.weight, DTensor)


@pytest.mark.usefixtures("gloo_one_rank")
def test_one_replica_divides_each_expert_gradient_by_the_data_parallel_degree():
    mesh = _one_rank_mesh()
    plain = nn.Parameter(torch.zeros(2))
    plain.grad = torch.tensor([3.0, 6.0])
    sharded = nn.Parameter(DTensor.from_local(torch.zeros(2), mesh, [Shard(0)]))
    sharded.grad = DTensor.from_local(torch.tensor([9.0, 12.0]), mesh, [Shard(0)])
    unused = nn.Parameter(torch.zeros(1))
    sync_expert_grads([plain, unused, sharded], dist.group.WORLD, 3)
    assert plain.grad.tolist() == [1.0, 2.0]
    assert sharded.grad.to_local().tolist() == [3.0, 4.0]
    assert unused.grad is None


@pytest.mark.distributed
def test_four_ranks_route_tokens_to_their_ep_groups_experts_as_one_process_does():
    """ep 2 in a (dp 2, ep 2) mesh of four gloo ranks: rank r holds experts 2 (r % 2) and
    2 (r % 2) + 1 (ids 0, 1 locally) and trades tokens with its ep peer only; each rank's
    outputs and token gradients are one process's over its ep group's tokens, its shards'
    gradients that process's for its experts (its peer's tokens' share included), and after
    sync_expert_grads the sum over its edp group (ranks r and r + 2 mod 4) over dp 4."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    cmd += [expert_ranks.__file__]
    proc = forked_ranks.run(cmd, env=worker_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = {
        d["rank"]: d for d in (json.loads(x) for x in proc.stdout.splitlines() if x[:1] == "{")
    }
    assert sorted(found) == [0, 1, 2, 3]
    groups = {g: _reference(list(g)) for g in ((0, 1), (2, 3))}
    for r, got in found.items():
        group = (0, 1) if r < 2 else (2, 3)
        out, hidden_grad, weights_grad, param_grads = groups[group]
        a = sum(len(tokens(q)[1]) for q in group if q < r)
        b = a + len(tokens(r)[1])
        e = 2 * (r % 2)
        assert got["num_experts"] == 2 and got["out_dtype"] == "torch.float64"
        assert got["placements"] == ["(Shard(dim=0),)"] * 2
        torch.testing.assert_close(torch.tensor(got["out"]).double(), out[a:b].detach())
        torch.testing.assert_close(torch.tensor(got["hidden_grad"]).double(), hidden_grad[a:b])
        torch.testing.assert_close(torch.tensor(got["weights_grad"]), weights_grad[a:b])
        for name, g in got["shard_grads"].items():
            torch.testing.assert_close(torch.tensor(g).double(), param_grads[name][e : e + 2])
        for name, g in got["synced"].items():
            both = groups[(0, 1)][3][name] + groups[(2, 3)][3][name]
            torch.testing.assert_close(torch.tensor(g).double(), both[e : e + 2] / 4)
        edp = (r % 2) + 1 + (r % 2) + 3  # ranks r % 2 and r % 2 + 2, plus one each
        assert got["synced_plain"] == [[edp / 4] * 2, None]


@pytest.mark.usefixtures("gloo_one_rank")
def test_a_bf16_module_at_ep_1_gives_its_own_forwards_bits():
    """In bfloat16 the dispatching forward's unit weights must not widen the module's
    outputs: each expert's output times 1, then times its weight and summed over the k
    experts in bfloat16, is the module's own forward bit for bit (k = 2: one rounding of two
    rounded products either way)."""
    model = Holder().to(torch.bfloat16)
    own = Experts().to(torch.bfloat16)
    apply_expert_parallel(model, _one_rank_mesh())
    hidden, ids, weights = tokens(1)
    hidden, weights = hidden.to(torch.bfloat16), weights.to(torch.bfloat16)
    with torch.no_grad():
        got = model.moe(hidden, ids, weights)
        want = own(hidden, ids, weights)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, want)


@pytest.mark.usefixtures("gloo_one_rank")
def test_the_unit_weights_are_made_on_the_tokens_device_whatever_the_default():
    """A default device other than the tokens' (a model built under ``torch.device(...)``):
    the forward still runs where its tokens are and gives the module's own outputs."""
    model = Holder()
    apply_expert_parallel(model, _one_rank_mesh())
    hidden, ids, weights = tokens(0)
    with torch.no_grad(), torch.device("meta"):
        got = model.moe(hidden, ids, weights)
    with torch.no_grad():
        want = Experts()(hidden, ids, weights)
    assert got.device.type == "cpu"
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.usefixtures("gloo_one_rank")
def test_the_output_keeps_the_hidden_dtype_when_the_weights_are_wider():
    """bfloat16 tokens routed with float32 weights: the module's own forward widens to float32
    (a bfloat16 output times a float32 weight); the dispatching forward gives the same sums,
    handed back in the tokens' bfloat16."""
    model = Holder().to(torch.bfloat16)
    own = Experts().to(torch.bfloat16)
    apply_expert_parallel(model, _one_rank_mesh())
    hidden, ids, weights = tokens(1)
    hidden = hidden.to(torch.bfloat16)
    with torch.no_grad():
        got = model.moe(hidden, ids, weights)
        want = own(hidden, ids, weights)
    assert want.dtype == torch.float32 and got.dtype == torch.bfloat16
    assert torch.equal(got, want.to(torch.bfloat16))
