"""Tests written for mutmut's generated mutants of planner/search/mixed/cost.py
(benchmarks/generated_mutants.py): the heterogeneous step time of one placement worked out by
hand on a two-stage, two-variant problem whose every number differs (so that a term read at the
wrong stage, variant or option changes the sum), each condition of ``fits_pool`` at its edge,
and the placement errors' whole messages. docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.search.milp.data import GIB, StageProblem
from planner.search.mixed.cost import fits_pool, pipeline_time, step_time
from planner.search.mixed.milp import MixedProblem


def arrays(*rows: list[float]) -> list[np.ndarray]:
    return [np.array(r, dtype=float) for r in rows]


def variant_numbers(scale: float, m: int, **over) -> StageProblem:
    """Two stages, segments of 1 and 2 blocks with two options each; ``scale`` makes one
    variant's numbers differ from the other's. Memory is in GiB."""
    fields = dict(
        pp=2,
        v=1,
        m=m,
        seg_len=[1, 2],
        time=arrays([1.0 * scale, 2.0 * scale], [4.0 * scale, 8.0 * scale]),
        state=arrays([0.1 * GIB, 0.2 * GIB], [0.3 * GIB, 0.4 * GIB]),
        host=arrays([0.01 * GIB, 0.02 * GIB], [0.03 * GIB, 0.05 * GIB]),
        act=arrays([0.05 * GIB, 0.06 * GIB], [0.07 * GIB, 0.09 * GIB]),
        ws=arrays([0.11 * GIB, 0.12 * GIB], [0.13 * GIB, 0.14 * GIB]),
        gather=arrays([0.015 * GIB, 0.025 * GIB], [0.035 * GIB, 0.045 * GIB]),
        optim=arrays([0.001 * scale, 0.002 * scale], [0.004 * scale, 0.008 * scale]),
        offl=arrays([0.0003 * scale, 0.0005 * scale], [0.0007 * scale, 0.0011 * scale]),
        has_params=[True, True],
        const_time=[0.0, 0.0],
        inflight=[3.0, 2.0],
        const_mem=[0.5 * GIB, 0.6 * GIB],
        capacity=100 * GIB,
        host_capacity=100 * GIB,
        dp_first=arrays([0.0125 * scale, 0.025 * scale], [0.05 * scale, 0.1 * scale]),
        dp_second=arrays([0.0025 * scale, 0.005 * scale], [0.0075 * scale, 0.015 * scale]),
        dp_once=(0.03 * scale, 0.07 * scale),
        loss_mem=[0.0, 0.0],
    )
    fields.update(over)
    return StageProblem(**fields)


def two_variants(first: StageProblem | None = None, second: StageProblem | None = None, **kw):
    """Variant 0: kind 0 at TP 1, DP multiple 1, m = 4; variant 1: kind 1 at TP 2, DP multiple 2,
    m = 2, three times slower. base[v][j] and hop[0][v][u] all differ."""
    fields = dict(
        kinds=["a", "b"],
        variants=[(0, 1, 1), (1, 2, 2)],
        per_variant=[first or variant_numbers(1.0, 4), second or variant_numbers(3.0, 2)],
        base_time=np.array([[0.125, 0.25], [0.375, 0.5]]),
        hop=np.array([[[0.01, 0.02], [0.03, 0.04]]]),
        units=[1, 4],
        const_step=0.0625,
    )
    fields.update(kw)
    return MixedProblem(**fields)


# stage 0: variant 0, segment 0's block at option 1, one of segment 1's at option 0;
# stage 1: variant 1, segment 1's other block at option 1
VARIANTS = [0, 1]
COUNTS = [[[0, 1], [1, 0]], [[0, 0], [0, 1]]]


def hand_step(mp: MixedProblem) -> float:
    """The placement's step time worked out term by term from the module docstring."""
    a, b = mp.per_variant
    # stage 0 on variant 0: base[0][0], the hop to variant 1 (0.02), options (0, 1) and (1, 0)
    t0 = 0.125 + 0.02 + a.time[0][1] + a.time[1][0]
    # stage 1 on variant 1: base[1][1], option (1, 1)
    t1 = 0.5 + b.time[1][1]
    pipeline = t0 + t1 + max(3 * t0, 1 * t1)  # m = 4 and 2
    e0 = max(0.0, a.dp_first[0][1] + a.dp_first[1][0] + a.dp_once[0])
    e0 += max(0.0, a.dp_second[0][1] + a.dp_second[1][0] + a.dp_once[1])
    e1 = max(0.0, b.dp_first[1][1] + b.dp_once[0]) + max(0.0, b.dp_second[1][1] + b.dp_once[1])
    optim = max(a.optim[0][1] + a.optim[1][0], b.optim[1][1])
    offl = max(a.offl[0][1] + a.offl[1][0], b.offl[1][1])
    return pipeline + max(e0, e1) + optim + offl + mp.const_step


def test_a_placements_step_adds_its_pipeline_exposed_dp_optimizer_offload_and_constant():
    mp = two_variants()
    # t0 = 0.125 + 0.02 + 2 + 4 = 6.145; t1 = 0.5 + 24 = 24.5; 3 t0 = 18.435 < 24.5
    assert hand_step(mp) == pytest.approx(6.145 + 24.5 + 24.5 + 0.645 + 0.024 + 0.0033 + 0.0625)
    assert step_time(mp, VARIANTS, COUNTS) == pytest.approx(hand_step(mp), rel=1e-12)


def test_the_busiest_stage_is_the_one_whose_extra_micro_batches_take_longest():
    """With variant 1 fast, stage 0's 3 extra micro-batches outweigh stage 1's one."""
    mp = two_variants(second=variant_numbers(0.25, 2))
    # t0 = 6.145, t1 = 0.5 + 2 = 2.5: max(3 t0, t1) = 18.435
    assert step_time(mp, VARIANTS, COUNTS) == pytest.approx(hand_step(mp), rel=1e-12)
    assert pipeline_time(mp, [0, 1], [6.145, 2.5]) == pytest.approx(6.145 + 2.5 + 18.435)
    assert pipeline_time(mp, [1, 0], [6.145, 2.5]) == pytest.approx(6.145 + 2.5 + 7.5)


def test_the_exposed_dp_parts_are_each_clamped_at_zero():
    """Negative DP terms (a share hidden behind the backward) clamp each part at 0 on its own:
    stage 0's first part -0.5 + 0.03 < 0 counts 0, its second part still counts."""
    first = variant_numbers(
        1.0, 4, dp_first=arrays([-0.25, -0.25], [-0.25, -0.25]), dp_once=(0.03, 0.07)
    )
    second = variant_numbers(3.0, 2, dp_first=arrays([0, 0], [0, -1.0]), dp_once=(0.0, 0.0))
    mp = two_variants(first, second)
    # e0 = max(0, -0.47) + (0.005 + 0.0075 + 0.07 = 0.0825); e1 = 0 + 0.045
    a_step = step_time(mp, VARIANTS, COUNTS)
    assert a_step == pytest.approx(6.145 + 24.5 + 24.5 + 0.0825 + 0.024 + 0.0033 + 0.0625)
    assert a_step == pytest.approx(hand_step(mp), rel=1e-12)
    # the second part negative on the stage whose first part is largest: e1 = 2 + 0
    second = variant_numbers(
        3.0, 2, dp_first=arrays([0, 0], [0, 2.0]), dp_second=arrays([0, 0], [0, -1.0]),
        dp_once=(0.0, 0.0),
    )  # fmt: skip
    mp = two_variants(None, second)
    assert step_time(mp, VARIANTS, COUNTS) == pytest.approx(
        6.145 + 24.5 + 24.5 + 2.0 + 0.024 + 0.0033 + 0.0625
    )


def test_a_stage_without_parameters_pays_no_once_terms():
    """Segment 1 has no parameters: stage 1 (only segment 1's block) skips the once terms,
    stage 0 (segment 0's too) pays them."""
    once = (5.0, 7.0)  # large enough to be the step's exposed part wherever paid
    first = variant_numbers(1.0, 4, has_params=[True, False], dp_once=once)
    second = variant_numbers(3.0, 2, has_params=[True, False], dp_once=(11.0, 13.0))
    mp = two_variants(first, second)
    e0 = 0.025 + 0.05 + 5.0 + 0.005 + 0.0075 + 7.0
    e1 = 0.3 + 0.045
    expected = 6.145 + 24.5 + 24.5 + max(e0, e1) + 0.024 + 0.0033 + 0.0625
    assert step_time(mp, VARIANTS, COUNTS) == pytest.approx(expected)
    # stage 1 holding segment 0's block instead: it pays its own (11 + 13)
    counts = [[[0, 0], [1, 1]], [[1, 0], [0, 0]]]
    t0 = 0.125 + 0.02 + 4 + 8
    t1 = 0.5 + 3
    e0 = 0.05 + 0.1 + 0.0075 + 0.015
    e1 = 0.0375 + 11.0 + 0.0075 + 13.0
    optim = max(0.004 + 0.008, 0.003)
    offl = max(0.0007 + 0.0011, 0.0009)
    expected = t0 + t1 + max(3 * t0, t1) + max(e0, e1) + optim + offl + 0.0625
    assert step_time(mp, VARIANTS, counts) == pytest.approx(expected)


def test_a_one_stage_placement_has_no_hop():
    sp = variant_numbers(
        1.0, 4, pp=1, const_time=[0.0], inflight=[4.0], const_mem=[0.5 * GIB], loss_mem=[0.0]
    )
    mp = MixedProblem(["a"], [(0, 1, 1)], [sp], np.array([[0.125]]), np.zeros((0, 1, 1)), [1])
    t = 0.125 + 1.0 + 4.0 + 8.0
    e = (0.0125 + 0.05 + 0.1 + 0.03) + (0.0025 + 0.0075 + 0.015 + 0.07)
    expected = t + 3 * t + e + (0.001 + 0.004 + 0.008) + (0.0003 + 0.0007 + 0.0011)
    assert step_time(mp, [0], [[[1, 0], [1, 1]]]) == pytest.approx(expected)


def stage0_memory(sp: StageProblem) -> float:
    """Stage 0's device bytes under COUNTS: its constant, its blocks' states and 3 in-flight
    micro-batches of their activations, the largest working set and gathered buffer."""
    blocks = sp.state[0][1] + sp.state[1][0] + 3 * (sp.act[0][1] + sp.act[1][0])
    working = max(sp.ws[0][1], sp.ws[1][0], sp.loss_mem[0])
    return sp.const_mem[0] + blocks + working + max(sp.gather[0][1], sp.gather[1][0])


@pytest.mark.parametrize(("factor", "fits"), [(1.0, True), (1 - 1e-10, True), (1 - 1e-6, False)])
def test_a_stage_fits_its_kinds_capacity_to_the_byte(factor, fits):
    """Stage 0 needs 0.5 + 0.2 + 0.3 + 3 (0.06 + 0.07) + 0.13 + 0.035 GiB: at that capacity
    (or within the 1e-9 relative slack the MILP's rows have) it fits, a millionth below it
    does not."""
    need = stage0_memory(variant_numbers(1.0, 4))
    assert need == pytest.approx((0.5 + 0.2 + 0.3 + 0.39 + 0.13 + 0.035) * GIB)
    mp = two_variants(variant_numbers(1.0, 4, capacity=need * factor))
    assert math.isfinite(step_time(mp, VARIANTS, COUNTS)) is fits


def test_the_working_set_is_the_larger_of_the_loss_and_the_options():
    sp = variant_numbers(1.0, 4, loss_mem=[0.2 * GIB, 0.0])
    need = stage0_memory(sp)
    assert need == pytest.approx((0.5 + 0.2 + 0.3 + 0.39 + 0.2 + 0.035) * GIB)
    for capacity, fits in ((need, True), (need * (1 - 1e-6), False)):
        mp = two_variants(variant_numbers(1.0, 4, loss_mem=[0.2 * GIB, 0.0], capacity=capacity))
        assert math.isfinite(step_time(mp, VARIANTS, COUNTS)) is fits


def test_the_optimizer_steps_peak_must_fit_as_well():
    """The step's peak: the constant plus each block's step bytes (here above the activation
    peak of 1.585 GiB)."""
    step = arrays([0.0, 1.0 * GIB], [0.75 * GIB, 0.0])
    need = 0.5 * GIB + 1.0 * GIB + 0.75 * GIB
    for capacity, fits in ((need, True), (need * (1 - 1e-6), False)):
        mp = two_variants(variant_numbers(1.0, 4, step=step, capacity=capacity))
        assert math.isfinite(step_time(mp, VARIANTS, COUNTS)) is fits


def test_the_host_bytes_must_fit_the_kinds_host_share():
    need = (0.02 + 0.03) * GIB
    for host, fits in ((need, True), (need * (1 - 1e-6), False)):
        mp = two_variants(variant_numbers(1.0, 4, host_capacity=host))
        assert math.isfinite(step_time(mp, VARIANTS, COUNTS)) is fits


def test_an_option_the_candidate_does_not_allow_makes_the_placement_infeasible():
    allowed = [np.array([True, True]), np.array([False, True])]
    mp = two_variants(variant_numbers(1.0, 4, allowed=allowed))
    assert step_time(mp, VARIANTS, COUNTS) == math.inf  # stage 0 runs (1, 0)
    counts = [[[0, 1], [0, 1]], [[0, 0], [1, 0]]]  # both allowed on variant 0
    assert math.isfinite(step_time(mp, VARIANTS, counts))


@pytest.mark.parametrize(
    ("variants", "counts", "message"),
    [
        ([0], COUNTS, "a placement of 2 stages needs 2 variants and 2 count rows"),
        ([0, 1], COUNTS[:1], "a placement of 2 stages needs 2 variants and 2 count rows"),
        ([0, 1], [[[0, 1], [1, 0]], [[0, 0], [1, 1]]], "placement puts [1, 3] blocks per "
         "segment, not [1, 2]"),
        ([0, 1], [[[1, 0], [2, 0]], [[0, 0], [0, 0]]], "placement puts [1, 2] blocks per "
         "segment, not [1, 2]"),
    ],
)  # fmt: skip
def test_a_placement_of_the_wrong_shape_is_refused_by_name(variants, counts, message):
    with pytest.raises(ValueError) as err:
        step_time(two_variants(), variants, counts)
    assert str(err.value) == message


def pool(units, low=None, needs=(), dp_needs=(), tied=()):
    return two_variants(
        units=list(units), units_low=low, needs=list(needs), dp_needs=list(dp_needs),
        tied=list(tied),
    )  # fmt: skip


def test_each_kinds_units_must_lie_within_its_range():
    """[0, 1] take kind 0's 1 unit and kind 1's 2 x 2 = 4."""
    assert fits_pool(pool([1, 4]), VARIANTS, COUNTS)
    assert fits_pool(pool([1, 4], [1, 4]), VARIANTS, COUNTS)
    assert not fits_pool(pool([0, 4]), VARIANTS, COUNTS)
    assert not fits_pool(pool([1, 3]), VARIANTS, COUNTS)
    assert not fits_pool(pool([2, 8], [2, 4]), VARIANTS, COUNTS)
    assert not fits_pool(pool([2, 8], [1, 5]), VARIANTS, COUNTS)
    assert fits_pool(pool([2, 8]), [1, 1], COUNTS)  # 8 of kind 1
    assert not fits_pool(pool([2, 7]), [1, 1], COUNTS)
    assert math.isinf(step_time(pool([1, 3]), VARIANTS, COUNTS))


def test_some_stage_must_take_each_needed_degree_and_multiple():
    assert fits_pool(pool([2, 8], needs=[1, 2], dp_needs=[1, 2]), VARIANTS, COUNTS)
    assert not fits_pool(pool([2, 8], needs=[2]), [0, 0], COUNTS)
    assert not fits_pool(pool([2, 8], needs=[1]), [1, 1], COUNTS)
    assert not fits_pool(pool([2, 8], dp_needs=[2]), [0, 0], COUNTS)
    assert not fits_pool(pool([2, 8], dp_needs=[1]), [1, 1], COUNTS)
    assert fits_pool(pool([2, 8], needs=[2], dp_needs=[2]), [1, 1], COUNTS)


def test_the_stages_holding_a_tied_groups_blocks_share_their_degrees():
    """Segments 0 and 1 tied: both stages hold some, and their (TP, DP) differ."""
    assert not fits_pool(pool([2, 8], tied=[(0, 1)]), VARIANTS, COUNTS)
    assert fits_pool(pool([2, 8], tied=[(0, 1)]), [1, 1], COUNTS)
    # a variant of TP 1 at DP multiple 2: the same TP, another DP degree
    mp = pool([2, 8], tied=[(0, 1)])
    mp.variants = [(0, 1, 1), (1, 1, 2)]
    assert not fits_pool(mp, VARIANTS, COUNTS)
    mp.variants = [(0, 1, 1), (1, 1, 1)]
    assert fits_pool(mp, VARIANTS, COUNTS)
    # a tie of segment 0 with itself binds only the stage that holds it
    assert fits_pool(pool([2, 8], tied=[(0, 0)]), VARIANTS, COUNTS)
    assert math.isinf(step_time(pool([2, 8], tied=[(0, 1)]), VARIANTS, COUNTS))


def test_a_stage_at_the_tolerances_edge_still_fits():
    """Memory and host bytes exactly at capacity x (1 + 1e-9) fit: the slack is inclusive."""
    edge = 2.0**30 * (1 + 1e-9)
    zero = arrays([0.0, 0.0], [0.0, 0.0])
    blank = dict(state=zero, act=zero, ws=zero, gather=zero, host=zero)
    first = variant_numbers(1.0, 4, **blank, const_mem=[edge, 0.0], capacity=2.0**30)
    assert math.isfinite(step_time(two_variants(first), VARIANTS, COUNTS))
    host = arrays([0.0, edge], [0.0, 0.0])  # stage 0 runs option 1 of segment 0
    first = variant_numbers(1.0, 4, host=host, host_capacity=2.0**30)
    assert math.isfinite(step_time(two_variants(first), VARIANTS, COUNTS))
    # a byte more in either is too much
    over = variant_numbers(1.0, 4, **blank, const_mem=[edge + 256, 0.0], capacity=2.0**30)
    assert math.isinf(step_time(two_variants(over), VARIANTS, COUNTS))


def test_without_an_optimizer_step_peak_the_blocks_add_nothing_to_it():
    """A stage whose constant fills the device to the byte (1 GiB, slack 1.07 bytes) and whose
    blocks hold nothing fits when the variant has no step peak (step None): its two blocks
    add 0 bytes to the step's peak, not a byte each."""
    zero = arrays([0.0, 0.0], [0.0, 0.0])
    blank = dict(state=zero, act=zero, ws=zero, gather=zero, step=None)
    first = variant_numbers(1.0, 4, **blank, const_mem=[2.0**30, 0.0], capacity=2.0**30)
    assert math.isfinite(step_time(two_variants(first), VARIANTS, COUNTS))


def test_each_stage_pays_the_hop_to_the_stage_after_it():
    """Three stages on variants 0, 1, 1: stage 1's hop is hop[1][1][1] (to stage 2's
    variant), not hop[1][1][0] (stage 0's); the last stage pays none."""
    first = variant_numbers(
        1.0, 4, pp=3, const_time=[0.0] * 3, inflight=[3.0, 2.0, 1.0], const_mem=[0.5 * GIB] * 3,
        loss_mem=[0.0] * 3,
    )  # fmt: skip
    second = variant_numbers(
        3.0, 4, pp=3, const_time=[0.0] * 3, inflight=[3.0, 2.0, 1.0], const_mem=[0.5 * GIB] * 3,
        loss_mem=[0.0] * 3,
    )  # fmt: skip
    base = np.array([[0.125, 0.25, 0.0625], [0.375, 0.5, 0.75]])
    hop = np.array([[[0.01, 0.02], [0.03, 0.04]], [[0.05, 0.06], [0.07, 0.08]]])
    mp = two_variants(first, second, base_time=base, hop=hop, units=[1, 8])
    counts = [[[1, 0], [0, 0]], [[0, 0], [1, 0]], [[0, 0], [0, 1]]]
    t = [0.125 + 0.02 + 1.0, 0.5 + 0.08 + 12.0, 0.75 + 24.0]
    exposed = max(0.0125 + 0.0025 + 0.1, 0.15 + 0.0225 + 0.09 + 0.21, 0.3 + 0.045 + 0.3)
    optim = max(0.001, 0.012, 0.024)
    offl = max(0.0003, 0.0021, 0.0033)
    expected = sum(t) + 3 * max(t) + exposed + optim + offl + 0.0625
    assert step_time(mp, [0, 1, 1], counts) == pytest.approx(expected)


def test_the_pools_lists_must_match_in_length():
    """A least-units list of another length than the kinds', or fewer count rows than
    variants, is refused (zip's strict), not cut short."""
    mp = pool([1, 4], [1])
    with pytest.raises(ValueError):
        fits_pool(mp, VARIANTS, COUNTS)
    with pytest.raises(ValueError):
        fits_pool(pool([2, 8], tied=[(0, 1)]), VARIANTS, COUNTS[:1])
