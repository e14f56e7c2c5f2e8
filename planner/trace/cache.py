"""On-disk cache of traced OpGraphs, so planning the same model again is instant.

The key covers everything a trace depends on: the model file's bytes, the build_model arguments,
the micro-batch size, the dtype, the versions of torch, transformers (if loaded) and of the
trace format itself, and a hash of the code that writes a trace (the tracer, the op costs and
the model-file loader), so an edited tracer never reads traces an older one wrote. Entries are
written atomically; a corrupt entry is ignored and replaced.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
from pathlib import Path

import networkx as nx
import torch

from planner.atomic import write_text_atomic
from planner.trace.graph import OpGraph

TRACE_FORMAT = 8  # bump when the OpGraph's attributes change
# The modules whose code decides what a cached trace holds (relative to the planner package).
TRACE_CODE = (
    "trace/export.py",
    "trace/opcost.py",
    "trace/cache.py",
    "trace/graph.py",
    "trace/loss_samples.py",
    "modelfile.py",
    "vocab.py",
)


@functools.cache
def trace_code_hash() -> str:
    here = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for name in TRACE_CODE:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    root = os.environ.get("MESHPLAN_CACHE")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "meshplan"


def trace_key(sha256: str, args: dict, micro_batch_size: int, dtype: str) -> str:
    versions = {"torch": torch.__version__, "format": TRACE_FORMAT, "code": trace_code_hash()}
    try:  # models built with transformers trace differently across its versions
        versions["transformers"] = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        pass
    payload = json.dumps(
        [sha256, args, micro_batch_size, dtype, versions], sort_keys=True, default=str
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def load_graph(key: str) -> OpGraph | None:
    path = cache_dir() / "traces" / f"{key}.json"
    try:
        data = json.loads(path.read_text())
        graph = nx.node_link_graph(data, directed=True, edges="edges")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return OpGraph(graph)


def save_graph(key: str, graph: nx.DiGraph) -> None:
    path = cache_dir() / "traces" / f"{key}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = nx.node_link_data(graph, edges="edges")
        write_text_atomic(path, json.dumps(data, separators=(",", ":")))
    except OSError:
        pass  # a cache that cannot be written only costs time
