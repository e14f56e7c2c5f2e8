"""A torchrun command's ranks forked from one pre-imported process instead of started afresh.

torchrun starts an agent and then one fresh interpreter per rank, and each imports torch and
the runtime: about 6 CPU-s a process on the 2-core CI machine, more than most of these tests'
training. Here the ranks of a launch are forked from a multiprocessing forkserver that this
test session starts once and that imports the runtime once (``PRELOAD``). Each rank gets the
command's environment plus what torchrun's agent gives a rank (RANK, LOCAL_RANK, WORLD_SIZE,
the agent's store at MASTER_ADDR:MASTER_PORT, TORCHELASTIC_RESTART_COUNT 0, OMP_NUM_THREADS 1),
runs the command's module or script as ``__main__`` with its arguments, and the launch ends as
torchrun's does: when a rank fails the others are ended, and the exit status is 1 when any
rank failed. The answer is what ``subprocess.run`` of the torchrun command gives: returncode,
stdout and stderr (each the ranks' in rank order).

The real entry point stays tested end to end: ``plan run`` (tests/test_runtime_fault.py,
tests/test_runtime_launch.py) and tests/test_worker_alone.py start ``torchrun -m
runtime.worker`` themselves.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

# What every rank imports before its first line (runtime.worker: torch, its distributed
# packages, the runtime; the HF model classes the example models build). An import that fails
# here is only done later, in the rank (multiprocessing ignores a preload's ImportError).
PRELOAD = [
    "runtime.worker",
    "runtime.recsys",
    "transformers.models.llama.modeling_llama",
    "transformers.models.gpt2.modeling_gpt2",
    "transformers.models.opt.modeling_opt",
    "frozen_imports",  # last: freezes what the imports above left alive
]

# How long torchrun's agent lets the other ranks end after one failed, before SIGKILL
TERMINATE_GRACE_S = 30.0

_context: multiprocessing.context.BaseContext | None = None


def _forkserver() -> multiprocessing.context.BaseContext:
    """The session's forkserver context, started with one thread per process as torchrun
    gives its ranks (OpenMP reads OMP_NUM_THREADS when torch loads, in the server), and with
    this process's import path. The server is a fresh ``python -c`` whose path would be its
    working directory, PYTHONPATH and the editable install's finder (Python 3.11's forkserver
    ignores the parent's ``sys.path`` it is handed), so a test whose tree is on ``sys.path``
    only by conftest's insert (a mutated copy run from elsewhere) had ranks import
    ``runtime`` from the install: the server gets this path, first, and no working
    directory."""
    global _context
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        server_env = {
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(os.path.abspath(p) for p in sys.path),
            "PYTHONSAFEPATH": "1",
        }
        saved = {k: os.environ.get(k) for k in server_env}
        os.environ.update(server_env)
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            for k, v in saved.items():
                if v is None:
                    del os.environ[k]
                else:
                    os.environ[k] = v
        _context = ctx
    return _context


def stop_forkserver() -> None:
    """End the forkserver and wait for it, so that its ranks' CPU time is counted with this
    process's children (``/usr/bin/time``, the suite's figures)."""
    global _context
    if _context is not None:
        multiprocessing.forkserver._forkserver._stop()
        _context = None


def parse_torchrun(cmd: list[str]) -> tuple[int, list[str], list[str]]:
    """(ranks, ``["-m", module]`` or ``[script]``, arguments) of ``python -m
    torch.distributed.run [--standalone] --nproc-per-node N (-m module | script) args``; any
    other torchrun option is refused, as these ranks would not honour it."""
    head = [sys.executable, "-m", "torch.distributed.run"]
    if cmd[:3] != head:
        raise ValueError(f"not a torchrun command: {cmd[:3]}")
    rest, nproc = list(cmd[3:]), None
    while rest and rest[0].startswith("--"):
        opt = rest.pop(0)
        if opt == "--standalone":
            continue
        if opt.startswith("--nproc-per-node="):
            nproc = int(opt.split("=", 1)[1])
        elif opt == "--nproc-per-node":
            nproc = int(rest.pop(0))
        else:
            raise ValueError(f"torchrun option {opt} is not supported by forked ranks")
    if nproc is None:
        raise ValueError("the torchrun command names no --nproc-per-node")
    target = rest[:2] if rest[0] == "-m" else rest[:1]
    return nproc, target, rest[len(target) :]


def run(
    cmd: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float,
    capture_output: bool = True,
    text: bool = True,
) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True,
    timeout=timeout)`` of a torchrun command, its ranks forked (see the module's docstring), or
    of ``python -c CODE args``, one process forked; subprocess.TimeoutExpired when they
    outlast ``timeout``."""
    assert capture_output and text, "forked ranks always capture their output as text"
    ranked = cmd[1:2] != ["-c"]
    nproc, target, args = parse_torchrun(cmd) if ranked else (1, cmd[1:3], cmd[3:])
    ctx = _forkserver()
    # the agent's store, as torchrun keeps it in the agent (the ranks connect as clients)
    store = dist.TCPStore("127.0.0.1", 0, nproc, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=timeout)) if ranked else None  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="forked-ranks-") as logs:
        outs = [Path(logs) / f"{rank}.{kind}" for rank in range(nproc) for kind in ("out", "err")]
        procs = []
        for rank in range(nproc):
            rank_env = dict(os.environ if env is None else env)
            if ranked:
                rank_env.update(rank_variables(rank, nproc, store.port))
            if nproc > 1:  # torchrun's default
                rank_env.setdefault("OMP_NUM_THREADS", "1")
            where = str(cwd or os.getcwd())
            procs.append(ctx.Process(
                target=_rank_main,
                args=(target, args, rank_env, where, str(outs[2 * rank]), str(outs[2 * rank + 1]),
                      _package_files()),
                name=f"rank{rank}",
            ))  # fmt: skip
        for p in procs:
            p.start()
        status, failed = _wait(procs, timeout)
        out, err = (_joined(outs[kind::2]) for kind in (0, 1))
    del store
    if status is None:
        raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err)
    if failed:
        err += f"forked ranks: {failed}\n"
    return subprocess.CompletedProcess(cmd, status, out, err)


def _joined(paths: list[Path]) -> str:
    return "".join(p.read_text(errors="replace") for p in paths if p.exists())


def rank_variables(rank: int, world: int, port: int) -> dict[str, str]:
    """What torchrun's agent sets for a rank of a one-node launch (torch 2.13)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "GROUP_WORLD_SIZE": "1",
        "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": "forked",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }


def _wait(procs: list, timeout: float) -> tuple[int | None, str]:
    """Wait as torchrun's agent does: all ranks ending well is status 0; the first rank to fail
    has the others sent SIGTERM (SIGKILL after ``TERMINATE_GRACE_S``) and the status is 1.
    (None, ...) when ``timeout`` passes first (every rank killed)."""
    deadline = time.monotonic() + timeout
    running = list(procs)
    while running:
        left = deadline - time.monotonic()
        if left <= 0:
            _end(procs, grace_s=0)
            return None, "timed out"
        multiprocessing.connection.wait([p.sentinel for p in running], timeout=left)
        running = [p for p in running if p.exitcode is None]
        bad = [p for p in procs if p.exitcode not in (None, 0)]
        if bad:
            failed = ", ".join(f"{p.name} exit {p.exitcode}" for p in bad)
            _end(procs, grace_s=TERMINATE_GRACE_S)
            return 1, failed
    return 0, ""


def _end(procs: list, grace_s: float) -> None:
    for p in procs:
        if p.exitcode is None:
            p.terminate()  # SIGTERM
    for p in procs:
        p.join(grace_s)
        if p.exitcode is None:
            p.kill()
            p.join()


def _package_files() -> dict[str, str]:
    """Where this process imports the project's packages from (their ``__init__.py``)."""
    specs = {name: importlib.util.find_spec(name) for name in ("runtime", "planner")}
    return {name: spec.origin for name, spec in specs.items() if spec is not None}


def _rank_main(
    target: list[str], args: list[str], env: dict, cwd: str, out: str, err: str, files: dict
) -> None:
    """One rank, in a process forked from the server: the command's environment and working
    directory, stdout and stderr to files, then the code, module or script as ``__main__``.
    It stops first if the server imported a project package from elsewhere than the test
    process (``files``): a test of a mutated or edited tree would pass on another tree."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    for name, file in files.items():
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin != file:
            sys.exit(f"forked ranks: {name} is {spec and spec.origin} here, {file} in the test")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count()))
    if target[0] == "-c":
        sys.argv = ["-c", *args]
        exec(compile(target[1], "<string>", "exec"), {"__name__": "__main__"})
    elif target[0] == "-m":
        sys.argv = [target[1], *args]
        runpy.run_module(target[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target[0], *args]
        sys.path.insert(0, str(Path(target[0]).resolve().parent))
        runpy.run_path(target[0], run_name="__main__")
    sys.stdout.flush()
    sys.stderr.flush()
