"""Tests written for mutmut's generated mutants of runtime/launch.py (``plan run``: a plan
checked against this machine and its model file, then torchrun started;
benchmarks/generated_mutants.py). One process: a shipped plan (Llama 3 8B on 64 GPUs, pointed
at a model file of the test's own), every refusal's message whole, the torchrun command and
the workers' environment word by word, and ``run_plan`` with ``subprocess.run`` recording the
command it would start (tests/test_runtime_launch.py starts real workers). docs/mutation.md
names the mutants each test kills."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

import runtime.launch as launch
from planner.errors import MeshplanError, UserInputError
from planner.modelfile import file_sha256
from planner.schema import load_plan
from runtime.launch import (
    REPO_ROOT,
    check_model_file,
    processes_per_node,
    run_plan,
    torchrun_command,
    worker_env,
)
from runtime.stop import ENV as STOP_ENV
from runtime.stop import write_stop

SHIPPED = REPO_ROOT / "examples" / "plans" / "llama3-8b-64xh100.json"


@pytest.fixture
def plan_file(tmp_path) -> Path:
    """The shipped plan (pp 1 x dp 8 x cp 1 x tp 8: 64 processes) for a model file here."""
    model = tmp_path / "model.py"
    model.write_text("# a model\n")
    data = json.loads(SHIPPED.read_text())
    data["model"].update(file=str(model), sha256=file_sha256(model))
    path = tmp_path / "plans" / "plan.json"
    path.parent.mkdir()
    path.write_text(json.dumps(data))
    return path


def _opts(**kw) -> argparse.Namespace:
    base = {"steps": 3, "seed": 7}
    return argparse.Namespace(**{**base, **kw})


def test_a_plans_model_file_must_exist_and_be_unchanged(plan_file):
    plan = load_plan(plan_file)
    check_model_file(plan, plan_file)
    model = Path(plan.model.file)
    model.write_text("# changed\n")
    digest = file_sha256(model)
    with pytest.raises(UserInputError) as err:
        check_model_file(plan, plan_file)
    assert str(err.value) == (
        f"model file {model} changed since plan {plan_file} was made (sha256 {digest[:12]}…, "
        f"plan has {plan.model.sha256[:12]}…): plan again"
    )
    model.unlink()
    with pytest.raises(UserInputError) as err:
        check_model_file(plan, plan_file)
    assert str(err.value) == (
        f"plan {plan_file} was made for model file {model}, which does not exist: restore it "
        "or plan again"
    )


def test_the_processes_are_split_evenly_over_the_nodes(plan_file):
    plan = load_plan(plan_file)
    assert processes_per_node(plan, _opts(), "cpu") == 64
    assert processes_per_node(plan, _opts(nnodes=None), "cpu") == 64
    assert processes_per_node(plan, _opts(nnodes=1), "cpu") == 64
    two = _opts(nnodes=8, rdzv_endpoint="h:1", node_rank=7)
    assert processes_per_node(plan, two, "cpu") == 8
    assert processes_per_node(plan, _opts(nnodes=64, rdzv_endpoint="h:1", node_rank=0), "cpu") == 1
    with pytest.raises(UserInputError) as err:
        processes_per_node(plan, _opts(nnodes=3), "cpu")
    assert str(err.value) == (
        "the plan needs 64 processes (pp 1 x dp 8 x cp 1 x tp 8), which 3 nodes cannot split "
        "evenly: use --nnodes dividing 64, or plan again for 3 nodes"
    )


def test_several_nodes_need_a_rendezvous_and_a_node_rank_below_their_count(plan_file):
    plan = load_plan(plan_file)
    with pytest.raises(UserInputError) as err:
        processes_per_node(plan, _opts(nnodes=2, node_rank=0), "cpu")
    assert str(err.value) == "--nnodes 2 needs --rdzv-endpoint HOST:PORT"
    with pytest.raises(UserInputError, match="^--nnodes 2 needs"):
        processes_per_node(plan, _opts(nnodes=2, rdzv_endpoint="", node_rank=0), "cpu")
    for rank in (2, -1):
        with pytest.raises(UserInputError) as err:
            processes_per_node(plan, _opts(nnodes=2, rdzv_endpoint="h:1", node_rank=rank), "cpu")
        assert str(err.value) == f"--node-rank {rank} is not below --nnodes 2"


def test_a_gpu_node_must_hold_its_share_of_the_processes(plan_file, monkeypatch):
    import torch

    plan = load_plan(plan_file)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert processes_per_node(plan, _opts(nnodes=8, rdzv_endpoint="h:1", node_rank=0), "cuda") == 8
    with pytest.raises(UserInputError) as err:
        processes_per_node(plan, _opts(nnodes=4, rdzv_endpoint="h:1", node_rank=0), "cuda")
    assert str(err.value) == (
        "the plan needs 16 GPUs per node (64 over 4 nodes) but this node has 8: plan again "
        "with --gpus 32, or add nodes"
    )
    # the CPU is not counted: 16 processes a node run there
    assert processes_per_node(plan, _opts(nnodes=4, rdzv_endpoint="h:1", node_rank=0), "cpu") == 16


def test_torchrun_runs_the_worker_standalone_on_one_node():
    head = [sys.executable, "-m", "torch.distributed.run"]
    tail = ["-m", "runtime.worker", "--a", "b"]
    assert torchrun_command(4, ["--a", "b"]) == [
        *head,
        "--nproc-per-node=4",
        "--standalone",
        *tail,
    ]
    assert torchrun_command(4, ["--a", "b"], max_restarts=2) == [
        *head,
        "--nproc-per-node=4",
        "--max-restarts=2",
        "--standalone",
        *tail,
    ]


def test_torchrun_meets_the_other_nodes_at_the_rendezvous():
    assert torchrun_command(8, [], nnodes=2, node_rank=1, rdzv_endpoint="h:29400") == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=8",
        "--nnodes=2",
        "--node-rank=1",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=h:29400",
        "--rdzv-id=meshplan",
        "-m",
        "runtime.worker",
    ]
    cmd = torchrun_command(8, [], nnodes=2, rdzv_endpoint="h:1", rdzv_id="job", max_restarts=1)
    assert cmd[3:10] == [
        "--nproc-per-node=8",
        "--max-restarts=1",
        "--nnodes=2",
        "--node-rank=0",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=h:1",
        "--rdzv-id=job",
    ]


def test_the_workers_import_this_checkout_first(monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = worker_env()
    assert env["PYTHONPATH"] == str(REPO_ROOT) and env["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    env = worker_env()
    assert env["PYTHONPATH"] == f"{REPO_ROOT}:/elsewhere" and env["OMP_NUM_THREADS"] == "3"
    assert env["HOME"] == __import__("os").environ["HOME"]


class _Torchrun:
    """``subprocess.run`` as ``run_plan`` calls it: the command and environment kept, the
    exit status given, and a stop file written first when asked (a worker that stopped)."""

    def __init__(self, rc: int = 0, stop: MeshplanError | None = None) -> None:
        self.rc, self.stop, self.calls = rc, stop, []

    def __call__(self, cmd, env=None, check=None):
        self.calls.append((cmd, env, check))
        if self.stop is not None:
            write_stop(Path(self.run_dir), self.stop)
        return subprocess.CompletedProcess(cmd, self.rc)


def _worker_args(plan: Path, run_dir: Path, extra: list[str] = ()) -> list[str]:
    return [
        "-m", "runtime.worker",
        "--plans", str(plan.resolve()),
        "--run-dirs", str(run_dir.resolve()),
        "--steps", "3",
        "--seed", "7",
        "--checkpoint-every", "0",
        "--device", "cpu",
        *extra,
    ]  # fmt: skip


def test_a_run_starts_torchrun_with_the_plans_workers(plan_file, monkeypatch, capsys):
    run = _Torchrun()
    monkeypatch.setattr(launch.subprocess, "run", run)
    monkeypatch.delenv("MESHPLAN_DEBUG", raising=False)
    assert run_plan(plan_file, _opts()) == 0
    ((cmd, env, check),) = run.calls
    run_dir = plan_file.parent
    assert cmd == [*torchrun_command(64, []), *_worker_args(plan_file, run_dir)[2:]]
    assert env[STOP_ENV] == "1" and "MESHPLAN_DEBUG" not in env and check is False
    assert env["PYTHONPATH"].split(":")[0] == str(REPO_ROOT)
    assert capsys.readouterr().out == f"metrics: {run_dir / 'metrics.jsonl'}\n"


def test_a_run_passes_every_option_on(plan_file, monkeypatch, tmp_path, capsys):
    run = _Torchrun()
    monkeypatch.setattr(launch.subprocess, "run", run)
    run_dir = tmp_path / "runs" / "a"
    (run_dir / "checkpoints" / "step_000002").mkdir(parents=True)
    write_stop(run_dir, UserInputError("a stop left by an earlier run"))  # cleared first
    opts = _opts(
        run_dir=str(run_dir), resume=True, hang_timeout=90, checkpoint_every=5, debug=True,
        nnodes=2, node_rank=1, rdzv_endpoint="h:1", rdzv_id="job", max_restarts=3, device="cpu",
    )  # fmt: skip
    assert run_plan(plan_file, opts) == 0
    ((cmd, env, _),) = run.calls
    args = _worker_args(plan_file, run_dir, ["--resume", "--hang-timeout", "90"])
    args[args.index("--checkpoint-every") + 1] = "5"
    assert cmd == [
        *torchrun_command(
            32, [], nnodes=2, node_rank=1, rdzv_endpoint="h:1", rdzv_id="job", max_restarts=3
        ),
        *args[2:],
    ]
    assert env["MESHPLAN_DEBUG"] == "1"


def test_a_resume_needs_a_complete_checkpoint(plan_file, monkeypatch, tmp_path):
    monkeypatch.setattr(launch.subprocess, "run", _Torchrun())
    run_dir = tmp_path / "r"
    (run_dir / "checkpoints" / "step_000004.tmp").mkdir(parents=True)
    with pytest.raises(UserInputError) as err:
        run_plan(plan_file, _opts(run_dir=run_dir, resume=True))
    assert str(err.value) == (
        f"--resume: no complete checkpoint under {run_dir / 'checkpoints'}; run with "
        "--checkpoint-every K first"
    )


def test_a_run_directory_that_cannot_be_made_is_refused(plan_file, tmp_path, monkeypatch):
    # a recording torchrun: a bug that let the run through must not start the plan's 64 workers
    torchrun = _Torchrun()
    monkeypatch.setattr(launch.subprocess, "run", torchrun)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UserInputError) as err:
        run_plan(plan_file, _opts(run_dir=blocker / "run"))
    assert str(err.value) == f"cannot create run directory {blocker / 'run'}: Not a directory"
    assert torchrun.calls == []


def test_failed_workers_are_said_and_their_status_returned(plan_file, monkeypatch, capsys):
    monkeypatch.setattr(launch.subprocess, "run", _Torchrun(rc=3))
    assert run_plan(plan_file, _opts()) == 3
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "plan run: the workers failed (exit status 3); see their messages above\n"


def test_workers_that_stopped_on_purpose_raise_their_error(plan_file, monkeypatch):
    run = _Torchrun(rc=1, stop=UserInputError("loss is nan at step 2"))
    run.run_dir = plan_file.parent
    monkeypatch.setattr(launch.subprocess, "run", run)
    with pytest.raises(MeshplanError) as err:
        run_plan(plan_file, _opts())
    assert str(err.value) == "loss is nan at step 2" and err.value.exit_code == 2


def test_a_run_directory_is_made_with_its_missing_parents(plan_file, monkeypatch, tmp_path):
    monkeypatch.setattr(launch.subprocess, "run", _Torchrun())
    run_dir = tmp_path / "runs" / "a" / "b"
    assert run_plan(plan_file, _opts(run_dir=run_dir)) == 0
    assert run_dir.is_dir()


def test_a_multi_node_run_without_a_rendezvous_id_meets_at_meshplans(plan_file, monkeypatch):
    run = _Torchrun()
    monkeypatch.setattr(launch.subprocess, "run", run)
    opts = _opts(nnodes=4, node_rank=3, rdzv_endpoint="h:1", rdzv_id=None, max_restarts=None)
    assert run_plan(plan_file, opts) == 0
    ((cmd, _, _),) = run.calls
    assert cmd[3:9] == [
        "--nproc-per-node=16",
        "--nnodes=4",
        "--node-rank=3",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=h:1",
        "--rdzv-id=meshplan",
    ]


@pytest.mark.parametrize("asked, used", [("cpu", "cpu"), (None, "cuda")])
def test_the_device_asked_for_is_used_and_a_visible_gpu_otherwise(
    plan_file, monkeypatch, asked, used
):
    """On a machine where CUDA is visible (64 GPUs, stood in), ``--device cpu`` still runs on
    the CPU; without ``--device`` the GPUs are used."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 64)
    run = _Torchrun()
    monkeypatch.setattr(launch.subprocess, "run", run)
    assert run_plan(plan_file, _opts(device=asked)) == 0
    ((cmd, _, _),) = run.calls
    assert cmd[cmd.index("--device") + 1] == used


def test_a_run_of_a_changed_model_file_names_the_plan(plan_file, monkeypatch):
    monkeypatch.setattr(launch.subprocess, "run", _Torchrun())
    model = Path(load_plan(plan_file).model.file)
    model.write_text("# changed\n")
    with pytest.raises(
        UserInputError, match=f"^model file {model} changed since plan {plan_file} "
    ):
        run_plan(plan_file, _opts())


def test_a_gpu_run_checks_the_nodes_gpus_before_starting(plan_file, monkeypatch):
    """CUDA visible (8 GPUs stood in), no ``--device``: the 64 processes need 64 GPUs."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    run = _Torchrun()
    monkeypatch.setattr(launch.subprocess, "run", run)
    with pytest.raises(UserInputError, match="^the plan needs 64 GPUs per node"):
        run_plan(plan_file, _opts())
    assert run.calls == []


@pytest.mark.parametrize(
    "kw, nproc, head",
    [
        ({"nnodes": None, "node_rank": None, "max_restarts": None}, 64, ["--standalone"]),
        (
            {"nnodes": 2, "node_rank": 0, "rdzv_endpoint": "h:1"},
            32,
            ["--nnodes=2", "--node-rank=0"],
        ),
    ],
)
def test_options_left_unset_mean_one_node_and_node_rank_zero(
    plan_file, monkeypatch, kw, nproc, head
):
    """``plan run``'s parser leaves unset options None (or 0): one node, rank 0, no restarts."""
    run = _Torchrun()
    monkeypatch.setattr(launch.subprocess, "run", run)
    assert run_plan(plan_file, _opts(checkpoint_every=None, **kw)) == 0
    ((cmd, _, _),) = run.calls
    assert cmd[3 : 4 + len(head)] == [f"--nproc-per-node={nproc}", *head]
    assert cmd[cmd.index("--checkpoint-every") + 1] == "0"
