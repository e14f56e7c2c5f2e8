"""Brute force over the stage MILP's discrete space, under the same cost model.

Every contiguous split of the blocks into pp * v non-empty stages, times every option per block,
priced by ``costmodel.evaluate``. Exponential: for tests on small instances only, where its
optimum must equal the MILP's.
"""

from __future__ import annotations

import itertools
import math

from planner.cost.records import Config, CostInputs, StepCost
from planner.cost.step import evaluate
from planner.schema.mesh import Mesh


def splits(n_blocks: int, n_stages: int):
    """Stage index per block for every contiguous split into n_stages non-empty stages."""
    for cuts in itertools.combinations(range(1, n_blocks), n_stages - 1):
        bounds = (0, *cuts, n_blocks)
        yield [s for s in range(n_stages) for _ in range(bounds[s + 1] - bounds[s])]


def every_config(
    inp: CostInputs,
    mesh: Mesh,
    micro_batch_size: int,
    schedule: str,
    virtual_stages: int,
    zero: int,
):
    """(Config, StepCost) of every contiguous split and option choice, feasible or not."""
    n = len(inp.blocks)
    for stage_of in splits(n, mesh.pp * virtual_stages):
        for choice in itertools.product(*(range(len(o)) for o in inp.options)):
            cfg = Config(
                mesh, micro_batch_size, schedule, virtual_stages, zero, stage_of, list(choice)
            )
            yield cfg, evaluate(inp, cfg)


def brute_force(
    inp: CostInputs,
    mesh: Mesh,
    micro_batch_size: int,
    schedule: str,
    virtual_stages: int,
    zero: int,
) -> tuple[float, Config | None, StepCost | None]:
    best: tuple[float, Config | None, StepCost | None] = (math.inf, None, None)
    for cfg, cost in every_config(inp, mesh, micro_batch_size, schedule, virtual_stages, zero):
        if cost.feasible and cost.step_time_s < best[0]:
            best = (cost.step_time_s, cfg, cost)
    return best
