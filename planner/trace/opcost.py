"""FLOPs and bytes of one traced op, from its shapes alone.

Convention (the one FlopCounterMode, Megatron and MFU reports use): ``flops`` counts the
multiply-adds of matrix products and convolutions (2 per MAC), the work that runs on tensor cores.
Element-wise, normalisation and softmax ops are counted in ``bytes`` instead: their time is set
by memory bandwidth, and the roofline uses the larger of the two.

Backward: a product ``Y = A @ B`` needs ``dA = dY @ B^T`` and ``dB = A^T @ dY``, each as many
FLOPs as the forward, but only for operands that require a gradient. Memory-bound ops read the
output gradient and what they saved and write the input gradient: about twice the forward bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MATMUL_OPS = {
    "aten.linear.default",
    "aten.matmul.default",
    "aten.mm.default",
    "aten.bmm.default",
    "aten.addmm.default",
    "aten.baddbmm.default",
    "aten.addbmm.default",
    "aten.einsum.default",
}
CONV_OPS = {
    "aten.conv1d.default",
    "aten.conv2d.default",
    "aten.conv3d.default",
    "aten.convolution.default",
    "aten.conv_transpose1d.input",
    "aten.conv_transpose2d.input",
    "aten.conv_transpose3d.input",
}
# Batch-statistics normalization; argument 5 is the ``training`` flag in each.
BATCH_NORM_OPS = {
    "aten.batch_norm.default",
    "aten.native_batch_norm.default",
    "aten._native_batch_norm_legit.default",
    "aten._native_batch_norm_legit_functional.default",
}
ATTENTION_OPS = {
    "aten.scaled_dot_product_attention.default",
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
}
# Ops that only reinterpret memory: no bytes move, nothing to compute.
VIEW_OPS = {
    "aten.view.default",
    "aten._unsafe_view.default",
    "aten.reshape.default",
    "aten.transpose.int",
    "aten.t.default",
    "aten.permute.default",
    "aten.unsqueeze.default",
    "aten.squeeze.dim",
    "aten.squeeze.default",
    "aten.expand.default",
    "aten.slice.Tensor",
    "aten.select.int",
    "aten.alias.default",
    "aten.detach.default",
    "aten.split.Tensor",
    "aten.split_with_sizes.default",
    "aten.chunk.default",
    "aten.unflatten.int",
    "aten.flatten.using_ints",
    "aten.unbind.int",
    "aten.narrow.default",
    "aten.as_strided.default",
    "aten.lift_fresh_copy.default",
    "aten._assert_tensor_metadata.default",
    "_operator.getitem",
    "aten.sym_size.int",
}


def numel(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape)


def matmul_flops(op: str, in_shapes: list[list[int] | None], out_shape: list[int]) -> int:
    """2·M·N·K for every matrix product form; K read from the operands' shapes."""
    if op == "aten.linear.default":
        k = in_shapes[0][-1]  # x[..., k] @ W[n, k]^T
    elif op in ("aten.addmm.default", "aten.baddbmm.default", "aten.addbmm.default"):
        k = in_shapes[1][-1]
    elif op == "aten.einsum.default":
        return 0  # priced by its decomposition when one is traced; see einsum_flops
    else:
        a = in_shapes[0]
        k = a[-1] if a else 1
    if op == "aten.addbmm.default":
        return 2 * numel(out_shape) * k * in_shapes[1][0]
    return 2 * numel(out_shape) * k


def conv_flops(in_shapes: list[list[int] | None], out_shape: list[int], transposed: bool) -> int:
    w = in_shapes[1]
    # weight [out_c, in_c/groups, *kernel] (or [in_c, out_c/groups, *k] when transposed)
    per_out = numel(w[1:])
    if transposed:
        # every input element scatters into out_c/groups * kernel outputs
        return 2 * numel(in_shapes[0]) * per_out
    return 2 * numel(out_shape) * per_out


def attention_flops(in_shapes: list[list[int] | None]) -> int:
    """QK^T and PV: 2 products of b·heads·s_q·s_kv·d MACs each."""
    q, k, v = in_shapes[0], in_shapes[1], in_shapes[2]
    batch_heads = numel(q[:-2])
    s_q, d = q[-2], q[-1]
    s_kv, d_v = k[-2], v[-1]
    return 2 * batch_heads * s_q * s_kv * d + 2 * batch_heads * s_q * s_kv * d_v


def is_grouped_mm(op: str) -> bool:
    """Expert layers' grouped products (torch's ``_grouped_mm``, meshplan's ``grouped_mm``,
    libraries' fallbacks of that name): rows (S, K) times per-expert weights (E, K, N), each
    row multiplied by one expert's matrix, so 2·S·K·N FLOPs whatever the routing."""
    parts = op.split(".")
    return len(parts) >= 2 and "grouped_mm" in parts[-2]


def forward_flops(op: str, in_shapes: list[list[int] | None], out_shape: list[int] | None) -> int:
    if out_shape is None:
        return 0
    if is_grouped_mm(op) and in_shapes and in_shapes[0]:
        return 2 * numel(out_shape) * in_shapes[0][-1]
    if op in MATMUL_OPS:
        return matmul_flops(op, in_shapes, out_shape)
    if op in CONV_OPS:
        return conv_flops(in_shapes, out_shape, "transpose" in op)
    if op in ATTENTION_OPS:
        return attention_flops(in_shapes)
    return 0


def product_operands(op: str) -> tuple[int, int]:
    """Positions of the two multiplied operands among an op's tensor arguments."""
    if op in ("aten.addmm.default", "aten.baddbmm.default", "aten.addbmm.default"):
        return (1, 2)
    return (0, 1)


def backward_flops(op: str, fwd: int, needs_grad: list[bool]) -> int:
    """One product per multiplied operand that needs a gradient; a bias gradient is a
    reduction, not a product. Attention: dQ, dK, dV and dP, twice the forward (model FLOPs;
    FlashAttention's recompute of the scores is hardware work the cost model adds itself)."""
    if fwd == 0:
        return 0
    if op in ATTENTION_OPS:
        return 2 * fwd if any(needs_grad[:3]) else 0
    a, b = product_operands(op)
    count = sum(1 for i in (a, b) if i < len(needs_grad) and needs_grad[i])
    return fwd * count


def is_view(op: str) -> bool:
    return op in VIEW_OPS
