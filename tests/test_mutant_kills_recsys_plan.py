"""Tests written for mutmut's generated mutants of planner/recsys/plan.py (the recommendation
plan's file: written, recognised, read and checked; benchmarks/generated_mutants.py). The plans
are written here by hand, one defect each, and every refusal is compared as its whole one-line
message, so a changed word, bound or name is seen. docs/mutation.md names the mutants each test
kills."""

from __future__ import annotations

import copy
import json
import os

import pytest

from planner.errors import UserInputError
from planner.recsys.plan import (
    CPU_SHARDINGS,
    KERNELS,
    OPTIMIZERS,
    SCHEMA,
    SHARDINGS,
    check_recplan,
    is_recplan,
    load_recplan,
    write_recplan,
)

FIX = "; plan again with `plan MODEL.py`"
NOT_A_DICT = ["a list, not a plan"]


def good_plan() -> dict:
    """A valid plan on 4 GPU ranks: every field check_recplan reads, at legal values."""
    return {
        "schema": "meshplan.recplan/1",
        "model": {"file": "m.py"},
        "cluster": {"profile": "h100-sxm", "nodes": 1, "gpus_per_node": 4, "gpus": 4},
        "device": "cuda",
        "global_batch_size": 8,
        "optimizer": "sgd",
        "lr": 0.1,
        "dense": {"strategy": "fsdp"},
        "tables": [
            {"name": "a", "sharding": "table_wise", "kernel": "fused", "ranks": [0]},
            {"name": "b", "sharding": "row_wise", "kernel": "fused_uvm_caching", "ranks": [0, 3]},
        ],
    }


def refusal(plan, where: str) -> str:
    with pytest.raises(UserInputError) as info:
        check_recplan(plan, where)
    return str(info.value)


def test_the_vocabularies_are_torchrecs_names():
    assert SCHEMA == "meshplan.recplan/1"
    assert SHARDINGS == ("data_parallel", "table_wise", "column_wise", "row_wise", "table_row_wise")
    assert KERNELS == ("dense", "fused", "fused_uvm_caching")
    assert CPU_SHARDINGS == ("data_parallel", "table_wise", "column_wise")
    assert OPTIMIZERS == ("sgd", "adamw")


def test_a_good_plan_passes_and_each_legal_edge_too():
    check_recplan(good_plan())
    p = good_plan()  # one rank, the batch equal to it, the highest rank, no dense section
    p["cluster"]["gpus"] = 1
    p["global_batch_size"] = 1
    del p["dense"]
    for t in p["tables"]:
        t["ranks"] = [0]
    check_recplan(p)
    p = good_plan()
    p["dense"] = None  # a null dense section is DDP's default
    p["tables"][0]["ranks"] = [3]
    check_recplan(p)
    p = good_plan()  # on CPU: the three CPU shardings, dense kernels under adamw
    p["device"] = "cpu"
    p["optimizer"] = "adamw"
    p["dense"] = {"strategy": "ddp"}
    p["tables"] = [
        {"name": s, "sharding": s, "kernel": "dense", "ranks": [1]} for s in CPU_SHARDINGS
    ]
    check_recplan(p)
    p["optimizer"] = "sgd"  # SGD's fused kernel runs on CPU
    p["tables"][0]["kernel"] = "fused"
    check_recplan(p)


@pytest.mark.parametrize(
    "defect, message",
    [
        (lambda p: NOT_A_DICT, "schema is not 'meshplan.recplan/1'"),
        (lambda p: p.update(schema="meshplan.plan/1"), "schema is not 'meshplan.recplan/1'"),
        (lambda p: p.pop("schema"), "schema is not 'meshplan.recplan/1'"),
        *(
            (lambda p, k=k: p.pop(k), f"missing {k!r}")
            for k in (
                "model",
                "cluster",
                "tables",
                "global_batch_size",
                "lr",
                "optimizer",
                "device",
            )
        ),
        (lambda p: p["cluster"].pop("gpus"), "cluster.gpus must be a positive integer"),
        (lambda p: p["cluster"].update(gpus=0), "cluster.gpus must be a positive integer"),
        (lambda p: p["cluster"].update(gpus=4.0), "cluster.gpus must be a positive integer"),
        (
            lambda p: p.update(global_batch_size=0),
            "global_batch_size 0 must be a positive multiple of 4 ranks",
        ),
        (
            lambda p: p.update(global_batch_size=6),
            "global_batch_size 6 must be a positive multiple of 4 ranks",
        ),
        (
            lambda p: p.update(global_batch_size=8.0),
            "global_batch_size 8.0 must be a positive multiple of 4 ranks",
        ),
        (
            lambda p: p.update(optimizer="adam"),
            "optimizer 'adam' is not one of ('sgd', 'adamw')",
        ),
        (
            lambda p: p.update(dense={"strategy": "zero1"}),
            "dense strategy 'zero1' is not one of ('ddp', 'fsdp')",
        ),
        (
            lambda p: p["tables"].append(dict(p["tables"][0])),
            "table 'a' appears twice",
        ),
        (
            lambda p: p["tables"][1].update(sharding="grid"),
            "table 'b': sharding 'grid' is not one of ('data_parallel', 'table_wise',"
            " 'column_wise', 'row_wise', 'table_row_wise')",
        ),
        (
            lambda p: p["tables"][1].pop("sharding"),
            "table 'b': sharding None is not one of ('data_parallel', 'table_wise',"
            " 'column_wise', 'row_wise', 'table_row_wise')",
        ),
        (
            lambda p: p["tables"][1].update(kernel="quant"),
            "table 'b': kernel 'quant' is not one of ('dense', 'fused', 'fused_uvm_caching')",
        ),
        (
            lambda p: p["tables"][1].pop("kernel"),
            "table 'b': kernel None is not one of ('dense', 'fused', 'fused_uvm_caching')",
        ),
        *(
            (
                lambda p, r=r: p["tables"][1].update(ranks=r),
                "table 'b': ranks must be a non-empty list of ranks below 4",
            )
            for r in ([], (0,), [4], [-1], [0, 1.0], None)
        ),
        (
            lambda p: p["tables"][1].pop("ranks"),
            "table 'b': ranks must be a non-empty list of ranks below 4",
        ),
    ],
)
def test_each_defect_is_refused_in_its_own_words(defect, message):
    plan = good_plan()
    out = defect(plan)
    if out is NOT_A_DICT:
        plan = out
    assert refusal(plan, "p.json") == f"p.json: {message}{FIX}"


def test_the_default_place_is_the_plan():
    with pytest.raises(UserInputError) as info:
        check_recplan({"schema": "x"})
    assert str(info.value) == f"plan: schema is not 'meshplan.recplan/1'{FIX}"


@pytest.mark.parametrize(
    "sharding, kernel",
    [("row_wise", "fused"), ("table_row_wise", "dense"), ("table_wise", "fused_uvm_caching")],
)
def test_on_cpu_a_gpu_only_table_is_refused(sharding, kernel):
    plan = good_plan()
    plan["device"] = "cpu"
    plan["tables"] = [{"name": "t", "sharding": sharding, "kernel": kernel, "ranks": [0]}]
    assert refusal(plan, "p.json") == (
        f"p.json: table 't': {sharding} with kernel {kernel} needs a GPU (TorchRec runs "
        f"table-wise, column-wise and data-parallel on CPU){FIX}"
    )
    plan["device"] = "cuda"  # the same table on a GPU is fine
    check_recplan(plan)


@pytest.mark.parametrize("kernel", ["fused", "fused_uvm_caching"])
def test_on_cpu_adamw_takes_dense_kernels_only(kernel):
    plan = good_plan()
    plan["device"] = "cpu"
    plan["optimizer"] = "adamw"
    plan["tables"] = [
        {"name": "d", "sharding": "column_wise", "kernel": "dense", "ranks": [0, 1]},
        {"name": "t", "sharding": "column_wise", "kernel": kernel, "ranks": [0, 1]},
    ]
    expected = (
        f"p.json: table 't': kernel {kernel} with adamw needs a GPU (fbgemm's CPU kernels fuse "
        f"SGD and Adagrad only; on CPU Adam's tables use kernel dense){FIX}"
    )
    if kernel == "fused_uvm_caching":  # the caching kernel is refused first, for any optimizer
        expected = (
            f"p.json: table 't': column_wise with kernel {kernel} needs a GPU (TorchRec runs "
            f"table-wise, column-wise and data-parallel on CPU){FIX}"
        )
    assert refusal(plan, "p.json") == expected
    plan["device"] = "cuda"
    check_recplan(plan)


def test_a_written_plan_is_two_space_json_in_order_and_reads_back(tmp_path):
    plan = good_plan()
    plan["zz"] = 1  # a key out of alphabetical order stays where it was put
    plan["notes"] = ["é"]
    out = tmp_path / "new" / "dir"
    path = write_recplan(plan, out)
    assert path == out / "plan.json"
    text = path.read_text(encoding="utf-8")
    assert text == json.dumps(plan, indent=2) + "\n"
    assert text.startswith('{\n  "schema": "meshplan.recplan/1",\n  "model": {\n    "file"')
    assert list(json.loads(text)) == list(plan)
    assert oct(os.stat(path).st_mode & 0o777) != oct(0o600)  # a plan is for reading
    assert load_recplan(path) == plan
    assert is_recplan(path)
    write_recplan({"schema": SCHEMA, "x": 2}, out)  # an existing folder: written over
    assert json.loads(path.read_text()) == {"schema": SCHEMA, "x": 2}


def test_is_recplan_reads_the_schema_only(tmp_path):
    cases = {
        "rec.json": json.dumps({"schema": SCHEMA}),  # nothing else checked
        "plan.json": json.dumps({"schema": "meshplan.plan/1"}),
        "list.json": "[1, 2]",
        "bad.json": "{not json",
        "noschema.json": "{}",
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
    assert [is_recplan(tmp_path / n) for n in cases] == [True, False, False, False, False]
    assert is_recplan(str(tmp_path / "rec.json"))
    assert not is_recplan(tmp_path / "missing.json")
    assert not is_recplan(tmp_path)  # a folder: an OSError, not a crash


def test_load_recplan_refuses_an_unreadable_or_broken_file_in_one_line(tmp_path):
    missing = tmp_path / "missing.json"
    with pytest.raises(UserInputError) as info:
        load_recplan(missing)
    assert str(info.value) == f"cannot read plan {missing}: No such file or directory"
    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    with pytest.raises(UserInputError) as info:
        load_recplan(bad)
    assert str(info.value) == (
        f"plan {bad} is not valid JSON: Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)"
    )
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"schema": "x"}))
    with pytest.raises(UserInputError) as info:
        load_recplan(str(wrong))
    assert str(info.value) == f"{wrong}: schema is not 'meshplan.recplan/1'{FIX}"


def test_check_leaves_the_plan_as_it_was():
    plan = good_plan()
    before = copy.deepcopy(plan)
    check_recplan(plan)
    assert plan == before
