"""Tests written for mutants mutmut generated that the suite let survive (docs/mutation.md lists
each survivor and the test here that kills it). Each states a number from a formula written
out here, at an input where the surviving change would alter it."""

from __future__ import annotations

import pytest

from planner.hardware.collectives import p2p_time

B = 360e9  # bytes/s
ALPHA = 5e-6  # s


@pytest.mark.parametrize("nbytes", [0.5, 1.0, 2.0])
def test_a_send_of_a_byte_or_less_still_pays_its_latency(nbytes):
    """p2p_time's guard is "nothing to move" (S <= 0), not "little to move": S/B + alpha for
    any S > 0 (killed: ``if nbytes <= 1: return 0.0``)."""
    assert p2p_time(nbytes, B, ALPHA) == pytest.approx(nbytes / B + ALPHA, rel=1e-12)
