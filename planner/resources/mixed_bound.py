"""split_bound's exact dynamic program over contiguous splits, with each stage's kind free:
lower bounds of the mixed MILP's max stage time, sum of stage times, and step time.

For stage j and range [a, b), kind k's least time tau^k_j(a, b) and least
(m - 1) T_j + Opt_j + Off_j, psi^k_j(a, b), are split_bound.stage_costs under k's numbers
(options fractional under k's memory; inf where the range cannot fit on k). A mixed placement
runs stage j on some kind k_j, and its hop to the next stage costs >= 0, so

    T_j >= min_k tau^k_j(a_j, a_{j+1}),   (m - 1) T_j + Opt_j + Off_j >= min_k psi^k_j(...)

and split_bound's recurrences over these minima give T*, S* and P* every placement satisfies
(the pool's stage counts per kind are dropped: a relaxation, still a bound). Kind k's stage
constant is priced as base[k, j] + min_l hop[j, k, l], the cheapest hop it could have (its own
link or the fabric, whichever is cheaper): a homogeneous StageProblem's constant holds its own
link's hop, which a faster fabric could undercut.

The exposed DP communication adds: E >= E_j^1 + E_j^2 >= (its blocks' d^1 + d^2 terms and the
once terms) for every stage j, so E is at least their mean over stages, and the mean is at least
(sum_s L_s min_{k,o} (d^1 + d^2)[k,s,o] + min_k (d^1_once + d^2_once)[k]) / J (one stage at
least holds parameters; the once terms are >= 0). The step is then at least
S* + P* + max(0, that) + K, as in split_bound; the MILP carries T*, S*, P* as cuts.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from planner.resources.mixed_milp import MixedProblem
from planner.search.split_bound import SplitBound, _min_max, _min_sum, range_counts, stage_costs


def mixed_split_bound(mp: MixedProblem) -> SplitBound:
    """T*, S* and P* over every kind per stage (inf when no split fits on any kinds)."""
    n, J = sum(mp.seg_len), mp.J
    if n < J:
        return SplitBound(math.inf, math.inf)
    if J == 1:
        return SplitBound(0.0, 0.0, 0.0)
    counts = range_counts(mp.seg_len)
    empty = np.tril(np.ones((n + 1, n + 1), bool))
    kinds = []
    for k, sp in enumerate(mp.per_kind):
        hops = [float(np.min(mp.hop[j][k])) for j in range(J - 1)] + [0.0]
        const = [float(mp.base_time[k][j]) + hops[j] for j in range(J)]
        kinds.append(replace(sp, const_time=const))
    taus, psis = [], []
    for j in range(J):
        tau = np.min([stage_costs(sp, j, counts, 1.0, 0.0) for sp in kinds], axis=0)
        psi = np.min([stage_costs(sp, j, counts, mp.m - 1.0, 1.0) for sp in kinds], axis=0)
        tau[empty] = psi[empty] = math.inf
        taus.append(tau)
        psis.append(psi)
    max_stage = _min_max(taus, n)
    if not math.isfinite(max_stage):
        return SplitBound(math.inf, math.inf)
    return SplitBound(max_stage, _min_sum(taus, n), _min_max(psis, n))


def exposed_floor(mp: MixedProblem) -> float:
    """The module docstring's lower bound of E, the exposed DP communication."""
    per_block = sum(
        length * min(float(np.min(sp.dp_first[s] + sp.dp_second[s])) for sp in mp.per_kind)
        for s, length in enumerate(mp.seg_len)
    )
    once = min(sum(sp.dp_once) for sp in mp.per_kind)
    return max(0.0, (per_block + once) / mp.J)


def step_bound(mp: MixedProblem, split: SplitBound) -> float:
    """S* + P* + E_min + K: no placement's step time is lower."""
    return split.sum_stages + split.weighted_max + exposed_floor(mp) + mp.const_step
