"""Run the calibration kernels in N concurrent processes with the real backend.

``run_workers`` spawns N ranks (torch.multiprocessing, spawn start method), joins them into one
process group (gloo on CPU, NCCL on CUDA, rendezvous through a file in a temporary folder so no
port can clash), and has every rank measure at the same time: matmul and streaming rates while
the other ranks also compute (on a CPU they share the cores), then the collectives and a
point-to-point ping-pong. Each rank sends its raw numbers back over a queue; rank 0 also sends
progress. The parent only collects: fitting and turning numbers into a profile happen elsewhere.
"""

from __future__ import annotations

import os
import queue as queue_mod
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh

from planner.calibrate.bench import (
    PHASES_MS,
    all_gather_fn,
    attention_rate,
    comm_overlap,
    compute_phase,
    elementwise_rates,
    host_link_rates,
    matmul_rates,
    op_overheads,
    reduce_scatter_fn,
    resident_bytes,
    settings,
    stream_rates,
    synchronizer,
)
from planner.vocab import DTYPES, PEAK_DTYPES

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
IN_SITU_BYTES = 1 << 20  # the largest message timed between compute phases
Progress = Callable[[str, int, int], None]


def matmul_dtypes(device: str) -> tuple[str, ...]:
    """CPU has no TF32 (its fp32 rate stands in); CUDA measures all four."""
    return PEAK_DTYPES if device == "cuda" else DTYPES


def phase_totals(device: str, quick: bool) -> dict[str, int]:
    """Steps per phase, for the progress display."""
    s = settings(device, quick)
    return {
        "start": 1,
        "matmul": len(matmul_dtypes(device)) * len(s.matmul_shapes),
        "memory": 2 if device == "cuda" else 1,
        "collectives": len(COLLECTIVES) * (len(s.collective_sizes) + len(in_situ_sizes(s))),
        "p2p": len(s.collective_sizes),
    }


def in_situ_sizes(s) -> tuple[int, ...]:
    return tuple(n for n in s.collective_sizes if n <= IN_SITU_BYTES)


def run_workers(
    device: str, nproc: int, threads: int, quick: bool, progress: Progress | None = None
) -> list[dict[str, Any]]:
    """Every rank's raw measurements, ordered by rank. Raises the first rank's exception."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="meshplan-calibrate-") as tmp:
        init = f"file://{os.path.join(tmp, 'rendezvous')}"
        procs = mp.start_processes(
            _worker,
            args=(nproc, device, threads, quick, init, q),
            nprocs=nproc,
            join=False,
            start_method="spawn",
        )
        results: dict[int, dict[str, Any]] = {}
        done = False
        while not done:
            try:
                done = procs.join(timeout=0.1)
            except mp.ProcessExitedException:
                _drain(q, results, progress)
                if len(results) < nproc:
                    raise
                done = True  # every rank reported; one then died on its way out
            _drain(q, results, progress)
        _drain(q, results, progress)
    missing = sorted(set(range(nproc)) - set(results))
    if missing:
        raise RuntimeError(f"calibration ranks {missing} exited without reporting results")
    return [results[r] for r in range(nproc)]


def _drain(q, results: dict[int, dict[str, Any]], progress: Progress | None) -> None:
    while True:
        try:
            msg = q.get_nowait()
        except queue_mod.Empty:
            return
        if msg[0] == "progress" and progress is not None:
            progress(msg[1], msg[2], msg[3])
        elif msg[0] == "result":
            results[msg[1]] = msg[2]


def _worker(rank: int, nproc: int, device: str, threads: int, quick: bool, init: str, q) -> None:
    """One rank: join the group, measure everything the others measure at the same time."""
    torch.set_num_threads(threads)
    s = settings(device, quick)
    totals = phase_totals(device, quick)
    if device == "cuda":
        dev = torch.device("cuda", rank)
        torch.cuda.set_device(dev)
        dist.init_process_group(
            "nccl",
            init_method=init,
            rank=rank,
            world_size=nproc,
            device_id=dev,
            timeout=timedelta(minutes=5),
        )
    else:
        dev = torch.device("cpu")
        dist.init_process_group(
            "gloo", init_method=init, rank=rank, world_size=nproc, timeout=timedelta(minutes=5)
        )

    def report(phase: str, done: int) -> None:
        if rank == 0:
            q.put(("progress", phase, done, totals[phase]))

    out: dict[str, Any] = {"rank": rank, "threads": torch.get_num_threads()}
    dist.barrier()
    report("start", 1)
    out.update(_memory_footprint(dev))

    out["matmul"] = {}
    step = 0
    for dtype in matmul_dtypes(device):
        rates = []
        for shape in s.matmul_shapes:
            dist.barrier()
            rates += matmul_rates(dev, dtype, [shape], s.seconds)
            step += 1
            report("matmul", step)
        out["matmul"][dtype] = rates
    # Short inner dimensions, in the reference dtype: how far below peak a GEMM over K runs.
    dist.barrier()
    ref = "bf16" if device == "cuda" else "fp32"
    inner = [(s.inner_mn, s.inner_mn, k) for k in s.inner_dims]
    out["matmul_inner"] = matmul_rates(dev, ref, inner, s.seconds)
    if s.attention_shapes:
        dist.barrier()
        out["attention"] = [attention_rate(dev, shape, s.seconds) for shape in s.attention_shapes]

    dist.barrier()
    out["stream"] = stream_rates(dev, s.stream_bytes, s.seconds)
    dist.barrier()
    out["elementwise"] = elementwise_rates(dev, s.elementwise_bytes, s.seconds)
    dist.barrier()
    # Every rank, and each rank alone: see op_overheads.
    meshes = init_device_mesh(dev.type, (nproc, 1), mesh_dim_names=("ranks", "alone"))
    out["op_overhead"] = op_overheads(dev, s.seconds, meshes["ranks"], meshes["alone"])
    report("memory", 1)
    if device == "cuda":
        dist.barrier()
        out["host_link"] = host_link_rates(dev, s.host_bytes, s.seconds)
        report("memory", 2)

    out["collectives"], out["p2p"] = [], []
    if nproc > 1:  # one GPU alone has nothing to time; its profile keeps datasheet links
        out["collectives"] = _collectives(dev, nproc, s, lambda i: report("collectives", i))
        done = len(COLLECTIVES) * len(s.collective_sizes)
        out["collectives_in_situ"] = _collectives_in_situ(
            dev, nproc, s, lambda i: report("collectives", done + i)
        )
        out["p2p"] = _ping_pong(dev, rank, nproc, s, lambda i: report("p2p", i))
        out["comm_overlap"] = comm_overlap(dev)
    dist.barrier()
    # Report before tearing down, and flush: a rank that crashes on its way out (torch's
    # DTensor and FSDP probes can leave a C++ thread that aborts at exit) loses nothing.
    q.put(("result", rank, out))
    q.close()
    q.join_thread()
    dist.destroy_process_group()


def _memory_footprint(dev: torch.device) -> dict[str, float]:
    """What a rank costs before the model: the process's resident set on CPU (Python, torch and
    the process group), the CUDA context and NCCL buffers on a GPU."""
    if dev.type == "cuda":
        torch.ones(1, device=dev).sum().item()
        free, total = torch.cuda.mem_get_info(dev)
        return {
            "device_name": torch.cuda.get_device_name(dev),
            "device_total_bytes": float(total),
            "context_bytes": float(total - free),
        }
    torch.ones(1).sum().item()
    return {"rss_bytes": resident_bytes()}


def _collective_call(kind: str, dev: torch.device, nproc: int, nbytes: int):
    """A closure running one ``kind`` collective whose full buffer is ``nbytes`` (rounded down
    to a multiple of 4·n), and the byte count actually moved."""
    per_rank = max(1, nbytes // 4 // nproc)
    full = torch.ones(per_rank * nproc, device=dev)
    part = torch.ones(per_rank, device=dev)
    if kind == "all_reduce":
        return (lambda: dist.all_reduce(full)), full.numel() * 4
    if kind == "all_gather":
        gather = all_gather_fn()
        return (lambda: gather(full, part)), full.numel() * 4
    scatter = reduce_scatter_fn()
    return (lambda: scatter(part, full)), full.numel() * 4


def _collectives(dev: torch.device, nproc: int, s, tick: Callable[[int], None]) -> list:
    """(kind, n, bytes, trial, seconds per call) for every kind, size and trial, this rank's
    view. Every rank runs the same deterministic repetition count, so none waits on another's
    choice."""
    sync = synchronizer(dev)
    rows = []
    step = 0
    for kind in COLLECTIVES:
        for size in s.collective_sizes:
            call, moved = _collective_call(kind, dev, nproc, size)
            reps = max(2, min(50, s.collective_budget_bytes // max(moved, 1)))
            call()
            sync()
            for trial in range(s.trials):
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(reps):
                    call()
                sync()
                rows.append((kind, nproc, moved, trial, (time.perf_counter() - t0) / reps))
            step += 1
            tick(step)
    return rows


def _collectives_in_situ(dev: torch.device, nproc: int, s, tick: Callable[[int], None]) -> list:
    """(kind, n, bytes, trial, seconds per call) for every kind, size up to ``IN_SITU_BYTES``
    and trial, this rank's view, timed in situ: between compute phases, as a training step
    issues them.

    A collective issued back to back with the previous one costs less than one issued after a
    compute phase: the ranks arrive apart (their phases jitter), the waiting rank's thread and
    core have gone to sleep and must be woken, caches hold the compute's data. On this 2-core VM
    a 4 KiB gloo all-reduce took 0.4 ms back to back and 0.5-1.2 ms after 1-10 ms of matmuls;
    a 512 KiB one 0.9 ms and 1.1-3.1 ms. The step pays the in-situ figure, so each trial runs
    ``PHASES_MS`` compute phases twice, once followed by the collective and once not, and
    charges the collective the difference of the two walls over the slowest rank's plain
    compute wall (a slower core is the compute rate's business, not the collective's). Larger
    messages are left to the back-to-back timings: their bandwidth dwarfs the difference."""
    sync = synchronizer(dev)
    phase = compute_phase(dev)
    rows = []
    step = 0
    for kind in COLLECTIVES:
        for size in in_situ_sizes(s):
            call, moved = _collective_call(kind, dev, nproc, size)
            call()
            sync()
            for trial in range(s.trials):
                plain = _phases_wall(phase, sync, None)
                slowest_plain = torch.tensor([plain], dtype=torch.float64, device=dev)
                dist.all_reduce(slowest_plain, op=dist.ReduceOp.MAX)
                with_call = _phases_wall(phase, sync, call)
                calls = 2 * len(PHASES_MS)
                seconds = max((with_call - float(slowest_plain.item())) / calls, 1e-7)
                rows.append((kind, nproc, moved, trial, seconds))
            step += 1
            tick(step)
    return rows


def _phases_wall(phase: Callable[[float], None], sync: Callable[[], None], call) -> float:
    """Wall seconds of every phase of ``PHASES_MS`` twice, each followed by ``call`` if given."""
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(2):
        for ms in PHASES_MS:
            phase(ms)
            if call is not None:
                call()
    sync()
    return time.perf_counter() - t0


def _ping_pong(dev: torch.device, rank: int, nproc: int, s, tick: Callable[[int], None]) -> list:
    """("p2p", 2, bytes, trial, one-way seconds) between ranks 0 and 1: half a round trip of a
    send answered by a send back, as a pipeline stage boundary moves activations."""
    sync = synchronizer(dev)
    rows = []
    for i, size in enumerate(s.collective_sizes):
        buf = torch.ones(max(1, size // 4), device=dev)
        moved = buf.numel() * 4
        reps = max(2, min(50, s.collective_budget_bytes // max(moved, 1)))
        for trial in range(s.trials + 1):  # the first round warms the connection up
            dist.barrier()
            if rank > 1:
                continue
            peer = 1 - rank
            t0 = time.perf_counter()
            for _ in range(reps):
                if rank == 0:
                    dist.send(buf, peer)
                    dist.recv(buf, peer)
                else:
                    dist.recv(buf, peer)
                    dist.send(buf, peer)
            sync()
            if trial > 0:
                rows.append(("p2p", 2, moved, trial - 1, (time.perf_counter() - t0) / (2 * reps)))
        tick(i + 1)
    return rows
