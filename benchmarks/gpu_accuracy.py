"""Accuracy of the cost model on a real GPU: predicted vs measured step time and peak memory.

    python benchmarks/gpu_accuracy.py prepare                 # here: plan the suite (CPU, cvxpy)
    python benchmarks/gpu_accuracy.py measure --out DIR       # on the GPU machine: train them
    python benchmarks/gpu_accuracy.py report --measured DIR   # here: compare, write the report

The three phases are apart because the GPU machine this project is lent now and then has torch
and CUDA but not the solver; the plans travel to it as JSON (planned here against the shipped
profile, ``profiles/h200.toml`` unless ``--profile``) and only the runtime runs there.

``measure`` trains every plan in one torchrun launch on one GPU (NCCL, world size 1), STEPS steps
each, and records each step's time (synchronized with the device) and the peak of CUDA's
caching allocator (allocated and reserved); it also times the suite's own GEMM and attention
shapes alone (``torch.cuda.Event``, median of repeats), which says which cost term a miss
comes from. ``report`` holds the medians of the warm steps against ``plan["predicted"]``: the
step time, and the peak memory less the profile's ``reserved_bytes`` (the CUDA context, which
the allocator does not count), and writes ``reports/accuracy/<profile>.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PREPARED = ROOT / ".device" / "gpu-accuracy"
GPT = "examples/gpt.py"
LLAMA = "examples/llama.py"
# Llama 3.2 1B and 3B shapes (hidden, layers, heads, kv heads, ffn; vocabulary 128256), untied.
LLAMA_1B = {"size": "llama3-8b", "layers": 16, "hidden": 2048, "heads": 32, "kv_heads": 8,
            "ffn": 8192, "seq_len": 2048}  # fmt: skip
LLAMA_3B = {"size": "llama3-8b", "layers": 28, "hidden": 3072, "heads": 24, "kv_heads": 8,
            "ffn": 8192, "seq_len": 2048}  # fmt: skip

# name, model file, model args, global batch, pins (one GPU: tp = pp = dp = 1)
SUITE: list[tuple[str, str, dict, int, dict]] = [
    ("llama-1b mb8 none", LLAMA, LLAMA_1B, 8, dict(micro_batch_size=8, recompute="none")),
    ("llama-1b mb8 selective", LLAMA, LLAMA_1B, 8, dict(micro_batch_size=8, recompute="selective")),
    ("llama-1b mb8 full", LLAMA, LLAMA_1B, 8, dict(micro_batch_size=8, recompute="full")),
    ("llama-1b mb2 x4 none", LLAMA, LLAMA_1B, 8, dict(micro_batch_size=2, recompute="none")),
    ("llama-3b mb4 none", LLAMA, LLAMA_3B, 4, dict(micro_batch_size=4, recompute="none")),
    ("gpt-1.3b mb8 none", GPT, {"size": "1.3b"}, 8, dict(micro_batch_size=8, recompute="none")),
    ("gpt-1.3b mb8 full", GPT, {"size": "1.3b"}, 8, dict(micro_batch_size=8, recompute="full")),
    ("gpt-350m mb16 none", GPT, {"size": "350m"}, 16, dict(micro_batch_size=16, recompute="none")),
    ("llama-3b mb4 full", LLAMA, LLAMA_3B, 4, dict(micro_batch_size=4, recompute="full")),
    # FSDP2 on one rank, then with parameters and optimizer states on the host (CPUOffloadPolicy):
    # the host link and the CPU's AdamW, which only a GPU machine can show against the model
    ("llama-1b mb8 zero3", LLAMA, LLAMA_1B, 8, dict(micro_batch_size=8, recompute="none", zero=3)),
    (
        "llama-1b mb8 zero3 offload",
        LLAMA,
        LLAMA_1B,
        8,
        dict(micro_batch_size=8, recompute="none", zero=3, offload="optimizer+params"),
    ),
    (
        "gpt-350m mb16 zero3 offload",
        GPT,
        {"size": "350m"},
        16,
        dict(micro_batch_size=16, recompute="none", zero=3, offload="optimizer+params"),
    ),
]
# A suite small enough for a CPU, to check the three phases end to end without a GPU.
TINY_SUITE: list[tuple[str, str, dict, int, dict]] = [
    ("gpt-tiny mb8 none", GPT, {"size": "tiny"}, 8, dict(micro_batch_size=8, recompute="none")),
    ("gpt-tiny mb4 full", GPT, {"size": "tiny"}, 8, dict(micro_batch_size=4, recompute="full")),
]


def prepare(args: argparse.Namespace) -> int:
    """Plan every configuration pinned on one device; model files are written relative to the
    repository root so the plans run from any checkout of the same tree."""
    from planner.errors import InfeasibleError
    from planner.schema import write_plan

    suite = TINY_SUITE if args.tiny else SUITE
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (name, model, margs, gbs, pins) in enumerate(suite):
        t0 = time.perf_counter()
        refused = None
        try:
            p = _pinned_plan(model, margs, gbs, pins, args.profile, args.dtype)
        except InfeasibleError as exc:
            if not args.refused_on:
                raise
            # the planner says it will not fit: plan it on a larger device's profile anyway, so
            # the GPU shows whether the refusal was right (an OOM) or too cautious (it ran)
            refused = str(exc)
            p = _pinned_plan(model, margs, gbs, pins, args.refused_on, args.dtype)
        p["model"]["file"] = model
        path = write_plan(p, out / f"c{i:02d}")
        pred = p["predicted"]
        rows.append(
            {
                "name": name,
                "model": model,
                "model_args": margs,
                "global_batch_size": gbs,
                "pins": pins,
                "plan": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
                "predicted_s": pred["step_time_s"],
                "predicted_peak_bytes": pred["peak_memory_bytes"],
                "predicted_memory": pred["memory_per_stage"][0],
                "model_flops_per_step": pred["model_flops_per_step"],
                "params": p["model"]["params"],
            }
        )
        if refused:
            rows[-1].update(refused=refused, planned_on=args.refused_on)
        print(
            f"[plan {i + 1}/{len(suite)}] {name}: predicted {pred['step_time_s'] * 1e3:.1f} ms, "
            f"{pred['peak_memory_bytes'] / 2**30:.1f} GiB ({time.perf_counter() - t0:.1f} s)"
            + (f"; refused on {args.profile}, planned on {args.refused_on}" if refused else ""),
            flush=True,
        )
    meta = {"profile": args.profile, "dtype": args.dtype, "tiny": args.tiny, "rows": rows}
    (out / "suite.json").write_text(json.dumps(meta, indent=1))
    print(f"wrote {len(rows)} plans and {out / 'suite.json'}")
    return 0


def _dims(r: dict) -> tuple[int, int, int, int, int, int, int]:
    """(micro-batch, hidden, heads, key/value width, ffn, sequence, vocabulary) of a row."""
    a = r["model_args"]
    mb = r["pins"]["micro_batch_size"]
    if r["model"] == GPT:
        from examples.gpt import SIZES as GS  # noqa: PLC0415

        _, h, heads, seq, vocab = GS[a["size"]]
        return mb, h, heads, h, 4 * h, seq, vocab
    h, heads = a["hidden"], a["heads"]
    return mb, h, heads, h // heads * a["kv_heads"], a["ffn"], a["seq_len"], 128256


def _gemm_shapes(rows: list[dict]) -> list[tuple[int, int, int]]:
    """(M, K, N) of each suite model's projections at its micro-batch: what its layers run."""
    shapes = set()
    for r in rows:
        mb, h, _, kv, ffn, seq, vocab = _dims(r)
        m = mb * seq
        shapes |= {(m, h, h), (m, h, kv), (m, h, ffn), (m, ffn, h), (m, h, vocab)}
    return sorted(shapes)


def _attention_shapes(rows: list[dict]) -> list[tuple[int, int, int, int]]:
    """(batch, heads, sequence, head dim) of each suite model's attention."""
    shapes = set()
    for r in rows:
        mb, h, heads, _, _, seq, _ = _dims(r)
        shapes.add((mb, heads, seq, h // heads))
    return sorted(shapes)


def _randn(dev, dt, *shapes, grad: int = 0) -> list:
    """Random tensors of ``shapes``; the first ``grad`` of them require gradients."""
    import torch

    return [
        torch.randn(*sh, device=dev, dtype=dt, requires_grad=i < grad)
        for i, sh in enumerate(shapes)
    ]


def _causal_attention(q, k, v, grad) -> None:
    import torch.nn.functional as F

    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if grad is not None:
        out.backward(grad)
        q.grad = k.grad = v.grad = None


def median_seconds(fn, reps: int, device: str = "cuda") -> float:
    """Median seconds of one call of ``fn`` over ``reps`` calls after three warm-ups: timed
    with CUDA events on a GPU (each call synchronized), with the host clock on a CPU."""
    import torch

    for _ in range(3):
        fn()
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        return statistics.median(times)
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def kernels(rows: list[dict], device: str) -> dict:
    """The suite's GEMMs and causal attention alone, bf16, forward and backward: achieved
    TFLOP/s against what the profile's efficiencies say."""
    import torch

    from planner.calibrate.bench import attention_forward_flops, attention_work

    dev = torch.device(device)
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    timed = partial(median_seconds, device=device)
    scale = 1 if device == "cuda" else 64  # a CPU dry run at a fraction of the size
    reps = 20 if device == "cuda" else 2
    out: dict[str, list] = {"gemm": [], "attention": []}
    for m, k, n in _gemm_shapes(rows):
        m = max(16, m // scale)
        t = timed(partial(torch.matmul, *_randn(dev, dt, (m, k), (k, n))), reps)
        out["gemm"].append({"m": m, "k": k, "n": n, "s": t, "tflops": 2 * m * k * n / t / 1e12})
    for b_, heads, seq, d in _attention_shapes(rows):
        seq_ = max(16, seq // scale)
        q, k, v, g = _randn(dev, dt, *[(b_, heads, seq_, d)] * 4, grad=3)
        tf = timed(partial(_causal_attention, q, k, v, None), reps)
        tfb = timed(partial(_causal_attention, q, k, v, g), reps)
        shape = (b_, heads, seq_, d)
        out["attention"].append(
            {
                "batch": b_,
                "heads": heads,
                "seq": seq_,
                "head_dim": d,
                "fwd_s": tf,
                "fwd_bwd_s": tfb,
                "fwd_tflops": attention_forward_flops(shape) / tf / 1e12,
                "fwd_bwd_tflops": attention_work(shape) / tfb / 1e12,
            }
        )
    return out


def _selected(rows: list[dict], only: str | None) -> list[dict]:
    """The suite's rows ``--only`` names (comma-separated), or all of them."""
    return [r for r in rows if not only or r["name"] in only.split(",")]


def measure(args: argparse.Namespace) -> int:
    """Train every prepared plan on this machine's first GPU (or the CPU with --device cpu)."""
    import torch

    prepared = Path(args.dir)
    meta = json.loads((prepared / "suite.json").read_text())
    rows = _selected(meta["rows"], args.only)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = {"torch": torch.__version__, "device": args.device}
    if args.device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_memory_bytes"] = torch.cuda.get_device_properties(0).total_memory
    print(f"measuring on {info}", flush=True)
    runs = Path(tempfile.mkdtemp(prefix="meshplan-gpu-accuracy-"))
    run_dirs = {r["name"]: runs / f"c{i:02d}" for i, r in enumerate(rows)}
    # the plans that fit with room to spare train in one launch; each refused one, and each
    # predicted within 10% of this device's memory, alone, since an OOM ends its process
    room = 0.9 * info.get("gpu_memory_bytes", math.inf)
    fitting = [r for r in rows if not r.get("refused") and r["predicted_peak_bytes"] < room]
    alone = [[r] for r in rows if r not in fitting]
    launches = ([fitting] if fitting else []) + alone
    exits: dict[str, dict] = {}
    deadline = time.perf_counter() + args.timeout
    for i, group in enumerate(launches):
        log = runs / f"launch-{i:02d}.log"
        rc, seconds = _launch(group, run_dirs, args, deadline - time.perf_counter(), log)
        text = log.read_text(errors="replace")
        oom = "OutOfMemoryError" in text or "CUDA out of memory" in text
        for r in group:
            exits[r["name"]] = {"exit": rc, "seconds": seconds, "oom": oom}
            if rc:
                exits[r["name"]]["output_tail"] = text.splitlines()[-25:]
    results = []
    for r in rows:
        path = run_dirs[r["name"]] / "metrics.jsonl"
        recs = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
        results.append({"name": r["name"], "records": recs, **exits.get(r["name"], {})})
    t0 = time.perf_counter()
    try:
        info["kernels"] = kernels(rows, args.device)
    except Exception as exc:  # noqa: BLE001 - the training results stand without them
        info["kernels_error"] = f"{type(exc).__name__}: {exc}"
    print(f"kernels: {time.perf_counter() - t0:.1f} s", flush=True)
    (out / "measured.json").write_text(json.dumps({"info": info, "results": results}, indent=1))
    print(f"wrote {out / 'measured.json'}")
    planned = {r["name"] for r in rows if not r.get("refused")}
    return 0 if all(e["exit"] == 0 for n, e in exits.items() if n in planned) else 1


def _launch(group: list[dict], run_dirs: dict, args, timeout: float, log: Path):
    """One torchrun over ``group``'s plans on one device; (exit status, seconds). Its output
    goes to the terminal and to ``log``."""
    from runtime.launch import torchrun_command, worker_env

    cmd = torchrun_command(
        1,
        [
            "--plans",
            *[str(ROOT / r["plan"]) for r in group],
            "--run-dirs",
            *[str(run_dirs[r["name"]]) for r in group],
            "--steps",
            str(args.steps),
            "--seed",
            "0",
            "--device",
            args.device,
        ],
    )
    t0 = time.perf_counter()
    env = worker_env()
    # the model is built on the CPU before it moves to the GPU: let the build use the cores
    env["OMP_NUM_THREADS"] = str(os.cpu_count() or 1)
    names = ", ".join(r["name"] for r in group)
    with log.open("w") as fh:
        proc = subprocess.Popen(
            cmd, env=env, cwd=ROOT, text=True, start_new_session=True, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            for line in _lines(proc, max(timeout, 1.0)):
                fh.write(line)
                print(line, end="", flush=True)
            rc = proc.wait()
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its worker: keep what they wrote
            rc = proc.wait()
            print(f"training {names}: stopped at the --timeout", flush=True)
    seconds = time.perf_counter() - t0
    print(f"training {names}: exit {rc} in {seconds:.1f} s", flush=True)
    return rc, seconds


def _lines(proc: subprocess.Popen, timeout: float):
    """``proc``'s output lines until it ends; TimeoutExpired once ``timeout`` seconds pass."""
    import selectors

    end = time.perf_counter() + timeout
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    while True:
        left = end - time.perf_counter()
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        if sel.select(left):
            line = proc.stdout.readline()
            if not line:
                return
            yield line


KERNEL_CLASSES = (
    # (class, substrings of a CUDA kernel's name), first match wins
    ("attention", ("flash", "fmha", "attention", "attn")),
    ("optimizer", ("multi_tensor_apply", "adam")),
    ("communication", ("nccl",)),
    ("matmul", ("gemm", "nvjet", "sm90_xmma", "cutlass", "wgmma", "splitk")),
)


def kernel_class(name: str) -> str:
    low = name.lower()
    for cls, keys in KERNEL_CLASSES:
        if any(k in low for k in keys):
            return cls
    return "elementwise and other"


def fsdp_kernel_time(events) -> dict[str, float]:
    """Seconds of CUDA kernels launched inside FSDP2's own ranges (``FSDP::...``: the casts to
    the compute dtype, the all-gather's copy-in and copy-out, the gradients' copy into the
    reduce-scatter buffer and their cast back), per outermost range name: the work FSDP adds
    to a step beyond the model's own kernels and the collectives."""
    out: dict[str, float] = {}
    for e in events:
        if not e.name.startswith("FSDP::"):
            continue
        parent, nested = e.cpu_parent, False
        while parent is not None:
            if parent.name.startswith("FSDP::"):
                nested = True
                break
            parent = parent.cpu_parent
        if nested:
            continue
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = getattr(e, "cuda_time_total", 0.0)
        name = re.sub(r" (\(\d+\)|for \d+)$", "", e.name)  # one entry per range, not per unit
        out[name] = out.get(name, 0.0) + t / 1e6
    return out


def fsdp_total(by_range: dict[str, float]) -> float:
    """The FSDP ranges' kernel seconds in all, less the root's (``root_pre_forward``,
    ``root_post_backward_callback``): those enclose the root unit's own ranges, which the
    profiler's parent links did not show as nested (both read 7.7 ms on an H200)."""
    return sum(t for name, t in by_range.items() if not name.startswith("FSDP::root_"))


def _phase_memory(built, mf, step: int, device) -> dict:
    """One step of a one-device plan (pp = 1) with the allocator read between its phases:
    what the forward holds at its end (activations, the loss), each phase's peak, and what
    stays after the optimizer."""
    import torch

    from runtime.batching import dp_slice, micro_batches
    from runtime.parallelize import gradient_sync

    plan = built.plan
    gbs, mbs = plan.global_batch_size, plan.micro_batch_size
    cuda = device.type == "cuda"

    def now() -> int:
        return int(torch.cuda.memory_allocated(device)) if cuda else 0

    def peak() -> int:
        return int(torch.cuda.max_memory_allocated(device)) if cuda else 0

    def reset() -> None:
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)

    batch = mf.batch(gbs, step=step)
    inputs, targets = dp_slice(batch, 0, gbs)
    chunks = micro_batches((inputs, targets), gbs, mbs)
    model = built.parts[0]
    out: dict = {"start": now(), "micro_batches": []}
    for j, (x, y) in enumerate(chunks):
        x = tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in x)
        y = y.to(device) if isinstance(y, torch.Tensor) else y
        gradient_sync(built.parts, j == len(chunks) - 1)
        reset()
        loss = mf.loss(model(*x), y)
        fwd = {"held_after_forward": now(), "forward_peak": peak()}
        reset()
        (loss / len(chunks)).backward()
        del loss
        reset_peak = peak()
        fwd.update(backward_peak=reset_peak, held_after_backward=now())
        out["micro_batches"].append(fwd)
    reset()
    built.sync_gradients()
    for opt in built.optimizers:
        opt.step()
    out["optimizer_peak"] = peak()
    out["held_after_optimizer"] = now()
    for opt in built.optimizers:
        opt.zero_grad(set_to_none=True)
    out["held_between_steps"] = now()
    return out


def probe(args: argparse.Namespace) -> int:
    """Where each prepared plan's step time and memory go: every CUDA kernel of one step
    (torch.profiler) summed by class (matrix products, attention, optimizer, the rest), the
    GPU's busy time against the step's wall time (the rest is the GPU waiting for the host),
    and the allocator read between the step's phases. In this process, world size 1."""
    import socket

    import torch
    import torch.distributed as dist
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from planner.modelfile import load_model_file
    from planner.schema import load_plan
    from runtime.build import build, release
    from runtime.train import _local_step, _optimizer_step

    meta = json.loads((Path(args.dir) / "suite.json").read_text())
    rows = _selected(meta["rows"], args.only)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    os.environ.setdefault("LOCAL_RANK", "0")
    cuda = args.device == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for r in rows:
        t0 = time.perf_counter()
        res: dict = {"name": r["name"]}
        try:
            plan = load_plan(ROOT / r["plan"])
            mf = load_model_file(plan.model.file, plan.model.args)
            built = build(plan, mf, device, 0)
            if cuda:
                torch.cuda.synchronize()
            res["held_after_build"] = int(torch.cuda.memory_allocated()) if cuda else 0
            for step in (1, 2):
                _local_step(built, mf, step, device)
                _optimizer_step(built)
            res["phases"] = _phase_memory(built, mf, 3, device)
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            with profile(activities=acts) as prof:
                w0 = time.perf_counter()
                _local_step(built, mf, 4, device)
                _optimizer_step(built)
                if cuda:
                    torch.cuda.synchronize()
                res["profiled_wall_s"] = time.perf_counter() - w0
            classes: dict[str, float] = {}
            kernels_: list = []
            for e in prof.key_averages():
                # kernels only: an aten op's entry carries its kernels' time too (counted
                # twice, the GPU's busy time came out at twice the step's wall time), and so
                # does a record_function range seen on the GPU (FSDP's, the optimizer's)
                if e.device_type != DeviceType.CUDA or getattr(e, "is_user_annotation", False):
                    continue
                t = e.self_device_time_total
                if t <= 0:
                    continue
                classes[kernel_class(e.key)] = classes.get(kernel_class(e.key), 0.0) + t / 1e6
                kernels_.append((t / 1e6, e.count, e.key[:90]))
            res["kernel_s_by_class"] = classes
            res["gpu_busy_s"] = sum(classes.values())
            res["fsdp_kernel_s_by_range"] = fsdp_kernel_time(prof.events())
            res["top_kernels"] = sorted(kernels_, reverse=True)[: args.top]
            if cuda:
                res["optimizer_step_s"] = _optimizer_timings(built, mf, device)
            release(built)
            del built
        except Exception as exc:  # noqa: BLE001 - record and go on to the next plan
            res["error"] = f"{type(exc).__name__}: {exc}"
        if cuda:
            torch.cuda.empty_cache()
        res["probe_s"] = time.perf_counter() - t0
        results.append(res)
        busy = res.get("gpu_busy_s", 0.0)
        fsdp = fsdp_total(res.get("fsdp_kernel_s_by_range", {}))
        print(
            f"[probe] {r['name']}: {res.get('error', '')}"
            f"wall {res.get('profiled_wall_s', 0):.3f} s, "
            f"GPU busy {busy:.3f} s, FSDP {fsdp:.3f} s, "
            + ", ".join(f"{k} {v:.3f}" for k, v in sorted(res.get("kernel_s_by_class", {}).items()))
            + f" ({res['probe_s']:.0f} s)",
            flush=True,
        )
        (out / "probe.json").write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()
    print(f"wrote {out / 'probe.json'}")
    return 0


def _optimizer_timings(built, mf, device) -> dict:
    """The optimizer step alone (gradients present, median of 5 after a warm-up): the plan's
    optimizer as the runtime builds it, and the same class with ``fused=True`` (one kernel
    reading and writing each tensor once) over the same parameters."""
    import torch

    from runtime.optim import optimizer_class, optimizer_kwargs
    from runtime.train import _local_step

    def timed(opts) -> float:
        times = []
        for _ in range(6):
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            for o in opts:
                o.step()
            torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])

    _local_step(built, mf, 5, device)  # gradients to step with
    plan = built.plan
    out = {"runtime": timed(built.optimizers)}
    on_host = any(p.device.type == "cpu" for part in built.parts for p in part.parameters())
    if on_host:  # offloaded: the states live on the host, where the runtime's step ran
        return out
    try:
        cls = optimizer_class(plan.optimizer)
        kw = optimizer_kwargs(plan.optimizer, float(plan.lr))
        fused = [cls(p.parameters(), fused=True, **kw) for p in built.parts]
        out["fused"] = timed(fused)
        del fused
    except Exception as exc:  # noqa: BLE001 - the runtime's timing stands without it
        out["fused_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return out


def _pinned_plan(model: str, margs: dict, gbs: int, pins: dict, profile: str, dtype: str) -> dict:
    """The plan dict of one configuration on one device, everything the suite leaves open
    pinned to no parallelism."""
    from planner.api import plan as make_plan
    from planner.search import Pins

    full = dict(tp=1, pp=1, dp=1, zero=0, offload="none", schedule=None)
    full.update(pins)
    res = make_plan(
        ROOT / model,
        1,
        model_args=margs,
        profile=profile,
        global_batch_size=gbs,
        dtype=dtype,
        pins=Pins(**full),
    )
    return res.plan.to_dict()


def report(args: argparse.Namespace) -> int:
    from planner.hardware.profiles import load_profile

    meta = json.loads((Path(args.dir) / "suite.json").read_text())
    # each configuration from the first run that has its warm steps; runs given with
    # --times-only lend step times, not memory
    runs = [(Path(d), True) for d in args.measured] + [(Path(d), False) for d in args.times_only]
    measured = [json.loads((d / "measured.json").read_text()) for d, _ in runs]
    prof = load_profile(meta["profile"])
    context = prof.reserved_bytes
    rows = []
    for r in meta["rows"]:
        row = dict(r)
        recs, memory_ok, source = [], False, None
        for (d, mem_ok), run in zip(runs, measured):
            found = {x["name"]: x["records"] for x in run["results"]}.get(r["name"], [])
            recs = [x for x in found if x["step"] > args.warmup]
            if recs:
                memory_ok, source = mem_ok, str(d)
                break
        if r.get("refused"):
            # planned on a larger profile only to see whether the refusal holds: its step
            # time is not this profile's prediction, its memory says whether it fits
            row["error"] = _refusal_outcome(r, runs, measured, args.warmup)
            rows.append(row)
            continue
        if not recs:
            row["error"] = "no warm steps measured"
            rows.append(row)
            continue
        t = statistics.median(x["step_time_s"] for x in recs)
        pred_peak = r["predicted_peak_bytes"] - context
        row.update(
            measured_from=source,
            measured_s=t,
            step_times_s=[x["step_time_s"] for x in recs],
            rel_error=(r["predicted_s"] - t) / t,
            predicted_peak_less_context_bytes=pred_peak,
            measured_tflops=r["model_flops_per_step"] / t / 1e12,
        )
        if memory_ok:
            peak = max(x["peak_memory_bytes"][0] for x in recs)
            row.update(
                measured_peak_bytes=peak,
                measured_reserved_bytes=max(x.get("peak_reserved_bytes", [0])[0] for x in recs),
                memory_rel_error=(pred_peak - peak) / peak,
            )
        if args.profile:
            alt = _pinned_plan(
                r["model"],
                r["model_args"],
                r["global_batch_size"],
                r["pins"],
                args.profile,
                meta["dtype"],
            )["predicted"]
            row["repriced"] = {
                "profile": args.profile,
                "predicted_s": alt["step_time_s"],
                "rel_error": (alt["step_time_s"] - t) / t,
            }
        rows.append(row)
    ok = [r for r in rows if "measured_s" in r]
    mem_ok = [r for r in ok if "measured_peak_bytes" in r]
    hdr = (
        f"{'config':28s} {'pred ms':>9s} {'meas ms':>9s} {'err':>7s} {'TFLOP/s':>8s} "
        f"{'pred GiB':>9s} {'meas GiB':>9s} {'err':>7s}"
    )
    print(hdr + ("  repriced err" if args.profile else ""))
    for r in rows:
        if "measured_s" not in r:
            print(f"{r['name']:28s} {r['error']}")
            continue
        mem = (
            f"{r['measured_peak_bytes'] / 2**30:9.2f} {r['memory_rel_error']:+7.1%}"
            if "measured_peak_bytes" in r
            else f"{'-':>9s} {'-':>7s}"
        )
        line = (
            f"{r['name']:28s} {r['predicted_s'] * 1e3:9.1f} {r['measured_s'] * 1e3:9.1f} "
            f"{r['rel_error']:+7.1%} {r['measured_tflops']:8.1f} "
            f"{r['predicted_peak_less_context_bytes'] / 2**30:9.2f} {mem}"
        )
        if "repriced" in r:
            line += f"  {r['repriced']['rel_error']:+7.1%}"
        print(line)
    summary = {}
    if ok:
        summary = {
            "configs": len(rows),
            "measured": len(ok),
            "median_abs_step_error": statistics.median(abs(r["rel_error"]) for r in ok),
            "worst_abs_step_error": max(abs(r["rel_error"]) for r in ok),
            "memory_measured": len(mem_ok),
            "median_abs_memory_error": statistics.median(
                abs(r["memory_rel_error"]) for r in mem_ok
            ),
            "worst_abs_memory_error": max(abs(r["memory_rel_error"]) for r in mem_ok),
        }
        if args.profile:
            summary["repriced_median_abs_step_error"] = statistics.median(
                abs(r["repriced"]["rel_error"]) for r in ok
            )
        print(json.dumps(summary, indent=1))
    name = Path(meta["profile"]).stem
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "command": "python benchmarks/gpu_accuracy.py " + " ".join(sys.argv[1:]),
        "profile": meta["profile"],
        "machine": {k: v for k, v in measured[0]["info"].items() if k != "kernels"},
        "kernels": measured[0]["info"].get("kernels"),
        "summary": summary,
        "configs": rows,
    }
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1, default=_finite))
    if ok and not args.no_plot:
        _plot(ok, out / f"{name}.png", meta["profile"], measured[0]["info"])
    print(f"wrote {out / (name + '.json')}")
    return 0


def _refusal_outcome(r: dict, runs: list, measured: list[dict], warmup: int) -> str:
    """What the device made of a configuration the planner refused: an OOM (the refusal was
    right), a peak over the device (also right), or a run that fit (too cautious)."""
    for (d, _), run in zip(runs, measured):
        res = next((x for x in run["results"] if x["name"] == r["name"]), None)
        if res is None:
            continue
        total = run["info"].get("gpu_memory_bytes", math.inf)
        recs = [x for x in res["records"] if x["step"] > warmup]
        if res.get("oom"):
            return f"refused by the planner; out of memory on the device ({d})"
        if recs:
            peak = max(x.get("peak_reserved_bytes", x["peak_memory_bytes"])[0] for x in recs)
            verdict = "too cautious" if peak < total else "right"
            return (
                f"refused by the planner; ran with {peak / 2**30:.1f} GiB reserved of "
                f"{total / 2**30:.1f} GiB: the refusal was {verdict} ({d})"
            )
    return "refused by the planner; not run on the device"


def _finite(x):
    return None if isinstance(x, float) and not math.isfinite(x) else str(x)


def _plot(rows: list[dict], path: Path, profile: str, info: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 6))
    pairs = [
        ("step time (s)", "predicted_s", "measured_s"),
        ("peak memory (GiB)", "predicted_peak_less_context_bytes", "measured_peak_bytes"),
    ]
    for ax, (label, pk, mk) in zip(axes, pairs):
        k = 1 / 2**30 if "bytes" in pk else 1.0
        numbered = [(i, r) for i, r in enumerate(rows, start=1) if mk in r]
        xs = [r[pk] * k for _, r in numbered]
        ys = [r[mk] * k for _, r in numbered]
        lo, hi = min(xs + ys) / 1.3, max(xs + ys) * 1.3
        grid = [lo * (hi / lo) ** (i / 50) for i in range(51)]
        ax.fill_between(grid, [g * 0.9 for g in grid], [g * 1.1 for g in grid], alpha=0.2,
                        color="tab:green", label="±10%")  # fmt: skip
        ax.plot(grid, grid, "k-", lw=1, label="y = x")
        for (i, _), x, y in zip(numbered, xs, ys):
            ax.scatter(x, y, color="tab:blue", zorder=3)
            ax.annotate(str(i), (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"predicted {label}")
        ax.set_ylabel(f"measured {label}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    key = "  ".join(f"{i}: {r['name']}" for i, r in enumerate(rows, start=1))
    fig.suptitle(
        f"meshplan on one {info.get('gpu', info.get('device'))}, torch {info.get('torch')}, "
        f"profile {profile}\n{key}",
        fontsize=8,
    )
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="phase", required=True)
    p = sub.add_parser("prepare", help="plan the suite here")
    p.add_argument("--dir", default=str(PREPARED))
    p.add_argument("--profile", default="h200")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--tiny", action="store_true", help="a CPU-sized suite (checks the phases)")
    p.add_argument(
        "--refused-on",
        metavar="PROFILE",
        help="plan what --profile refuses on this larger profile, so measure shows the OOM",
    )
    m = sub.add_parser("measure", help="train the prepared plans on this machine")
    m.add_argument("--dir", default=str(PREPARED))
    m.add_argument("--out", default=os.environ.get("OUT", "gpu-measured"))
    m.add_argument("--steps", type=int, default=8)
    m.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    m.add_argument("--timeout", type=float, default=600.0, help="seconds for the training")
    m.add_argument("--only", help="comma-separated config names")
    q = sub.add_parser("probe", help="profile one step of each prepared plan on this machine")
    q.add_argument("--dir", default=str(PREPARED))
    q.add_argument("--out", default=os.environ.get("OUT", "gpu-measured"))
    q.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    q.add_argument("--only", help="comma-separated config names")
    q.add_argument("--top", type=int, default=12, help="kernels listed per plan")
    r = sub.add_parser("report", help="compare predictions with a measure phase's output")
    r.add_argument("--dir", default=str(PREPARED))
    r.add_argument("--measured", nargs="+", required=True, help="measure phases' --out dirs")
    r.add_argument(
        "--times-only", nargs="*", default=[], help="runs whose memory is not to be compared"
    )
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--profile", help="also price the suite on this profile (a measured one)")
    r.add_argument("--out", default=str(ROOT / "reports" / "accuracy"))
    r.add_argument("--no-plot", action="store_true")
    args = ap.parse_args()
    phases = {"prepare": prepare, "measure": measure, "probe": probe, "report": report}
    return phases[args.phase](args)


if __name__ == "__main__":
    sys.exit(main())
