"""The search's bounds kept beside the trace: each candidate's split bound and LP relaxation,
by a hash of exactly what they were computed from.

After the stage MILPs (milp.runs), most of a warm plan's search is bounding candidates before
any MILP: Llama-3-70B / 64 with a global batch of 1,024 takes about 600 pipelines through the LP
relaxation (a HiGHS LP each) and two dozen through split_bound's dynamic program, the same
numbers every time the same model is planned on the same cluster. Both are functions of their
inputs alone: the LP of the arrays handed to HiGHS (and its version; it is solved with fixed
options), the split bound of the StageProblem (and split_bound's own code). So a result kept
under a hash of those inputs is the one computing it would give, and the search's pruning,
certificates and plan do not change; any change to the cost model changes the inputs and so the
key. The candidates' StageProblems are still built (their hash is the key, and the MILP reads
them).

One JSON file per trace (the variants' and probes' way), read when a plan starts and written
when it has added to it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from planner.atomic import write_text_atomic
from planner.search.milp.data import StageProblem
from planner.search.milp.runs import run_key
from planner.search.milp.split_bound import SplitBound, split_bound
from planner.trace.cache import cache_dir, code_hash

# the modules whose code decides a split bound from its StageProblem
SPLIT_CODE = ("search/milp/split_bound.py", "search/milp/data.py")


def problem_key(sp: StageProblem) -> str:
    """A hash of every number in ``sp``, field by field (arrays by dtype, shape and bytes,
    floats by their exact repr)."""
    digest = hashlib.sha256(code_hash(SPLIT_CODE).encode())

    def add(value) -> None:
        if isinstance(value, np.ndarray):
            a = np.ascontiguousarray(value)
            digest.update(f"a{a.dtype.str}{a.shape}".encode())
            digest.update(a.tobytes())
        elif isinstance(value, list | tuple):
            digest.update(f"l{len(value)}".encode())
            for item in value:
                add(item)
        else:
            digest.update(f"s{value!r};".encode())

    for f in dataclasses.fields(sp):
        digest.update(f.name.encode())
        add(getattr(sp, f.name))
    return digest.hexdigest()[:32]


class BoundMemo:
    """Split bounds and LP relaxations by their inputs' hash; ``added`` says whether any was
    computed here (and the file needs writing)."""

    def __init__(self, entries: dict | None = None) -> None:
        self.entries: dict[str, list] = entries or {}
        self.added = 0

    def split(self, sp: StageProblem) -> SplitBound:
        """split_bound(sp), computed once."""
        key = "s" + problem_key(sp)
        if key not in self.entries:
            found = split_bound(sp)
            self.entries[key] = [found.max_stage, found.sum_stages, found.weighted_max]
            self.added += 1
        return SplitBound(*self.entries[key])

    def adopt(self, entries: dict[str, list]) -> None:
        """Take the bounds another copy of this memo computed (a forked search's) where this
        one has none, to be saved as if computed here."""
        for key, entry in entries.items():
            if key not in self.entries:
                self.entries[key] = entry
                self.added += 1

    def lp(self, solve: Callable[..., tuple[str, float]], *arrays: np.ndarray) -> tuple:
        """``solve(*arrays)`` (bounds._solve_lp: min c.x over the LP those arrays are), once."""
        pattern = arrays[1]
        flat = [arrays[0], pattern.indptr, pattern.indices, pattern.data(arrays[2]), *arrays[3:]]
        key = "l" + run_key(flat, {"lp": "presolve off"})
        if key not in self.entries:
            self.entries[key] = list(solve(*arrays))
            self.added += 1
        status, value = self.entries[key]
        return status, float(value)


def bounds_path(trace_key: str) -> Path:
    return cache_dir() / "bounds" / f"{trace_key}.json"


def load_bounds(trace_key: str) -> BoundMemo:
    """The bounds an earlier plan of this trace kept (none if there is no readable file)."""
    try:
        entries = json.loads(bounds_path(trace_key).read_text())
    except (OSError, ValueError):
        return BoundMemo()
    return BoundMemo(entries if isinstance(entries, dict) else None)


def save_bounds(trace_key: str, memo: BoundMemo) -> None:
    """Keep ``memo`` for the next plan of this trace (a failed write only costs time)."""
    path = bounds_path(trace_key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(memo.entries, separators=(",", ":")))
    except (OSError, TypeError, ValueError):
        pass
