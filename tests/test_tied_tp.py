"""A tied weight under tensor parallelism (runtime.parallelize.retie): parallelize_module
distributes each holder's weight on its own, so a vocabulary-parallel embedding and the head
that shares its weight come out as two DTensors; retie makes them one tensor again, points an
alias no style touched at it too, and refuses holders split differently with one line. Runs in
a child process on torch's fake process group (two ranks' layout), so no process group is left
behind in the test session."""

from __future__ import annotations

import pytest
from conftest import run_on_fake_pg

pytestmark = pytest.mark.distributed

CHILD = r"""
from torch import nn
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from planner.errors import UserInputError
from runtime.parallelize import retie
from runtime.tied import tied_groups


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(8, 4)
        self.head = nn.Linear(4, 8)
        self.head.weight = self.embed.weight
        self.bias = self.head.bias  # held, never read (BERT's head bias in its parent)


def run(head_style):
    model = Tied()
    ties = tied_groups(model)
    styles = {"embed": RowwiseParallel(input_layouts=Replicate()), "head": head_style}
    parallelize_module(model, mesh, styles)
    split_apart = model.embed.weight is not model.head.weight
    retie(model, ties)
    return model, split_apart


out = {}
model, out["split_apart"] = run(ColwiseParallel(output_layouts=Replicate()))
out["one_tensor"] = model.embed.weight is model.head.weight
out["placements"] = repr(model.head.weight.placements)
out["alias"] = model.bias is model.head.bias and isinstance(model.bias, DTensor)
out["groups"] = sorted(tied_groups(model))
try:
    run(RowwiseParallel())  # the head split along the other dimension
    out["error"] = None
except UserInputError as e:
    out["error"] = str(e)
"""


def test_retie_keeps_one_tensor_and_refuses_two_layouts():
    out = run_on_fake_pg(CHILD)
    assert out["split_apart"]  # what parallelize_module leaves: two DTensors
    assert out["one_tensor"]
    assert out["placements"] == "(Shard(dim=0),)"
    assert out["alias"]  # the untouched holder points at the head's sharded bias
    assert out["groups"] == ["bias", "embed.weight"]  # both ties one tensor each
    assert out["error"] and "\n" not in out["error"]
    assert "tied weight embed.weight" in out["error"] and "--tp 1" in out["error"]
