"""split_bound's exact dynamic program over contiguous splits, with each stage's variant (device
kind, TP degree, DP multiple) free: lower bounds of the mixed MILP's max stage time, sum of
stage times, and step time.

For stage j and range [a, b), variant v's least time tau^v_j(a, b) and least
(m_v - 1) T_j + Opt_j + Off_j, psi^v_j(a, b), are split_bound.stage_costs under v's numbers
(options fractional under v's memory; inf where the range cannot fit on v; m_v the variant's
micro-batches per replica). A mixed placement runs stage j on some variant v_j, and its hop to
the next stage costs >= 0, so

    T_j >= min_v tau^v_j(a_j, a_{j+1}),   (m_j - 1) T_j + Opt_j + Off_j >= min_v psi^v_j(...)

and split_bound's recurrences over these minima give T*, S* and P* every placement satisfies.
The recurrences carry the units (t r) used so far, so no split gives the kinds more stages'
GPUs than they hold: P*'s each kind's (counted coarsely where the state space would
be large: a relaxation, ``unit_moves``), T*'s and S*'s their sum (``total_moves``). The tied
weights' one degree is dropped (a relaxation, still a bound). Variant v's stage constant is
priced as base[v, j] + min_u hop[j, v, u], the cheapest hop it could have (its own link or
the fabric, whichever is cheaper): a homogeneous StageProblem's constant holds its own link's
hop, which a faster fabric could undercut.

The exposed DP communication adds: E >= E_j^1 + E_j^2 >= (its blocks' d^1 + d^2 terms and the
once terms) for every stage j, so E is at least their mean over stages, and the mean is at least
(sum_s L_s min_{v,o} (d^1 + d^2)[v,s,o] + min_v (d^1_once + d^2_once)[v]) / J (one stage at
least holds parameters; the once terms are >= 0). The step is then at least
S* + P* + max(0, that) + K, as in split_bound; the MILP carries T*, S*, P* as cuts.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from planner.search.milp.split_bound import SplitBound, range_counts, stage_costs
from planner.search.mixed.milp import MixedProblem

# The units DP's state space at most: each kind's units are counted in steps of q_k (a power
# of two) large enough that the states (per kind, cap_k // q_k + 1) multiply to no more.
UNIT_STATES = 256
# pipeline_floor's grid of the largest psi: P* (1 + PHI_STEP i), i = 0 .. PHI_POINTS
PHI_STEP, PHI_POINTS = 0.03, 6


Costs = tuple[list[list[np.ndarray]], list[list[np.ndarray]]]


def variant_costs(mp: MixedProblem, v: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per stage j, variant v's tau^v_j and psi^v_j over every range (inf where a range
    cannot fit, or holds no block): what the recurrences read, reusable for any subset of
    the variants that holds v (v's constant holds its cheapest hop to any of mp's)."""
    n, J = sum(mp.seg_len), mp.J
    counts = range_counts(mp.seg_len)
    empty = np.tril(np.ones((n + 1, n + 1), bool))
    hops = [float(np.min(mp.hop[j][v])) for j in range(J - 1)] + [0.0]
    const = [float(mp.base_time[v][j]) + hops[j] for j in range(J)]
    sp = replace(mp.per_variant[v], const_time=const)
    taus, psis = [], []
    for j in range(J):
        tau = stage_costs(sp, j, counts, 1.0, 0.0)
        psi = stage_costs(sp, j, counts, sp.m - 1.0, 1.0)
        tau[empty] = psi[empty] = math.inf
        taus.append(tau)
        psis.append(psi)
    return taus, psis


def _all_costs(mp: MixedProblem) -> Costs:
    per = [variant_costs(mp, v) for v in range(len(mp.variants))]
    return (
        [[p[0][j] for p in per] for j in range(mp.J)],
        [[p[1][j] for p in per] for j in range(mp.J)],
    )


def mixed_split_bound(mp: MixedProblem, costs: Costs | None = None) -> SplitBound:
    """T*, S* and P* over every variant per stage, within the kinds' TP units (inf when no
    split fits). ``costs``: per stage, per variant of ``mp``, (tau, psi) as ``variant_costs``
    gives them, when the caller has them."""
    n, J = sum(mp.seg_len), mp.J
    if n < J:
        return SplitBound(math.inf, math.inf)
    if J == 1:
        return SplitBound(0.0, 0.0, 0.0)
    taus, psis = costs or _all_costs(mp)
    # T* and S* (cuts) over the kinds' units added up; P*, the bound's main term, per kind
    total = total_moves(mp.variants, mp.units, mp.needs, mp.dp_needs)
    max_stage, sum_stages = (
        units_recurrence(taus, *total, n, combine) for combine in (np.maximum, np.add)
    )
    if not math.isfinite(max_stage):
        return SplitBound(math.inf, math.inf)
    per_kind = unit_moves(mp.variants, mp.units, mp.needs, mp.dp_needs)
    weighted = units_recurrence(psis, *per_kind, n, np.maximum)
    return SplitBound(max_stage, sum_stages, weighted)


def fastest_floor(
    fastest: list[np.ndarray],
    seg_len: list[int],
    variants: Variants,
    units: list[int],
    J: int,
    scale: Sequence[float],
    needs: Sequence[int] = (),
    dp_needs: Sequence[int] = (),
) -> tuple[float, float]:
    """(S_f, Q_f): no placement's sum_j T_j is below S_f nor its max_j (m_j - 1) T_j below
    Q_f (``scale[v]``: variant v's m_v - 1), so none steps faster than S_f + Q_f. The
    recurrences over each variant's fastest option on every block (``fastest[v][s]``), with no
    memory, constant or hop (each dropped: a relaxation), within the units (Q_f each kind's,
    S_f their sum). It needs no StageProblem, nor the ZeRO stage: the search's cheap test of a
    cell before it builds one."""
    n = sum(seg_len)
    if n < J:
        return math.inf, math.inf
    empty = np.tril(np.ones((n + 1, n + 1), bool))
    ranges, scaled = [], []
    for f, c in zip(fastest, scale, strict=True):
        ends = np.concatenate([[0.0], np.cumsum(np.repeat(f, seg_len))])
        span = ends[None, :] - ends[:, None]
        ranges.append(np.where(empty, math.inf, span))
        scaled.append(np.where(empty, math.inf, span * c))
    per_kind = unit_moves(variants, units, needs, dp_needs)
    busiest = units_recurrence([scaled] * J, *per_kind, n, np.maximum)
    if not math.isfinite(busiest):
        return math.inf, math.inf
    total = total_moves(variants, units, needs, dp_needs)
    return units_recurrence([ranges] * J, *total, n, np.add), busiest


Variants = list[tuple[int, int, int]]
# per variant (units axis, step, the needed flags it sets); the units state's sizes; flags
Moves = tuple[list[tuple[int, int, tuple[int, ...]]], tuple[int, ...], int]


def variant_flags(
    variants: Variants, needs: Sequence[int], dp_needs: Sequence[int] = ()
) -> tuple[list[tuple[int, ...]], int]:
    """Per variant, the needed flags it sets, and how many there are: one per needed TP degree
    and per needed DP multiple that some variant lacks (where every variant has it, every
    placement takes it)."""
    tracked = [(1, d) for d in sorted(set(needs)) if any(v[1] != d for v in variants)]
    tracked += [(2, d) for d in sorted(set(dp_needs)) if any(v[2] != d for v in variants)]
    flags = [tuple(i for i, (axis, d) in enumerate(tracked) if v[axis] == d) for v in variants]
    return flags, len(tracked)


def total_moves(
    variants: Variants, units: list[int], needs: Sequence[int] = (), dp_needs: Sequence[int] = ()
) -> Moves:
    """Per variant, (0, its units t r) against the kinds' units added up, in steps of the
    units' greatest common divisor: the per-kind caps relaxed to their sum."""
    g = math.gcd(*(t * r for _, t, r in variants))
    flags, count = variant_flags(variants, needs, dp_needs)
    moves = [(0, t * r // g, f) for (_, t, r), f in zip(variants, flags, strict=True)]
    return moves, (sum(u // g for u in units) + 1,), count


def unit_moves(
    variants: Variants,
    units: list[int],
    needs: Sequence[int] = (),
    dp_needs: Sequence[int] = (),
    states: int = 0,
) -> Moves:
    """Per variant, the (kind, step) its stage adds to the units state, and the state's sizes:
    kind k counts floor(t r / q_k) per stage against floor(cap_k / q_k), which every placement
    meets (a sum of floors is at most the floor of the sum): exact where q_k divides every
    width t r of k, else a relaxation. q_k starts at the widths' greatest common divisor and
    doubles, the kind with the most states first, until the states are few (``states``, by
    default UNIT_STATES)."""
    K = len(units)
    q = []
    for k in range(K):
        widths = [t * r for kk, t, r in variants if kk == k]
        q.append(math.gcd(*widths) if widths else 1)
    caps = [u // qk for u, qk in zip(units, q, strict=True)]
    while math.prod(c + 1 for c in caps) > (states or UNIT_STATES):
        k = max(range(K), key=lambda i: (caps[i], -i))
        q[k] *= 2
        caps[k] = units[k] // q[k]
    flags, count = variant_flags(variants, needs, dp_needs)
    moves = [(k, t * r // q[k], f) for (k, t, r), f in zip(variants, flags, strict=True)]
    return moves, tuple(c + 1 for c in caps), count


def units_recurrence(
    costs: list[list[np.ndarray]],
    moves: list[tuple[int, int, tuple[int, ...]]],
    dims: tuple[int, ...],
    flags: int,
    n: int,
    combine,
) -> float:
    """min over splits, and a variant per stage whose units stay within ``dims`` and that
    take every needed degree (``flags`` of them), of the stages' costs (``costs[j][v]``)
    combined: np.maximum gives the F recurrence, np.add the S recurrence. The state is
    best[b, *units, *flags] after each stage; variants that move it alike are one (their
    least cost)."""
    U, J = len(dims), len(costs)
    shape = (n + 1, *dims, *([2] * flags))
    steps = sorted(set(moves))
    per_step = [
        [np.min([c for c, mv in zip(stage, moves) if mv == step], axis=0) for step in steps]
        for stage in costs
    ]
    best = np.full(shape, math.inf)
    first = slice(1, n - J + 2)  # stage 0 ends after 1 .. n - J + 1 blocks
    for (axis, step, sets), cost in zip(steps, per_step[0]):
        if step < dims[axis]:
            at = [first] + [0] * (U + flags)
            at[1 + axis] = step
            for flag in sets:
                at[1 + U + flag] = 1
            best[tuple(at)] = np.minimum(best[tuple(at)], cost[0, first])
    pad = (None,) * (len(shape) - 1)
    for j, stage in enumerate(per_step[1:], start=1):
        # stage j starts after j .. n - J + j blocks and ends after j + 1 .. n - J + j + 1
        starts, ends = slice(j, n - J + j + 1), slice(j + 1, n - J + j + 2)
        new = np.full(shape, math.inf)
        for (axis, step, sets), cost in zip(steps, stage):
            if step >= dims[axis]:
                continue
            src = [starts] + [slice(None)] * (len(shape) - 1)
            dst = [ends] + [slice(None)] * (len(shape) - 1)
            src[1 + axis] = slice(0, dims[axis] - step)
            dst[1 + axis] = slice(step, None)
            prev = best[tuple(src)]  # (a, *units, *flags)
            for flag in sets:  # the stage takes a needed degree: set whatever it was
                prev = prev.min(axis=1 + U + flag, keepdims=True)
                dst[1 + U + flag] = slice(1, 2)
            window = cost[starts, ends][(slice(None), slice(None), *pad)]
            total = combine(prev[:, None], window).min(axis=0)
            new[tuple(dst)] = np.minimum(new[tuple(dst)], total)
        best = new
    return float(best[n][(slice(None),) * U + (1,) * flags].min())


def exposed_floor(mp: MixedProblem) -> float:
    """The module docstring's lower bound of E, the exposed DP communication."""
    per_block = sum(
        length * min(float(np.min(sp.dp_first[s] + sp.dp_second[s])) for sp in mp.per_variant)
        for s, length in enumerate(mp.seg_len)
    )
    once = min(sum(sp.dp_once) for sp in mp.per_variant)
    return max(0.0, (per_block + once) / mp.J)


def pipeline_floor(mp: MixedProblem, split: SplitBound, costs: Costs | None = None) -> float:
    """A lower bound of sum_j T_j + (m - 1) T_max + Opt + Off tighter than S* + P*: S* piles
    the blocks on the fastest stages, which no placement whose stages' psi_j stay within P*
    can do. With S(phi) the least sum_j T_j over splits whose every psi_j <= phi (the S
    recurrence on tau, ranges with psi above phi dropped), nonincreasing in phi, a placement
    whose largest psi_j lies in [phi_i, phi_{i+1}) has the sum at least S(phi_{i+1}) +
    phi_i, and one beyond the grid's last point at least S* + phi_G:

        min( min_i S(phi_{i+1}) + phi_i,  S* + phi_G ),   phi_i = P* (1 + PHI_STEP i).
    """
    n, J = sum(mp.seg_len), mp.J
    if J == 1 or not split.feasible:
        return split.sum_stages + split.weighted_max
    if costs is None:
        costs = _all_costs(mp)
    taus, psis = costs
    moves = unit_moves(mp.variants, mp.units, mp.needs, mp.dp_needs)
    grid = [split.weighted_max * (1 + PHI_STEP * i) for i in range(PHI_POINTS + 1)]
    best = split.sum_stages + grid[-1]
    for low, high in itertools.pairwise(grid):
        within = [
            [np.where(p <= high * (1 + 1e-12), t, math.inf) for t, p in zip(tj, pj)]
            for tj, pj in zip(taus, psis, strict=True)
        ]
        best = min(best, units_recurrence(within, *moves, n, np.add) + low)
    return max(best, split.sum_stages + split.weighted_max)


def step_bound(mp: MixedProblem, split: SplitBound, pipeline: float | None = None) -> float:
    """S* + P* (or ``pipeline_floor``, when given) + E_min + K: no placement's step time is
    lower."""
    pipe = split.sum_stages + split.weighted_max if pipeline is None else pipeline
    return pipe + exposed_floor(mp) + mp.const_step
