"""Tests written for mutmut's generated mutants of planner/search/milp/runs.py
(benchmarks/generated_mutants.py): HiGHS runs saved to and read back from a folder of the
test's own, the file's text and the key's hash by hand. docs/mutation.md names the mutants each
test kills."""

from __future__ import annotations

import hashlib
import importlib.metadata

import numpy as np
import pytest

from planner.search.milp.runs import HighsRun, RunStore, run_key

RUN = HighsRun("optimal", 2.5, 7, True, [0.0, 1.0, 0.25])


def test_the_key_hashes_version_options_and_each_arrays_type_shape_and_bytes():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.array([0.5, -1.0])
    options = {"node_limit": 300, "gap": 0.01, "cutoff": None}
    digest = hashlib.sha256(importlib.metadata.version("highspy").encode())
    digest.update(b'{"cutoff": null, "gap": 0.01, "node_limit": 300}')
    digest.update(b"<i4(2, 3)" + a.tobytes())
    digest.update(b"<f8(2,)" + b.tobytes())
    key = run_key([a, b], options)
    assert key == digest.hexdigest()[:32]
    assert run_key([a.T.copy().T, b], dict(reversed(options.items()))) == key
    # a transposed (non-contiguous) view hashes its values in order, as a copy of it does
    assert run_key([a.T, b], options) == run_key([np.array(a.T, order="C"), b], options)
    assert run_key([a.reshape(3, 2), b], options) != key
    assert run_key([a.astype(np.int64), b], options) != key
    assert run_key([a, b], {**options, "gap": 0.02}) != key


def test_a_saved_run_is_one_compact_json_file_read_back_exactly(tmp_path):
    store = RunStore(tmp_path / "deep" / "milp")  # folders made as needed
    assert store.read == 0 and store.load("k1") is None and store.read == 0
    store.save("k1", RUN)
    store.save("k2", HighsRun("infeasible", float("inf"), 0, False, []))  # folder exists now
    assert (tmp_path / "deep" / "milp" / "k1.json").read_text() == (
        '{"model_status":"optimal","dual_bound":2.5,"nodes":7,"primal_feasible":true,'
        '"x":[0.0,1.0,0.25]}'
    )
    assert store.load("k1") == RUN and store.read == 1
    assert store.load("k2") == HighsRun("infeasible", float("inf"), 0, False, [])
    assert store.read == 2
    assert sorted(p.name for p in (tmp_path / "deep" / "milp").iterdir()) == ["k1.json", "k2.json"]


def test_the_default_folder_is_the_caches_milp_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    store = RunStore()
    assert store.folder == tmp_path / "milp" and store.read == 0
    store.save("k", RUN)
    assert RunStore(tmp_path / "milp").load("k") == RUN


@pytest.mark.parametrize(
    "text", ["{not json", '{"model_status": "optimal"}', '{"nodes": 1, "extra": 2}', "[1, 2]"]
)
def test_an_unreadable_run_is_none_and_not_counted(tmp_path, text):
    (tmp_path / "k.json").write_text(text)
    store = RunStore(tmp_path)
    assert store.load("k") is None and store.read == 0


def test_a_run_that_cannot_be_written_costs_only_the_solve(tmp_path):
    (tmp_path / "file").write_text("")
    RunStore(tmp_path / "file" / "milp").save("k", RUN)  # a folder under a file: OSError
    store = RunStore(tmp_path)
    store.save("k", HighsRun("optimal", 1.0, 1, True, [np.float32(1.0)]))  # TypeError
    store.save("n", HighsRun("optimal", 1.0, 1, True, [1.0]))
    assert store.load("n") is not None
    assert store.load("k") is None  # nothing, or not a whole run, was left under the key
