"""Run a pipelined block that is handed several tensors as the user's eager module.

torch's pipelining runs each stage as the exported graph, unflattened into the model's module
tree. ``runtime.stages`` swaps a traced module back for the eager one where its traced call
passes the one tensor the eager forward takes. An HF Llama decoder layer is handed the stream,
the rotary tables and the mask (``layer(h, attention_mask=m, position_embeddings=(cos, sin),
position_ids=p, cache=None, use_cache=False)``), and its traced copy takes them as four
positional inputs in the order its code first reads them: no eager call can be read off that.
Run traced, the layer's shapes are fixed at trace time, so it cannot run sequence-parallel, and
its column-parallel outputs must be gathered at once for the traced code around them.

So the stage's export keeps each such block's call signature (``torch.export``'s
``preserve_module_call_signature``): the pytree of ``(args, kwargs)`` the model passed and, per
leaf, the graph value (by name) or the constant. ``call_eagerly`` rewrites the block's call in
the traced code around it to pass those values as the model did, and the caller swaps in the
eager module. A tensor the model passes but the traced code never reads (Llama's
``position_ids``, which the layer hands its attention, which ignores it) may not reach the
stage: a zero tensor of its traced shape and dtype stands in (the trace records every read of a
value, so nothing reads it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.export.graph_signature import ConstantArgument, TensorArgument
from torch.utils._pytree import TreeSpec, tree_unflatten


@dataclass(frozen=True)
class Passed:
    """One leaf of a block's call: the graph value ``name`` (a tensor of ``shape`` and
    ``dtype`` in the trace) or, where ``name`` is None, the constant ``value``."""

    name: str | None
    value: Any = None
    shape: tuple[int, ...] = ()
    dtype: torch.dtype | None = None


@dataclass(frozen=True)
class BlockCall:
    """How the model called a block: the structure of ``(args, kwargs)`` and its leaves, and
    the graph values (by name) of the leaves of what it returned, None for a non-tensor."""

    in_spec: TreeSpec
    leaves: tuple[Passed, ...]
    returned: tuple[str | None, ...]


@dataclass(frozen=True)
class ModuleCalls:
    """What one forward passes each module: how often it is called, and whether every call
    passes exactly one tensor, positionally.

    A traced module taking one tensor may stand for an eager one whose one argument is not a
    tensor: DPT's depth head takes the list of fused features and reads the last; the trace
    kept only that one as its input, and the eager head, handed it, indexed the batch
    instead (a crash there; silently wrong rows elsewhere). Such a module is swapped back by
    its call signature instead."""

    count: int
    one_tensor: bool


def module_calls(model: nn.Module, example: tuple) -> dict[str, ModuleCalls] | None:
    """Per module path, its ``ModuleCalls`` over one forward of the example micro-batch on
    the meta device (the model's tensors swapped for meta ones for the call). None where that
    forward fails (HF Llama's mask code reads a tensor's value)."""
    seen: dict[str, ModuleCalls] = {}

    def hook(name: str):
        def record(_module: nn.Module, args: tuple, kwargs: dict) -> None:
            one = len(args) == 1 and isinstance(args[0], torch.Tensor) and not kwargs
            was = seen.get(name, ModuleCalls(0, True))
            seen[name] = ModuleCalls(was.count + 1, was.one_tensor and one)

        return record

    handles = [
        m.register_forward_pre_hook(hook(n), with_kwargs=True)
        for n, m in model.named_modules()
        if n
    ]
    # each tensor once, under its first name: functional_call ties the model's other names
    # for it to the same meta tensor, and refuses a tied tensor given twice
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    meta = {n: torch.empty_like(t, device="meta") for n, t in tensors.items()}
    inputs = tuple(t.to("meta") if isinstance(t, torch.Tensor) else t for t in example)
    try:
        with torch.no_grad(), torch.device("meta"):
            torch.func.functional_call(model, meta, inputs, strict=False)
    except Exception:  # noqa: BLE001 - the meta device cannot run this forward
        return None
    finally:
        for h in handles:
            h.remove()
    return seen


def signature_modules(paths: list[str], calls: dict[str, ModuleCalls] | None) -> tuple[str, ...]:
    """Of the block module ``paths``, those whose call signature the stage's export keeps:
    each called once and not with one tensor alone (such a module is swapped back by that
    tensor, ``runtime.stages``; one called twice would need a signature per call). Where the
    meta forward could not tell (``calls`` None), every one of them; where the export cannot
    keep them, the stage is traced again without."""
    if calls is None:
        return tuple(dict.fromkeys(paths))
    return tuple(
        p
        for p in dict.fromkeys(paths)
        if p in calls and calls[p].count == 1 and not calls[p].one_tensor
    )


def block_calls(
    program: torch.export.ExportedProgram, paths: tuple[str, ...]
) -> dict[str, BlockCall]:
    """The kept call signatures of ``paths`` in an exported ``program``, by module path; a call
    passing anything but tensors and plain constants (a symbolic size, an opaque object) is
    left out, and that module stays traced."""
    values = {n.name: n.meta.get("val") for n in program.graph.nodes}
    found: dict[str, BlockCall] = {}
    for entry in program.module_call_graph:
        sig = entry.signature
        if entry.fqn not in paths or sig is None:
            continue
        leaves = []
        for arg in sig.inputs:
            val = values.get(arg.name) if isinstance(arg, TensorArgument) else None
            if isinstance(val, torch.Tensor):
                leaves.append(Passed(arg.name, None, tuple(int(d) for d in val.shape), val.dtype))
            elif isinstance(arg, ConstantArgument):
                leaves.append(Passed(None, arg.value))
            else:
                break
        else:
            returned = tuple(a.name if isinstance(a, TensorArgument) else None for a in sig.outputs)
            found[entry.fqn] = BlockCall(sig.in_spec, tuple(leaves), returned)
    return found


# The key under which each exported node's meta keeps its name in the exported program: the
# stage split and the unflattening copy a node's meta with it but may rename the node
# (``embedding`` becomes ``embedding_default`` inside a stage that computes it).
VALUE_NAME = "meshplan_value"


def name_values(program: torch.export.ExportedProgram) -> None:
    """Record each node's name in its meta (``VALUE_NAME``), for ``call_eagerly``."""
    for node in program.graph.nodes:
        node.meta[VALUE_NAME] = node.name


def _value_name(node: torch.fx.Node) -> str:
    return node.meta.get(VALUE_NAME, node.name)


def _stand_in(like: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A value the block is passed but nothing reads, on the device of ``like``."""
    return torch.zeros(shape, dtype=dtype, device=like.device)


def _call_sites(stage: nn.Module, fqn: str) -> tuple[nn.Module, list[torch.fx.Node]] | None:
    """The nearest module above ``fqn`` whose graph calls it, and those calls. (torch's
    unflattening gives a ModuleList an empty graph of its own: its layers are called from
    the graph of the module holding it.)"""
    path = fqn
    while path:
        path = path.rpartition(".")[0]
        owner = stage.get_submodule(path) if path else stage
        graph = getattr(owner, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        target = fqn[len(path) + 1 :] if path else fqn
        sites = [n for n in graph.nodes if n.op == "call_module" and n.target == target]
        if sites:
            return owner, sites
    return None


def call_eagerly(stage: nn.Module, fqn: str, call: BlockCall) -> int | None:
    """Make the traced code that calls module ``fqn`` in ``stage`` pass what the model passed
    it (``call``), so the eager module can run there, and return the position, among the
    leaves of what the module returns, of the one value that code reads (gpt-oss's MLP returns
    its output and the router's scores, and the trace kept the output alone). None, with
    nothing changed, where the call cannot be rebuilt: the traced code reads several of the
    module's outputs, calls it more than once, or the module reads a value the model did not
    pass it (a tensor the eager module would find some other way, which this rank may not
    have computed)."""
    traced = stage.get_submodule(fqn)
    graph = getattr(traced, "graph", None)
    found = _call_sites(stage, fqn)
    if not isinstance(graph, torch.fx.Graph) or found is None:
        return None
    owner, sites = found
    out = next(n for n in graph.nodes if n.op == "output").args[0]
    places = [_value_name(n) for n in graph.nodes if n.op == "placeholder"]
    if not isinstance(out, torch.fx.Node) or len(sites) != 1 or sites[0].kwargs:
        return None
    read = _value_name(out)
    site = sites[0]
    if (
        read not in call.returned
        or len(site.args) != len(places)
        or not set(places) <= {p.name for p in call.leaves}
    ):
        return None
    given = dict(zip(places, site.args))
    named = {_value_name(n): n for n in owner.graph.nodes}
    tensors = [a for a in site.args if isinstance(a, torch.fx.Node)]
    if not tensors:
        return None
    leaves = []
    with owner.graph.inserting_before(site):
        for p in call.leaves:
            if p.name is None:
                leaves.append(p.value)
            elif p.name in given:
                leaves.append(given[p.name])
            elif p.name in named and _before(owner.graph, named[p.name], site):
                leaves.append(named[p.name])
            else:
                leaves.append(owner.graph.call_function(_stand_in, (tensors[0], p.shape, p.dtype)))
    args, kwargs = tree_unflatten(leaves, call.in_spec)
    site.args, site.kwargs = tuple(args), dict(kwargs)
    owner.graph.lint()
    _refresh(owner)
    return call.returned.index(read)


def _before(graph: torch.fx.Graph, node: torch.fx.Node, site: torch.fx.Node) -> bool:
    for n in graph.nodes:
        if n is node:
            return True
        if n is site:
            return False
    return False


def _refresh(owner: nn.Module) -> None:
    """Regenerate the code of a graph-running module after its graph changed."""
    if isinstance(owner, torch.fx.GraphModule):
        owner.recompile()
    elif hasattr(owner, "finalize"):  # torch.export's InterpreterModule
        owner.finalize()
