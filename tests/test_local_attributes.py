"""runtime/local_attributes.py: each rank's head counts set to its own share, once per module,
never where traced code reads the gathered heads, and a plan that does not fit the model
refused in one line."""

from __future__ import annotations

import pytest
from torch import nn

from planner.errors import UserInputError
from planner.schema import BlockPlan
from runtime.local_attributes import set_local_attributes


class Attention(nn.Module):
    def __init__(self, heads: int) -> None:
        super().__init__()
        self.num_heads = heads
        self.q_proj = nn.Linear(8, 8)


class Layer(nn.Module):
    def __init__(self, heads: int) -> None:
        super().__init__()
        self.self_attn = Attention(heads)


def block(name: str, *attrs: str) -> BlockPlan:
    return BlockPlan(name, [name], 0, "none", "none", tp_local_attributes=list(attrs))


def test_each_listed_attribute_is_divided_by_the_tp_degree_once_per_module():
    root = nn.Module()
    root.layers = nn.ModuleList([Layer(8), Layer(8)])
    root.again = root.layers[1]  # one module under two paths (a stage's later call)
    blocks = [
        block("layers.0", "layers.0.self_attn.num_heads"),
        block("layers.1", "layers.1.self_attn.num_heads"),
        block("again", "again.self_attn.num_heads"),
        block("elsewhere", "stage1.self_attn.num_heads"),  # another stage's module
    ]
    applied = set_local_attributes(root, blocks, 4, [])
    assert applied == ["layers.0.self_attn.num_heads", "layers.1.self_attn.num_heads"]
    assert [layer.self_attn.num_heads for layer in root.layers] == [2, 2]


def test_an_attention_whose_projection_was_gathered_keeps_every_head():
    root = Layer(8)
    got = set_local_attributes(root, [block("", "self_attn.num_heads")], 2, ["self_attn.q_proj"])
    assert got == [] and root.self_attn.num_heads == 8


@pytest.mark.parametrize("heads", [3, "8"])
def test_a_count_the_degree_does_not_divide_is_refused_in_one_line(heads):
    root = Layer(8)
    root.self_attn.num_heads = heads
    with pytest.raises(UserInputError, match=r"self_attn.num_heads to its local count over 2"):
        set_local_attributes(root, [block("", "self_attn.num_heads")], 2, [])
