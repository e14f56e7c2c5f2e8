"""The pipeline schedule of one step as boxes on a time axis: a small, pure simulation.

The cost model prices a step with closed formulas; the timeline figure needs to show *where* each
forward and backward runs and where the ranks wait. Each pipeline rank executes its operations in
the fixed order its schedule prescribes (GPipe, 1F1B, Megatron/torch interleaved 1F1B), and an
operation starts as soon as its rank is free and its input has arrived: the forward of a
micro-batch on virtual stage s needs that micro-batch's forward on s - 1, its backward needs the
backward on s + 1 (or its own forward, on the last stage). With no other resource contention the
start times do not depend on the order we visit ranks in, so a fixed-point sweep is exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.vocab import Schedule


@dataclass(frozen=True)
class Box:
    """One operation of one pipeline rank: a forward ("F") or backward ("B") of a micro-batch on
    a virtual stage (``chunk`` is its index among the rank's chunks, 0 unless interleaved)."""

    rank: int
    stage: int
    chunk: int
    kind: str
    microbatch: int
    start: float
    end: float


def rank_order(schedule: str, pp: int, m: int, v: int, rank: int) -> list[tuple[str, int, int]]:
    """The (kind, micro-batch, chunk) operations of ``rank`` in the order it runs them."""
    if schedule == Schedule.GPIPE:
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
    if schedule == Schedule.ONE_F_ONE_B or v == 1:
        fwd = [(i, 0) for i in range(m)]
        bwd = [(i, 0) for i in range(m)]
        warmup = min(pp - rank - 1, m)
    elif schedule == Schedule.INTERLEAVED:
        # Micro-batches go round in groups of pp; within a group, every chunk in turn (forward in
        # chunk order, backward in reverse), as in Megatron-LM and torch's Interleaved1F1B.
        fwd, bwd = [], []
        for g in range(0, m, pp):
            group = range(g, min(g + pp, m))
            fwd += [(i, c) for c in range(v) for i in group]
            bwd += [(i, c) for c in reversed(range(v)) for i in group]
        warmup = min(m * v, (v - 1) * pp + 2 * (pp - rank - 1))
    else:
        raise ValueError(f"unknown schedule {schedule!r}")
    ops = [("F", i, c) for i, c in fwd[:warmup]]
    f_next, b_next = warmup, 0
    while f_next < len(fwd):
        ops.append(("F", *fwd[f_next]))
        ops.append(("B", *bwd[b_next]))
        f_next, b_next = f_next + 1, b_next + 1
    ops += [("B", i, c) for i, c in bwd[b_next:]]
    return ops


def simulate(
    schedule: str,
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    pp: int,
    m: int,
    v: int = 1,
) -> list[Box]:
    """Every forward and backward of one step, placed in time.

    ``forward_s`` and ``backward_s`` are per virtual stage (pp * v entries, stage s on rank
    s % pp) and per micro-batch. Raises ValueError if the order deadlocks (it cannot for the
    three schedules above with valid inputs)."""
    n = pp * v
    if len(forward_s) != n or len(backward_s) != n:
        raise ValueError(f"expected {n} stage timings, got {len(forward_s)} and {len(backward_s)}")
    if pp < 1 or m < 1 or v < 1:
        raise ValueError("pp, m and v must be positive")
    orders = [rank_order(schedule, pp, m, v, r) for r in range(pp)]
    done: dict[tuple[str, int, int], float] = {}  # (kind, micro-batch, stage) -> end time
    free = [0.0] * pp
    pos = [0] * pp
    boxes: list[Box] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(pp):
            while pos[r] < len(orders[r]):
                kind, i, c = orders[r][pos[r]]
                s = c * pp + r
                if kind == "F":
                    dep = ("F", i, s - 1) if s > 0 else None
                else:
                    dep = ("B", i, s + 1) if s < n - 1 else ("F", i, s)
                if dep is not None and dep not in done:
                    break
                start = max(free[r], done[dep] if dep is not None else 0.0)
                end = start + (forward_s[s] if kind == "F" else backward_s[s])
                done[(kind, i, s)] = end
                boxes.append(Box(r, s, c, kind, i, start, end))
                free[r] = end
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError(f"the {schedule} order deadlocks with pp={pp}, m={m}, v={v}")
    return boxes


def makespan(boxes: Sequence[Box]) -> float:
    return max((b.end for b in boxes), default=0.0)


def peak_inflight(boxes: Sequence[Box], rank: int) -> int:
    """The most micro-batch chunks whose forward ``rank`` has run and whose backward it has not:
    the activations it holds at its peak."""
    events = sorted(
        (b.start if b.kind == "F" else b.end, 1 if b.kind == "F" else -1)
        for b in boxes
        if b.rank == rank
    )
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


def idle_time(boxes: Sequence[Box], rank: int, until: float) -> float:
    """Time ``rank`` waits between 0 and ``until``: its share of the pipeline bubble."""
    return until - sum(b.end - b.start for b in boxes if b.rank == rank)


def steady_cuts(
    boxes: Sequence[Box], schedule: str, pp: int, m: int, v: int = 1, keep: int | None = None
) -> list[tuple[float, float, int]]:
    """Stretches of the steady state that a figure may leave out, as (start, end, micro-batches
    skipped): every rank is busy in them and repeats the same pattern.

    A window opens when the first stage starts the forward of micro-batch ``keep`` and closes
    when it starts that of ``m - keep``; ``keep`` (default pp, 2 pp interleaved) is past every
    rank's warm-up. GPipe's backward phase gets the same window, measured on the last stage.
    Empty when there are too few micro-batches to gain anything."""
    keep = keep if keep is not None else (2 * pp if v > 1 else pp)
    if m - 2 * keep < 4:
        return []
    n = pp * v
    start = {(b.kind, b.microbatch, b.stage): b.start for b in boxes}
    cuts = [(start[("F", keep, 0)], start[("F", m - keep, 0)], m - 2 * keep)]
    if schedule == Schedule.GPIPE:
        cuts.append((start[("B", keep, n - 1)], start[("B", m - keep, n - 1)], m - 2 * keep))
    return cuts


def compress(boxes: Sequence[Box], cuts: Sequence[tuple[float, float, int]], gap: float):
    """The boxes with each cut replaced by a gap of width ``gap``: boxes inside a cut vanish, boxes
    across its edges are clipped. Returns (boxes, to_drawn) where to_drawn maps a true time
    outside the cuts to its position on the compressed axis."""
    cuts = sorted(cuts)

    def to_drawn(t: float) -> float:
        shift = 0.0
        for a, b, _ in cuts:
            if t >= b:
                shift += (b - a) - gap
            elif t > a:
                return a - shift + gap * (t - a) / (b - a)
        return t - shift

    out: list[Box] = []
    for box in boxes:
        pieces = [(box.start, box.end)]
        for a, b, _ in cuts:
            nxt = []
            for s, e in pieces:
                if s < a:
                    nxt.append((s, min(e, a)))
                if e > b:
                    nxt.append((max(s, b), e))
            pieces = nxt
        for s, e in pieces:
            if e > s:
                out.append(
                    Box(
                        box.rank,
                        box.stage,
                        box.chunk,
                        box.kind,
                        box.microbatch,
                        to_drawn(s),
                        to_drawn(e),
                    )
                )
    return out, to_drawn
