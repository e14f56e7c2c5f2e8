"""A small MIP for the tests of HiGHS's task scheduler (test_forked_search, test_highs_one_thread):
they run it in fresh interpreters, which import it from here (the tests folder on PYTHONPATH)."""

from __future__ import annotations

import highspy
import numpy as np

from planner.highs import quiet_highs


def knapsack(threads: int | None = None) -> highspy.Highs:
    """A knapsack-like MIP of 40 binaries and 20 rows, built and not run: a few hundred
    branch-and-bound nodes, so HiGHS's scheduler is used. ``threads``: quiet_highs'."""
    h = quiet_highs(threads)
    n = 40
    rng = np.random.default_rng(0)
    for _ in range(n):
        h.addVar(0, 1)
    idx = np.arange(n, dtype=np.int32)
    h.changeColsIntegrality(n, idx, np.array([highspy.HighsVarType.kInteger] * n))
    h.changeColsCost(n, idx, -rng.random(n))
    for _ in range(20):
        cols = rng.choice(n, 8, replace=False).astype(np.int32)
        h.addRow(-np.inf, 2.5, 8, cols, rng.random(8))
    return h
