"""The measurement kernels of ``plan calibrate``: matmul, streaming memory and host-link rates.

Each kernel runs for a fixed wall-clock time rather than a fixed count, so that N ranks started
together after a barrier stay busy over the same interval: on a CPU the ranks share the cores
and the memory bus, and the rate each one gets while the others run is the rate a training step
gets. Times are taken with ``time.perf_counter`` after synchronizing the device.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

DTYPES = {
    "fp32": torch.float32,
    "tf32": torch.float32,  # with TF32 tensor cores allowed (CUDA only)
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


@dataclass(frozen=True)
class Settings:
    """Problem sizes and timing for one device kind and mode (full or --quick)."""

    matmul_shapes: tuple[tuple[int, int, int], ...]  # (M, N, K)
    stream_bytes: int  # size of each streamed tensor (bandwidth)
    elementwise_bytes: int  # size of each element-wise op's input
    seconds: float  # wall time per timed kernel
    collective_sizes: tuple[int, ...]  # message sizes in bytes (the full buffer S)
    collective_budget_bytes: int  # repetitions per size: about this many bytes moved
    trials: int  # timed repeats per collective size; the fastest counts
    host_bytes: int  # host<->device copy size (CUDA)


def settings(device: str, quick: bool) -> Settings:
    """Sizes large enough to leave the caches (full) or just big enough to be meaningful
    (--quick, for tests). The CPU's element-wise size stays below glibc's 32 MiB mmap
    threshold, as a small model's activations do: above it every output page-faults afresh,
    which measures the kernel, not the model."""
    if device == "cuda":
        if quick:
            return Settings(
                matmul_shapes=((2048, 2048, 2048), (4096, 1024, 4096)),
                stream_bytes=2**26,
                elementwise_bytes=2**26,
                seconds=0.05,
                collective_sizes=tuple(2**k for k in range(12, 25, 4)),
                collective_budget_bytes=2**26,
                trials=2,
                host_bytes=2**26,
            )
        return Settings(
            matmul_shapes=(
                (4096, 4096, 4096),
                (8192, 8192, 8192),
                (16384, 4096, 4096),
                (2048, 16384, 4096),
            ),
            stream_bytes=2**30,
            elementwise_bytes=2**28,
            seconds=0.3,
            collective_sizes=tuple(2**k for k in range(12, 29, 2)),
            collective_budget_bytes=2**30,
            trials=3,
            host_bytes=2**28,
        )
    if quick:
        return Settings(
            matmul_shapes=((256, 256, 256), (512, 128, 512)),
            stream_bytes=2**22,
            elementwise_bytes=2**21,
            seconds=0.03,
            collective_sizes=(2**12, 2**16, 2**20, 2**24),  # 16 MiB: bandwidth outweighs noise
            collective_budget_bytes=2**21,
            trials=2,
            host_bytes=0,
        )
    return Settings(
        matmul_shapes=((512, 512, 512), (1024, 1024, 1024), (2048, 256, 1024)),
        stream_bytes=2**26,
        elementwise_bytes=2**24,
        seconds=0.25,
        collective_sizes=tuple(2**k for k in range(12, 27, 2)),
        collective_budget_bytes=2**25,
        trials=5,
        host_bytes=0,
    )


def synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def timed_rate(
    step: Callable[[], None], work: float, seconds: float, sync: Callable[[], None]
) -> float:
    """Work per second of ``step``: warm-up calls for a quarter of ``seconds`` (at least one),
    then calls until ``seconds`` pass.

    On CUDA calls are issued in batches between synchronizations, the batch sized so one batch
    takes about a tenth of the interval, so launch overhead is hidden as in a training step."""
    warm_until = time.perf_counter() + seconds / 4
    while True:  # warm up (thread pools, caches, clocks) for a quarter of the interval
        t0 = time.perf_counter()
        step()
        sync()
        one = max(time.perf_counter() - t0, 1e-7)
        if t0 + one >= warm_until:
            break
    batch = max(1, int(seconds / 10 / one))
    count = 0
    start = time.perf_counter()
    while True:
        for _ in range(batch):
            step()
        sync()
        count += batch
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return work * count / elapsed


def matmul_rates(device: torch.device, dtype: str, shapes, seconds: float) -> list[float]:
    """FLOP/s of ``A[M,K] @ B[K,N]`` per shape (2·M·N·K FLOPs each)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        return [_matmul_rate(device, DTYPES[dtype], shape, seconds) for shape in shapes]
    finally:
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False


def _matmul_rate(device: torch.device, dtype: torch.dtype, shape, seconds: float) -> float:
    m, n, k = shape
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype)
    c = torch.empty(m, n, device=device, dtype=dtype)
    return timed_rate(lambda: torch.mm(a, b, out=c), 2.0 * m * n * k, seconds, synchronizer(device))


def stream_rates(device: torch.device, nbytes: int, seconds: float) -> dict[str, float]:
    """Bytes/s (read + written) of pure streaming kernels on fp32 tensors of ``nbytes`` with
    preallocated outputs: ``y = x`` (2 streams), ``z = x + y`` (3), ``y = 2x`` (2). The best of
    them is the memory bandwidth the profile records."""
    sync = synchronizer(device)
    n = max(1, nbytes // 4)
    x = torch.rand(n, device=device)
    y = torch.rand(n, device=device)
    z = torch.empty(n, device=device)
    per = 4.0 * n
    kernels = {
        "copy": (lambda: z.copy_(x), 2 * per),
        "add": (lambda: torch.add(x, y, out=z), 3 * per),
        "scale": (lambda: torch.mul(x, 2.0, out=z), 2 * per),
    }
    return {name: timed_rate(fn, work, seconds, sync) for name, (fn, work) in kernels.items()}


ELEMENTWISE = ("add", "gelu", "layer_norm", "softmax")


def elementwise_rates(device: torch.device, nbytes: int, seconds: float) -> dict[str, float]:
    """Bytes/s (inputs read + output written) of the memory-bound ops a training step runs
    between its matmuls, out of place as a model runs them (so allocation is included), on
    fp32 rows of 1024: residual add, GeLU, LayerNorm and softmax. The cost model prices these
    by bytes over bandwidth times ``elementwise_efficiency``."""
    sync = synchronizer(device)
    rows = max(1, nbytes // 4 // 1024)
    x = torch.rand(rows, 1024, device=device)
    y = torch.rand(rows, 1024, device=device)
    w = torch.ones(1024, device=device)
    b = torch.zeros(1024, device=device)
    per = 4.0 * x.numel()
    kernels = {
        "add": (lambda: x + y, 3 * per),
        "gelu": (lambda: F.gelu(x), 2 * per),
        "layer_norm": (lambda: F.layer_norm(x, (1024,), w, b), 2 * per),
        "softmax": (lambda: torch.softmax(x, -1), 2 * per),
    }
    return {name: timed_rate(fn, work, seconds, sync) for name, (fn, work) in kernels.items()}


def host_link_rates(device: torch.device, nbytes: int, seconds: float) -> dict[str, float]:
    """Bytes/s of pinned host -> device and device -> host copies (CUDA only): the offload
    path."""
    sync = synchronizer(device)
    n = max(1, nbytes // 4)
    host = torch.empty(n, pin_memory=True)
    dev = torch.empty(n, device=device)
    return {
        "h2d": timed_rate(lambda: dev.copy_(host, non_blocking=True), 4.0 * n, seconds, sync),
        "d2h": timed_rate(lambda: host.copy_(dev, non_blocking=True), 4.0 * n, seconds, sync),
    }


def resident_bytes() -> float:
    """This process's resident set size (Linux /proc), or 0 where it cannot be read."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 0.0


OVERHEAD_CHAIN = 64  # ops per timed call: long enough that the Python loop is noise


def op_overheads(device: torch.device, seconds: float, mesh=None) -> dict[str, float]:
    """Seconds one eager op costs when its math is negligible (8-element tensors): forward
    with autograd recording as in training, its backward, and (given a device mesh) the same
    op on a replicated DTensor, which is what TP and FSDP2 parameters and their optimizer
    steps run. The cost model adds these to each op's roofline time."""
    sync = synchronizer(device)
    x = torch.ones(8, device=device, requires_grad=True)

    def forward() -> torch.Tensor:
        y = x
        for _ in range(OVERHEAD_CHAIN):
            y = y * 1.0001
        return y

    def forward_backward() -> None:
        forward().sum().backward()

    fwd = 1.0 / timed_rate(forward, 1.0, seconds, sync) / OVERHEAD_CHAIN
    both = 1.0 / timed_rate(forward_backward, 1.0, seconds, sync) / OVERHEAD_CHAIN
    out = {"forward": fwd, "backward": max(both - fwd, 0.0)}
    if mesh is not None:
        from torch.distributed.tensor import DTensor, Replicate

        d = DTensor.from_local(torch.ones(8, device=device), mesh, [Replicate()])

        def dtensor_chain() -> None:
            y = d
            for _ in range(OVERHEAD_CHAIN):
                y = y * 1.0001

        out["dtensor"] = 1.0 / timed_rate(dtensor_chain, 1.0, seconds, sync) / OVERHEAD_CHAIN
    return out
