"""Context parallelism: each rank of a ``cp`` group holds 1/cp of every sequence, and attention
runs as a ring (torch's ``context_parallel``): keys and values travel around the group while
each rank attends its own queries.

torch's ring attention replaces fused attention ops (``scaled_dot_product_attention`` with
``is_causal`` or no mask), so the planner offers CP only for models whose attention is one
such op per layer, and the runtime passes each token's global position (``position_ids``)
because a rank's chunk no longer starts at position 0.

On the CPU, SDPA dispatches to ``_scaled_dot_product_flash_attention_for_cpu``, which torch
2.13's ring-attention table (CUDA's flash, efficient and cuDNN kernels only) does not list:
``enable_cpu_ring_attention`` adds the CPU kernel to that table with torch's own ring
templates, so the same code path runs (and is tested) on CPU/gloo. Causal load balancing is
off: it reorders the tokens of a chunk, and transformers reads reordered ``position_ids`` as
packed sequences and builds a mask, which ring attention cannot take; without it the last
rank does the most causal work: (2cp - 1)/cp of the mean, which the cost model prices.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from planner.errors import UserInputError

aten = torch.ops.aten
SEQ_DIM_OF_ATTENTION = 2  # (batch, heads, sequence, head dim)


def check_model(model: nn.Module) -> None:
    """The model must take ``position_ids`` (its chunk's positions are not 0..s/cp)."""
    params = inspect.signature(model.forward).parameters
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if "position_ids" not in params and not takes_kwargs:
        raise UserInputError(
            f"context parallelism passes each token's position as position_ids, which "
            f"{type(model).__name__}.forward does not take: plan again with --cp 1"
        )


def enable_cpu_ring_attention() -> None:
    """Register the CPU flash-attention kernel with torch's ring attention (see the module
    docstring); idempotent, and a no-op where torch already lists it."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp

    forward = aten._scaled_dot_product_flash_attention_for_cpu.default
    backward = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    if forward in cp.custom_ops:
        return

    def shard(tensors, mesh: DeviceMesh) -> tuple:
        return tuple(
            DTensor.from_local(t, mesh, [Shard(SEQ_DIM_OF_ATTENTION)], run_check=False)
            for t in tensors
        )

    def ring_forward(_op, args, kwargs):
        q, k, v = args[:3]
        dropout = args[3] if len(args) > 3 else kwargs.get("dropout_p", 0.0)
        causal = args[4] if len(args) > 4 else kwargs.get("is_causal", False)
        if kwargs.get("attn_mask") is not None:
            raise UserInputError(
                "context parallelism runs causal or unmasked attention only, and this model "
                "passes an attention mask: plan again with --cp 1"
            )
        mesh = q.device_mesh
        out, lse = cp._templated_ring_attention(
            mesh.get_group(),
            SEQ_DIM_OF_ATTENTION,
            forward,
            q.to_local(),
            k.to_local(),
            v.to_local(),
            is_causal=causal,
            dropout_p=dropout,
            scale=kwargs.get("scale"),
        )
        return shard((out, lse), mesh)

    def ring_backward(_op, args, kwargs):
        grad, q, k, v, out, lse, dropout, causal = args[:8]
        mesh = q.device_mesh
        grads = cp._templated_ring_attention_backward(
            mesh.get_group(),
            SEQ_DIM_OF_ATTENTION,
            backward,
            grad_out=grad.to_local(),
            grad_out_name="grad_out",
            query=q.to_local(),
            key=k.to_local(),
            value=v.to_local(),
            out=out.to_local(),
            logsumexp=lse.to_local(),
            is_causal=causal,
            dropout_p=dropout,
            scale=kwargs.get("scale"),
        )
        return shard(grads[:3], mesh)

    cp.custom_ops[forward] = ring_forward
    cp.custom_ops[backward] = ring_backward


@contextlib.contextmanager
def sequence_chunks(
    cp_mesh: DeviceMesh, inputs: tuple, targets: torch.Tensor
) -> Iterator[tuple[tuple, dict, torch.Tensor]]:
    """Inside: this rank's chunk of the inputs and targets (split along dim 1, the sequence)
    and ``{"position_ids": ...}`` for the model; attention runs as a ring."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._context_parallel import _attention

    _attention._cp_options.enable_load_balance = False  # see the module docstring
    if cp_mesh.device_type == "cpu":
        enable_cpu_ring_attention()
    b, s = targets.shape[0], targets.shape[1]
    positions = torch.arange(s, device=targets.device).expand(b, s).contiguous()
    buffers = [t.clone() for t in inputs] + [targets.clone(), positions]
    with context_parallel(
        cp_mesh,
        buffers=buffers,
        buffer_seq_dims=[1] * len(buffers),
        no_restore_buffers=set(buffers),
    ):
        n = len(inputs)
        yield tuple(buffers[:n]), {"position_ids": buffers[n + 1]}, buffers[n]
