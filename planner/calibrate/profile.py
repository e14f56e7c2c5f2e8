"""Turn raw calibration measurements into a profile the cost model reads as it reads the
shipped ones.

How each cost-model input is set (planner/cost/model.py, planner/hardware/cluster.py):

- Matmuls take ``FLOPs / (peak_flops[dtype] * matmul_efficiency)``. One efficiency serves every
  dtype, so it is fitted on the reference dtype (fp32 on a CPU, bf16 on a GPU) against a real
  peak (the datasheet's for a known GPU; cores x clock x FLOP/cycle of the ISA for a CPU, or the
  best measured shape when the clock boosts above that), and every other dtype's peak is set to
  ``achieved / efficiency`` so the model reproduces each measured rate exactly.
- Achieved rates are the slowest rank's (a synchronous step waits for it), over a mix of shapes:
  total FLOPs / total time with one call of each shape.
- Memory-bound ops take ``bytes / (memory_bandwidth * elementwise_efficiency)``: the bandwidth is
  the best pure streaming kernel, the efficiency what real element-wise ops reach of it.
- Collectives take the alpha-beta ring formulas at ``intra_node_bandwidth * collective_efficiency``
  and ``intra_node_latency``: their product is the joint fit over all-reduce, all-gather and
  reduce-scatter timed back to back (planner/calibrate_fit.py); the link bandwidth is a
  point-to-point transfer's, the efficiency what the collectives reach of it. Each call then
  pays ``collective_sync_s``: the median of what the same collectives cost beyond that fit when
  issued between compute phases, as a step issues them.
- On a CPU, N ranks share the cores and memory: every rate is measured with all N running at
  once, so ``--gpus N`` on this machine prices each rank at what it really gets.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.calibrate.bench import OVERHEAD_CHAIN, OVERLAP_BYTES, Settings, attention_work
from planner.calibrate.fit import fit_alpha_beta, fit_each
from planner.errors import MeshplanError
from planner.hardware.profiles import DeviceProfile, load_profile
from planner.vocab import PEAK_DTYPES, Recompute

REFERENCE_DTYPE = {"cpu": "fp32", "cuda": "bf16"}
ELEMENTWISE_BYTES = {"add": 3.0, "gelu": 2.0, "layer_norm": 2.0, "softmax": 2.0}


@dataclass
class Machine:
    """What calibration knows about the host before measuring."""

    device: str
    nproc: int
    threads: int  # torch threads per rank
    cores: int
    hostname: str
    cpu_model: str
    cpu_mhz: float
    cpu_flags: frozenset[str]
    cpu_vendor: str
    host_memory_bytes: float
    load_average: float
    torch_version: str
    started: str  # ISO time, UTC
    command: str
    quick: bool


@dataclass
class Result:
    profile: DeviceProfile
    comments: dict[str, str]
    header: str
    summary: dict[str, Any]


# --------------------------------------------------------------------------- the host


def read_cpuinfo() -> tuple[str, float, frozenset[str], str]:
    """(model name, clock in MHz, ISA flags, vendor) from /proc/cpuinfo, or what platform
    knows elsewhere. The clock is the larger of the current and the cpufreq maximum."""
    model, mhz, flags, vendor = platform.processor() or "unknown CPU", 0.0, frozenset(), ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "model name" and model in ("", "unknown CPU", platform.processor()):
                    model = value
                elif key == "cpu MHz" and not mhz:
                    mhz = float(value)
                elif key == "flags" and not flags:
                    flags = frozenset(value.split())
                elif key == "vendor_id" and not vendor:
                    vendor = value
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") as f:
            mhz = max(mhz, float(f.read()) / 1000)
    except (OSError, ValueError):
        pass
    return model, mhz, flags, vendor


def host_memory_bytes() -> float:
    """Physical memory (MemTotal), or 0 where /proc/meminfo is missing."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 0.0


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def fp32_flops_per_cycle(flags: frozenset[str], vendor: str) -> int:
    """Dense fp32 FLOP per cycle per core from the vector ISA: two FMA pipes x lanes x 2.
    AMD's Zen 4 runs AVX-512 on 256-bit pipes, so it counts as AVX2 width."""
    if "avx512f" in flags and vendor == "GenuineIntel":
        return 64
    if "avx2" in flags and "fma" in flags:
        return 32
    if "avx" in flags:
        return 16
    return 8


# --------------------------------------------------------------------------- aggregation


def fit_half_inner_dim(inner: list[int], rates: list[float]) -> float:
    """``half`` in rate = R * K / (K + half), by least squares on 1 / rate = 1/R + (half/R)/K
    (linear in 1/K). 0 when the data show no slowdown at short K (or cannot say)."""
    if len(set(inner)) < 2 or len(inner) != len(rates):
        return 0.0
    x = np.array([1.0 / k for k in inner])
    y = np.array([1.0 / r for r in rates])
    slope, intercept = np.polyfit(x, y, 1)
    if not (intercept > 0 and slope > 0):
        return 0.0
    return float(slope / intercept)


def slowest(results: list[dict[str, Any]], section: str) -> dict[str, Any]:
    """Per key (a kernel or dtype), the slowest rank's rate(s)."""
    keys = results[0][section]
    out: dict[str, Any] = {}
    for key in keys:
        values = [r[section][key] for r in results]
        if isinstance(values[0], list):
            out[key] = [min(v[i] for v in values) for i in range(len(values[0]))]
        else:
            out[key] = min(values)
    return out


def mix_rate(work: list[float], rates: list[float]) -> float:
    """Work per second doing one of each: total work over total time."""
    return sum(work) / sum(w / r for w, r in zip(work, rates))


def collective_samples(
    results: list[dict[str, Any]], key: str, typical: bool = False
) -> list[tuple[str, int, int, float]]:
    """(kind, n, bytes, seconds): per trial the slowest rank's time, then the fastest trial
    (back-to-back timings: noise from other processes only ever adds time) or, with
    ``typical``, the median trial (in-situ timings are differences of two walls, so noise
    moves them both ways, and the jitter between ranks is part of what they measure)."""
    by_trial: dict[tuple, float] = {}
    for r in results:
        for kind, n, nbytes, trial, seconds in r.get(key, ()):
            k = (kind, n, nbytes, trial)
            by_trial[k] = max(by_trial.get(k, 0.0), seconds)
    trials: dict[tuple, list[float]] = {}
    for (kind, n, nbytes, _), seconds in by_trial.items():
        trials.setdefault((kind, n, nbytes), []).append(seconds)
    pick = (lambda ts: float(np.median(ts))) if typical else min
    return [(kind, n, nbytes, pick(ts)) for (kind, n, nbytes), ts in sorted(trials.items())]


# --------------------------------------------------------------------------- the profile


def reference_profile(device: str) -> tuple[DeviceProfile | None, str]:
    """The shipped profile of the local GPU (datasheet peaks, inter-node network), or None."""
    if device != "cuda":
        return None, ""
    from planner.hardware.profiles import default_profile_name

    name, reason = default_profile_name()
    if "no shipped profile" in reason:
        return None, reason
    return load_profile(name), name


@dataclass
class _Context:
    """What every section of a profile reads: the reference profile, how many ranks shared
    the machine, and where the comments and the summary go."""

    ref: DeviceProfile | None
    ref_name: str
    share: str
    comments: dict[str, str]
    summary: dict[str, Any]


def build_profile(
    m: Machine,
    s: Settings,
    results: list[dict[str, Any]],
    single: dict[str, Any],
    name: str,
) -> Result:
    """The measured profile, a source comment per field and a header saying when and how:
    each section (compute, memory, host overheads, capacity, node, network) gives its fields."""
    ref, ref_name = reference_profile(m.device)
    share = f"{m.nproc} ranks at once" if m.nproc > 1 else "one rank"
    c = _Context(ref, ref_name, share, {}, {})
    fields: dict[str, Any] = {}
    for section in (_matmul, _memory, _overheads, _capacity, _node, _network):
        fields.update(section(m, s, results, single, c))
    device_text = (
        f"{results[0].get('device_name', 'GPU')} x{m.nproc}, NCCL"
        if m.device == "cuda"
        else f"{m.cpu_model}, {m.nproc} gloo ranks x {m.threads} thread(s) on {m.cores} cores"
    )
    profile = DeviceProfile(
        name=name,
        description=f"measured by plan calibrate: {device_text}",
        host_memory_bytes=m.host_memory_bytes,
        device="gpu" if m.device == "cuda" else "cpu",
        **fields,
    )
    coll = c.summary["samples"]["collectives"] + c.summary["samples"]["p2p"]
    situ = [(f"{k} in situ", n, b, t) for k, n, b, t in c.summary.get("samples_in_situ", [])]
    return Result(profile, c.comments, _header(m, device_text, coll + situ), c.summary)


def _matmul(
    m: Machine, s: Settings, results: list[dict[str, Any]], single: dict[str, Any], c: _Context
) -> dict[str, Any]:
    """Peak FLOP/s per dtype, matmul efficiency and the short-inner-dimension fit.

    Long because each field's comment is written next to the measurement it cites.
    """
    comments, summary, share, ref, ref_name = c.comments, c.summary, c.share, c.ref, c.ref_name
    shapes = s.matmul_shapes
    work = [2.0 * a * b * c_ for a, b, c_ in shapes]
    shape_text = ", ".join(f"{a}x{b}x{c_}" for a, b, c_ in shapes)
    matmul = slowest(results, "matmul")
    achieved = {d: mix_rate(work, rates) for d, rates in matmul.items()}
    best = {d: max(rates) for d, rates in matmul.items()}
    ref_dtype = REFERENCE_DTYPE[m.device]
    if m.device == "cpu":
        cores_per_rank = min(float(m.threads), m.cores / m.nproc)
        per_core = fp32_flops_per_cycle(m.cpu_flags, m.cpu_vendor) * m.cpu_mhz * 1e6
        isa_peak = per_core * cores_per_rank
        peak = max(isa_peak, best[ref_dtype])
        peak_note = (
            f"{cores_per_rank:g} core(s) per rank x {m.cpu_mhz:.0f} MHz x "
            f"{fp32_flops_per_cycle(m.cpu_flags, m.cpu_vendor)} FLOP/cycle = "
            f"{isa_peak / 1e9:.1f} GFLOP/s"
        )
        if best[ref_dtype] > isa_peak:
            peak_note += (
                f"; the best shape measured {best[ref_dtype] / 1e9:.1f} GFLOP/s (the clock "
                "boosts above the one /proc/cpuinfo reports), so that is the peak"
            )
    elif ref is not None:
        peak = max(ref.peak_flops[ref_dtype], best[ref_dtype])
        peak_note = f"datasheet dense {ref_dtype} peak from profiles/{ref_name}.toml"
    else:
        peak = best[ref_dtype]
        peak_note = f"no datasheet for this GPU ({ref_name}): the best measured shape"
    # Short inner dimensions: fit rate = R * K / (K + half) over every shape measured in the
    # reference dtype; matmul_efficiency is then the asymptotic R's share of peak.
    inner_rates = (
        [min(r["matmul_inner"][i] for r in results) for i in range(len(s.inner_dims))]
        if all("matmul_inner" in r for r in results)
        else []
    )
    half = fit_half_inner_dim(
        [k for _, _, k in shapes] + list(s.inner_dims[: len(inner_rates)]),
        list(matmul[ref_dtype]) + inner_rates,
    )
    corr = sum(w * (k + half) / k for w, (_, _, k) in zip(work, shapes)) / sum(work)
    peak = max(peak, achieved[ref_dtype] * corr)
    efficiency = achieved[ref_dtype] * corr / peak
    peaks = {d: achieved[d] * corr / efficiency for d in achieved}
    peaks[ref_dtype] = peak
    comments["matmul_half_inner_dim"] = (
        f"fitted: rate = R * K / (K + this) over {ref_dtype} GEMMs with K = "
        + ", ".join(str(k) for k in sorted({k for _, _, k in shapes} | set(s.inner_dims)))
        + " ("
        + ", ".join(f"K={k} {r / 1e9:.3g}" for k, r in zip(s.inner_dims, inner_rates))
        + f" GFLOP/s at {s.inner_mn}x{s.inner_mn}; slowest rank, {share})"
    )
    summary["matmul_half_inner_dim"] = half
    if "tf32" not in peaks:  # CPUs have no TF32: torch runs fp32 matmuls
        peaks["tf32"] = peaks["fp32"]
    for d in PEAK_DTYPES:
        key = f"peak_flops_{d}"
        if d == ref_dtype:
            comments[key] = f"peak: {peak_note}"
        elif d in achieved:
            comments[key] = (
                f"measured {achieved[d] / 1e9:.4g} GFLOP/s per rank ({share}; shapes "
                f"{shape_text}; best {best[d] / 1e9:.4g}) / matmul_efficiency"
            )
        else:
            comments[key] = "CPUs have no TF32: torch runs fp32 matmuls, so the fp32 figure"
        if d in single.get("matmul", {}):
            comments[key] += (
                f"; one process alone with {single['threads']} threads: "
                f"{mix_rate(work, single['matmul'][d]) / 1e9:.4g} GFLOP/s"
            )
    comments["matmul_efficiency"] = (
        f"measured {achieved[ref_dtype] / 1e9:.4g} GFLOP/s {ref_dtype} per rank ({share}, "
        f"slowest rank, one call of each shape {shape_text}), over those shapes' mean "
        f"K / (K + matmul_half_inner_dim) = {1 / corr:.3f}, / peak"
    )
    summary["matmul_flops"] = achieved
    summary["matmul_efficiency"] = efficiency
    fields = {
        "peak_flops": {d: peaks[d] for d in PEAK_DTYPES},
        "matmul_efficiency": efficiency,
        "matmul_half_inner_dim": half,
    }
    if s.attention_shapes and all("attention" in r for r in results):
        fields["attention_efficiency"] = _attention(s, results, peaks["bf16"], c)
    return fields


def _attention(s: Settings, results: list[dict[str, Any]], peak: float, c: _Context) -> float:
    """Fused causal attention's share of the bf16 peak, forward and backward, on the work the
    cost model counts for it (``bench.attention_rate``): the slowest rank's time over the
    shapes together. Without it a measured profile prices attention as a GEMM, which on an
    H200 (torch 2.11's SDPA, 2026-11-26) runs about twice as fast as the kernel does."""
    rates = [min(r["attention"][i] for r in results) for i in range(len(s.attention_shapes))]
    work = [attention_work(shape) for shape in s.attention_shapes]
    rate = mix_rate(work, rates)
    c.comments["attention_efficiency"] = (
        f"measured {rate / 1e12:.4g} TFLOP/s bf16 ({c.share}, slowest rank; causal "
        "scaled_dot_product_attention forward and backward at (batch, heads, sequence, head "
        "dim) "
        + ", ".join(f"{shape} {r / 1e12:.4g}" for shape, r in zip(s.attention_shapes, rates))
        + "; on half the scores, backward x2.5) / bf16 peak"
    )
    c.summary["attention_flops"] = rate
    return rate / peak


def _memory(
    m: Machine, s: Settings, results: list[dict[str, Any]], single: dict[str, Any], c: _Context
) -> dict[str, Any]:
    """Memory bandwidth (the best streaming kernel) and element-wise efficiency."""
    comments, summary, share, ref = c.comments, c.summary, c.share, c.ref
    stream = slowest(results, "stream")
    bandwidth = max(stream.values())
    fastest = max(stream, key=stream.get)
    ew = slowest(results, "elementwise")
    ew_rate = mix_rate([ELEMENTWISE_BYTES[k] for k in ew], [ew[k] for k in ew])
    ew_eff = min(1.0, ew_rate / bandwidth)
    comments["bandwidth_bytes_per_s"] = (
        f"measured: best streaming kernel ({fastest}) on {s.stream_bytes >> 20} MiB fp32 "
        f"tensors per rank, {share}; "
        + ", ".join(f"{k} {v / 1e9:.3g}" for k, v in stream.items())
        + " GB/s"
    )
    if ref is not None:
        comments["bandwidth_bytes_per_s"] += (
            f" ({bandwidth / ref.memory_bandwidth:.0%} of the {ref.memory_bandwidth / 1e12:.3g} "
            "TB/s datasheet)"
        )
    if single.get("stream"):
        comments["bandwidth_bytes_per_s"] += (
            f"; one process alone: {max(single['stream'].values()) / 1e9:.3g} GB/s"
        )
    comments["elementwise_efficiency"] = (
        f"measured {ew_rate / 1e9:.3g} GB/s for one each of "
        + ", ".join(f"{k} {v / 1e9:.3g}" for k, v in ew.items())
        + f" GB/s (out of place, {s.elementwise_bytes >> 20} MiB inputs) / memory bandwidth"
    )
    summary["memory_bandwidth"] = bandwidth
    summary["elementwise_efficiency"] = ew_eff
    return {"memory_bandwidth": bandwidth, "elementwise_efficiency": ew_eff}


def _overheads(
    m: Machine, s: Settings, results: list[dict[str, Any]], single: dict[str, Any], c: _Context
) -> dict[str, Any]:
    """Host time per op, optimizer op, DTensor op, TP module and FSDP unit.

    Long because each field's comment is written next to the measurement it cites.
    """
    comments, summary, share = c.comments, c.summary, c.share
    overhead = {k: max(r["op_overhead"][k] for r in results) for k in results[0]["op_overhead"]}
    if m.device == "cpu":
        op_ovh = overhead["forward"]
        bwd_ovh = overhead["backward"]
        sel_ovh = overhead[Recompute.SELECTIVE]
        opt_ovh = overhead["optimizer"]
        dt_ovh = overhead.get("dtensor", opt_ovh)
        where = f"slowest rank, {share}"
        mix = (
            f"torch's TransformerEncoderLayer at width 8 in training ({overhead['ops']:.0f} "
            "traced ops, math negligible)"
        )
        comments["op_overhead_s"] = (
            f"measured: {mix}, forward per traced op ({where}): dispatch and autograd "
            "recording run in line with the math on a CPU"
        )
        comments["backward_op_overhead_s"] = "measured: that layer's backward, per traced op"
        comments["selective_op_overhead_s"] = (
            "measured: that layer under a checkpoint whose policy saves matrix products (as the "
            "runtime's selective recompute), extra forward+backward host time per traced op"
        )
        comments["optimizer_op_overhead_s"] = (
            f"measured: a chain of {OVERHEAD_CHAIN} eager multiplies of 8-element tensors, per op "
            f"({where}): what a per-tensor optimizer step issues"
        )
        comments["dtensor_op_overhead_s"] = (
            f"measured: the same multiply on a replicated DTensor, per op ({where}); "
            "what FSDP2 and TP parameters' optimizer steps run"
        )
        alone = "the larger of all ranks together and each rank on a mesh of its own"
        fsdp_ovh = overhead.get("fsdp_unit", 0.0)
        comments["fsdp_unit_overhead_s"] = (
            "measured: two 8-wide nn.Linear units under FSDP2 fully_shard (resharded after "
            "forward), forward and backward, less the pair unsharded and the units' all-gathers "
            f"and reduce-scatter on a plain tensor, per unit (slowest rank, {share}; {alone})"
            if "fsdp_unit" in overhead
            else "not measured (one rank: nothing to shard over)"
        )
        tp_ovh = overhead.get("tp_module", 0.0)
        gather_ovh = overhead.get("tp_gather_module", tp_ovh)
        comments["tp_gather_overhead_s"] = (
            "measured: a pair of 8-wide nn.Linear under ColwiseParallel with gathered output, "
            "forward and backward, less the pair unsharded, its two all-gathers and its "
            f"all-reduce, per module (slowest rank, {share}; {alone})"
            if "tp_gather_module" in overhead
            else "not measured (one rank: no tensor-parallel mesh)"
        )
        comments["tp_module_overhead_s"] = (
            "measured: a colwise -> rowwise pair of 8-wide nn.Linear under torch's "
            "ParallelStyles, forward and backward, less the pair unsharded and its all-reduce, "
            f"per module (slowest rank, {share}; {alone})"
            if "tp_module" in overhead
            else "not measured (one rank: no tensor-parallel mesh)"
        )
    else:
        op_ovh = bwd_ovh = sel_ovh = opt_ovh = dt_ovh = tp_ovh = gather_ovh = fsdp_ovh = 0.0
        note = (
            "0: CUDA launches are asynchronous and overlap the running kernel; measured here "
            f"{overhead['forward'] * 1e6:.3g} us forward, {overhead['backward'] * 1e6:.3g} us "
            "backward per op of host time"
        )
        if "dtensor" in overhead:
            note += f", {overhead['dtensor'] * 1e6:.3g} us per DTensor op"
        if "tp_module" in overhead:
            note += f", {overhead['tp_module'] * 1e6:.3g} us per TP-sharded linear"
        for k in (
            "op_overhead_s",
            "backward_op_overhead_s",
            "selective_op_overhead_s",
            "optimizer_op_overhead_s",
            "dtensor_op_overhead_s",
            "tp_module_overhead_s",
            "tp_gather_overhead_s",
            "fsdp_unit_overhead_s",
        ):
            comments[k] = note
    summary["op_overhead"] = overhead
    return {
        "op_overhead": op_ovh,
        "backward_op_overhead": bwd_ovh,
        "selective_op_overhead": sel_ovh,
        "optimizer_op_overhead": opt_ovh,
        "dtensor_op_overhead": dt_ovh,
        "tp_module_overhead": tp_ovh,
        "tp_gather_overhead": gather_ovh,
        "fsdp_unit_overhead": fsdp_ovh,
    }


def _capacity(
    m: Machine, s: Settings, results: list[dict[str, Any]], single: dict[str, Any], c: _Context
) -> dict[str, Any]:
    """Device memory capacity and what the context and process group reserve."""
    comments = c.comments
    if m.device == "cuda":
        capacity = min(r["device_total_bytes"] for r in results)
        reserved = max(r["context_bytes"] for r in results)
        comments["capacity_bytes"] = f"torch.cuda.mem_get_info total of {results[0]['device_name']}"
        comments["reserved_bytes"] = (
            "measured: device memory in use after the CUDA context and the NCCL process group "
            "were created (allocator fragmentation not included)"
        )
    else:
        capacity = m.host_memory_bytes / m.nproc
        reserved = max(r["rss_bytes"] for r in results)
        comments["capacity_bytes"] = (
            f"this host's {m.host_memory_bytes / 2**30:.1f} GiB MemTotal shared by {m.nproc} ranks"
        )
        comments["reserved_bytes"] = (
            "measured: the largest rank's resident set after importing torch and joining the "
            "gloo group, before any model"
        )
    return {"memory_bytes": capacity, "reserved_bytes": reserved}


def _node(
    m: Machine, s: Settings, results: list[dict[str, Any]], single: dict[str, Any], c: _Context
) -> dict[str, Any]:
    """GPUs per node, the host link (offload) and host memory bandwidth."""
    comments, summary, share = c.comments, c.summary, c.share
    stream = slowest(results, "stream")
    bandwidth = max(stream.values())
    if m.device == "cuda":
        gpus_per_node = _cuda_device_count()
        links = slowest(results, "host_link")
        host_link = 2.0 / (1.0 / links["h2d"] + 1.0 / links["d2h"])
        host_bw = max(single["stream"].values()) / gpus_per_node
        comments["gpus_per_node"] = "torch.cuda.device_count() on this host"
        comments["host_link_bytes_per_s"] = (
            f"measured: harmonic mean of pinned H2D {links['h2d'] / 1e9:.3g} and D2H "
            f"{links['d2h'] / 1e9:.3g} GB/s ({s.host_bytes >> 20} MiB, {share}; offload moves "
            "as much each way)"
        )
        comments["host_memory_bandwidth_bytes_per_s"] = (
            f"measured: one process's best host streaming rate "
            f"{max(single['stream'].values()) / 1e9:.3g} GB/s shared by {gpus_per_node} GPUs"
        )
    else:
        gpus_per_node = m.nproc
        host_link = stream["copy"]
        host_bw = bandwidth
        comments["gpus_per_node"] = (
            "the ranks this profile was measured for (gloo processes, not GPUs); "
            "calibrate with --nproc M to plan M ranks"
        )
        comments["host_link_bytes_per_s"] = (
            "measured: on a CPU, offload is a memory copy: the per-rank copy rate"
        )
        comments["host_memory_bandwidth_bytes_per_s"] = (
            "measured: the per-rank memory bandwidth (host and device memory are the same RAM)"
        )
    comments["host_memory_bytes"] = "this host's MemTotal (/proc/meminfo)"
    summary["host_link"] = host_link
    return {
        "gpus_per_node": gpus_per_node,
        "host_bandwidth": host_link,
        "host_memory_bandwidth": host_bw,
    }


def _network(
    m: Machine, s: Settings, results: list[dict[str, Any]], single: dict[str, Any], c: _Context
) -> dict[str, Any]:
    """Link bandwidth and latency (alpha-beta fits), in-situ sync and overlap.

    Long because each field's comment is written next to the measurement it cites.
    """
    comments, summary, ref, ref_name = c.comments, c.summary, c.ref, c.ref_name
    coll = collective_samples(results, "collectives")
    p2p = collective_samples(results, "p2p")
    net: dict[str, float] = {}
    if m.nproc >= 2:
        try:
            joint = fit_alpha_beta(coll)
        except ValueError as exc:
            raise MeshplanError(
                f"collective timings could not be fitted ({exc}): other processes are probably "
                "loading the machine; rerun plan calibrate when it is quieter"
            ) from exc
        each = _fits_or_none(lambda: fit_each(coll))
        link = _fits_or_none(lambda: fit_alpha_beta(p2p))
        largest = max(p2p, key=lambda x: x[2])
        link_rate = largest[2] / largest[3]  # latency included: a lower bound on the link
        link_bw = max(link_rate, joint.bandwidth)
        net["intra_node_bandwidth_bytes_per_s"] = link_bw
        net["intra_node_latency_s"] = joint.alpha
        net["collective_efficiency"] = joint.bandwidth / link_bw
        backend = "NCCL" if m.device == "cuda" else "gloo"
        sizes = sorted({x[2] for x in coll})
        size_text = f"{_size(sizes[0])}..{_size(sizes[-1])}"
        comments["intra_node_bandwidth_bytes_per_s"] = (
            f"measured: {backend} point-to-point ping-pong between 2 ranks, "
            f"{_size(largest[2])} one way at {link_rate / 1e9:.3g} GB/s ("
            + (
                f"its alpha-beta fit: alpha {link.alpha * 1e6:.3g} us, B "
                f"{link.bandwidth / 1e9:.3g} GB/s, worst point off by {link.max_rel_error:.0%}"
                if link
                else "too noisy for an alpha-beta fit"
            )
            + "); at least the collectives' bus bandwidth"
        )
        comments["intra_node_latency_s"] = (
            f"measured: joint alpha-beta least-squares fit of {backend} all-reduce, all-gather "
            f"and reduce-scatter over {m.nproc} ranks, {size_text}, worst point off by "
            f"{joint.max_rel_error:.0%}"
        )
        comments["collective_efficiency"] = (
            f"measured: the joint fit's bus bandwidth {joint.bandwidth / 1e9:.3g} GB/s / link; "
            "alone: "
            + (
                ", ".join(
                    f"{k} {f.bandwidth / 1e9:.3g} GB/s alpha {f.alpha * 1e6:.3g} us"
                    for k, f in each.items()
                )
                if each
                else "too noisy to fit each kind alone"
            )
        )
        summary.update(collective=joint, p2p=link, link_bandwidth=link_bw, per_kind=each)
        situ = collective_samples(results, "collectives_in_situ", typical=True)
        excess = [t - joint.time(kind, n, nbytes) for kind, n, nbytes, t in situ]
        net["collective_sync_s"] = max(0.0, float(np.median(excess))) if excess else 0.0
        sizes = sorted({x[2] for x in situ})
        comments["collective_sync_s"] = (
            (
                f"measured: {backend} collectives of {_size(sizes[0])}..{_size(sizes[-1])} "
                "issued after 1-10 ms of matmuls, as a training step issues them, less the "
                "back-to-back fit above; the median per call (from "
                f"{min(excess) * 1e6:.3g} to {max(excess) * 1e6:.3g} us over kinds and sizes)"
            )
            if excess
            else "not measured"
        )
        summary["samples_in_situ"] = situ
    else:
        src = ref_name if ref is not None else "h100-sxm"
        base = ref or load_profile("h100-sxm")
        net["intra_node_bandwidth_bytes_per_s"] = base.intra_node_bandwidth
        net["intra_node_latency_s"] = base.intra_node_latency
        net["collective_efficiency"] = base.collective_efficiency
        net["collective_sync_s"] = base.collective_sync
        for k in (
            "intra_node_bandwidth_bytes_per_s",
            "intra_node_latency_s",
            "collective_efficiency",
            "collective_sync_s",
        ):
            comments[k] = f"not measured (one GPU: no collective to time); from profiles/{src}.toml"
    if m.device == "cpu":
        net["inter_node_bandwidth_bytes_per_s"] = net["intra_node_bandwidth_bytes_per_s"]
        net["inter_node_latency_s"] = net["intra_node_latency_s"]
        note = "one host: no inter-node link to measure; the loopback figures above"
    else:
        base = ref or load_profile("h100-sxm")
        net["inter_node_bandwidth_bytes_per_s"] = base.inter_node_bandwidth
        net["inter_node_latency_s"] = base.inter_node_latency
        note = f"not measured (one node); from profiles/{ref_name if ref else 'h100-sxm'}.toml"
    comments["inter_node_bandwidth_bytes_per_s"] = note
    comments["inter_node_latency_s"] = note
    summary["samples"] = {"collectives": coll, "p2p": p2p}
    ov = results[0].get("comm_overlap")
    if ov is not None:
        net["comm_overlap"] = ov["overlap"]
        comments["comm_overlap"] = (
            f"measured: a {_size(OVERLAP_BYTES)} all-reduce took {ov['comm_s'] * 1e3:.3g} ms "
            f"alone, a matmul loop {ov['compute_s'] * 1e3:.3g} ms alone, both at once "
            f"{ov['both_s'] * 1e3:.3g} ms (slowest rank): this share of the shorter one hid"
        )
        summary["comm_overlap"] = ov
    elif m.device == "cpu":
        net["comm_overlap"] = 0.0
        comments["comm_overlap"] = (
            "not measured (one rank): on a CPU, collectives' threads compete with compute for "
            "the cores, so nothing is assumed to hide"
        )
    else:
        net["comm_overlap"] = (ref or load_profile("h100-sxm")).comm_overlap
        comments["comm_overlap"] = "not measured (one GPU: no collective to time); the reference's"
    return {
        "intra_node_bandwidth": net["intra_node_bandwidth_bytes_per_s"],
        "intra_node_latency": net["intra_node_latency_s"],
        "inter_node_bandwidth": net["inter_node_bandwidth_bytes_per_s"],
        "inter_node_latency": net["inter_node_latency_s"],
        "collective_efficiency": net["collective_efficiency"],
        "collective_sync": net["collective_sync_s"],
        "comm_overlap": net["comm_overlap"],
    }


def _header(m: Machine, device_text: str, samples) -> str:
    lines = [
        f"Measured by `{m.command}` on host {m.hostname} at {m.started} "
        f"({'--quick: short timings, small sizes' if m.quick else 'full run'}).",
        f"{device_text}; torch {m.torch_version}.",
    ]
    if m.device == "cpu":
        lines += [
            f"Every rate is per rank while all {m.nproc} ranks run at once (they share the "
            f"{m.cores} cores and the memory bus):",
            f"plan with --gpus {m.nproc} --profile <this file>; for another rank count, "
            "calibrate with --nproc M.",
            f"Each rank used torch.set_num_threads({m.threads}), as torchrun's "
            "OMP_NUM_THREADS=cores/ranks would.",
        ]
    lines += [
        f"1-minute load average: {m.load_average:.2f} when measuring began, "
        f"{load_average_now():.2f} when it ended (other processes lower every rate).",
        "Units: bytes, seconds, FLOP/s. Collective samples (kind, ranks, bytes: seconds, the "
        "slowest rank's, fastest of the trials; in situ: the median trial):",
    ]
    per_line: dict[tuple[str, int], list[str]] = {}
    for kind, n, nbytes, t in samples:
        per_line.setdefault((kind, n), []).append(f"{_size(nbytes)} {t * 1e6:.4g}us")
    for (kind, n), items in per_line.items():
        lines.append(f"  {kind} n={n}: " + ", ".join(items))
    return "\n".join(lines)


def load_average_now() -> float:
    """The 1-minute load average (0 where the OS has none): noise context for the header."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def _fits_or_none(fit):
    """A fit shown only in comments: None when noise leaves it undetermined."""
    try:
        return fit()
    except ValueError:
        return None


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g}{unit}"
    return f"{nbytes:g}B"


def _cuda_device_count() -> int:
    import torch

    return max(1, torch.cuda.device_count())
