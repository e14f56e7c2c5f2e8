"""Exact bounds over contiguous splits of the blocks into pipeline stages (a dynamic program).

The stage MILP's LP relaxation spreads blocks and options fractionally over stages, so on deep
pipelines its max stage time T_max sits well below what any integer split reaches: with 80
layers on 8 stages under 1F1B, the first stage holds 8 micro-batches of activations and must
recompute, which the relaxation averages away over all stages. A dynamic program over where
each stage starts, pricing each stage with its own memory, closes that part of the gap.

Stage j (chunks in model order, j = 0..J-1, J = pp * v, rank r = j mod pp) holds a contiguous,
nonempty range of blocks [a, b) (the MILP's ``order`` and ``nonempty`` rows); c_s(a, b) of them
come from segment s. Its least time per micro-batch, options chosen fractionally, is the LP

    tau_j(a, b) = c_j + min  sum_{s,o} n_so t_so
                  s.t.       sum_o n_so = c_s(a, b),  n >= 0
                             sum_{s,o} n_so w_jso <= W_j(a, b)

with w_jso = state_so + inflight_j act_so (the MILP's memory row) and W_j(a, b) = capacity -
const_mem_r - max(loss_r, max_{s: c_s > 0} min_o ws_so) - max_{s: c_s > 0} min_o gather_so
(the working-set and gathered-buffer terms are at least the least one of any segment present,
the working set at least the loss where the stage computes it). Its Lagrangian dual is exact
(an LP): tau_j(a, b) = c_j + max_{l >= 0} [sum_s c_s g_s(l) - l W_j(a, b)], with
g_s(l) = min_o (t_so + l w_jso) concave and piecewise linear, so the maximum lies at l = 0 or
at a breakpoint of some g_s, a finite set. A range whose least memory sum_s c_s min_o w_jso
exceeds W_j cannot run on stage j: tau = inf. (Host memory and the other chunks a rank holds
under interleaving are dropped: a relaxation, still a bound.)

Then the least achievable max_j T_j and sum_j T_j over splits:

    F_0(b) = tau_0(0, b),      F_j(b) = min_{j <= a < b} max(F_{j-1}(a), tau_j(a, b)),
    S_0(b) = tau_0(0, b),      S_j(b) = min_{j <= a < b} S_{j-1}(a) + tau_j(a, b),
    T* = F_{J-1}(N),           S* = S_{J-1}(N).

Every MILP placement is such a split with T_j >= tau_j, so T_max >= T* and sum_j T_j >= S*.

With v = 1 (rank r = stage j), the same LP with each option costing (m - 1) t_so + optim_so +
offl_so instead of t_so gives psi_j(a, b), the least (m - 1) T_j + Opt_j + Off_j stage j can
have, and P* = min over splits of max_j psi_j (the F recurrence on psi). Since Opt and Off are
maxima over ranks, (m - 1) T_max + Opt + Off >= (m - 1) T_j + Opt_j + Off_j for every j, so
(m - 1) T_max + Opt + Off >= P*, and the step time
    sum_j T_j + (m - 1) T_max + E + Opt + Off + K >= S* + P* + K      (E >= 0).
This is what prunes deep 1F1B pipelines: the stage that must recompute or offload to hold its
in-flight micro-batches is priced as it must run, not averaged over all stages.

All three are cuts the MILP carries (tmax >= T*, sum T >= S*, (m - 1) tmax + Opt + Off >= P*):
every placement satisfies them, and its relaxation starts at the integer split's level. With
one stage there is one range, which the MILP's own relaxation already prices: no cut.

Cost: a range's price depends only on its count vector (c_s), a few hundred distinct ones for a
transformer against N^2 ranges, each priced at the envelopes' breakpoints; then J steps of the
recurrence over an (N+1) x (N+1) array: tens of milliseconds for 80 layers on 16 stages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner.search.milp.data import GIB, StageProblem


@dataclass(frozen=True)
class SplitBound:
    max_stage: float  # T*: no placement's max_j T_j is lower
    sum_stages: float  # S*: no placement's sum_j T_j is lower
    # P*: no placement's (m - 1) T_max + Opt + Off (v = 1), or m R_max + Opt + Off (v > 1,
    # interleaved), is lower; inf when not computed
    weighted_max: float = math.inf

    @property
    def feasible(self) -> bool:
        return math.isfinite(self.max_stage)

    def step_bound(self, sp: StageProblem) -> float:
        """A lower bound on the MILP's objective from the cuts (0 when P* is not defined):
        v = 1: S* + P* + const_step; v > 1: P* + (p - 1) T* + const_step."""
        if not math.isfinite(self.weighted_max):
            return 0.0
        if sp.v == 1:
            return self.sum_stages + self.weighted_max + sp.const_step
        return self.weighted_max + (sp.pp - 1) * self.max_stage + sp.const_step


def split_bound(sp: StageProblem) -> SplitBound:
    """T*, S* and P* of the module docstring (inf when no split fits in memory)."""
    n = sum(sp.seg_len)
    stages = sp.pp * sp.v
    if n < stages:
        return SplitBound(math.inf, math.inf)
    if stages == 1:  # one range: the MILP's own relaxation already prices it
        return SplitBound(0.0, 0.0, 0.0)
    counts = range_counts(sp.seg_len)
    empty = np.tril(np.ones((n + 1, n + 1), bool))  # a >= b: no block, not a stage
    taus = []
    for j in range(stages):
        tau = stage_costs(sp, j, counts, 1.0, 0.0)
        tau[empty] = math.inf
        taus.append(tau)
    max_stage, sum_stages = _min_max(taus, n), _min_sum(taus, n)
    weighted = math.inf
    if math.isfinite(max_stage):
        alpha = sp.m - 1.0 if sp.v == 1 else float(sp.m)
        psis = []
        for j in range(stages):
            psi = stage_costs(sp, j, counts, alpha, 1.0)
            psi[empty] = math.inf
            psis.append(psi)
        weighted = _min_max(psis, n) if sp.v == 1 else _rank_max(psis, n, sp.pp)
    return SplitBound(max_stage, sum_stages, weighted)


def _rank_max(costs: list[np.ndarray], n: int, p: int, rounds: int = 40) -> float:
    """A lower bound on min over splits of max_r sum_{j = r mod p} costs[j][a_j, a_{j+1}]: the
    interleaved P*, where rank r holds chunks r, r + p, ... For weights w on the simplex,
    max_r X_r >= sum_r w_r X_r, so min over splits of the weighted sum (the S recurrence on
    w_{j mod p} costs[j]) is a bound for every w; their best is sought by projected
    subgradient ascent (the weighted minimum is concave in w, and the minimizing split's
    per-rank sums are a supergradient). Any w gives a valid bound; the ascent only tightens it."""
    w = np.full(p, 1.0 / p)
    best = -math.inf
    step = None
    # the stages' costs as one array, each weighted by its rank's weight in one product per
    # round (the same products as stage by stage, which took three numpy calls a stage)
    stacked = np.stack(costs)
    infinite = np.isinf(stacked)
    negative = bool(np.isneginf(stacked).any())  # -inf is written inf, as stage by stage
    rank_of = np.arange(len(costs)) % p
    for _ in range(rounds):
        with np.errstate(invalid="ignore"):  # inf * 0 where a rank's weight is 0
            weighted = stacked * w[rank_of][:, None, None]
        if negative or not w.all():  # that nan is an infinite cost: it stays inf
            weighted[infinite] = math.inf
        value, per_rank = _min_sum_ranks(weighted, costs, n, p)
        if not math.isfinite(value):
            return value  # no split fits at all: the candidate is infeasible
        best = max(best, value)
        spread = per_rank - per_rank.mean()
        if np.allclose(spread, 0.0, atol=1e-12 * max(1.0, abs(value))):
            break  # balanced: uniform w's bound is max_r X_r of this split itself
        step = step or 1.0 / max(per_rank.max() - per_rank.min(), 1e-300)
        w = _project_simplex(w + step * spread)
        step *= 0.85
    return best


def _min_sum_ranks(
    weighted: list[np.ndarray] | np.ndarray, costs: list[np.ndarray], n: int, p: int
) -> tuple[float, np.ndarray]:
    """min over splits of sum_j weighted[j][a_j, a_{j+1}], and the minimizing split's per-rank
    sums of the unweighted costs (the supergradient _rank_max follows)."""
    best = weighted[0][0].copy()
    arg = []
    columns = np.arange(len(best))
    for cost in weighted[1:]:
        total = best[:, None] + cost
        arg.append(total.argmin(axis=0))
        best = total[arg[-1], columns]  # the minimum: the entry argmin points at
    value = float(best[n])
    per_rank = np.zeros(p)
    if not math.isfinite(value):
        return value, per_rank
    b = n
    for j in range(len(weighted) - 1, 0, -1):
        a = int(arg[j - 1][b])
        per_rank[j % p] += costs[j][a, b]
        b = a
    per_rank[0] += costs[0][0, b]
    return value, per_rank


def _project_simplex(v: np.ndarray) -> np.ndarray:
    """The Euclidean projection of v onto {w >= 0, sum w = 1} (sort-based)."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1.0
    k = np.arange(1, len(v) + 1)
    rho = np.nonzero(u - css / k > 0)[0][-1]
    return np.maximum(v - css[rho] / (rho + 1), 0.0)


def _min_max(costs: list[np.ndarray], n: int) -> float:
    """min over splits of max_j costs[j][a_j, a_{j+1}] (the F recurrence)."""
    best = costs[0][0].copy()
    for cost in costs[1:]:
        best = np.maximum(best[:, None], cost).min(axis=0)
    return float(best[n])


def _min_sum(costs: list[np.ndarray], n: int) -> float:
    """min over splits of sum_j costs[j][a_j, a_{j+1}] (the S recurrence)."""
    return _min_sum_ranks(costs, costs, n, 1)[0]


def stage_costs(
    sp: StageProblem, j: int, counts: tuple[np.ndarray, np.ndarray], alpha: float, beta: float
) -> np.ndarray:
    """Least alpha T_j + beta (Opt_j + Off_j) of stage j over every range [a, b), options
    fractional under stage j's memory (inf where the range cannot fit), as an (N+1, N+1)
    array: alpha = 1, beta = 0 is tau_j; alpha = m - 1, beta = 1 is psi_j. A range's cost
    depends only on its count vector (c_s), so each distinct vector is priced once (a few
    hundred for a transformer, against N^2 ranges): ``counts`` is (distinct vectors (S, U),
    each range's vector (N+1, N+1)), from ``range_counts``."""
    vectors, where = counts
    S = vectors.shape[0]
    r = j % sp.pp
    present = vectors > 0
    options = [_allowed(sp, s) for s in range(S)]
    t = [
        alpha * sp.time[s][k] + beta * (sp.optim[s][k] + sp.offl[s][k])
        for s, k in enumerate(options)
    ]
    w = [(sp.state[s][k] + sp.inflight[j] * sp.act[s][k]) / GIB for s, k in enumerate(options)]
    least_ws = np.array([_least(sp.ws[s][k]) for s, k in enumerate(options)]) / GIB
    least_gather = np.array([_least(sp.gather[s][k]) for s, k in enumerate(options)]) / GIB
    room = (sp.capacity - sp.const_mem[r]) / GIB
    working = np.where(present, least_ws[:, None], 0.0).max(axis=0)
    room = room - np.maximum(working, sp.loss_mem[r] / GIB)
    room = room - np.where(present, least_gather[:, None], 0.0).max(axis=0)
    lams = np.unique(np.concatenate([[0.0]] + [_breakpoints(ts, ws) for ts, ws in zip(t, w)]))
    env = np.stack([_envelope(ts, ws, lams) for ts, ws in zip(t, w)], axis=1)  # (L, S)
    # inf * 0 where a segment without options is absent; 0 * -inf (lambda 0 times the room
    # of a range holding such a segment, refused below)
    with np.errstate(invalid="ignore"):
        least_mem = np.where(present, np.array([_least(x) for x in w])[:, None] * vectors, 0.0)
        least_mem = least_mem.sum(axis=0)
        dual = np.where(present[None], env[:, :, None] * vectors[None], 0.0).sum(axis=1)
        cost = (dual - lams[:, None] * room[None]).max(axis=0) + alpha * sp.const_time[j]
    cost[least_mem > room * (1 + 1e-12) + 1e-12] = math.inf
    return cost[where]


def range_counts(seg_len: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """c_s(a, b), how many blocks of segment s the range [a, b) holds, as the distinct count
    vectors (S, U) and, per range, the index of its vector (N+1, N+1)."""
    n = sum(seg_len)
    idx = np.arange(n + 1)
    a, b = idx[:, None], idx[None, :]
    starts = np.concatenate([[0], np.cumsum(seg_len)[:-1]])
    out = [
        np.clip(np.minimum(b, s0 + length) - np.maximum(a, s0), 0, None)
        for s0, length in zip(starts, seg_len)
    ]
    flat = np.asarray(out, dtype=float).reshape(len(seg_len), -1)
    vectors, where = np.unique(flat, axis=1, return_inverse=True)
    return vectors, where.reshape(n + 1, n + 1)


def _allowed(sp: StageProblem, s: int) -> np.ndarray:
    k = np.arange(len(sp.time[s]))
    return k if sp.allowed is None else k[np.asarray(sp.allowed[s], bool)]


def _least(x: np.ndarray) -> float:
    return float(np.min(x)) if len(x) else math.inf


def _envelope(t: np.ndarray, w: np.ndarray, lams: np.ndarray) -> np.ndarray:
    """g_s(l) = min_o (t_o + l w_o) at each l; inf for a segment without an allowed option."""
    if not len(t):
        return np.full(len(lams), math.inf)
    return (t[None, :] + lams[:, None] * w[None, :]).min(axis=1)


def _breakpoints(t: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The l > 0 where g(l) = min_o (t_o + l w_o) changes its minimizing option: where two
    options cost the same and nothing is cheaper (the dual's maximum is at one of them)."""
    if len(t) < 2:
        return np.zeros(0)
    dt = t[None, :] - t[:, None]
    dw = w[:, None] - w[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        lam = dt / dw
    lam = np.unique(lam[(dw > 0) & (dt > 0) & np.isfinite(lam)])
    if not len(lam):
        return lam
    lines = t[None, :] + lam[:, None] * w[None, :]  # (L, K)
    low = lines.min(axis=1, keepdims=True)
    ties = (lines <= low + 1e-12 * np.abs(low) + 1e-15).sum(axis=1)
    return lam[ties >= 2]
