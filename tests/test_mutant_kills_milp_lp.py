"""Tests written for mutmut's generated mutants of planner/search/milp/relaxation.py and
planner/search/milp/data.py (benchmarks/generated_mutants.py). The relaxation's sparse matrix is
compared with one written out densely, row by row, from its module docstring (each coefficient
distinct, so a value in the wrong row, column or sign shows); StageProblem's default loss
memory by hand. docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import numpy as np

from planner.search.milp.data import StageProblem
from planner.search.milp.relaxation import shape, values

J, P, SEG_OF = 3, 2, (0, 0, 1)  # 3 stages on 2 ranks (stages 0 and 2 share rank 0), K = 3, S = 2


def _dense(sh, data: np.ndarray) -> np.ndarray:
    pat = sh.pattern
    out = np.zeros(pat.shape)
    for col in range(pat.shape[1]):
        for at in range(pat.indptr[col], pat.indptr[col + 1]):
            out[pat.indices[at], col] = data[at]
    return out


def test_the_relaxations_rows_are_the_docstrings():
    K, S = len(SEG_OF), max(SEG_OF) + 1
    rng = np.random.default_rng(7)
    time, host, optim, offl = (rng.uniform(1, 2, K) + i for i in range(4))
    memory = rng.uniform(10, 11, (J, K))
    sh = shape(J, P, SEG_OF)
    got = _dense(sh, sh.pattern.data(values(sh, time, memory, host, optim, offl)))

    n = lambda j, k: j * K + k  # noqa: E731
    T = lambda j: J * K + j  # noqa: E731
    tmax, rmax, opt, off = J * K + J, J * K + J + 1, J * K + J + 2, J * K + J + 3
    n_ub = 2 * J + 5 * P
    want = np.zeros((n_ub + S + J, tmax + 4))
    for j in range(J):
        want[j, T(j)], want[j, tmax] = 1, -1  # T_j - tmax <= 0
        for k in range(K):
            want[J + j, n(j, k)] = -1  # -sum_k n[j, k] <= -1
    for r in range(P):
        base = 2 * J + 5 * r
        want[base, rmax] = want[base + 3, opt] = want[base + 4, off] = -1
        for j in range(r, J, P):  # the stages on rank r
            want[base, T(j)] = 1
            for k in range(K):
                want[base + 1, n(j, k)] = memory[j, k]
                want[base + 2, n(j, k)] = host[k]
                want[base + 3, n(j, k)] = optim[k]
                want[base + 4, n(j, k)] = offl[k]
    for j in range(J):
        for k in range(K):
            want[n_ub + SEG_OF[k], n(j, k)] = 1  # each segment's blocks placed once
            want[n_ub + S + j, n(j, k)] = -time[k]  # T_j - n_j . time = const_j
        want[n_ub + S + j, T(j)] = 1
    assert sh.n_ub == n_ub and (sh.J, sh.p, sh.K, sh.S) == (J, P, K, S)
    np.testing.assert_array_equal(got, want)


def test_the_relaxations_columns_in_order():
    sh = shape(J, P, SEG_OF)
    assert sh.blocks() == (("n", 9), ("T", 3), ("tmax", 1), ("rmax", 1), ("opt", 1), ("off", 1))
    assert sh.pattern.shape[1] == 9 + 3 + 4


def _stage_problem(pp: int, loss_mem=None) -> StageProblem:
    one = [np.zeros(1)]
    return StageProblem(
        pp=pp, v=1, m=1, seg_len=[1], time=one, state=one, host=one, act=one, ws=one,
        gather=one, optim=one, offl=one, has_params=[True] * pp, const_time=[0.0] * pp,
        inflight=[1.0] * pp, const_mem=[0.0] * pp, capacity=1.0, host_capacity=1.0,
        dp_first=one, dp_second=one, loss_mem=loss_mem,
    )  # fmt: skip


def test_the_loss_memory_is_zero_per_rank_unless_given():
    assert _stage_problem(3).loss_mem == [0.0, 0.0, 0.0]
    assert _stage_problem(2, [1.5, 2.5]).loss_mem == [1.5, 2.5]
