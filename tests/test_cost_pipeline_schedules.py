"""The pipeline's step-time term (``cost.pipeline.pipeline_time``) for each schedule of the
vocabulary, against the step computed here by hand for small, unequal stage times (the
schedules' timelines as Huang et al. 2019 (GPipe) and Narayanan et al. 2021 (1F1B and its
interleaved form, Sec. 2.2) draw them), and the point-to-point hop it adds per micro-batch."""

from __future__ import annotations

import pytest

from planner.cost.pipeline import hop_time, pipeline_time
from planner.cost.records import Config, StageCost
from planner.schema.mesh import Mesh
from planner.vocab import Schedule


def _stages(times: list[float], p: int) -> list[StageCost]:
    return [
        StageCost(
            index=s,
            pp_rank=s % p,
            blocks=[s],
            compute_s=t,
            tp_comm_s=0.0,
            p2p_s=0.0,
            time_s=t,
            fwd_s=t / 3,
            bwd_s=2 * t / 3,
            dp_comm_s=0.0,
            dp_exposed_s=0.0,
            optimizer_s=0.0,
            offload_s=0.0,
            inflight=1,
        )  # fmt: skip
        for s, t in enumerate(times)
    ]


def _config(schedule: Schedule, p: int, v: int) -> Config:
    return Config(Mesh(p, 1, 1), 1, schedule.value, v, 0, list(range(p * v)), [0] * (p * v))


@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B])
def test_one_chunk_schedules_by_hand(schedule):
    """Three stages of 2, 5 and 3 ms a micro-batch (forward and backward), 4 micro-batches.
    The first micro-batch passes every stage once, 2 + 5 + 3 = 10 ms; the slowest stage (5 ms)
    then runs the other 3 back to back, 15 ms: 25 ms. GPipe (all forwards, then all
    backwards) and 1F1B reorder the same work and have the same critical path; they differ in
    memory. Bubble: the step less the busiest stage's own m x 5 = 20 ms, 5 ms = 2 + 3."""
    stages = _stages([0.002, 0.005, 0.003], 3)
    step, bubble = pipeline_time(stages, _config(schedule, 3, 1), 4)
    assert step == pytest.approx(0.002 + 0.005 + 0.003 + 3 * 0.005)
    assert step == pytest.approx(0.025)
    assert bubble == pytest.approx(0.025 - 4 * 0.005)


@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B])
def test_one_chunk_equal_stages_bubble_is_p_minus_1_over_m(schedule):
    """p = 4 equal stages of 1 ms, m = 8: 8 + 3 = 11 ms, bubble (p - 1) / m of the 8 ms."""
    step, bubble = pipeline_time(_stages([0.001] * 4, 4), _config(schedule, 4, 1), 8)
    assert step == pytest.approx(0.011)
    assert bubble / 0.008 == pytest.approx(3 / 8)


def test_one_stage_is_m_times_its_time():
    step, bubble = pipeline_time(_stages([0.004], 1), _config(Schedule.ONE_F_ONE_B, 1, 1), 6)
    assert (step, bubble) == (pytest.approx(0.024), pytest.approx(0.0))


def test_interleaved_by_hand():
    """p = 2 ranks, v = 2 chunks each, m = 4. Chunks (virtual stages 0..3) of 1, 2, 3 and
    1 ms; rank 0 runs chunks 0 and 2 (4 ms a micro-batch), rank 1 chunks 1 and 3 (3 ms). The
    busiest rank runs its m micro-batches back to back, 4 x 4 = 16 ms, plus a warm-up and
    cool-down of (p - 1) of the slowest chunk, 1 x 3 = 3 ms: 19 ms; bubble 3 ms."""
    stages = _stages([0.001, 0.002, 0.003, 0.001], 2)
    step, bubble = pipeline_time(stages, _config(Schedule.INTERLEAVED, 2, 2), 4)
    assert step == pytest.approx(4 * (0.001 + 0.003) + (2 - 1) * 0.003)
    assert step == pytest.approx(0.019)
    assert bubble == pytest.approx(0.003)


def test_interleaved_equal_chunks_bubble_is_one_vth_of_1f1b():
    """p = 4, v = 3, m = 8, every chunk 1 ms (a rank's 3 ms what a 1F1B stage of the same
    layers takes): 8 x 3 + 3 x 1 = 27 ms, bubble 3 ms = (p - 1) / (v m) of the 24 ms
    (1F1B: 8 x 3 + 3 x 3 = 33 ms, bubble 9 ms)."""
    inter, bubble = pipeline_time(_stages([0.001] * 12, 4), _config(Schedule.INTERLEAVED, 4, 3), 8)
    assert inter == pytest.approx(0.027)
    assert bubble / 0.024 == pytest.approx(3 / (3 * 8))
    one, one_bubble = pipeline_time(_stages([0.003] * 4, 4), _config(Schedule.ONE_F_ONE_B, 4, 1), 8)
    assert one == pytest.approx(0.033)
    assert one_bubble == pytest.approx(0.009)


def test_hop_is_an_activation_forward_and_its_gradient_back():
    """A boundary of 64 MiB at TP 4, 25 GB/s and 10 us a message: whole activations cost
    2 x (64 MiB / 25 GB/s + 10 us) = 5.3887 ms; Megatron's scatter/gather sends 1/t of it from
    each TP rank, 2 x (16 MiB / 25 GB/s + 10 us) = 1.3622 ms. Between stages of TP 2 and 4,
    each of the 4 receivers takes a whole copy, 2 per sender: 2 x 64 MiB forward; the
    gradient back is one whole copy: 3 x 64 MiB / 25 GB/s + 2 x 10 us = 8.0731 ms."""
    mib64, bw, lat = 64 * 2**20, 25e9, 10e-6
    assert hop_time(mib64, 4, 4, bw, lat, shards=False) == pytest.approx(2 * (mib64 / bw + lat))
    assert hop_time(mib64, 4, 4, bw, lat, shards=False) == pytest.approx(5.3887e-3, rel=1e-4)
    assert hop_time(mib64, 4, 4, bw, lat, shards=True) == pytest.approx(1.3622e-3, rel=1e-4)
    assert hop_time(mib64, 2, 4, bw, lat, shards=False) == pytest.approx(8.0731e-3, rel=1e-4)
