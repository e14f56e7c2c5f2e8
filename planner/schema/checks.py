"""The checks every plan passes before anything reads it (``validate_plan``): its schema, the
mesh and batch arithmetic, every block, stage and prediction, each failure one line naming the
field. Kept apart from the records (``plan``) and their JSON form (the package)."""

from __future__ import annotations

from typing import Any

from planner.errors import UserInputError
from planner.schema.mesh import Mesh
from planner.schema.plan import Plan
from planner.training import replica_counts
from planner.vocab import (
    BATCHNORM_STATS,
    DTYPES,
    OFFLOAD,
    OPTIMIZERS,
    RECOMPUTE,
    SCHEDULES,
    TP_STYLES,
    is_tp_style,
)

SCHEMA = "meshplan.plan/1"

REQUIRED = {
    "schema": str,
    "model": dict,
    "cluster": dict,
    "mesh": dict,
    "global_batch_size": int,
    "micro_batch_size": int,
    "num_microbatches": int,
    "schedule": str,
    "virtual_stages": int,
    "zero_stage": int,
    "dtype": str,
    "optimizer": str,
    "stages": list,
    "blocks": list,
    "predicted": dict,
    "solver": dict,
}


def validate_plan(plan: Any, where: str) -> None:
    """Every check a plan passes before anything reads it; each failure is one line saying
    which field is wrong. A typed plan is checked as the JSON it writes."""
    if isinstance(plan, Plan):
        plan = plan.to_dict()
    if not isinstance(plan, dict):
        raise UserInputError(f"plan {where} is not a JSON object")
    schema = plan.get("schema")
    if schema != SCHEMA:
        raise UserInputError(
            f"plan {where} has schema {schema!r}, this meshplan reads {SCHEMA!r}: plan again"
        )
    for key, kind in REQUIRED.items():
        if not isinstance(plan.get(key), kind) or isinstance(plan.get(key), bool):
            raise UserInputError(f"plan {where}: {key!r} is missing or not a {kind.__name__}")
    _check_header(plan, where)
    _check_blocks(plan, where)
    _check_stages(plan, where)
    _check_sequence_stream(plan, where)
    _check_prediction(plan, where)
    _check_report_fields(plan, where)
    _check_kinds(plan, where)


def _check_kinds(plan: dict, where: str) -> None:
    """A heterogeneous plan's kinds: a name per global rank, each one of the plan's kinds, and
    every rank of a stage of that stage's kind (a single-kind plan has none of these)."""
    kinds, ranks = plan.get("kinds"), plan.get("rank_kinds")
    if kinds is None and ranks is None and all("kind" not in st for st in plan["stages"]):
        return
    if not isinstance(kinds, list) or not all(
        isinstance(k, dict) and isinstance(k.get("name"), str) for k in kinds
    ):
        raise UserInputError(f"plan {where}: kinds must be a list of objects with a name")
    names = {k["name"] for k in kinds}
    gpus = plan["cluster"]["gpus"]
    if not isinstance(ranks, list) or len(ranks) != gpus or not set(ranks) <= names:
        raise UserInputError(
            f"plan {where}: rank_kinds must name one of the plan's kinds for each of {gpus} ranks"
        )
    for st in plan["stages"]:
        kind = st.get("kind")
        if kind not in names or any(ranks[r] != kind for r in st["ranks"]):
            raise UserInputError(
                f"plan {where}: stage {st['index']} must name its kind, the kind of its ranks"
            )


def _check_header(plan: dict, where: str) -> None:
    """The mesh, the model, the cluster, the batch sizes and the words of the plan."""
    mesh = plan["mesh"]
    for k in ("pp", "dp", "tp"):
        if not isinstance(mesh.get(k), int) or isinstance(mesh.get(k), bool) or mesh[k] < 1:
            raise UserInputError(f"plan {where}: mesh.{k} must be a positive integer")
    cp = mesh.setdefault("cp", 1)
    if not isinstance(cp, int) or isinstance(cp, bool) or cp < 1:
        raise UserInputError(f"plan {where}: mesh.cp must be a positive integer")
    ep = mesh.setdefault("ep", 1)
    if not isinstance(ep, int) or isinstance(ep, bool) or ep < 1 or mesh["dp"] % ep:
        raise UserInputError(f"plan {where}: mesh.ep must be a positive integer dividing mesh.dp")
    model = plan["model"]
    for k in ("file", "sha256"):
        if not isinstance(model.get(k), str):
            raise UserInputError(f"plan {where}: model.{k} is missing")
    for key in ("global_batch_size", "micro_batch_size", "num_microbatches", "virtual_stages"):
        if plan[key] < 1:
            raise UserInputError(f"plan {where}: {key} must be positive")
    _check_stage_degrees(plan, where)
    gpus = plan["cluster"].get("gpus")
    if not isinstance(gpus, int) or gpus != _dims(mesh).size:
        raise UserInputError(f"plan {where}: cluster.gpus does not equal the mesh's ranks")
    if plan["global_batch_size"] != (
        mesh["dp"] * plan["micro_batch_size"] * plan["num_microbatches"]
    ):
        raise UserInputError(
            f"plan {where}: global_batch_size != dp * micro_batch_size * num_microbatches"
        )
    if plan["schedule"] not in SCHEDULES:
        raise UserInputError(f"plan {where}: unknown schedule {plan['schedule']!r}")
    if plan["zero_stage"] not in (0, 1, 2, 3):
        raise UserInputError(f"plan {where}: zero_stage must be 0-3")
    if plan["dtype"] not in DTYPES or plan["optimizer"] not in OPTIMIZERS:
        raise UserInputError(f"plan {where}: unknown dtype or optimizer")
    if plan.get("batchnorm", BATCHNORM_STATS[0]) not in BATCHNORM_STATS:
        raise UserInputError(f"plan {where}: batchnorm must be one of {', '.join(BATCHNORM_STATS)}")
    if plan.get("reduce_dtype", "fp32") not in ("fp32", plan["dtype"]):
        raise UserInputError(f"plan {where}: reduce_dtype must be fp32 or the plan's dtype")


def _check_blocks(plan: dict, where: str) -> None:
    """Every block named once, with its modules, choices and stage, in stage order."""
    mesh = plan["mesh"]
    n_stages = mesh["pp"] * plan["virtual_stages"]
    if len(plan["stages"]) != n_stages:
        raise UserInputError(f"plan {where}: expected {n_stages} stages")
    names = []
    for b in plan["blocks"]:
        if not isinstance(b, dict) or not isinstance(b.get("name"), str):
            raise UserInputError(f"plan {where}: a block lacks its name")
        if not isinstance(b.get("modules"), list) or not all(
            isinstance(x, str) for x in b["modules"]
        ):
            raise UserInputError(f"plan {where}: block {b['name']!r} lacks its modules")
        if b.get("recompute") not in RECOMPUTE:
            raise UserInputError(f"plan {where}: block {b['name']!r} has a bad recompute")
        if b.get("offload") not in OFFLOAD:
            raise UserInputError(f"plan {where}: block {b['name']!r} has a bad offload")
        if not isinstance(b.get("tp_plan"), dict):
            raise UserInputError(f"plan {where}: block {b['name']!r} has a bad tp_plan")
        sums = b.get("tp_grad_sums", [])
        if not isinstance(sums, list) or not all(isinstance(x, str) for x in sums):
            raise UserInputError(
                f"plan {where}: block {b['name']!r} has a bad tp_grad_sums (a list of modules)"
            )
        local = b.get("tp_local_attributes", [])
        if not isinstance(local, list) or not all(isinstance(x, str) and x for x in local):
            raise UserInputError(
                f"plan {where}: block {b['name']!r} has a bad tp_local_attributes (a list of "
                "module attribute paths)"
            )
        for key in ("takes_sequence_shard", "leaves_sequence_shard"):
            if key in b and (b[key] is not True or "sp_block" not in b["tp_plan"].values()):
                raise UserInputError(
                    f"plan {where}: block {b['name']!r} has a bad {key} (true, on a block "
                    'whose tp_plan runs it sequence-parallel with "sp_block", or left out)'
                )
        bad = [v for v in b["tp_plan"].values() if not is_tp_style(v)]
        if bad:
            raise UserInputError(
                f"plan {where}: block {b['name']!r} has an unknown tensor-parallel style "
                f"{bad[0]!r} (known: {', '.join(TP_STYLES)}; by k blocks: "
                "colwise_dtensor[_in_out]:k, colwise_gather[_in_out]:k)"
            )
        stage = b.get("stage")
        if not isinstance(stage, int) or isinstance(stage, bool) or not 0 <= stage < n_stages:
            raise UserInputError(f"plan {where}: block {b['name']!r} has a bad stage")
        names.append(b["name"])
    if len(set(names)) != len(names):
        raise UserInputError(f"plan {where}: block names repeat")
    stages_of = [b["stage"] for b in plan["blocks"]]
    if stages_of != sorted(stages_of):
        raise UserInputError(f"plan {where}: blocks are not in stage order")


def _check_sequence_stream(plan: dict, where: str) -> None:
    """The sequence-sharded stream's flags agree: inside a stage, a block leaves the shard
    exactly where the next takes it; at a pipeline cut, a block leaves or takes it only where
    the receiving stage receives shards; the first stage receives nothing."""
    stages = {s["index"]: s for s in plan["stages"] if isinstance(s, dict) and "index" in s}
    for s in stages.values():
        if s.get("receives_sequence_shard") not in (None, True) or (
            s.get("receives_sequence_shard") and s["index"] == 0
        ):
            raise UserInputError(
                f"plan {where}: stage {s['index']} has a bad receives_sequence_shard (true on a "
                "stage after the first, or left out)"
            )
    blocks = plan["blocks"]
    if blocks and (
        blocks[0].get("takes_sequence_shard") or blocks[-1].get("leaves_sequence_shard")
    ):
        raise UserInputError(
            f"plan {where}: the first block cannot take, nor the last leave, a sequence shard"
        )
    for before, after in zip(blocks, blocks[1:]):
        leaves = before.get("leaves_sequence_shard", False)
        takes = after.get("takes_sequence_shard", False)
        if before["stage"] == after["stage"]:
            ok = leaves == takes
        else:
            ok = not (leaves or takes) or bool(
                stages.get(after["stage"], {}).get("receives_sequence_shard")
            )
        if not ok:
            raise UserInputError(
                f"plan {where}: block {before['name']!r} and the block after it, "
                f"{after['name']!r}, disagree on whether the stream between them is "
                "sequence-sharded (leaves_sequence_shard / takes_sequence_shard, and at a "
                "pipeline cut the stage's receives_sequence_shard)"
            )


def _check_stage_degrees(plan: dict, where: str) -> None:
    """Per-stage TP and DP degrees (heterogeneous pipelines): one per pipeline rank, the
    largest being mesh.tp / mesh.dp, each stage's micro-batches a whole number, with one stage
    per rank and no context or expert parallelism, which the runtime does not combine with
    them."""
    mesh = plan["mesh"]
    for axis in ("tp", "dp"):
        degrees = mesh.get(f"stage_{axis}")
        if degrees is None:
            continue
        ok = isinstance(degrees, list) and len(degrees) == mesh["pp"]
        ok = ok and all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in degrees)
        if not ok or max(degrees) != mesh[axis]:
            raise UserInputError(
                f"plan {where}: mesh.stage_{axis} must list {mesh['pp']} positive "
                f"{axis.upper()} degrees, the largest equal to mesh.{axis} ({mesh[axis]})"
            )
        if mesh["cp"] != 1 or mesh["ep"] != 1 or plan.get("virtual_stages") != 1:
            raise UserInputError(
                f"plan {where}: mesh.stage_{axis} needs cp = ep = 1 and one stage per pipeline rank"
            )
        if axis == "dp":
            per = plan["global_batch_size"] // plan["micro_batch_size"]
            if any(per % d for d in degrees):
                raise UserInputError(
                    f"plan {where}: mesh.stage_dp {degrees} must divide the step's {per} "
                    "micro-batches"
                )


def _dims(mesh: dict) -> Mesh:
    return Mesh(
        mesh["pp"],
        mesh["dp"],
        mesh["tp"],
        mesh["ep"],
        mesh["cp"],
        mesh.get("stage_tp"),
        mesh.get("stage_dp"),
    )


def _check_stages(plan: dict, where: str) -> None:
    """Each stage lists its blocks, sits on pp rank index % pp, and names its ranks."""
    mesh = plan["mesh"]
    pp = mesh["pp"]
    dims = _dims(mesh)
    for i, st in enumerate(plan["stages"]):
        if not isinstance(st, dict) or not isinstance(st.get("blocks"), list):
            raise UserInputError(f"plan {where}: stage {i} is malformed")
        own = [b["name"] for b in plan["blocks"] if b["stage"] == i]
        if st["blocks"] != own:
            raise UserInputError(f"plan {where}: stage {i} does not list its blocks {own}")
        if st.get("index") != i or st.get("pp_rank") != i % pp:
            raise UserInputError(f"plan {where}: stage {i} has a wrong index or pp_rank")
        want = dims.stage_ranks(i % pp)
        if st.get("ranks") != want:
            raise UserInputError(f"plan {where}: stage {i} ranks are not {want}")
        counts = replica_counts(
            plan["global_batch_size"], dims.dp_of(i % pp), plan["micro_batch_size"]
        )
        stored = (st.get("local_batch_size", counts[0]), st.get("num_microbatches", counts[1]))
        if stored != counts:
            raise UserInputError(
                f"plan {where}: stage {i} local_batch_size and num_microbatches are "
                f"{stored}, not the global batch's share {counts}"
            )
        for key in ("forward_s", "backward_s"):
            _number(st, key, f"plan {where}: stage {i}")


def _check_prediction(plan: dict, where: str) -> None:
    """The learning rate, the model's arguments and the predicted numbers."""
    model, pp = plan["model"], plan["mesh"]["pp"]
    if not isinstance(plan.get("lr", 3e-4), (int, float)) or not plan.get("lr", 3e-4) > 0:
        raise UserInputError(f"plan {where}: lr must be a positive number")
    if not isinstance(model.get("args", {}), dict):
        raise UserInputError(f"plan {where}: model.args must be an object")
    pred = plan["predicted"]
    for key in ("step_time_s", "peak_memory_bytes", "capacity_bytes", "mfu"):
        _number(pred, key, f"plan {where}: predicted")
    rng = pred.get("step_time_range_s")
    if rng is not None and not (
        isinstance(rng, list)
        and len(rng) == 2
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in rng)
        and 0 <= rng[0] <= rng[1]
    ):
        raise UserInputError(
            f"plan {where}: predicted.step_time_range_s must be [fastest, slowest] seconds"
        )
    per_stage = pred.get("memory_per_stage")
    if not isinstance(per_stage, list) or len(per_stage) != pp:
        raise UserInputError(f"plan {where}: predicted.memory_per_stage needs {pp} entries")
    for mem in per_stage:
        for key in ("params", "grads", "optimizer", "activations", "other", "total"):
            _number(mem, key, f"plan {where}: predicted.memory_per_stage")


STAGE_KEYS = ("tp_comm_s", "p2p_s", "dp_comm_s", "dp_exposed_s", "optimizer_s", "offload_s")
BLOCK_KEYS = ("time_per_microbatch_s", "memory_bytes", "activation_bytes_per_microbatch")
CANDIDATE_KEYS = ("step_time_s", "peak_memory_bytes")


def _check_report_fields(plan: dict, where: str) -> None:
    """What the report reads beyond what the runtime needs, so a hand-edited or truncated plan
    is a one-line error rather than a traceback."""

    def number(obj: object, key: str, what: str) -> None:
        value = obj.get(key) if isinstance(obj, dict) else None
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
            raise UserInputError(f"plan {where}: {what} lacks a non-negative number {key!r}")

    cl = plan["cluster"]
    for key in ("nodes", "gpus_per_node"):
        if not isinstance(cl.get(key), int) or cl[key] < 1:
            raise UserInputError(f"plan {where}: cluster.{key} must be a positive integer")
    if cl["nodes"] * cl["gpus_per_node"] < cl["gpus"]:
        raise UserInputError(f"plan {where}: cluster has fewer GPUs than cluster.gpus")
    for st in plan["stages"]:
        for key in STAGE_KEYS:
            number(st, key, f"stage {st.get('index')}")
    for b in plan["blocks"]:
        for key in BLOCK_KEYS:
            number(b, key, f"block {b['name']!r}")
        if not isinstance(b.get("tp_variant"), str) or not isinstance(b.get("class"), str):
            raise UserInputError(f"plan {where}: block {b['name']!r} lacks tp_variant or class")
    sol = plan["solver"]
    cands, alts = sol.get("candidates"), sol.get("alternatives")
    if not isinstance(cands, list) or not isinstance(alts, list):
        raise UserInputError(f"plan {where}: solver.candidates or solver.alternatives is missing")
    for c in cands:
        for key in CANDIDATE_KEYS:
            number(c, key, "a solver candidate")
        if not isinstance(c.get("label"), str) or not isinstance(c.get("feasible"), bool):
            raise UserInputError(f"plan {where}: a solver candidate lacks label or feasible")
    for a in alts:
        if (
            not isinstance(a, dict)
            or not isinstance(a.get("label"), str)
            or not isinstance(a.get("why_not"), str)
        ):
            raise UserInputError(f"plan {where}: an alternative lacks label or why_not")
    for key in ("samples_per_s", "tokens_per_s"):
        number(plan["predicted"], key, "predicted")
    for key in ("candidates_total", "candidates_solved", "candidates_pruned", "solve_time_s"):
        number(sol, key, "solver")


def _number(obj: Any, key: str, where: str) -> float:
    value = obj.get(key) if isinstance(obj, dict) else None
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or value != value
        or value < 0
        or value == float("inf")
    ):
        raise UserInputError(f"{where}: {key} must be a non-negative number")
    return float(value)
