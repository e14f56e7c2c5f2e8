"""What an export returns: the engine's files, what of the plan it could not say as is, and
the plan as the engine will run it (``AsRun``, which ``planner.export.pricing`` prices)."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.schema.mesh import Mesh


@dataclass(frozen=True)
class AsRun:
    """The plan's decisions as the engine carries them out: where an export changes one (a
    ZeRO stage the engine lacks, one recompute policy for every layer, an even stage cut), the
    engine's, else the plan's. Layers are the plan's repeated blocks (``PlanFacts``)."""

    mesh: Mesh
    zero_stage: int
    schedule: str  # vocab.Schedule
    virtual_stages: int
    layers_per_stage: tuple[int, ...]  # per (virtual) stage
    layer_recompute: tuple[str, ...]  # per layer, vocab.Recompute
    other_recompute: tuple[str, ...]  # the non-layer blocks', in block order
    layer_offload: tuple[str, ...]  # per layer, vocab.Offload
    other_offload: tuple[str, ...]  # the non-layer blocks'
    sequence_parallel: bool  # TP shards the activations between products over the sequence


@dataclass
class Export:
    engine: str
    files: dict[str, str]  # file name (beside plan.json) -> its text
    # what the engine runs differently from the plan, one sentence each ("ZeRO-1 became ...")
    changes: list[str] = field(default_factory=list)
    command: str = ""  # how to start the engine with the files
    runs: AsRun | None = None  # the plan as the engine runs it
