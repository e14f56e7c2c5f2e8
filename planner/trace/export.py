"""Trace a model file into an OpGraph: every op, its module, shapes, FLOPs, bytes and what
autograd saves for backward.

Two passes over one program, both on the meta device so no weight is ever allocated:

1. ``torch.export`` (non-strict) gives the op graph with shapes and ``nn_module_stack``.
2. The exported graph is run again, op by op, with grad enabled and a saved-tensor hook: the
   tensors autograd keeps for backward are *measured*, attributed to the op that saves them and
   to the op that produced them (the tensor-parallel cost model needs both). Dropout runs as
   ``native_dropout`` so its mask is the 1-byte tensor a GPU keeps, not the CPU fallback's
   same-dtype mask.

When export fails, module-level forward hooks give a coarser graph (one node per leaf module)
and the caller is told so in one line; when both fail, the error names the module that broke.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import operator
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import torch
import torch.fx
from torch.nn.modules.batchnorm import _BatchNorm

from planner.errors import UserInputError, brief
from planner.fx_stacks import stack_traces_off
from planner.modelfile import (
    DTYPES,
    ModelFile,
    expert_modules,
    forward_takes_one_argument,
    parameter_names,
)
from planner.trace.graph import OpGraph
from planner.trace.loss_samples import loss_sample_check, meta_forward
from planner.trace.opcost import (
    MATMUL_OPS,
    backward_flops,
    forward_flops,
    is_grouped_mm,
    is_view,
    numel,
)
from planner.trace.randomness import numpy_draws
from planner.trace.repeats import (
    NotPeriodic,
    Repeat,
    copied_modules,
    copied_state,
    cut,
    expand,
    find_repeats,
    full_trace_forced,
)
from planner.trace.value_checks import drop_value_checks
from planner.vocab import ELEMENT_BYTES


@dataclass
class TraceResult:
    graph: nx.DiGraph  # the OpGraph; graph.graph holds model-level facts
    method: str  # "export" or "hooks"
    note: str  # one line for the user when the fallback was used
    repeats: list[Repeat] = field(default_factory=list)  # containers traced cut (repeats.py)


def tensor_bytes(t: Any) -> int:
    if not isinstance(t, torch.Tensor):
        return 0
    return numel(t.shape) * element_bytes(t)


def element_bytes(t: torch.Tensor) -> int:
    return ELEMENT_BYTES.get(str(t.dtype).removeprefix("torch."), t.element_size())


def op_name(target: Any) -> str:
    if target is operator.getitem:
        return "_operator.getitem"
    return str(target)


def build_meta_model(mf: ModelFile, dtype: str) -> torch.nn.Module:
    """The user's model on the meta device, floating tensors in the training dtype."""
    with torch.device("meta"):
        model = mf.build()
    _parameters_to_meta(model)
    model = model.to(DTYPES[dtype])
    model.train()
    return model


def _parameters_to_meta(model: torch.nn.Module) -> None:
    """Move to the meta device the parameters the default device did not reach: a legacy
    constructor (XLNet's ``nn.Parameter(torch.FloatTensor(d, n, h))``) allocates on the CPU
    whatever the default, and the trace then met a CPU weight beside meta activations. A
    parameter held by several modules stays one tensor. Buffers stay where the model put
    them (model code may read their values)."""
    moved: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None or p.device.type == "meta":
                continue
            if id(p) not in moved:
                moved[id(p)] = torch.nn.Parameter(p.to("meta"), requires_grad=p.requires_grad)
            module._parameters[name] = moved[id(p)]


def meta_inputs(mf: ModelFile, traced_batch_size: int, dtype: str) -> tuple[torch.Tensor, ...]:
    """``make_batch``'s inputs on the meta device, floating ones in the training dtype."""
    inputs, _ = mf.batch(traced_batch_size, step=0)
    return tuple(
        t.to("meta", DTYPES[dtype]) if t.is_floating_point() else t.to("meta") for t in inputs
    )


@contextlib.contextmanager
def quiet_torch_logs() -> Iterator[None]:
    """Silence torch's own loggers while a user's model is traced.

    A forward that fails a shape check makes torch's fake-tensor layer log the full internal
    traceback at ERROR before the exception reaches us; the user must see only our one line.
    Its warnings too (torch.export's about a model attribute assigned while exporting, as
    RecurrentGemma's recurrent states are): they speak of torch's tracing, not the user's
    training."""
    # Each existing torch logger is disabled by its flag (a setLevel per logger clears every
    # logger's cache: quadratic in the loggers, 0.2 s a call with transformers imported), and
    # the "torch" logger's level covers the loggers created while tracing.
    top = logging.getLogger("torch")
    loggers = [top] + [
        lg
        for name, lg in list(logging.root.manager.loggerDict.items())
        if name.startswith("torch.") and isinstance(lg, logging.Logger)
    ]
    disabled, level = [lg.disabled for lg in loggers], top.level
    top.setLevel(logging.CRITICAL + 1)
    for lg in loggers:
        lg.disabled = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, was in zip(loggers, disabled):
            lg.disabled = was
        top.setLevel(level)


def trace_model(mf: ModelFile, traced_batch_size: int = 1, dtype: str = "bf16") -> TraceResult:
    """Trace ``mf`` for one micro-batch; the OpGraph's numbers are for the batch size its
    ``traced_batch_size`` records (``batch_statistics_samples`` may raise the one asked for).

    The forward runs with the meta device as the default: a model that makes a tensor without
    naming a device (an unrolled RNN's ``torch.zeros(batch, hidden)`` initial state) makes it
    beside its meta weights, as it makes it beside its real ones when it trains."""
    with quiet_torch_logs(), torch.device("meta"):
        return _trace_model(mf, traced_batch_size, dtype)


def batch_statistics_samples(model: torch.nn.Module) -> int:
    """The fewest samples a forward in training mode is defined on: 2 where a BatchNorm
    normalises with the batch's statistics (after global pooling, or over a [batch, features]
    input, one sample leaves one value per channel and torch refuses it: LeViT, MobileViT),
    else 1."""
    return 2 if any(isinstance(m, _BatchNorm) for m in model.modules()) else 1


def _trace_model(mf: ModelFile, traced_batch_size: int, dtype: str) -> TraceResult:
    """The block-deduplicated trace where the model's layers repeat (``repeats``), else the
    full one; both give the same graph."""
    model = build_meta_model(mf, dtype)
    # Costs are per sample times the micro-batch, whatever batch the trace ran on.
    traced_batch_size = max(traced_batch_size, batch_statistics_samples(model))
    inputs = meta_inputs(mf, traced_batch_size, dtype)
    found = [] if full_trace_forced() else _find_repeats(model, inputs)
    if found:
        try:
            return _trace(mf, model, inputs, traced_batch_size, dtype, found)
        except Exception:  # noqa: BLE001  (the full trace decides: it or its error)
            model = build_meta_model(mf, dtype)  # the cut trace's forwards ran on this one
    return _trace(mf, model, inputs, traced_batch_size, dtype, [])


def _find_repeats(model: torch.nn.Module, inputs: tuple) -> list[Repeat]:
    """``repeats.find_repeats`` on an eager meta forward; none where that forward fails (the
    full trace then says why)."""
    with quiet_torch_logs():
        try:
            with meta_forward():
                return find_repeats(model, lambda: model(*inputs))
        except Exception:  # noqa: BLE001
            return []


def _trace(
    mf: ModelFile,
    model: torch.nn.Module,
    inputs: tuple,
    traced_batch_size: int,
    dtype: str,
    repeats: list[Repeat],
) -> TraceResult:
    """The trace, with the containers of ``repeats`` cut and written out again after."""
    functions: set[str] = set()
    called: set[str] = set()
    drawn: list[str] = []  # numpy.random calls of the forward (randomness.numpy_draws)
    with cut(model, repeats):
        graph, method, note = _export_or_hooks(mf, model, inputs, functions, called, drawn)
    if repeats and method != "export":
        raise NotPeriodic("the cut model did not export")
    for r in repeats:
        graph = expand(graph, r)
    _annotate_model(graph, mf, model, traced_batch_size, dtype, method)
    graph.graph["custom_backward"] = sorted(functions)
    graph.graph["numpy_draws"] = sorted(set(drawn))
    graph.graph["direct_forward"] = direct_forwards(model, copied_modules(called, repeats))
    graph.graph["shared_modules"] = shared_modules(model)
    before = state_versions(model)  # the loss check runs the model on the meta device
    with cut(model, repeats):  # the outputs are the full model's (find_repeats checked)
        graph.graph["loss_samples"] = loss_sample_check(
            mf, model, lambda n: meta_inputs(mf, n, dtype)
        )
    graph.graph["forward_state"] = copied_state(forward_state(model, before), repeats)
    return TraceResult(graph=graph, method=method, note=note, repeats=repeats)


def _export_or_hooks(
    mf: ModelFile,
    model: torch.nn.Module,
    inputs: tuple,
    functions: set[str],
    called: set[str],
    drawn: list[str],
) -> tuple[nx.DiGraph, str, str]:
    """The op graph from torch.export, or from module hooks where export fails; the method
    and the note for the user."""
    try:
        # torch.export prints the graph it gave up on (a data-dependent size): its words to
        # itself, not to the user, who gets one line
        with (
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
            _watch_forward(model, functions, called),
            numpy_draws(drawn),
            stack_traces_off(),
        ):
            exported = torch.export.export(model, inputs, strict=False)
        _drop_traced_causal_masks(exported)
        value_checks = drop_value_checks(exported)
        # sizes that depend on the data (JetMoE's tokens per expert, split by their counts)
        # have no number to price: the export path cannot count that graph's ops
        graph = _graph_from_export(exported, model)
        note = ""
        if value_checks:
            note = (
                f"{len(value_checks)} input check(s) of {mf.path.name} reading tensor values "
                "(transformers' image-token count), which a trace without data cannot: not "
                "priced, run on every real batch in training (planner/trace/value_checks.py)"
            )
        return graph, "export", note
    except Exception as export_exc:  # export fails on data-dependent control flow and more
        with _watch_forward(model, functions, called):
            graph = _trace_with_hooks(mf, model, inputs, export_exc)
        reason = " ".join(str(export_exc).split())[:160]
        return (
            graph,
            "hooks",
            (
                f"torch.export could not trace {mf.path.name} ({type(export_exc).__name__}: "
                f"{reason}); fell back to module-level tracing (coarser op graph)"
            ),
        )


@contextlib.contextmanager
def _watch_forward(model: torch.nn.Module, found: set[str], called: set[str]) -> Iterator[None]:
    """Record in ``called`` the modules whose forward ran through ``__call__`` (the others'
    hooks never fire: ``direct_forwards``), and in ``found`` the model's own
    ``torch.autograd.Function`` classes whose backward a pipeline
    would lose (YOSO's attention, straight-through estimators). torch's pipelining runs each
    stage as the exported graph and differentiates its ops, except inside a module it runs
    eagerly (``runtime.stages.adopt_eager_modules``: one tensor in, one out, a forward of one
    argument), where the function runs as written: BLOOM's GeLU function sits in such a
    module, YOSO's in an attention taking a mask too (YOSO trained another model under PP 2).
    torch's own Functions (reentrant checkpointing) keep the forward's true gradient."""
    names = {id(m): n for n, m in model.named_modules()}
    stack: list[str] = []
    plain: dict[str, bool] = {}  # module -> every call one tensor in and one tensor out
    applied: list[tuple[str, list[str]]] = []  # (function, the modules around its call)
    original = torch.autograd.Function.__dict__["apply"]

    def apply(cls, *args, **kwargs):  # noqa: ANN001, ANN202
        if not cls.__module__.startswith("torch."):
            applied.append((cls.__qualname__, list(stack)))
        return original.__func__(cls, *args, **kwargs)

    def enter(m: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        name = names.get(id(m), "")
        stack.append(name)
        called.add(name)
        one = len(args) == 1 and isinstance(args[0], torch.Tensor) and not kwargs
        plain[name] = plain.get(name, True) and one and forward_takes_one_argument(m)

    def leave(m: torch.nn.Module, _args: tuple, _kwargs: dict, out: object) -> None:
        if stack:
            name = stack.pop()
            plain[name] = plain.get(name, True) and isinstance(out, torch.Tensor)

    handles = [m.register_forward_pre_hook(enter, with_kwargs=True) for m in model.modules()]
    handles += [m.register_forward_hook(leave, with_kwargs=True) for m in model.modules()]
    torch.autograd.Function.apply = classmethod(apply)
    try:
        yield
    finally:
        torch.autograd.Function.apply = original
        for h in handles:
            h.remove()
        found.update(fn for fn, around in applied if not any(plain.get(n) for n in around if n))


def shared_modules(model: torch.nn.Module) -> list[list[str]]:
    """The paths of each module holding weights that one container lists under more than one
    name (``nn.ModuleList([block] * n)``: one block listed n times). torch.export's
    unflatten, which torch's pipelining cuts stages with, refuses such a model at most cuts
    ("Child module 'norm' is not a descendant of parent module 'layers.4'", even at a block
    that is not itself listed twice). (One module registered in two containers, an
    embedding table beside its encoder's, is not what this finds.)"""
    paths: dict[int, list[str]] = {}
    for name, m in model.named_modules(remove_duplicate=False):
        if name and any(True for _ in m.parameters()):
            paths.setdefault(id(m), []).append(name)
    return sorted(
        names
        for names in paths.values()
        if len(names) > 1 and len({n.rpartition(".")[0] for n in names}) == 1
    )


def direct_forwards(model: torch.nn.Module, called: set[str]) -> list[str]:
    """The modules whose ``forward`` the model calls directly (``layer.forward(x)``, as
    SqueezeBERT's encoder does), not through ``__call__``: never entered (``called``), though
    a module inside them was. Their hooks never fire, and FSDP2's gathers, the composable
    checkpoint and sequence parallelism's slicing all work through a module's hooks: a block
    sharded by FSDP2 then ran its forward on its shards ("mixed torch.Tensor and DTensor").
    The runtime routes these calls through ``__call__`` (``runtime.parallelize``)."""
    inside = {
        name
        for name, m in model.named_modules()
        if name and not isinstance(m, (torch.nn.ModuleList, torch.nn.ModuleDict))
    }
    return sorted(name for name in inside - called if any(c.startswith(name + ".") for c in called))


def _drop_traced_causal_masks(exported: torch.export.ExportedProgram) -> None:
    """Fused attention given a boolean (query x key) mask built from shapes alone runs as
    ``is_causal`` instead, and the ops that built the mask go.

    transformers materialises the s x s causal mask while exporting (an exported graph must
    not hard-code is_causal, its masking_utils explains), where eager training of an unpadded
    batch passes none and lets SDPA apply causality: at 128K tokens that mask alone is 16 GiB.
    The planner prices training, so it keeps what training runs. A mask that depends on the
    inputs' values (padding) stays."""
    gm = exported.graph_module
    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    user = {
        spec.arg.name
        for spec in exported.graph_signature.input_specs
        if spec.kind.name.lower() == "user_input"
    }
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not sdpa:
            continue
        args = list(node.args) + [None] * (7 - len(node.args))
        mask = args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
        q, k = (a.meta.get("val") for a in node.args[:2])
        val = mask.meta.get("val") if isinstance(mask, torch.fx.Node) else None
        if (
            val is None
            or val.dtype != torch.bool
            or q.shape[-2] != k.shape[-2]
            or tuple(val.shape[-2:]) != (q.shape[-2], k.shape[-2])
            or _depends_on(mask, user)
        ):
            continue
        kwargs = {key: v for key, v in node.kwargs.items() if key not in ("attn_mask", "is_causal")}
        q, k, v = node.args[:3]
        kv = _compact_grouped(k), _compact_grouped(v)
        if all(x is not None for x in kv):
            k, v = kv
            kwargs["enable_gqa"] = True
        node.args = (q, k, v)
        node.kwargs = {**kwargs, "attn_mask": None, "is_causal": True}
        changed = True
    if changed:
        check = torch.ops.aten._assert_tensor_metadata.default
        while True:  # shape asserts on what only the mask used keep it alive: drop them too
            gm.graph.eliminate_dead_code()
            lone = [
                n
                for n in gm.graph.nodes
                if n.op == "call_function"
                and n.target is check
                and all(len(a.users) == 1 for a in n.all_input_nodes)
            ]
            if not lone:
                break
            for n in lone:
                gm.graph.erase_node(n)
        gm.recompile()


def _compact_grouped(kv: Any) -> torch.fx.Node | None:
    """The compact key or value behind grouped-query attention's head repeat, if ``kv`` is one:
    ``reshape(expand(unsqueeze(x, 2), [b, g, r, s, d]), [b, g * r, s, d])`` -> ``x``.

    transformers repeats the g key/value heads r times when a mask is passed (which exporting
    makes it do), and hands SDPA the compact heads with ``enable_gqa`` when none is (eager
    training): the fused kernel then keeps g heads, not g * r, for backward."""
    aten = torch.ops.aten
    if not isinstance(kv, torch.fx.Node) or kv.target not in (
        aten.reshape.default,
        aten.view.default,
        aten._unsafe_view.default,
    ):
        return None
    expand = kv.args[0]
    if not isinstance(expand, torch.fx.Node) or expand.target is not aten.expand.default:
        return None
    unsqueeze = expand.args[0]
    if (
        not isinstance(unsqueeze, torch.fx.Node)
        or unsqueeze.target is not aten.unsqueeze.default
        or unsqueeze.args[1] != 2
    ):
        return None
    src = unsqueeze.args[0]
    shape = getattr(src.meta.get("val"), "shape", None) if isinstance(src, torch.fx.Node) else None
    out = getattr(kv.meta.get("val"), "shape", None)
    if shape is None or out is None or len(shape) != 4 or len(out) != 4:
        return None
    b, g, s, d = shape
    if (out[0], out[2], out[3]) != (b, s, d) or out[1] % g or out[1] == g:
        return None
    return src


def _depends_on(node: torch.fx.Node, names: set[str]) -> bool:
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        if n.name in names:
            return True
        for a in n.all_input_nodes:
            if a.name not in seen:
                seen.add(a.name)
                todo.append(a)
    return False


def _annotate_model(
    graph: nx.DiGraph,
    mf: ModelFile,
    model: torch.nn.Module,
    traced_batch_size: int,
    dtype: str,
    method: str,
) -> None:
    params = dict(model.named_parameters())  # de-duplicated: tied weights appear once
    graph.graph.update(
        file=str(mf.path),
        sha256=mf.sha256,
        args=mf.args,
        traced_batch_size=traced_batch_size,
        dtype=dtype,
        method=method,
        params=sum(p.numel() for p in params.values()),
        param_shapes={k: list(p.shape) for k, p in params.items()},
        param_dtype_bytes={k: element_bytes(p) for k, p in params.items()},
        param_owner=_param_aliases(model),
        modules={name: type(m).__name__ for name, m in model.named_modules()},
        containers=[
            name
            for name, m in model.named_modules()
            if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict))
        ],
        torch_version=torch.__version__,
        experts=expert_modules(model),
        tp_modules=tp_shardable_modules(model, graph),
    )


# What a Linear or Embedding subclass's own forward may run and still be a plain product
# (Falcon's FalconLinear computes x @ W.T + b): anything else, sharded, meets DTensors.
PRODUCT_OPS = MATMUL_OPS | {
    "aten.add.Tensor",
    "aten.embedding.default",
    "aten.t.default",  # the weight's transpose, as .t(), .T or .transpose(0, 1) trace
    "aten.numpy_T.default",
    "aten.transpose.int",
}


def tp_shardable_modules(model: torch.nn.Module, graph: nx.DiGraph | None = None) -> list[str]:
    """Paths of the modules tensor parallelism can shard through a ParallelStyle: an
    ``nn.Linear`` or ``nn.Embedding`` running the stock ``forward``, or any other module whose
    own parameters are a 2-D ``weight`` and at most a 1-D ``bias`` and whose ``forward`` takes
    one argument (transformers' ``Conv1D``): the styles convert that one argument. Which of
    them the sharding ILP styles depends on the ops their weight feeds
    (``planner.cost.sharding``). A module whose ``forward`` takes more (transformers' OPT
    positional embedding: a mask and keywords) would get the conversion on the wrong
    argument. A Linear or Embedding subclass with its own ``forward`` is sharded only where
    the trace (``graph``) shows that forward running a product and nothing else (Falcon's
    ``x @ W.T + b``): torch's styles run all of that forward on the sharded DTensor product,
    and Llama 4's router (an ``nn.Linear`` that goes on to top-k and scatter its scores) then
    fails, scatter having no sharding rule."""
    stock = {
        torch.nn.Linear: torch.nn.Linear.forward,
        torch.nn.Embedding: torch.nn.Embedding.forward,
    }
    ops: dict[str, set[str]] = {}
    for _, d in graph.nodes(data=True) if graph is not None else ():
        if not is_view(d["op"]):
            ops.setdefault(d.get("module", ""), set()).add(d["op"])
    found = []
    for name, m in model.named_modules():
        base = next((cls for cls in stock if isinstance(m, cls)), None)
        if base is None:
            keep = _weight_module(m)
        elif type(m).forward is stock[base]:
            keep = True
        else:  # its own forward: a plain product only
            keep = _weight_module(m) and bool(ops.get(name)) and ops[name] <= PRODUCT_OPS
        if keep:
            found.append(name)
    return sorted(found)


def _weight_module(m: torch.nn.Module) -> bool:
    params = dict(m.named_parameters(recurse=False))
    weight, bias = params.pop("weight", None), params.pop("bias", None)
    if params or weight is None or weight.dim() != 2 or (bias is not None and bias.dim() != 1):
        return False
    return forward_takes_one_argument(m)


def _param_aliases(model: torch.nn.Module) -> dict[str, str]:
    """Every name a parameter is reachable under -> its canonical (first) name."""
    return {n: first for first, names in parameter_names(model).items() for n in names}


# --------------------------------------------------------------------------- export path


def _graph_from_export(exported: torch.export.ExportedProgram, model: torch.nn.Module):
    """
    Long because it is one pass over the exported graph that records every attribute of a node
    together.
    """
    sig = exported.graph_signature
    gm = exported.graph_module
    kinds: dict[str, tuple[str, str]] = {}  # placeholder name -> (kind, fqn)
    for spec in sig.input_specs:
        kind = spec.kind.name.lower()  # parameter | buffer | constant_tensor | user_input
        kinds[spec.arg.name] = (kind, spec.target or spec.arg.name)
    # Parameters that train: a frozen weight (requires_grad False) needs no gradient, and a
    # product of it with an activation that needs none has no backward at all.
    grads = {n: p.requires_grad for n, p in model.named_parameters(remove_duplicate=False)}
    trainable = {
        name for name, (kind, fqn) in kinds.items() if kind == "parameter" and grads.get(fqn, True)
    }
    graph = OpGraph()
    order = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            kind, fqn = kinds.get(node.name, ("user_input", node.name))
            if kind == "user_input":
                val = node.meta.get("val")
                graph.add_node(
                    node.name,
                    op="input",
                    module="",
                    order=order,
                    shapes=[_shape(val)],
                    dtypes=[_dtype(val)],
                    out_bytes=tensor_bytes(val),
                    fwd_flops=0,
                    bwd_flops=0,
                    fwd_bytes=0,
                    bwd_bytes=0,
                    params=[],
                    args=[],
                    requires_grad=False,
                    saved=[],
                    mm_inner=None,
                )
                order += 1
            continue
        if node.op != "call_function":
            continue
        op = op_name(node.target)
        vals = node.meta.get("val")
        outs = list(vals) if isinstance(vals, (tuple, list)) else [vals]
        in_nodes = [a for a in node.all_input_nodes]
        in_vals = [a.meta.get("val") for a in _tensor_args(node)]
        in_shapes = [_shape(v) for v in in_vals]
        param_fqns = [
            kinds[a.name][1]
            for a in in_nodes
            if a.op == "placeholder" and kinds.get(a.name, ("",))[0] == "parameter"
        ]
        requires_grad = any(a.name in trainable for a in in_nodes) or any(
            graph.nodes[a.name].get("requires_grad", False) for a in in_nodes if a.name in graph
        )
        out_bytes = sum(tensor_bytes(o) for o in outs)
        fwd = forward_flops(op, in_shapes, _shape(outs[0]) if outs else None)
        needs_grad = [
            (a.op == "placeholder" and a.name in trainable)
            or (a.name in graph and graph.nodes[a.name].get("requires_grad", False))
            for a in _tensor_args(node)
        ]
        view = is_view(op)
        fwd_bytes = 0 if view else out_bytes + sum(tensor_bytes(v) for v in in_vals)
        graph.add_node(
            node.name,
            op=op,
            module=_module_path(node),
            order=order,
            shapes=[_shape(o) for o in outs],
            dtypes=[_dtype(o) for o in outs],
            out_bytes=0 if view else out_bytes,
            fwd_flops=fwd,
            bwd_flops=backward_flops(op, fwd, needs_grad),
            fwd_bytes=fwd_bytes,
            bwd_bytes=2 * fwd_bytes if requires_grad else 0,
            params=param_fqns,
            args=_serialise_args(node.args, kinds) + [_serialise_kwargs(node.kwargs, kinds)],
            requires_grad=requires_grad,
            saved=[],
            mm_inner=matmul_inner_dims(op, in_shapes, _shape(outs[0]) if outs else None),
        )
        order += 1
        for a in in_nodes:
            if a.name in graph:
                graph.add_edge(a.name, node.name, bytes=tensor_bytes(a.meta.get("val")))
    outputs = [n for n in gm.graph.nodes if n.op == "output"][0].all_input_nodes
    graph.graph["outputs"] = [n.name for n in outputs if n.name in graph]
    # Parameters the training forward never reads (DINOv2's mask token without a mask): no
    # gradient ever reaches them, which DDP takes for a hang unless told (runtime.parallelize).
    graph.graph["unread_params"] = sorted(
        kinds[n.name][1]
        for n in gm.graph.nodes
        if n.op == "placeholder" and kinds.get(n.name, ("",))[0] == "parameter" and not n.users
    )
    _measure_saved(exported, model, graph, kinds)
    return graph


def state_versions(model: torch.nn.Module) -> dict[str, tuple[int, int]]:
    """Each buffer's and parameter's identity and version: what an update in place or a
    reassignment changes."""
    tensors = [*model.named_buffers(), *model.named_parameters()]
    return {n: (id(t), t._version) for n, t in tensors}


def forward_state(model: torch.nn.Module, before: dict[str, tuple[int, int]]) -> list[str]:
    """Buffers and weights the training forward updated since ``before`` (``state_versions``,
    taken before the loss check's meta forwards): a spectral norm's power-iteration vectors,
    an EMA codebook, the rows an ``nn.Embedding(max_norm=...)`` renormalises in place. One
    process runs every micro-batch's forward on them in turn; a data-parallel replica runs
    only its own, so they, and the outputs that read them, drift (spectral-normalized linears
    at DP 2: the first loss off by 9e-5; a max-norm embedding at DP 2 under DDP ended 7.35
    from one process, exit 0). BatchNorm's running
    statistics are left out: each plan's ``batchnorm`` field says how they are kept, and in
    training no output reads them. torch.export does not list such updates when they run
    under no_grad with ``out=`` (the spectral norm's). Where the meta forward failed nothing
    changed, and nothing is told."""
    stats = {
        f"{m}.{b}" if m else b
        for m, mod in model.named_modules()
        if isinstance(mod, _BatchNorm)
        for b in ("running_mean", "running_var", "num_batches_tracked")
    }
    now = state_versions(model)
    return sorted(n for n in now if n not in stats and before.get(n) != now[n])


def matmul_inner_dims(op: str, in_shapes: list, out_shape) -> list | None:
    """The inner (reduction) dimension of a matrix product's GEMMs: [forward, the input
    gradient's, the other operand's gradient's, whether that last one grows with the batch].
    A GEMM with a short inner dimension runs below peak (``matmul_half_inner_dim``).
    Forward A[M,K] @ B[K,N] reduces over K; dA = dC @ B^T over N; dB = A^T @ dC over M, which
    for a weight is every token of the micro-batch."""
    if not out_shape or len(out_shape) < 2:
        return None
    shapes = [s for s in in_shapes if s]
    if is_grouped_mm(op) and len(shapes) >= 2 and len(shapes[1]) == 3:
        # each expert's weight gradient sums over the rows routed to it: S / E on average
        return [shapes[0][-1], out_shape[-1], max(1, out_shape[0] // shapes[1][0]), True]
    if op not in MATMUL_OPS:
        return None
    if op in ("aten.addmm.default", "aten.baddbmm.default"):
        shapes = shapes[1:]  # the added term first
    if len(shapes) < 2 or len(shapes[0]) < 2 and op != "aten.linear.default":
        return None
    k = shapes[0][-1]
    n = out_shape[-1]
    second_is_matrix = op in ("aten.linear.default", "aten.mm.default", "aten.addmm.default") or (
        len(shapes[1]) == 2
    )
    if second_is_matrix:  # a weight-like operand: its gradient sums over every leading row
        return [k, n, math.prod(out_shape[:-1]), True]
    return [k, n, out_shape[-2], False]


def _tensor_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    found: list[torch.fx.Node] = []

    def visit(a: Any) -> None:
        if isinstance(a, torch.fx.Node):
            if isinstance(a.meta.get("val"), torch.Tensor):
                found.append(a)
        elif isinstance(a, (list, tuple)):
            for x in a:
                visit(x)

    for a in node.args:
        visit(a)
    return found


def _module_path(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path, _type = list(stack.values())[-1]
    return _clean_path(path)


def _clean_path(path: str) -> str:
    # Non-strict export names modules by their FQN; strip any "L['self']." style prefix.
    for prefix in ("L['self'].", "L__self__.", "self."):
        path = path.removeprefix(prefix)
    return path


def _shape(v: Any) -> list[int] | None:
    if isinstance(v, torch.Tensor):
        return [int(d) for d in v.shape]
    return None


def _dtype(v: Any) -> str | None:
    if isinstance(v, torch.Tensor):
        return str(v.dtype).replace("torch.", "")
    return None


def _serialise(a: Any, kinds: dict[str, tuple[str, str]]) -> Any:
    if isinstance(a, torch.fx.Node):
        if a.op == "placeholder":
            kind, fqn = kinds.get(a.name, ("user_input", a.name))
            if kind == "parameter":
                return {"param": fqn}
            if kind == "buffer":
                return {"buffer": fqn}
            if kind != "user_input":
                return {"const": fqn}
        return {"node": a.name}
    if isinstance(a, (list, tuple)):
        return [_serialise(x, kinds) for x in a]
    if isinstance(a, bool) or a is None or isinstance(a, (int, float, str)):
        return a
    if isinstance(a, torch.SymInt):
        return int(a)
    return str(a)


def _serialise_args(args: tuple, kinds: dict[str, tuple[str, str]]) -> list[Any]:
    return [_serialise(a, kinds) for a in args]


def _serialise_kwargs(kwargs: dict, kinds: dict[str, tuple[str, str]]) -> dict[str, Any]:
    return {k: _serialise(v, kinds) for k, v in kwargs.items() if k not in ("device", "layout")}


# --------------------------------------------------------------------------- saved tensors


class _SavedTensorInterpreter(torch.fx.Interpreter):
    """Runs the exported graph with autograd on; records who produced and who saved each
    tensor kept for backward (by storage, so a view and its base count once)."""

    def __init__(self, gm: torch.fx.GraphModule, static_keys: set[int]) -> None:
        super().__init__(gm)
        self.current = ""
        self.static = static_keys
        self.producer: dict[int, str] = {}
        self.saved: dict[int, tuple[str, int]] = {}  # storage -> (saver, bytes)
        self.keep: list[torch.Tensor] = []  # keep storages alive so ids stay unique

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key is not None and key not in self.static and key not in self.saved:
            self.saved[key] = (self.current, t.untyped_storage().nbytes())
            self.keep.append(t)
        return t

    def run_node(self, n: torch.fx.Node) -> Any:
        self.current = n.name
        if n.op == "call_function" and n.target is torch.ops.aten.dropout.default:
            x, p, train = (list(n.args) + [None, None])[:3]
            x = self.env[x] if isinstance(x, torch.fx.Node) else x
            both = torch.ops.aten.native_dropout.default(x, p, True) if train and p else (x,)
            out, produced = both[0], list(both)
        elif (
            n.op == "call_function"
            and n.target is torch.ops.aten.scaled_dot_product_attention.default
        ):
            out, produced = self._fused_attention(n)
        else:
            out = super().run_node(n)
            produced = list(out) if isinstance(out, (tuple, list)) else [out]
        for t in produced:
            if isinstance(t, torch.Tensor):
                key = _storage_key(t)
                if key is not None:
                    self.producer.setdefault(key, n.name)
                    self.keep.append(t)
        return out

    def _fused_attention(self, n: torch.fx.Node) -> tuple[Any, list]:
        """SDPA as the fused kernel training runs (FlashAttention, or the CPU's flash kernel):
        on the meta device it would otherwise take the math path and save the s x s
        probabilities, which no real run keeps (they are recomputed in backward). The fused
        kernel saves q, k, v, the output and the log-sum-exp."""
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        q, k, v = args[:3]
        mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
        dropout = args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)
        causal = args[5] if len(args) > 5 else kwargs.get("is_causal", False)
        scale = args[6] if len(args) > 6 else kwargs.get("scale")
        # Masks built from shapes alone are gone by now (_drop_traced_causal_masks): one left
        # depends on the inputs. Grouped-query k and v stay compact, as fused kernels keep them.
        # SDPA turns a boolean mask into an additive one of the query's dtype before it calls a
        # fused kernel (torch's convert_boolean_attn_mask), and that is the mask it keeps.
        if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=q.dtype, device=mask.device).masked_fill(
                mask.logical_not(), float("-inf")
            )
        # Its meta kernel shapes the output like q; value heads narrower than the query/key
        # heads (DeepSeek's MLA: 192 against 128) are padded in, the output cut back after,
        # as FlashAttention's callers do.
        pad = q.shape[-1] - v.shape[-1] if q.dim() == v.dim() else 0
        try:
            both = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
                q, k, torch.nn.functional.pad(v, (0, pad)) if pad > 0 else v, dropout, causal,
                attn_mask=mask, scale=scale,
            )  # fmt: skip
        except (RuntimeError, NotImplementedError):
            # The meta kernel took every case tried (MLA head sizes, float and padding masks,
            # cross-attention, compact GQA, 3-D and 5-D inputs, fp16, dropout); a call it refuses
            # in another torch still traces, saving what the math path saves.
            out = super().run_node(n)
            return out, [out]
        out = both[0][..., : v.shape[-1]] if pad > 0 else both[0]
        return out, [out, *both[1:]]


def _data_dependent(exc: BaseException) -> bool:
    """Whether a trace failed on sizes that depend on tensor values."""
    text = str(exc)
    return (
        "DataDependent" in type(exc).__name__
        or "data-dependent" in text
        or "item() cannot be called on meta" in text
        or "Cannot copy out of meta tensor" in text  # .tolist() (Qwen2-VL's split sizes)
    )


def _export_failure(exc: BaseException) -> str:
    """torch.export's failure, with its message unless it is about data-dependent sizes (the
    hint after it says that better). A forward that fails its own shape checks (a config
    whose rotary size does not match its heads) must not read as data-dependent code."""
    name = type(exc).__name__
    if _data_dependent(exc):
        return name
    return f"{name}: {brief(str(exc))}"


def data_dependent_hint(model: torch.nn.Module) -> str:
    """What to do about a forward that decides its work from tensor values: for a model with
    experts, a dispatch of static sizes; otherwise the branch or check itself."""
    experts = any("expert" in name.lower() for name, _ in model.named_modules())
    if experts:
        return (
            "; the forward sizes its work from tensor values (.item() or .tolist(), such "
            "as tokens counted per expert), which a trace without data cannot follow: use "
            "an implementation that keeps sizes static (transformers' grouped_mm or "
            "batched_mm experts, a capacity-padded dispatch)"
        )
    return (
        "; the forward decides what to do from tensor values (a branch such as `if "
        "mask.any():`, a check such as `assert lengths.max() <= n`, .item(), nonzero()), which "
        "a trace without data cannot follow: make that code depend on shapes only (or move "
        "the check out of forward)"
    )


def _storage_key(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


def _measure_saved(
    exported: torch.export.ExportedProgram,
    model: torch.nn.Module,
    graph: nx.DiGraph,
    kinds: dict[str, tuple[str, str]],
) -> None:
    gm = exported.graph_module
    state = dict(model.named_parameters(remove_duplicate=False))
    state.update(dict(model.named_buffers(remove_duplicate=False)))
    state.update(exported.constants)
    args: list[torch.Tensor] = []
    static: set[int] = set()
    for spec in exported.graph_signature.input_specs:
        if spec.kind.name.lower() == "user_input":
            continue
        t = state[spec.target]
        if isinstance(t, torch.Tensor):
            trains = spec.kind.name.lower() == "parameter" and t.is_floating_point()
            t = t.detach().to("meta").requires_grad_(trains and t.requires_grad)
            key = _storage_key(t)
            if key is not None:
                static.add(key)
        args.append(t)
    user = [
        n
        for n in gm.graph.nodes
        if n.op == "placeholder" and kinds.get(n.name, ("user_input",))[0] == "user_input"
    ]
    for n in user:
        val = n.meta["val"]
        args.append(torch.empty(val.shape, dtype=val.dtype, device="meta"))
    interp = _SavedTensorInterpreter(gm, static)
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(interp.pack, _identity):
        interp.run(*args)
    for key, (saver, nbytes) in interp.saved.items():
        producer = interp.producer.get(key)
        if producer not in graph:
            producer = None
        if saver in graph:
            graph.nodes[saver]["saved"].append([producer, nbytes])


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


# --------------------------------------------------------------------------- hook fallback


def _trace_with_hooks(
    mf: ModelFile, model: torch.nn.Module, inputs: tuple, export_exc: BaseException
) -> nx.DiGraph:
    """One node per leaf module call, from forward hooks on the meta device.

    Long because the hooks share their state through closures; split, that state would have to
    become an object.
    """
    graph = OpGraph()
    producer: dict[int, str] = {}
    saved_seen: set[int] = set()
    names = {m: n for n, m in model.named_modules()}
    static = {_storage_key(p) for p in list(model.parameters()) + list(model.buffers())}
    current: list[str] = []
    pending_saved: dict[str, list] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key is not None and key not in static and key not in saved_seen and current:
            saved_seen.add(key)
            pending_saved.setdefault(current[-1], []).append(
                [producer.get(key), t.untyped_storage().nbytes()]
            )
        return t

    def pre_hook(module: torch.nn.Module, args: tuple) -> None:
        current.append(names[module])

    def post_hook(module: torch.nn.Module, args: tuple, output: Any) -> None:
        path = names[module]
        node = f"{path or 'root'}#{graph.number_of_nodes()}"
        outs = [o for o in (output if isinstance(output, (tuple, list)) else [output])]
        out_t = [o for o in outs if isinstance(o, torch.Tensor)]
        in_t = [a for a in args if isinstance(a, torch.Tensor)]
        params = [f"{path}.{n}" if path else n for n, _ in module.named_parameters(recurse=False)]
        if isinstance(module, torch.nn.Linear) and in_t and out_t:
            fwd = 2 * numel(out_t[0].shape) * in_t[0].shape[-1]
        elif isinstance(module, torch.nn.modules.conv._ConvNd) and out_t:
            fwd = 2 * numel(out_t[0].shape) * numel(module.weight.shape[1:])
        else:
            fwd = 0
        requires_grad = any(a.requires_grad for a in in_t) or bool(params)
        grads = (1 if in_t and in_t[0].requires_grad else 0) + (1 if params else 0)
        # Bytes moved: activations in and out, and the weights read (as on the export path).
        weights = [p for _, p in module.named_parameters(recurse=False)]
        io_bytes = sum(tensor_bytes(t) for t in in_t + out_t + weights)
        graph.add_node(
            node,
            op=f"module.{type(module).__name__}",
            module=path,
            order=graph.number_of_nodes(),
            shapes=[list(o.shape) for o in out_t],
            dtypes=[_dtype(o) for o in out_t],
            out_bytes=sum(tensor_bytes(o) for o in out_t),
            fwd_flops=fwd,
            bwd_flops=fwd * grads,
            fwd_bytes=io_bytes,
            bwd_bytes=2 * io_bytes if requires_grad else 0,
            params=[mf_alias.get(p, p) for p in params],
            args=[],
            requires_grad=requires_grad,
            saved=pending_saved.pop(path, []),
            mm_inner=None,
        )
        for a in in_t:
            src = producer.get(_storage_key(a))
            if src is not None and src != node:
                graph.add_edge(src, node, bytes=tensor_bytes(a))
        for o in out_t:
            producer[_storage_key(o)] = node
        current.pop()

    mf_alias = _param_aliases(model)
    leaves = [m for m in model.modules() if not list(m.children())]
    handles = []
    for m in leaves:
        handles.append(m.register_forward_pre_hook(pre_hook))
        handles.append(m.register_forward_hook(post_hook))
    try:
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, _identity):
            model(*inputs)
    except Exception as exc:
        where = current[-1] if current else "(top level)"
        if not _data_dependent(export_exc) and _data_dependent(exc):
            # the module trace runs on meta tensors and stopped at an ``.item()`` that export's
            # fake tensors passed, before the failure export reached: that one is the problem
            raise UserInputError(
                f"{mf.path.name}: cannot trace the model: its forward fails under torch.export: "
                f"{_export_failure(export_exc)} (does it run outside meshplan?)"
            ) from export_exc
        hint = data_dependent_hint(model) if _data_dependent(exc) else ""
        raise UserInputError(
            f"{mf.path.name}: cannot trace the model: torch.export failed "
            f"({_export_failure(export_exc)}) and its forward raised in module {where!r}: "
            f"{type(exc).__name__}: {brief(str(exc), 300)}{hint}"
        ) from exc
    finally:
        for h in handles:
            h.remove()
    if graph.number_of_nodes() == 0:
        raise UserInputError(f"{mf.path.name}: the model's forward ran no module with hooks")
    last = max(graph.nodes, key=lambda n: graph.nodes[n]["order"])
    graph.graph["outputs"] = [last]
    return graph
