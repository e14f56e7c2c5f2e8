"""The process torchrun starts: join the process group, then train each given plan in turn.

``plan run`` passes one plan. Tests pass many plans of the same world size, so one launch (one
process group, one torch import per rank) serves a whole batch; meshes are cached per shape and
each plan's modules are dropped before the next.

    python -m torch.distributed.run --nproc-per-node 4 -m runtime.worker \
        --plans a.json b.json --run-dirs out/a out/b --steps 5
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys
import threading
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from planner.errors import MeshplanError, brief
from planner.modelfile import load_model_file
from planner.schema import load_plan
from runtime.build import RuntimeCache, freeze_launch_state
from runtime.checkpoint import latest_checkpoint
from runtime.stop import ENV as STOP_ENV
from runtime.stop import RunStopped, exit_worker, read_stop, watch_stop, write_stop
from runtime.train import train_plan


def restarted(run_dir: Path) -> bool:
    """torchrun restarted the workers after a failure (``--max-restarts``) and a complete
    checkpoint exists: continue from it instead of starting over."""
    again = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    return again and latest_checkpoint(run_dir) is not None


# How long a rank that raised a MeshplanError waits for its peers at the closing barrier before
# it ends alone (gloo's barrier times out after 30 s on rank 0 only)
ALONE_AFTER_S = 35.0


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="runtime.worker")
    p.add_argument("--plans", nargs="+", required=True)
    p.add_argument("--run-dirs", nargs="+", required=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--hang-timeout", type=float, default=0.0, help="seconds per step; 0: off")
    args = p.parse_args(argv)
    if len(args.plans) != len(args.run_dirs):
        p.error("--plans and --run-dirs need the same number of entries")
    return args


def init_process_group(backend: str, **kwargs) -> None:
    """``dist.init_process_group`` on a store namespaced by torchrun's restart attempt.

    The agent's store outlives a restart, and with it every key the failed attempt's process
    groups wrote: a restarted rank could read a dead peer's address and fail to connect (gloo:
    "connectFullMesh failed ... Connection refused"; pytorch/pytorch#167288). A prefix per
    attempt gives each attempt clean keys."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None:  # not under torchrun: nothing outlives this process
        dist.init_process_group(backend, **kwargs)
        return
    store, rank, world_size = next(dist.rendezvous("env://"))
    store = dist.PrefixStore(f"meshplan/attempt_{attempt}", store)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, **kwargs)


def main(argv: list[str] | None = None) -> int:
    """What torchrun starts on every rank: read the plan and the model, build this rank's share,
    train, and end every rank with one line on an error. Long because the start, the run and
    every way a rank can end (its own error, a peer's, the stop file) share the process's
    state."""
    args = parse(sys.argv[1:] if argv is None else argv)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        init_process_group("gloo")
    rank = dist.get_rank()
    # build_stage warns once per eager module it cannot retarget; on one device that is noise.
    logging.getLogger("torch.distributed.pipelining._IR").setLevel(logging.ERROR)
    # torch's pipelining deep-copies pytree specs, and torch warns about its own deprecated
    # LeafSpec check each time (torch 2.13): a line per stage and copy that is not the user's
    warnings.filterwarnings(
        "ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning
    )
    cache = RuntimeCache()  # meshes and traces the plans of this launch share
    watch_stop(Path(args.run_dirs[0]))  # plan run: one plan, one run directory
    try:
        for plan_path, run_dir in zip(args.plans, args.run_dirs):
            plan = load_plan(plan_path)
            mf = load_model_file(plan.model.file, plan.model.args)
            if rank == 0:
                mesh = plan.mesh
                print(
                    f"running {plan_path}: pp {mesh.pp} x dp {mesh.dp_label}"
                    + (f" (ep {mesh.ep})" if mesh.ep > 1 else "")
                    + (f" x cp {mesh.cp}" if mesh.cp > 1 else "")
                    + f" x tp {mesh.tp_label}, "
                    f"{plan.schedule if mesh.pp > 1 else 'no pipeline'}, "
                    f"ZeRO {plan.zero_stage}, {args.steps} steps on {device.type}",
                    flush=True,
                )
            t0 = time.perf_counter()
            train_plan(
                plan,
                mf,
                device,
                steps=args.steps,
                seed=args.seed,
                run_dir=Path(run_dir),
                checkpoint_every=args.checkpoint_every,
                resume=args.resume or restarted(Path(run_dir)),
                hang_timeout_s=args.hang_timeout,
                cache=cache,
            )
            if rank == 0:
                print(f"done {plan_path} in {time.perf_counter() - t0:.1f} s", flush=True)
            del plan, mf  # so that only what the launch keeps is frozen
            freeze_launch_state()
    except MeshplanError as exc:
        # Every rank raises the same error at the same point (the loss is all-reduced, the plan
        # is the same): meet before tearing down, so no rank closes its connections while a
        # peer still uses them and dies of it (which torchrun would retry). A rank whose peers
        # do not all come (the error was its stage's alone, and the others wait in a pipeline
        # message) ends the run itself (``_err_alone``), as rank 0 may never get here; the
        # barrier's own timeout holds on rank 0 alone, hence the timer.
        alone = threading.Timer(ALONE_AFTER_S, _err_alone, (exc, Path(run_dir)))
        alone.daemon = True
        alone.start()
        try:  # NCCL has no monitored barrier: its plain one, bounded by the timer alone
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
            else:
                dist.barrier()
        except Exception:  # noqa: BLE001 - a peer that never comes is what the timeout is for
            _err_alone(exc, Path(run_dir))
        alone.cancel()
        dist.destroy_process_group()
        if os.environ.get(STOP_ENV) != "1":
            if rank == 0:
                print(f"error: {exc}", file=sys.stderr, flush=True)
            return exc.exit_code
        if rank == 0:
            write_stop(Path(run_dir), exc)
        # A deliberate stop must not be retried (torchrun restarts any failed worker), nor
        # reported by torchrun as a failure with a traceback of its own: the launcher ends
        # with the stop file's line and exit status.
        return 0
    except Exception as exc:  # noqa: BLE001 - a bug (meshplan's, or the model's under this plan)
        if os.environ.get("MESHPLAN_DEBUG") == "1":
            raise  # every failing rank's traceback, as torchrun prints it
        return report_bug(rank, exc, Path(args.run_dirs[0]))
    dist.barrier()  # leave together (see runtime.recsys.main)
    dist.destroy_process_group()
    return 0


def _err_alone(exc: MeshplanError, run_dir: Path) -> None:
    """End this rank with its error, though its peers did not meet it: under ``plan run`` through
    the stop file (the launcher says it; the peers' ``watch_stop`` ends them), otherwise said
    here, with a failed exit that has torchrun end the peers."""
    if os.environ.get(STOP_ENV) == "1":
        if read_stop(run_dir) is None:
            write_stop(run_dir, exc)
        exit_worker(0)
    print(f"error: {exc}", file=sys.stderr, flush=True)
    exit_worker(exc.exit_code)


def report_bug(rank: int, exc: Exception, run_dir: Path) -> int:
    """One line for an unexpected error, as the CLI gives one for its own (the rank, the
    exception and its first words, how to see the traceback), and the worker's exit status.

    Under ``plan run`` without restarts the first rank to fail leaves the line for the
    launcher to end with (the peers' "connection closed" that follows is not the cause) and,
    on gloo, every rank exits cleanly, so torchrun adds no report of its own; with restarts,
    under another launcher, or on NCCL, the worker fails (1) and torchrun restarts the group
    or ends it."""
    message = (
        f"rank {rank}: internal error: {type(exc).__name__}: {brief(exc)} (run again with "
        "--debug for the traceback, and please report it)"
    )
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    stopping = os.environ.get(STOP_ENV) == "1" and restarts == 0
    if stopping and read_stop(run_dir) is not None:
        return 0  # a peer stopped first: this is its consequence, and the launcher says that
    print(f"error: {message}", file=sys.stderr, flush=True)
    if not stopping:
        return 1
    write_stop(run_dir, RunStopped(message, 1))
    # gloo's peers see this process's sockets close and fail at once, down the same path;
    # NCCL's may wait in a collective until its timeout, so there torchrun ends them now
    return 0 if dist.get_backend() == "gloo" else 1


if __name__ == "__main__":
    exit_worker(main())
