"""Hardware profiles: one TOML file per device kind, every number with its source.

Shipped profiles live in ``profiles/``; measured ones (``plan calibrate``) in
``profiles/measured/``. A profile is also accepted by path. Every field is checked on load, so a
typo or a negative bandwidth is a one-line error naming the field and the file, not a wrong plan.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.atomic import write_text_atomic
from planner.errors import UserInputError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


DEVICES = ("gpu", "cpu")  # a profile's top-level ``device``

# (section, key in the file, attribute, kind, unit). Kinds: "pos" finite > 0, "nonneg" finite
# >= 0, "eff" a fraction in (0, 1], "unit" a fraction in [0, 1], "int" a positive integer. A
# "peak_flops.<dtype>" attribute is one entry of DeviceProfile.peak_flops.
FIELDS: tuple[tuple[str, str, str, str, str], ...] = (
    ("compute", "peak_flops_fp32", "peak_flops.fp32", "pos", "FLOP/s"),
    ("compute", "peak_flops_tf32", "peak_flops.tf32", "pos", "FLOP/s"),
    ("compute", "peak_flops_bf16", "peak_flops.bf16", "pos", "FLOP/s"),
    ("compute", "peak_flops_fp16", "peak_flops.fp16", "pos", "FLOP/s"),
    ("compute", "peak_flops_fp8", "peak_flops.fp8", "nonneg", "FLOP/s"),
    ("compute", "matmul_efficiency", "matmul_efficiency", "eff", "share of peak"),
    ("compute", "fp8_matmul_efficiency", "fp8_matmul_efficiency", "eff", "share of FP8 peak"),
    ("compute", "attention_efficiency", "attention_efficiency", "unit", "share of peak"),
    (
        "compute",
        "native_attention_efficiency",
        "native_attention_efficiency",
        "unit",
        "share of peak",
    ),
    (
        "compute",
        "legacy_attention_efficiency",
        "legacy_attention_efficiency",
        "unit",
        "share of peak",
    ),
    (
        "compute",
        "misaligned_matmul_efficiency",
        "misaligned_matmul_efficiency",
        "unit",
        "share of peak",
    ),
    ("compute", "elementwise_efficiency", "elementwise_efficiency", "eff", "share of bandwidth"),
    ("compute", "matmul_half_inner_dim", "matmul_half_inner_dim", "nonneg", "elements"),
    ("compute", "op_overhead_s", "op_overhead", "nonneg", "seconds per op"),
    ("compute", "backward_op_overhead_s", "backward_op_overhead", "nonneg", "seconds per op"),
    ("compute", "selective_op_overhead_s", "selective_op_overhead", "nonneg", "seconds per op"),
    ("compute", "optimizer_op_overhead_s", "optimizer_op_overhead", "nonneg", "seconds per op"),
    ("compute", "dtensor_op_overhead_s", "dtensor_op_overhead", "nonneg", "seconds per op"),
    ("compute", "tp_module_overhead_s", "tp_module_overhead", "nonneg", "seconds per module"),
    ("compute", "tp_gather_overhead_s", "tp_gather_overhead", "nonneg", "seconds per module"),
    ("compute", "fsdp_unit_overhead_s", "fsdp_unit_overhead", "nonneg", "seconds per unit"),
    ("memory", "capacity_bytes", "memory_bytes", "pos", "bytes"),
    ("memory", "bandwidth_bytes_per_s", "memory_bandwidth", "pos", "bytes/s"),
    ("memory", "reserved_bytes", "reserved_bytes", "nonneg", "bytes"),
    ("memory", "allocator_overhead", "allocator_overhead", "nonneg", "share of the peak"),
    ("node", "gpus_per_node", "gpus_per_node", "int", "devices"),
    ("node", "host_memory_bytes", "host_memory_bytes", "pos", "bytes"),
    ("node", "host_link_bytes_per_s", "host_bandwidth", "pos", "bytes/s"),
    ("node", "host_memory_bandwidth_bytes_per_s", "host_memory_bandwidth", "pos", "bytes/s"),
    ("network", "intra_node_bandwidth_bytes_per_s", "intra_node_bandwidth", "pos", "bytes/s"),
    ("network", "intra_node_latency_s", "intra_node_latency", "nonneg", "seconds"),
    ("network", "inter_node_bandwidth_bytes_per_s", "inter_node_bandwidth", "pos", "bytes/s"),
    ("network", "inter_node_latency_s", "inter_node_latency", "nonneg", "seconds"),
    ("network", "collective_efficiency", "collective_efficiency", "eff", "share of link"),
    ("network", "collective_sync_s", "collective_sync", "nonneg", "seconds per call"),
    ("network", "comm_overlap", "comm_overlap", "unit", "share of compute comm can hide behind"),
    ("network", "async_tp_overlap", "async_tp_overlap", "unit", "share of TP collectives hidden"),
)
SECTIONS = ("compute", "memory", "node", "network")
# file key -> default. The per-op overheads are host time an eager op costs besides its
# roofline time: real on a CPU, where dispatch runs in line with the math; hidden on a GPU, whose
# asynchronous launches overlap the running kernel (so the shipped GPU profiles leave them 0).
OPTIONAL: dict[str, float] = {
    "reserved_bytes": 0.0,
    # What torch's caching allocator holds beyond the allocated peak (fragmentation and cached
    # blocks: max_memory_reserved / max_memory_allocated - 1), which nvidia-smi and
    # torch's max_reserved count; 0: not known (a CPU has no caching allocator).
    "allocator_overhead": 0.0,
    # FP8 tensor-core rate (0: the device has none) and the share of it FP8 GEMMs reach.
    "peak_flops_fp8": 0.0,
    "fp8_matmul_efficiency": 1.0,
    # A fused attention kernel's achieved share of the 16-bit peak on the work it does
    # (cost.compute.op_rate); 0: priced as any matrix product (no separate measurement).
    "attention_efficiency": 0.0,
    # The same for the chip's own fused attention kernel (cuDNN/FlashAttention-3 on Hopper),
    # where a framework runs it (Training.native_attention); 0: none beyond attention_efficiency.
    "native_attention_efficiency": 0.0,
    # The same for flash-attention builds that predate the chip (2023's on Hopper, as
    # llm-foundry's MPT benchmarks ran), where a framework runs one (Training.legacy_attention);
    # 0: as attention_efficiency.
    "legacy_attention_efficiency": 0.0,
    # A 16-bit product of two activations with a dimension that is not a multiple of 8
    # elements (16 bytes) runs cuBLAS's unaligned path at this share of the 16-bit peak
    # (cost.compute.misaligned); 0: at matmul_efficiency like any product.
    "misaligned_matmul_efficiency": 0.0,
    # A GEMM reducing over K runs at K / (K + this) of matmul_efficiency's asymptotic rate.
    "matmul_half_inner_dim": 0.0,
    "op_overhead_s": 0.0,
    "backward_op_overhead_s": 0.0,
    "selective_op_overhead_s": 0.0,
    "optimizer_op_overhead_s": 0.0,
    "dtensor_op_overhead_s": 0.0,
    "tp_module_overhead_s": 0.0,
    "tp_gather_overhead_s": 0.0,
    "fsdp_unit_overhead_s": 0.0,
    # How much of the compute time data-parallel communication can hide behind. 1 on a GPU
    # (collectives run on their own stream and SMs); near 0 on a CPU whose ranks fill its cores,
    # where gloo's threads take their cycles from the compute.
    "comm_overlap": 1.0,
    # What one blocking collective costs between compute phases beyond its ring (ranks arriving
    # apart, the waiting one woken): measured by plan calibrate; the shipped GPU profiles have
    # no measurement of it and keep 0.
    "collective_sync_s": 0.0,
    # The most of the TP collectives torch's async TP hides behind the products it
    # micro-pipelines (cost.compute.tp_exposed); 1: no measurement, bounded by compute alone.
    "async_tp_overlap": 1.0,
}
# What a written profile says of the keys no measurement fills (plan calibrate times neither
# FP8 products nor fused attention kernels): their defaults and what those mean.
UNMEASURED_NOTES = {
    "peak_flops_fp8": "not measured: 0 = FP8 linears run at the 16-bit rate",
    "fp8_matmul_efficiency": "not measured: unused without an FP8 peak",
    "attention_efficiency": "not measured: 0 = fused attention priced as a matrix product",
    "native_attention_efficiency": "not measured: 0 = as attention_efficiency",
    "legacy_attention_efficiency": "not measured: 0 = as attention_efficiency",
    "misaligned_matmul_efficiency": "not measured: 0 = unaligned products as any product",
    "async_tp_overlap": "not measured: 1 = async TP bounded by compute alone",
    "allocator_overhead": (
        "not measured (a training run's, not a kernel's: benchmarks/gpu_accuracy.py reads it); "
        "0 = the allocator holds only the allocated peak"
    ),
}
# A key a profile may lack -> the key of the same section whose value stands in for it: a
# profile measured before the key existed prices as it did (a gathered column-parallel module
# as any TP module), not at the optional default.
STANDS_IN = {"tp_gather_overhead_s": "tp_module_overhead_s"}
_NEED = {
    "pos": "a positive finite number",
    "nonneg": "a finite number >= 0",
    "eff": "a fraction in (0, 1]",
    "unit": "a fraction in [0, 1]",
    "int": "a positive integer",
}


@dataclass(frozen=True)
class DeviceProfile:
    """One device kind and the node and network it sits in; all figures in bytes and seconds.

    ``peak_flops`` is dense FLOP/s keyed "fp32", "tf32", "bf16", "fp16" and "fp8" (absent: none).
    ``source`` is where the profile was loaded from; it is not part of equality, so a profile
    written elsewhere and read back compares equal.
    """

    name: str
    description: str
    peak_flops: dict[str, float] = field(hash=False)
    matmul_efficiency: float
    elementwise_efficiency: float
    matmul_half_inner_dim: float
    op_overhead: float
    backward_op_overhead: float
    selective_op_overhead: float
    optimizer_op_overhead: float
    dtensor_op_overhead: float
    tp_module_overhead: float
    tp_gather_overhead: float
    fsdp_unit_overhead: float
    memory_bytes: float
    memory_bandwidth: float
    reserved_bytes: float
    gpus_per_node: int
    host_memory_bytes: float
    host_bandwidth: float
    host_memory_bandwidth: float
    intra_node_bandwidth: float
    intra_node_latency: float
    inter_node_bandwidth: float
    inter_node_latency: float
    collective_efficiency: float
    collective_sync: float
    comm_overlap: float
    # FP8 GEMMs' share of the FP8 peak; a fused attention kernel's share of the 16-bit peak
    # (0: priced as a matrix product). Defaults keep profiles built in code as before.
    fp8_matmul_efficiency: float = 1.0
    attention_efficiency: float = 0.0
    native_attention_efficiency: float = 0.0
    legacy_attention_efficiency: float = 0.0
    misaligned_matmul_efficiency: float = 0.0
    allocator_overhead: float = 0.0
    async_tp_overlap: float = 1.0
    # Where the ranks compute: "gpu" (CUDA; the runtime steps the optimizer with torch's fused
    # kernel there) or "cpu" (gloo ranks; torch's per-tensor optimizer step).
    device: str = "gpu"
    source: str = field(default="", compare=False)


def profiles_dir() -> Path:
    """The shipped profiles, beside the package (a source checkout or an editable install)."""
    return Path(__file__).resolve().parents[2] / "profiles"


def list_profiles() -> list[str]:
    """Names ``load_profile`` accepts: shipped ones, then measured ones as ``measured/<name>``."""
    root = profiles_dir()
    names = sorted(p.stem for p in root.glob("*.toml"))
    names += sorted(f"measured/{p.stem}" for p in (root / "measured").glob("*.toml"))
    return names


def load_profile(name_or_path: str) -> DeviceProfile:
    """A profile by name (``h100-sxm``, ``measured/<name>``) or by path to a ``.toml`` file.

    Raises UserInputError naming the file and the field for anything that would otherwise give a
    silently wrong plan: unknown name, unreadable file, bad TOML, missing or invalid field.
    """
    text = str(name_or_path)
    if text in list_profiles():
        path = profiles_dir() / f"{text}.toml"
    elif text.endswith(".toml") or "/" in text or "\\" in text:
        path = Path(text)
        if not path.is_file():
            raise UserInputError(
                f"profile file {text} does not exist: give the path to a .toml profile or one of "
                f"the names {', '.join(list_profiles())}"
            )
    else:
        raise UserInputError(
            f"unknown profile {text!r}: choose one of {', '.join(list_profiles())}, "
            "or give the path to a .toml file"
        )
    return profile_from_dict(read_toml(path, "profile", "; fix the file"), str(path))


def read_toml(path: Path, what: str, hint: str = "") -> dict[str, Any]:
    """A TOML file's contents; a one-line UserInputError naming ``what`` it is when it cannot
    be read or parsed (``hint`` follows the parser's message)."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise UserInputError(f"{what} {path} is not valid TOML: {exc}{hint}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise UserInputError(f"{what} {path} cannot be read: {exc}") from exc


def profile_from_dict(data: dict[str, Any], source: str) -> DeviceProfile:
    """Validate the TOML-shaped mapping (as in the files) and build the profile."""
    strings = {}
    for key in ("name", "description"):
        value = data.get(key)
        if not isinstance(value, str) or (key == "name" and not value.strip()):
            raise UserInputError(
                f"profile {source}: top-level {key} must be a "
                f'{"non-empty " if key == "name" else ""}string, e.g. {key} = "..."; add it'
            )
        strings[key] = value
    device = data.get("device", "gpu")
    if device not in DEVICES:
        raise UserInputError(
            f"profile {source}: top-level device = {device!r} must be one of "
            f"{', '.join(map(repr, DEVICES))} (where the ranks compute); fix it or leave it out"
        )
    strings["device"] = device
    for section in SECTIONS:
        table = data.get(section, {})
        if not isinstance(table, dict):
            raise UserInputError(f"profile {source}: [{section}] must be a table of numbers")
        known = {key for sec, key, *_ in FIELDS if sec == section}
        unknown = sorted(set(table) - known)
        if unknown:
            raise UserInputError(
                f"profile {source}: unknown key [{section}] {unknown[0]}: the keys of "
                f"[{section}] are {', '.join(sorted(known))}"
            )
    values: dict[str, Any] = {"peak_flops": {}}
    for section, key, attr, kind, unit in FIELDS:
        raw = data.get(section, {}).get(key)
        if raw is None and key in STANDS_IN:
            raw = data.get(section, {}).get(STANDS_IN[key])
        if raw is None:
            if key in OPTIONAL:
                raw = OPTIONAL[key]
            else:
                raise UserInputError(
                    f"profile {source} lacks [{section}] {key} ({unit}): add it; "
                    f"see {profiles_dir() / 'h100-sxm.toml'} for the format"
                )
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise UserInputError(
                f"profile {source}: [{section}] {key} = {raw!r} must be {_NEED[kind]} ({unit})"
            )
        value = float(raw)
        bad = (
            not math.isfinite(value)
            or (kind in ("pos", "int") and value <= 0)
            or (kind == "nonneg" and value < 0)
            or (kind == "eff" and not 0 < value <= 1)
            or (kind == "unit" and not 0 <= value <= 1)
            or (kind == "int" and value != int(value))
        )
        if bad:
            raise UserInputError(
                f"profile {source}: [{section}] {key} = {raw} must be {_NEED[kind]} ({unit})"
            )
        if attr.startswith("peak_flops."):
            if value > 0:  # an optional rate left at 0 (no FP8 units) is no entry
                values["peak_flops"][attr.split(".", 1)[1]] = value
        else:
            values[attr] = int(value) if kind == "int" else value
    return DeviceProfile(**strings, **values, source=source)


def profile_to_dict(p: DeviceProfile) -> dict[str, Any]:
    """The TOML-shaped mapping of the files (plus ``source``); ``profile_from_dict`` inverts it."""
    out: dict[str, Any] = {
        "name": p.name,
        "description": p.description,
        "device": p.device,
        "source": p.source,
    }
    for section, key, attr, kind, _ in FIELDS:
        if attr.startswith("peak_flops."):
            value = p.peak_flops.get(attr.split(".", 1)[1], 0.0)
        else:
            value = getattr(p, attr)
        out.setdefault(section, {})[key] = int(value) if kind == "int" else float(value)
    return out


def profile_to_toml(
    p: DeviceProfile, comments: dict[str, str] | None = None, header: str = ""
) -> str:
    """The shipped file format, written by hand (flat tables of numbers need no TOML library).

    ``comments`` maps a file key to its source note; ``header`` becomes leading ``#`` lines.
    """
    comments = comments or {}
    data = profile_to_dict(p)
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += [f"name = {_toml_string(p.name)}", f"description = {_toml_string(p.description)}"]
    lines += [f"device = {_toml_string(p.device)}"]
    for section in SECTIONS:
        lines += ["", f"[{section}]"]
        for key, value in data[section].items():
            note = comments.get(key) or UNMEASURED_NOTES.get(key)
            lines.append(f"{key} = {value!r}" + (f"  # {note}" if note else ""))
    return "\n".join(lines) + "\n"


def write_profile(
    p: DeviceProfile,
    path: str | Path,
    comments: dict[str, str] | None = None,
    header: str = "",
) -> None:
    """Write ``p`` atomically in the shipped format; it is validated first, so a bad measured
    figure fails here rather than on the next load."""
    path = Path(path)
    profile_from_dict(profile_to_dict(p), str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, profile_to_toml(p, comments, header))


def default_profile_name() -> tuple[str, str]:
    """The local GPU's shipped profile when torch sees one, otherwise h100-sxm; with the reason
    (shown to the user, since a wrong default silently changes every plan)."""
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
            total = torch.cuda.get_device_properties(0).total_memory
            upper = gpu.upper()
            if "H200" in upper:
                return "h200", f"local GPU {gpu}"
            if "H100" in upper:
                return "h100-sxm", f"local GPU {gpu}"
            if "A100" in upper:
                kind = "a100-80g" if total > 60e9 else "a100-40g"
                return kind, f"local GPU {gpu} with {total / 2**30:.0f} GiB"
            if "V100" in upper:
                return "v100-16g", f"local GPU {gpu}"
            return "h100-sxm", (
                f"local GPU {gpu} has no shipped profile; using h100-sxm "
                "(set --profile, or run plan calibrate)"
            )
    except Exception:  # a broken CUDA setup must not stop planning for another cluster
        pass
    return "h100-sxm", "no GPU visible to torch; using h100-sxm (set --profile to change)"


def _toml_string(text: str) -> str:
    """A TOML basic string: backslash, quote and control characters escaped."""
    out = []
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
