"""The heterogeneous step time of one placement, written directly (no solver): what the mixed
MILP minimizes, so a brute force over placements can check the MILP's answer.

A placement is a variant (device kind, TP degree, DP multiple) per stage and, per stage, how
many blocks of each segment run each of that variant's options (blocks in model order, stage
after stage). With T_j the stage's time per micro-batch (its blocks' times under its variant,
its constant, and the hop to the next stage between the two stages' variants) and m_j its
replicas' micro-batches each (n / (dp r_j), the step's n taken in turns):

    step = sum_j T_j + max_j (m_j - 1) T_j + max_j (E_j^1+ + E_j^2+) + max_j Opt_j + max_j Off_j
           + K

(the pipeline fills and drains through every stage once, and in between its busiest replica
runs its other micro-batches: with one DP degree, (m - 1) max_j T_j as for a homogeneous
pipeline). The placement fits when every stage's memory (states, in-flight activations, the
largest working set and gathered buffer of its options, its other memory) is within its kind's
capacity, its host bytes within its kind's host share, each kind's stages' units (t r) add up
to within what the pool holds (``MixedProblem.units``, at least ``units_low``), some stage
takes each degree in ``MixedProblem.needs`` and each multiple in ``dp_needs``, and the stages
holding a tied group's blocks share one TP and one DP degree.
"""

from __future__ import annotations

import math

from planner.cost.pipeline import one_chunk_pipeline
from planner.search.mixed.milp import MixedProblem, tied_groups


def fits_pool(mp: MixedProblem, variants: list[int], counts: list[list[list[int]]]) -> bool:
    """Whether each kind's stages' units add up to within its own, some stage takes each
    needed degree and multiple, and the stages holding each tied group's blocks run one TP and
    one DP degree."""
    if any(d not in {mp.tp_of(v) for v in variants} for d in mp.needs):
        return False
    if any(d not in {mp.dp_of(v) for v in variants} for d in mp.dp_needs):
        return False
    units = [0] * len(mp.kinds)
    for v in variants:
        units[mp.kind_of(v)] += mp.width(v)
    if any(not lo <= u <= hi for u, lo, hi in zip(units, mp.low, mp.units, strict=True)):
        return False
    for group in tied_groups(mp.tied, len(mp.seg_len)):
        degrees = {
            (mp.tp_of(v), mp.dp_of(v))
            for v, row in zip(variants, counts, strict=True)
            if any(sum(row[s]) for s in group)
        }
        if len(degrees) > 1:
            return False
    return True


def pipeline_time(mp: MixedProblem, variants: list[int], times: list[float]) -> float:
    """sum_j T_j + max_j (m_j - 1) T_j: stage j of variant ``variants[j]`` taking ``times[j]``
    a micro-batch."""
    return one_chunk_pipeline(times, [mp.m_of(v) for v in variants])


def step_time(mp: MixedProblem, variants: list[int], counts: list[list[list[int]]]) -> float:
    """The step time of the placement (a variant per stage), or inf when it does not fit
    (memory, host, pool, tied degrees)."""
    J, L = mp.J, mp.seg_len
    if len(variants) != J or len(counts) != J:
        raise ValueError(f"a placement of {J} stages needs {J} variants and {J} count rows")
    placed = [sum(sum(counts[j][s]) for j in range(J)) for s in range(len(L))]
    if placed != list(L) or any(sum(map(sum, row)) < 1 for row in counts):
        raise ValueError(f"placement puts {placed} blocks per segment, not {L}")
    if not fits_pool(mp, variants, counts):
        return math.inf
    times, exposed, optim, offl = [], [], [], []
    for j, (v, row) in enumerate(zip(variants, counts, strict=True)):
        sp = mp.per_variant[v]
        t = mp.base_time[v][j] + (mp.hop[j][v][variants[j + 1]] if j < J - 1 else 0.0)
        mem = step = sp.const_mem[j]
        host = e1 = e2 = opt = off = gather = 0.0
        ws = sp.loss_mem[j]
        params = False
        for s, per_opt in enumerate(row):
            for o, c in enumerate(per_opt):
                if c == 0:
                    continue
                if sp.allowed is not None and not sp.allowed[s][o]:
                    return math.inf
                params = params or sp.has_params[s]
                t += c * sp.time[s][o]
                mem += c * (sp.state[s][o] + sp.inflight[j] * sp.act[s][o])
                step += c * (sp.step[s][o] if sp.step is not None else 0.0)
                host += c * sp.host[s][o]
                ws, gather = max(ws, sp.ws[s][o]), max(gather, sp.gather[s][o])
                e1 += c * sp.dp_first[s][o]
                e2 += c * sp.dp_second[s][o]
                opt += c * sp.optim[s][o]
                off += c * sp.offl[s][o]
        if params:
            e1, e2 = e1 + sp.dp_once[0], e2 + sp.dp_once[1]
        over_device = max(mem + ws + gather, step) > sp.capacity * (1 + 1e-9)
        if over_device or host > sp.host_capacity * (1 + 1e-9):
            return math.inf
        times.append(t)
        exposed.append(max(0.0, e1) + max(0.0, e2))
        optim.append(opt)
        offl.append(off)
    pipeline = pipeline_time(mp, variants, times)
    return float(pipeline + max(exposed) + max(optim) + max(offl) + mp.const_step)
