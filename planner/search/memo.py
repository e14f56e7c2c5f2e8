"""What one planning run computes once and reuses across its searches (the chosen plan's and
the baselines'): an explicit object the caller owns, so nothing is cached behind its back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SearchMemo:
    # (block class, tp, micro-batch, ep, cp, variant names, cluster, training) -> options
    priced: dict = field(default_factory=dict)
    # (block class, tp, cost rates) -> the sharding ILP's variants of that class: the same for
    # every plan of one traced model, so ``planner.api.plan(solved=...)`` may carry them on
    variants: dict = field(default_factory=dict)
    # the stage MILPs' HiGHS runs kept on disk (planner.search.milp.runs.RunStore), or None:
    # solved again every time (``plan --no-cache``, and searches called without one)
    runs: Any = None
    # the candidates' split bounds and LP relaxations by their inputs' hash
    # (planner.search.bound_memo.BoundMemo), or None: computed every time
    bounds: Any = None
