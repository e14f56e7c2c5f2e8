"""The OpGraph: one node per traced op, edges carrying tensors, and the facts derived from it
that every later stage asks for (computed once, held by the graph that they describe).

Both tracing paths (``torch.export``, or module hooks when export fails) write the same node
attributes, ``OP_NODE_KEYS``; ``check_op_graph`` says which a node lacks. Graph-level facts
(``graph.graph``) are the model's: file, hash, arguments, traced micro-batch size, dtype,
parameters and their shapes, module types, containers, expert modules.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from functools import cached_property
from typing import Any, TypedDict

import networkx as nx

from planner.trace.opcost import MATMUL_OPS, is_view


class OpNode(TypedDict):
    """What one traced op records (per traced micro-batch)."""

    op: str  # aten op name ("aten.mm.default"), "input", or "module.<Type>" on the hook path
    module: str  # the owning module's path
    order: int  # execution order
    shapes: list  # output shapes
    dtypes: list  # output dtypes
    out_bytes: int
    fwd_flops: int
    bwd_flops: int  # products for operands that need a gradient
    fwd_bytes: int  # bytes read and written in forward
    bwd_bytes: int
    params: list[str]  # parameter names the op reads
    args: list  # serialised arguments: {"node": name}, {"param": fqn}, {"buffer": fqn}, values
    requires_grad: bool
    saved: list  # [producer node or None, bytes] for every tensor autograd keeps
    mm_inner: list | None  # a matrix product's inner dimensions (opcost.matmul_inner_dims)


OP_NODE_KEYS = tuple(OpNode.__annotations__)


class OpGraph(nx.DiGraph):
    """A traced model's op graph (a networkx DiGraph) with the facts derived from it."""

    @cached_property
    def core(self) -> set[str]:
        """The attention-like core selective recompute drops (``core_nodes``)."""
        return core_nodes(self)

    @cached_property
    def param_bytes(self) -> dict[str, int]:
        """Bytes of each parameter, under every name an op may use for it (tied aliases too)."""
        shapes = self.graph.get("param_shapes", {})
        elem = self.graph.get("param_dtype_bytes", {})
        found = {k: math.prod(v) * elem.get(k, 4) for k, v in shapes.items()}
        for alias, owner in self.graph.get("param_owner", {}).items():
            if owner in found:
                found.setdefault(alias, found[owner])
        return found


def as_op_graph(graph: nx.DiGraph) -> OpGraph:
    """An OpGraph of ``graph`` (itself when it already is one)."""
    return graph if isinstance(graph, OpGraph) else OpGraph(graph)


def core_of(graph: nx.DiGraph) -> set[str]:
    """The core of any op graph: cached on an OpGraph, computed for a hand-built one."""
    if isinstance(graph, OpGraph):
        return graph.core
    return core_nodes(graph)


def param_bytes_of(graph: nx.DiGraph) -> dict[str, int]:
    """Parameter bytes by name: cached on an OpGraph, computed for a hand-built one."""
    return as_op_graph(graph).param_bytes


def core_nodes(graph: nx.DiGraph) -> set[str]:
    """Ops that selective recompute drops: weight-free ops lying between two products of
    activations (QK^T -> mask -> softmax -> dropout -> PV). Their inputs stay saved; what they
    produce is recomputed. A block with no such pair (FlashAttention, an MLP) has no core."""
    param_view: set[str] = set()
    weight_free: set[str] = set()
    act_matmul: set[str] = set()
    for n in sorted(graph.nodes, key=lambda n: graph.nodes[n]["order"]):
        d = graph.nodes[n]
        if d["op"] == "input":
            continue
        refs = _refs(d["args"])
        uses_param = bool(d["params"]) or any(r in param_view for r in refs)
        if is_view(d["op"]) and uses_param:
            param_view.add(n)
            continue
        if uses_param:
            continue
        weight_free.add(n)
        if d["op"] in MATMUL_OPS:
            act_matmul.add(n)
    order = sorted(weight_free, key=lambda n: graph.nodes[n]["order"])
    after: dict[str, bool] = {}  # an activation product lies upstream (or is n itself)
    for n in order:
        after[n] = n in act_matmul or any(after.get(p, False) for p in graph.predecessors(n))
    before: dict[str, bool] = {}  # an activation product lies strictly downstream
    for n in reversed(order):
        before[n] = any(
            s in weight_free and (s in act_matmul or before.get(s, False))
            for s in graph.successors(n)
        )
    core = {n for n in order if after[n] and before[n]}
    return core


def arg_refs(args: object) -> Iterator[dict]:
    """The references in a node's serialised arguments, in order: ``{"node": name}``,
    ``{"param": fqn}``, ``{"buffer": fqn}`` or ``{"const": ...}``, however nested."""
    if isinstance(args, dict):
        if ("node" in args and len(args) == 1) or any(k in args for k in REF_KEYS[1:]):
            yield args
        else:
            for v in args.values():
                yield from arg_refs(v)
    elif isinstance(args, list):
        for v in args:
            yield from arg_refs(v)


REF_KEYS = ("node", "param", "buffer", "const")


def _refs(args: object) -> list[str]:
    return [r["node"] for r in arg_refs(args) if "node" in r and len(r) == 1]


def check_op_graph(graph: nx.DiGraph) -> list[str]:
    """Nodes that lack an OpNode attribute, as "node: key" (empty for a well-formed graph)."""
    missing: list[Any] = []
    for n, d in graph.nodes(data=True):
        missing += [f"{n}: {k}" for k in OP_NODE_KEYS if k not in d]
    return missing


def pipeline_refusal(graph: nx.DiGraph) -> str:
    """Why torch's pipelining could not run this model as traced ("" when it can). Its stages
    are cut from and run as the graph torch.export makes of the model: a model export could
    not trace has no such graph, one listing a module under two names cannot be unflattened,
    and in one that applies its own autograd.Function the function's backward is not kept
    (the stage differentiates the forward's ops instead)."""
    if graph.graph.get("method") == "hooks":
        return (
            "torch.export could not trace the model (its note says why), and torch's "
            "pipelining cuts a model into stages by tracing it with torch.export"
        )
    shared = graph.graph.get("shared_modules") or []
    if shared:
        return (
            f"the model lists one module under several names ({', '.join(shared[0])}), and "
            "torch.export's unflatten, with which torch's pipelining cuts stages, refuses such "
            "a model"
        )
    functions = graph.graph.get("custom_backward") or []
    if functions:
        return (
            f"the model applies {', '.join(functions)}, a torch.autograd.Function with a "
            "backward of its own, which torch's pipelining does not keep (its stages run the "
            "exported forward and differentiate its ops instead)"
        )
    return ""
