"""``--resources POOL.toml``: the node types a run may use, read into validated dataclasses.

Every field a price or an energy figure comes from is named in the file, so a wrong number is
visible where it was typed; anything missing or out of range is a one-line UserInputError (exit
2) naming the node type and the field, never a silently wrong choice.

    effective_time_fraction = 0.90      # optional, default below
    [[node]]
    name = "dgx-h100"
    profile = "h100-sxm"                # a device profile (profiles/*.toml)
    nodes = 4                           # how many nodes are available
    gpus_per_node = 8                   # optional: the profile's
    price_per_gpu_hour = 2.49           # $ per GPU-hour (0 for owned hardware)
    gpu_busy_watts = 700                # per GPU at full utilization
    gpu_idle_watts = 100                # optional: per GPU at zero utilization (default: busy)
    node_watts = 4600                   # per node, outside the GPUs (CPUs, NICs, fans...)
    carbon_g_per_kwh = 390              # grid intensity
    pue = 1.58                          # facility power usage effectiveness
    [[fabric]]                          # optional: the network between two node types
    between = ["dgx-a100", "dgx-h100"]  # two node names of this pool
    bandwidth_bytes_per_s = 2.5e10      # per GPU, one way (its NIC's share of the fabric)
    latency_s = 1e-5                    # per message

Only node types joined by a fabric may share one job (a heterogeneous pipeline sends each
boundary's activations over it); without one, each kind is planned on its own.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from planner.errors import UserInputError

# Meta's Llama 3 report (Dubey et al. 2024, "The Llama 3 Herd of Models", Sec. 3.3.4) states
# higher than 90% effective training time through 466 interruptions in 54 days: the share of
# wall-clock time spent training, the rest going to checkpoints, restarts and lost work.
DEFAULT_EFFECTIVE_TIME_FRACTION = 0.90


@dataclass(frozen=True)
class NodeType:
    """One kind of node on offer: what it is, how many there are, what an hour of it costs."""

    name: str
    profile: str
    nodes: int
    gpus_per_node: int
    price_per_gpu_hour: float
    gpu_busy_watts: float
    gpu_idle_watts: float
    node_watts: float
    carbon_g_per_kwh: float
    pue: float


@dataclass(frozen=True)
class Fabric:
    """The link between two node types: what a pipeline hop from one to the other runs at."""

    between: tuple[str, str]
    bandwidth_bytes_per_s: float
    latency_s: float


@dataclass(frozen=True)
class Pool:
    """The node types of one pool file, the fabric between them, and the share of wall time
    that trains."""

    path: str
    node_types: tuple[NodeType, ...]
    effective_time_fraction: float = DEFAULT_EFFECTIVE_TIME_FRACTION
    fabric: tuple[Fabric, ...] = ()
    # where each figure is typed: node name -> field -> line of ``path`` ("" holds top-level keys)
    lines: dict[str, dict[str, int]] = field(default_factory=dict, compare=False)

    def link(self, a: str, b: str) -> Fabric | None:
        """The fabric between node types ``a`` and ``b`` (either order), None when absent."""
        return next((f for f in self.fabric if set(f.between) == {a, b}), None)


_NUMBERS = {
    # field: (lowest allowed, whether the lowest is allowed itself)
    "price_per_gpu_hour": (0.0, True),
    "gpu_busy_watts": (0.0, False),
    "gpu_idle_watts": (0.0, True),
    "node_watts": (0.0, True),
    "carbon_g_per_kwh": (0.0, True),
    "pue": (1.0, True),
}
_REQUIRED = ("name", "profile", "nodes", *(k for k in _NUMBERS if k != "gpu_idle_watts"))
_KNOWN = {*_REQUIRED, "gpu_idle_watts", "gpus_per_node"}


def load_pool(path: str | Path) -> Pool:
    """Read and validate a pool file; UserInputError (one line) for anything wrong."""
    p = Path(path)
    if not p.is_file():
        raise UserInputError(f"--resources {p}: no such file; give a pool .toml (profiles/pools/)")
    from planner.hardware.profiles import read_toml

    pool = pool_from_dict(read_toml(p, "pool"), str(p))
    return replace(pool, lines=figure_lines(p.read_text()))


_KEY = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=")
_NAME = re.compile(r'^\s*name\s*=\s*"([^"]*)"')


def figure_lines(text: str) -> dict[str, dict[str, int]]:
    """The line each figure of a pool file is typed on, by node name and field ("" holds the
    top-level keys): every number the choice prints can name the line it came from."""
    found: dict[str, dict[str, int]] = {"": {}}
    table: dict[str, int] | None = found[""]  # where keys go: top level, a [[node]], or nowhere
    for number, line in enumerate(text.splitlines(), start=1):
        head = line.split("#", 1)[0].strip()
        if head.startswith("["):
            table = {} if head == "[[node]]" else None
            continue
        key = _KEY.match(line)
        if key is None or table is None:
            continue
        table[key.group(1)] = number
        named = _NAME.match(line)
        if named and table is not found[""]:
            found[named.group(1)] = table
    return found


def figure_records(pool: Pool, kinds: list[str]) -> list[dict[str, Any]]:
    """For each node type of ``kinds``, each figure the run's time, money, energy and carbon
    were priced with and where it came from: ``source`` is ``<pool file>:<line>``, the profile
    file, or what stood in for a figure the file does not set."""
    from planner.hardware.profiles import profiles_dir

    records: list[dict[str, Any]] = []
    for t in pool.node_types:
        if t.name not in kinds:
            continue
        at = pool.lines.get(t.name, {})
        for key in _NUMBERS:
            value = getattr(t, key)
            if key in at:
                records.append(_record(t.name, key, value, at[key], f"{pool.path}:{at[key]}"))
            elif key == "gpu_idle_watts":
                records.append(_record(t.name, key, value, None, "not set: gpu_busy_watts"))
        profile = os.path.relpath(profiles_dir() / f"{t.profile}.toml")
        records.append(_record(t.name, "step time", t.profile, None, profile))
    frac = pool.lines.get("", {}).get("effective_time_fraction")
    where = f"{pool.path}:{frac}" if frac else "the default, planner/resources/pool.py"
    records.append(
        _record("", "effective_time_fraction", pool.effective_time_fraction, frac, where)
    )
    return records


def _record(kind: str, name: str, value: Any, line: int | None, source: str) -> dict[str, Any]:
    return {"kind": kind, "figure": name, "value": value, "line": line, "source": source}


def figure_sources(pool: Pool, kinds: list[str]) -> str:
    """One line naming, for each node type of ``kinds``, each figure the run's time, money,
    energy and carbon were priced with and the line of the pool file it came from."""
    parts: dict[str, list[str]] = {}
    for r in figure_records(pool, kinds):
        if r["figure"] == "step time":
            text = f"step time from profile {r['value']} ({r['source']})"
        elif r["line"] is not None:
            text = f"{r['figure']} {r['value']:g} (line {r['line']})"
        else:
            text = f"{r['figure']} {r['value']:g} ({r['source']})"
        parts.setdefault(r["kind"], []).append(text)
    shown = [f"{k}: " + ", ".join(v) for k, v in parts.items() if k] + parts[""]
    return f"{pool.path}: " + "; ".join(shown)


def pool_from_dict(data: dict[str, Any], source: str) -> Pool:
    """Validate a parsed pool document (split from ``load_pool`` so tests need no files)."""
    from planner.hardware.profiles import list_profiles

    unknown = set(data) - {"node", "effective_time_fraction", "fabric"}
    if unknown:
        raise UserInputError(
            f"pool {source}: unknown top-level key(s) {', '.join(sorted(unknown))}"
        )
    frac = data.get("effective_time_fraction", DEFAULT_EFFECTIVE_TIME_FRACTION)
    if not _is_number(frac) or not 0 < frac <= 1:
        raise UserInputError(
            f"pool {source}: effective_time_fraction must be in (0, 1], got {frac!r}"
        )
    rows = data.get("node")
    if not isinstance(rows, list) or not rows:
        raise UserInputError(f"pool {source}: no [[node]] tables; list at least one node type")
    types: list[NodeType] = []
    for i, row in enumerate(rows):
        where = f"pool {source}: node {row.get('name', i + 1)!r}" if isinstance(row, dict) else ""
        if not isinstance(row, dict):
            raise UserInputError(f"pool {source}: node {i + 1} is not a table")
        missing = [k for k in _REQUIRED if k not in row]
        if missing:
            raise UserInputError(f"{where}: missing field(s) {', '.join(missing)}")
        extra = set(row) - _KNOWN
        if extra:
            raise UserInputError(f"{where}: unknown field(s) {', '.join(sorted(extra))}")
        profile = row["profile"]
        if not isinstance(profile, str) or profile not in list_profiles():
            raise UserInputError(
                f"{where}: unknown profile {profile!r}; choose one of {', '.join(list_profiles())}"
            )
        for key in ("nodes", "gpus_per_node"):
            value = row.get(key, 1)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise UserInputError(f"{where}: {key} must be a positive integer, got {value!r}")
        numbers = {}
        for key, (low, inclusive) in _NUMBERS.items():
            value = row.get(key, row["gpu_busy_watts"] if key == "gpu_idle_watts" else None)
            ok = _is_number(value) and (value >= low if inclusive else value > low)
            if not ok:
                bound = f">= {low:g}" if inclusive else f"> {low:g}"
                raise UserInputError(f"{where}: {key} must be a number {bound}, got {value!r}")
            numbers[key] = float(value)
        if numbers["gpu_idle_watts"] > numbers["gpu_busy_watts"]:
            raise UserInputError(f"{where}: gpu_idle_watts exceeds gpu_busy_watts")
        name = row["name"]
        if not isinstance(name, str) or not name or any(t.name == name for t in types):
            raise UserInputError(f"{where}: name must be a non-empty string, unique in the pool")
        per_node = row.get("gpus_per_node") or _profile_gpus_per_node(profile)
        types.append(NodeType(name, profile, row["nodes"], per_node, **numbers))
    fabric = _fabric(data.get("fabric", []), types, source)
    return Pool(source, tuple(types), float(frac), fabric)


def _fabric(rows: object, types: list[NodeType], source: str) -> tuple[Fabric, ...]:
    """Validate the [[fabric]] tables: two distinct node names each, one table per pair."""
    if not isinstance(rows, list):
        raise UserInputError(f"pool {source}: fabric must be a list of [[fabric]] tables")
    names = {t.name for t in types}
    found: list[Fabric] = []
    for i, row in enumerate(rows):
        where = f"pool {source}: fabric {i + 1}"
        if not isinstance(row, dict):
            raise UserInputError(f"{where} is not a table")
        extra = set(row) - {"between", "bandwidth_bytes_per_s", "latency_s"}
        if extra:
            raise UserInputError(f"{where}: unknown field(s) {', '.join(sorted(extra))}")
        pair = row.get("between")
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not all(isinstance(n, str) and n in names for n in pair)
            or pair[0] == pair[1]
        ):
            raise UserInputError(
                f"{where}: between must name two different node types of the pool, got {pair!r}"
            )
        bw, lat = row.get("bandwidth_bytes_per_s"), row.get("latency_s")
        if not _is_number(bw) or bw <= 0:
            raise UserInputError(f"{where}: bandwidth_bytes_per_s must be a number > 0, got {bw!r}")
        if not _is_number(lat) or lat < 0:
            raise UserInputError(f"{where}: latency_s must be a number >= 0, got {lat!r}")
        if any(set(f.between) == set(pair) for f in found):
            raise UserInputError(f"{where}: a second fabric between {pair[0]} and {pair[1]}")
        found.append(Fabric((pair[0], pair[1]), float(bw), float(lat)))
    return tuple(found)


def _profile_gpus_per_node(profile: str) -> int:
    from planner.hardware.profiles import load_profile

    return load_profile(profile).gpus_per_node


def _is_number(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )
