"""Tests written for mutmut's generated mutants of planner/trace/opcost.py
(benchmarks/generated_mutants.py): each product form's FLOPs by hand (2 per multiply-add, every
dimension distinct so that a wrong one shows), the backward's products per operand needing a
gradient, the grouped products' and views' names. docs/mutation.md names the mutants each test
kills."""

from __future__ import annotations

import pytest

from planner.trace.opcost import (
    backward_flops,
    forward_flops,
    is_grouped_mm,
    is_view,
    numel,
    product_operands,
)


def test_numel_is_the_product_of_the_dimensions():
    assert numel([2, 3, 5]) == 30 and numel([]) == 1 and numel((7.0,)) == 7


@pytest.mark.parametrize(
    "op, in_shapes, out, flops",
    [
        ("aten.linear.default", [[4, 5, 8], [16, 8], [16]], [4, 5, 16], 2 * 4 * 5 * 16 * 8),
        ("aten.mm.default", [[3, 7], [7, 11]], [3, 11], 2 * 3 * 11 * 7),
        ("aten.matmul.default", [[2, 3, 7], [7, 11]], [2, 3, 11], 2 * 2 * 3 * 11 * 7),
        ("aten.bmm.default", [[5, 3, 7], [5, 7, 11]], [5, 3, 11], 2 * 5 * 3 * 11 * 7),
        ("aten.mm.default", [None, [7, 11]], [3, 11], 2 * 3 * 11),  # no shape: K = 1
        ("aten.mm.default", [[], [7, 11]], [3, 11], 2 * 3 * 11),
        ("aten.addmm.default", [[11], [3, 7], [7, 11]], [3, 11], 2 * 3 * 11 * 7),
        ("aten.baddbmm.default", [[5, 3, 11], [5, 3, 7], [5, 7, 11]], [5, 3, 11],
         2 * 5 * 3 * 11 * 7),
        ("aten.addbmm.default", [[3, 11], [5, 3, 7], [5, 7, 11]], [3, 11], 2 * 5 * 3 * 11 * 7),
        ("aten.einsum.default", [[3, 7], [7, 11]], [3, 11], 0),
        # weight [out_c, in_c / groups, kh, kw]
        ("aten.conv2d.default", [[2, 3, 8, 9], [6, 3, 3, 2]], [2, 6, 6, 8],
         2 * (2 * 6 * 6 * 8) * (3 * 3 * 2)),
        # transposed: weight [in_c, out_c / groups, k]; every input element scatters
        ("aten.conv_transpose1d.input", [[2, 4, 5], [4, 3, 2]], [2, 3, 6], 2 * (2 * 4 * 5) * 6),
        ("aten.scaled_dot_product_attention.default",
         [[2, 4, 8, 16], [2, 4, 10, 16], [2, 4, 10, 32]], [2, 4, 8, 32],
         2 * 8 * 8 * 10 * 16 + 2 * 8 * 8 * 10 * 32),
        # (batch, sequence, head dim): no heads dimension
        ("aten.scaled_dot_product_attention.default", [[2, 8, 16], [2, 10, 16], [2, 10, 32]],
         [2, 8, 32], 2 * 2 * 8 * 10 * 16 + 2 * 2 * 8 * 10 * 32),
        ("aten._grouped_mm.default", [[9, 7], [4, 7, 11]], [9, 11], 2 * 9 * 11 * 7),
        ("aten._grouped_mm.default", [[4, 9, 7], [4, 7, 11]], [4, 9, 11], 2 * 4 * 9 * 11 * 7),
        ("aten._grouped_mm.default", [None, [4, 7, 11]], [9, 11], 0),
        ("aten._grouped_mm.default", [], [9, 11], 0),
        ("aten.mm.default", [[3, 7], [7, 11]], None, 0),
        ("aten.add.Tensor", [[3, 7], [3, 7]], [3, 7], 0),
    ],
)  # fmt: skip
def test_forward_flops_of_each_form(op, in_shapes, out, flops):
    assert forward_flops(op, in_shapes, out) == flops


def test_grouped_products_are_named_by_their_overload_packet():
    assert is_grouped_mm("aten._grouped_mm.default")
    assert is_grouped_mm("meshplan.grouped_mm.default")
    assert is_grouped_mm("grouped_mm.default")  # a packet of no namespace
    assert not is_grouped_mm("lib.grouped_mm")  # the packet is the second last part
    assert not is_grouped_mm("grouped_mm")
    assert not is_grouped_mm("aten.mm.grouped_mm")
    assert not is_grouped_mm("aten.mm.default")


def test_the_multiplied_operands():
    assert product_operands("aten.addmm.default") == (1, 2)
    assert product_operands("aten.baddbmm.default") == (1, 2)
    assert product_operands("aten.addbmm.default") == (1, 2)
    assert product_operands("aten.linear.default") == (0, 1)


@pytest.mark.parametrize(
    "op, fwd, needs_grad, flops",
    [
        ("aten.linear.default", 10, [True, True, True], 20),  # the bias: a reduction
        ("aten.linear.default", 10, [False, True, True], 10),
        ("aten.linear.default", 10, [True], 10),  # fewer flags than operands
        ("aten.linear.default", 10, [], 0),
        ("aten.linear.default", 0, [True, True], 0),
        ("aten.addmm.default", 10, [True, False, True], 10),
        ("aten.addmm.default", 10, [True, True, False], 10),
        ("aten.addmm.default", 10, [True, True], 10),
        ("aten.scaled_dot_product_attention.default", 10, [False, False, True], 20),
        ("aten.scaled_dot_product_attention.default", 10, [False, False, False, True], 0),
        ("aten.scaled_dot_product_attention.default", 0, [True, True, True], 0),
    ],
)
def test_backward_flops_one_product_per_operand_needing_a_gradient(op, fwd, needs_grad, flops):
    assert backward_flops(op, fwd, needs_grad) == flops


def test_views():
    assert is_view("aten.view.default") and is_view("_operator.getitem")
    assert not is_view("aten.add.Tensor") and not is_view("aten.clone.default")
