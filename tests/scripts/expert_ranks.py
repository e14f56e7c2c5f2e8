"""Run under torchrun (4 processes, gloo): expert parallelism at ep 2 on a small experts module
(runtime.expert_parallel) over a (dp 2, ep 2) mesh, so that an ep group (ranks 0 and 1, or 2
and 3) is not the world; each rank routes its own tokens, some of them to its peer's experts;
then ``sync_expert_grads`` over the edp group (ranks 0 and 2, or 1 and 3) at dp 4. Prints, as
JSON, each rank's output, its tokens' gradients, its expert shards' gradients and the
synchronised gradients, for tests/test_mutant_kills_expert_parallel.py to compare with one
process's module. The module and the tokens are defined here, and imported by that test."""

from __future__ import annotations

import json

import torch
from torch import nn

EXPERTS, WIDTH, TOP_K = 4, 3, 2


class Experts(nn.Module):
    """``num_experts`` small maps stacked along a leading expert dimension (a weight and a
    bias, both 3-D, as the planner recognises experts): a token's output is the weighted sum
    over its k experts of tanh(x W_e + b_e). The interface of transformers' ``*Experts``."""

    def __init__(self, num_experts: int = EXPERTS, width: int = WIDTH) -> None:
        super().__init__()
        self.num_experts = num_experts
        g = torch.Generator().manual_seed(0)
        self.weight = nn.Parameter(torch.randn(num_experts, width, width, generator=g).double())
        self.bias = nn.Parameter(torch.randn(num_experts, 1, width, generator=g).double())

    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        assert int(top_k_index.max()) < self.num_experts  # local ids under expert parallelism
        out = torch.zeros_like(hidden)
        for j in range(top_k_index.shape[1]):
            e = top_k_index[:, j]
            y = torch.tanh(torch.bmm(hidden.unsqueeze(1), self.weight[e]) + self.bias[e])
            out = out + y.squeeze(1) * top_k_weights[:, j : j + 1]
        return out


class Holder(nn.Module):
    """A model holding one experts module (expert_modules finds it at ``moe``)."""

    def __init__(self) -> None:
        super().__init__()
        self.moe = Experts()


# Each rank's tokens: rank 0's go mostly to experts 0 and 1 (its own), one to expert 3; rank
# 1's to all four, so each rank sends and receives a different count of rows; in the other ep
# group rank 2 sends nothing to its peer (a count of 0 for the last rank of its group).
ROUTES = {
    0: [[0, 1], [1, 0], [0, 3], [1, 0], [0, 1]],
    1: [[2, 3], [0, 2], [3, 1], [1, 2]],
    2: [[1, 0], [0, 1], [1, 0]],
    3: [[0, 1], [2, 1], [3, 0], [0, 2], [1, 3], [2, 3]],
}


def tokens(rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s hidden rows (float64), expert ids and routing weights (float32)."""
    g = torch.Generator().manual_seed(10 + rank)
    ids = torch.tensor(ROUTES[rank])
    hidden = torch.randn(len(ids), WIDTH, generator=g).double()
    weights = torch.rand(len(ids), TOP_K, generator=g) + 0.5
    return hidden, ids, weights


def loss_weights(rows: int) -> torch.Tensor:
    return torch.arange(1.0, rows * WIDTH + 1).reshape(rows, WIDTH).double() / 10


def main() -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from runtime.expert_parallel import apply_expert_parallel, sync_expert_grads

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "ep"))
    model = Holder()
    params = apply_expert_parallel(model, mesh["ep"])
    hidden, ids, weights = tokens(rank)
    hidden.requires_grad_()
    weights.requires_grad_()
    out = model.moe(hidden, ids, weights)
    (out * loss_weights(len(ids))).sum().backward()
    found = {
        "num_experts": model.moe.num_experts,
        "out": out.tolist(),
        "out_dtype": str(out.dtype),
        "hidden_grad": hidden.grad.tolist(),
        "weights_grad": weights.grad.tolist(),
        "placements": [str(p.placements) for p in params],
        "shard_grads": {n: p.grad.to_local().tolist() for n, p in model.moe.named_parameters()},
    }
    # the experts' gradients summed over the edp group and divided by dp 4 (every rank a
    # data-parallel replica); a plain gradient (rank + 1) too; a parameter without one passed over
    plain = nn.Parameter(torch.zeros(2))
    plain.grad = torch.full((2,), float(rank + 1))
    unused = nn.Parameter(torch.zeros(1))
    sync_expert_grads([*params, plain, unused], mesh["dp"].get_group(), 4)
    found["synced"] = {n: p.grad.to_local().tolist() for n, p in model.moe.named_parameters()}
    found["synced_plain"] = [plain.grad.tolist(), unused.grad]
    print(json.dumps({"rank": rank, **found}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
