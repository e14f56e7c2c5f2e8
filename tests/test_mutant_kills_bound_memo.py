"""The search's memo of bounds and priced options (planner/search/bound_memo.py), written for its
generated mutants (docs/mutation.md): each key changes with every input it names and with
nothing else, each kept value is what computing it gives (counted: computed once), the file
round-trips through JSON, and a file of other code drops exactly its code-keyed entries."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from conftest import cluster_of, make_block, make_option
from test_mutant_kills_milp_rows import _problem

from planner.cost.records import CostInputs
from planner.search import Candidate, bound_memo
from planner.search.bound_memo import (
    CODE,
    BoundMemo,
    _blocks_digest,
    _tuples,
    bounds_path,
    candidate_key,
    inputs_fingerprint,
    load_bounds,
    priced_key,
    problem_key,
    save_bounds,
    simpler_key,
)
from planner.search.bounds import relaxed_bound
from planner.search.milp.split_bound import split_bound
from planner.training import Training


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    """A cache folder of the test's own, and no blocks digest kept from before."""
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    monkeypatch.setattr(bound_memo, "_last_blocks", [None, ""])


def test_the_problem_key_changes_with_every_field_and_only_with_them():
    base = _problem()
    key = problem_key(base)
    assert len(key) == 32 and problem_key(_problem()) == key  # equal numbers: equal keys
    changed = {
        "pp": 3, "v": 2, "m": 5, "seg_len": [1, 2, 2], "capacity": base.capacity + 1,
        "host_capacity": base.host_capacity * 2, "const_step": 0.5, "dp_once": (0.0, 0.0),
        "const_time": [0.0, 0.0], "inflight": [1.0, 1.0], "const_mem": [0.0, 0.0],
        "loss_mem": [0.0, 0.0], "has_params": [True, True, True], "step": None,
        "allowed": [np.array([True, False])] * 3,
    }  # fmt: skip
    for name in ("time", "state", "host", "act", "ws", "gather", "optim", "offl"):
        arrays = getattr(base, name)
        changed[name] = [arrays[0] + 1.0, *arrays[1:]]
    keys = {key}
    for name, value in changed.items():
        keys.add(problem_key(dataclasses.replace(base, **{name: value})))
    assert len(keys) == len(changed) + 1
    # an array and a list of its numbers, a tuple of one and a list of one, differ
    a = dataclasses.replace(base, time=[np.array([1.0, 2.0])] * 3)
    b = dataclasses.replace(base, time=[[1.0, 2.0]] * 3)
    assert problem_key(a) != problem_key(b)
    # the same bytes under another dtype or shape differ
    c = dataclasses.replace(base, time=[np.array([1.0, 2.0]).reshape(1, 2)] * 3)
    assert problem_key(a) != problem_key(c)
    d = dataclasses.replace(base, time=[np.array([1.0, 2.0]).view(np.int64)] * 3)
    assert problem_key(a) != problem_key(d)
    # a list of two lists of one against one list of two
    e = dataclasses.replace(base, const_time=[[0.0], [1.0]])
    f = dataclasses.replace(base, const_time=[[0.0, 1.0]])
    assert problem_key(e) != problem_key(f)
    # the field names count: the same numbers moved to another field differ
    g = dataclasses.replace(base, const_time=[0.5, 0.25], inflight=[0.25, 0.5])
    h = dataclasses.replace(base, const_time=[0.25, 0.5], inflight=[0.5, 0.25])
    assert problem_key(g) != problem_key(h)


def _inputs(blocks=None, options=None, **kw) -> CostInputs:
    blocks = blocks or [make_block(0, "a"), make_block(1, "b"), make_block(2, "b")]
    shared = [make_option(1e-3, 1000, 5000), make_option(2e-3, 1000, 100)]
    options = options or [[make_option(3e-3, 500, 10)], shared, shared]
    fields = dict(traced_mbs=1, cluster=cluster_of(4), training=Training(8))
    fields.update(kw)
    return CostInputs(blocks, options, fields["traced_mbs"], fields["cluster"], fields["training"])


def test_the_inputs_fingerprint_changes_with_each_input_and_is_kept_on_them():
    base = _inputs()
    key = inputs_fingerprint(base)
    assert base.memo["fingerprint"] == key and inputs_fingerprint(_inputs()) == key
    base.memo["fingerprint"] = "kept"
    assert inputs_fingerprint(base) == "kept"  # read from the inputs, not computed again
    others = [
        _inputs(traced_mbs=2),
        _inputs(cluster=cluster_of(8)),
        _inputs(training=Training(16)),
        _inputs(blocks=[make_block(0, "a"), make_block(1, "b"), make_block(2, "c")]),
        _inputs(options=[[make_option(3e-3, 500, 11)], *_inputs().options[1:]]),
    ]
    fraction = _inputs()
    fraction.memory_fraction = 0.5
    others.append(fraction)
    # the second and third blocks with options of the same numbers but one list each: the
    # same inputs, the same StageProblem, keyed apart or not; the blocks' order counts
    first, second = _inputs(), _inputs()
    swapped = [first.options[1], first.options[0], first.options[2]]
    others.append(_inputs(options=swapped))
    keys = {key} | {inputs_fingerprint(o) for o in others}
    assert len(keys) == len(others) + 1
    assert inputs_fingerprint(second) == key


def test_the_blocks_digest_is_kept_for_one_list_at_a_time():
    one = [make_block(0, "a")]
    two = [make_block(0, "b")]
    d1 = _blocks_digest(one)
    assert d1 != _blocks_digest(two)  # another list: computed again
    assert _blocks_digest(one) == d1
    one.append(make_block(1, "a"))  # the same list: kept as it was (never changed in a plan)
    assert _blocks_digest(one) == d1


def _candidate(**kw) -> Candidate:
    fields = dict(pp=2, dp=2, tp=1, micro_batch_size=1, schedule="1f1b", virtual_stages=1, zero=1)
    fields.update(kw)
    return Candidate(**fields)


def test_the_candidate_key_changes_with_its_mesh_batch_schedule_chunks_and_zero():
    inp = _inputs()
    key = candidate_key(inp, _candidate())
    assert len(key) == 32 and candidate_key(inp, _candidate(bound=5.0)) == key
    others = [
        dict(pp=1, dp=4), dict(tp=2, dp=1), dict(micro_batch_size=2),
        dict(schedule="gpipe"), dict(virtual_stages=2, schedule="interleaved_1f1b"),
        dict(zero=2), dict(ep=2),
    ]  # fmt: skip
    keys = {key} | {candidate_key(inp, _candidate(**o)) for o in others}
    assert len(keys) == len(others) + 1
    assert candidate_key(_inputs(traced_mbs=2), _candidate()) != key


def test_the_simpler_key_adds_the_placement():
    inp = _inputs()
    cand = _candidate()
    cand.config = type("C", (), {"stage_of": [0, 0, 1], "choice": [0, 1, 0]})()
    key = simpler_key(inp, cand)
    assert len(key) == 32 and key != candidate_key(inp, cand)
    cand.config.stage_of = [0, 1, 1]
    moved = simpler_key(inp, cand)
    cand.config.choice = [0, 0, 0]
    assert len({key, moved, simpler_key(inp, cand)}) == 3


def test_the_priced_key_is_of_every_argument():
    key = priced_key("block", 2, (1, 2))
    assert len(key) == 32 and key == priced_key("block", 2, (1, 2))
    assert len({key, priced_key("block", 2, (1, 3)), priced_key("block", 2)}) == 3


def test_json_lists_become_tuples_again():
    assert _tuples([1, [2, [3.5, "x"]], []]) == (1, (2, (3.5, "x")), ())
    assert _tuples(4.5) == 4.5 and _tuples("ab") == "ab"


def test_a_split_bound_is_computed_once_and_read_back_as_it_was(monkeypatch):
    calls = []
    real = bound_memo.split_bound
    monkeypatch.setattr(bound_memo, "split_bound", lambda sp: calls.append(1) or real(sp))
    sp = _problem(capacity=3.25)
    memo = BoundMemo()
    got = memo.split(sp)
    want = split_bound(sp)
    assert got == want and memo.added == 1 and len(memo.entries) == 1
    assert memo.split(_problem(capacity=3.25)) == want and len(calls) == 1 and memo.added == 1
    (key,) = memo.entries
    assert key == "s" + problem_key(sp)
    assert memo.entries[key] == [want.max_stage, want.sum_stages, want.weighted_max]


def test_a_candidates_split_and_step_bound_build_its_problem_only_when_missing():
    sp = _problem(capacity=3.25, const_step=0.25)
    built = []
    memo = BoundMemo()
    split, step = memo.split_of("k1", lambda: built.append(1) or sp)
    want = split_bound(sp)
    assert split == want and step == want.step_bound(sp) and step > 0.25
    assert memo.added == 2  # the candidate's entry and the problem's split bound
    assert memo.entries["pk1"] == [want.max_stage, want.sum_stages, want.weighted_max, step]
    again = memo.split_of("k1", lambda: built.append(1) or sp)
    assert again == (want, step) and built == [1] and memo.added == 2


def test_a_candidates_relaxation_builds_its_problem_only_when_missing():
    sp = _problem(capacity=3.25)
    built = []
    memo = BoundMemo()
    got = memo.relaxed("k2", lambda: built.append(1) or sp)
    want = relaxed_bound(sp, -math.inf)
    assert got == pytest.approx(want, rel=1e-12) and math.isfinite(got) and got > 0
    assert memo.entries["rk2"] == got and isinstance(got, float)
    added = memo.added
    assert memo.relaxed("k2", lambda: built.append(1) or sp) == got
    assert built == [1] and memo.added == added
    # the relaxation's LP went through the memo too: an "l" entry
    assert any(k.startswith("l") for k in memo.entries)


def test_the_lp_is_solved_once_per_arrays():
    from planner.highs import Pattern

    pattern = Pattern.of(np.array([0, 0]), np.array([0, 1]), (1, 2))
    arrays = (np.array([1.0, 2.0]), pattern, np.array([1.0, 1.0]), np.array([1.0]))
    solved = []
    memo = BoundMemo()

    def solve(*a):
        solved.append(a)
        return ("optimal", 1.5)

    assert memo.lp(solve, *arrays) == ("optimal", 1.5) and memo.added == 1
    assert memo.lp(solve, *arrays) == ("optimal", 1.5) and len(solved) == 1
    assert solved[0][0] is arrays[0] and solved[0][1] is pattern
    other = (np.array([1.0, 3.0]), pattern, np.array([1.0, 1.0]), np.array([1.0]))
    memo.lp(solve, *other)
    values = (np.array([1.0, 2.0]), pattern, np.array([1.0, 2.0]), np.array([1.0]))
    memo.lp(solve, *values)
    bounds = (np.array([1.0, 2.0]), pattern, np.array([1.0, 1.0]), np.array([2.0]))
    memo.lp(solve, *bounds)
    wider = Pattern.of(np.array([0, 1]), np.array([0, 1]), (2, 2))
    memo.lp(solve, np.array([1.0, 2.0]), wider, np.array([1.0, 1.0]), np.array([1.0]))
    assert len(solved) == 5 and memo.added == 5
    status, value = memo.lp(solve, *arrays)
    assert type(value) is float


def test_options_round_trip_through_the_file_field_for_field(tmp_path):
    opts = [
        dataclasses.replace(make_option(1.1e-3, 1234.5, 77), tp_comm_s=0.25, ep=2),
        make_option(2e-3, 10, 3, recompute="full", offload="optimizer"),
    ]
    memo = load_bounds("trace")  # no file yet: empty, with the code's name
    priced = []
    got = memo.options("key", lambda: priced.append(1) or opts)
    assert got is opts and memo.added == 1
    save_bounds("trace", memo)
    back = load_bounds("trace")
    read = back.options("key", lambda: priced.append(1) or [])
    assert read == opts and priced == [1] and back.added == 0
    assert all(type(getattr(o, f.name)) is type(getattr(p, f.name))
               for o, p in zip(read, opts) for f in dataclasses.fields(o))  # fmt: skip
    assert memo.options("key", lambda: []) == opts  # in memory: fields kept as they are


def test_a_tuple_field_comes_back_a_tuple():
    """``norm_channels`` (a tuple of (name, channels) pairs) is a list in JSON."""
    opt = dataclasses.replace(make_option(1e-3, 10, 3), norm_channels=(("bn", 64), ("ln", 32)))
    memo = BoundMemo({"okey": json.loads(json.dumps([list(bound_memo._option_fields(opt))]))})
    (back,) = memo.options("key", list)
    assert back.norm_channels == (("bn", 64), ("ln", 32)) and back == opt


def test_simpler_choices_are_kept_once_as_lists():
    memo = BoundMemo()
    calls = []
    assert memo.simpler("k", lambda: calls.append(1) or (2, 0, 1)) == [2, 0, 1]
    assert memo.entries["tk"] == [2, 0, 1] and memo.added == 1
    kept = memo.simpler("k", lambda: calls.append(1) or (9,))
    assert kept == [2, 0, 1] and calls == [1]
    kept.append(5)  # a copy: the memo's entry is not changed through it
    assert memo.entries["tk"] == [2, 0, 1]


def test_adopt_takes_only_what_is_missing():
    memo = BoundMemo({"a": [1], "b": [2]})
    memo.adopt({"b": [20], "c": [3], "d": [4]})
    assert memo.entries == {"a": [1], "b": [2], "c": [3], "d": [4]} and memo.added == 2
    assert BoundMemo().entries == {} and BoundMemo(None).added == 0


def test_the_file_keeps_every_entry_and_another_codes_loses_its_code_keyed_ones(tmp_path):
    assert bounds_path("t1") == tmp_path / "bounds" / "t1.json"
    fresh = load_bounds("t1")  # no file
    code = fresh.entries[CODE]
    assert fresh.entries == {CODE: code} and fresh.added == 0
    entries = {"sA": [1.0, 2.0, 3.0], "lB": ["optimal", 4.0], "rC": 5.0, "pD": [1, 2, 3, 4],
               "oE": [[1]], "tF": [0], CODE: code}  # fmt: skip
    save_bounds("t1", BoundMemo(dict(entries)))
    assert json.loads(bounds_path("t1").read_text()) == entries
    assert load_bounds("t1").entries == entries  # the same code: all kept
    old = dict(entries, **{CODE: "another planner"})
    bounds_path("t1").write_text(json.dumps(old))
    assert load_bounds("t1").entries == {"sA": [1.0, 2.0, 3.0], "lB": ["optimal", 4.0], CODE: code}
    old.pop(CODE)  # a file without the code's name: the same
    bounds_path("t1").write_text(json.dumps(old))
    assert load_bounds("t1").entries == {"sA": [1.0, 2.0, 3.0], "lB": ["optimal", 4.0], CODE: code}
    for broken in ("{not json", "[1, 2]"):
        bounds_path("t1").write_text(broken)
        assert load_bounds("t1").entries == {CODE: code}


def test_a_file_that_cannot_be_written_only_costs_time(tmp_path, monkeypatch):
    (tmp_path / "bounds").write_text("a file where the folder should be")
    save_bounds("t2", BoundMemo({"sA": [1.0]}))  # no error
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "deep" / "er"))
    save_bounds("t3", BoundMemo({"sA": [1.0]}))  # folders made
    assert json.loads((tmp_path / "deep" / "er" / "bounds" / "t3.json").read_text()) == {
        "sA": [1.0]
    }
    save_bounds("t4", BoundMemo({"x": {1, 2}}))  # not JSON: skipped
    assert not (tmp_path / "deep" / "er" / "bounds" / "t4.json").exists()


def test_each_entry_computed_here_counts_once():
    """A fresh memo's ``added`` is the number of its entries: two split bounds, two choices,
    two option lists, a relaxation and the LPs it solved through the memo."""
    memo = BoundMemo()
    memo.split(_problem(capacity=3.25))
    memo.split(_problem(capacity=4.0))
    memo.simpler("a", lambda: [0])
    memo.simpler("b", lambda: [1])
    memo.options("a", lambda: [make_option(1e-3, 1, 1)])
    memo.options("b", lambda: [make_option(2e-3, 1, 1)])
    assert memo.added == len(memo.entries) == 6
    memo.relaxed("c", lambda: _problem(capacity=3.25))
    assert memo.added == len(memo.entries) > 7


def test_the_file_is_written_again_where_its_folder_exists(tmp_path):
    save_bounds("t5", BoundMemo({"sA": [1.0]}))
    save_bounds("t5", BoundMemo({"sA": [1.0], "sB": [2.0]}))  # the folder is there now
    assert json.loads(bounds_path("t5").read_text()) == {"sA": [1.0], "sB": [2.0]}


def test_option_lists_are_told_apart_by_which_blocks_share_them():
    """Blocks (a, b, a) against (a, b, b), each list shared by the blocks of a class: the
    same lists in the same first order, so only the block-to-list positions differ."""
    a_opts = [make_option(1e-3, 10, 3)]
    b_opts = [make_option(2e-3, 10, 3)]
    blocks = [make_block(0, "a"), make_block(1, "b"), make_block(2, "c")]
    aba = _inputs(blocks=blocks, options=[a_opts, b_opts, a_opts])
    abb = _inputs(blocks=blocks, options=[a_opts, b_opts, b_opts])
    assert inputs_fingerprint(aba) != inputs_fingerprint(abb)
