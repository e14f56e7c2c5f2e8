"""What this runtime can build, checked before any process starts (``plan run``) and again in
each worker (a batch of plans skips ``plan run``)."""

from __future__ import annotations

from planner.errors import UserInputError
from planner.schema import Plan
from planner.vocab import Schedule


def check_runnable(plan: Plan) -> None:
    """Refuse, before any process starts, what the runtime cannot build (one line, no trace)."""
    mesh = plan.mesh
    if plan.zero_stage == 1 and (mesh.pp > 1 or mesh.tp > 1):
        raise UserInputError(
            "ZeRO-1 with pipeline or tensor parallelism: torch's ZeroRedundancyOptimizer holds "
            "neither DTensors nor pipeline stages; plan again with --zero 0, 2 or 3"
        )
    if mesh.cp > 1 and (mesh.pp > 1 or mesh.ep > 1):
        raise UserInputError(
            "this runtime runs context parallelism without pipelining or expert parallelism: "
            "plan again with --cp 1, or with --pp 1 --ep 1"
        )
    if mesh.round_robin and plan.schedule != Schedule.GPIPE:
        raise UserInputError(
            f"stages of DP degrees {mesh.dp_label} run GPipe only: under 1F1B each replica's "
            "own warm-up waits for micro-batches its narrower neighbour sends later, and the "
            "pipeline can deadlock; plan again with --schedule gpipe or one DP degree"
        )
