"""Blocks whose code reads column-parallel outputs by their global shape run on DTensors.

A column-parallel module hands on a local shard, and model code that fixes the head count
and infers another dimension (OPT's ``view(bsz, -1, heads, head_dim)``) reads it wrongly. The
plan marks such a block's column-parallel modules ``colwise_dtensor``: their outputs stay
DTensors, so the code around them sees global shapes and DTensor runs each op sharded as the
plan priced (attention by heads, whatever its form: SDPA, or matmul, mask, softmax and
dropout). The row-parallel module closing the region takes the DTensor and returns a plain
replicated tensor. Inside the block plain tensors (masks, rotary tables) meet DTensors, so the
block runs under DTensor's implicit replication; it is safe there because every sharded
activation of the block is a DTensor, so a plain tensor is a whole one.

torch has no DTensor strategy for the CPU flash-attention kernel that SDPA runs on CPU; one is
registered here (heads or batch sharded, as torch's CUDA kernels have).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.experimental import implicit_replication, register_sharding

aten = torch.ops.aten
_registered: list[bool] = []


def _mask_placement(mask: object, d: int) -> object:
    """A mask [b|1, heads|1, q, k] follows the split of dim ``d`` unless it broadcasts there."""
    if mask is None:
        return None
    shape = getattr(mask, "shape", None)
    if shape is None or len(shape) < 4 or shape[d] == 1:
        return Replicate()
    return Shard(d)


def register_cpu_attention_sharding() -> None:
    """DTensor strategies for SDPA's CPU kernel and its backward: all replicated, or q, k, v,
    the output and the log-sum-exp split alike along batch (dim 0) or heads (dim 1)."""
    if _registered:
        return
    _registered.append(True)

    @register_sharding(aten._scaled_dot_product_flash_attention_for_cpu.default)
    def _forward(query, key, value, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):  # noqa: ANN001, ANN202
        found = [([Replicate(), Replicate()], [Replicate()] * 3 + [None, None, None, None])]
        for d in (0, 1):
            s = Shard(d)
            found.append(([s, s], [s, s, s, None, None, _mask_placement(attn_mask, d), None]))
        if attn_mask is not None:
            found[0][1][5] = Replicate()
        return found

    @register_sharding(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
    def _backward(  # noqa: ANN202
        grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask=None,  # noqa: ANN001
        scale=None,  # noqa: ANN001
    ):  # fmt: skip
        rep = [Replicate()] * 6 + [None, None, Replicate() if attn_mask is not None else None]
        found = [([Replicate()] * 3, rep + [None])]
        for d in (0, 1):
            s = Shard(d)
            found.append(([s] * 3, [s] * 6 + [None, None, _mask_placement(attn_mask, d), None]))
        return found


def run_with_implicit_replication(module: nn.Module) -> None:
    """Enter DTensor's implicit replication for every call of ``module`` (nested calls
    included) and leave it when the call returns."""
    depth: list = []

    def enter(_m: nn.Module, _args: tuple, _kwargs: dict) -> None:
        ctx = implicit_replication()
        ctx.__enter__()
        depth.append(ctx)

    def leave(_m: nn.Module, _args: tuple, _kwargs: dict, _out: object) -> None:
        if depth:
            depth.pop().__exit__(None, None, None)

    module.register_forward_pre_hook(enter, with_kwargs=True)
    module.register_forward_hook(leave, with_kwargs=True, always_call=True)
