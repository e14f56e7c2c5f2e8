"""Tests written for mutmut's generated mutants of runtime/local_attributes.py (each rank's head
counts set to its own share; benchmarks/generated_mutants.py), beside
tests/test_local_attributes.py. One process, modules written here. docs/mutation.md names the
mutants each test kills."""

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
        self.num_kv = heads // 2
        self.q_proj = nn.Linear(4, 4)


def _root() -> nn.Module:
    root = nn.Module()
    root.self_attn = Attention(8)
    root.self_attn_2 = Attention(8)
    root.mlp = nn.Linear(4, 4)
    return root


def _block(*attrs: str) -> BlockPlan:
    return BlockPlan("b", ["b"], 0, "none", "none", tp_local_attributes=list(attrs))


def test_another_stages_module_first_does_not_stop_the_rest():
    """A path whose module this rank lacks is passed over, and the ones after it (in the
    block and in later blocks) still set: integers, two attributes of one module each."""
    root = _root()
    blocks = [
        _block("stage1.self_attn.num_heads", "self_attn.num_heads"),
        _block("self_attn.num_kv"),
    ]
    assert set_local_attributes(root, blocks, 2, []) == ["self_attn.num_heads", "self_attn.num_kv"]
    assert (root.self_attn.num_heads, root.self_attn.num_kv) == (4, 2)
    assert type(root.self_attn.num_heads) is int and type(root.self_attn.num_kv) is int


def test_only_a_gathered_module_inside_the_owner_or_the_owner_itself_keeps_the_heads():
    """Gathered modules elsewhere (a sibling whose name starts with the owner's, the MLP)
    leave the owner's count divided; the owner gathered whole keeps its count."""
    root = _root()
    gathered = ["self_attn_2.q_proj", "mlp"]
    got = set_local_attributes(root, [_block("self_attn.num_heads")], 4, gathered)
    assert got == ["self_attn.num_heads"] and root.self_attn.num_heads == 2
    root = _root()
    got = set_local_attributes(root, [_block("self_attn_2.num_heads")], 4, ["self_attn_2"])
    assert got == [] and root.self_attn_2.num_heads == 8


def test_a_top_level_attribute_of_the_root_is_set():
    root = _root()
    root.heads = 6
    assert set_local_attributes(root, [_block("heads")], 3, []) == ["heads"]
    assert root.heads == 2


@pytest.mark.parametrize("value", [None, True, 8.0])
def test_a_missing_or_non_integer_count_is_refused_by_its_value(value):
    root = _root()
    if value is None:
        del root.self_attn.num_heads
    else:
        root.self_attn.num_heads = value
    with pytest.raises(UserInputError) as err:
        set_local_attributes(root, [_block("self_attn.num_heads")], 2, [])
    assert str(err.value) == (
        f"plan sets self_attn.num_heads to its local count over 2 ranks, but the model's "
        f"self_attn.num_heads is {value!r}, not an integer 2 divides: plan again for this model"
    )


def test_a_path_passed_over_does_not_stop_the_blocks_next_one():
    """In one block: a module already set under another path, then one whose projection was
    gathered, then one to set: only the last is set (and the first, once)."""
    root = _root()
    root.again = root.self_attn
    block = _block(
        "self_attn.num_heads", "again.num_heads", "self_attn_2.num_heads", "self_attn.num_kv"
    )
    got = set_local_attributes(root, [block], 2, ["self_attn_2.q_proj"])
    assert got == ["self_attn.num_heads", "self_attn.num_kv"]
    assert (root.self_attn.num_heads, root.self_attn.num_kv, root.self_attn_2.num_heads) == (
        4,
        2,
        8,
    )
