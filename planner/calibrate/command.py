"""``plan calibrate``: measure this machine into a profile the planner loads like a shipped one.

    plan calibrate [--device cpu|cuda] [--nproc N] [--out FILE] [--quick] [--force] [--quiet]

N ranks run at once with the real backend (gloo on CPU, NCCL on GPUs) and measure matmul rates
per dtype, memory bandwidth, element-wise throughput, collectives (fitted as latency + bytes /
bandwidth, as the cost model prices them), point-to-point transfers and, on a GPU, the host
link. planner/calibrate_profile.py explains how each number becomes a profile field. On a CPU
the ranks share the cores, so the profile is for ``--gpus N`` on this machine; the default N is
the number of cores (at least 2, at most 8).
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from planner.errors import UserInputError
from planner.flags import CommandParser

DEFAULT_MAX_CPU_RANKS = 8


def parse_args(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser(
        prog="plan calibrate", description="Measure this machine into a profile TOML."
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--nproc", type=int, help="ranks to measure with (default: cores or GPUs)")
    p.add_argument("--out", help="profile to write (default: profiles/measured/<name>.toml)")
    p.add_argument("--quick", action="store_true", help="short timings and small sizes (tests)")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--json", action="store_true", help="the written profile as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="print only errors")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def default_nproc(device: str, cores: int) -> int:
    if device == "cuda":
        import torch

        return max(1, torch.cuda.device_count())
    return max(2, min(cores, DEFAULT_MAX_CPU_RANKS))


def default_name(device: str, nproc: int) -> str:
    """``<hostname>-cpu-x<N>`` on a CPU (the host is what was measured), ``<gpu>-x<N>`` on
    GPUs (the device kind is), lower-case with dashes so it loads as ``measured/<name>``."""
    if device == "cuda":
        import torch

        base = torch.cuda.get_device_name(0)
    else:
        base = f"{socket.gethostname().split('.')[0]}-cpu"
    slug = re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-") or device
    return f"{slug}-x{nproc}"


def check_request(device: str, nproc: int) -> None:
    """Refuse what cannot be measured, before spending any time."""
    if nproc < 1:
        raise UserInputError(f"--nproc must be a positive integer, got {nproc}")
    if device == "cpu" and nproc < 2:
        raise UserInputError(
            "--nproc must be at least 2 on a CPU: collectives need two gloo ranks to time"
        )
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UserInputError("--device cuda: torch sees no GPU here; use --device cpu")
        if nproc > torch.cuda.device_count():
            raise UserInputError(
                f"--nproc {nproc} exceeds the {torch.cuda.device_count()} GPUs torch sees"
            )


def measure_single(device: str, s) -> dict[str, Any]:
    """One process alone with every core: the figure the per-rank ones are compared with (CPU),
    and the host memory bandwidth behind the GPUs' offload (CUDA)."""
    import torch

    from planner.calibrate.bench import matmul_rates, stream_rates

    cpu = torch.device("cpu")
    out: dict[str, Any] = {"threads": torch.get_num_threads()}
    if device == "cpu":
        out["matmul"] = {
            d: matmul_rates(cpu, d, s.matmul_shapes, s.seconds) for d in ("fp32", "bf16")
        }
    out["stream"] = stream_rates(cpu, s.stream_bytes, s.seconds)
    return out


def main(argv: list[str]) -> int:
    """Run the calibration; write the profile; print its key numbers unless --quiet."""
    args = parse_args(list(argv))
    started = time.perf_counter()
    from planner.calibrate.profile import usable_cores

    cores = usable_cores()
    nproc = args.nproc if args.nproc is not None else default_nproc(args.device, cores)
    check_request(args.device, nproc)
    if args.out:
        out = Path(args.out)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", out.stem) or "measured"
    else:
        from planner.hardware.profiles import profiles_dir

        name = default_name(args.device, nproc)
        out = profiles_dir() / "measured" / f"{name}.toml"
    if out.is_dir() or out.suffix != ".toml":
        raise UserInputError(f"--out {out}: give the path of a .toml file (profiles load by it)")
    if out.exists() and not args.force:
        raise UserInputError(f"{out} exists: pass --force to overwrite it, or choose --out")

    from planner.calibrate.display import Display
    from planner.progress import bars_enabled

    quiet = args.quiet or args.json
    with Display(not bars_enabled(quiet), args.device, args.quick) as display:
        result = calibrate(args.device, nproc, args.quick, name, display.update, argv)
    from planner.hardware.profiles import write_profile

    write_profile(result.profile, out, result.comments, result.header)
    if args.json:
        from planner.hardware.profiles import profile_to_dict

        print(json.dumps({"path": str(out), "profile": profile_to_dict(result.profile)}, indent=2))
    elif not args.quiet:
        from planner.calibrate.display import print_summary

        print_summary(result, out, time.perf_counter() - started)
    return 0


def calibrate(device: str, nproc: int, quick: bool, name: str, progress=None, argv=()) -> Any:
    """Measure and build the profile (nothing is written): planner.calibrate.profile.Result."""
    import torch

    from planner.calibrate.bench import settings
    from planner.calibrate.profile import (
        Machine,
        build_profile,
        host_memory_bytes,
        load_average_now,
        read_cpuinfo,
        usable_cores,
    )
    from planner.calibrate.workers import run_workers

    cores = usable_cores()
    model, mhz, flags, vendor = read_cpuinfo()
    machine = Machine(
        device=device,
        nproc=nproc,
        threads=max(1, cores // nproc),
        cores=cores,
        hostname=socket.gethostname(),
        cpu_model=model,
        cpu_mhz=mhz,
        cpu_flags=flags,
        cpu_vendor=vendor,
        host_memory_bytes=host_memory_bytes(),
        load_average=load_average_now(),
        torch_version=torch.__version__,
        started=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        command=" ".join(["plan calibrate", *argv]).strip(),
        quick=quick,
    )
    s = settings(device, quick)
    if progress:
        progress("single", 0, 1)
    single = measure_single(device, s)
    if progress:
        progress("single", 1, 1)
    if progress:
        progress("start", 0, 1)
    results = run_workers(device, nproc, machine.threads, quick, progress)
    result = build_profile(machine, s, results, single, name)
    result.profile = rounded(result.profile)
    return result


# Capacities are hard limits: rounded up, a plan would count on memory that is not there (an
# H100's 85,017,493,504 bytes became 85.02e9).
EXACT_FIELDS = ("memory_bytes", "host_memory_bytes")


def rounded(profile):
    """Four significant digits: run-to-run noise is larger, and the file stays readable; the
    capacities (``EXACT_FIELDS``) stay as measured."""
    from dataclasses import fields, replace

    def r(x: float) -> float:
        return float(f"{x:.4g}")

    changes: dict[str, Any] = {"peak_flops": {k: r(v) for k, v in profile.peak_flops.items()}}
    for f in fields(profile):
        value = getattr(profile, f.name)
        if isinstance(value, float) and f.name not in EXACT_FIELDS:
            changes[f.name] = r(value)
    return replace(profile, **changes)
