"""A grouped matrix product for mixture-of-experts layers: rows of ``x`` sorted by expert, each
group multiplied by its expert's weight.

Why an op of our own: a dropless expert layer's per-expert row counts depend on the data, so
eager code that splits by them (``.tolist()``, ``nonzero``) cannot be traced on the meta device,
and torch's ``_grouped_mm`` runs on the CPU for bf16 only. Registered as a custom op, its shapes
are static (rows in, rows out), ``torch.export`` records it as one node whose FLOPs the planner
counts (2 * rows * K * N), and it runs on any device in any dtype. The kernels are a loop over
experts: correct everywhere, fast nowhere; on a GPU, bf16 inputs take torch's ``_grouped_mm``.

    y = grouped_mm(x, w, offsets)   # x (S, K) sorted by expert, w (E, K, N), offsets (E,) int:
                                    # cumulative row ends, rows offsets[e-1]:offsets[e] use w[e]
"""

from __future__ import annotations

import torch

_NAME = "meshplan::grouped_mm"


def _bounds(offsets: torch.Tensor) -> list[tuple[int, int]]:
    ends = [int(e) for e in offsets.tolist()]
    starts = [0, *ends[:-1]]
    return list(zip(starts, ends))


def _forward(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    if x.is_cuda and x.dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm"):
        return torch._grouped_mm(x, w, offs=offsets.to(torch.int32))
    out = x.new_zeros(x.shape[0], w.shape[-1])
    for e, (lo, hi) in enumerate(_bounds(offsets)):
        if hi > lo:
            out[lo:hi] = x[lo:hi] @ w[e]
    return out


def _weight_grad(x: torch.Tensor, g: torch.Tensor, offsets: torch.Tensor, experts: int):
    dw = x.new_zeros(experts, x.shape[1], g.shape[1])
    for e, (lo, hi) in enumerate(_bounds(offsets)):
        if hi > lo:
            dw[e] = x[lo:hi].T @ g[lo:hi]
    return dw


if not hasattr(torch.ops, "meshplan") or not hasattr(torch.ops.meshplan, "grouped_mm"):

    @torch.library.custom_op(_NAME, mutates_args=())
    def _grouped_mm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return _forward(x, w, offsets)

    @_grouped_mm.register_fake
    def _(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return x.new_empty(x.shape[0], w.shape[-1])

    def _setup(ctx, inputs, output) -> None:
        x, w, offsets = inputs
        ctx.save_for_backward(x, w, offsets)

    def _backward(ctx, g: torch.Tensor):
        x, w, offsets = ctx.saved_tensors
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = torch.ops.meshplan.grouped_mm(g, w.transpose(1, 2).contiguous(), offsets)
        if ctx.needs_input_grad[1]:
            dw = _weight_grad(x, g, offsets, w.shape[0])
        return dx, dw, None

    _grouped_mm.register_autograd(_backward, setup_context=_setup)


def grouped_mm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``x`` (S, K) with rows sorted by expert, ``w`` (E, K, N), ``offsets`` (E,) cumulative row
    ends -> (S, N)."""
    return torch.ops.meshplan.grouped_mm(x, w, offsets)
