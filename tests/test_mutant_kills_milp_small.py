"""Tests written for mutmut's generated mutants of planner/search/milp/dominance.py and
planner/search/milp/columns.py (benchmarks/generated_mutants.py). Dominance is compared with a
brute force over every pair of options (small integer coefficients, so ties are common; the
tolerance's own cases by hand); the column layout with its starts summed by hand.
docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

from planner.search.milp.columns import Columns
from planner.search.milp.data import StageProblem
from planner.search.milp.dominance import LP_FIELDS, MILP_FIELDS, undominated

COEFFICIENTS = ("time", "state", "host", "act", "ws", "gather", "optim", "offl", "dp_first",
                "dp_second")  # fmt: skip


def _problem(per_field: dict[str, list[np.ndarray]], allowed=None, step=None) -> StageProblem:
    segments = len(per_field["time"])
    return StageProblem(
        pp=1, v=1, m=1, seg_len=[1] * segments, **per_field, has_params=[True],
        const_time=[0.0], inflight=[1], const_mem=[0.0], capacity=1.0, host_capacity=1.0,
        allowed=allowed, step=step,
    )  # fmt: skip


def _brute(sp: StageProblem, fields: tuple[str, ...]) -> list[list[int]]:
    """Per segment, each allowed option that no other allowed option beats (at or below on
    every field, strictly below on one), nor an earlier allowed one equals on every field."""
    keep = []
    for s in range(len(sp.seg_len)):
        names = [f for f in fields if getattr(sp, f) is not None]
        rows = [tuple(getattr(sp, f)[s][o] for f in names) for o in range(len(sp.time[s]))]
        ok = [True] * len(rows) if sp.allowed is None else list(sp.allowed[s])
        kept = []
        for o, row in enumerate(rows):
            if not ok[o]:
                continue
            beaten = any(
                ok[p] and all(a <= b for a, b in zip(rows[p], row)) and rows[p] != row
                for p in range(len(rows))
            )
            twin = any(ok[p] and rows[p] == row for p in range(o))
            if not (beaten or twin):
                kept.append(o)
        keep.append(kept)
    return keep


@pytest.mark.parametrize("seed", range(12))
def test_the_undominated_options_are_the_brute_forces(seed):
    rng = np.random.default_rng(seed)
    segments, options = 1 + seed % 3, 3 + seed % 5
    per_field = {
        f: [rng.integers(0, 3, options).astype(float) for _ in range(segments)]
        for f in COEFFICIENTS
    }
    step = [rng.integers(0, 3, options).astype(float) for _ in range(segments)]
    allowed = [rng.random(options) < 0.7 for _ in range(segments)]
    for allow, with_step in itertools.product((None, allowed), (None, step)):
        sp = _problem(per_field, allow, with_step)
        assert undominated(sp) == _brute(sp, MILP_FIELDS)
        assert undominated(sp, LP_FIELDS) == _brute(sp, LP_FIELDS)


def _one_segment(**rows: list[float]) -> StageProblem:
    width = len(next(iter(rows.values())))
    per_field = {f: [np.array(rows.get(f, [0.0] * width), dtype=float)] for f in COEFFICIENTS}
    return _problem(per_field)


def test_the_lp_reads_its_own_fields_only():
    """Option 1 is slower but needs less working set, a smaller gathered buffer and less DP
    exposure: the MILP keeps it, the LP (which drops those three) does not."""
    for field in ("ws", "gather", "dp_first", "dp_second"):
        sp = _one_segment(time=[1.0, 2.0], **{field: [5.0, 1.0]})
        assert undominated(sp) == [[0, 1]]
        assert undominated(sp, LP_FIELDS) == [[0]]
    step = _one_segment(time=[1.0, 2.0])
    step.step = [np.array([5.0, 1.0])]  # a lighter optimizer step: the MILP reads it
    assert undominated(step) == [[0, 1]] and undominated(step, LP_FIELDS) == [[0]]


def test_options_closer_than_the_tolerance_are_the_same_option():
    """Within 1e-12 of a field's largest magnitude options tie (the first kept); beyond it the
    smaller wins. The tolerance is relative: coefficients of 1e-13 still differ."""
    assert undominated(_one_segment(time=[1.0 + 1e-14, 1.0])) == [[0]]
    assert undominated(_one_segment(time=[1.0 + 1e-10, 1.0])) == [[1]]
    assert undominated(_one_segment(time=[2e-13, 1e-13])) == [[1]]
    assert undominated(_one_segment(time=[1e-13, 2e-13])) == [[0]]
    # one slower within the tolerance, one lighter beyond it: option 1 dominates
    assert undominated(_one_segment(time=[1.0, 1.0 + 1e-14], state=[3.0, 2.0])) == [[1]]
    # faster beyond it, heavier within it: option 0 dominates
    assert undominated(_one_segment(time=[1.0, 2.0], state=[1.0 + 1e-14, 1.0])) == [[0]]
    # negative coefficients (the DP exposure falls with backward time) by magnitude
    assert undominated(_one_segment(dp_first=[-3.0, -3.0 - 1e-13])) == [[0]]
    assert undominated(_one_segment(dp_first=[-3.0, -3.5])) == [[1]]


def test_a_disallowed_option_neither_stays_nor_beats_another():
    sp = _one_segment(time=[1.0, 2.0, 2.0, 3.0])
    sp.allowed = [np.array([False, True, True, True])]
    assert undominated(sp) == [[1]]
    sp.allowed = [np.array([False, False, True, True])]
    assert undominated(sp) == [[2]]
    sp.allowed = [np.array([False, False, False, False])]
    assert undominated(sp) == [[]]
    sp.allowed = [np.array([False, True, False, True])]  # two disallowed: inf - inf
    assert undominated(sp) == [[1]]


class _Layout(Columns):
    def __init__(self, widths: dict[str, int]) -> None:
        self.widths = widths

    def blocks(self):
        return tuple(self.widths.items())


def test_each_block_starts_where_the_ones_before_it_end():
    layout = _Layout({"n": 6, "t": 2, "empty": 0, "y": 3, "z": 1})
    assert (layout.n, layout.t, layout.empty, layout.y, layout.z) == (0, 6, 8, 8, 11)
    assert layout.columns == 12
    assert layout.starts == {"n": 0, "t": 6, "empty": 8, "y": 8, "z": 11, "columns": 12}
    assert _Layout({}).columns == 0


def test_a_name_no_block_has_is_an_attribute_error():
    layout = _Layout({"n": 2})
    with pytest.raises(AttributeError) as err:
        layout.missing  # noqa: B018
    assert err.value.args == ("missing",)
    assert getattr(layout, "missing", None) is None
    assert not hasattr(layout, "_private") and not hasattr(layout, "__deepcopy__")
    layout.starts["_hidden"] = 4  # a private name never reads the starts
    with pytest.raises(AttributeError) as err:
        layout._hidden  # noqa: B018
    assert err.value.args == ("_hidden",)


def test_blocks_that_fail_raise_rather_than_recurse():
    """``starts`` computing raises AttributeError from inside blocks(): Python then asks
    __getattr__ for "starts", which must not compute it again."""

    class Broken(Columns):
        def blocks(self):
            raise AttributeError("widths")  # an attribute blocks() reads that is not there

    with pytest.raises(AttributeError) as err:
        Broken().n  # noqa: B018
    assert err.value.args == ("starts",)


def test_each_fields_tolerance_is_its_own():
    """A field in the 1e15s (bytes) gives no slack to one in seconds: option 1 is a second
    faster and holds the same bytes."""
    assert undominated(_one_segment(time=[2.0, 1.0], state=[1e15, 1e15])) == [[1]]


def test_options_exactly_the_tolerance_apart_tie():
    """The tolerance is inclusive: with a field's largest magnitude c, values 0 and
    tol = 1e-12 c are the same value (the earlier option kept), and neither beats the other."""
    c = 1e6
    tol = 1e-12 * (c + 1e-300)
    # options: c (beaten), 0, then tol: tol ties with the earlier 0
    assert undominated(_one_segment(time=[c, 0.0, tol])) == [[1]]
    # options: c, tol, then 0: 0 is no win over tol (it ties, and the earlier one is kept)
    assert undominated(_one_segment(time=[c, tol, 0.0])) == [[1]]


def test_two_disallowed_options_warn_of_nothing():
    """inf - inf between two disallowed options is NaN: planning must print no warning."""
    sp = _one_segment(time=[1.0, 2.0, 3.0])
    sp.allowed = [np.array([True, False, False])]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert undominated(sp) == [[0]]
