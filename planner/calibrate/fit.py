"""Alpha-beta fits of measured collective times, in the cost model's own terms.

The cost model (planner/collectives.py) prices a ring collective of S bytes over n ranks as

    t = c_kind(n) * S / B + d_kind(n) * alpha

with (c, d) = (2(n-1)/n, 2(n-1)) for all-reduce, ((n-1)/n, n-1) for all-gather, reduce-scatter
and all-to-all, and (1, 1) for point-to-point. Calibration therefore fits the unknowns
x = (1/B, alpha) by least squares over every measured (kind, S, t) at once: the profile then
holds the one (B, alpha) pair that makes the cost model's collective times closest to the
measured ones, not a figure the model would reinterpret.

Rows are weighted by 1/t (relative error): message sizes span four orders of magnitude, and
unweighted least squares would let the largest messages decide alpha alone. Both unknowns are
constrained to be >= 0 (non-negative least squares), since a negative latency is noise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from planner.hardware.collectives import ring_factors


@dataclass(frozen=True)
class AlphaBeta:
    """A fitted latency (s per ring step) and bandwidth (bytes/s), with the fit's quality."""

    alpha: float
    bandwidth: float
    max_rel_error: float  # largest |model - measured| / measured over the fitted points
    points: int

    def time(self, kind: str, n: int, nbytes: float) -> float:
        """The fitted model's time of one ``kind`` over ``n`` ranks moving ``nbytes``."""
        c, d = ring_factors(kind, n)
        return c * nbytes / self.bandwidth + d * self.alpha


def fit_alpha_beta(samples: Iterable[tuple[str, int, float, float]]) -> AlphaBeta:
    """Fit (alpha, B) to samples ``(kind, n, nbytes, seconds)`` under the ring model above.

    Exact data (times computed from some alpha >= 0 and B > 0) is recovered exactly. Raises
    ValueError when the data cannot determine a bandwidth (fewer than two distinct sizes, or
    times that do not grow with size)."""
    rows: list[tuple[float, float]] = []
    times: list[float] = []
    sizes: set[float] = set()
    for kind, n, nbytes, seconds in samples:
        if not (seconds > 0 and math.isfinite(seconds) and nbytes > 0):
            raise ValueError(f"bad sample {kind} n={n} S={nbytes} t={seconds}")
        c, d = ring_factors(kind, n)
        rows.append((c * nbytes, d))
        times.append(seconds)
        sizes.add(float(nbytes))
    if len(sizes) < 2:
        raise ValueError("an alpha-beta fit needs at least two message sizes")
    a = np.array(rows, dtype=float)
    t = np.array(times, dtype=float)
    w = 1.0 / t
    # Scale the columns to order one so nnls is well conditioned whatever the units.
    scale = np.maximum(np.abs(a).max(axis=0), 1e-300)
    x_scaled, _ = nnls(a / scale * w[:, None], t * w)
    inv_bw, alpha = x_scaled / scale
    if not inv_bw > 0:
        raise ValueError("collective times do not grow with message size: no bandwidth to fit")
    model = a @ np.array([inv_bw, alpha])
    rel = float(np.max(np.abs(model - t) / t))
    return AlphaBeta(
        alpha=float(alpha), bandwidth=float(1.0 / inv_bw), max_rel_error=rel, points=len(times)
    )


def fit_each(samples: Sequence[tuple[str, int, float, float]]) -> dict[str, AlphaBeta]:
    """One fit per collective kind (for the profile's comments: how far apart they are)."""
    kinds = sorted({s[0] for s in samples})
    return {k: fit_alpha_beta([s for s in samples if s[0] == k]) for k in kinds}
