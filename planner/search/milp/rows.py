"""The stage MILP of milp.solve's docstring as one HiGHS model, its rows assembled with numpy.

Built straight from the StageProblem's arrays rather than through cvxpy: cvxpy's
canonicalisation cost tens of milliseconds for each new MILP shape and about ten per solve
(more than HiGHS spends on most of these MILPs), and hid the objective's constant from HiGHS,
so the cutoff and the proven bound were compared without it.

Columns, in this order (``Layout`` holds the offsets): n (J x K, stage-major, K = all options
of all segments), a (J x S), h (J), u (P x K), T (J), tmax, rmax, E, dp_first (J),
dp_second (J), X (P), Z (P), Opt, Off. The rows are those of milp.solve's docstring, one numpy
block each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner.highs import Pattern
from planner.search.milp.columns import Columns
from planner.search.milp.data import GIB, StageProblem
from planner.search.milp.split_bound import SplitBound


@dataclass(frozen=True)
class Layout(Columns):
    """Where each variable's columns start, and the MILP's dimensions."""

    J: int
    P: int
    S: int
    K: int

    def blocks(self) -> tuple[tuple[str, int], ...]:
        J, P, S, K = self.J, self.P, self.S, self.K
        return (
            ("n", J * K), ("a", J * S), ("h", J), ("u", P * K), ("T", J), ("tmax", 1),
            ("rmax", 1), ("E", 1), ("dp_first", J), ("dp_second", J), ("X", P), ("Z", P),
            ("opt", 1), ("off", 1),
        )  # fmt: skip


@dataclass
class StageModel:
    """One candidate's MILP: min cost . x + offset, row_lower <= A x <= row_upper (A: the
    entries ``values`` in ``pattern``), col_lower <= x <= col_upper, ``integer`` columns
    integral."""

    layout: Layout
    cols: np.ndarray  # first column of each segment's options within K
    cost: np.ndarray
    offset: float
    pattern: Pattern
    values: np.ndarray
    row_lower: np.ndarray
    row_upper: np.ndarray
    col_lower: np.ndarray
    col_upper: np.ndarray
    integer: np.ndarray  # bool per column

    def counts(self, x: np.ndarray) -> list[list[list[int]]]:
        """n read back as [stage][segment][option] block counts."""
        lay = self.layout
        values = np.rint(x[: lay.J * lay.K]).astype(int).reshape(lay.J, lay.K)
        return [
            [values[j, self.cols[s] : self.cols[s + 1]].tolist() for s in range(lay.S)]
            for j in range(lay.J)
        ]


class Rows:
    """Rows appended block by block as (row, column, coefficient) triplets with their bounds."""

    def __init__(self) -> None:
        self.count = 0
        self.rows: list[np.ndarray] = []
        self.cols: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []
        self.lower: list[np.ndarray] = []
        self.upper: list[np.ndarray] = []

    def add(self, lower, upper, *terms: tuple) -> None:
        """Rows lower <= sum of terms <= upper; a term is (local row, column, coefficient),
        broadcast against each other; the block's row count is len(lower)."""
        lower = np.atleast_1d(np.asarray(lower, dtype=float))
        upper = np.broadcast_to(np.asarray(upper, dtype=float), lower.shape)
        for r, c, v in terms:
            r, c, v = np.broadcast_arrays(np.asarray(r), np.asarray(c), np.asarray(v, float))
            self.rows.append(self.count + r.ravel())
            self.cols.append(c.ravel())
            self.vals.append(v.ravel())
        self.lower.append(lower)
        self.upper.append(np.array(upper))
        self.count += len(lower)


def stage_model(sp: StageProblem, keep: list[list[int]], split: SplitBound) -> StageModel:
    """The MILP of milp.solve's docstring for ``sp``, options outside ``keep`` fixed to 0 and
    split_bound's T*, S* and P* as cuts.

    Long because the row families are assembled in the order of milp.solve's docstring, one
    numpy block each, so the code reads beside the formulation."""
    inf = np.inf
    n_opts = [len(t) for t in sp.time]
    J, P, S, K = sp.pp * sp.v, sp.pp, len(sp.seg_len), sum(n_opts)
    lay = Layout(J, P, S, K)
    cat = np.concatenate
    cols = np.cumsum([0, *n_opts])
    seg_of = np.repeat(np.arange(S), n_opts)
    L = np.asarray(sp.seg_len, dtype=float)
    js, ks, ss, rs = np.arange(J), np.arange(K), np.arange(S), np.arange(P)
    rank_of = js % P
    jj, kk = np.meshgrid(js, ks, indexing="ij")  # (J, K)
    ncol = lay.n + jj * K + kk  # column of n[j, k]
    acol = lay.a + js[:, None] * S + ss[None, :]  # (J, S) column of a[j, s]
    ucol = lay.u + rs[:, None] * K + ks[None, :]  # (P, K) column of u[r, k]
    time_k = cat(sp.time)
    memco = (cat(sp.state)[None, :] + np.asarray(sp.inflight, float)[:, None] * cat(sp.act)) / GIB
    rows = Rows()
    # place: every block of each segment on some stage
    rows.add(L, L, (seg_of[kk], ncol, 1.0))
    # nonempty: every stage holds a block
    rows.add(np.ones(J), inf, (jj, ncol, 1.0))
    # has: a[j, s] <= sum_o n[j, s, o] <= L_s a[j, s]
    cell = jj * S + seg_of[kk]  # row of (j, segment of k)
    rows.add(np.full(J * S, -inf), 0.0, (cell, ncol, -1.0), (js[:, None] * S + ss, acol, 1.0))
    rows.add(np.full(J * S, -inf), 0.0, (cell, ncol, 1.0), (js[:, None] * S + ss, acol, -L))
    # h[j] >= a[j, s] for the segments holding parameters
    held = [s for s in range(S) if sp.has_params[s]]
    if held:
        hs = np.asarray(held)
        local = js[:, None] * len(hs) + np.arange(len(hs))[None, :]
        rows.add(
            np.full(J * len(hs), -inf),
            0.0,
            (local, acol[:, hs], 1.0),
            (local, lay.h + js[:, None], -1.0),
        )
    if S > 1:
        # order_a: C[j, s] - L_s a[j, s+1] >= 0 (all j), C[j, s] = blocks of s on stages <= j
        r, c, a_rows = cumulative(lay, seg_of, J, S, 0)
        rows.add(np.zeros(J * (S - 1)), inf, (r, c, 1.0), (a_rows, acol[:, 1:], -L[: S - 1]))
        if J > 1:  # order_b: C[j, s+1] + L_{s+1} a[j+1, s] <= L_{s+1} (j < J - 1)
            r, c, a_rows = cumulative(lay, seg_of, J - 1, S, 1)
            upper = np.tile(L[1:], J - 1)
            rows.add(
                np.full(len(upper), -inf), upper, (r, c, 1.0), (a_rows, acol[1:, : S - 1], L[1:])
            )
    # time: T_j - n_j . t = const_j;  tmax >= T_j
    const_time = np.asarray(sp.const_time, dtype=float)
    rows.add(const_time, const_time, (jj, ncol, -time_k[kk]), (js, lay.T + js, 1.0))
    rows.add(np.zeros(J), inf, (js, lay.tmax, 1.0), (js, lay.T + js, -1.0))
    # split cuts: sum_j T_j >= S*;  (m - 1) tmax + Opt + Off >= P* (v = 1), m rmax + Opt + Off
    # >= P* (v > 1);  tmax >= T* below
    rows.add([split.sum_stages], inf, (np.zeros(J, int), lay.T + js, 1.0))
    c_t = sp.m - 1.0 if sp.v == 1 else sp.pp - 1.0
    weighted = split.weighted_max if math.isfinite(split.weighted_max) else 0.0
    zero3 = np.zeros(3, int)
    lead, c_lead = (lay.tmax, c_t) if sp.v == 1 else (lay.rmax, float(sp.m))
    rows.add([weighted], inf, (zero3, [lead, lay.opt, lay.off], [c_lead, 1.0, 1.0]))
    # dp: dp_first_j >= n_j . k1 + k1h h_j, dp_second_j likewise, E >= their sum
    for ecol, per_opt, once in (
        (lay.dp_first, sp.dp_first, sp.dp_once[0]),
        (lay.dp_second, sp.dp_second, sp.dp_once[1]),
    ):
        rows.add(
            np.zeros(J),
            inf,
            (js, ecol + js, 1.0),
            (jj, ncol, -cat(per_opt)[kk]),
            (js, lay.h + js, -once),
        )
    first, second = lay.dp_first + js, lay.dp_second + js
    rows.add(np.zeros(J), inf, (js, lay.E, 1.0), (js, first, -1.0), (js, second, -1.0))
    # rmax >= sum of T_j over the rank's stages
    rows.add(np.zeros(P), inf, (rs, lay.rmax, 1.0), (rank_of, lay.T + js, -1.0))
    # u[r, k] L_k >= blocks running option k on rank r;  X_r >= ws_k u[r, k];  Z_r likewise
    Lcol = L[seg_of]
    rk = rs[:, None] * K + ks[None, :]
    rows.add(
        np.zeros(P * K), inf, (rk, ucol, Lcol[None, :]), (rank_of[:, None] * K + kk, ncol, -1.0)
    )
    for col, per_opt in ((lay.X, sp.ws), (lay.Z, sp.gather)):
        rows.add(
            np.zeros(P * K),
            inf,
            (rk, col + rs[:, None], 1.0),
            (rk, ucol, -cat(per_opt)[None, :] / GIB),
        )
    # memory: the rank's blocks (states + in-flight activations) + X_r + Z_r + const_r <= cap
    room = (sp.capacity - np.asarray(sp.const_mem, dtype=float)) / GIB
    rank_rows = np.broadcast_to(rank_of[:, None], (J, K))
    rows.add(
        np.full(P, -inf),
        room,
        (rank_rows, ncol, memco),
        (rs, lay.X + rs, 1.0),
        (rs, lay.Z + rs, 1.0),
    )
    if sp.step is not None:
        # the optimizer step: the rank's blocks' step states + const_r <= cap
        rows.add(np.full(P, -inf), room, (rank_rows, ncol, cat(sp.step)[kk] / GIB))
    # host memory; Opt and Off are the largest rank's optimizer and offload time
    host = cat(sp.host) / GIB
    rows.add(np.full(P, -inf), sp.host_capacity / GIB, (rank_rows, ncol, host[kk]))
    for col, per_opt in ((lay.opt, sp.optim), (lay.off, sp.offl)):
        rows.add(np.zeros(P), inf, (rs, col, 1.0), (rank_rows, ncol, -cat(per_opt)[kk]))
    pattern = Pattern.of(cat(rows.rows), cat(rows.cols), (rows.count, lay.columns))
    # bounds and integrality: n in [0, L_s] for kept options (0 otherwise), a, h, u binary
    col_lower = np.zeros(lay.columns)
    col_upper = np.full(lay.columns, inf)
    allow = np.zeros(K)
    for s in range(S):
        allow[cols[s] + np.asarray(keep[s], dtype=int)] = 1.0
    col_upper[lay.n : lay.a] = np.tile(Lcol * allow, J)
    col_upper[lay.a : lay.T] = 1.0
    col_lower[lay.tmax] = split.max_stage
    # X_r, the working set, is at least the loss's peak where the rank computes the loss
    col_lower[lay.X : lay.X + P] = np.asarray(sp.loss_mem, dtype=float) / GIB
    integer = np.zeros(lay.columns, bool)
    integer[lay.n : lay.T] = True
    # objective: v = 1: sum_j T_j + (m - 1) tmax; v > 1: m rmax + (p - 1) tmax; + E + Opt + Off
    cost = np.zeros(lay.columns)
    if sp.v == 1:
        cost[lay.T : lay.T + J] = 1.0
    else:
        cost[lay.rmax] = float(sp.m)
    cost[lay.tmax] = c_t
    cost[[lay.E, lay.opt, lay.off]] = 1.0
    return StageModel(
        lay,
        cols,
        cost,
        float(sp.const_step),
        pattern,
        cat(rows.vals),
        cat(rows.lower),
        cat(rows.upper),
        col_lower,
        col_upper,
        integer,
    )


def cumulative(lay: Layout, seg_of: np.ndarray, n_rows: int, S: int, shift: int):
    """The n terms of C[j, s + shift] for j < n_rows, s < S - 1 (row j (S - 1) + s): every
    n[j', k] with j' <= j and k an option of segment s + shift. Returns (rows, columns, the
    rows again as a (n_rows, S - 1) grid for the a terms)."""
    j_row, j_col = np.nonzero(np.arange(n_rows)[:, None] >= np.arange(lay.J)[None, :])
    ks = np.nonzero((seg_of >= shift) & (seg_of < S - 1 + shift))[0]
    r = j_row[:, None] * (S - 1) + (seg_of[ks] - shift)[None, :]
    c = lay.n + j_col[:, None] * lay.K + ks[None, :]
    grid = np.arange(n_rows)[:, None] * (S - 1) + np.arange(S - 1)[None, :]
    return r, c, grid
