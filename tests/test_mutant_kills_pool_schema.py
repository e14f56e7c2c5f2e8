"""Tests written for mutmut's survivors (benchmarks/generated_mutants.py) in the plan checks
(planner/schema/checks.py), the resource chooser and pool (planner/resources) and the
recommendation-model cost and tables (planner/recsys). Each asserts a number or a message
against a reference worked out by hand, at inputs where the mutated term is live; docs/
mutation.md names the mutants each one kills."""

from __future__ import annotations

import copy
import math
import os
from types import SimpleNamespace

import pytest
from conftest import POOL_NODE as ROW
from conftest import cluster_of

from planner.errors import InfeasibleError, UserInputError
from planner.recsys.cost import Costed, TableOption, kernel_io, price, zipf_hit_rate
from planner.recsys.tables import RecModel, TableBlock
from planner.resources.choose import (
    Option,
    PlanPoint,
    choose,
    evaluate,
    meets,
    node_counts,
    pareto,
    plan_option,
    why_chosen,
)
from planner.resources.energy import RunCost
from planner.resources.pool import (
    Fabric,
    NodeType,
    Pool,
    figure_lines,
    figure_records,
    figure_sources,
    load_pool,
    pool_from_dict,
)
from planner.schema import plan_from_dict
from planner.schema.checks import validate_plan

# ------------------------------------------------------------------------ planner/schema/checks


def plan_doc(
    pp: int = 2,
    dp: int = 2,
    tp: int = 1,
    mbs: int = 2,
    nmb: int = 2,
    stage_tp: list[int] | None = None,
    stage_dp: list[int] | None = None,
) -> dict:
    """A valid plan.json dict written by hand, one block a stage: ranks laid out stage after
    stage (pipeline rank i holds dp_i x tp_i ranks), each stage's replica running
    gbs / dp_i samples in micro-batches of ``mbs``."""
    tps = stage_tp or [tp] * pp
    dps = stage_dp or [dp] * pp
    gbs = dp * mbs * nmb
    mesh: dict = {"pp": pp, "dp": dp, "tp": tp, "ep": 1, "cp": 1}
    if stage_tp:
        mesh["stage_tp"] = stage_tp
    if stage_dp:
        mesh["stage_dp"] = stage_dp
    first = [sum(tps[j] * dps[j] for j in range(i)) for i in range(pp + 1)]
    gpus = first[pp]
    number = {
        "tp_comm_s": 0.0,
        "p2p_s": 0.0,
        "dp_comm_s": 0.0,
        "dp_exposed_s": 0.0,
        "optimizer_s": 0.0,
        "offload_s": 0.0,
    }
    stages = [
        {
            "index": i,
            "pp_rank": i,
            "blocks": [f"b{i}"],
            "ranks": list(range(first[i], first[i + 1])),
            "forward_s": 0.1,
            "backward_s": 0.2,
            "local_batch_size": gbs // dps[i],
            "num_microbatches": gbs // dps[i] // mbs,
            **number,
        }
        for i in range(pp)
    ]
    blocks = [
        {
            "name": f"b{i}",
            "modules": [f"layers.{i}"],
            "stage": i,
            "recompute": "none",
            "offload": "none",
            "tp_plan": {},
            "class": "Layer",
            "tp_variant": "replicated",
            "time_per_microbatch_s": 0.1,
            "memory_bytes": 10.0,
            "activation_bytes_per_microbatch": 1.0,
        }
        for i in range(pp)
    ]
    mem = {"params": 1, "grads": 1, "optimizer": 2, "activations": 3, "other": 0, "total": 7}
    return {
        "schema": "meshplan.plan/1",
        "model": {"file": "/m.py", "sha256": "ab"},
        "cluster": {"profile": "cpu", "nodes": 1, "gpus_per_node": gpus, "gpus": gpus},
        "mesh": mesh,
        "global_batch_size": gbs,
        "micro_batch_size": mbs,
        "num_microbatches": nmb,
        "schedule": "1f1b",
        "virtual_stages": 1,
        "zero_stage": 0,
        "dtype": "fp32",
        "optimizer": "adamw",
        "stages": stages,
        "blocks": blocks,
        "predicted": {
            "step_time_s": 1.0,
            "peak_memory_bytes": 7.0,
            "capacity_bytes": 8.0,
            "mfu": 0.5,
            "memory_per_stage": [dict(mem) for _ in range(pp)],
            "samples_per_s": 8.0,
            "tokens_per_s": 0.0,
        },
        "solver": {
            "status": "optimal",
            "candidates": [
                {
                    "label": "a",
                    "step_time_s": 1.0,
                    "peak_memory_bytes": 0.0,
                    "feasible": True,
                    "chosen": True,
                }
            ],
            "alternatives": [
                {
                    "label": "b",
                    "status": "solved",
                    "mesh": {"pp": 1, "dp": 4, "tp": 1},
                    "micro_batch_size": 2,
                    "schedule": "1f1b",
                    "virtual_stages": 1,
                    "zero_stage": 0,
                    "why_not": "slower",
                }
            ],
            "candidates_total": 1,
            "candidates_solved": 1,
            "candidates_pruned": 0,
            "solve_time_s": 0.0,
        },
    }


def mixed_kinds(doc: dict) -> dict:
    """``doc`` (two stages of two ranks) as a heterogeneous plan: stage 0 on kind "a", 1 on "b"."""
    doc["kinds"] = [
        {"name": k, "profile": "cpu", "gpus_per_node": 2, "gpus": 2} for k in ("a", "b")
    ]
    doc["rank_kinds"] = ["a", "a", "b", "b"]
    doc["stages"][0]["kind"], doc["stages"][1]["kind"] = "a", "b"
    return doc


def _set(path: str, value):
    """An edit setting the dotted ``path`` ("stages.1.ranks") of a plan dict to ``value``."""

    def edit(doc: dict) -> None:
        *parents, last = [int(k) if k.isdigit() else k for k in path.split(".")]
        for k in parents:
            doc = doc[k]
        doc[last] = value

    return edit


def _drop(path: str):
    def edit(doc: dict) -> None:
        *parents, last = [int(k) if k.isdigit() else k for k in path.split(".")]
        for k in parents:
            doc = doc[k]
        del doc[last]

    return edit


VALID = {
    "pp2-dp2": plan_doc(),
    "one-rank-of-one-sample": plan_doc(pp=1, dp=1, mbs=1, nmb=1),
    "stage-tp-1-2": plan_doc(tp=2, dp=1, stage_tp=[1, 2]),
    "stage-dp-2-1": plan_doc(dp=2, stage_dp=[2, 1]),
    "stage-dp-4-2-of-8-micro-batches": plan_doc(dp=4, mbs=1, nmb=2, stage_dp=[4, 2]),
    "kinds": mixed_kinds(plan_doc()),
    "ep-2": plan_doc(),
    "cp-and-ep-absent": plan_doc(),
    "zero-1": plan_doc(),
    "zero-2": plan_doc(),
    "zero-3": plan_doc(),
    "bf16-reduced-in-bf16": plan_doc(),
    "bf16-reduced-in-fp32": plan_doc(),
    "batchnorm-per-replica": plan_doc(),
    "lr-and-args": plan_doc(),
    "step-range-from-0": plan_doc(),
    "step-range-of-one-value": plan_doc(),
    "no-stored-counts": plan_doc(),
    "zeros-where-non-negative": plan_doc(),
    "nodes-beyond-the-gpus": plan_doc(),
    "tp-styles-and-lists": plan_doc(),
    "two-blocks-on-stage-0": plan_doc(),
}
VALID["ep-2"]["mesh"]["ep"] = 2
del VALID["cp-and-ep-absent"]["mesh"]["cp"], VALID["cp-and-ep-absent"]["mesh"]["ep"]
for _z in (1, 2, 3):
    VALID[f"zero-{_z}"]["zero_stage"] = _z
VALID["bf16-reduced-in-bf16"].update(dtype="bf16", reduce_dtype="bf16")
VALID["bf16-reduced-in-fp32"].update(dtype="bf16", reduce_dtype="fp32")
VALID["batchnorm-per-replica"]["batchnorm"] = "per_replica"
VALID["lr-and-args"].update(lr=1e-9)
VALID["lr-and-args"]["model"]["args"] = {"size": "tiny"}
VALID["step-range-from-0"]["predicted"]["step_time_range_s"] = [0, 2.5]
VALID["step-range-of-one-value"]["predicted"]["step_time_range_s"] = [1.5, 1.5]
for _st in VALID["no-stored-counts"]["stages"]:
    del _st["local_batch_size"], _st["num_microbatches"]
_z0 = VALID["zeros-where-non-negative"]
_z0["stages"][0]["forward_s"] = 0
_z0["stages"][1]["p2p_s"] = 0
_z0["blocks"][0]["memory_bytes"] = 0
_z0["predicted"]["mfu"] = 0.0
_z0["predicted"]["memory_per_stage"][1]["total"] = 0
_z0["solver"]["candidates"][0]["peak_memory_bytes"] = 0
VALID["nodes-beyond-the-gpus"]["cluster"].update(nodes=3, gpus_per_node=2)
_b = VALID["tp-styles-and-lists"]["blocks"][1]
_b.update(tp_plan={"q": "colwise", "o": "rowwise", "c": "colwise_dtensor:2"})
_b.update(tp_grad_sums=["norm"], tp_local_attributes=["attn.num_heads"])
_two = VALID["two-blocks-on-stage-0"]
_two["blocks"].insert(1, dict(_two["blocks"][0], name="b0x"))
_two["stages"][0]["blocks"] = ["b0", "b0x"]


@pytest.mark.parametrize("name", list(VALID))
def test_plans_written_by_hand_pass_the_checks(name):
    """Every value at the edge of what the checks allow passes: a batch of one, ZeRO 0-3,
    the optional fields absent or at their bounds, the heterogeneous forms."""
    doc = copy.deepcopy(VALID[name])
    validate_plan(doc, "p.json")
    record = plan_from_dict(copy.deepcopy(VALID[name]), "p.json")
    validate_plan(record, "p.json")  # a typed plan is checked as the JSON it writes
    assert doc["mesh"]["cp"] == 1 and doc["mesh"]["ep"] == (2 if name == "ep-2" else 1)


P = "plan p.json: "
BAD = [
    # validate_plan
    (
        "pp2-dp2",
        _set("schema", "meshplan.plan/0"),
        "plan p.json has schema 'meshplan.plan/0', "
        "this meshplan reads 'meshplan.plan/1': plan again",
    ),
    ("pp2-dp2", _drop("stages"), P + "'stages' is missing or not a list"),
    ("pp2-dp2", _set("global_batch_size", True), P + "'global_batch_size' is missing or not a int"),
    ("pp2-dp2", _set("model", []), P + "'model' is missing or not a dict"),
    # _check_kinds
    (
        "pp2-dp2",
        _set("kinds", [{"name": "a"}]),
        P + "rank_kinds must name one of the plan's kinds for each of 4 ranks",
    ),
    ("pp2-dp2", _set("rank_kinds", ["a"] * 4), P + "kinds must be a list of objects with a name"),
    ("pp2-dp2", _set("stages.0.kind", "a"), P + "kinds must be a list of objects with a name"),
    (
        "kinds",
        _set("kinds", [{"name": "a"}, {"nom": "b"}]),
        P + "kinds must be a list of objects with a name",
    ),
    (
        "kinds",
        _set("kinds", [{"name": "a"}, "b"]),
        P + "kinds must be a list of objects with a name",
    ),
    (
        "kinds",
        _set("rank_kinds", ["a", "a", "b"]),
        P + "rank_kinds must name one of the plan's kinds for each of 4 ranks",
    ),
    (
        "kinds",
        _set("rank_kinds", ["a", "a", "b", "c"]),
        P + "rank_kinds must name one of the plan's kinds for each of 4 ranks",
    ),
    (
        "kinds",
        _set("rank_kinds", "aabb"),
        P + "rank_kinds must name one of the plan's kinds for each of 4 ranks",
    ),
    ("kinds", _set("stages.1.kind", "c"), P + "stage 1 must name its kind, the kind of its ranks"),
    (
        "kinds",
        _set("rank_kinds", ["a", "a", "a", "b"]),
        P + "stage 1 must name its kind, the kind of its ranks",
    ),
    (
        "kinds",
        _set("rank_kinds", ["a", "b", "b", "b"]),
        P + "stage 0 must name its kind, the kind of its ranks",
    ),
    # _check_header
    ("pp2-dp2", _set("mesh.pp", 0), P + "mesh.pp must be a positive integer"),
    ("pp2-dp2", _set("mesh.dp", True), P + "mesh.dp must be a positive integer"),
    ("pp2-dp2", _set("mesh.tp", 1.0), P + "mesh.tp must be a positive integer"),
    ("pp2-dp2", _set("mesh.cp", 0), P + "mesh.cp must be a positive integer"),
    ("pp2-dp2", _set("mesh.cp", True), P + "mesh.cp must be a positive integer"),
    ("pp2-dp2", _set("mesh.cp", "1"), P + "mesh.cp must be a positive integer"),
    ("pp2-dp2", _set("mesh.ep", 0), P + "mesh.ep must be a positive integer dividing mesh.dp"),
    ("pp2-dp2", _set("mesh.ep", 3), P + "mesh.ep must be a positive integer dividing mesh.dp"),
    ("pp2-dp2", _set("mesh.ep", True), P + "mesh.ep must be a positive integer dividing mesh.dp"),
    ("pp2-dp2", _set("mesh.ep", 2.0), P + "mesh.ep must be a positive integer dividing mesh.dp"),
    ("pp2-dp2", _drop("model.file"), P + "model.file is missing"),
    ("pp2-dp2", _set("model.sha256", 1), P + "model.sha256 is missing"),
    ("pp2-dp2", _set("global_batch_size", 0), P + "global_batch_size must be positive"),
    ("pp2-dp2", _set("micro_batch_size", 0), P + "micro_batch_size must be positive"),
    ("pp2-dp2", _set("num_microbatches", -1), P + "num_microbatches must be positive"),
    ("pp2-dp2", _set("virtual_stages", 0), P + "virtual_stages must be positive"),
    ("pp2-dp2", _set("cluster.gpus", 5), P + "cluster.gpus does not equal the mesh's ranks"),
    ("pp2-dp2", _set("cluster.gpus", 4.0), P + "cluster.gpus does not equal the mesh's ranks"),
    (
        "pp2-dp2",
        _set("global_batch_size", 16),
        P + "global_batch_size != dp * micro_batch_size * num_microbatches",
    ),
    ("pp2-dp2", _set("schedule", "1F1B"), P + "unknown schedule '1F1B'"),
    ("pp2-dp2", _set("zero_stage", 4), P + "zero_stage must be 0-3"),
    ("pp2-dp2", _set("zero_stage", -1), P + "zero_stage must be 0-3"),
    ("pp2-dp2", _set("dtype", "fp8"), P + "unknown dtype or optimizer"),
    ("pp2-dp2", _set("optimizer", "adam"), P + "unknown dtype or optimizer"),
    (
        "pp2-dp2",
        _set("batchnorm", "global"),
        P + "batchnorm must be one of synchronized, per_replica",
    ),
    ("pp2-dp2", _set("reduce_dtype", "bf16"), P + "reduce_dtype must be fp32 or the plan's dtype"),
    (
        "bf16-reduced-in-bf16",
        _set("reduce_dtype", "fp16"),
        P + "reduce_dtype must be fp32 or the plan's dtype",
    ),
    # _check_stage_degrees
    (
        "stage-tp-1-2",
        _set("mesh.stage_tp", [1, 2, 2]),
        P + "mesh.stage_tp must list 2 positive TP degrees, the largest equal to mesh.tp (2)",
    ),
    (
        "stage-tp-1-2",
        _set("mesh.stage_tp", [0, 2]),
        P + "mesh.stage_tp must list 2 positive TP degrees, the largest equal to mesh.tp (2)",
    ),
    (
        "stage-tp-1-2",
        _set("mesh.stage_tp", [True, 2]),
        P + "mesh.stage_tp must list 2 positive TP degrees, the largest equal to mesh.tp (2)",
    ),
    (
        "stage-tp-1-2",
        _set("mesh.stage_tp", [1.0, 2]),
        P + "mesh.stage_tp must list 2 positive TP degrees, the largest equal to mesh.tp (2)",
    ),
    (
        "stage-tp-1-2",
        _set("mesh.stage_tp", (1, 2)),
        P + "mesh.stage_tp must list 2 positive TP degrees, the largest equal to mesh.tp (2)",
    ),
    (
        "stage-tp-1-2",
        _set("mesh.stage_tp", [1, 1]),
        P + "mesh.stage_tp must list 2 positive TP degrees, the largest equal to mesh.tp (2)",
    ),
    (
        "stage-dp-2-1",
        _set("mesh.stage_dp", [1, 1]),
        P + "mesh.stage_dp must list 2 positive DP degrees, the largest equal to mesh.dp (2)",
    ),
    (
        "stage-tp-1-2",
        _set("mesh.cp", 2),
        P + "mesh.stage_tp needs cp = ep = 1 and one stage per pipeline rank",
    ),
    (
        "stage-dp-2-1",
        _set("mesh.ep", 2),
        P + "mesh.stage_dp needs cp = ep = 1 and one stage per pipeline rank",
    ),
    (
        "stage-tp-1-2",
        _set("virtual_stages", 2),
        P + "mesh.stage_tp needs cp = ep = 1 and one stage per pipeline rank",
    ),
    (
        "stage-dp-4-2-of-8-micro-batches",
        _set("mesh.stage_dp", [4, 3]),
        P + "mesh.stage_dp [4, 3] must divide the step's 8 micro-batches",
    ),
    # _check_blocks
    ("pp2-dp2", _set("virtual_stages", 2), P + "expected 4 stages"),
    ("pp2-dp2", _set("blocks.1", "b1"), P + "a block lacks its name"),
    ("pp2-dp2", _set("blocks.1.name", 1), P + "a block lacks its name"),
    ("pp2-dp2", _set("blocks.1.modules", "layers.1"), P + "block 'b1' lacks its modules"),
    ("pp2-dp2", _set("blocks.1.modules", ["a", 2]), P + "block 'b1' lacks its modules"),
    ("pp2-dp2", _set("blocks.1.recompute", "all"), P + "block 'b1' has a bad recompute"),
    ("pp2-dp2", _set("blocks.1.offload", "cpu"), P + "block 'b1' has a bad offload"),
    ("pp2-dp2", _set("blocks.1.tp_plan", []), P + "block 'b1' has a bad tp_plan"),
    (
        "pp2-dp2",
        _set("blocks.1.tp_grad_sums", "norm"),
        P + "block 'b1' has a bad tp_grad_sums (a list of modules)",
    ),
    (
        "pp2-dp2",
        _set("blocks.1.tp_grad_sums", ["norm", 3]),
        P + "block 'b1' has a bad tp_grad_sums (a list of modules)",
    ),
    (
        "pp2-dp2",
        _set("blocks.1.tp_local_attributes", "a.n"),
        P + "block 'b1' has a bad tp_local_attributes (a list of module attribute paths)",
    ),
    (
        "pp2-dp2",
        _set("blocks.1.tp_local_attributes", ["a.n", ""]),
        P + "block 'b1' has a bad tp_local_attributes (a list of module attribute paths)",
    ),
    (
        "pp2-dp2",
        _set("blocks.1.tp_local_attributes", ["a.n", 5]),
        P + "block 'b1' has a bad tp_local_attributes (a list of module attribute paths)",
    ),
    (
        "pp2-dp2",
        _set("blocks.1.tp_plan", {"q": "colwise", "o": "rowwize"}),
        P + "block 'b1' has "
        "an unknown tensor-parallel style 'rowwize' (known: colwise, colwise_gather, rowwise, "
        "colwise_sp, rowwise_sp, sequence, sp_gather, sp_block, colwise_sp_tokens, "
        "rowwise_sp_tokens, sequence_tokens, colwise_in_out, colwise_dtensor, "
        "colwise_dtensor_in_out, colwise_gather_in_out, rowwise_in_out; by k blocks: "
        "colwise_dtensor[_in_out]:k, colwise_gather[_in_out]:k)",
    ),
    ("pp2-dp2", _set("blocks.1.stage", 2), P + "block 'b1' has a bad stage"),
    ("pp2-dp2", _set("blocks.1.stage", -1), P + "block 'b1' has a bad stage"),
    ("pp2-dp2", _set("blocks.1.stage", True), P + "block 'b1' has a bad stage"),
    ("pp2-dp2", _set("blocks.1.stage", 1.0), P + "block 'b1' has a bad stage"),
    ("pp2-dp2", _set("blocks.1.name", "b0"), P + "block names repeat"),
    ("two-blocks-on-stage-0", _set("blocks.0.stage", 1), P + "blocks are not in stage order"),
    # _check_stages
    ("pp2-dp2", _set("stages.1", []), P + "stage 1 is malformed"),
    ("pp2-dp2", _set("stages.1.blocks", "b1"), P + "stage 1 is malformed"),
    ("pp2-dp2", _set("stages.1.blocks", ["b0"]), P + "stage 1 does not list its blocks ['b1']"),
    ("pp2-dp2", _set("stages.1.index", 0), P + "stage 1 has a wrong index or pp_rank"),
    ("pp2-dp2", _set("stages.1.pp_rank", 0), P + "stage 1 has a wrong index or pp_rank"),
    ("pp2-dp2", _set("stages.1.ranks", [2, 3, 4]), P + "stage 1 ranks are not [2, 3]"),
    ("stage-tp-1-2", _set("stages.1.ranks", [2, 3]), P + "stage 1 ranks are not [1, 2]"),
    (
        "pp2-dp2",
        _set("stages.1.local_batch_size", 8),
        P + "stage 1 local_batch_size and "
        "num_microbatches are (8, 2), not the global batch's share (4, 2)",
    ),
    (
        "stage-dp-2-1",
        _set("stages.1.num_microbatches", 2),
        P + "stage 1 local_batch_size and "
        "num_microbatches are (8, 2), not the global batch's share (8, 4)",
    ),
    (
        "pp2-dp2",
        _set("stages.1.forward_s", -0.5),
        P + "stage 1: forward_s must be a non-negative number",
    ),
    (
        "pp2-dp2",
        _set("stages.1.backward_s", float("nan")),
        P + "stage 1: backward_s must be a non-negative number",
    ),
    (
        "pp2-dp2",
        _set("stages.1.backward_s", float("inf")),
        P + "stage 1: backward_s must be a non-negative number",
    ),
    (
        "pp2-dp2",
        _set("stages.1.backward_s", True),
        P + "stage 1: backward_s must be a non-negative number",
    ),
    (
        "pp2-dp2",
        _set("stages.1.backward_s", "0.2"),
        P + "stage 1: backward_s must be a non-negative number",
    ),
    # _check_prediction
    ("pp2-dp2", _set("lr", 0), P + "lr must be a positive number"),
    ("pp2-dp2", _set("lr", "3e-4"), P + "lr must be a positive number"),
    ("pp2-dp2", _set("lr", float("nan")), P + "lr must be a positive number"),
    ("pp2-dp2", _set("model.args", ["tiny"]), P + "model.args must be an object"),
    (
        "pp2-dp2",
        _drop("predicted.capacity_bytes"),
        P + "predicted: capacity_bytes must be a non-negative number",
    ),
    ("pp2-dp2", _set("predicted.mfu", -0.1), P + "predicted: mfu must be a non-negative number"),
    (
        "pp2-dp2",
        _set("predicted.step_time_range_s", [2, 1]),
        P + "predicted.step_time_range_s must be [fastest, slowest] seconds",
    ),
    (
        "pp2-dp2",
        _set("predicted.step_time_range_s", [-1, 1]),
        P + "predicted.step_time_range_s must be [fastest, slowest] seconds",
    ),
    (
        "pp2-dp2",
        _set("predicted.step_time_range_s", [1, 2, 3]),
        P + "predicted.step_time_range_s must be [fastest, slowest] seconds",
    ),
    (
        "pp2-dp2",
        _set("predicted.step_time_range_s", [1]),
        P + "predicted.step_time_range_s must be [fastest, slowest] seconds",
    ),
    (
        "pp2-dp2",
        _set("predicted.step_time_range_s", [1, True]),
        P + "predicted.step_time_range_s must be [fastest, slowest] seconds",
    ),
    (
        "pp2-dp2",
        _set("predicted.step_time_range_s", [1, "2"]),
        P + "predicted.step_time_range_s must be [fastest, slowest] seconds",
    ),
    (
        "pp2-dp2",
        _set("predicted.step_time_range_s", "1-2"),
        P + "predicted.step_time_range_s must be [fastest, slowest] seconds",
    ),
    (
        "pp2-dp2",
        _set("predicted.memory_per_stage", [{}]),
        P + "predicted.memory_per_stage needs 2 entries",
    ),
    (
        "pp2-dp2",
        _set("predicted.memory_per_stage", {}),
        P + "predicted.memory_per_stage needs 2 entries",
    ),
    (
        "pp2-dp2",
        _drop("predicted.memory_per_stage.1.other"),
        P + "predicted.memory_per_stage: other must be a non-negative number",
    ),
    (
        "pp2-dp2",
        _set("predicted.memory_per_stage.1.total", -7),
        P + "predicted.memory_per_stage: total must be a non-negative number",
    ),
    (
        "pp2-dp2",
        _set("predicted.memory_per_stage", [3, 4]),
        P + "predicted.memory_per_stage: params must be a non-negative number",
    ),
    # _check_report_fields
    (
        "pp2-dp2",
        _set("solver.candidates", ["a"]),
        P + "a solver candidate lacks a non-negative number 'step_time_s'",
    ),
    ("pp2-dp2", _set("cluster.nodes", 0), P + "cluster.nodes must be a positive integer"),
    (
        "pp2-dp2",
        _set("cluster.gpus_per_node", "4"),
        P + "cluster.gpus_per_node must be a positive integer",
    ),
    ("pp2-dp2", _set("cluster.gpus_per_node", 3), P + "cluster has fewer GPUs than cluster.gpus"),
    (
        "pp2-dp2",
        _set("stages.1.dp_exposed_s", -1),
        P + "stage 1 lacks a non-negative number 'dp_exposed_s'",
    ),
    ("pp2-dp2", _drop("stages.0.offload_s"), P + "stage 0 lacks a non-negative number 'offload_s'"),
    (
        "pp2-dp2",
        _set("stages.1.tp_comm_s", True),
        P + "stage 1 lacks a non-negative number 'tp_comm_s'",
    ),
    (
        "pp2-dp2",
        _set("blocks.1.memory_bytes", "10"),
        P + "block 'b1' lacks a non-negative number 'memory_bytes'",
    ),
    (
        "pp2-dp2",
        _set("blocks.1.activation_bytes_per_microbatch", -1.0),
        P + "block 'b1' lacks a non-negative number 'activation_bytes_per_microbatch'",
    ),
    ("pp2-dp2", _drop("blocks.1.tp_variant"), P + "block 'b1' lacks tp_variant or class"),
    ("pp2-dp2", _set("blocks.1.class", None), P + "block 'b1' lacks tp_variant or class"),
    (
        "pp2-dp2",
        _drop("solver.candidates"),
        P + "solver.candidates or solver.alternatives is missing",
    ),
    (
        "pp2-dp2",
        _set("solver.alternatives", {}),
        P + "solver.candidates or solver.alternatives is missing",
    ),
    (
        "pp2-dp2",
        _set("solver.candidates.0.step_time_s", -1),
        P + "a solver candidate lacks a non-negative number 'step_time_s'",
    ),
    (
        "pp2-dp2",
        _drop("solver.candidates.0.peak_memory_bytes"),
        P + "a solver candidate lacks a non-negative number 'peak_memory_bytes'",
    ),
    (
        "pp2-dp2",
        _set("solver.candidates.0.label", 3),
        P + "a solver candidate lacks label or feasible",
    ),
    (
        "pp2-dp2",
        _set("solver.candidates.0.feasible", 1),
        P + "a solver candidate lacks label or feasible",
    ),
    ("pp2-dp2", _set("solver.alternatives.0", "b"), P + "an alternative lacks label or why_not"),
    ("pp2-dp2", _drop("solver.alternatives.0.label"), P + "an alternative lacks label or why_not"),
    (
        "pp2-dp2",
        _set("solver.alternatives.0.why_not", None),
        P + "an alternative lacks label or why_not",
    ),
    (
        "pp2-dp2",
        _set("predicted.samples_per_s", -8),
        P + "predicted lacks a non-negative number 'samples_per_s'",
    ),
    (
        "pp2-dp2",
        _drop("predicted.tokens_per_s"),
        P + "predicted lacks a non-negative number 'tokens_per_s'",
    ),
    (
        "pp2-dp2",
        _drop("solver.candidates_total"),
        P + "solver lacks a non-negative number 'candidates_total'",
    ),
    (
        "pp2-dp2",
        _set("solver.candidates_solved", None),
        P + "solver lacks a non-negative number 'candidates_solved'",
    ),
    (
        "pp2-dp2",
        _set("solver.candidates_pruned", -1),
        P + "solver lacks a non-negative number 'candidates_pruned'",
    ),
    (
        "pp2-dp2",
        _set("solver.solve_time_s", float("nan")),
        P + "solver lacks a non-negative number 'solve_time_s'",
    ),
]


@pytest.mark.parametrize("base, edit, message", BAD, ids=[m[len(P) :] for *_, m in BAD])
def test_each_defect_of_a_plan_is_refused_by_its_own_line(base, edit, message):
    """Each edit breaks one field of a valid plan; the error is that field's line, whole."""
    doc = copy.deepcopy(VALID[base])
    edit(doc)
    with pytest.raises(UserInputError) as err:
        validate_plan(doc, "p.json")
    assert str(err.value) == message


def test_what_is_not_a_plan_is_refused_by_name():
    with pytest.raises(UserInputError) as err:
        validate_plan([1], "p.json")
    assert str(err.value) == "plan p.json is not a JSON object"


# ---------------------------------------------------------------------- planner/resources/choose


def kind(name: str, available: int = 2, gpus_per_node: int = 8, **figures) -> NodeType:
    base = dict(
        price_per_gpu_hour=2.0,
        gpu_busy_watts=500.0,
        gpu_idle_watts=100.0,
        node_watts=1000.0,
        carbon_g_per_kwh=400.0,
        pue=1.5,
    )
    return NodeType(name, "h100-sxm", available, gpus_per_node, **{**base, **figures})


def priced(
    node: NodeType, nodes: int, wall_h: float, cost: float, energy: float = 1.0, carbon=1.0
) -> Option:
    """An option whose run figures are given by hand (the choice reads only these)."""
    run = RunCost(1, wall_h * 3600.0, 0.0, cost, 0.0, energy, carbon)
    return Option(node, nodes, PlanPoint(1.0, 0.5, 1, "dp1"), run)


def test_each_option_is_priced_by_hand_at_its_node_count():
    """2 nodes of 4 GPUs, a 10 s step half busy, 10,500 tokens at 1,000 a step, 0.5 of the
    wall time training: 11 steps, 220 s, 8 x 220 / 3600 GPU-hours at $2, 100 + 400 x 0.5 =
    300 W a GPU and 1000 W a node (4,400 W) x 220 s x PUE 1.5, 400 g a kWh."""
    node = kind("k", available=3, gpus_per_node=4)
    pool = Pool("p", (node,), effective_time_fraction=0.5)
    said: list[str] = []

    def planner(nt: NodeType, n: int) -> PlanPoint:
        if n == 1:
            raise InfeasibleError("does not fit; use more GPUs; or a smaller batch")
        return PlanPoint(10.0, 0.4, 1000, f"dp{n}", busy=0.5)

    options = evaluate(pool, planner, tokens=10_500, progress=said.append)
    assert said == ["k x1", "k x2", "k x3"]
    assert [(o.nodes, o.gpus, o.label) for o in options] == [
        (1, 4, "k x1"),
        (2, 8, "k x2"),
        (3, 12, "k x3"),
    ]
    assert options[0].run is None and options[0].why_not == "does not fit"
    run = options[1].run
    energy = 4400 * 220 / 3.6e6 * 1.5
    assert (run.steps, run.wall_s, run.gpu_watts) == (11, 220.0, 300.0)
    assert run.gpu_hours == pytest.approx(8 * 220 / 3600, rel=1e-12)
    assert run.cost_usd == pytest.approx(2 * 8 * 220 / 3600, rel=1e-12)
    assert run.energy_kwh == pytest.approx(energy, rel=1e-12)
    assert run.carbon_kg == pytest.approx(energy * 0.4, rel=1e-12)
    assert options[2].run.steps == 11 and options[2].run.wall_s == 220.0
    assert options[1].point == PlanPoint(10.0, 0.4, 1000, "dp2", busy=0.5)
    by_steps = evaluate(pool, planner, steps=7)
    assert by_steps[2].run.steps == 7 and by_steps[2].run.wall_s == 140.0


@pytest.mark.parametrize(
    "budget, message",
    [
        (
            {"tokens": 10, "steps": 2},
            "with --resources give the training budget once: --tokens N or --steps N, not both",
        ),
        ({}, "with --resources give the training budget: --tokens N or --steps N"),
    ],
)
def test_the_training_budget_is_given_once(budget, message):
    pool = Pool("p", (kind("k"),))
    with pytest.raises(UserInputError) as err:
        evaluate(pool, lambda nt, n: PlanPoint(1.0, 0.5, 1, "dp1"), **budget)
    assert str(err.value) == message


def test_an_option_at_the_deadline_or_the_budget_to_the_cent_meets_it():
    a = kind("a")
    at = priced(a, 1, wall_h=10.0, cost=500.0)
    over = priced(a, 2, wall_h=10.0 + 1e-9, cost=400.0)
    assert meets(at, 10.0, 500.0) and not meets(over, 10.0, 500.0)
    assert not meets(priced(a, 1, wall_h=1.0, cost=500.01), 10.0, 500.0)
    assert not meets(Option(a, 1, None, None, "does not fit"), None, None)
    assert choose([at, over], "cost", deadline_h=10.0, budget_usd=500.0) is at


def test_ties_on_the_objective_go_to_the_faster_then_the_cheaper_then_by_name_and_count():
    a, b = kind("a", available=4), kind("b", available=4)
    slow = priced(a, 1, wall_h=20.0, cost=100.0, energy=5.0)
    fast = priced(b, 1, wall_h=10.0, cost=300.0, energy=5.0)
    assert choose([slow, fast], "energy") is fast
    dear = priced(a, 1, wall_h=10.0, cost=300.0, carbon=2.0)
    cheap = priced(b, 1, wall_h=10.0, cost=200.0, carbon=2.0)
    assert choose([dear, cheap], "carbon") is cheap
    b1, a2, a1 = (priced(n, k, 10.0, 200.0) for n, k in ((b, 1), (a, 2), (a, 1)))
    assert choose([b1, a2, a1], "cost") is a1
    assert choose([b1, a2], "time") is a2


def test_an_unknown_objective_and_a_pool_where_nothing_fits_are_refused_by_name():
    a = kind("a", available=8)
    with pytest.raises(UserInputError) as err:
        choose([priced(a, 1, 1.0, 1.0)], "speed")
    assert str(err.value) == "--objective must be one of time, cost, energy, carbon"
    unfit = [Option(a, n, None, None, f"needs {16 // n} GPUs more") for n in (1, 2, 4, 8)]
    with pytest.raises(InfeasibleError) as err:
        choose(unfit, "time")
    assert str(err.value) == (
        "no option of the pool fits the model: a x1: needs 16 GPUs more; "
        "a x2: needs 8 GPUs more; a x4: needs 4 GPUs more"
    )


def test_a_missed_deadline_on_every_node_names_the_nodes_it_would_take():
    """Best by deadline: a x2 at 16.04 h (a x1 at 30 h misses 3-fold); 6.04 h short, a
    deadline of ceil(160.4) / 10 = 16.1 h, and ceil(2 x 16.04 / 10) = 4 nodes."""
    a = kind("a", available=2)
    options = [priced(a, 1, 30.0, 100.0), priced(a, 2, 16.04, 120.0)]
    with pytest.raises(InfeasibleError) as err:
        choose(options, "cost", deadline_h=10.0)
    assert str(err.value) == (
        "no option of the pool meets the 10 h deadline: the nearest is a x2 (16.0 h, $120), "
        "which needs 6.0 h more time (--deadline 16.1), or about 4 a nodes instead of the 2 "
        "available (at linear scaling)"
    )
    short = [priced(a, 1, 12.0, 100.0), priced(a, 2, 30.0, 120.0)]
    with pytest.raises(InfeasibleError) as err:
        choose(short, "cost", deadline_h=10.0)
    assert str(err.value) == (
        "no option of the pool meets the 10 h deadline: the nearest is a x1 (12.0 h, $100), "
        "which needs 2.0 h more time (--deadline 12.0)"
    )


def test_a_missed_budget_and_deadline_name_the_option_nearest_both():
    """Misses by the larger of wall / deadline and cost / budget: x 1.2, y 1.15, w 1.4; y
    uses its one node, so ceil(1 x 10.5 / 10) = 2 would do."""
    x, y, w = kind("x"), kind("y", available=1), kind("w")
    options = [priced(x, 1, 12.0, 1100.0), priced(y, 1, 10.5, 1150.0), priced(w, 1, 10.2, 1400.0)]
    with pytest.raises(InfeasibleError) as err:
        choose(options, "time", deadline_h=10.0, budget_usd=1000.0)
    assert str(err.value) == (
        "no option of the pool meets the 10 h deadline and the $1,000 budget: the nearest is "
        "y x1 (10.5 h, $1,150), which needs 0.5 h more time (--deadline 10.5), or about 2 y "
        "nodes instead of the 1 available (at linear scaling), $150 more money (--budget 1150)"
    )
    on_time = [priced(x, 1, 10.0, 1234.4), priced(w, 1, 9.0, 1300.0)]
    with pytest.raises(InfeasibleError) as err:
        choose(on_time, "time", deadline_h=10.0, budget_usd=1000.0)
    assert str(err.value) == (
        "no option of the pool meets the 10 h deadline and the $1,000 budget: the nearest is "
        "x x1 (10.0 h, $1,234), which needs $234 more money (--budget 1235)"
    )
    with pytest.raises(InfeasibleError) as err:
        choose(on_time, "time", budget_usd=1000.0)
    assert str(err.value) == (
        "no option of the pool meets the $1,000 budget: the nearest is x x1 (10.0 h, $1,234), "
        "which needs $234 more money (--budget 1235)"
    )


def test_an_option_late_but_at_the_budget_to_the_dollar_needs_only_time():
    a = kind("a", available=2)
    with pytest.raises(InfeasibleError) as err:
        choose([priced(a, 1, 12.0, 1000.0)], "cost", deadline_h=10.0, budget_usd=1000.0)
    assert str(err.value) == (
        "no option of the pool meets the 10 h deadline and the $1,000 budget: the nearest is "
        "a x1 (12.0 h, $1,000), which needs 2.0 h more time (--deadline 12.0)"
    )


def test_an_option_tying_another_on_one_figure_and_beaten_on_the_rest_is_off_the_front():
    """(time, cost, carbon): b ties a's cost and loses on time and carbon, so a dominates it;
    c is faster than a but dearer: both a and c stay."""
    a, b, c = kind("a"), kind("b"), kind("c")
    oa = priced(a, 1, 10.0, 100.0, carbon=5.0)
    ob = priced(b, 1, 12.0, 100.0, carbon=6.0)
    oc = priced(c, 1, 8.0, 150.0, carbon=5.0)
    assert pareto([oa, ob, oc]) == [oa, oc]


@pytest.mark.parametrize(
    "objective, text",
    [
        ("time", "a x1 has the least time (1,000.0 h) of the 2 options that meet the deadline "
         "and budget; b x1: 2,000.0 h (+100.0%)"),
        ("carbon", "a x1 has the least carbon (1,000.00 tCO2) of the 2 options that meet the "
         "deadline and budget; b x1: 2,000.00 tCO2 (+100.0%)"),
    ],
)  # fmt: skip
def test_why_chosen_shows_hours_and_tonnes_to_their_last_digit(objective, text):
    """1,000 h is 3.6e6 s over 3,600; 1e6 kg is 1,000 t."""
    chosen = priced(kind("a"), 1, 1000.0, 1.0, carbon=1e6)
    options = [chosen, priced(kind("b"), 1, 2000.0, 2.0, carbon=2e6)]
    assert why_chosen(chosen, options, objective, 2) == text


@pytest.mark.parametrize(
    "objective, text",
    [
        (
            "cost",
            "a x1 has the least cost ($1,000) of the 3 options that meet the deadline and "
            "budget; a x2: $1,100 (+10.0%); b x1: $1,500 (+50.0%)",
        ),
        (
            "time",
            "a x1 has the least time (1.5 h) of the 3 options that meet the deadline and "
            "budget; b x1: 2.0 h (+33.3%)",
        ),
        (
            "energy",
            "a x1 has the least energy (0 kWh) of the 3 options that meet the deadline "
            "and budget; b x1: 1 kWh (+100.0%)",
        ),
        (
            "carbon",
            "a x1 has the least carbon (0.00 tCO2) of the 3 options that meet the "
            "deadline and budget; a x2: 0.00 tCO2 (+0.0%); b x1: 0.00 tCO2 (+0.0%)",
        ),
    ],
)
def test_why_chosen_compares_the_runner_up_and_each_other_kinds_best(objective, text):
    """Chosen a x1 against a x2, b x1 and b x2 (c x1 fits nothing): the runner-up, then the
    best of each other kind, each once (a x2, neither, is left out where b x1 is the
    runner-up); a share over a zero objective is +0.0%."""
    a, b, c = kind("a"), kind("b"), kind("c")
    chosen = priced(a, 1, 1.5, 1000.0, energy=0.5, carbon=0.0)
    options = [
        chosen,
        priced(a, 2, 3.0, 1100.0, energy=2.0, carbon=3.0),
        priced(b, 1, 2.0, 1500.0, energy=1.0, carbon=4.0),
        priced(b, 2, 4.0, 2000.0, energy=3.0, carbon=5.0),
        Option(c, 1, None, None, "does not fit"),
    ]
    assert why_chosen(chosen, options, objective, 3) == text


def test_the_real_planner_option_reads_the_plans_step_tokens_busy_share_and_mesh(monkeypatch):
    """plan_option plans nodes x GPUs per node on the kind's profile and reads: tokens a
    step = global batch x tokens / samples (8 x 2048 / 4 = 4096), at least 1; one sample per
    sample where samples/s is 0; the busy share 1 - (1 + 0.5 + 0.5) / 8."""
    import planner.api

    calls = []

    def fake_plan(model, gpus, profile, gpus_per_node, **kwargs):
        calls.append((model, gpus, profile, gpus_per_node, kwargs))
        tokens, samples, gbs, cp = kwargs["figures"]
        pred = SimpleNamespace(
            step_time_s=8.0,
            mfu=0.3,
            tokens_per_s=tokens,
            samples_per_s=samples,
            bubble_s=1.0,
            dp_exposed_s=0.5,
            offload_s=0.5,
        )
        mesh = SimpleNamespace(pp=2, dp=3, tp=4, cp=cp)
        return SimpleNamespace(
            plan=SimpleNamespace(predicted=pred, mesh=mesh, global_batch_size=gbs)
        )

    monkeypatch.setattr(planner.api, "plan", fake_plan)
    node = kind("k", gpus_per_node=4)
    point = plan_option("m.py", {"figures": (2048.0, 4.0, 8, 1)})(node, 3)
    assert calls[0] == ("m.py", 12, "h100-sxm", 4, {"figures": (2048.0, 4.0, 8, 1)})
    assert (point.step_time_s, point.mfu, point.tokens_per_step) == (8.0, 0.3, 4096)
    assert point.busy == 0.75 and point.mesh == "pp2 dp3 tp4"
    assert point.plan.global_batch_size == 8
    no_rate = plan_option("m.py", {"figures": (0.0, 0.0, 8, 2)})(node, 1)
    assert no_rate.tokens_per_step == 8 and no_rate.mesh == "pp2 dp3 tp4 cp2"
    tiny = plan_option("m.py", {"figures": (1.0, 10.0, 2, 1)})(node, 1)
    assert tiny.tokens_per_step == 1  # round(0.2) = 0 tokens, counted as 1


def test_node_counts_stop_at_the_availability():
    assert node_counts(1) == [1] and node_counts(2) == [1, 2] and node_counts(5) == [1, 2, 4, 5]
    assert node_counts(16) == [1, 2, 4, 8, 16]


# ------------------------------------------------------------------------- planner/recsys/cost

SYNC = 1e-4  # a collective's fixed cost, set so that its terms are live (the profiles hold 0)


def rec_model(dim: int = 16, unit: int = 0, ops: tuple[int, int] = (0, 0)) -> RecModel:
    table = TableBlock("t", "ebc", ("f", "g"), 1000, dim, 2.0, 0.0)
    return RecModel(
        [table],
        dense_params=100,
        dense_tensors=2,
        dense_flops_per_sample=200.0,
        dense_activations_per_sample=20.0,
        dense_forward_ops=ops[0],
        dense_backward_ops=ops[1],
        dense_unit_params=unit,
    )


def _hbm(p) -> float:
    return p.memory_bandwidth * p.elementwise_efficiency


def _options(costed: Costed) -> dict[str, TableOption]:
    return {o.label: o for o in costed.options["t"]}


@pytest.mark.parametrize("dim, gpus, labels", [
    (16, 4, ["tw", "cw2", "cw4", "dp", "host0.05", "host0.2", "rw"]),
    (64, 4, ["tw", "cw2", "cw4", "dp", "host0.05", "host0.2", "rw"]),
    (64, 8, ["tw", "cw2", "cw4", "cw8", "dp", "host0.05", "host0.2", "rw"]),
    (34, 8, ["tw", "dp", "host0.05", "host0.2", "rw"]),
    (16, 1, ["tw", "dp", "host0.05", "host0.2"]),
    (16, 16, ["tw", "cw2", "cw4", "dp", "host0.05", "host0.2", "rw", "twrw"]),
])  # fmt: skip
def test_column_shards_are_offered_where_k_ranks_each_get_a_multiple_of_4_columns(
    dim, gpus, labels
):
    """cw k: k <= ranks, k divides the dim and dim / k is a multiple of 4 (34 / 8 = 4 rounds
    down, 34 is no multiple of 8); row-wise beyond one rank; table-row-wise across nodes."""
    costed = price(rec_model(dim), cluster_of(gpus, "h100-sxm"), 512)
    assert [o.label for o in costed.options["t"]] == labels
    assert [o.count for o in costed.options["t"] if o.label.startswith("cw")] == [
        int(k[2:]) for k in labels if k.startswith("cw")
    ]


@pytest.mark.parametrize("optimizer, s", [("sgd", 0), ("adamw", 2)])
def test_row_and_table_row_wise_shards_by_hand(optimizer, s):
    """16 H100s on 2 nodes, batch 512, 2 ids a sample over 2 features, dim 16: the row-wise
    table reads 1/16 of the looked-up rows (1 + 2 (1 + s) passes) and its ids, writes every
    sample's partial sum, receives 1/16 of the ids and reduce-scatters the pooled rows forward
    and back ((n - 1) / n of them); the table-row-wise one does the same over one node's 8."""
    c = cluster_of(16, "h100-sxm", collective_sync=SYNC)
    hbm = _hbm(c.profile)
    opts = _options(price(rec_model(), c, 512, optimizer))
    a2a = 8 / 16 / (c.profile.inter_node_bandwidth * c.profile.collective_efficiency)
    bw, _ = c.link(list(range(16)))
    node_bw, _ = c.link(list(range(8)))
    read = 512 * 2.0 * 16 * 4
    ids = 512 * 2.0 * 8 + 512 * 2 * 8  # ids and one length per sample and feature
    pooled = 512 * 16 * 4
    weights = 1000 * 16 * 4
    passes = 1 + 2 * (1 + s)
    rw, twrw = opts["rw"], opts["twrw"]
    assert (rw.placement, rw.count, rw.sharding, twrw.placement, twrw.count) == (
        "all",
        16,
        "row_wise",
        "node",
        1,
    )
    io16 = 2 * (512 * 2.0 / 16) * 8 + 2 * pooled
    assert rw.lookup_s == pytest.approx((passes * read / 16 + io16) / hbm, rel=1e-12)
    assert rw.comm_s == pytest.approx(a2a * ids / 16 + 2 * 15 / 16 * pooled / bw, rel=1e-12)
    assert rw.device_bytes == pytest.approx(weights * (1 + s) / 16 + 2 * pooled, rel=1e-12)
    io8 = 2 * (512 * 2.0 / 8) * 8 + 2 * pooled
    assert twrw.lookup_s == pytest.approx((passes * read / 8 + io8) / hbm, rel=1e-12)
    want = a2a * (ids + 2 * pooled) / 8 + 2 * 7 / 8 * pooled / node_bw
    assert twrw.comm_s == pytest.approx(want, rel=1e-12)
    assert twrw.device_bytes == pytest.approx(weights * (1 + s) / 8 + 2 * pooled, rel=1e-12)
    assert rw.host_bytes == twrw.host_bytes == 0.0
    assert rw.time_s == pytest.approx(rw.lookup_s + rw.comm_s, rel=1e-12)


@pytest.mark.parametrize("optimizer, s", [("sgd", 0), ("adamw", 2)])
def test_column_and_data_parallel_shards_by_hand(optimizer, s):
    """4 H100s, batch 512: a cw4 shard looks up 4 of 16 columns of every row the batch reads
    and all the ids; a data-parallel replica reads its 128 samples' rows forward and writes
    their gradient rows (3 passes), all-reduces the whole table and steps all of it."""
    c = cluster_of(4, "h100-sxm")
    hbm = _hbm(c.profile)
    opts = _options(price(rec_model(), c, 512, optimizer))
    a2a = 3 / 4 / (c.profile.intra_node_bandwidth * c.profile.collective_efficiency)
    ids = 512 * 2.0 * 8 + 512 * 2 * 8
    passes = 1 + 2 * (1 + s)
    cw = opts["cw4"]
    io = 2 * 512 * 2.0 * 8 + 2 * 512 * 4 * 4
    assert cw.lookup_s == pytest.approx((passes * 512 * 2.0 * 4 * 4 + io) / hbm, rel=1e-12)
    assert cw.comm_s == pytest.approx(a2a * (ids + 2 * 512 * 4 * 4), rel=1e-12)
    assert cw.device_bytes == pytest.approx(1000 * 4 * 4 * (1 + s) + 2 * 512 * 4 * 4)
    assert (cw.table, cw.sharding, cw.host_bytes) == ("t", "column_wise", 0.0)
    assert (cw.kernel, cw.placement, cw.optimizer_s, cw.cache_ratio) == ("fused", "rank", 0.0, None)
    dp = opts["dp"]
    weights = 1000 * 16 * 4
    io_dp = 2 * 128 * 2.0 * 8 + 2 * 128 * 16 * 4
    assert dp.lookup_s == pytest.approx((3 * 128 * 2.0 * 16 * 4 + io_dp) / hbm, rel=1e-12)
    assert dp.optimizer_s == pytest.approx((3 + 2 * s) * weights / hbm, rel=1e-12)
    assert (dp.comm_s, dp.count, dp.placement, dp.kernel) == (0.0, 4, "all", "dense")
    assert dp.time_s == pytest.approx(dp.lookup_s + dp.optimizer_s, rel=1e-12)


def test_adam_tables_on_a_cpu_run_the_dense_kernel_by_hand():
    """fbgemm fuses no Adam on a CPU: a table-wise shard reads its rows forward and writes
    their gradient rows (2 passes), holds weights, gradient and two states, and AdamW steps
    the whole shard ((3 + 2 x 2) passes over it); SGD stays fused (3 passes)."""
    c = cluster_of(2, "cpu")
    hbm = _hbm(c.profile)
    read = 512 * 2.0 * 16 * 4
    io = 2 * 512 * 2.0 * 8 + 2 * 512 * 16 * 4
    weights, buffers = 1000 * 16 * 4, 2 * 512 * 16 * 4
    adam = _options(price(rec_model(), c, 512, "adamw", device="cpu"))["tw"]
    assert adam.kernel == "dense"
    assert adam.lookup_s == pytest.approx((2 * read + io) / hbm, rel=1e-12)
    assert (adam.device_bytes, adam.host_bytes) == (4 * weights + buffers, 0.0)
    assert adam.optimizer_s == pytest.approx(7 * weights / hbm, rel=1e-12)
    sgd = _options(price(rec_model(), c, 512, "sgd", device="cpu"))["tw"]
    assert sgd.kernel == "fused" and sgd.optimizer_s == 0.0
    assert sgd.lookup_s == pytest.approx((3 * read + io) / hbm, rel=1e-12)
    assert (sgd.device_bytes, sgd.host_bytes) == (weights + buffers, 0.0)


def test_a_host_cached_table_hits_its_share_of_uniform_rows_by_hand():
    """Uniform ids (zipf 0): a cache of 5% of the rows takes 5% of the lookups; the other
    95% of the row bytes move at the host link. AdamW: states on the host beside the rows."""
    c = cluster_of(2, "h100-sxm")
    p = c.profile
    hbm = _hbm(p)
    host = _options(price(rec_model(), c, 512, "adamw"))["host0.05"]
    read = 512 * 2.0 * 16 * 4
    io = 2 * 512 * 2.0 * 8 + 2 * 512 * 16 * 4
    want = 7 * read * (0.05 / hbm + 0.95 / p.host_bandwidth) + io / hbm
    assert host.lookup_s == pytest.approx(want, rel=1e-12)
    assert host.kernel == "fused_uvm_caching" and host.cache_ratio == 0.05
    assert host.device_bytes == pytest.approx(0.05 * 64000 + 2 * 512 * 16 * 4, rel=1e-12)
    assert host.host_bytes == pytest.approx(3 * 64000, rel=1e-12)


def test_zipf_hit_rate_is_the_laws_closed_form():
    """F(k) = ((1 + k)^(1 - s) - 1) / ((1 + R)^(1 - s) - 1), log1p(k) / log1p(R) at s = 1,
    k / R at s = 0; the cache clamped to [0, R]; no rows: every lookup hits."""
    assert zipf_hit_rate(1000, 2.0, 9) == pytest.approx((1 / 10 - 1) / (1 / 1001 - 1), rel=1e-12)
    assert zipf_hit_rate(1000, 0.5, 99) == pytest.approx(9 / (1001**0.5 - 1), rel=1e-12)
    assert zipf_hit_rate(1000, 1.0, 9) == pytest.approx(math.log(10) / math.log(1001), rel=1e-12)
    assert zipf_hit_rate(1000, 1.0 + 5e-10, 9) == pytest.approx(
        math.log(10) / math.log(1001), rel=1e-6
    )
    assert zipf_hit_rate(1000, 0.0, 250) == 0.25
    assert zipf_hit_rate(1000, 0.0, 2000) == 1.0 and zipf_hit_rate(1000, 2.0, 5000) == 1.0
    assert zipf_hit_rate(1000, 0.0, -5) == 0.0 and zipf_hit_rate(1000, 2.0, -5) == 0.0
    assert zipf_hit_rate(0, 1.0, 5) == 1.0 and zipf_hit_rate(1, 0.0, 0.5) == 0.5


@pytest.mark.parametrize("dtype, e", [("fp32", 4), ("bf16", 2)])
def test_the_dense_part_on_two_cpu_ranks_by_hand(dtype, e):
    """2 CPU ranks, batch 256 (128 a rank), 100 dense parameters in 2 tensors, 200 FLOPs a
    sample forward, 5 forward and 9 backward ops: products at the matmul rate plus each op's
    dispatch; DDP all-reduces 100 e bytes (2 (n - 1) / n of them, 2 (n - 1) latencies) and
    AdamW steps all of it (7 passes over fp32 weights, 8 ops a tensor); memory: fp32 master
    weights, gradients and two states, activations and the pooled rows (2 x 128 x 16 fp32)."""
    c = cluster_of(2, "cpu", collective_sync=SYNC)
    p = c.profile
    bw, alpha = c.link([0, 1])
    rate = p.peak_flops[dtype] * p.matmul_efficiency
    costed = price(rec_model(ops=(5, 9)), c, 256, "adamw", dtype, "cpu", memory_fraction=0.5)
    d = costed.dense
    fwd = 200 * 128 / rate + 5 * p.op_overhead
    bwd = 400 * 128 / rate + 9 * p.backward_op_overhead
    assert d.compute_s == pytest.approx(fwd + bwd, rel=1e-12)
    assert d.backward_s == pytest.approx(bwd, rel=1e-12)
    assert d.allreduce_fixed_s == pytest.approx(100 * e / bw + 2 * alpha + SYNC, rel=1e-12)
    assert d.allreduce_s_per_byte == pytest.approx(1 / bw, rel=1e-12)
    assert d.a2a_latency_s == pytest.approx(alpha + SYNC, rel=1e-12)
    assert d.dp_allreduce_latency_s == pytest.approx(2 * alpha + SYNC, rel=1e-12)
    opt = 7 * 100 * 4 / _hbm(p) + 2 * 8 * p.optimizer_op_overhead
    assert d.optimizer_s == pytest.approx(opt, rel=1e-12)
    assert d.fixed_s == pytest.approx(fwd + bwd + opt, rel=1e-12)
    device = 100 * (4 + e + 8) + 20 * 128 * e + 2 * 128 * 16 * 4
    assert d.device_bytes == pytest.approx(device, rel=1e-12)
    assert (d.params, d.strategy, d.forward_exposed_s, d.comm_overlap) == (100, "ddp", 0.0, 0.07)
    assert costed.device_capacity == pytest.approx(
        p.memory_bytes * 0.5 - p.reserved_bytes - device, rel=1e-12
    )
    assert costed.host_capacity == pytest.approx(p.host_memory_bytes / 2, rel=1e-12)
    assert (costed.ranks, costed.gpus_per_node, costed.device, costed.global_batch_size) == (
        2,
        2,
        "cpu",
        256,
    )


def test_zero3_on_two_cpu_ranks_by_hand():
    """ZeRO-3 with no unit known: half the states plus the whole dense part's parameters and
    gradients; one all-gather (or reduce-scatter) of 100 x 4 bytes, 1/2 of them, one latency;
    the forward's exposed past 0.07 of the forward; AdamW over half the weights, each tensor's
    8 ops at the DTensor dispatch cost."""
    c = cluster_of(2, "cpu", collective_sync=SYNC)
    p = c.profile
    bw, alpha = c.link([0, 1])
    costed = price(rec_model(ops=(5, 9)), c, 256, "adamw", "fp32", "cpu", dense_strategy="fsdp")
    d = costed.dense
    fwd = 200 * 128 / (p.peak_flops["fp32"] * p.matmul_efficiency) + 5 * p.op_overhead
    one = 0.5 * 400 / bw + alpha + SYNC
    assert d.strategy == "fsdp"
    assert d.allreduce_fixed_s == pytest.approx(2 * one, rel=1e-12)
    assert d.forward_exposed_s == pytest.approx(max(0.0, one - 0.07 * fwd), rel=1e-12)
    assert d.forward_exposed_s > 0
    opt = 7 * 100 * 4 / 2 / _hbm(p) + 2 * 8 * p.dtensor_op_overhead
    assert d.optimizer_s == pytest.approx(opt, rel=1e-12)
    device = 100 * 16 / 2 + 2 * 100 * 4 + 20 * 128 * 4 + 2 * 128 * 16 * 4
    assert d.device_bytes == pytest.approx(device, rel=1e-12)
    unit = price(rec_model(unit=30), c, 256, "adamw", "fp32", "cpu", dense_strategy="fsdp")
    assert d.device_bytes - unit.dense.device_bytes == pytest.approx(2 * 70 * 4, rel=1e-12)


def test_one_rank_pays_no_collective_and_runs_ddp_whatever_is_asked():
    c = cluster_of(1, "cpu", collective_sync=SYNC)
    d = price(rec_model(), c, 64, "sgd", "fp32", "cpu", dense_strategy="fsdp").dense
    assert (d.allreduce_fixed_s, d.a2a_latency_s, d.dp_allreduce_latency_s) == (0.0, 0.0, 0.0)
    assert (d.allreduce_s_per_byte, d.strategy, d.forward_exposed_s) == (0.0, "ddp", 0.0)
    assert d.sharding_latency_s("table_wise") == 0.0
    plain = price(rec_model(unit=30), c, 64, "adamw", "fp32", "cpu").dense
    asked = price(rec_model(unit=30), c, 64, "adamw", "fp32", "cpu", dense_strategy="fsdp")
    assert (asked.dense.device_bytes, asked.dense.optimizer_s) == (
        plain.device_bytes,
        plain.optimizer_s,
    )


def test_the_dense_choices_keep_each_strategys_capacity():
    c = cluster_of(8, "h100-sxm")
    ddp, fsdp = (price(rec_model(), c, 512, "adamw", dense_strategy=s) for s in ("ddp", "fsdp"))
    both = ddp.choosing_dense([fsdp])
    assert both.dense_choices == (
        (ddp.dense, ddp.device_capacity),
        (fsdp.dense, fsdp.device_capacity),
    )
    assert both.device_capacity == max(ddp.device_capacity, fsdp.device_capacity)
    second = both.with_dense(1)
    assert (second.dense, second.device_capacity, second.dense_choices) == (
        fsdp.dense,
        fsdp.device_capacity,
        (),
    )
    assert both.with_dense(0).device_capacity == ddp.device_capacity


def test_kernel_io_reads_ids_twice_and_moves_the_pooled_rows_twice():
    assert kernel_io(3, 5) == 2 * 3 * 8 + 2 * 5 * 4


# ------------------------------------------------------------------------- planner/resources/pool

FABRIC = {"between": ["n", "m"], "bandwidth_bytes_per_s": 25e9, "latency_s": 1e-5}


def test_a_pool_at_every_bound_reads_as_floats_and_the_profiles_node():
    """Zero price, idle, node power and carbon, PUE 1, idle = busy, a fraction of 1, zero
    latency: each at its bound and accepted; GPUs a node from the profile (1 for the measured
    H100) unless given."""
    edge = dict(
        ROW, price_per_gpu_hour=0, gpu_idle_watts=0, node_watts=0, carbon_g_per_kwh=0, pue=1
    )
    other = dict(ROW, name="m", profile="measured/h100-x1", gpu_idle_watts=700)
    third = dict(ROW, name="k", gpus_per_node=4)
    fabric = dict(FABRIC, latency_s=0, bandwidth_bytes_per_s=25_000_000_000)
    pool = pool_from_dict(
        {"node": [edge, other, third], "effective_time_fraction": 1, "fabric": [fabric]}, "p"
    )
    a, b, k = pool.node_types
    assert a == NodeType("n", "h100-sxm", 2, 8, 0.0, 700.0, 0.0, 0.0, 0.0, 1.0)
    figures = ("price_per_gpu_hour", "gpu_busy_watts", "gpu_idle_watts", "node_watts")
    figures += ("carbon_g_per_kwh", "pue")
    assert all(type(getattr(t, f)) is float for t in (a, b, k) for f in figures)
    assert (b.gpus_per_node, b.gpu_idle_watts, k.gpus_per_node) == (1, 700.0, 4)
    assert pool.effective_time_fraction == 1.0 and type(pool.effective_time_fraction) is float
    assert pool.path == "p" and pool.fabric == (Fabric(("n", "m"), 25e9, 0.0),)
    assert pool.link("m", "n") is pool.fabric[0] and pool.link("n", "k") is None
    assert type(pool.fabric[0].bandwidth_bytes_per_s) is type(pool.fabric[0].latency_s) is float
    assert pool_from_dict({"node": [ROW], "effective_time_fraction": 1e-9}, "p")


def _pool_error(data: dict) -> str:
    with pytest.raises(UserInputError) as err:
        pool_from_dict(data, "p")
    return str(err.value)


N = "pool p: node 'n': "
POOL_BAD = [
    ({"node": [ROW], "zeta": 1, "alpha": 2}, "pool p: unknown top-level key(s) alpha, zeta"),
    ({"node": [ROW], "effective_time_fraction": 0}, "pool p: effective_time_fraction must be in "
     "(0, 1], got 0"),
    ({"node": [ROW], "effective_time_fraction": 1.01}, "pool p: effective_time_fraction must be "
     "in (0, 1], got 1.01"),
    ({"node": [ROW], "effective_time_fraction": True}, "pool p: effective_time_fraction must be "
     "in (0, 1], got True"),
    ({"node": [ROW], "effective_time_fraction": float("nan")}, "pool p: effective_time_fraction "
     "must be in (0, 1], got nan"),
    ({"node": [ROW], "effective_time_fraction": "0.9"}, "pool p: effective_time_fraction must be "
     "in (0, 1], got '0.9'"),
    ({}, "pool p: no [[node]] tables; list at least one node type"),
    ({"node": []}, "pool p: no [[node]] tables; list at least one node type"),
    ({"node": ROW}, "pool p: no [[node]] tables; list at least one node type"),
    ({"node": [ROW, "m"]}, "pool p: node 2 is not a table"),
    ({"node": [{k: v for k, v in ROW.items() if k not in ("nodes", "pue")}]}, N + "missing "
     "field(s) nodes, pue"),
    ({"node": [ROW, {k: v for k, v in ROW.items() if k != "name"}]}, "pool p: node 2: missing "
     "field(s) name"),
    ({"node": [dict(ROW, colour=1, age=2)]}, N + "unknown field(s) age, colour"),
    ({"node": [dict(ROW, profile=3)]}, N + "unknown profile 3; choose one of a100-40g, a100-80g, "
     "cpu, h100-hbm2e, h100-sxm, h200, v100-16g, measured/h100-x1, measured/h200-x1, "
     "measured/vm-cpu-x2"),
    ({"node": [dict(ROW, profile="tpu")]}, N + "unknown profile 'tpu'; choose one of a100-40g, "
     "a100-80g, cpu, h100-hbm2e, h100-sxm, h200, v100-16g, measured/h100-x1, measured/h200-x1, "
     "measured/vm-cpu-x2"),
    ({"node": [dict(ROW, nodes=0)]}, N + "nodes must be a positive integer, got 0"),
    ({"node": [dict(ROW, nodes=True)]}, N + "nodes must be a positive integer, got True"),
    ({"node": [dict(ROW, nodes=2.0)]}, N + "nodes must be a positive integer, got 2.0"),
    ({"node": [dict(ROW, gpus_per_node=-1)]}, N + "gpus_per_node must be a positive integer, "
     "got -1"),
    ({"node": [dict(ROW, price_per_gpu_hour=-0.01)]}, N + "price_per_gpu_hour must be a number "
     ">= 0, got -0.01"),
    ({"node": [dict(ROW, price_per_gpu_hour=True)]}, N + "price_per_gpu_hour must be a number "
     ">= 0, got True"),
    ({"node": [dict(ROW, price_per_gpu_hour=float("inf"))]}, N + "price_per_gpu_hour must be a "
     "number >= 0, got inf"),
    ({"node": [dict(ROW, gpu_busy_watts=0)]}, N + "gpu_busy_watts must be a number > 0, got 0"),
    ({"node": [dict(ROW, gpu_idle_watts="1")]}, N + "gpu_idle_watts must be a number >= 0, got "
     "'1'"),
    ({"node": [dict(ROW, node_watts=-1)]}, N + "node_watts must be a number >= 0, got -1"),
    ({"node": [dict(ROW, carbon_g_per_kwh=-1)]}, N + "carbon_g_per_kwh must be a number >= 0, "
     "got -1"),
    ({"node": [dict(ROW, pue=0.99)]}, N + "pue must be a number >= 1, got 0.99"),
    ({"node": [dict(ROW, gpu_idle_watts=700.5)]}, N + "gpu_idle_watts exceeds gpu_busy_watts"),
    ({"node": [dict(ROW, name="")]}, "pool p: node '': name must be a non-empty string, unique "
     "in the pool"),
    ({"node": [dict(ROW, name=3)]}, "pool p: node 3: name must be a non-empty string, unique in "
     "the pool"),
    ({"node": [ROW, ROW]}, N + "name must be a non-empty string, unique in the pool"),
    ({"node": [ROW], "fabric": {}}, "pool p: fabric must be a list of [[fabric]] tables"),
    ({"node": [ROW], "fabric": ["x"]}, "pool p: fabric 1 is not a table"),
    ({"node": [ROW, dict(ROW, name="m")], "fabric": [FABRIC, dict(FABRIC, colour=1, age=2)]},
     "pool p: fabric 2: unknown field(s) age, colour"),
]  # fmt: skip
for _pair in (["n", "n"], ["n"], ["n", "m", "k"], ["n", "x"], ["n", 3], ("n", "m"), None):
    POOL_BAD.append(
        (
            {
                "node": [ROW, dict(ROW, name="m")],
                "fabric": [dict(FABRIC, between=_pair)],
            },
            "pool p: fabric 1: between must name two different node types of the pool, got "
            f"{_pair!r}",
        )
    )
for _key, _value, _bound in (
    ("bandwidth_bytes_per_s", 0, "> 0"),
    ("bandwidth_bytes_per_s", None, "> 0"),
    ("bandwidth_bytes_per_s", True, "> 0"),
    ("latency_s", -1e-9, ">= 0"),
    ("latency_s", "1", ">= 0"),
):
    POOL_BAD.append(
        (
            {
                "node": [ROW, dict(ROW, name="m")],
                "fabric": [dict(FABRIC, **{_key: _value})],
            },
            f"pool p: fabric 1: {_key} must be a number {_bound}, got {_value!r}",
        )
    )
POOL_BAD.append(
    (
        {
            "node": [ROW, dict(ROW, name="m")],
            "fabric": [FABRIC, dict(FABRIC, between=["m", "n"])],
        },
        "pool p: fabric 2: a second fabric between m and n",
    )
)


@pytest.mark.parametrize("data, message", POOL_BAD, ids=[m[7:] for _, m in POOL_BAD])
def test_each_defect_of_a_pool_is_refused_by_its_own_line(data, message):
    assert _pool_error(copy.deepcopy(data)) == message


def test_each_figure_names_its_line_or_what_stood_in_for_it(tmp_path):
    """Typed figures cite their line; an unset idle power cites the busy one; the step time
    its profile file; the fraction its line, or the default where the file has none."""
    from planner.hardware.profiles import profiles_dir

    text = (
        "effective_time_fraction = 0.8\n"
        '[[node]]\nname = "x"\nprofile = "h100-sxm"\nnodes = 1\nprice_per_gpu_hour = 2.5\n'
        "gpu_busy_watts = 700\nnode_watts = 0\ncarbon_g_per_kwh = 390\npue = 1.5\n"
        '[[node]]\nname = "y"\nprofile = "cpu"\nnodes = 1\nprice_per_gpu_hour = 0\n'
        "gpu_busy_watts = 100\ngpu_idle_watts = 50\nnode_watts = 10\ncarbon_g_per_kwh = 1\n"
        "pue = 1\n"
    )
    path = tmp_path / "pool.toml"
    path.write_text(text)
    pool = load_pool(path)
    h100 = os.path.relpath(profiles_dir() / "h100-sxm.toml")
    assert figure_sources(pool, ["x"]) == (
        f"{path}: x: price_per_gpu_hour 2.5 (line 6), gpu_busy_watts 700 (line 7), "
        "gpu_idle_watts 700 (not set: gpu_busy_watts), node_watts 0 (line 8), carbon_g_per_kwh "
        f"390 (line 9), pue 1.5 (line 10), step time from profile h100-sxm ({h100}); "
        "effective_time_fraction 0.8 (line 1)"
    )
    records = figure_records(pool, ["y"])
    assert [(r["kind"], r["figure"], r["line"]) for r in records] == [
        ("y", "price_per_gpu_hour", 15),
        ("y", "gpu_busy_watts", 16),
        ("y", "gpu_idle_watts", 17),
        ("y", "node_watts", 18),
        ("y", "carbon_g_per_kwh", 19),
        ("y", "pue", 20),
        ("y", "step time", None),
        ("", "effective_time_fraction", 1),
    ]
    assert records[-1]["source"] == f"{path}:1"
    assert records[2] == {
        "kind": "y", "figure": "gpu_idle_watts", "value": 50.0, "line": 17,
        "source": f"{path}:17",
    }  # fmt: skip
    path.write_text(text.split("\n", 1)[1])
    plain = load_pool(path)
    assert figure_records(plain, [])[-1] == {
        "kind": "",
        "figure": "effective_time_fraction",
        "value": 0.9,
        "line": None,
        "source": "the default, planner/resources/pool.py",
    }
    with pytest.raises(UserInputError) as err:
        load_pool(tmp_path / "none.toml")
    assert str(err.value) == (
        f"--resources {tmp_path / 'none.toml'}: no such file; give a pool .toml (profiles/pools/)"
    )


def test_figure_lines_number_from_one_and_skip_comments_and_other_tables():
    text = (
        "# effective_time_fraction = 0.5\n"
        "effective_time_fraction = 0.8 # = 3\n"
        '[[node]]\n  name = "a" # b\n  pue = 1.2\n'
        "[other]\nprice_per_gpu_hour = 9\n"
        '[[node]] # next # one\nname="c"\nnodes = 2\n'
        '[meta]\nname = "z"\n'
    )
    assert figure_lines(text) == {
        "": {"effective_time_fraction": 2},
        "a": {"name": 4, "pue": 5},
        "c": {"name": 9, "nodes": 10},
    }


def test_a_row_wise_table_on_two_ranks_reduce_scatters_half_its_pooled_rows():
    """2 H100s: each rank receives half the ids and reduce-scatters the pooled rows forward
    and back, (2 - 1) / 2 of their bytes each way."""
    c = cluster_of(2, "h100-sxm")
    rw = _options(price(rec_model(), c, 512))["rw"]
    a2a = 1 / 2 / (c.profile.intra_node_bandwidth * c.profile.collective_efficiency)
    bw, _ = c.link([0, 1])
    ids = 512 * 2.0 * 8 + 512 * 2 * 8
    assert rw.comm_s == pytest.approx(a2a * ids / 2 + 2 * 0.5 * 512 * 16 * 4 / bw, rel=1e-12)


def test_the_tables_get_the_whole_device_less_its_reserve_and_the_dense_part_by_default():
    c = cluster_of(2, "h100-sxm")
    p = c.profile
    costed = price(rec_model(), c, 512)
    assert costed.device_capacity == pytest.approx(
        p.memory_bytes - p.reserved_bytes - costed.dense.device_bytes, rel=1e-12
    )


def test_each_option_names_its_table_sharding_kernel_placement_and_shard_count():
    """16 H100s on 2 nodes, SGD: TorchRec's sharding type and kernel of each option, where
    its shards go and how many; only the host-cached ones hold host memory, only the
    data-parallel one joins the all-reduce and steps an optimizer apart."""
    opts = price(rec_model(), cluster_of(16, "h100-sxm"), 512).options["t"]
    assert [
        (o.table, o.label, o.sharding, o.kernel, o.placement, o.count, o.cache_ratio) for o in opts
    ] == [
        ("t", "tw", "table_wise", "fused", "rank", 1, None),
        ("t", "cw2", "column_wise", "fused", "rank", 2, None),
        ("t", "cw4", "column_wise", "fused", "rank", 4, None),
        ("t", "dp", "data_parallel", "dense", "all", 16, None),
        ("t", "host0.05", "table_wise", "fused_uvm_caching", "rank", 1, 0.05),
        ("t", "host0.2", "table_wise", "fused_uvm_caching", "rank", 1, 0.2),
        ("t", "rw", "row_wise", "fused", "all", 16, None),
        ("t", "twrw", "table_row_wise", "fused", "node", 1, None),
    ]
    assert [o.host_bytes > 0 for o in opts] == [False] * 4 + [True, True, False, False]
    assert [o.allreduce_bytes for o in opts] == [0.0] * 3 + [1000 * 16 * 4] + [0.0] * 4
    assert [o.optimizer_s > 0 for o in opts] == [False] * 3 + [True] + [False] * 4
    assert all(o.optimizer_s == 0.0 for o in opts if o.label != "dp")


@pytest.mark.parametrize("gpus, per_node, twrw", [(2, 1, False), (4, 2, True), (8, 8, False)])
def test_table_row_wise_needs_several_nodes_of_several_gpus(gpus, per_node, twrw):
    """Rows split over one node's ranks: offered across nodes (else it is row-wise) of more
    than one GPU (else it is table-wise)."""
    costed = price(rec_model(), cluster_of(gpus, "h100-sxm", gpus_per_node=per_node), 512)
    assert ("twrw" in _options(costed)) == twrw


def test_a_pool_read_from_a_dict_has_no_lines_to_cite_but_says_what_stood_in():
    """pool_from_dict keeps no lines (no file): only the figures that stood in for unset ones
    are sourced, the busy power for the idle, the profile for the step and the default
    fraction."""
    from planner.hardware.profiles import profiles_dir

    pool = pool_from_dict({"node": [ROW]}, "p")
    assert figure_records(pool, ["n"]) == [
        {"kind": "n", "figure": "gpu_idle_watts", "value": 700.0, "line": None,
         "source": "not set: gpu_busy_watts"},
        {"kind": "n", "figure": "step time", "value": "h100-sxm", "line": None,
         "source": os.path.relpath(profiles_dir() / "h100-sxm.toml")},
        {"kind": "", "figure": "effective_time_fraction", "value": 0.9, "line": None,
         "source": "the default, planner/resources/pool.py"},
    ]  # fmt: skip


def test_a_fabric_of_one_byte_a_second_is_slow_but_valid_and_a_broken_file_is_named(tmp_path):
    """Any bandwidth above 0 is a fabric (the bound is 0, not 1); a file TOML cannot parse is
    named as the pool it should be."""
    nodes = [ROW, dict(ROW, name="m")]
    pool = pool_from_dict({"node": nodes, "fabric": [dict(FABRIC, bandwidth_bytes_per_s=1)]}, "p")
    assert pool.fabric[0].bandwidth_bytes_per_s == 1.0
    path = tmp_path / "pool.toml"
    path.write_text("effective_time_fraction = \n")
    with pytest.raises(UserInputError) as err:
        load_pool(path)
    assert str(err.value).startswith(f"pool {path} is not valid TOML: ")
