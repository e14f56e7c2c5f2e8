"""plan.json: the plan's schema (typed records, ``planner.schema.plan``), the mesh that owns the
rank formula (``planner.schema.mesh``), its JSON form, and the checks every loaded plan passes.

This package is what the runtime and the report read; it imports neither torch nor the solver,
so a torchrun worker reads a plan without loading either.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from planner.atomic import write_text_atomic
from planner.errors import UserInputError
from planner.schema.checks import SCHEMA, validate_plan
from planner.schema.mesh import Mesh
from planner.schema.plan import (
    Alternative,
    BlockPlan,
    CandidatePoint,
    ClusterInfo,
    Memory,
    ModelInfo,
    Plan,
    Prediction,
    SchemaError,
    SolverRecord,
    StagePlan,
)
from planner.training import replica_counts

__all__ = [
    "SCHEMA",
    "Alternative",
    "BlockPlan",
    "CandidatePoint",
    "ClusterInfo",
    "Memory",
    "Mesh",
    "ModelInfo",
    "Plan",
    "Prediction",
    "SolverRecord",
    "StagePlan",
    "dumps",
    "load_plan",
    "plan_from_dict",
    "validate_plan",
    "write_plan",
]


def dumps(plan: Plan | dict) -> str:
    """plan.json's text: sorted keys, two-space indent, one trailing newline. Strict JSON: a
    number JSON cannot hold (inf, nan) is a bug in the writer, refused here rather than written
    as a file ``load_plan`` would refuse."""
    data = plan.to_dict() if isinstance(plan, Plan) else plan
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"


def write_plan(plan: Plan | dict, out_dir: Path) -> Path:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserInputError(f"cannot create output directory {out_dir}: {exc.strerror}") from exc
    if not os.access(out_dir, os.W_OK):
        raise UserInputError(f"output directory {out_dir} is not writable: choose --out DIR")
    path = out_dir / "plan.json"
    try:
        write_text_atomic(path, dumps(plan))
    except OSError as exc:
        raise UserInputError(f"cannot write {path}: {exc.strerror}") from exc
    return path


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan; every defect is a one-line UserInputError."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UserInputError(f"plan {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserInputError(f"plan {path} cannot be read: {exc}") from exc
    try:
        plan = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserInputError(
            f"plan {path} is not valid JSON (line {exc.lineno}): {exc.msg}"
        ) from None
    return plan_from_dict(plan, str(path))


def plan_from_dict(data: Any, where: str = "(in memory)") -> Plan:
    """A validated plan record from plan.json's dict."""
    validate_plan(data, where)
    try:
        plan = Plan.from_dict(data)
    except SchemaError as exc:
        raise UserInputError(f"plan {where}: {exc}") from None
    for st in plan.stages:  # written before the counts were stored (checked equal if present)
        if not st.num_microbatches or not st.local_batch_size:
            st.local_batch_size, st.num_microbatches = replica_counts(
                plan.global_batch_size, plan.mesh.dp_of(st.pp_rank), plan.micro_batch_size
            )
    return plan
