"""`plan run`: refusals before anything starts, checkpoint/resume, and two nodes on localhost."""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import threading
from pathlib import Path

import pytest
from oracle import reference_for_plan
from runs import forced_plan, launch, losses_of

from meshplan.cli import main as plan_main
from planner.errors import UserInputError
from runtime.launch import run_plan

ROOT = Path(__file__).resolve().parent.parent
RTOL = 1e-4


def opts(**kw) -> argparse.Namespace:
    base = dict(
        steps=5,
        device="cpu",
        seed=0,
        checkpoint_every=0,
        resume=False,
        run_dir=None,
        nnodes=1,
        node_rank=0,
        rdzv_endpoint=None,
        rdzv_id="meshplan-test",
    )
    base.update(kw)
    return argparse.Namespace(**base)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.fixture(scope="module")
def mlp_plan(tmp_path_factory) -> Path:
    """A world-4 plan of a private copy of the MLP example (so its hash can be broken)."""
    work = tmp_path_factory.mktemp("launch")
    model = work / "mlp.py"
    shutil.copy(ROOT / "examples" / "mlp.py", model)
    from planner.api import plan
    from planner.schema import write_plan
    from planner.search import Pins

    result = plan(
        model,
        4,
        model_args={"size": "tiny"},
        profile="cpu",
        global_batch_size=8,
        dtype="fp32",
        pins=Pins(
            tp=1,
            dp=2,
            pp=2,
            zero=0,
            schedule="1f1b",
            micro_batch_size=2,
            recompute="none",
            offload="none",
        ),
    )
    return write_plan(result.plan, work / "plan")


def test_corrupt_plan_is_refused_in_one_line(tmp_path, capsys):
    bad = tmp_path / "plan.json"
    bad.write_text('{"schema": "meshplan.plan/1", "mesh": ')
    assert plan_main(["run", str(bad)]) == 2
    line = one_error_line(capsys)
    assert "not valid JSON" in line and str(bad) in line


def test_missing_plan_is_refused(tmp_path, capsys):
    assert plan_main(["run", str(tmp_path / "nope.json")]) == 2
    assert "does not exist" in one_error_line(capsys)


def test_inconsistent_plan_is_refused(mlp_plan, tmp_path, capsys):
    doc = json.loads(mlp_plan.read_text())
    doc["cluster"]["gpus"] = 8  # mesh is 2*2*1 = 4
    broken = tmp_path / "plan.json"
    broken.write_text(json.dumps(doc))
    assert plan_main(["run", str(broken)]) == 2
    assert "cluster.gpus does not equal the mesh's ranks" in one_error_line(capsys)


@pytest.mark.parametrize(
    "edit,says",
    [
        ({"zero_stage": 1, "mesh": {"pp": 2, "dp": 2, "tp": 1}}, "ZeRO-1 with pipeline"),
        ({"mesh": {"pp": 2, "dp": 1, "tp": 1, "cp": 2}}, "context parallelism without"),
    ],
)
def test_plan_the_runtime_cannot_build_is_refused_before_launch(
    mlp_plan, tmp_path, capsys, edit, says
):
    """One line before any process starts, not a traceback from every rank."""
    from planner.schema import Plan
    from runtime.capability import check_runnable

    doc = json.loads(mlp_plan.read_text())
    doc.update(edit)
    with pytest.raises(UserInputError, match=says):
        check_runnable(Plan.from_dict(doc))


def test_world_size_that_nodes_cannot_host_is_refused(mlp_plan, capsys):
    assert plan_main(["run", str(mlp_plan), "--device", "cpu", "--nnodes", "3"]) == 2
    line = one_error_line(capsys)
    assert "needs 4 processes" in line and "3 nodes" in line


def test_multinode_without_endpoint_is_refused(mlp_plan):
    with pytest.raises(UserInputError, match="--rdzv-endpoint"):
        run_plan(mlp_plan, opts(nnodes=2))


def test_changed_model_file_is_refused(mlp_plan, tmp_path, capsys):
    doc = json.loads(mlp_plan.read_text())
    model = tmp_path / "mlp.py"
    model.write_text(Path(doc["model"]["file"]).read_text() + "\n# edited\n")
    doc["model"]["file"] = str(model)
    edited = tmp_path / "plan.json"
    edited.write_text(json.dumps(doc))
    assert plan_main(["run", str(edited), "--device", "cpu"]) == 2
    line = one_error_line(capsys)
    assert "changed since plan" in line and "plan again" in line


def test_resume_without_checkpoint_is_refused(mlp_plan, tmp_path):
    with pytest.raises(UserInputError, match="no complete checkpoint"):
        run_plan(mlp_plan, opts(resume=True, run_dir=str(tmp_path)))


@pytest.mark.distributed
@pytest.mark.long  # two torchrun "nodes": with the long matrix in CI
def test_two_nodes_on_localhost_match_one_process(mlp_plan, tmp_path):
    """Two torchrun launches (--nnodes 2, node ranks 0 and 1, c10d on 127.0.0.1)."""
    endpoint = f"127.0.0.1:{free_port()}"
    run_dir = tmp_path / "run"
    codes: dict[int, int] = {}

    def node(rank: int) -> None:
        codes[rank] = run_plan(
            mlp_plan,
            opts(nnodes=2, node_rank=rank, rdzv_endpoint=endpoint, run_dir=str(run_dir)),
        )

    threads = [threading.Thread(target=node, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=400)
    assert codes == {0: 0, 1: 0}
    got = losses_of(run_dir)
    want = reference_for_plan(json.loads(mlp_plan.read_text()), 5).losses
    assert len(got) == 5
    for g, w in zip(got, want):
        assert abs(g - w) <= RTOL * abs(w)


CHECKPOINT_CASES = [
    ("mlp", dict(tp=1, dp=2, pp=1, zero=3, micro_batch_size=2)),
    ("gpt", dict(tp=1, dp=1, pp=2, zero=0, schedule="1f1b", micro_batch_size=2)),
    ("llama", dict(tp=1, dp=2, pp=1, zero=1, micro_batch_size=2)),
    ("gpt", dict(tp=2, dp=1, pp=1, zero=0, micro_batch_size=4)),
]


@pytest.mark.distributed
@pytest.mark.long  # four launches (ZeRO 3, PP, ZeRO 1, TP): with the long matrix in CI
def test_resume_from_checkpoint_continues_the_same_run(tmp_path):
    """Steps 1-3 with a checkpoint at 3, then a new launch resumes and trains steps 4-5: the
    losses equal the uninterrupted one-process run's, step for step."""
    plans, dirs = [], []
    for i, (model, pins) in enumerate(CHECKPOINT_CASES):
        d = tmp_path / f"c{i}"
        plans.append(forced_plan(model, 2, d, recompute="none", **pins))
        dirs.append(d)
    rc, log = launch(plans, dirs, 2, "--checkpoint-every", "3")
    assert rc == 0, log
    # The first launch ran all 5 steps; keep only what an interruption after step 3 leaves.
    for d in dirs:
        assert (d / "checkpoints" / "step_000003").is_dir()
        assert not list((d / "checkpoints").glob("*.tmp"))
        lines = (d / "metrics.jsonl").read_text().splitlines()
        (d / "metrics.jsonl").write_text("\n".join(lines[:3]) + "\n")
    rc, log = launch(plans, dirs, 2, "--resume")
    assert rc == 0, log
    assert log.count("resuming from") == len(plans)
    assert "step 4/5" in log and "step 1/5" not in log  # only steps 4-5 were trained again
    for (model, _), p, d in zip(CHECKPOINT_CASES, plans, dirs):
        want = reference_for_plan(json.loads(p.read_text()), 5).losses
        got = losses_of(d)
        assert len(got) == 5, f"{model}: {got}"
        for step, (g, w) in enumerate(zip(got, want), start=1):
            assert abs(g - w) <= RTOL * abs(w), f"{model} {p} step {step}: {g} vs {w}"


@pytest.mark.distributed  # `plan run` starts torchrun: with the multi-process tests
def test_a_pipeline_torch_cannot_cut_ends_in_one_line(tmp_path, capfd):
    """OpenAI GPT's layers cannot be cut by torch's pipelining (torch.export's unflatten
    refuses the split module): the run ends with one line saying so and what to do, exit 2,
    not every rank's traceback and torchrun's report."""
    plan = forced_plan(
        "openai_gpt", 2, tmp_path / "pp", pp=2, dp=1, tp=1, zero=0, schedule="1f1b",
        micro_batch_size=2, recompute="none",
    )  # fmt: skip
    assert plan_main(["run", str(plan), "--device", "cpu", "--steps", "1"]) == 2
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
    last = err.strip().splitlines()[-1]
    assert "torch's pipelining cannot cut" in last and "--pp 1" in last, err[-3000:]


@pytest.mark.distributed  # `plan run` starts torchrun: with the multi-process tests
def test_an_error_in_the_workers_ends_in_one_line(tmp_path, capfd):
    """A model that fails only under torch.distributed: one line naming the rank, the error
    and --debug, exit 1, not every rank's traceback and torchrun's report."""
    plan = forced_plan(
        "fails_when_run", 2, tmp_path / "dp", pp=1, dp=2, tp=1, zero=0, micro_batch_size=4,
        recompute="none",
    )  # fmt: skip
    assert plan_main(["run", str(plan), "--device", "cpu", "--steps", "1"]) == 1
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
    last = err.strip().splitlines()[-1]
    assert "internal error: RuntimeError: the model's own failure" in last, err[-3000:]
    assert "--debug" in last
    # --debug: the workers' tracebacks
    assert plan_main(["run", str(plan), "--device", "cpu", "--steps", "1", "--debug"]) != 0
    out, err = capfd.readouterr()
    assert "Traceback" in err and "the model's own failure" in err
