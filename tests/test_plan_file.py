"""plan.json on disk: any mutation of a valid plan loads as a clear one-line error or as a
valid plan, never a traceback; the same inputs give byte-identical files in fresh processes
whatever PYTHONHASHSEED and thread count."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.api import plan
from planner.errors import UserInputError
from planner.schema import dumps, load_plan, plan_from_dict
from planner.search import Pins

ROOT = Path(__file__).resolve().parent.parent
GPT = ROOT / "examples" / "gpt.py"


@pytest.fixture(scope="module")
def valid_plans():
    return [
        plan(GPT, 4, model_args={"size": "tiny"}, profile="cpu", pins=Pins(pp=2, dp=2)).plan,
        plan(GPT, 8, model_args={"size": "tiny"}, profile="cpu", pins=Pins(tp=2, pp=2)).plan,
    ]


@pytest.fixture(scope="module")
def valid_dicts(valid_plans):
    return [p.to_dict() for p in valid_plans]


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(min_value=-3, max_value=9), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_mutated_plans_load_or_fail_cleanly(valid_dicts, data):
    doc = copy.deepcopy(data.draw(st.sampled_from(valid_dicts)))
    paths = [p for p in _paths(doc) if p]
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        path = data.draw(st.sampled_from(paths))
        parent = doc
        try:
            for k in path[:-1]:
                parent = parent[k]
            if data.draw(st.booleans()):
                parent[path[-1]] = data.draw(JUNK)
            elif isinstance(parent, dict):
                del parent[path[-1]]
            else:
                parent.pop(path[-1])
        except (KeyError, IndexError, TypeError, AttributeError):
            continue  # an earlier mutation removed or replaced this path
    try:
        record = plan_from_dict(doc, "mutated.json")
    except UserInputError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("plan mutated.json")
    else:  # what passes the checks reads into records, and they write what they read
        assert plan_from_dict(record.to_dict(), "again.json") == record


def test_valid_plans_pass_and_text_mutations_fail_cleanly(valid_plans, tmp_path):
    path = tmp_path / "plan.json"
    text = dumps(valid_plans[1])
    path.write_text(text)
    assert load_plan(path).to_dict() == json.loads(text)  # the records round-trip exactly
    for broken in (text[: len(text) // 2], text.replace('"schema"', '"schemа"'), "", "\x00\x01"):
        path.write_text(broken)
        with pytest.raises(UserInputError):
            load_plan(path)


def without_clock(text: str) -> str:
    """plan.json with the one field that measures a clock (the solve time) set to 0."""
    doc = json.loads(text)
    doc["solver"]["solve_time_s"] = 0.0
    return dumps(doc)


@pytest.mark.distributed
def test_byte_identical_across_hash_seeds_and_threads(tmp_path):
    outs = []
    for i, (seed, threads) in enumerate((("0", "1"), ("12345", "2"))):
        out = tmp_path / f"run{i}"
        env = {
            **os.environ,
            "PYTHONHASHSEED": seed,
            "OMP_NUM_THREADS": threads,
            "MESHPLAN_CACHE": str(tmp_path / f"cache{i}"),
        }
        cmd = [sys.executable, "-m", "meshplan", str(GPT), "--model-arg", "size=small"]
        cmd += ["--gpus", "8", "--out", str(out), "--quiet"]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        outs.append(without_clock((out / "plan.json").read_text()))
    assert outs[0] == outs[1]


def test_an_alternative_no_placement_fits_round_trips_as_null(valid_plans, tmp_path):
    """A candidate whose bound is infinite (no placement fits: Llama-3-8B at 128K tokens on 8
    GPUs has several) is written as null, so plan.json stays JSON that load_plan reads back;
    a non-finite number reaching the writer is refused, never written as Infinity."""
    from planner.assemble import candidate_summary
    from planner.schema import write_plan
    from planner.search.candidates import Candidate

    doc = copy.deepcopy(valid_plans[0])
    cand = Candidate(1, 1, 1, 1, "gpipe", 1, 0)
    cand.bound = float("inf")
    doc.solver.alternatives.append(candidate_summary(cand, None))
    assert doc.solver.alternatives[-1].lower_bound_step_time_s is None
    back = load_plan(write_plan(doc, tmp_path))
    assert back.solver.alternatives[-1].lower_bound_step_time_s is None
    assert "Infinity" not in (tmp_path / "plan.json").read_text()
    doc.solver.alternatives[-1].lower_bound_step_time_s = float("inf")
    with pytest.raises(ValueError):
        dumps(doc)
