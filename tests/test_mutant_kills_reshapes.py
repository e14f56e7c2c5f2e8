"""Tests written for mutmut's generated mutants of planner/cost/reshapes.py (benchmarks/
generated_mutants.py): the eager probe's recorder run over a few ops on the meta device, each
reshape it must record (op, shapes, the column-parallel modules its input derives from) stated
by hand. docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import pytest
import torch

from planner.cost.reshapes import RESHAPE_OPS, Reshapes

META = torch.device("meta")


def test_each_reshape_is_recorded_with_what_its_input_derives_from():
    rec = Reshapes()
    with rec:
        x = torch.ones(2, 6, device=META)
        rec.mark(x, "q")
        rec.mark(x, "k")  # a second module's output too: both
        rec.mark(3, "v")  # not a tensor: nothing
        y = torch.ones(6, 2, device=META)
        rec.mark(y, "o")
        x.view(3, 4)
        (x * 2).reshape(12)  # through the product: still q and k
        x.t().reshape(12)  # not viewable: a copy, then _unsafe_view
        torch.ones(4, device=META).view(2, 2)  # derives from nothing
        first, second = torch.split(x, 3, dim=1)  # each output of a multi-output op
        second.reshape(6)
        torch.mm(x, y).view(4)  # both inputs' modules
        torch.add(x, other=torch.zeros(2, 6, device=META)).view(12)  # a keyword operand
    q_k = frozenset({"q", "k"})
    assert rec.seen == [
        ("aten.view.default", (2, 6), (3, 4), q_k),
        ("aten.view.default", (2, 6), (12,), q_k),
        ("aten._unsafe_view.default", (6, 2), (12,), q_k),
        ("aten.view.default", (4,), (2, 2), frozenset()),
        ("aten._unsafe_view.default", (2, 3), (6,), q_k),
        ("aten.view.default", (2, 2), (4,), frozenset({"q", "k", "o"})),
        ("aten.view.default", (2, 6), (12,), q_k),
    ]
    assert rec.failed == frozenset()
    assert any(t is x for t in rec._keep) and any(t is second for t in rec._keep)


def test_a_keyword_tensor_carries_its_modules():
    rec = Reshapes()
    with rec:
        w = torch.ones(2, 6, device=META)
        rec.mark(w, "up")
        torch.add(torch.zeros(2, 6, device=META), other=w).view(12)
    assert rec.seen == [("aten.view.default", (2, 6), (12,), frozenset({"up"}))]


def test_the_op_that_raises_leaves_what_its_input_derives_from():
    rec = Reshapes()
    with rec:
        plain = torch.ones(4, device=META)
        with pytest.raises(RuntimeError):
            plain.view(3)
        assert rec.failed == frozenset()
        shard = torch.ones(2, 6, device=META)
        rec.mark(shard, "attn.q_proj")
        with pytest.raises(RuntimeError):
            (shard + 1).view(5, 5)  # StableLM's view of a shard by the whole head count
    assert rec.failed == frozenset({"attn.q_proj"})
    assert rec.seen == []


def test_the_reshape_ops_are_aten_views_and_reshapes():
    assert RESHAPE_OPS == {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"}
