"""Exports: one plan translated into the configuration of an engine users already run
(torchtitan, Megatron-LM, DeepSpeed, Accelerate). Each engine's module is a pure function
``Plan -> Export`` (its files, and the sentences saying what it could not express as planned);
``write_exports`` puts the files beside plan.json.

    plan MODEL --gpus 64 --export megatron --export deepspeed
    plan export PLAN.json torchtitan
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

from planner.errors import UserInputError
from planner.export import accelerate, deepspeed, megatron, torchtitan
from planner.export.engines import ENGINES
from planner.export.facts import plan_facts
from planner.export.types import Export
from planner.schema.plan import Plan

_EXPORTERS: dict[str, Callable] = {
    "torchtitan": torchtitan.export,
    "megatron": megatron.export,
    "deepspeed": deepspeed.export,
}

__all__ = ["ENGINES", "Export", "export_plan", "write_exports"]


def export_plan(plan: Plan, engine: str) -> Export:
    """The plan in ``engine``'s vocabulary."""
    if engine not in ENGINES:
        raise UserInputError(f"unknown engine {engine!r}: choose one of {', '.join(ENGINES)}")
    facts = plan_facts(plan)
    if engine == "accelerate":
        layer_class = Counter(b.block_class for b in plan.blocks).most_common(1)[0][0]
        return accelerate.export(plan, facts, layer_class)
    return _EXPORTERS[engine](plan, facts)


# Beside the exported files: the names meshplan wrote there, so a later export may replace
# them (and only them, or files that name meshplan).
MANIFEST = ".meshplan-exports"


def write_exports(plan: Plan, engines: list[str], out_dir: Path) -> list[tuple[Export, list[Path]]]:
    """Each engine's files written into ``out_dir`` (beside plan.json); returns what was
    written per export. Files meshplan did not write are never replaced."""
    return [(result, write_files(result, out_dir)) for result in
            (export_plan(plan, e) for e in dict.fromkeys(engines))]  # fmt: skip


def write_files(result: Export, out_dir: Path) -> list[Path]:
    """An export's (or launch file's) files in ``out_dir``, refusing to replace a user's."""
    manifest = out_dir / MANIFEST
    ours = set(manifest.read_text().split()) if manifest.is_file() else set()
    paths = []
    for name, text in result.files.items():
        path = out_dir / name
        if path.exists() and name not in ours and not _names_meshplan(path):
            raise UserInputError(
                f"{path} exists and was not written by meshplan: move it, or --out elsewhere"
            )
        path.write_text(text)
        paths.append(path)
        ours.add(name)
    manifest.write_text("\n".join(sorted(ours)) + "\n")
    return paths


def _names_meshplan(path: Path) -> bool:
    try:
        return "meshplan" in path.read_text()[:2000]
    except (OSError, UnicodeDecodeError):
        return False
