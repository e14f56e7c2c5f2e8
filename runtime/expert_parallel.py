"""Expert parallelism: each rank of an ``ep`` group holds 1/ep of every mixture-of-experts
layer's experts, and routed tokens travel to their expert's rank and back with
``all_to_all_single``.

Any experts module the planner recognises (``planner.modelfile.expert_modules``: parameters that
are stacks of per-expert matrices) with the interface transformers 5 gives its ``*Experts``
modules and examples/moe.py follows: ``forward(hidden (T, d), top_k_index (T, k),
top_k_weights (T, k)) -> (T, d)`` and a ``num_experts`` attribute. The model's own router runs
unchanged; the module's own forward computes the local experts on the rows it receives
(with unit weights and local expert ids), so gating, activation and the product kernels stay
the model's. Dispatch and combine keep the routing exact and dropless: a plan with EP trains
like one process.

Expert weights become DTensors sharded along the expert dimension over the ``ep`` mesh
dimension (so checkpoints save every expert), the data-parallel wrapper leaves them alone, and
``sync_expert_grads`` averages their gradients: summed over the ranks holding the same experts
(``edp``, dp / ep of them) and divided by dp, as DP averages every other gradient.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.nn.functional import all_to_all_single as all_to_all_autograd
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from planner.errors import UserInputError
from planner.modelfile import expert_modules


def apply_expert_parallel(
    root: nn.Module, ep_mesh: DeviceMesh, eager_only: bool = False
) -> list[nn.Parameter]:
    """Shard every experts module of ``root`` over ``ep_mesh``; returns the expert parameters.
    ``eager_only``: ``root`` is a pipeline stage, whose experts must run as the model's eager
    modules (a traced stage graph has no forward to route tokens in); a stage may hold none."""
    ep = ep_mesh.size()
    found = expert_modules(root)
    if eager_only:
        from runtime.parallelize import is_traced

        for fqn in found:
            if is_traced(root.get_submodule(fqn)):
                raise UserInputError(
                    f"{fqn}: a pipeline stage runs it as traced code, where expert "
                    "parallelism cannot route tokens: plan again with --ep 1 or --pp 1"
                )
    if not found:
        if eager_only:
            return []  # a pipeline stage without experts
        raise UserInputError(
            "plan uses expert parallelism but the model has no experts module (parameters "
            "stacked per expert): plan again with --ep 1"
        )
    params: list[nn.Parameter] = []
    for fqn, info in found.items():
        module = root.get_submodule(fqn)
        total = info["num_experts"]
        if total % ep:
            raise UserInputError(
                f"{fqn} has {total} experts, which {ep} expert-parallel ranks cannot split "
                "evenly: plan again with an --ep that divides the expert count"
            )
        if getattr(module, "num_experts", None) != total:
            raise UserInputError(
                f"{fqn} ({type(module).__name__}) has no num_experts attribute equal to its "
                f"{total} experts, which expert parallelism sets to the local count: add it, "
                "or plan again with --ep 1"
            )
        names = [name for name, _ in module.named_parameters(recurse=False)]
        for name in names:
            full = getattr(module, name)
            sharded = nn.Parameter(distribute_tensor(full.detach(), ep_mesh, [Shard(0)]))
            setattr(module, name, sharded)
            params.append(sharded)
        module.num_experts = total // ep
        module.forward = _dispatching_forward(module, names, ep_mesh, total // ep)
    return params


def _dispatching_forward(
    module: nn.Module, names: list[str], ep_mesh: DeviceMesh, local: int
) -> Callable[..., torch.Tensor]:
    group = ep_mesh.get_group()
    ep = ep_mesh.size()
    own_forward = type(module).forward

    def forward(
        hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        shape = hidden.shape
        x = hidden.reshape(-1, shape[-1])
        k = top_k_index.shape[-1]
        ids = top_k_index.reshape(-1)
        dest = torch.div(ids, local, rounding_mode="floor")
        order = torch.argsort(dest, stable=True)  # rows grouped by the rank they go to
        send_counts = torch.bincount(dest, minlength=ep)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=group)
        send, recv = send_counts.tolist(), recv_counts.tolist()
        rows = x[torch.div(order, k, rounding_mode="floor")]
        got = all_to_all_autograd(x.new_empty(sum(recv), x.shape[1]), rows, recv, send, group)
        local_ids = (ids - dest * local)[order].contiguous()
        got_ids = local_ids.new_empty(sum(recv))
        dist.all_to_all_single(got_ids, local_ids, recv, send, group=group)
        ones = torch.ones(got.shape[0], 1, dtype=top_k_weights.dtype, device=got.device)
        out = _with_local_weights(module, names, own_forward, got, got_ids.unsqueeze(1), ones)
        back = all_to_all_autograd(out.new_empty(len(ids), out.shape[1]), out, send, recv, group)
        unsorted = back.new_zeros(back.shape).index_copy(0, order, back)
        weights = top_k_weights.reshape(-1, 1).to(unsorted.dtype)
        combined = (unsorted * weights).view(-1, k, unsorted.shape[1]).sum(dim=1)
        return combined.to(hidden.dtype).reshape(shape)

    return forward


def _with_local_weights(module, names, own_forward, *args) -> torch.Tensor:
    """The module's own forward over this rank's experts: its DTensor parameters stand in as
    their local shards for the call (autograd flows back through ``to_local``)."""
    saved = {n: module._parameters[n] for n in names}
    try:
        for n in names:
            module._parameters[n] = saved[n].to_local()
        return own_forward(module, *args)
    finally:
        module._parameters.update(saved)


def sync_expert_grads(params: list[nn.Parameter], edp_group, dp: int) -> None:
    """Average expert gradients like DP averages the rest: each rank's expert gradient already
    sums the contributions of its ep group's tokens; sum over the dp / ep ranks holding the same
    experts, then divide by dp. (The 0-dim parameters no data-parallel wrapper takes are
    averaged the same way, over their replicas: ``Built.sync_gradients``.)"""
    for p in params:
        if p.grad is None:
            continue
        g = p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad
        if dist.get_world_size(edp_group) > 1:
            dist.all_reduce(g, group=edp_group)
        g.div_(dp)
