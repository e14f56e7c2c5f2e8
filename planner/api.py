"""The Python face of meshplan: the functions the CLI calls, usable from a notebook too."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx

from planner.blocks import Block, make_blocks
from planner.cache import load_graph, save_graph, trace_key
from planner.modelfile import ModelFile, load_model_file
from planner.trace import trace_model


@dataclass
class TracedModel:
    model_file: ModelFile
    graph: nx.DiGraph
    blocks: list[Block]
    note: str  # one line for the user (fallback tracing), or ""
    from_cache: bool

    @property
    def params(self) -> int:
        return int(self.graph.graph["params"])

    @property
    def micro_batch_size(self) -> int:
        return int(self.graph.graph["micro_batch_size"])


def trace(
    model_file: str | Path | ModelFile,
    model_args: dict[str, Any] | None = None,
    micro_batch_size: int = 1,
    dtype: str = "bf16",
    use_cache: bool = True,
) -> TracedModel:
    """Trace a model file (or a loaded one) into its OpGraph and blocks, through the cache."""
    mf = (
        model_file
        if isinstance(model_file, ModelFile)
        else load_model_file(model_file, model_args or {})
    )
    key = trace_key(mf.sha256, mf.args, micro_batch_size, dtype)
    graph = load_graph(key) if use_cache else None
    note, cached = "", graph is not None
    if graph is None:
        result = trace_model(mf, micro_batch_size, dtype)
        graph, note = result.graph, result.note
        graph.graph["note"] = note
        if use_cache:
            save_graph(key, graph)
    else:
        note = graph.graph.get("note", "")
    return TracedModel(mf, graph, make_blocks(graph), note, cached)


def graph_summary(traced: TracedModel) -> dict[str, Any]:
    """The ``plan --graph --json`` document: the model and its blocks for one micro-batch."""
    g = traced.graph.graph
    classes: dict[str, int] = {}
    for b in traced.blocks:
        classes[b.label] = classes.get(b.label, 0) + 1
    return {
        "model": {
            "file": g["file"],
            "sha256": g["sha256"],
            "args": g["args"],
            "params": g["params"],
            "micro_batch_size": g["micro_batch_size"],
            "dtype": g["dtype"],
            "trace": g["method"],
            "ops": traced.graph.number_of_nodes(),
            "blocks": len(traced.blocks),
            "classes": classes,
            "fwd_flops": sum(b.fwd_flops for b in traced.blocks),
            "bwd_flops": sum(b.bwd_flops for b in traced.blocks),
            "saved_activation_bytes": sum(b.saved_bytes for b in traced.blocks),
        },
        "blocks": [
            {
                "name": b.name,
                "class": b.label,
                "modules": b.modules,
                "params": b.params,
                "fwd_flops": b.fwd_flops,
                "bwd_flops": b.bwd_flops,
                "saved_activation_bytes": b.saved_bytes,
                "saved_activation_bytes_selective": b.saved_selective_bytes,
                "input_bytes": b.input_bytes,
                "output_bytes": b.output_bytes,
            }
            for b in traced.blocks
        ],
    }
