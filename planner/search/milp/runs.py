"""The stage MILPs' HiGHS runs kept on disk, keyed by exactly what HiGHS was given.

A warm ``plan`` (the trace cached) spent most of its search in HiGHS, proving the same stage
MILPs it proved the run before: on Llama-3-70B / 64 the baselines' MILPs (Megatron's rule: an
8-stage interleaved pipeline, a 300-node first pass and a 2,000-node second one) were about 3 s
of CPU of a 3.6 s plan. HiGHS is deterministic for a given model and options (the search's
limits are node counts, never the clock), so what it returns is a function of those alone: the
key here is a hash of the arrays handed to it (costs, the sparse matrix, row and column bounds,
integrality, the objective's constant), of its options (node limit, gaps, cutoff) and of its
version. A run read back is what solving would return, to the bit, and the stage MILP's own
code turns it into a placement as before; so plans and certificates do not change, and any
change to the cost model or the MILP's rows changes the arrays and so the key.

One small JSON file per run (status, proven bound, nodes, the solution's column values:
Python's float repr round-trips exactly), in the trace cache's folder; a file that cannot be
read or written only costs the solve.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from planner.atomic import write_text_atomic
from planner.trace.cache import cache_dir


@dataclass
class HighsRun:
    """What the stage MILP reads from a finished HiGHS instance."""

    model_status: str  # "optimal", "infeasible" or "other" (what solve_stage_milp tells apart)
    dual_bound: float
    nodes: int
    primal_feasible: bool
    x: list[float]  # the solution's column values (empty when there is none)


@functools.cache
def _highs_version() -> str:
    return importlib.metadata.version("highspy")


def run_key(arrays: list[np.ndarray], options: dict[str, float | int | None]) -> str:
    """The hash of one HiGHS input: each array's dtype, shape and bytes, the options, the
    solver's version."""
    digest = hashlib.sha256(_highs_version().encode())
    digest.update(json.dumps(options, sort_keys=True).encode())
    for a in arrays:
        a = np.ascontiguousarray(a)
        digest.update(f"{a.dtype.str}{a.shape}".encode())
        digest.update(a.tobytes())
    return digest.hexdigest()[:32]


class RunStore:
    """HiGHS runs on disk under ``folder`` (default: the trace cache's ``milp`` folder)."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder if folder is not None else cache_dir() / "milp"
        self.read = 0  # runs read back (tests and benchmarks say how many solves were saved)

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def load(self, key: str) -> HighsRun | None:
        try:
            run = HighsRun(**json.loads(self._path(key).read_text()))
        except (OSError, ValueError, TypeError):
            return None
        self.read += 1
        return run

    def save(self, key: str, run: HighsRun) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self._path(key), json.dumps(asdict(run), separators=(",", ":")))
        except (OSError, TypeError, ValueError):
            pass  # a cache that cannot be written only costs time
