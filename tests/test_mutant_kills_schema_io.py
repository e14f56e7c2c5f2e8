"""Tests written for mutmut's generated mutants of planner/schema/__init__.py (benchmarks/
generated_mutants.py): plan.json's text, its write to a folder and its load, each defect's whole
message, and the per-stage counts a plan written before they were stored gets from the global
batch (worked by hand on a heterogeneous two-stage plan). docs/mutation.md names the mutants
each test kills."""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

import pytest
from test_mutant_kills_pool_schema import plan_doc

import planner.schema as schema
from planner.errors import UserInputError
from planner.schema import dumps, load_plan, plan_from_dict, write_plan


def hetero_doc() -> dict:
    """Two stages of different DP: stage 0 on 3 replicas of TP 1, stage 1 on 1 replica of TP 2;
    global batch 3 x 2 x 2 = 12, micro-batch 2, so stage 0's replica runs 12 / 3 = 4 samples in
    2 micro-batches and stage 1's runs 12 samples in 6."""
    return plan_doc(pp=2, dp=3, tp=2, mbs=2, nmb=2, stage_tp=[1, 2], stage_dp=[3, 1])


def counts(plan) -> list[tuple[int, int]]:
    return [(st.local_batch_size, st.num_microbatches) for st in plan.stages]


def test_dumps_is_sorted_two_space_json_with_one_trailing_newline():
    data = {"b": [1, 2], "a": {"d": 1.5, "c": None}}
    text = dumps(data)
    assert (
        text == '{\n  "a": {\n    "c": null,\n    "d": 1.5\n  },\n  "b": [\n    1,\n    2\n  ]\n}\n'
    )
    plan = plan_from_dict(hetero_doc())
    assert dumps(plan) == json.dumps(plan.to_dict(), indent=2, sort_keys=True) + "\n"


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_dumps_refuses_a_number_json_cannot_hold(bad):
    with pytest.raises(ValueError, match="JSON compliant"):
        dumps({"x": bad})


def test_write_plan_makes_nested_folders_and_overwrites(tmp_path):
    out = tmp_path / "a" / "b"
    path = write_plan({"x": 1}, out)
    assert path == out / "plan.json"
    assert path.read_text() == '{\n  "x": 1\n}\n'
    assert write_plan({"x": 2}, out) == path  # the folder exists: written again
    assert path.read_text() == '{\n  "x": 2\n}\n'
    assert sorted(p.name for p in out.iterdir()) == ["plan.json"]  # no temporary left


def test_write_plan_into_a_file_is_one_line_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UserInputError) as exc:
        write_plan({"x": 1}, blocker / "sub")
    assert str(exc.value) == f"cannot create output directory {blocker / 'sub'}: Not a directory"


def test_write_plan_asks_whether_the_folder_is_writable(tmp_path, monkeypatch):
    """The check asks os.access for write permission (root passes every access check, so the
    answer is stood in: writable for anything but W_OK)."""
    asked = []

    def access(path, mode):
        asked.append((Path(path), mode))
        return mode != os.W_OK

    monkeypatch.setattr(schema.os, "access", access)
    with pytest.raises(UserInputError) as exc:
        write_plan({"x": 1}, tmp_path)
    assert str(exc.value) == f"output directory {tmp_path} is not writable: choose --out DIR"
    assert asked == [(tmp_path, os.W_OK)]
    assert not (tmp_path / "plan.json").exists()


def test_write_plan_that_cannot_write_the_file_is_one_line_error(tmp_path):
    (tmp_path / "plan.json").mkdir()  # os.replace onto a folder fails
    with pytest.raises(UserInputError) as exc:
        write_plan({"x": 1}, tmp_path)
    assert str(exc.value) == f"cannot write {tmp_path / 'plan.json'}: Is a directory"


def test_load_plan_reads_back_what_write_plan_wrote(tmp_path):
    doc = hetero_doc()
    path = write_plan(doc, tmp_path)
    plan = load_plan(str(path))  # a str path too
    assert plan.to_dict() == plan_from_dict(copy.deepcopy(doc)).to_dict()
    assert counts(plan) == [(4, 2), (12, 6)]


def test_load_plan_defects_are_one_line_errors(tmp_path):
    missing = tmp_path / "none.json"
    with pytest.raises(UserInputError) as exc:
        load_plan(missing)
    assert str(exc.value) == f"plan {missing} does not exist"
    with pytest.raises(UserInputError) as exc:
        load_plan(tmp_path)
    assert (
        str(exc.value)
        == f"plan {tmp_path} cannot be read: [Errno 21] Is a directory: {str(tmp_path)!r}"
    )
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe{")
    with pytest.raises(UserInputError) as exc:
        load_plan(binary)
    assert str(exc.value).startswith(f"plan {binary} cannot be read: 'utf-8' codec can't decode")
    broken = tmp_path / "broken.json"
    broken.write_text('{\n"a": 1\n\n]')
    with pytest.raises(UserInputError) as exc:
        load_plan(broken)
    assert str(exc.value) == f"plan {broken} is not valid JSON (line 4): Expecting ',' delimiter"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(dict(hetero_doc(), micro_batch_size=0)))
    with pytest.raises(UserInputError) as exc:
        load_plan(bad)
    assert str(exc.value).startswith(f"plan {bad}: ")


def test_a_record_the_schema_refuses_names_where_the_plan_came_from():
    doc = hetero_doc()
    doc["stages"][0]["forward_s"] = "fast"
    with pytest.raises(UserInputError) as exc:
        plan_from_dict(doc)
    assert str(exc.value).startswith("plan (in memory): ")
    assert "forward_s" in str(exc.value)
    with pytest.raises(UserInputError) as exc:
        plan_from_dict(doc, "p.json")
    assert str(exc.value).startswith("plan p.json: ")


def test_a_schema_error_of_the_records_is_one_line_error(monkeypatch):
    from planner.schema.plan import Plan, SchemaError

    def refuse(data):
        raise SchemaError("stages[1].x: must be a number")

    monkeypatch.setattr(Plan, "from_dict", staticmethod(refuse))
    with pytest.raises(UserInputError) as exc:
        plan_from_dict(hetero_doc(), "w.json")
    assert str(exc.value) == "plan w.json: stages[1].x: must be a number"
    with pytest.raises(UserInputError) as exc:
        plan_from_dict(hetero_doc())
    assert str(exc.value) == "plan (in memory): stages[1].x: must be a number"


def test_stored_counts_are_kept():
    assert counts(plan_from_dict(hetero_doc())) == [(4, 2), (12, 6)]


@pytest.mark.parametrize(
    "drop",
    [("local_batch_size",), ("num_microbatches",), ("local_batch_size", "num_microbatches")],
)
def test_counts_a_plan_lacks_are_each_stages_share_of_the_global_batch(drop):
    """A stage missing either count gets both from its own DP degree: (12 / 3, 4 / 2) and
    (12 / 1, 12 / 2); the other stage keeps what it stored."""
    doc = hetero_doc()
    for key in drop:
        del doc["stages"][1][key]
    assert counts(plan_from_dict(doc)) == [(4, 2), (12, 6)]
    doc = hetero_doc()
    for key in drop:
        del doc["stages"][0][key]
    assert counts(plan_from_dict(doc)) == [(4, 2), (12, 6)]
