"""What an export returns: the engine's files and what of the plan it could not say as is."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Export:
    engine: str
    files: dict[str, str]  # file name (beside plan.json) -> its text
    # what the engine runs differently from the plan, one sentence each ("ZeRO-1 became ...")
    changes: list[str] = field(default_factory=list)
    command: str = ""  # how to start the engine with the files
