"""Tests written for mutmut's generated mutants of planner/search/mixed/search.py
(benchmarks/generated_mutants.py). The helpers against hand-worked values or brute force over
their small inputs (variants per kind, unit caps and counts, boxes, cells, floors, hops, the
memory check); the search itself on examples/mlp.py (tiny, two layers: four blocks) over two
CPU kinds (two ranks of profiles/cpu.toml, one of a copy at half its peak and memory), a
fraction of a second a search: the pruned search against every cell solved (pruning off),
each solved cell's bound against its value, the best against its placement priced directly,
and by a rate against the same search by time. test_mixed_stage_tp, test_mixed_stage_dp and
test_mixed_plan plan larger models (tens of seconds). docs/mutation.md names the mutants each
test kills."""

from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import highspy
import numpy as np
import pytest
from runs import cpu_profile
from test_mutant_kills_mixed_milp import rich_problem

from planner.api import trace, variants_for
from planner.cost.data_parallel import tied_sync_time
from planner.cost.pipeline import hop_time, stage_time_parts
from planner.cost.records import Config, CostInputs
from planner.hardware.cluster import Cluster
from planner.hardware.collectives import p2p_time
from planner.hardware.profiles import load_profile
from planner.schema.mesh import Mesh
from planner.search.bound_memo import BoundMemo
from planner.search.candidates import Candidate, Pins
from planner.search.milp.split_bound import SplitBound
from planner.search.mixed import search as ms
from planner.search.mixed.cost import step_time
from planner.search.mixed.milp import MixedSolution, solve_mixed
from planner.search.mixed.search import (
    Floors,
    Kind,
    MixedCandidate,
    MixedResult,
    RunRate,
    box_feasible,
    cell_variants,
    dp_multiples,
    exact_objective,
    fits_at_all,
    floors_of,
    hop_times,
    mixed_problem,
    outer_candidates,
    search_mixed,
    split_box,
    stage_variants,
    tied_segments,
    unit_caps,
    unit_counts,
    variant_parts,
    wide_kinds,
)
from planner.search.options import price_options
from planner.training import Training
from planner.vocab import Schedule

ROOT = Path(__file__).resolve().parent.parent
LINK = (4.4e9, 3.1e-4)
CPU = load_profile("cpu")


@pytest.fixture(autouse=True)
def _own_highs_scheduler():
    """mutmut forks a child per mutant; HiGHS's task scheduler's threads do not come with a
    fork, so each test starts it afresh (as the other MILP kill files)."""
    highspy.Highs.resetGlobalScheduler(False)


def kind(name: str, gpn: int, gpus: int, nodes: int = 1) -> Kind:
    return Kind(name, Cluster(CPU, nodes, gpn), gpus)


# ---------------------------------------------------------------- variants, caps, cells


def test_stage_variants_by_hand():
    """A: 4 a node, 8 GPUs; B: 8 a node, 2 GPUs. At dp 1, multiples 1 and 2: A takes TP up to
    its node (4) and widths up to 8 (on whole nodes); B widths up to its 2 GPUs."""
    kinds = [kind("a", 4, 8, 2), kind("b", 8, 2)]
    got = stage_variants(kinds, 1, [1, 2, 4, 8], (1, 2))
    assert got == [
        (0, 1, 1), (0, 2, 1), (0, 4, 1), (0, 1, 2), (0, 2, 2), (0, 4, 2),
        (1, 1, 1), (1, 2, 1), (1, 1, 2),
    ]  # fmt: skip
    assert stage_variants(kinds, 1, [1, 2]) == [(0, 1, 1), (0, 2, 1), (1, 1, 1), (1, 2, 1)]
    # dp 3: on 4 a node, widths 3 and 6 are neither inside a node nor whole nodes; 12 is
    # three whole nodes. On 3 a node, 3 is the node itself.
    odd = [kind("c", 4, 12, 3), kind("d", 3, 6, 2)]
    assert stage_variants(odd, 3, [1, 2, 4]) == [(0, 4, 1), (1, 1, 1), (1, 2, 1)]
    assert stage_variants(odd, 3, [1, 2, 4], (1, 2)) == [
        (0, 4, 1), (0, 2, 2), (1, 1, 1), (1, 2, 1), (1, 1, 2),
    ]  # fmt: skip
    # exactly a kind's GPUs fit; one more does not
    assert stage_variants([kind("e", 8, 4)], 2, [1, 2, 4]) == [(0, 1, 1), (0, 2, 1)]


def test_unit_caps_are_gpus_over_dp_and_pp_widest_stages():
    variants = [(0, 1, 1), (0, 2, 1), (1, 1, 1), (1, 1, 2), (2, 2, 2)]
    kinds = [kind("a", 8, 16), kind("b", 8, 16), kind("c", 8, 3), kind("d", 8, 8)]
    # a: min(16, 3 * 2); b: min(16, 3 * 2); c: min(3, 3 * 4); d: no variant
    assert unit_caps(kinds, 1, variants, 3) == [6, 6, 3, 0]
    assert unit_caps(kinds, 2, variants, 3) == [6, 6, 1, 0]
    assert unit_caps(kinds, 4, variants, 5) == [4, 4, 0, 0]


def test_cell_variants_and_dp_multiples():
    vs = [(0, 1, 1), (0, 2, 1), (0, 4, 1), (0, 1, 2), (1, 2, 4), (1, 8, 1)]
    assert cell_variants(vs, 2, 4) == [(0, 2, 1), (0, 4, 1)]
    assert cell_variants(vs, 1, 2) == [(0, 1, 1), (0, 2, 1)]  # multiple 1 by default
    assert cell_variants(vs, 1, 2, 2) == [(0, 1, 1), (0, 2, 1), (0, 1, 2)]
    assert cell_variants(vs, 2, 8, 4) == [(0, 2, 1), (0, 4, 1), (1, 2, 4), (1, 8, 1)]
    assert [dp_multiples(n) for n in (1, 2, 3, 4, 8)] == [
        [1],
        [1, 2],
        [1, 2],
        [1, 2, 4],
        [1, 2, 4, 8],
    ]


def reference_cells(kinds, n_blocks, gbs, degrees, pins, stage_dp=True):
    """outer_candidates by its docstring, as a filter over every tuple of degrees."""
    out = set()
    mults = [1, 2, 4] if stage_dp and not pins.dp else [1]
    for dp, lo, hi, top, pp, mbs, zero in itertools.product(
        range(1, gbs + 1), degrees, degrees, (1, 2, 4), range(2, n_blocks + 1),
        range(1, gbs + 1), range(4),
    ):  # fmt: skip
        if gbs % dp or lo > hi or top not in mults or (gbs // dp) % mbs:
            continue
        if (pins.dp and dp != pins.dp) or (pins.pp and pp != pins.pp):
            continue
        allowed = stage_variants(kinds, dp, degrees, mults)
        tps = {t for _, t, _ in allowed}
        cell = [(k, t, r) for k, t, r in allowed if lo <= t <= hi and r <= top]
        if lo not in tps or hi not in tps or len({k for k, _, _ in cell}) < 2:
            continue
        if not any(r == top for _, _, r in cell):
            continue
        room = sum(
            kinds[k].gpus // (dp * min(t * r for kk, t, r in cell if kk == k))
            for k in {k for k, _, _ in cell}
        )
        m = gbs // dp // mbs
        if pp > room or m % top or zero == 1 or (zero and dp * top == 1):
            continue
        sched = Schedule.ONE_F_ONE_B if m >= pp and top == 1 else Schedule.GPIPE
        out.add((pp, dp, hi, mbs, sched, zero, lo, top))
    return out


def cell_key(cell) -> tuple:
    c, lo, top = cell
    return (c.pp, c.dp, c.tp, c.micro_batch_size, c.schedule, c.zero, lo, top)


@pytest.mark.parametrize(
    "pins, stage_dp",
    [
        (Pins(offload="none"), True),
        (Pins(offload="none"), False),
        (Pins(offload="none", dp=2), True),
        (Pins(offload="none", pp=3), True),
    ],
)
def test_outer_candidates_are_the_docstrings_cells(pins, stage_dp):
    kinds = [kind("a", 4, 4), kind("b", 2, 2), kind("c", 1, 1)]
    got = outer_candidates(kinds, 4, Training(8, "fp32", "sgd"), [1, 2, 4], pins, stage_dp)
    keys = [cell_key(cell) for cell in got]
    assert len(keys) == len(set(keys))
    assert set(keys) == reference_cells(kinds, 4, 8, [1, 2, 4], pins, stage_dp)
    assert all(c.virtual_stages == 1 for c, _, _ in got)
    assert got  # the case is not empty
    # the order: dp, then (lo, hi), then top, then pp, mbs, zero ascending
    keys = [(c.dp, lo, c.tp, top, c.pp, c.micro_batch_size, c.zero) for c, lo, top in got]
    assert keys == sorted(keys)


def test_outer_candidates_where_kinds_narrowest_stages_differ():
    """Nodes of 4 and of 3 at dp 3: the first kind's narrowest stage is TP 4 (12 ranks, three
    whole nodes), the second's TP 1 (its node of 3), so each kind's room is its own GPUs over
    its own narrowest stage: 1 + 2 stages, not 4 + 0."""
    kinds = [kind("c", 4, 12, 3), kind("d", 3, 6, 2)]
    pins = Pins(offload="none")
    got = outer_candidates(kinds, 5, Training(6, "fp32", "sgd"), [1, 2, 4], pins)
    assert {cell_key(cell) for cell in got} == reference_cells(kinds, 5, 6, [1, 2, 4], pins)
    assert max(c.pp for c, lo, _ in got if c.dp == 3 and (lo, c.tp) == (1, 4)) == 3


def test_outer_candidates_keep_every_micro_batch_that_parts_evenly():
    """Batch 12 at dp 1, multiple 4: micro-batches of 1 and 3 (12 and 4 per replica part by
    4); 2 (6) does not, and neither stops the look at larger ones."""
    kinds = [kind("a", 4, 4), kind("b", 1, 1)]
    got = outer_candidates(kinds, 2, Training(12, "fp32", "sgd"), [1], Pins(offload="none"))
    assert sorted({c.micro_batch_size for c, _, top in got if top == 4}) == [1, 3]


def test_outer_candidates_by_hand():
    """One rank of each of two kinds, 2 blocks, batch 2: dp 1, TP 1, two stages; micro-batch
    1 (m 2: 1F1B) or 2 (m 1 < pp: GPipe); multiple 2 needs two GPUs of a kind."""
    kinds = [kind("a", 1, 1), kind("b", 1, 1)]
    got = outer_candidates(kinds, 2, Training(2, "fp32", "sgd"), [1, 2], Pins(offload="none"))
    assert got == [
        (Candidate(2, 1, 1, 1, Schedule.ONE_F_ONE_B, 1, 0), 1, 1),
        (Candidate(2, 1, 1, 2, Schedule.GPIPE, 1, 0), 1, 1),
    ]
    # one block: no pipeline
    assert outer_candidates(kinds, 1, Training(2, "fp32", "sgd"), [1], Pins()) == []


def test_wide_kinds_hold_the_widest_pipeline():
    kinds = [kind("a", 4, 8, 2), kind("b", 8, 2)]
    cells = [
        (Candidate(2, 1, 2, 1, "gpipe", 1, 0), 1, 2),  # span 2 * 1 * 2 * 2 = 8
        (Candidate(3, 2, 1, 1, "gpipe", 1, 0), 1, 1),  # 6
    ]
    wide = wide_kinds(kinds, cells)
    assert [(k.name, k.gpus, k.cluster.nodes, k.cluster.gpus_per_node) for k in wide] == [
        ("a", 8, 2, 4),
        ("b", 2, 1, 8),
    ]
    cells.append((Candidate(3, 1, 4, 1, "gpipe", 1, 0), 4, 2))  # 24: 6 nodes of 4, 3 of 8
    wide = wide_kinds(kinds, cells)
    assert [k.cluster.nodes for k in wide] == [6, 3]
    assert wide[0].cluster.profile is CPU
    assert [k.cluster.nodes for k in wide_kinds(kinds, [])] == [2, 1]
    # dp 4: 2 stages of 4 replicas at TP 2 span 16 ranks; 6 ranks are 2 nodes of 4, 1 of 8
    wide = wide_kinds(kinds, [(Candidate(2, 4, 2, 1, "gpipe", 1, 0), 2, 1)])
    assert [k.cluster.nodes for k in wide] == [4, 2]
    wide = wide_kinds(kinds, [(Candidate(3, 2, 1, 1, "gpipe", 1, 0), 1, 1)])
    assert [k.cluster.nodes for k in wide] == [2, 1]
    assert all(type(k.cluster.nodes) is int for k in wide)
    wide = wide_kinds([kind("f", 4, 4)], [(Candidate(3, 2, 1, 1, "gpipe", 1, 0), 1, 1)])
    assert wide[0].cluster.nodes == 2 and type(wide[0].cluster.nodes) is int


def test_tied_segments_name_owner_and_reader_segments():
    blocks = [SimpleNamespace(cls=c) for c in "EEALLLH"]
    tied = [SimpleNamespace(owner=0, user=6), SimpleNamespace(owner=1, user=4),
            SimpleNamespace(owner=0, user=6), SimpleNamespace(owner=2, user=3)]  # fmt: skip
    inp = SimpleNamespace(blocks=blocks, tied=tied)
    assert tied_segments(inp) == [(0, 2), (0, 3), (1, 2)]


# ---------------------------------------------------------------- units and boxes


def stage_sums(widths, n):
    """Every sum of n widths (with repeats)."""
    return {sum(c) for c in itertools.combinations_with_replacement(widths, n)} if n else {0}


@pytest.mark.parametrize("cap, pp", [(7, 3), (4, 2), (9, 4), (0, 2)])
def test_unit_counts_against_every_multiset_of_stages(cap, pp):
    variants = [(0, 1, 1), (0, 2, 1), (0, 1, 2), (0, 4, 1), (1, 3, 1)]
    masks = unit_counts(variants, 0, cap, pp)
    assert len(masks) == cap + 1
    for u in range(cap + 1):
        want = sum(1 << n for n in range(pp + 1) if u in stage_sums([1, 2, 4], n))
        assert masks[u] == want, (u, masks[u], want)
    other = unit_counts(variants, 1, cap, pp)
    for u in range(cap + 1):
        assert other[u] == sum(1 << n for n in range(pp + 1) if u == 3 * n)


def box_brute(widths, lo, hi, pp):
    """Whether pp stages, each of some kind's width, give every kind units within [lo, hi]."""
    choices = [(k, w) for k, ws in enumerate(widths) for w in ws]
    for combo in itertools.combinations_with_replacement(choices, pp):
        units = [sum(w for k, w in combo if k == kk) for kk in range(len(widths))]
        if all(a <= u <= b for a, u, b in zip(lo, units, hi)):
            return True
    return False


def test_box_feasible_against_every_placement():
    widths = [[2, 4], [1], [3]]
    variants = [(k, w, 1) for k, ws in enumerate(widths) for w in ws]
    caps = [8, 3, 6]
    for pp in (2, 3):
        masks = [unit_counts(variants, k, cap, pp) for k, cap in enumerate(caps)]
        seen = set()
        for lo in itertools.product(*(range(c + 1) for c in caps)):
            for hi in itertools.product(*(range(a, c + 1, 2) for a, c in zip(lo, caps))):
                got = box_feasible(masks, lo, hi, pp)
                assert got == box_brute(widths, lo, hi, pp), (pp, lo, hi)
                seen.add(got)
        assert seen == {True, False}
    masks = [unit_counts(variants, k, cap, 2) for k, cap in enumerate(caps)]
    with pytest.raises(ValueError):  # a box of another number of kinds than the masks
        box_feasible(masks, (0, 0), (8, 3), 2)


def test_split_box_halves_by_hand():
    # fewer than two kinds used for sure: the first kind that may be unused goes 0 | >= 1
    assert split_box((0, 0, 2), (4, 6, 8)) == [((0, 0, 2), (0, 6, 8)), ((1, 0, 2), (4, 6, 8))]
    assert split_box((3, 0, 0), (4, 6, 8)) == [((3, 0, 0), (4, 0, 8)), ((3, 1, 0), (4, 6, 8))]
    # two used: the widest range halves (ties to the first kind)
    assert split_box((1, 2, 0), (5, 4, 6)) == [((1, 2, 0), (5, 4, 3)), ((1, 2, 4), (5, 4, 6))]
    assert split_box((1, 1), (5, 5)) == [((1, 1), (3, 5)), ((4, 1), (5, 5))]
    assert split_box((2, 1), (7, 6)) == [((2, 1), (4, 6)), ((5, 1), (7, 6))]
    # one used, nothing open: the widest range
    assert split_box((2, 0), (9, 0)) == [((2, 0), (5, 0)), ((6, 0), (9, 0))]


# ---------------------------------------------------------------- floors


def test_floors_step_and_priced_by_hand():
    fl = Floors(m=8, pp=2, dp=2, fastest=3.0, rank_s=5.0, speed=(0.5, 0.25),
                priced_rank_s=7.0, least_rho_t=0.5, split=None, top=2)  # fmt: skip
    # pipeline: 3 (1 + (8 / 2 - 1) / 2) = 7.5; fluid: (8 - 2) 5 / (0.5 4 + 0.25 8) + 3 = 10.5
    assert fl.step([4, 8]) == pytest.approx(10.5, rel=1e-12)
    # weight 0.5 20 + 0.25 40 = 20: fluid 1.5 + 3 = 4.5 < 7.5
    assert fl.step([20, 40]) == pytest.approx(7.5, rel=1e-12)
    assert replace(fl, split=12.0).step([4, 8]) == 12.0
    assert fl.step([0, 0]) == math.inf
    # a weight below 1 still bounds: 0.5 1 -> fluid 30 / 0.5 + 3 = 63
    assert fl.step([1, 0]) == pytest.approx(63.0, rel=1e-12)
    # priced: 2 ((8 - 2) 7 + 3 2 0.5) = 90
    assert fl.priced() == pytest.approx(90.0, rel=1e-12)
    with pytest.raises(ValueError):
        fl.step([4])


def test_floors_of_by_hand():
    """Two segments (lengths 1 and 3), variants (0, 1, 1), (0, 2, 1), (1, 1, 2)."""
    fastest = [np.array([4.0, 2.0]), np.array([3.0, 1.5]), np.array([1.0, 5.0])]
    variants = [(0, 1, 1), (0, 2, 1), (1, 1, 2)]
    cand = Candidate(3, 2, 2, 1, "gpipe", 1, 0)
    fl = floors_of(fastest, [1, 3], variants, 3, cand, 8, (0.5, 2.0, 9.0))
    # t F: [4, 2], [6, 3], [1, 5]; kind 0's own least 1 4 + 3 2 = 10, kind 1's 1 + 15 = 16
    assert fl.speed == (0.1, 1 / 16, 0.0)
    assert fl.fastest == pytest.approx(1.0 + 3 * 1.5)  # min over variants per segment
    # weighted: [0.4, 0.2], [0.6, 0.3], [1/16, 5/16]: 1/16 + 3 0.2
    assert fl.rank_s == pytest.approx(1 / 16 + 0.6)
    # rho t F: [2, 1], [3, 1.5], [2, 10]: 2 + 3 1
    assert fl.priced_rank_s == pytest.approx(5.0)
    assert fl.least_rho_t == pytest.approx(0.5)  # 0.5 1 1, 0.5 2 1, 2 1 2
    # the least at multiple 2: 1 1 1, 1 2 1, 0.2 1 2
    assert floors_of(fastest, [1, 3], variants, 2, cand, 8, (1.0, 0.2)).least_rho_t == 0.4
    assert (fl.m, fl.pp, fl.dp, fl.top, fl.split) == (8, 3, 2, 2, None)
    bare = floors_of(fastest, [1, 3], variants, 2, cand, 8, ())
    assert bare.priced_rank_s == 0.0 and bare.least_rho_t == 0.0 and bare.speed == (0.1, 1 / 16)
    with pytest.raises(ValueError):
        floors_of(fastest[:2], [1, 3], variants, 2, cand, 8, ())


# ---------------------------------------------------------------- the memory check


def reference_fits(mp) -> bool:
    fewest = min(min(sp.inflight) for sp in mp.per_variant)
    need = sum(
        n * min(float(np.min(sp.state[s] + fewest * sp.act[s])) for sp in mp.per_variant)
        for s, n in enumerate(mp.seg_len)
    )
    rooms = []
    for k, units in enumerate(mp.units):
        mine = [v for v, var in enumerate(mp.variants) if var[0] == k]
        if not mine:
            continue
        room = max(mp.per_variant[v].capacity - min(mp.per_variant[v].const_mem) for v in mine)
        narrow = min(mp.variants[v][1] * mp.variants[v][2] for v in mine)
        rooms += [room] * min(units // narrow, mp.J)
    rooms = sorted(rooms, reverse=True)[: mp.J]
    return len(rooms) == mp.J and need <= sum(rooms) * (1 + 1e-9), need, sum(rooms)


@pytest.mark.parametrize(
    "case",
    [
        dict(seed=0, pp=2, units=(1, 1)),
        dict(seed=1, pp=3, units=(2, 1)),
        dict(seed=2, pp=2, units=(2, 3), degrees=(1, 2)),
        dict(seed=3, pp=3, units=(4, 2), mults=(1, 2)),
    ],
)
def test_fits_at_all_at_the_edge(case):
    """At each case's own numbers, then with every capacity scaled so that the rooms are the
    need exactly (fits), and a part in a million less (does not)."""
    mp = rich_problem(**case)
    ok, need, room = reference_fits(mp)
    assert fits_at_all(mp) == ok
    if room == 0:
        assert not ok
        return
    for scale, want in ((1.0, True), (1 - 1e-6, False)):
        # each room grows by the same d: the J largest by J d, so the rooms total need x scale
        d = (need * scale - room) / mp.J
        pv = [replace(sp, capacity=sp.capacity + d) for sp in mp.per_variant]
        edge = replace(mp, per_variant=pv)
        assert reference_fits(edge)[0] == want
        assert fits_at_all(edge) == want, (case, scale)


def test_too_few_stages_never_fit():
    mp = rich_problem(seed=4, pp=3, units=(1, 1))
    big = replace(mp, per_variant=[replace(sp, capacity=1e30) for sp in mp.per_variant])
    assert not fits_at_all(big)  # two units, three stages
    assert fits_at_all(replace(big, units=[2, 1]))


# ---------------------------------------------------------------- cells and results


def test_mixed_candidate_cells():
    c = Candidate(3, 2, 4, 2, "gpipe", 1, 3)
    mc = MixedCandidate(c, 1.5, tp_low=2, dp_top=4, units_low=(1, 2), units=(3, 5))
    assert mc.degrees == (2, 4) and mc.dp_needs == [1, 4] and mc.several
    assert mc.label() == "pp3 dp2..8 tp2..4, micro-batch 2, gpipe, ZeRO-3"
    assert mc.gpus() == [2, 4] and mc.gpus((3, 5)) == [6, 10]
    one = MixedCandidate(c, 1.5)
    assert one.degrees == (4, 4) and one.dp_needs == [1, 1] and not one.several
    assert one.label() == "pp3 dp2 tp4, micro-batch 2, gpipe, ZeRO-3"
    assert one.gpus() == [] and one.status == "pending" and one.value == math.inf
    assert MixedCandidate(c, 0.0, tp_low=4).several is False
    assert MixedCandidate(c, 0.0, tp_low=4, dp_top=2).several is True
    assert MixedCandidate(c, 0.0, tp_low=1).label().startswith("pp3 dp2 tp1..4,")
    assert MixedCandidate(c, 0.0, dp_top=2).label().startswith("pp3 dp2..4 tp4,")


def sol(status: str) -> MixedSolution:
    return MixedSolution(status, 1.0, [0], [[[1]]])


def test_mixed_result_counts_and_proof():
    c = Candidate(2, 1, 1, 1, "gpipe", 1, 0)

    def mc(status, s=None):
        return MixedCandidate(c, 0.0, status=status, solution=s)

    best = mc("solved", sol("optimal"))
    ok = [best, mc("solved", sol("optimal")), mc("pruned-bound"), mc("cutoff", sol("cutoff"))]
    res = MixedResult(best, ok, {}, [], 0.0)
    assert res.solved == 2 and res.proven and res.notes == [] and not res.skipped
    assert MixedResult(None, ok[2:], {}, [], 0.0).proven
    for bad in (mc("no_solution"), mc("solved", sol("node_limit")), mc("x", sol("inexact"))):
        assert not MixedResult(best, [*ok, bad], {}, [], 0.0).proven
    assert not MixedResult(mc("solved", sol("node_limit")), ok, {}, [], 0.0).proven
    assert not MixedResult(mc("solved"), ok, {}, [], 0.0).proven


# ---------------------------------------------------------------- the search on a real model


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """The MLP's trace, two CPU kinds (two fast ranks, one slow), their variants."""
    tmp = tmp_path_factory.mktemp("kinds")
    half = cpu_profile(tmp, "cpu-half", peak_flops_fp32="5.0e10", capacity_bytes=4294967296)
    traced = trace(ROOT / "examples" / "mlp.py", {"size": "tiny", "layers": 2}, 1, "fp32")
    kinds = [
        Kind("fast", Cluster(CPU, 1, 8), 2),
        Kind("slow", Cluster(load_profile(half), 1, 8), 1),
    ]
    variants = [variants_for(traced.graph, k.cluster, "auto") for k in kinds]
    return SimpleNamespace(traced=traced, kinds=kinds, variants=variants)


TRAINING = Training(4, "fp32", "sgd", lr=0.5)


def run(mlp, cutoff=math.inf, links=None, **kw):
    kw.setdefault("pins", Pins(offload="none"))
    return search_mixed(
        mlp.traced.graph, mlp.traced.blocks, TRAINING, mlp.kinds,
        {(0, 1): LINK} if links is None else links, mlp.variants, cutoff, **kw,
    )  # fmt: skip


def run_inputs(mlp, k: int, tp: int, mbs: int):
    """The priced options of kind k at TP tp and micro-batch mbs, as the search prices them."""
    prices = ms._Prices(mlp.traced.graph, mlp.traced.blocks, TRAINING, mlp.kinds,
                        mlp.variants, Pins(offload="none"))  # fmt: skip
    return prices.of(k, tp, mbs)


@pytest.fixture(scope="module")
def pruned(mlp):
    """The search as the planner runs it, each cell's label recorded as it is built."""
    seen = []
    res = run(mlp, stage_degrees=True, progress=seen.append)
    res.seen = seen
    return res


@pytest.fixture(scope="module")
def every(mlp):
    """Pruning off: every cell of every outer candidate built and solved."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ms, "REL_TOL", -1e12)
        return run(mlp, stage_degrees=True)


# Every placement of a two-stage pipeline (options pinned to one a block: no recompute, no
# offload), priced one by one: the brute force the searches below are held to.
LEAN = Pins(offload="none", recompute="none", pp=2)


@pytest.fixture(scope="module")
def placements(mlp):
    """(GPUs per kind, step time) of every two-stage placement of the MLP on the pool: each
    DP degree and micro-batch, each stage's (kind, TP, DP multiple) from stage_variants with
    one stage at multiple 1 (the least DP degree is the candidate's), every ZeRO stage the
    runtime runs with them, 1F1B where no stage takes a multiple and the micro-batches fill
    the pipeline (GPipe else), every cut of the blocks and option of each block; each priced
    by mixed.cost.step_time on the mixed problem of all the DP degree's variants, its options
    priced by price_options as a pipeline stage (inf where it does not fit)."""
    graph, blocks = mlp.traced.graph, mlp.traced.blocks
    traced_mbs = int(graph.graph["traced_batch_size"])
    gbs, n, pp = TRAINING.global_batch_size, len(blocks), 2
    inputs = {}

    def priced(k, t, mbs):
        if (k, t, mbs) not in inputs:
            cl = mlp.kinds[k].cluster
            opts = price_options(graph, blocks, t, mbs, cl, TRAINING, LEAN, mlp.variants[k],
                                 1, 1, {}, t > 1)  # fmt: skip
            inputs[k, t, mbs] = CostInputs(blocks, opts, traced_mbs, cl, TRAINING, 1.0)
        return inputs[k, t, mbs]

    out = []
    for dp, mbs in itertools.product((1, 2, 4), (1, 2, 4)):
        if (gbs // dp) % mbs:
            continue
        m = gbs // dp // mbs
        vs = [v for v in stage_variants(mlp.kinds, dp, [1, 2, 4, 8], (1, 2, 4)) if m % v[2] == 0]
        problems = {}
        for chosen in itertools.product(range(len(vs)), repeat=pp):
            top = max(vs[i][2] for i in chosen)
            if min(vs[i][2] for i in chosen) != 1:
                continue
            sched = Schedule.ONE_F_ONE_B if m >= pp and top == 1 else Schedule.GPIPE
            units = [sum(t * r for i in chosen for k, t, r in [vs[i]] if k == kk) for kk in (0, 1)]
            for zero in (0, 2, 3) if dp * top > 1 else (0,):
                if (sched, zero) not in problems:
                    cand = Candidate(pp, dp, 1, mbs, sched, 1, zero)
                    ins = [priced(k, t, mbs) for k, t, _ in vs]
                    problems[sched, zero] = mixed_problem(ins, cand, vs, mlp.kinds, {(0, 1): LINK})
                mp = problems[sched, zero]
                seg_of = [s for s, length in enumerate(mp.seg_len) for _ in range(length)]
                for cut in range(1, n):
                    stages = [range(0, cut), range(cut, n)]
                    sizes = [len(mp.per_variant[chosen[j]].time[seg_of[b]])
                             for j in range(pp) for b in stages[j]]  # fmt: skip
                    for opts in itertools.product(*map(range, sizes)):
                        counts = [
                            [[0] * len(row) for row in mp.per_variant[v].time] for v in chosen
                        ]
                        it = iter(opts)
                        for j in range(pp):
                            for b in stages[j]:
                                counts[j][seg_of[b]][next(it)] += 1
                        step = step_time(mp, list(chosen), counts)
                        out.append(([u * dp for u in units], step))
    assert len(out) > 100 and any(math.isfinite(s) for _, s in out)
    return out


def least_objective(placements, rate) -> float:
    """The least rate(GPUs) x step of the placements of two kinds within the longest step."""
    return min(
        (rate.per_step_s(g) * s for g, s in placements
         if sum(1 for x in g if x) >= 2 and s <= rate.max_step_s(g) * (1 + 1e-9)),
        default=math.inf,
    )  # fmt: skip


def test_the_search_is_the_least_placement(mlp, placements):
    """By time: the search's best is the least step of every placement (to REL_TOL: here
    exactly), no solved cell beats it, each solved cell's bound is at most its value."""
    least = min(s for _, s in placements)
    start = time.perf_counter()
    res = run(mlp, pins=LEAN, stage_degrees=True)
    assert 0 < res.solve_time_s <= time.perf_counter() - start and res.kinds == mlp.kinds
    assert res.best.value == pytest.approx(least, rel=1e-12) and res.proven
    assert res.best.status == "solved" and res.best.cand.pp == 2
    for mc in res.candidates:
        assert mc.status in ("solved", "pruned-bound", "pruned-memory", "cutoff")
        if mc.status == "solved":
            assert least <= mc.value and mc.bound <= mc.value * (1 + 1e-9)
    assert run(mlp, least, pins=LEAN, stage_degrees=True).best is None
    above = run(mlp, least * (1 + 2e-3), pins=LEAN, stage_degrees=True)
    assert above.best.value == pytest.approx(least, rel=1e-12)


@pytest.mark.parametrize("which", ["per-gpu", "flat", "budget", "deadline"])
def test_a_rate_is_the_least_placement_of_two_kinds(mlp, placements, which):
    """By a rate: the least objective over placements of both kinds within the longest
    step (a budget between the placements' objectives; a deadline below every step)."""
    costs = sorted(
        per_gpu_rate().per_step_s(g) * s for g, s in placements if math.isfinite(s) and all(g)
    )
    rate = {
        "per-gpu": per_gpu_rate(),
        "flat": RunRate(lambda g: 2.0, lambda g: math.inf),
        "budget": budget_rate(costs[len(costs) // 2]),
        "deadline": per_gpu_rate(min(s for _, s in placements) * 0.99),
    }[which]
    want = least_objective(placements, rate)
    res = run(mlp, pins=LEAN, stage_degrees=True, rate=rate)
    if which == "deadline":
        assert math.isinf(want) and res.best is None
        return
    assert res.best.value == pytest.approx(want, rel=1e-12) and res.proven
    g = res.best.gpus()
    assert all(g) and res.best.value == pytest.approx(
        rate.per_step_s(g) * res.best.solution.objective, rel=1e-12
    )
    assert res.best.solution.objective <= rate.max_step_s(g) * (1 + 1e-9)
    assert any(mc.dp_top > 1 for mc in res.candidates)  # stage degrees asked: DP multiples too
    for mc in res.candidates:
        if mc.status == "solved":
            assert mc.bound <= mc.value * (1 + 1e-9) and want <= mc.value * (1 + 1e-12)
            # the box's placement: its units within the box, priced at its own GPUs
            mp, sol = mc.problem, mc.solution
            units = [sum(mp.width(v) for v in sol.variants if mp.kind_of(v) == k) for k in (0, 1)]
            assert all(a <= u <= b for a, u, b in zip(mc.units_low, units, mc.units))
            gpus = [u * mc.cand.dp for u in units]
            assert mc.value == pytest.approx(rate.per_step_s(gpus) * sol.objective, rel=1e-12)


def test_a_graph_torch_cannot_pipeline_has_no_cell(mlp):
    """A module-level trace (no exported graph): torch's pipelining could not run any stage,
    so no cell is searched, whatever the pool."""
    graph = mlp.traced.graph.copy()
    graph.graph["method"] = "hooks"
    res = search_mixed(graph, mlp.traced.blocks, TRAINING, mlp.kinds, {(0, 1): LINK},
                       mlp.variants, pins=Pins(offload="none"), stage_degrees=True)  # fmt: skip
    assert res.best is None and res.candidates == [] and res.inputs == {}
    assert not res.skipped and res.notes == []


def test_kept_options_are_taken_and_added(mlp):
    """A BoundMemo given as ``kept`` receives every block class's priced options (one entry
    each, none twice), and a search reading them back prices nothing and finds the same
    options and plan."""
    pins = Pins(offload="none", tp=1, pp=2)
    memo = BoundMemo()
    first = run(mlp, stage_degrees=True, kept=memo, pins=pins)
    assert memo.added == len(memo.entries) > 0
    assert all(k.startswith("o") for k in memo.entries)
    again = BoundMemo(json.loads(json.dumps(memo.entries)))
    second = run(mlp, stage_degrees=True, kept=again, pins=pins)
    assert again.added == 0 and second.best.value == first.best.value
    assert set(second.inputs) == set(first.inputs)
    for key, inp in first.inputs.items():
        assert second.inputs[key].options == inp.options


def test_each_milp_is_cut_at_the_incumbent(mlp, placements, monkeypatch):
    """Each MILP is asked only for steps below the incumbent's 1 - REL_TOL share (over the
    box's rate) and within its longest step (to 1e-9): by time from an unreached cutoff, and
    by a flat rate of 2 under a deadline of 1.5 times the least step, from no cutoff and from
    one of 1.2 times the least objective. The incumbent each call is held to is followed
    here from the MILPs' own answers, priced by step_time."""
    calls = []
    real = ms.solve_mixed

    def spy(mp, cutoff, *args):
        # each with the node limit and the cell's split bound (mixed_bound's cuts)
        assert len(args) == 2 and args[0] == ms.NODE_LIMIT
        assert isinstance(args[1], SplitBound) and args[1].feasible
        sol = real(mp, cutoff, *args)
        calls.append((mp, cutoff, sol))
        return sol

    monkeypatch.setattr(ms, "solve_mixed", spy)
    least = min(s for _, s in placements)
    deadline = 1.5 * least
    flat = RunRate(lambda g: 2.0, lambda g: deadline)
    runs = [
        (None, 1.0, 1.0, math.inf),
        (flat, math.inf, 2.0, deadline),  # the deadline cuts the first MILPs
        (flat, 2.4 * least, 2.0, deadline),  # the cutoff over the rate does, below the deadline
    ]
    for rate, cutoff, r, longest in runs:
        calls.clear()
        res = run(mlp, cutoff, pins=LEAN, stage_degrees=True, rate=rate)
        assert res.best.value == pytest.approx(r * least, rel=1e-12) and calls
        incumbent = cutoff
        for mp, asked, sol in calls:
            assert asked == min(incumbent * (1 - ms.REL_TOL) / r, longest * (1 + 1e-9))
            if sol.status == "optimal":
                incumbent = min(incumbent, r * step_time(mp, sol.variants, sol.counts))
        assert incumbent == res.best.value
        for mc in res.candidates:  # a MILP's own status where it found no placement
            if mc.solution is not None and mc.solution.status != "optimal":
                assert mc.status == mc.solution.status


def test_each_cell_is_its_variants_mixed_problem(mlp, monkeypatch):
    """Pruning off, every cell solved: each cell's MILP numbers are mixed_problem's for its
    variants (the search builds them from the variants' parts and hops shared by the cells
    of one candidate)."""
    monkeypatch.setattr(ms, "REL_TOL", -1e12)
    res = run(mlp, pins=LEAN, stage_degrees=True)
    solved = [mc for mc in res.candidates if mc.status == "solved"]
    assert len(solved) >= 5 and any(mc.dp_top > 1 for mc in solved)
    for mc in solved:
        mp, c = mc.problem, mc.cand
        ins = [res.inputs[k, t, c.micro_batch_size] for k, t, _ in mp.variants]
        want = mixed_problem(ins, c, mp.variants, mlp.kinds, {(0, 1): LINK},
                             list(mc.degrees), dp_needs=mc.dp_needs)  # fmt: skip
        assert mp.variants == want.variants and mp.units == want.units
        assert (mp.needs, mp.dp_needs, mp.tied) == (want.needs, want.dp_needs, want.tied)
        assert mp.base_time.tolist() == want.base_time.tolist()
        assert mp.hop.tolist() == want.hop.tolist() and mp.const_step == want.const_step
        for got, ref in zip(mp.per_variant, want.per_variant, strict=True):
            assert (got.m, got.inflight, got.capacity) == (ref.m, ref.inflight, ref.capacity)
            assert all(np.array_equal(a, b) for a, b in zip(got.time, ref.time, strict=True))
            assert all(np.array_equal(a, b) for a, b in zip(got.state, ref.state, strict=True))


def test_a_milp_stopped_at_its_node_limit_still_counts(mlp, placements, monkeypatch):
    """A MILP that stops at its node limit gives a placement all the same: priced by
    step_time (the MILP's value beside it), solved and kept, the result not proven."""
    real = ms.solve_mixed

    def stopped(*args):
        sol = real(*args)
        return replace(sol, status="node_limit") if sol.status == "optimal" else sol

    monkeypatch.setattr(ms, "solve_mixed", stopped)
    res = run(mlp, pins=LEAN, stage_degrees=True)
    best, least = res.best, min(s for _, s in placements)
    assert best.status == "solved" and best.solution.status == "node_limit"
    assert best.value == least and math.isfinite(best.solution.milp_objective)
    assert not res.proven


def test_stage_degrees_by_default_up_to_the_limits(mlp, monkeypatch):
    """A pool of exactly STAGE_DEGREE_GPUS and STAGE_DP_GPUS GPUs (3) is small enough:
    stages of their own TP and DP degree, nothing left out."""
    monkeypatch.setattr(ms, "STAGE_DEGREE_GPUS", 3)
    monkeypatch.setattr(ms, "STAGE_DP_GPUS", 3)
    res = run(mlp, pins=LEAN)
    assert not res.skipped and res.notes == []
    assert any(mc.dp_top > 1 for mc in res.candidates)
    assert any(len(set(mc.degrees)) == 2 for mc in res.candidates)


def test_a_rate_keeps_one_degree_by_default(mlp):
    """Priced by a rate, the default rule keeps every stage at one TP and DP degree (the
    boxes multiply the work) and says so; the best is the same search's with one degree
    asked for."""
    flat = RunRate(lambda g: 2.0, lambda g: math.inf)
    default = run(mlp, rate=flat)
    assert default.candidates and all(not mc.several for mc in default.candidates)
    assert default.skipped and default.notes == [
        "a pipeline across kinds gives its stages one TP and DP degree here: stages of their "
        "own TP degree are searched by default on pools of at most 2 kinds and 64 GPUs, of "
        "their own DP degree on at most 8 GPUs, by time with no deadline or budget (this one: "
        "2 kinds, 3 GPUs, priced by a rate); --stage-degrees on searches them (minutes on "
        "large pools)"
    ]
    one = run(mlp, rate=flat, stage_degrees=False)
    assert not one.skipped and one.notes == []
    assert default.best.value == one.best.value
    assert [mc.label() for mc in default.candidates] == [mc.label() for mc in one.candidates]


def test_a_rate_with_the_dp_degree_pinned_still_says_its_stages_share_a_tp_degree(mlp):
    """With ``--dp`` pinned no DP degree is left out, so the note stands on the cells of
    several TP degrees the default rule left whole alone (``_Search.run``'s ``skipped``)."""
    flat = RunRate(lambda g: 2.0, lambda g: math.inf)
    res = run(mlp, rate=flat, pins=Pins(offload="none", dp=1))
    assert res.candidates and all(not mc.several for mc in res.candidates)
    assert res.skipped and len(res.notes) == 1
    assert res.notes[0].startswith("a pipeline across kinds gives its stages one TP and DP")


def test_a_pool_whose_memory_holds_no_stage_prunes_every_cell_by_memory(mlp):
    """At a millionth of each GPU's memory (``--memory-fraction``) no stage fits: every cell
    is pruned by memory (or by an infinite bound), none solved, and each kind's options are
    priced at that fraction."""
    tiny = 1e-6
    res = run(mlp, stage_degrees=True, pins=Pins(offload="none", memory_fraction=tiny))
    assert res.best is None and res.candidates
    statuses = {mc.status for mc in res.candidates}
    assert "pruned-memory" in statuses <= {"pruned-memory", "pruned-bound"}  # bound: inf
    assert res.inputs and {inp.memory_fraction for inp in res.inputs.values()} == {tiny}


def test_the_pruned_search_is_every_cells_optimum(pruned, every):
    solved = [mc for mc in every.candidates if mc.status == "solved"]
    assert len(solved) > 10
    for mc in every.candidates:
        assert mc.status in ("solved", "pruned-memory") or math.isinf(mc.bound), mc.status
    least = min(mc.value for mc in solved)
    assert every.best.value == least
    assert pruned.best.value == pytest.approx(least, rel=1e-9)
    assert pruned.proven and every.proven and pruned.solved >= 1
    # no cell's bound, as it stood when its MILP ran, is above its optimum
    for mc in solved:
        assert mc.bound <= mc.value * (1 + 1e-9), (mc.label(), mc.bound, mc.value)
        assert mc.value == step_time(mc.problem, mc.solution.variants, mc.solution.counts)
        assert mc.solution.status == "optimal" and mc.solution.objective == mc.value
    # the pruned search solved fewer and pruned the rest by bound
    statuses = {mc.status for mc in pruned.candidates}
    assert statuses <= {"solved", "pruned-bound", "pruned-memory", "cutoff"}
    assert "pruned-bound" in statuses
    assert len(pruned.candidates) == len(every.candidates)


def test_the_best_is_its_placement_priced(pruned, mlp):
    best = pruned.best
    mp, s = best.problem, best.solution
    assert best.value == step_time(mp, s.variants, s.counts) == s.objective
    assert best.status == "solved"
    assert s.milp_objective == pytest.approx(s.objective, rel=1e-7)
    assert mp.needs == sorted(set(best.degrees)) and mp.dp_needs == sorted({1, best.dp_top})
    assert s.kinds == [mp.kind_of(v) for v in s.variants]
    assert mp.kinds == ["fast", "slow"]
    assert best.label() in [mc.label() for mc in pruned.candidates]
    # the inputs priced: (kind, TP, micro-batch) for the searched variants
    assert (0, 1, best.cand.micro_batch_size) in pruned.inputs
    assert pruned.kinds == mlp.kinds and pruned.solve_time_s > 0
    assert not pruned.skipped and pruned.notes == []


def test_a_cutoff_at_the_optimum_keeps_nothing(pruned, mlp):
    best = pruned.best.value
    assert run(mlp, best, stage_degrees=True).best is None
    near = run(mlp, best * (1 + 2e-3), stage_degrees=True)
    assert near.best is not None and near.best.value == pytest.approx(best, rel=1e-9)


def test_without_a_fabric_no_pipeline_crosses_kinds(pruned, every, mlp):
    """A cell holds variants of both kinds, but without a fabric its placements keep to one
    (here the two fast ranks): no better than with one, and each solved one on one kind."""
    res = run(mlp, links={}, stage_degrees=True)
    solved = [mc for mc in res.candidates if mc.status == "solved"]
    assert solved and all(len(set(mc.solution.kinds)) == 1 for mc in solved)
    one_kind = [
        mc.value for mc in every.candidates
        if mc.status == "solved" and len(set(mc.solution.kinds)) == 1
    ]  # fmt: skip
    assert res.best.value >= pruned.best.value
    if one_kind:
        assert res.best.value <= min(one_kind) * (1 + 1e-9)


def test_one_degree_for_all_stages(pruned, every, mlp):
    """stage_degrees False: only cells of one TP and DP degree (and no note); the best of
    them is the every-cell search's best among one-degree cells."""
    one = run(mlp, stage_degrees=False)
    assert all(not mc.several for mc in one.candidates)
    assert not one.skipped and one.notes == []
    least = min(mc.value for mc in every.candidates if mc.status == "solved" and not mc.several)
    assert one.best.value == pytest.approx(least, rel=1e-9)
    assert one.best.value >= pruned.best.value


def test_stage_degrees_by_default_on_small_pools(pruned, mlp, monkeypatch):
    default = run(mlp)
    assert not default.skipped and default.notes == []
    assert default.best.value == pytest.approx(pruned.best.value, rel=1e-9)
    assert any(mc.dp_top > 1 for mc in default.candidates)  # 3 GPUs: DP multiples too
    monkeypatch.setattr(ms, "STAGE_DP_GPUS", 2)
    no_dp = run(mlp)
    assert all(mc.dp_top == 1 for mc in no_dp.candidates)
    assert any(mc.several for mc in no_dp.candidates)
    assert no_dp.skipped and no_dp.notes == [
        "a pipeline across kinds gives its stages one DP degree here: stages of their own TP "
        "degree are searched by default on pools of at most 2 kinds and 64 GPUs, of their own "
        "DP degree on at most 2 GPUs, by time with no deadline or budget (this one: 2 kinds, "
        "3 GPUs); --stage-degrees on searches them (minutes on large pools)"
    ]
    monkeypatch.setattr(ms, "STAGE_DEGREE_GPUS", 2)
    left = run(mlp)
    assert all(not mc.several for mc in left.candidates)
    assert left.skipped and left.notes[0].startswith(
        "a pipeline across kinds gives its stages one TP and DP degree here: "
    )
    monkeypatch.undo()
    monkeypatch.setattr(ms, "STAGE_DEGREE_KINDS", 1)
    assert run(mlp).skipped
    # pinned to one DP degree: nothing was left out by the DP rule
    monkeypatch.undo()
    monkeypatch.setattr(ms, "STAGE_DP_GPUS", 2)
    pinned = run(mlp, pins=Pins(offload="none", dp=1))
    assert not pinned.skipped and pinned.notes == []


def test_pins_restrict_every_stage(mlp):
    res = run(mlp, pins=Pins(offload="none", tp=1, dp=1, pp=2), stage_degrees=True)
    assert res.candidates
    for mc in res.candidates:
        assert mc.cand.pp == 2 and mc.cand.dp == 1 and mc.degrees == (1, 1) and mc.dp_top == 1


def test_progress_names_each_cell_built(pruned, mlp):
    res, seen = pruned, pruned.seen
    assert seen and len(seen) == len(set(seen))
    assert set(seen) <= {mc.label() for mc in res.candidates}
    assert res.best.label() in seen
    # a search of its own (the module fixture's ran in another test's setup)
    own = []
    lean = run(mlp, pins=LEAN, stage_degrees=True, progress=own.append)
    assert len(own) == len(set(own)) and lean.best.label() in own
    assert set(own) <= {mc.label() for mc in lean.candidates}


def test_a_flat_rate_is_the_step_times_it(boxes, mlp):
    """A rate of 2 a step second whatever the GPUs: the least objective is twice the least
    step over pipelines of two kinds."""
    flat = RunRate(lambda g: 2.0, lambda g: math.inf)
    res = run(mlp, rate=flat, stage_degrees=True)
    want = by_rate(boxes, flat)
    assert res.best.value == pytest.approx(want, rel=1e-9)
    assert res.best.solution.objective == pytest.approx(want / 2, rel=1e-9)
    assert res.proven
    assert run(mlp, want, rate=flat, stage_degrees=True).best is None


def test_a_rate_keeps_to_pipelines_of_two_kinds(mlp, tmp_path):
    """With a slow kind at a twentieth of the fast one's peak, the fastest pipeline keeps to
    the two fast ranks; priced by a rate, the search is over pipelines of both kinds, and a
    box that holds units of one kind for sure is split again, never solved."""
    slow = cpu_profile(tmp_path, "cpu-slow", peak_flops_fp32="5.0e9")
    kinds = [mlp.kinds[0], Kind("slow", Cluster(load_profile(slow), 1, 8), 1)]
    pool = SimpleNamespace(
        traced=mlp.traced,
        kinds=kinds,
        variants=[mlp.variants[0], variants_for(mlp.traced.graph, kinds[1].cluster, "auto")],
    )
    assert set(run(pool, stage_degrees=True).best.solution.kinds) == {0}
    flat = RunRate(lambda g: 2.0, lambda g: math.inf)
    best = run(pool, rate=flat, stage_degrees=True).best
    assert set(best.solution.kinds) == {0, 1}
    assert all(a > 0 for a in best.units_low)


def per_gpu_rate(limit=math.inf):
    """3 and 1 thousandths a GPU-second (rates below 1: a bound that took 1 for no GPUs
    would exceed every placement's); ``limit``: the longest step, whatever the GPUs."""
    return RunRate(lambda g: 0.003 * g[0] + 0.001 * g[1], lambda g: limit, (0.003, 0.001))


def budget_rate(budget: float) -> RunRate:
    """A budget: the longest step is the budget over the placement's rate, shorter with
    more GPUs."""
    rate = per_gpu_rate()
    return replace(rate, max_step_s=lambda g: budget / rate.per_step_s(g))


@pytest.fixture(scope="module")
def boxes(every):
    """(GPUs per kind, least step) of every cell at each units total of two kinds or more:
    each cell's MILP solved again with its units pinned (the brute force over boxes of one
    unit)."""
    out = []
    for mc in every.candidates:
        if mc.status != "solved":
            continue
        mp = mc.problem
        for units in itertools.product(*(range(u + 1) for u in mp.units)):
            if sum(1 for u in units if u) < 2:
                continue
            box = replace(mp, units=list(units), units_low=list(units))
            s = solve_mixed(box)
            if s.status == "optimal":
                g = [u * mc.cand.dp for u in units]
                out.append((g, step_time(box, s.variants, s.counts)))
    assert out
    return out


def by_rate(boxes, rate) -> float:
    """The least objective of the boxes within the rate's longest step."""
    return min(
        (rate.per_step_s(g) * step for g, step in boxes if step <= rate.max_step_s(g) * (1 + 1e-9)),
        default=math.inf,
    )


def test_a_rate_per_gpu_is_the_boxes_optimum(boxes, mlp):
    rate = per_gpu_rate()
    res = run(mlp, rate=rate, stage_degrees=True)
    want = by_rate(boxes, rate)
    assert res.best.value == pytest.approx(want, rel=1e-6)
    g = res.best.gpus()
    assert res.best.value == pytest.approx(rate.per_step_s(g) * res.best.solution.objective)
    assert sum(1 for x in g if x) == 2
    assert any(mc.status == "split" for mc in res.candidates)
    for mc in res.candidates:
        if mc.status == "solved":
            assert mc.bound <= mc.value * (1 + 1e-9)
            assert all(a <= b for a, b in zip(mc.units_low, mc.units))


def test_a_deadline_is_the_boxes_optimum_within_it(boxes, mlp):
    """A deadline below every box's step; a budget between the boxes' objectives, whose
    longest step shrinks with the GPUs."""
    steps = sorted({step for _, step in boxes})
    res = run(mlp, rate=per_gpu_rate(steps[0] * 0.99), stage_degrees=True)
    assert res.best is None
    costs = sorted(per_gpu_rate().per_step_s(g) * step for g, step in boxes)
    rate = budget_rate(costs[len(costs) // 2])
    got = run(mlp, rate=rate, stage_degrees=True).best
    assert got.value == pytest.approx(by_rate(boxes, rate), rel=1e-6)
    assert got.value <= costs[len(costs) // 2] * (1 + 1e-9)


# ---------------------------------------------------------------- variant parts and hops


def test_variant_parts_and_mixed_problem(pruned, mlp):
    best = pruned.best
    c = best.cand
    inp = pruned.inputs[0, 1, c.micro_batch_size]
    c2 = replace(c, micro_batch_size=1)
    inp2 = run_inputs(mlp, 0, 1, 1)
    vp = variant_parts(inp2, c2, 1, 2)
    assert vp.config.mesh.pp == c.pp and vp.config.mesh.dp == c.dp * 2 and vp.config.mesh.tp == 1
    assert vp.problem.m == 4 // (c.dp * 2)
    c, inp = c2, inp2
    assert vp.config.micro_batch_size == c.micro_batch_size and vp.config.zero_stage == c.zero
    assert vp.config.schedule == c.schedule and vp.config.virtual_stages == 1
    want = [sum(stage_time_parts(inp, [], vp.config, j)[:2]) for j in range(c.pp)]
    assert vp.base_time == want and want[-1] > 0
    assert vp.tied_sync == tied_sync_time(inp, vp.config)
    vs = [(0, 1), (1, 1)]
    ins = [pruned.inputs[0, 1, c.micro_batch_size], pruned.inputs[1, 1, c.micro_batch_size]]
    mp = mixed_problem(ins, c, vs, mlp.kinds, {(0, 1): LINK}, [1, 1], dp_needs=[1, 1])
    assert mp.variants == [(0, 1, 1), (1, 1, 1)] and mp.kinds == ["fast", "slow"]
    assert mp.needs == [1] and mp.dp_needs == [1]
    assert mp.units == unit_caps(mlp.kinds, c.dp, mp.variants, c.pp)
    parts = [variant_parts(i, c, 1, 1) for i in ins]
    assert mp.const_step == max(p.tied_sync for p in parts)
    assert mp.base_time.tolist() == [p.base_time for p in parts]
    assert mp.tied == tied_segments(ins[0])
    assert mixed_problem(ins, c, vs, mlp.kinds, {}).needs == []
    assert (
        mp.hop.tolist()
        == hop_times(ins, [p.config for p in parts], mp.variants, {(0, 1): LINK}).tolist()
    )


def test_mixed_problem_prices_each_variant_at_its_degrees(mlp):
    """Variants at TP 2 and at DP multiple 2: each priced at its own degree and multiple;
    the constant step the largest tied sync, the ties the first input's."""
    c = Candidate(2, 1, 2, 1, "gpipe", 1, 0)
    vs = [(0, 2, 1), (1, 1, 2), (0, 1, 1)]
    ins = [run_inputs(mlp, k, t, 1) for k, t, _ in vs]
    mp = mixed_problem(ins, c, vs, mlp.kinds, {(0, 1): LINK}, [1, 2], dp_needs=[2, 1, 2])
    parts = [variant_parts(i, c, t, r) for i, (_, t, r) in zip(ins, vs)]
    assert [p.config.mesh.tp for p in parts] == [2, 1, 1]
    assert [p.config.mesh.dp for p in parts] == [1, 2, 1]
    assert [sp.m for sp in mp.per_variant] == [4, 2, 4]
    assert mp.base_time.tolist() == [p.base_time for p in parts]
    assert mp.dp_needs == [1, 2] and mp.needs == [1, 2]
    assert mp.units == [2, 1]  # the fast kind's 2 GPUs; the slow one's 1 (its multiple 2 needs 2)
    # given parts and hops are taken as they are
    tied = [replace(p, tied_sync=x) for p, x in zip(parts, (0.3, 0.7, 0.1))]
    blocks = mlp.traced.blocks
    untied = SimpleNamespace(blocks=blocks, tied=[])
    fake = [SimpleNamespace(blocks=blocks, tied=[SimpleNamespace(owner=0, user=3)]), untied, untied]
    hop = np.full((1, 3, 3), 0.25)
    given = mixed_problem(fake, c, vs, mlp.kinds, {}, parts=tied, hop=hop)
    assert given.const_step == 0.7 and given.tied == [(0, 2)] and given.hop is hop


def test_hops_by_hand(pruned):
    c = replace(pruned.best.cand, pp=3)
    mbs = c.micro_batch_size
    variants = [(0, 1, 1), (1, 1, 1), (0, 2, 1)]
    ins = [
        pruned.inputs[k, t, mbs] if (k, t, mbs) in pruned.inputs else None for k, t, _ in variants
    ]
    if ins[2] is None:
        variants, ins = variants[:2], ins[:2]
    configs = [variant_parts(i, c, t, r).config for i, (_, t, r) in zip(ins, variants)]
    links = {(1, 0): (1e9, 1e-5)}  # named in the other order
    hop = hop_times(ins, configs, variants, links)
    V = len(variants)
    assert hop.shape == (2, V, V)
    for j in range(2):
        for a, (ka, ta, _) in enumerate(variants):
            inp = ins[a]
            nbytes = inp.boundary_bytes * mbs / inp.traced_mbs
            for b, (kb, tb, _) in enumerate(variants):
                if ka == kb:
                    m = configs[a].mesh
                    link = inp.cluster.link([m.rank(j, 0, 0), m.rank(j + 1, 0, 0)])
                else:
                    link = (1e9, 1e-5)
                want = hop_time(nbytes, ta, tb, *link, inp.training.pipeline_sends_shards)
                assert hop[j, a, b] == pytest.approx(want, rel=1e-12)
                assert want > 0
    # without a fabric: inf across kinds, finite within one
    bare = hop_times(ins, configs, variants, {})
    assert math.isinf(bare[0, 0, 1]) and math.isinf(bare[1, 1, 0])
    assert bare[0, 0, 0] == hop[0, 0, 0]
    assert hop_times(ins[:1], [replace(configs[0], mesh=replace(configs[0].mesh, pp=1))],
                     variants[:1], {}).shape == (0, 1, 1)  # fmt: skip


def test_hops_read_each_stages_first_rank_on_nodes_of_three():
    """Three stages of two ranks on nodes of 3 (ranks 0 1 | 2 3 | 4 5): the hop from stage 0
    stays in node 0 (ranks 0, 2), the hop from stage 1 crosses (2, 4); a traced batch of 2
    halves the bytes of a micro-batch of 4; sent as shards, a TP 2 hop sends half."""
    cluster = Cluster(CPU, 2, 3)
    training = replace(Training(4, "fp32", "sgd"), pipeline_sends_shards=True)
    inp = SimpleNamespace(boundary_bytes=3e6, traced_mbs=2, cluster=cluster, training=training)
    variants = [(0, 1, 2), (0, 2, 1)]
    configs = [Config(mesh, 4, "gpipe", 1, 0, [], []) for mesh in (Mesh(3, 2, 1), Mesh(3, 1, 2))]
    hop = hop_times([inp, inp], configs, variants, {})
    inside, across = cluster.link([0, 2]), cluster.link([2, 4])
    assert inside != across
    nbytes = 3e6 * 4 / 2
    for j, link in enumerate((inside, across)):
        assert hop[j, 0, 0] == pytest.approx(2 * p2p_time(nbytes, *link), rel=1e-12)
        assert hop[j, 1, 1] == pytest.approx(2 * p2p_time(nbytes / 2, *link), rel=1e-12)
        assert hop[j, 0, 1] == pytest.approx(hop_time(nbytes, 1, 2, *link, True), rel=1e-12)


def test_exact_objective_marks_a_milp_that_strays(pruned):
    best = pruned.best
    mp, s = best.problem, best.solution
    exact = step_time(mp, s.variants, s.counts)
    near = exact_objective(mp, replace(s, objective=exact * (1 + 5e-8)))
    assert near.status == "optimal" and near.objective == exact
    assert near.milp_objective == exact * (1 + 5e-8)
    far = exact_objective(mp, replace(s, objective=exact * (1 + 2e-7)))
    assert far.status == "inexact" and far.objective == exact
    low = exact_objective(mp, replace(s, status="node_limit", objective=exact * (1 - 2e-7)))
    assert low.status == "inexact"
    assert exact_objective(mp, replace(s, status="node_limit")).status == "node_limit"
