"""HiGHS instances for the planner's LPs and MILPs (the search's stage problems and bounds, the
sharding ILP): silent, and loaded from numpy arrays."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


def quiet_highs(threads: int | None = None):
    """A silent highspy.Highs. HiGHS prints its banner from C++ to the process's stdout when
    the first instance is built, before any option can turn output off, and that line would
    land in the middle of ``plan``'s output: the first construction runs with fd 1 muted.
    ``threads``: HiGHS's option of that name (None: its default); 1 only inside
    ``one_thread``."""
    import highspy

    if not _HIGHS_BANNER_DONE:
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)
                h = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        _HIGHS_BANNER_DONE.append(True)
    else:
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    if threads is not None:
        h.setOptionValue("threads", threads)
    return h


_HIGHS_BANNER_DONE: list[bool] = []


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """HiGHS's scheduler without worker threads while the block runs (its instances made
    with ``quiet_highs(threads=1)``), and HiGHS's default one again after.

    HiGHS keeps one task scheduler per process, built by the first run with that run's
    ``threads``; its workers spin between tasks. The sharding ILP is a hundred MIPs of a few
    hundred columns per plan, solved to optimality, where that spinning was 40% of their CPU
    (on 2 cores it also took a core from the forked baselines' search); they find the same
    solutions on one thread. The search's stage MILPs keep the default scheduler: their
    bounds where the node limit stops them depend on it. Each side starts from a fresh
    scheduler (``resetGlobalScheduler`` waits for the old one's workers to stop), since an
    instance asking for another thread count than the running scheduler's fails."""
    import highspy

    highspy.Highs.resetGlobalScheduler(True)
    try:
        yield
    finally:
        highspy.Highs.resetGlobalScheduler(True)


@dataclass(frozen=True)
class Pattern:
    """Where the entries (row, column) of a sparse matrix go in its compressed-column form,
    computed once so that a matrix of this pattern is one gather and one segmented sum
    (duplicate entries add up): scipy's coo -> csc costs more than HiGHS's solve of the
    search's small LPs."""

    shape: tuple[int, int]
    order: np.ndarray  # entries sorted by (column, row)
    starts: np.ndarray  # first sorted entry of each distinct (row, column)
    indptr: np.ndarray
    indices: np.ndarray

    @classmethod
    def of(cls, rows: np.ndarray, cols: np.ndarray, shape: tuple[int, int]) -> Pattern:
        rows, cols = np.asarray(rows, np.int64), np.asarray(cols, np.int64)
        key = cols * shape[0] + rows
        order = np.argsort(key, kind="stable")
        key = key[order]
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        first = key[starts]
        indptr = np.searchsorted(first // shape[0], np.arange(shape[1] + 1)).astype(np.int32)
        return cls(shape, order, starts, indptr, (first % shape[0]).astype(np.int32))

    def data(self, values: np.ndarray) -> np.ndarray:
        """The compressed-column values of the matrix whose entries are ``values``."""
        return np.add.reduceat(np.asarray(values, dtype=float)[self.order], self.starts)


def pass_model(
    h,
    cost: np.ndarray,
    pattern: Pattern,
    values: np.ndarray,
    row_lower: np.ndarray,
    row_upper: np.ndarray,
    col_lower: np.ndarray,
    col_upper: np.ndarray,
    integer: np.ndarray | None = None,
    offset: float = 0.0,
) -> None:
    """Load min cost . x + offset, row_lower <= A x <= row_upper, col_lower <= x <= col_upper
    (``integer`` columns integral) into ``h``, A of ``pattern`` with entries ``values``;
    numpy's infinities become HiGHS's."""
    import highspy

    inf = highspy.kHighsInf

    def finite(x) -> np.ndarray:
        return np.clip(np.asarray(x, dtype=float), -inf, inf)

    n_rows, n_cols = pattern.shape
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n_cols, n_rows
    lp.offset_ = float(offset)
    lp.col_cost_ = np.asarray(cost, dtype=float)
    lp.col_lower_, lp.col_upper_ = finite(col_lower), finite(col_upper)
    lp.row_lower_, lp.row_upper_ = finite(row_lower), finite(row_upper)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = pattern.indptr
    lp.a_matrix_.index_ = pattern.indices
    lp.a_matrix_.value_ = pattern.data(values)
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = n_cols, n_rows
    if integer is not None:
        kinds = (highspy.HighsVarType.kContinuous, highspy.HighsVarType.kInteger)
        lp.integrality_ = [kinds[int(i)] for i in integer]
    h.passModel(lp)
