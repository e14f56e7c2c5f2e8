"""``plan run``: check a plan against this machine and the model file, then start torchrun.

Everything that can be wrong before any process starts (a corrupt plan, a model file that
changed since planning, a world size the nodes cannot host) is refused here with a one-line
UserInputError; the workers (``runtime.worker``) only train.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from planner.device import choose_device
from planner.errors import UserInputError
from planner.modelfile import file_sha256
from planner.schema import Plan, load_plan
from runtime.capability import check_runnable
from runtime.checkpoint import latest_checkpoint
from runtime.stop import ENV as STOP_ENV
from runtime.stop import clear_stop, read_stop

REPO_ROOT = Path(__file__).resolve().parent.parent


def check_model_file(plan: Plan, plan_path: Path) -> None:
    model = Path(plan.model.file)
    if not model.is_file():
        raise UserInputError(
            f"plan {plan_path} was made for model file {model}, which does not exist: "
            "restore it or plan again"
        )
    digest = file_sha256(model)
    if digest != plan.model.sha256:
        raise UserInputError(
            f"model file {model} changed since plan {plan_path} was made (sha256 "
            f"{digest[:12]}…, plan has {plan.model.sha256[:12]}…): plan again"
        )


def processes_per_node(plan: Plan, opts: argparse.Namespace, device: str) -> int:
    mesh = plan.mesh
    world = mesh.size
    nnodes = int(getattr(opts, "nnodes", 1) or 1)
    if world % nnodes:
        raise UserInputError(
            f"the plan needs {world} processes (pp {mesh.pp} x dp {mesh.dp_label} x cp "
            f"{mesh.cp} x tp {mesh.tp_label}), which {nnodes} nodes cannot split "
            "evenly: use --nnodes dividing "
            f"{world}, or plan again for {nnodes} nodes"
        )
    nproc = world // nnodes
    if device == "cuda":
        import torch

        have = torch.cuda.device_count()
        if nproc > have:
            raise UserInputError(
                f"the plan needs {nproc} GPUs per node ({world} over {nnodes} nodes) but this "
                f"node has {have}: plan again with --gpus {have * nnodes}, or add nodes"
            )
    if nnodes > 1:
        if not getattr(opts, "rdzv_endpoint", None):
            raise UserInputError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT")
        if not 0 <= opts.node_rank < nnodes:
            raise UserInputError(f"--node-rank {opts.node_rank} is not below --nnodes {nnodes}")
    return nproc


def torchrun_command(
    nproc: int,
    worker_args: list[str],
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    rdzv_id: str = "meshplan",
    max_restarts: int = 0,
) -> list[str]:
    """``python -m torch.distributed.run ... -m runtime.worker ARGS``: standalone rendezvous (a
    free local port) on one node, c10d at ``rdzv_endpoint`` across nodes. With ``max_restarts``
    torchrun restarts every worker when one fails, and the workers resume from the last
    complete checkpoint (``runtime.worker``)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if max_restarts:
        cmd.append(f"--max-restarts={max_restarts}")
    if nnodes == 1:
        cmd.append("--standalone")
    else:
        cmd += [
            f"--nnodes={nnodes}",
            f"--node-rank={node_rank}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rdzv_endpoint}",
            f"--rdzv-id={rdzv_id}",
        ]
    return cmd + ["-m", "runtime.worker", *worker_args]


def worker_env() -> dict[str, str]:
    """The workers import ``runtime`` and ``planner`` from this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_plan(plan_path: Path, opts: argparse.Namespace) -> int:
    """Validate, then train the plan under torchrun; the workers' exit status is returned."""
    plan_path = Path(plan_path)
    plan = load_plan(plan_path)
    check_model_file(plan, plan_path)
    check_runnable(plan)
    device = choose_device(getattr(opts, "device", None))
    nproc = processes_per_node(plan, opts, device)
    run_dir = Path(getattr(opts, "run_dir", None) or plan_path.resolve().parent)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserInputError(f"cannot create run directory {run_dir}: {exc.strerror}") from exc
    if getattr(opts, "resume", False):
        if latest_checkpoint(run_dir) is None:
            raise UserInputError(
                f"--resume: no complete checkpoint under {run_dir / 'checkpoints'}; "
                "run with --checkpoint-every K first"
            )
    worker_args = [
        "--plans", str(plan_path.resolve()),
        "--run-dirs", str(run_dir.resolve()),
        "--steps", str(opts.steps),
        "--seed", str(opts.seed),
        "--checkpoint-every", str(getattr(opts, "checkpoint_every", 0) or 0),
        "--device", device,
    ]  # fmt: skip
    if getattr(opts, "resume", False):
        worker_args.append("--resume")
    if getattr(opts, "hang_timeout", None):
        worker_args += ["--hang-timeout", str(opts.hang_timeout)]
    cmd = torchrun_command(
        nproc,
        worker_args,
        nnodes=int(getattr(opts, "nnodes", 1) or 1),
        node_rank=int(getattr(opts, "node_rank", 0) or 0),
        rdzv_endpoint=getattr(opts, "rdzv_endpoint", None),
        rdzv_id=getattr(opts, "rdzv_id", None) or "meshplan",
        max_restarts=int(getattr(opts, "max_restarts", 0) or 0),
    )
    clear_stop(run_dir)
    env = worker_env()
    env[STOP_ENV] = "1"
    if getattr(opts, "debug", False):
        env["MESHPLAN_DEBUG"] = "1"  # the workers print their tracebacks too
    rc = subprocess.run(cmd, env=env, check=False).returncode
    stopped = read_stop(run_dir)
    if stopped is not None:  # the workers stopped on purpose (a diverged loss): no restart
        raise stopped
    if rc != 0:
        print(
            f"plan run: the workers failed (exit status {rc}); see their messages above",
            file=sys.stderr,
        )
    else:
        print(f"metrics: {run_dir / 'metrics.jsonl'}")
    return rc
