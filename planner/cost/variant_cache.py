"""The sharding ILP's solutions kept on disk beside the trace they were solved for.

``tp_variants`` solves one ILP per block class, TP degree and cost rates (about 18 for the 70B
Llama on 64 H100s, 1.6 s of a warm plan). Its solutions, the variant templates, depend only on
the trace, those arguments and the code that solves them; so they are kept in the trace cache's
folder under the trace's key and a hash of that code and of the solver's version, and a re-plan
of the same model, under any pins, solves none. The entry is plain JSON: each memo key (a tuple
of strings, numbers and a flag) as a list, each template as its fields; floats round-trip
exactly, so a plan made from the entry is byte for byte the plan made by solving.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
from pathlib import Path
from typing import Any

from planner.atomic import write_text_atomic
from planner.cost.sharding import _Template
from planner.trace.cache import cache_dir

# The modules whose code decides a template (relative to the planner package).
VARIANT_CODE = (
    "cost/sharding.py",
    "cost/variant_cache.py",
    "hardware/collectives.py",
    "highs.py",
    "modelfile.py",
    "trace/blocks.py",
    "trace/graph.py",
    "trace/opcost.py",
    "vocab.py",
)


@functools.cache
def variant_code_hash() -> str:
    here = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for name in VARIANT_CODE:
        digest.update((here / name).read_bytes())
    digest.update(importlib.metadata.version("highspy").encode())
    return digest.hexdigest()[:16]


def variants_path(trace_key: str) -> Path:
    return cache_dir() / "variants" / f"{trace_key}-{variant_code_hash()}.json"


def _tuples(value: Any) -> Any:
    """JSON's lists back to the tuples a template holds (every sequence in one is a tuple)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def load_variants(trace_key: str) -> dict:
    """The memo ``tp_variants`` fills, as a previous run of this trace left it ({} if none)."""
    try:
        entries = json.loads(variants_path(trace_key).read_text())
        return {
            _tuples(key): [_Template(**{k: _tuples(v) for k, v in t.items()}) for t in templates]
            for key, templates in entries
        }
    except (OSError, ValueError, TypeError, KeyError):
        return {}


def save_variants(trace_key: str, memo: dict) -> None:
    """Keep ``memo`` (``tp_variants``' solutions) for the next plan of this trace."""
    entries = [[list(key), [dataclasses.asdict(t) for t in found]] for key, found in memo.items()]
    path = variants_path(trace_key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(entries, separators=(",", ":")))
    except (OSError, TypeError):
        pass  # a cache that cannot be written only costs time
