"""Per-step measurements: peak memory of this process and the JSON lines of metrics.jsonl."""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path
from typing import Any

import torch

from planner.atomic import write_text_atomic


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA's max_memory_allocated on a GPU; on the CPU the process's max RSS (the closest
    thing to "memory this rank needed", although it includes Python and torch themselves)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def peak_reserved_bytes(device: torch.device) -> int:
    """CUDA's max_memory_reserved: what the caching allocator held at its peak, the allocated
    peak plus its fragmentation, which is what runs out first; 0 on the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_reserved(device))
    return 0


def start_metrics(path: Path, resume_step: int) -> None:
    """A fresh metrics file, or on resume the lines up to the checkpoint's step."""
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = []
    if resume_step > 0 and path.exists():
        for line in path.read_text().splitlines():
            try:
                if json.loads(line).get("step", 0) <= resume_step:
                    kept.append(line)
            except json.JSONDecodeError:
                continue
    write_text_atomic(path, "".join(line + "\n" for line in kept))


def append_metrics(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def format_step(record: dict[str, Any], steps: int) -> str:
    rate = (
        f"{record['tokens_per_s']:,.0f} tokens/s"
        if "tokens_per_s" in record
        else f"{record['samples_per_s']:,.1f} samples/s"
    )
    peak = max(record["peak_memory_bytes"]) / 2**20
    return (
        f"step {record['step']:>{len(str(steps))}}/{steps}  loss {record['loss']:.6f}  "
        f"{record['step_time_s']:.3f} s  {rate}  peak {peak:,.0f} MiB (max over ranks)"
    )
