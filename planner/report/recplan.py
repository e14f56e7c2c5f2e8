"""``plan show`` for a recommendation plan (``"schema": "meshplan.recplan/1"``).

A recommendation plan's unit is the embedding table, not the pipeline stage, so the dense
plan's figures (stages, pipeline timeline) have nothing to draw. What a person needs to read
is which option each table runs as and on which ranks, and what each rank then carries: the
tables as rows (option, TorchRec kernel, ranks, predicted seconds and bytes per
shard's rank) and the ranks as rows (shards, predicted step, device and host memory).

The report reads the plan file and nothing else; the layer rules keep it from importing
``planner.recsys`` (which checks plans for the runtime), so it checks here only the fields it
shows, and anything it cannot show is a one-line ``UserInputError``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.table import Table

from planner.errors import UserInputError
from planner.report.console import console, human_bytes, human_count, human_time
from planner.vocab import DenseStrategy

SCHEMA = "meshplan.recplan/1"
TABLE_FIELDS = {"name": str, "option": str, "sharding": str, "kernel": str, "ranks": list,
                "rows": int, "dim": int, "lookup_s": (int, float), "comm_s": (int, float),
                "device_bytes": (int, float)}  # fmt: skip
RANK_FIELDS = {"rank": int, "step_s": (int, float), "lookup_s": (int, float),
               "comm_s": (int, float), "device_bytes": (int, float),
               "host_bytes": (int, float)}  # fmt: skip
PREDICTED_FIELDS = {"step_time_s": (int, float), "samples_per_s": (int, float),
                    "peak_device_bytes": (int, float),
                    "device_capacity_bytes": (int, float)}  # fmt: skip


def read_recplan(path: Path) -> dict[str, Any] | None:
    """The plan as a dict when ``path`` holds a recommendation plan; None for anything else
    (a dense plan, a file that is no JSON), which the dense reader then reads or refuses with
    its own one-line error; a one-line error for a recommendation plan missing a field this
    view shows."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return None
    _check(doc, path)
    return doc


def _check(doc: dict[str, Any], path: Path) -> None:
    def need(obj: Any, fields: dict[str, Any], where: str) -> None:
        if not isinstance(obj, dict):
            raise UserInputError(f"plan {path}: {where} is not an object; plan again")
        for key, kind in fields.items():
            value = obj.get(key)
            if isinstance(value, bool) or not isinstance(value, kind):
                raise UserInputError(
                    f"plan {path}: {where} has no valid {key!r} (got {value!r}); plan again"
                )

    for key in ("tables", "ranks"):
        if not isinstance(doc.get(key), list) or not doc[key]:
            raise UserInputError(f"plan {path}: {key!r} must be a non-empty list; plan again")
    for t in doc["tables"]:
        need(t, TABLE_FIELDS, f"table {t.get('name', '?') if isinstance(t, dict) else t!r}")
    for r in doc["ranks"]:
        need(r, RANK_FIELDS, "a rank entry")
    need(doc.get("predicted"), PREDICTED_FIELDS, "'predicted'")
    need(doc.get("cluster"), {"gpus": int, "profile": str}, "'cluster'")
    world = doc["cluster"]["gpus"]
    for t in doc["tables"]:
        if not all(isinstance(r, int) and 0 <= r < world for r in t["ranks"]) or not t["ranks"]:
            raise UserInputError(
                f"plan {path}: table {t['name']!r} has ranks {t['ranks']!r}, not ranks below "
                f"{world}; plan again"
            )


def ranks_label(ranks: list[int], world: int) -> str:
    """'all' for every rank, else the ranks, runs of consecutive ranks as a-b."""
    if len(ranks) == world and world > 1:
        return "all"
    out, start = [], ranks[0]
    for prev, cur in zip(ranks, [*ranks[1:], None]):
        if cur != prev + 1:
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur
    return ",".join(out)


def print_recplan(doc: dict[str, Any], quiet: bool = False) -> None:
    """The tables x option x ranks table, the per-rank table, and the predicted step."""
    out = console(quiet)
    c, p = doc["cluster"], doc["predicted"]
    world = c["gpus"]
    tables = Table(
        title=(
            f"{len(doc['tables'])} tables on {world} x {c['profile']} "
            f"({doc.get('device', '?')}), global batch {doc.get('global_batch_size', '?')}"
        )
    )
    for col in ("table", "rows", "dim", "option", "kernel", "ranks", "lookup", "all-to-all",
                "memory/rank"):  # fmt: skip
        tables.add_column(col, justify="left" if col in ("table", "option", "kernel") else "right")
    for t in doc["tables"]:
        tables.add_row(
            t["name"],
            human_count(t["rows"]),
            str(t["dim"]),
            t["option"],
            t["kernel"],
            ranks_label(sorted(t["ranks"]), world),
            human_time(t["lookup_s"]),
            human_time(t["comm_s"]),
            human_bytes(t["device_bytes"]),
        )
    out.print(tables)
    shards = [0] * world
    for t in doc["tables"]:
        for r in t["ranks"]:
            shards[r] += 1
    ranks = Table(title="ranks")
    for col in ("rank", "shards", "step", "lookups", "all-to-all", "device mem", "host mem"):
        ranks.add_column(col, justify="right")
    slowest = max(r["step_s"] for r in doc["ranks"])
    for r in sorted(doc["ranks"], key=lambda r: r["rank"]):
        step = human_time(r["step_s"])
        ranks.add_row(
            str(r["rank"]),
            str(shards[r["rank"]] if 0 <= r["rank"] < world else "?"),
            f"[bold]{step}[/bold]" if r["step_s"] == slowest else step,
            human_time(r["lookup_s"]),
            human_time(r["comm_s"]),
            human_bytes(r["device_bytes"]),
            human_bytes(r["host_bytes"]),
        )
    out.print(ranks)
    dense = doc.get("dense") or {}
    if isinstance(dense.get("strategy"), str):
        label = DenseStrategy(dense["strategy"]).label()
        out.print(f"dense part: {label}")
    solver = doc.get("solver") or {}
    gap = solver.get("gap")
    out.print(
        f"predicted step {human_time(p['step_time_s'])} ({p['samples_per_s']:,.0f} samples/s); "
        f"peak device memory {human_bytes(p['peak_device_bytes'])} of "
        f"{human_bytes(p['device_capacity_bytes'])}"
        + (f"; solver {solver.get('status')}, gap {gap * 100:.3f}%" if gap is not None else "")
    )
