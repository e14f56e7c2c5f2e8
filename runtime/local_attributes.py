"""Head counts set to each rank's own: a module whose code views by a fixed head count runs
split by heads on plain local tensors.

transformers' OPT attention (also Whisper's, PatchTST's) writes
``view(bsz, -1, self.num_heads, self.head_dim)``: on a column-parallel shard of q, which holds
``num_heads / t`` heads, the -1 would absorb the missing heads as a shorter sequence. The
planner's eager probe finds the attributes such a view reads (``planner.cost.eager_probe``)
and checks that the code with each of them divided by the TP degree views its shard by its
own heads; the plan lists them per block (``BlockPlan.tp_local_attributes``). Each rank's
module then holds its local count, as Megatron's attention holds ``heads / t`` per partition:
the user's class and code are untouched, only the instance attribute differs per rank.
"""

from __future__ import annotations

from torch import nn

from planner.errors import UserInputError
from planner.schema import BlockPlan


def set_local_attributes(
    root: nn.Module, blocks: list[BlockPlan], tp: int, gathered: list[str]
) -> list[str]:
    """Divide each planned attribute of a module in ``root`` by ``tp``; returns the paths set.

    Not where a column-parallel module inside the attribute's module had its output gathered
    (``gathered``: traced pipeline-stage code reads it whole), since that code then sees every
    head. A module reached under two paths (a stage holding a later call of it) is set once."""
    done: set[tuple[int, str]] = set()
    applied = []
    for block in blocks:
        for path in block.tp_local_attributes:
            owner, _, name = path.rpartition(".")
            try:
                module = root.get_submodule(owner)
            except AttributeError:
                continue  # another stage's module
            if (id(module), name) in done:
                continue
            if any(g == owner or g.startswith(owner + ".") for g in gathered):
                continue
            value = getattr(module, name, None)
            if type(value) is not int or value % tp:
                raise UserInputError(
                    f"plan sets {path} to its local count over {tp} ranks, but the model's "
                    f"{path} is {value!r}, not an integer {tp} divides: plan again for this model"
                )
            setattr(module, name, value // tp)
            done.add((id(module), name))
            applied.append(path)
    return applied
