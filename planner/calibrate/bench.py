"""The measurement kernels of ``plan calibrate``: matmul, streaming memory and host-link rates.

Each kernel runs for a fixed wall-clock time rather than a fixed count, so that N ranks started
together after a barrier stay busy over the same interval: on a CPU the ranks share the cores
and the memory bus, and the rate each one gets while the others run is the rate a training step
gets. Times are taken with ``time.perf_counter`` after synchronizing the device.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from planner.cost.compute import FLASH_BACKWARD
from planner.fx_stacks import stack_traces_off
from planner.vocab import Recompute

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
    inner_dims: tuple[int, ...]  # short K of (inner_mn, inner_mn, K) GEMMs, for the K fit
    inner_mn: int
    stream_bytes: int  # size of each streamed tensor (bandwidth)
    elementwise_bytes: int  # size of each element-wise op's input
    seconds: float  # wall time per timed kernel
    collective_sizes: tuple[int, ...]  # message sizes in bytes (the full buffer S)
    collective_budget_bytes: int  # repetitions per size: about this many bytes moved
    trials: int  # timed repeats per collective size; the fastest counts
    host_bytes: int  # host<->device copy size (CUDA)
    # (batch, heads, sequence, head dim) of causal fused attention, forward and backward
    # (CUDA only: on a CPU, SDPA's math kernel is priced as the products it runs)
    attention_shapes: tuple[tuple[int, int, int, int], ...] = ()


def settings(device: str, quick: bool) -> Settings:
    """Sizes large enough to leave the caches (full) or just big enough to be meaningful
    (--quick, for tests). The CPU's element-wise size stays below glibc's 32 MiB mmap
    threshold, as a small model's activations do: above it every output page-faults afresh,
    which measures the kernel, not the model."""
    if device == "cuda":
        if quick:
            return Settings(
                matmul_shapes=((2048, 2048, 2048), (4096, 1024, 4096)),
                inner_dims=(64, 128),
                inner_mn=4096,
                stream_bytes=2**26,
                elementwise_bytes=2**26,
                seconds=0.05,
                collective_sizes=tuple(2**k for k in range(12, 25, 4)),
                collective_budget_bytes=2**26,
                trials=2,
                host_bytes=2**26,
                attention_shapes=((2, 8, 1024, 64),),
            )
        return Settings(
            matmul_shapes=(
                (4096, 4096, 4096),
                (8192, 8192, 8192),
                (16384, 4096, 4096),
                (2048, 16384, 4096),
            ),
            inner_dims=(64, 128, 256),
            inner_mn=8192,
            stream_bytes=2**30,
            elementwise_bytes=2**28,
            seconds=0.3,
            collective_sizes=tuple(2**k for k in range(12, 29, 2)),
            collective_budget_bytes=2**30,
            trials=3,
            host_bytes=2**28,
            # the head dims language models use (64, 128) at a training sequence length
            attention_shapes=((4, 32, 2048, 64), (4, 16, 2048, 128), (2, 32, 4096, 128)),
        )
    if quick:
        return Settings(
            matmul_shapes=((256, 256, 256), (512, 128, 512)),
            inner_dims=(32, 64),
            inner_mn=256,
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
        inner_dims=(32, 64, 128),
        inner_mn=1024,
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


def attention_forward_flops(shape) -> float:
    """Causal attention's forward at (batch, heads, sequence, head dim): its two products over
    the unmasked half of the scores, 4·b·h·s²·d / 2."""
    b, h, seq, d = shape
    return 4.0 * b * h * seq * seq * d / 2


def attention_work(shape) -> float:
    """Causal attention's forward and backward as the cost model prices them
    (``planner.cost.compute.op_rate``): the forward and a backward of 2 · FLASH_BACKWARD times it
    (it recomputes the scores)."""
    return attention_forward_flops(shape) * (1 + 2 * FLASH_BACKWARD)


def attention_rate(device: torch.device, shape, seconds: float) -> float:
    """FLOP/s of causal ``scaled_dot_product_attention`` forward and backward in bf16, counted
    as ``attention_work``."""
    b, h, seq, d = shape
    q, k, v = (
        torch.randn(b, h, seq, d, device=device, dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    grad = torch.randn(b, h, seq, d, device=device, dtype=torch.bfloat16)

    def step() -> None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(grad)
        q.grad = k.grad = v.grad = None

    return timed_rate(step, attention_work(shape), seconds, synchronizer(device))


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


def model_op_mix() -> tuple[torch.nn.Module, torch.Tensor]:
    """torch's own pre-LN transformer layer at a width where every op's math is negligible: a
    representative mix of the eager ops models run (linear, layer norm, attention, GeLU,
    dropout, residual adds), each paying dispatch, autograd recording and its backward node."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        8, 2, 32, dropout=0.1, activation="gelu", batch_first=True, norm_first=True
    )
    return layer.train(), torch.randn(2, 4, 8)


def traced_op_count(module: torch.nn.Module, x: torch.Tensor) -> int:
    """Ops the tracer would count for ``module`` (torch.export's graph, views excluded): the
    unit the cost model charges a per-op overhead on."""
    from planner.trace.export import op_name
    from planner.trace.opcost import is_view

    with stack_traces_off():
        exported = torch.export.export(module, (x,), strict=False)
    nodes = exported.graph_module.graph.nodes
    return sum(1 for n in nodes if n.op == "call_function" and not is_view(op_name(n.target)))


def op_overheads(
    device: torch.device, seconds: float, mesh=None, local_mesh=None
) -> dict[str, float]:
    """Host seconds of op dispatch where the math is negligible. "forward"/"backward": per
    traced op of a transformer layer (model_op_mix) in training, forward with autograd
    recording and then its backward. "optimizer": per eager multiply in a chain on 8-element
    tensors, the kind of op a per-tensor optimizer step issues. "dtensor": that multiply on a
    replicated DTensor (FSDP2 and TP parameters' optimizer steps); "tp_module" and
    "tp_gather_module" (given a mesh of 2 or more ranks): see tp_module_overhead and
    tp_gather_overhead, and fsdp_unit_overhead. Each of those three is the larger of its
    timing on ``mesh`` and on ``local_mesh`` (this rank alone, when given): the wrapping and
    dispatch cost the same at any mesh size, and a cost read as the small difference of
    multi-rank timings, each carrying the other process's jitter, can come out near zero on a
    loaded machine (it did on CI: 6 us for a module of several 15 us DTensor ops)."""
    # The runtime's own selective recompute (its checkpoint and policy), so the probe times
    # what a plan runs.
    from torch.distributed._composable import checkpoint

    from planner.checkpoint_policy import selective_context

    sync = synchronizer(device)
    layer, x = model_op_mix()
    ops = traced_op_count(layer, x)
    layer, x = layer.to(device), x.to(device)

    def forward() -> None:
        layer(x)

    fwd = 1.0 / timed_rate(forward, 1.0, seconds, sync)
    both = 1.0 / timed_rate(_forward_backward(layer, x), 1.0, seconds, sync)
    out = {"forward": fwd / ops, "backward": max(both - fwd, 0.0) / ops, "ops": float(ops)}
    # The same layer under selective recomputation: its dispatch mode sees every op in forward
    # and again in the recompute, which costs far more than the recomputed math at small sizes.
    selective, _ = model_op_mix()
    checkpoint(selective.to(device), context_fn=selective_context)
    sel = 1.0 / timed_rate(_forward_backward(selective, x), 1.0, seconds, sync)
    out[Recompute.SELECTIVE] = max(sel - both, 0.0) / ops

    chain = _multiply_chain(torch.ones(8, device=device))
    out["optimizer"] = 1.0 / timed_rate(chain, 1.0, seconds, sync) / OVERHEAD_CHAIN
    if mesh is not None:
        from torch.distributed.tensor import DTensor, Replicate

        d = DTensor.from_local(torch.ones(8, device=device), mesh, [Replicate()])
        dchain = _multiply_chain(d)
        out["dtensor"] = 1.0 / timed_rate(dchain, 1.0, seconds, sync) / OVERHEAD_CHAIN
        if mesh.size() > 1:
            meshes = [mesh] if local_mesh is None else [mesh, local_mesh]
            for key, probe in (
                ("tp_module", tp_module_overhead),
                ("tp_gather_module", tp_gather_overhead),
                ("fsdp_unit", fsdp_unit_overhead),
            ):
                out[key] = max(probe(device, m) for m in meshes)
    return out


def _multiply_chain(start: torch.Tensor) -> Callable[[], None]:
    """OVERHEAD_CHAIN eager multiplies on ``start`` (a plain tensor or a DTensor)."""

    def chain() -> None:
        y = start
        for _ in range(OVERHEAD_CHAIN):
            y = y * 1.0001

    return chain


def all_gather_fn() -> Callable:
    """torch's all-gather into one tensor: ``all_gather_single`` from torch 2.13, which
    deprecates (with a warning on every call) the older releases' ``all_gather_into_tensor``."""
    import torch.distributed as dist

    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def reduce_scatter_fn() -> Callable:
    """torch's reduce-scatter of one tensor: ``reduce_scatter_single`` from torch 2.13, else the
    older ``reduce_scatter_tensor``."""
    import torch.distributed as dist

    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


TP_CALLS = 40
TP_TRIALS = 5


def _linear_pair(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to(device)


def _forward_backward(module: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        module(x).sum().backward()

    return step


def _lockstep_best(fns: list[Callable[[], None]], group, sync: Callable[[], None]) -> list[float]:
    """Per-call seconds of each of ``fns``: the best of TP_TRIALS interleaved trials (load
    that comes and goes hits all alike) of TP_CALLS calls. A fixed call count on every rank:
    the functions are collective, and a time-bounded loop could leave one rank a call short
    and hang the other."""
    import torch.distributed as dist

    for fn in fns:  # warm up
        for _ in range(3):
            fn()
    best = [math.inf] * len(fns)
    for _ in range(TP_TRIALS):
        for i, fn in enumerate(fns):
            dist.barrier(group=group)
            sync()
            t0 = time.perf_counter()
            for _ in range(TP_CALLS):
                fn()
            sync()
            best[i] = min(best[i], (time.perf_counter() - t0) / TP_CALLS)
    return best


def tp_module_overhead(device: torch.device, mesh) -> float:
    """Host seconds one tensor-parallel nn.Linear adds to its forward and backward besides its
    collective: torch's ParallelStyle hooks wrap and unwrap DTensors, and the linear and its
    backward dispatch as several DTensor ops. Timed on a colwise -> rowwise pair of 8-wide
    linears (one all-reduce, in forward), less the same pair unsharded and one plain
    all-reduce of its output; half of that per module. Call on every rank of ``mesh``."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    styles = {"0": ColwiseParallel(), "1": RowwiseParallel()}
    return _styled_pair_overhead(device, mesh, styles, gathers=0, reduces=1)


def tp_gather_overhead(device: torch.device, mesh) -> float:
    """Host seconds a column-parallel nn.Linear whose output is gathered (the runtime's
    ``colwise_gather``: ``ColwiseParallel(output_layouts=Replicate())``) adds besides its
    collectives: the redistribute from a last-dim shard to a replica (gather, then chunk and
    concatenate along the last dimension) on top of the colwise module's own wrapping. Timed
    on a pair of 8-wide gathered linears (two all-gathers forward, one all-reduce backward:
    the first takes a plain input that needs no gradient), less the pair unsharded and those
    collectives on plain tensors; half of that per module. Call on every rank of ``mesh``."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel

    gathered = ColwiseParallel(output_layouts=Replicate())
    return _styled_pair_overhead(device, mesh, {"0": gathered, "1": gathered}, 2, 1)


def _styled_pair_overhead(
    device: torch.device, mesh, styles: dict, gathers: int, reduces: int
) -> float:
    """Per module: the pair of 8-wide linears under ``styles``, forward and backward, less the
    pair unsharded and ``gathers`` all-gathers and ``reduces`` all-reduces of its [4, 8]
    activations on plain tensors (the collectives the styles issue)."""
    import torch.distributed as dist
    from torch.distributed.tensor.parallel import parallelize_module

    x = torch.ones(4, 8, device=device)
    sharded = parallelize_module(_linear_pair(device), mesh, styles)
    group = mesh.get_group()
    out = torch.ones(4, 8, device=device)
    full = torch.ones(4 * mesh.size(), 8 // mesh.size() or 1, device=device)
    part = torch.ones(4, 8 // mesh.size() or 1, device=device)
    gather = all_gather_fn()

    def collectives() -> None:
        for _ in range(gathers):
            gather(full, part, group=group)
        for _ in range(reduces):
            dist.all_reduce(out, group=group)

    t_plain, t_tp, t_coll = _lockstep_best(
        [_forward_backward(_linear_pair(device), x), _forward_backward(sharded, x), collectives],
        group,
        synchronizer(device),
    )
    return max(t_tp - t_plain - t_coll, 0.0) / 2


def fsdp_unit_overhead(device: torch.device, mesh) -> float:
    """Host seconds one FSDP2 unit adds per micro-batch besides its collectives' modelled
    latency: the pre/post hooks, the copy-in and copy-out around each all-gather and the
    gradient reduce-scatter, the state machine. Timed on two 8-wide nn.Linear units under
    fully_shard (resharded after forward: two all-gathers and one reduce-scatter per unit),
    less the same pair unsharded and those collectives on a plain tensor; per unit. Call on
    every rank of ``mesh``."""
    from torch.distributed.fsdp import fully_shard

    x = torch.ones(4, 8, device=device)
    sharded = _linear_pair(device)
    for unit in sharded:
        fully_shard(unit, mesh=mesh, reshard_after_forward=True)
    fully_shard(sharded, mesh=mesh, reshard_after_forward=True)
    per_unit = sum(p.numel() for p in _linear_pair(device)[0].parameters())
    full = torch.ones(per_unit * mesh.size(), device=device)  # one unit's parameters, gathered
    shard = torch.ones(per_unit, device=device)
    group = mesh.get_group()
    gather, scatter = all_gather_fn(), reduce_scatter_fn()

    def unit_collectives() -> None:  # what each of the two units issues per micro-batch
        for _ in range(2):
            gather(full, shard, group=group)
            gather(full, shard, group=group)
            scatter(shard, full, group=group)

    t_plain, t_fsdp, t_coll = _lockstep_best(
        [
            _forward_backward(_linear_pair(device), x),
            _forward_backward(sharded, x),
            unit_collectives,
        ],
        group,
        synchronizer(device),
    )
    return max(t_fsdp - t_plain - t_coll, 0.0) / 2


# Compute between a training step's collectives runs from a fraction of a layer (tensor
# parallelism) to a whole backward (data parallelism); the in-situ collective timings cycle
# through phases of these lengths.
PHASES_MS = (1.0, 3.0, 10.0)


def compute_phase(device: torch.device) -> Callable[[float], None]:
    """A closure that computes for about ``ms`` milliseconds (square matmuls; every rank agrees
    on the repetition count per millisecond, so ranks on equal hardware run equal work and any
    difference in arrival is the machine's own jitter)."""
    import torch.distributed as dist

    n = 256 if device.type == "cpu" else 4096
    a = torch.randn(n, n, device=device)
    sync = synchronizer(device)
    a @ a
    sync()
    t0 = time.perf_counter()
    for _ in range(8):
        a @ a
    sync()
    per_call = torch.tensor([(time.perf_counter() - t0) / 8], dtype=torch.float64, device=device)
    dist.all_reduce(per_call, op=dist.ReduceOp.MAX)
    calls_per_ms = 1e-3 / max(float(per_call.item()), 1e-9)

    def phase(ms: float) -> None:
        for _ in range(max(1, round(ms * calls_per_ms))):
            a @ a

    return phase


OVERLAP_BYTES = 16 << 20  # the all-reduce whose overlap with compute is timed
OVERLAP_TRIALS = 5


def comm_overlap(device: torch.device) -> dict[str, float]:
    """How much of an all-reduce hides behind compute running beside it: time the all-reduce
    alone (t_comm), a matmul loop sized to take about as long alone (t_comp), then both with
    the all-reduce issued asynchronously first (t_both). The share hidden is
    (t_comm + t_comp - t_both) / min(t_comm, t_comp). Call on every rank at once (the
    all-reduce is collective). On a CPU whose ranks fill its cores the collective's threads
    take their cycles from the compute, and little hides."""
    import torch.distributed as dist

    sync = synchronizer(device)
    buf = torch.ones(OVERLAP_BYTES // 4, device=device)
    a = torch.randn(256, 256, device=device)

    def timed(fn: Callable[[], None]) -> float:
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's
        return float(elapsed.item())

    def comm() -> None:
        dist.all_reduce(buf)

    timed(comm)  # warm the connections
    t_comm = min(timed(comm) for _ in range(2))
    one = min(timed(lambda: a @ a) for _ in range(OVERLAP_TRIALS))
    reps = max(1, round(t_comm / max(one, 1e-9)))
    # Every rank must run the same loop: agree on the largest repetition count.
    agreed = torch.tensor([reps], dtype=torch.float64, device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    reps = int(agreed.item())

    def comp() -> None:
        for _ in range(reps):
            a @ a

    def both() -> None:
        work = dist.all_reduce(buf, async_op=True)
        comp()
        work.wait()

    # Interleaved trials, each with its own share; the smallest counts: a slow "alone" sample
    # reads as compute hidden behind (the median trial's share swung from 0 to 0.58 between
    # calibrations on the development VM, where the runtime's DDP hides nearly nothing), and
    # what hid in every trial is what a step can count on.
    trials = []
    for _ in range(OVERLAP_TRIALS):
        c, k, b = timed(comm), timed(comp), timed(both)
        trials.append(((c + k - b) / max(min(c, k), 1e-12), c, k, b))
    hidden, t_comm, t_comp, t_both = min(trials)
    return {
        "comm_s": t_comm,
        "compute_s": t_comp,
        "both_s": t_both,
        "overlap": min(max(hidden, 0.0), 1.0),
    }
