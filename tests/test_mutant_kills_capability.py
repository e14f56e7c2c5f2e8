"""Tests written for mutmut's generated mutants of runtime/capability.py (what the runtime can
build, refused before any process starts; benchmarks/generated_mutants.py). One process: a
plan as ``check_runnable`` reads it (its ``Mesh``, ZeRO stage and schedule) on each side of
each limit, every refusal's whole line compared. docs/mutation.md names the mutants each test
kills."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from planner.errors import UserInputError
from planner.schema import Mesh
from planner.vocab import Schedule
from runtime.capability import check_runnable

ZERO1 = (
    "ZeRO-1 with pipeline or tensor parallelism: torch's ZeroRedundancyOptimizer holds "
    "neither DTensors nor pipeline stages; plan again with --zero 0, 2 or 3"
)
CP = (
    "this runtime runs context parallelism without pipelining or expert parallelism: "
    "plan again with --cp 1, or with --pp 1 --ep 1"
)
ROUND_ROBIN = (
    "stages of DP degrees 2/1 run GPipe only: under 1F1B each replica's own warm-up waits "
    "for micro-batches its narrower neighbour sends later, and the pipeline can deadlock; "
    "plan again with --schedule gpipe or one DP degree"
)


def _plan(mesh: Mesh, zero: int = 0, schedule: Schedule = Schedule.ONE_F_ONE_B):
    return SimpleNamespace(mesh=mesh, zero_stage=zero, schedule=schedule)


@pytest.mark.parametrize(
    "mesh,zero,schedule,says",
    [
        (Mesh(pp=2, dp=2, tp=1), 1, Schedule.ONE_F_ONE_B, ZERO1),
        (Mesh(pp=1, dp=2, tp=2), 1, Schedule.ONE_F_ONE_B, ZERO1),
        (Mesh(pp=1, dp=2, tp=1, cp=2, ep=2), 0, Schedule.ONE_F_ONE_B, CP),
        (Mesh(pp=2, dp=1, tp=1, cp=2), 2, Schedule.GPIPE, CP),
        (Mesh(pp=2, dp=2, tp=1, stage_dp=(2, 1)), 0, Schedule.ONE_F_ONE_B, ROUND_ROBIN),
    ],
    ids=["zero1-pp2", "zero1-tp2", "cp2-ep2", "cp2-pp2", "dp2/1-1f1b"],
)
def test_what_the_runtime_cannot_build_is_refused_in_one_line(mesh, zero, schedule, says):
    with pytest.raises(UserInputError) as err:
        check_runnable(_plan(mesh, zero, schedule))
    assert str(err.value) == says


@pytest.mark.parametrize(
    "mesh,zero,schedule",
    [
        (Mesh(pp=1, dp=4, tp=1), 1, Schedule.ONE_F_ONE_B),
        (Mesh(pp=2, dp=2, tp=2), 2, Schedule.ONE_F_ONE_B),
        (Mesh(pp=2, dp=2, tp=2), 0, Schedule.ONE_F_ONE_B),
        (Mesh(pp=1, dp=2, tp=2, cp=2), 3, Schedule.ONE_F_ONE_B),
        (Mesh(pp=2, dp=2, tp=1, ep=2), 0, Schedule.ONE_F_ONE_B),
        (Mesh(pp=2, dp=2, tp=1, stage_dp=(2, 1)), 0, Schedule.GPIPE),
        (Mesh(pp=2, dp=2, tp=1, stage_dp=(2, 2)), 0, Schedule.ONE_F_ONE_B),
    ],
    ids=[
        "zero1-dp",
        "zero2-pp2-tp2",
        "zero0-pp2-tp2",
        "cp2-tp2",
        "ep2-pp2",
        "dp2/1-gpipe",
        "dp2/2-1f1b",
    ],  # fmt: skip
)
def test_what_it_can_build_passes(mesh, zero, schedule):
    assert check_runnable(_plan(mesh, zero, schedule)) is None
