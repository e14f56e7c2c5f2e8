"""On-disk cache of traced OpGraphs and their blocks, so planning the same model again is
instant.

An entry is one compact JSON document: the graph's own facts, the op attribute names once and
one row of values per op, edges as pairs of op positions with their bytes, and the blocks
``make_blocks`` found (the slowest part of reading a trace back, and a function of the graph and
of blocks.py, whose code the key covers). Read back, it builds the OpGraph directly, in the op
and edge order it was written in (what ``networkx``'s node-link form gave), without the
node-link dicts or a copy: the 70B Llama's 4,672 ops load about 5 times faster than they did.

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

from planner.atomic import write_text_atomic
from planner.trace.blocks import Block
from planner.trace.graph import OpGraph

TRACE_FORMAT = 9  # bump when the OpGraph's attributes or the entry's layout change
# The modules whose code decides what a cached trace holds (relative to the planner package).
TRACE_CODE = (
    "trace/export.py",
    "trace/opcost.py",
    "trace/cache.py",
    "trace/graph.py",
    "trace/blocks.py",
    "trace/loss_samples.py",
    "trace/repeats.py",
    "modelfile.py",
    "vocab.py",
)


@functools.cache
def code_hash(names: tuple[str, ...]) -> str:
    """A hash of the code of planner modules (paths relative to the planner package): a cache
    entry keyed by it is never read by code other than the code that wrote it."""
    here = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for name in names:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:16]


def trace_code_hash() -> str:
    return code_hash(TRACE_CODE)


def cache_dir() -> Path:
    root = os.environ.get("MESHPLAN_CACHE")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "meshplan"


def trace_key(sha256: str, args: dict, traced_batch_size: int, dtype: str) -> str:
    """The entry's key. Package versions come from their metadata: reading a cached trace
    imports neither torch nor transformers."""
    versions = {
        "torch": importlib.metadata.version("torch"),
        "format": TRACE_FORMAT,
        "code": trace_code_hash(),
    }
    try:  # models built with transformers trace differently across its versions
        versions["transformers"] = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        pass
    payload = json.dumps(
        [sha256, args, traced_batch_size, dtype, versions], sort_keys=True, default=str
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def _entry_path(key: str) -> Path:
    return cache_dir() / "traces" / f"{key}.json"


def load_trace(key: str) -> tuple[OpGraph, list[Block]] | None:
    """The cached graph and blocks under ``key``, or None (absent, unreadable or corrupt)."""
    try:
        data = json.loads(_entry_path(key).read_text())
        if data.get("format") != TRACE_FORMAT:
            return None
        names = data["names"]
        fields = data["fields"]
        graph = OpGraph()
        graph.graph.update(data["graph"])
        graph.add_nodes_from(zip(names, (dict(zip(fields, row)) for row in data["nodes"])))
        graph.add_edges_from((names[u], names[v], {"bytes": b}) for u, v, b in data["edges"])
        blocks = [Block(**b) for b in data["blocks"]]
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    return graph, blocks


def save_trace(key: str, graph: OpGraph, blocks: list[Block]) -> None:
    """Write the entry for ``key``: see the module's docstring for its layout."""
    names = list(graph.nodes)
    position = {n: i for i, n in enumerate(names)}
    fields = sorted({k for _, d in graph.nodes(data=True) for k in d})
    entry = {
        "format": TRACE_FORMAT,
        "graph": graph.graph,
        "names": names,
        "fields": fields,
        "nodes": [[d[k] for k in fields] for _, d in graph.nodes(data=True)],
        "edges": [[position[u], position[v], d["bytes"]] for u, v, d in graph.edges(data=True)],
        "blocks": [b.to_dict() for b in blocks],
    }
    path = _entry_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(entry, separators=(",", ":")))
    except (OSError, TypeError, KeyError):
        pass  # a cache that cannot be written only costs time
