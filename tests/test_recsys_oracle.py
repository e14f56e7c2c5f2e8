"""TorchRec runs of the tiny DLRM against one-process training.

On 2 and 4 CPU ranks (gloo), at a global batch of 256, six plans — every table table-wise,
column-wise where TorchRec can split it (else table-wise), data-parallel, a mix of the three
(one table table-wise, the widest column-wise, the others data-parallel), the planner's own plan
(on the cpu profile all data-parallel: each further sharding type costs TorchRec's five
all-to-alls a step), and that plan with the dense MLPs under ZeRO-3 (FSDP2 beside TorchRec's
tables) — train 5 steps under torchrun through
``runtime.recsys`` (one launch per world size). Every parameter, the sharded tables gathered
from their shards, must equal 5 steps of plain SGD in one process on the same global batches:
|theta_plan - theta_ref| <= 1e-5 max|theta_ref| + 1e-3 max|theta_ref - theta_0|, and every
tensor must have moved, so a frozen table fails; a gradient off by the world size fails too
(``test_oracle_notices_a_wrong_table``). The same plans also train with AdamW on 2 ranks
against torch's AdamW in one process (``test_adamw_plan_trains_like_one_process``).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import forked_ranks
import pytest
import torch
import torchrec  # noqa: F401  (no skip: the README's test command installs the recsys extra)

from planner.modelfile import load_model_file
from planner.recsys.planning import plan_recsys
from planner.training import training_from
from runtime.launch import worker_env

ROOT = Path(__file__).resolve().parent.parent
DLRM = ROOT / "examples" / "dlrm.py"
STEPS = 5
KINDS = ("tw", "cw", "dp", "mixed", "planner", "fsdp")
TRAINING = {"global_batch_size": 256, "optimizer": "sgd", "dtype": "fp32", "lr": 0.5}
ADAMW = {**TRAINING, "optimizer": "adamw", "lr": 0.01}

pytestmark = pytest.mark.distributed


def _plans(world: int, out: Path, training: dict = TRAINING) -> dict[str, Path]:
    mf = load_model_file(DLRM, {"size": "tiny"})
    settings = training_from(training, "test")
    base, _ = plan_recsys(mf, world, profile="cpu", training=settings, device="cpu")
    # fbgemm's CPU kernels fuse no Adam: its sharded tables run TorchRec's dense kernel
    kernel = "fused" if training["optimizer"] == "sgd" else "dense"
    paths = {}
    for kind in KINDS:
        plan = copy.deepcopy(base)
        for i, t in enumerate(plan["tables"]):
            if kind == "dp" or kind == "mixed" and i % 2 == 1:
                t.update(sharding="data_parallel", kernel="dense", ranks=list(range(world)))
            elif kind == "mixed" and i == 0:
                t.update(sharding="table_wise", kernel=kernel, ranks=[world - 1])
            elif kind == "mixed":  # the widest table (16 columns) in 4-column shards
                t.update(sharding="column_wise", kernel=kernel, ranks=list(range(min(world, 4))))
            elif kind in ("tw", "cw"):
                t.update(sharding="table_wise", kernel=kernel, ranks=[i % world])
                k = min(world, 4)
                if kind == "cw" and t["dim"] % k == 0 and (t["dim"] // k) % 4 == 0:
                    t.update(sharding="column_wise", ranks=list(range(k)))
                elif kind == "cw" and t["dim"] % 2 == 0 and (t["dim"] // 2) % 4 == 0:
                    t.update(sharding="column_wise", ranks=[i % world, (i + 1) % world])
        if kind == "fsdp":  # the planner's tables, the MLPs under ZeRO-3 (FSDP2)
            plan["dense"]["strategy"] = "fsdp"
        path = out / kind / "plan.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(plan))
        paths[kind] = path
    return paths


def _reference(steps: int, training: dict = TRAINING) -> tuple[dict, dict]:
    """(initial, final) parameters of one process on the global batch's mean loss: plain
    SGD, or torch's AdamW with its defaults (dense: every row steps, looked up or not)."""
    spec = importlib.util.spec_from_file_location("dlrm_reference", DLRM)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    torch.manual_seed(0)
    model = m.build_model("tiny")
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if training["optimizer"] == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=training["lr"])
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=training["lr"])
    for step in range(steps):
        inputs, labels = m.make_batch(training["global_batch_size"], step=step)
        loss = m.loss_fn(model(*inputs), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return initial, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def reference():
    return _reference(STEPS)


# 4 ranks run with the long matrix (``-m "long or zoo"``, CI's second command)
@pytest.fixture(
    scope="module",
    params=[2, pytest.param(4, marks=pytest.mark.long)],
    ids=lambda w: f"world{w}",
)
def runs(request, tmp_path_factory):
    world = request.param
    return world, _launch(world, tmp_path_factory.mktemp(f"recsys{world}"), TRAINING)


@pytest.fixture(scope="module")
def adamw_runs(tmp_path_factory):
    return 2, _launch(2, tmp_path_factory.mktemp("recsys_adamw"), ADAMW)


def _launch(world: int, out: Path, training: dict) -> dict[str, Path]:
    """Every plan of ``KINDS`` trained STEPS steps in one torchrun launch of ``world`` ranks."""
    plans = _plans(world, out, training)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={world}", "-m", "runtime.recsys",
           "--plans", *map(str, plans.values()),
           "--run-dirs", *(str(p.parent) for p in plans.values()),
           "--steps", str(STEPS), "--dump-params"]  # fmt: skip
    proc = forked_ranks.run(cmd, env=worker_env(), capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return plans


def _mismatches(got: dict, initial: dict, ref: dict) -> list[str]:
    bad = []
    for name, want in ref.items():
        moved = (want - initial[name]).abs().max().item()
        tol = 1e-5 * want.abs().max().item() + 1e-3 * moved
        err = (got[name] - want).abs().max().item()
        if err > tol or moved < 100 * 1e-7:
            bad.append(f"{name}: |diff| {err:.2e} > tol {tol:.2e} (moved {moved:.2e})")
    return bad


@pytest.mark.parametrize("kind", KINDS)
def test_plan_trains_like_one_process(runs, reference, kind):
    world, plans = runs
    plan = json.loads(plans[kind].read_text())
    shardings = {t["sharding"] for t in plan["tables"]}
    if kind == "cw":
        assert "column_wise" in shardings
    if kind == "mixed":  # three sharding types in one plan, as a planner may mix them
        assert shardings == {"data_parallel", "table_wise", "column_wise"}, plan["tables"]
    got = torch.load(plans[kind].parent / "params.pt")
    initial, final = reference
    assert set(got) == set(final)
    assert _mismatches(got, initial, final) == []
    records = [json.loads(line) for line in (plans[kind].parent / "metrics.jsonl").open()]
    assert len(records) == STEPS
    # FSDP2 really sharded the MLPs (their parameters are DTensors), and only in that plan
    assert (records[0]["sharded_dense_params"] > 0) == (kind == "fsdp")


@pytest.mark.parametrize("kind", KINDS)
def test_adamw_plan_trains_like_one_process(adamw_runs, kind):
    """AdamW on 2 CPU ranks: the sharded tables on TorchRec's dense kernel (fbgemm's CPU
    kernels have no fused Adam) stepped by torch's AdamW shard by shard, which is AdamW on the
    whole table because every term of its update is elementwise."""
    world, plans = adamw_runs
    plan = json.loads(plans[kind].read_text())
    assert plan["optimizer"] == "adamw"
    assert {t["kernel"] for t in plan["tables"]} == {"dense"}
    got = torch.load(plans[kind].parent / "params.pt")
    initial, final = _reference(STEPS, ADAMW)
    assert set(got) == set(final)
    assert _mismatches(got, initial, final) == []


def test_oracle_notices_a_wrong_table():
    """The comparison fails when one table is off by what a missing gradient division
    (a factor of the world size) would leave."""
    initial, final = _reference(2)
    wrong = dict(final)
    name = "ebc.embedding_bags.t0.weight"
    wrong[name] = initial[name] + 2 * (final[name] - initial[name])
    assert _mismatches(wrong, initial, final) != []
