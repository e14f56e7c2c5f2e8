"""The LP that bounds.relaxed_bound solves, assembled from a sparsity pattern computed once
per shape (stages, ranks, the segment of each option column): hundreds of candidates share a
few dozen shapes, and only the coefficients change between them.

Columns: n[j, k] at j K + k (fractional blocks of option k on stage j, J K of them), then T_j
(J), tmax, rmax, opt, off. Rows: [0, J) T_j - tmax <= 0; [J, 2J) -sum_k n[j, k] <= -1
(nonempty); per rank r at 2J + 5r + (0..4): sum_{j on r} T_j - rmax <= 0, memory, host,
optimizer - opt <= 0, offload - off <= 0; then the equalities: each segment's blocks placed
once, T_j - n_j . time = const_j.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from planner.highs import Pattern
from planner.search.milp.columns import Columns


@dataclass(frozen=True)
class Shape(Columns):
    """The LP's rows and columns for J stages on p ranks, option column k in segment
    seg_of[k]."""

    J: int
    p: int
    K: int
    S: int
    pattern: Pattern
    n_ub: int  # rows before the equalities

    def blocks(self) -> tuple[tuple[str, int], ...]:
        J, K = self.J, self.K
        return (("n", J * K), ("T", J), ("tmax", 1), ("rmax", 1), ("opt", 1), ("off", 1))


@lru_cache(maxsize=256)
def shape(J: int, p: int, seg_of: tuple[int, ...]) -> Shape:
    """The pattern of the module docstring's rows, entries in the order ``values`` gives."""
    K, S = len(seg_of), max(seg_of) + 1
    js, rs = np.arange(J), np.arange(p)
    ncol = (js[:, None] * K + np.arange(K)[None, :]).ravel()
    T, tmax = J * K, J * K + J
    base = 2 * J + 5 * (js % p)  # first row of each stage's rank
    n_ub = 2 * J + 5 * p
    entries = [
        (js, T + js),
        (js, np.full(J, tmax)),
        (np.repeat(J + js, K), ncol),
        (base, T + js),
        (2 * J + 5 * rs, np.full(p, tmax + 1)),
        (np.repeat(base + 1, K), ncol),
        (np.repeat(base + 2, K), ncol),
        (np.repeat(base + 3, K), ncol),
        (2 * J + 5 * rs + 3, np.full(p, tmax + 2)),
        (np.repeat(base + 4, K), ncol),
        (2 * J + 5 * rs + 4, np.full(p, tmax + 3)),
        (n_ub + np.tile(np.asarray(seg_of), J), ncol),
        (n_ub + S + np.repeat(js, K), ncol),
        (n_ub + S + js, T + js),
    ]
    rows = np.concatenate([r for r, _ in entries])
    cols = np.concatenate([c for _, c in entries])
    pattern = Pattern.of(rows, cols, (n_ub + S + J, tmax + 4))
    return Shape(J, p, K, S, pattern, n_ub)


def values(
    sh: Shape,
    time: np.ndarray,
    memory: np.ndarray,
    host: np.ndarray,
    optim: np.ndarray,
    offl: np.ndarray,
) -> np.ndarray:
    """The entries of ``shape``'s rows in its order: per option column ``time``, ``host``,
    ``optim``, ``offl`` (K,) and the stage's memory coefficient ``memory`` (J, K)."""
    J, p = sh.J, sh.p
    ones_j, ones_p, ones_jk = np.ones(J), np.ones(p), np.ones(J * sh.K)
    return np.concatenate(
        [
            ones_j,
            -ones_j,
            -ones_jk,
            ones_j,
            -ones_p,
            memory.ravel(),
            np.tile(host, J),
            np.tile(optim, J),
            -ones_p,
            np.tile(offl, J),
            -ones_p,
            ones_jk,
            np.tile(-time, J),
            ones_j,
        ]
    )
