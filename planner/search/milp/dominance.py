"""Options that no other option of their segment beats on every coefficient a problem reads:
the only ones the stage MILP and its LP relaxation need."""

from __future__ import annotations

import numpy as np

from planner.search.milp.data import StageProblem

# What the stage MILP reads of an option: time, memory rows, working set, gathered buffer,
# host bytes, optimizer and offload time, and the exposed-DP coefficients (which fall as
# backward time grows).
MILP_FIELDS = (
    "time", "state", "host", "act", "ws", "gather", "optim", "offl", "dp_first", "dp_second",
    "step",
)  # fmt: skip
# What bounds.relaxed_bound's LP reads (it drops the working set, the gathered buffer and the
# DP exposure, which are >= 0).
LP_FIELDS = ("time", "state", "host", "act", "optim", "offl")


def undominated(sp: StageProblem, fields: tuple[str, ...] = MILP_FIELDS) -> list[list[int]]:
    """Per segment, the allowed options that no other allowed option beats on every one of
    ``fields`` (each a per-option coefficient the problem has only on the smaller-is-better
    side of its rows and objective). Dropping the rest is exact: swapping a dominated option
    for its dominator never worsens a constraint or the objective. Identical options keep
    the first."""
    keep = []
    for s in range(len(sp.seg_len)):
        rows = np.stack([getattr(sp, f)[s] for f in fields if getattr(sp, f) is not None], axis=1)
        tol = 1e-12 * (np.abs(rows).max(axis=0) + 1e-300)
        allowed = np.ones(len(rows), bool) if sp.allowed is None else sp.allowed[s]
        rows = np.where(allowed[:, None], rows, np.inf)
        le = np.all(rows[None, :, :] <= rows[:, None, :] + tol, axis=2)  # [o, o']: o' <= o
        lt = np.any(rows[None, :, :] < rows[:, None, :] - tol, axis=2)  # o' < o somewhere
        with np.errstate(invalid="ignore"):  # inf - inf between two disallowed options
            same = np.all(np.abs(rows[None, :, :] - rows[:, None, :]) <= tol, axis=2)
        earlier = np.tril(np.ones((len(rows), len(rows)), bool), k=-1)  # o' < o
        dominated = np.any(le & lt, axis=1) | np.any(same & earlier, axis=1)
        keep.append([o for o in range(len(rows)) if allowed[o] and not dominated[o]])
    return keep
