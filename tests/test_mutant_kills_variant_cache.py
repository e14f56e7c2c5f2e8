"""Tests written for mutmut's generated mutants of planner/cost/variant_cache.py (benchmarks/
generated_mutants.py): the sharding ILP's templates written to a cache folder of the test's
own and read back, the file's name and the code hash in it stated by hand, and every file that
cannot be read taken as no entry. docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
from pathlib import Path

import pytest

import planner
from planner.cost import variant_cache
from planner.cost.sharding import _Template
from planner.cost.variant_cache import (
    VARIANT_CODE,
    load_variants,
    save_variants,
    variant_code_hash,
    variants_path,
)

TEMPLATE = _Template(
    name="megatron",
    choice=(0, 2, 1),
    states=("R", "S(1)"),
    needs=((None, "R"), ("S(1)",)),
    plans=((0, 1, "colwise"), (3, 1, "rowwise")),
    grad_sums=((2, 0),),
    compute_fraction=0.5,
    memory_bound_fraction=0.1 + 0.2,  # 0.30000000000000004: floats round-trip exactly
    param_fraction=0.5,
    saved_bytes=4096,
    saved_selective_bytes=1024,
    input_bytes=512,
    comm_fwd=(("all_reduce", 2048),),
    comm_bwd=(("all_reduce", 2048), ("all_gather", 64)),
    time_s=1e-5 / 3,
    memory=3.5e9,
    sequence_parallel=True,
    on_dtensors=True,
    exit_gather=(("x", 1),),
    entry_gather=(),
)
MEMO = {
    ("Block", 2, 1.5e12, 3e11, True): [TEMPLATE, dataclasses.replace(TEMPLATE, name="other")],
    ("Head", 4, 2.0, 1.0, False): [],
}


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    return tmp_path


def test_the_code_hash_covers_the_solvers_code_and_highs_version():
    here = Path(planner.__file__).resolve().parent
    digest = hashlib.sha256()
    for name in VARIANT_CODE:
        digest.update((here / name).read_bytes())
    digest.update(importlib.metadata.version("highspy").encode())
    assert variant_code_hash() == digest.hexdigest()[:16]
    assert "cost/sharding.py" in VARIANT_CODE and "cost/variant_cache.py" in VARIANT_CODE


def test_the_entry_lies_in_the_caches_variants_folder_under_the_trace_and_code(cache):
    assert variants_path("abc") == cache / "variants" / f"abc-{variant_code_hash()}.json"


def test_templates_are_read_back_as_they_were_saved(cache):
    save_variants("key1", MEMO)
    path = variants_path("key1")
    assert path.exists() and not (cache / "variants" / f"{path.name}.tmp").exists()
    entries = json.loads(path.read_text())
    assert [e[0] for e in entries] == [list(k) for k in MEMO]
    assert entries[0][1][0]["choice"] == [0, 2, 1]
    assert " " not in path.read_text()  # compact: (",", ":") separators
    back = load_variants("key1")
    assert back == MEMO
    assert list(back) == list(MEMO) and all(isinstance(k, tuple) for k in back)
    kept = back[("Block", 2, 1.5e12, 3e11, True)][0]
    assert isinstance(kept, _Template) and kept == TEMPLATE
    assert kept.needs == ((None, "R"), ("S(1)",)) and isinstance(kept.needs[0], tuple)
    assert kept.memory_bound_fraction == 0.1 + 0.2 and kept.time_s == 1e-5 / 3
    assert hash(kept) == hash(TEMPLATE)  # a tuple everywhere: hashable as solved
    assert load_variants("key2") == {}  # another trace's key


@pytest.mark.parametrize(
    "text",
    ["", "{not json", "[[[\"k\"], [{\"name\": \"x\"}]]]", "[[[\"k\"], [{\"nope\": 1}]]]", "5",
     "[[1]]"],
    ids=["empty", "not-json", "missing-fields", "unknown-field", "a-number", "short-entry"],
)  # fmt: skip
def test_an_entry_that_cannot_be_read_is_no_entry(cache, text):
    path = variants_path("bad")
    path.parent.mkdir(parents=True)
    path.write_text(text)
    assert load_variants("bad") == {}


def test_a_folder_in_the_files_place_is_no_entry(cache):
    variants_path("dir").mkdir(parents=True)
    assert load_variants("dir") == {}


def test_a_cache_that_cannot_be_written_costs_only_time(cache, monkeypatch):
    (cache / "variants").write_text("a file where the folder goes")
    save_variants("k", MEMO)  # no error: the plan goes on
    assert load_variants("k") == {}
    monkeypatch.setenv("MESHPLAN_CACHE", str(cache / "fresh"))
    save_variants("k", {("odd", object()): []})  # not JSON: nothing written, no error
    assert not variants_path("k").exists()
    save_variants("k", MEMO)  # the folder is made on the first save
    assert load_variants("k") == MEMO


def test_the_code_hash_is_computed_once(monkeypatch):
    first = variant_code_hash()
    monkeypatch.setattr(variant_cache, "VARIANT_CODE", ())
    assert variant_code_hash() == first
