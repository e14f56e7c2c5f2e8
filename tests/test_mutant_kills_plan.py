"""Tests written for mutmut's generated mutants of planner/schema/plan.py (benchmarks/
generated_mutants.py): plan.json's dict to the records and back, on a plan written here by hand
that holds every record (two stages, a block of each kind of field, an alternative that is a
named baseline and one no placement fits, a certificate, the heterogeneous fields), and on the
shipped example plans. Each defect's whole message is compared. docs/mutation.md names the
mutants each test kills."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from planner.schema import plan as plan_module
from planner.schema.mesh import Mesh
from planner.schema.plan import (
    Alternative,
    BlockPlan,
    CandidatePoint,
    Certificate,
    ClusterInfo,
    KindInfo,
    Memory,
    ModelInfo,
    Plan,
    Prediction,
    SchemaError,
    SolverRecord,
    StagePlan,
)

ROOT = Path(__file__).resolve().parent.parent
MEMORY = {
    "params": 1.0,
    "grads": 2.0,
    "optimizer": 3.0,
    "activations": 4.5,
    "other": 0,
    "total": 10.5,
}


@pytest.fixture(autouse=True)
def fresh_field_lists(monkeypatch):
    """Each test writes records as a fresh process does: with no record class's field list
    read yet (``_DUMPED`` fills on the first write of each class; a warm one would hide how
    it is filled)."""
    monkeypatch.setattr(plan_module, "_DUMPED", {})


def _stage(i: int, kind: str) -> dict:
    return {
        "index": i, "pp_rank": i, "blocks": [f"b{i}"], "ranks": [2 * i, 2 * i + 1],
        "forward_s": 0.5, "backward_s": 1, "compute_s": 1.25, "tp_comm_s": 0.0625,
        "p2p_s": 0.03125, "time_per_microbatch_s": 1.5, "dp_comm_s": 0.25, "dp_exposed_s": 0.125,
        "optimizer_s": 0.1, "offload_s": 0.0, "inflight_microbatches": 2 - i,
        "local_batch_size": 8, "num_microbatches": 4, "kind": kind,
        "receives_sequence_shard": bool(i),
    }  # fmt: skip


PLAN = {
    "schema": "meshplan/plan/v1",
    "model": {
        "file": "/m.py",
        "sha256": "ab" * 32,
        "args": {"size": "tiny", "layers": 2},
        "params": 1000,
        "blocks": 2,
        "trace": "hooks",
        "unread_params": ["head.bias"],
        "direct_forward": ["enc"],
        "read_outside": ["emb.weight"],
    },  # fmt: skip
    "cluster": {"profile": "cpu", "nodes": 1, "gpus_per_node": 4, "gpus": 4},
    "mesh": {"pp": 2, "dp": 1, "tp": 2, "ep": 1, "cp": 1, "stage_tp": [2, 2], "stage_dp": [1, 1]},
    "global_batch_size": 8,
    "micro_batch_size": 2,
    "num_microbatches": 4,
    "schedule": "1f1b",
    "virtual_stages": 1,
    "zero_stage": 0,
    "dtype": "fp32",
    "optimizer": "adamw",
    "stages": [_stage(0, "a"), _stage(1, "b")],
    "blocks": [
        {
            "name": f"b{i}",
            "modules": [f"layers.{i}"],
            "stage": i,
            "recompute": "none",
            "offload": "none",
            "tp_plan": {f"layers.{i}.q": "colwise"},
            "tp_grad_sums": [f"layers.{i}.norm"],
            "tp_local_attributes": ["attn.num_heads"],
            "class": "Layer",
            "takes_sequence_shard": True,
            "leaves_sequence_shard": False,
            "params": 500,
            "tp_variant": "megatron",
            "time_per_microbatch_s": 0.75,
            "activation_bytes_per_microbatch": 4096.0,
            "memory_bytes": 1e6,
        }  # fmt: skip
        for i in range(2)
    ],
    "predicted": {
        "step_time_s": 6.5,
        "peak_memory_bytes": 2e9,
        "capacity_bytes": 8e10,
        "mfu": 0.4,
        "memory_per_stage": [MEMORY, dict(MEMORY, other=1.0, total=11.5)],
        "pipeline_s": 6,
        "bubble_s": 1.5,
        "dp_exposed_s": 0.25,
        "optimizer_s": 0.1,
        "offload_s": 0,
        "samples_per_s": 1.25,
        "tokens_per_s": 320.0,
        "model_flops_per_step": 1e12,
        "host_bytes_per_gpu": 0.0,
        "step_time_range_s": [6.0, 7.5],
        "step_time_range_runs": 5,
        "step_time_range_scope": "gpt",
    },  # fmt: skip
    "solver": {
        "status": "optimal",
        "objective": 6.5,
        "gap": 0.0,
        "solve_time_s": 0.5,
        "candidates_total": 3,
        "candidates_solved": 1,
        "candidates_pruned": 2,
        "alternatives": [
            {
                "label": "ddp",
                "status": "solved",
                "mesh": {"pp": 1, "dp": 4, "tp": 1, "ep": 1, "cp": 1},
                "micro_batch_size": 2,
                "schedule": "1f1b",
                "virtual_stages": 1,
                "zero_stage": 0,
                "why_not": "slower",
                "lower_bound_step_time_s": 7.0,
                "step_time_s": 8.0,
                "peak_memory_bytes": 3e9,
                "feasible": True,
                "mfu": 0.3,
                "baseline": "ddp",
            },
            {
                "label": "pp4",
                "status": "infeasible",
                "mesh": {"pp": 4, "dp": 1, "tp": 1, "ep": 1, "cp": 1},
                "micro_batch_size": 1,
                "schedule": "gpipe",
                "virtual_stages": 2,
                "zero_stage": 3,
                "why_not": "does not fit",
                "lower_bound_step_time_s": None,
                "step_time_s": None,
                "peak_memory_bytes": None,
                "feasible": None,
                "mfu": None,
            },
        ],
        "candidates": [
            {
                "label": "pp2 tp2",
                "step_time_s": 6.5,
                "peak_memory_bytes": 2e9,
                "feasible": True,
                "chosen": True,
            },
        ],
        "bound": 6.25,
        "nodes": 17,
        "work_limits": {"nodes": 1000},
        "certificates": [
            {
                "label": "pp2 tp2",
                "status": "solved",
                "objective": 6.5,
                "bound": 6.25,
                "gap": 0.04,
                "nodes": 17,
            },
            {
                "label": "pp4",
                "status": "infeasible",
                "objective": None,
                "bound": None,
                "gap": None,
                "nodes": 0,
            },
        ],
    },  # fmt: skip
    "lr": 1e-3,
    "mesh_order": ["pp", "dp", "cp", "tp"],
    "batchnorm": "per_replica",
    "reduce_dtype": "bf16",
    "kinds": [
        {"name": "a", "profile": "h100-sxm", "gpus_per_node": 2, "gpus": 2},
        {"name": "b", "profile": "a100-80g", "gpus_per_node": 2, "gpus": 2},
    ],
    "rank_kinds": ["a", "a", "b", "b"],
}


def test_every_record_is_read_field_for_field_and_written_back_as_it_was():
    plan = Plan.from_dict(copy.deepcopy(PLAN))
    assert plan.to_dict() == PLAN
    assert json.dumps(plan.to_dict()) == json.dumps(PLAN)  # the fields' order too
    assert isinstance(plan.model, ModelInfo) and plan.model.args == {"size": "tiny", "layers": 2}
    assert plan.model.direct_forward == ["enc"] and plan.model.read_outside == ["emb.weight"]
    assert isinstance(plan.cluster, ClusterInfo) and plan.cluster.gpus_per_node == 4
    assert plan.mesh == Mesh(2, 1, 2, stage_tp=(2, 2), stage_dp=(1, 1))
    assert [type(s) for s in plan.stages] == [StagePlan, StagePlan]
    assert [s.kind for s in plan.stages] == ["a", "b"]
    assert [s.receives_sequence_shard for s in plan.stages] == [False, True]
    assert [type(b) for b in plan.blocks] == [BlockPlan, BlockPlan]
    assert plan.blocks[1].block_class == "Layer" and plan.blocks[1].tp_variant == "megatron"
    assert plan.blocks[0].takes_sequence_shard is True
    assert plan.blocks[0].leaves_sequence_shard is False
    assert isinstance(plan.predicted, Prediction)
    assert [type(m) for m in plan.predicted.memory_per_stage] == [Memory, Memory]
    assert plan.predicted.memory_per_stage[1].total == 11.5
    assert plan.predicted.step_time_range_s == [6.0, 7.5]
    assert isinstance(plan.solver, SolverRecord) and plan.solver.work_limits == {"nodes": 1000}
    ddp, pp4 = plan.solver.alternatives
    assert isinstance(ddp, Alternative) and ddp.mesh == Mesh(1, 4, 1) and ddp.baseline == "ddp"
    assert pp4.lower_bound_step_time_s is None and pp4.feasible is None and pp4.baseline is None
    assert pp4.mesh == Mesh(4, 1, 1) and pp4.zero_stage == 3 and pp4.virtual_stages == 2
    assert [type(c) for c in plan.solver.candidates] == [CandidatePoint]
    assert [type(c) for c in plan.solver.certificates] == [Certificate, Certificate]
    assert plan.solver.certificates[0].gap == 0.04 and plan.solver.certificates[1].bound is None
    assert [type(k) for k in plan.kinds] == [KindInfo, KindInfo]
    assert plan.kinds[1].profile == "a100-80g" and plan.rank_kinds == ["a", "a", "b", "b"]
    assert (plan.lr, plan.batchnorm, plan.reduce_dtype) == (1e-3, "per_replica", "bf16")


def test_keys_a_plan_lacks_take_their_defaults_and_none_fields_are_not_written():
    data = copy.deepcopy(PLAN)
    for key in ("lr", "mesh_order", "batchnorm", "reduce_dtype", "kinds", "rank_kinds"):
        del data[key]
    for key in ("args", "params", "blocks", "trace", "unread_params", "direct_forward",
                "read_outside"):  # fmt: skip
        del data["model"][key]
    for st in data["stages"]:
        del st["kind"], st["receives_sequence_shard"], st["local_batch_size"]
    for b in data["blocks"]:
        del b["class"], b["takes_sequence_shard"], b["leaves_sequence_shard"], b["tp_plan"]
    del data["predicted"]["step_time_range_s"], data["predicted"]["pipeline_s"]
    del data["solver"]["certificates"], data["solver"]["work_limits"], data["solver"]["bound"]
    del data["mesh"]["stage_tp"], data["mesh"]["stage_dp"], data["mesh"]["cp"]
    del data["solver"]["alternatives"][1]["lower_bound_step_time_s"]
    plan = Plan.from_dict(data)
    assert (plan.lr, plan.mesh_order) == (3e-4, ["pp", "dp", "cp", "tp"])
    assert (plan.batchnorm, plan.reduce_dtype, plan.kinds, plan.rank_kinds) == (
        "synchronized", "fp32", None, None,
    )  # fmt: skip
    m = plan.model
    assert (m.args, m.params, m.blocks, m.trace, m.unread_params) == ({}, 0, 0, "export", [])
    assert (m.direct_forward, m.read_outside) == (None, None)
    assert plan.stages[1].kind is None and plan.stages[1].local_batch_size == 0
    assert plan.blocks[0].block_class == "" and plan.blocks[0].tp_plan == {}
    assert plan.blocks[0].takes_sequence_shard is None
    assert plan.predicted.step_time_range_s is None and plan.predicted.pipeline_s == 0.0
    assert plan.solver.certificates == [] and plan.solver.bound is None
    assert plan.mesh == Mesh(2, 1, 2) and plan.solver.alternatives[1].lower_bound_step_time_s == 0.0
    out = plan.to_dict()
    assert "kinds" not in out and "rank_kinds" not in out
    assert "direct_forward" not in out["model"] and "read_outside" not in out["model"]
    assert "stage_tp" not in out["mesh"] and "stage_dp" not in out["mesh"]
    assert "kind" not in out["stages"][0] and "receives_sequence_shard" not in out["stages"][0]
    assert "takes_sequence_shard" not in out["blocks"][0] and out["blocks"][0]["class"] == ""
    assert "step_time_range_s" not in out["predicted"]
    assert out["solver"]["bound"] is None  # not an omitted field: written as null
    assert "baseline" not in out["solver"]["alternatives"][1]
    assert out["solver"]["alternatives"][0]["baseline"] == "ddp"
    assert out["solver"]["alternatives"][1]["step_time_s"] is None  # null, not omitted
    assert out["lr"] == 3e-4 and out["mesh"]["cp"] == 1


def test_a_loaded_plans_records_are_written_from_the_records_not_the_dict():
    plan = Plan.from_dict(copy.deepcopy(PLAN))
    plan.blocks[0].block_class = "Other"
    plan.mesh = Mesh(1, 2, 2, stage_tp=(2,))
    plan.solver.work_limits = {"nodes": 5, "time": 2}
    out = plan.to_dict()
    assert out["blocks"][0]["class"] == "Other" and "block_class" not in out["blocks"][0]
    assert out["mesh"]["stage_tp"] == [2] and "stage_dp" not in out["mesh"]
    assert out["solver"]["work_limits"] == {"nodes": 5, "time": 2}
    assert Plan.from_dict(out).to_dict() == out


@pytest.mark.parametrize("name", ["llama3-8b-64xh100", "llama3-70b-64xh100"])
def test_the_shipped_example_plans_round_trip(name):
    data = json.loads((ROOT / "examples" / "plans" / f"{name}.json").read_text())
    plan = Plan.from_dict(copy.deepcopy(data))
    out = plan.to_dict()
    assert _within(data, out)  # written before some fields existed: those get their defaults
    assert out["reduce_dtype"] == "fp32" and out["blocks"][0]["tp_local_attributes"] == []
    assert Plan.from_dict(copy.deepcopy(out)).to_dict() == out
    assert plan.stages_of(0) == plan.stages


def _within(part, whole) -> bool:
    """Whether every key of ``part`` is in ``whole`` with the same value (recursively)."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(
            k in whole and _within(v, whole[k]) for k, v in part.items()
        )
    if isinstance(part, list):
        return (
            isinstance(whole, list) and len(part) == len(whole) and all(map(_within, part, whole))
        )
    return part == whole and type(part) is type(whole)


def test_each_pipeline_rank_runs_its_own_stages_in_order():
    data = copy.deepcopy(PLAN)
    data["stages"] = [dict(_stage(i % 2, "a"), index=i) for i in range(4)]
    plan = Plan.from_dict(data)
    assert [s.index for s in plan.stages_of(0)] == [0, 2]
    assert [s.index for s in plan.stages_of(1)] == [1, 3]
    assert plan.stages_of(2) == []


def _defect(path: tuple, value) -> dict:
    data = copy.deepcopy(PLAN)
    node = data
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


DEFECTS = [
    ((), None, "plan must be an object"),
    (("model", "sha256"), KeyError, "plan.model.sha256 is missing"),
    (("stages", 1, "forward_s"), KeyError, "plan.stages[1].forward_s is missing"),
    (("blocks", 0, "recompute"), KeyError, "plan.blocks[0].recompute is missing"),
    (("predicted", "memory_per_stage", 1, "total"), KeyError,
     "plan.predicted.memory_per_stage[1].total is missing"),
    (("solver", "alternatives", 0, "mesh", "tp"), KeyError,
     "plan.solver.alternatives[0].mesh.tp is missing"),
    (("cluster",), [1], "plan.cluster must be an object"),
    (("stages",), {"0": 1}, "plan.stages must be a list"),
    (("model", "unread_params"), "head.bias", "plan.model.unread_params must be a list"),
    (("model", "direct_forward"), "enc", "plan.model.direct_forward must be a list"),
    (("model", "direct_forward"), [1], "plan.model.direct_forward[0] must be a str, got 1"),
    (("stages", 1, "ranks", 1), 3.0, "plan.stages[1].ranks[1] must be a int, got 3.0"),
    (("stages", 0, "forward_s"), "0.5", "plan.stages[0].forward_s must be a float, got '0.5'"),
    (("stages", 0, "forward_s"), True, "plan.stages[0].forward_s must be a float, got True"),
    (("stages", 0, "backward_s"), float("nan"),
     "plan.stages[0].backward_s must be a float, got nan"),
    (("predicted", "mfu"), float("inf"), "plan.predicted.mfu must be a float, got inf"),
    (("predicted", "mfu"), -float("inf"), "plan.predicted.mfu must be a float, got -inf"),
    (("predicted", "step_time_range_s", 1), "7",
     "plan.predicted.step_time_range_s[1] must be a float, got '7'"),
    (("solver", "bound"), [6.0], "plan.solver.bound must be a float, got [6.0]"),
    (("global_batch_size",), True, "plan.global_batch_size must be a int, got True"),
    (("zero_stage",), 1.0, "plan.zero_stage must be a int, got 1.0"),
    (("schedule",), 1, "plan.schedule must be a str, got 1"),
    (("blocks", 1, "class"), 7, "plan.blocks[1].class must be a str, got 7"),
    (("stages", 0, "receives_sequence_shard"), 1,
     "plan.stages[0].receives_sequence_shard must be a bool, got 1"),
    (("model", "args"), [], "plan.model.args must be a dict, got []"),
    (("solver", "work_limits"), "x", "plan.solver.work_limits must be a dict, got 'x'"),
]  # fmt: skip


@pytest.mark.parametrize(
    "path, value, message", DEFECTS, ids=[f"{'.'.join(map(str, p))}={v!r}" for p, v, _ in DEFECTS]
)
def test_a_field_of_the_wrong_type_or_missing_is_named_where_it_is(path, value, message):
    data = value if path == () else _defect(path, value)
    with pytest.raises(SchemaError) as err:
        Plan.from_dict(data)
    assert str(err.value) == message


def test_numbers_of_either_kind_are_floats_and_nulls_stand_for_unset_fields():
    """An int is a float (JSON writes 1.0 as 1 in other tools); a null is None wherever it is,
    a non-nullable field too (plan validation refuses those first)."""
    data = _defect(("stages", 0, "forward_s"), 1)
    data["predicted"]["mfu"] = -0.5
    data["model"]["trace"] = None
    data["solver"]["alternatives"][0]["mfu"] = 1
    plan = Plan.from_dict(data)
    assert plan.stages[0].forward_s == 1 and plan.predicted.mfu == -0.5
    assert plan.model.trace is None and plan.solver.alternatives[0].mfu == 1
