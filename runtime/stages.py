"""Cut a model into pipeline stages at the plan's block boundaries, for any model.

``torch.distributed.pipelining.pipeline()`` traces the model with ``torch.export`` and splits
the graph before the first module of each stage's first block (``SplitPoint.BEGINNING``). The
glue code between modules (position ids, masks, rotary tables, residual adds) lands in the
stage that computes it; a value a later stage needs is relayed through the stages in between
(``relay_skip_connections``), because torch's schedules only talk to neighbouring stages.
Nothing in here knows the model.

The traced stage modules keep the model's module tree (as ``InterpreterModule``s with the same
paths), but tensor parallelism needs real ``nn.Linear``/``nn.Embedding`` modules and eager code
(``view(b, s, -1, d)`` infers the local head count). So every traced submodule that takes
exactly one input and returns one tensor, where the original module's ``forward`` takes exactly
one required argument, is swapped back for the original eager module: its call site passes that
one value, so the swap is exact: a GPT block runs fully eager. A block handed several tensors
(HF Llama's decoder layer: the stream, the mask, the rotary tables) is swapped back by the call
signature the stage's export keeps, its traced call rebuilt as the model made it
(``runtime.block_calls``). Parameters and buffers the swap does not reach become the model's
own tensors, found by path.
"""

from __future__ import annotations

import copy
import json
import operator
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.pipelining import SplitPoint
from torch.distributed.pipelining._IR import annotate_split_points

from planner.errors import UserInputError, brief
from planner.modelfile import forward_takes_one_argument, one_call_site
from planner.schema import Plan
from planner.vocab import keeps_dtensors
from runtime.block_calls import BlockCall, ModuleCalls, call_eagerly, signature_modules
from runtime.model_outputs import OutputLayout, traced_pipeline
from runtime.parallelize import called_paths, find_module


class PipelineCutError(UserInputError):
    """torch.distributed.pipelining's splitter refuses every cut of the plan (OpenAI GPT's
    layers, a list-returning block, fail inside torch.export's unflatten at each layer's
    start and end): the plan cannot run as a pipeline, whatever meshplan does."""


def split_points(plan: Plan, model: nn.Module) -> list[str]:
    """The module path where each stage after the first begins: its first block's first
    module, or where that is a ModuleList or ModuleDict (never called itself: ConvNeXt's
    one-layer ``stages.1.layers``), its first child, the first module the cut meets."""
    first_module = {b.name: b.modules[0] for b in plan.blocks}
    return [_called(model, first_module[st.blocks[0]]) for st in plan.stages[1:]]


def split_ends(plan: Plan, model: nn.Module) -> list[str]:
    """The module path after which each stage but the last ends: its last block's last module
    (or that container's last child). Where a stage's first module runs several times (one
    layer applied three times), a cut at its beginning splits at every call; the end of the
    module before it is met once."""
    last_module = {b.name: b.modules[-1] for b in plan.blocks}
    return [_called(model, last_module[st.blocks[-1]], last=True) for st in plan.stages[:-1]]


def _called(model: nn.Module, path: str, last: bool = False) -> str:
    """The first (or last) module ``path`` stands for when it runs (``called_paths``)."""
    paths = called_paths(model, path)
    return paths[-1 if last else 0] if paths else path


def traced_pipe(
    plan: Plan,
    model: nn.Module,
    example_inputs: tuple,
    traced: dict,
    calls: dict[str, ModuleCalls] | None = None,
) -> Any:
    """A private copy of the traced, split model; ``traced`` keeps the trace (the slow part)
    for later plans of the same model, micro-batch and cut. Cut at each stage's first module,
    or, where that makes more stages than the plan has, after each stage's last one. The
    pipe's ``meshplan_outputs`` rebuilds the model's output object from what its last stage
    returns (``runtime.model_outputs``); None where that is the one tensor the model returns.
    Its ``meshplan_block_calls``: the call signatures the export kept of the plan's blocks
    that ``calls`` (``block_calls.module_calls``) finds handed several tensors
    (``block_calls.signature_modules``); none where the export cannot keep them."""
    points = split_points(plan, model)
    # A block run on DTensors (``colwise_dtensor``) stays traced: eager, its attention's
    # backward meets the plain mask the model hands it beside DTensor activations (GPT-2's,
    # DeepSeek's and MiniCPM3's layers at pp 2 x tp 2), which DTensor refuses to mix
    blocks = [
        p
        for b in plan.blocks
        if not keeps_dtensors(b.tp_plan)
        for m in b.modules
        for p in called_paths(model, m)
    ]
    preserve = signature_modules(blocks, calls)
    key = json.dumps(
        [plan.model.sha256, plan.model.args, plan.micro_batch_size, points, preserve],
        sort_keys=True,
    )
    if key not in traced:
        tried, failed = [], []
        for spec in (
            {fqn: SplitPoint.BEGINNING for fqn in points},
            {fqn: SplitPoint.END for fqn in split_ends(plan, model)},
        ):
            try:
                pipe, out_spec, kept = _split(model, example_inputs, spec, preserve)
            except Exception as exc:  # noqa: BLE001 - torch's splitter refuses the cut
                failed.append(f"at {', '.join(spec)}: {type(exc).__name__}: {brief(exc, 200)}")
                continue
            tried.append(f"{pipe.num_stages} at {', '.join(spec)}")
            if pipe.num_stages == len(plan.stages):
                break
        else:
            if failed and not tried:
                raise PipelineCutError(
                    f"torch's pipelining cannot cut {plan.model.file} into the plan's "
                    f"{len(plan.stages)} stages ({'; '.join(failed)}): plan it again with --pp 1"
                )
            raise RuntimeError(
                f"tracing cut the model into {' or '.join(tried)} stages, the plan has "
                f"{len(plan.stages)}: a module where a stage begins or ends is not called once, "
                "in forward order"
            )
        pipe.meshplan_outputs = gather_model_outputs(pipe.split_gm, out_spec)
        pipe.meshplan_block_calls = kept
        relay_skip_connections(pipe.split_gm)
        contiguous_boundaries(pipe.split_gm)
        traced[key] = pipe
    return copy.deepcopy(traced[key])


def _split(
    model: nn.Module, example_inputs: tuple, spec: dict, preserve: tuple[str, ...]
) -> tuple[Any, Any, dict[str, BlockCall]]:
    """``traced_pipeline`` of a copy of ``model`` cut at ``spec``, keeping the call signatures
    of ``preserve``; where the export cannot keep them, traced again without (those blocks
    then run as traced code)."""
    if preserve:
        try:
            return _traced_copy(model, example_inputs, spec, preserve)
        except Exception:  # noqa: BLE001 - traced again without; that try's error decides
            pass
    return _traced_copy(model, example_inputs, spec, ())


def _traced_copy(
    model: nn.Module, example_inputs: tuple, spec: dict, preserve: tuple[str, ...]
) -> tuple[Any, Any, dict[str, BlockCall]]:
    traced_model = copy.deepcopy(model)
    annotate_split_points(traced_model, spec)
    return traced_pipeline(traced_model, example_inputs, inline_grad_mode_regions, preserve)


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous (it is sent to the stage before).
    ``copy``: the forward returns a copy, not a view, for a stage that modifies what it
    received in place (RegNet's ``hidden_state += residual`` right after a cut): autograd
    forbids in-place changes to a view a custom Function returned."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, copy: bool) -> torch.Tensor:  # noqa: ANN001
        return x.clone() if copy else x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        return grad.contiguous(), None


def contiguous_grad(x: torch.Tensor, copy: bool = False) -> torch.Tensor:
    return _ContiguousGrad.apply(x, copy) if x.requires_grad else x


def _writes_first_argument(node: torch.fx.Node) -> bool:
    """Whether ``node`` modifies its first argument in place (``add_``, ``copy_``, ...)."""
    target = node.target
    if node.op == "call_method":
        return isinstance(target, str) and target.endswith("_") and not target.endswith("__")
    schema = getattr(target, "_schema", None)
    if node.op != "call_function" or schema is None or not schema.arguments:
        return False
    alias = schema.arguments[0].alias_info
    return alias is not None and alias.is_write


def _views_first_argument(node: torch.fx.Node) -> bool:
    """Whether ``node``'s result aliases its first argument without writing it (a view)."""
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None or not schema.returns:
        return node.op == "call_method" and node.target in ("view", "view_as", "expand", "t")
    alias = schema.returns[0].alias_info
    return alias is not None and not alias.is_write


def mutated_in_place(node: torch.fx.Node, owner: torch.nn.Module) -> bool:
    """Whether ``owner``'s graph modifies ``node``'s tensor in place, directly, through views
    of it, or inside a submodule it is handed to (a stage's graph calls the model's modules)."""
    # a user is looked at once per value it reads: ``x.t().mul_(x)`` reads x directly and
    # writes it through the view, so seeing it from x first must not hide the write
    seen, todo = set(), [(node, owner)]
    while todo:
        n, mod = todo.pop()
        for user in n.users:
            if (n, user) in seen:
                continue
            seen.add((n, user))
            first = user.args[0] if user.args else None
            if first is n and _writes_first_argument(user):
                return True
            if first is n and _views_first_argument(user):
                todo.append((user, mod))
            if user.op == "call_module":
                todo += _parameters_receiving(n, user, mod)
    return False


def _parameters_receiving(
    n: torch.fx.Node, call: torch.fx.Node, mod: torch.nn.Module
) -> list[tuple[torch.fx.Node, torch.nn.Module]]:
    """The placeholders of the submodule ``call`` runs that receive ``n``."""
    sub = mod.get_submodule(call.target)
    graph = getattr(sub, "graph", None)
    if not isinstance(graph, torch.fx.Graph):
        return []
    places = [p for p in graph.nodes if p.op == "placeholder"]
    found = [places[i] for i, a in enumerate(call.args) if a is n and i < len(places)]
    named = {p.target: p for p in places}
    found += [named[k] for k, a in call.kwargs.items() if a is n and k in named]
    return [(p, sub) for p in found]


def _contiguous(graph: torch.fx.Graph, n: torch.fx.Node) -> torch.fx.Node:
    val = n.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return n
    out = graph.call_method("contiguous", (n,))
    out.meta = {**n.meta, "val": torch.empty(val.shape, dtype=val.dtype, device="meta")}
    return out


def contiguous_boundaries(split_gm: torch.fx.GraphModule) -> None:
    """Send and receive only contiguous tensors: gloo refuses any other ("input tensor has to
    be contiguous": the transposed attention outputs of transformers' OPT and T5). Each
    stage's outputs are made contiguous, its inputs' gradients (sent back) too, and its
    receive buffers, which torch's pipelining allocates with the strides the trace recorded,
    are declared contiguous; a received tensor the stage modifies in place is copied first
    (``_ContiguousGrad``). Values and gradients are unchanged."""
    for stage in split_gm.children():
        if not isinstance(stage, torch.fx.GraphModule):
            continue
        graph = stage.graph
        for node in list(graph.nodes):
            if node.op == "placeholder":
                val = node.meta.get("val")
                if isinstance(val, torch.Tensor) and not val.is_contiguous():
                    node.meta["val"] = torch.empty(val.shape, dtype=val.dtype, device="meta")
                if isinstance(val, torch.Tensor) and val.is_floating_point():
                    copy = mutated_in_place(node, stage)
                    with graph.inserting_after(node):
                        wrapped = graph.call_function(contiguous_grad, (node, copy))
                    wrapped.meta = dict(node.meta)
                    node.replace_all_uses_with(wrapped, lambda user, w=wrapped: user is not w)
            elif node.op == "output":
                with graph.inserting_before(node):
                    node.args = (torch.fx.map_arg(node.args[0], partial(_contiguous, graph)),)
        graph.lint()
        stage.recompile()


def inline_grad_mode_regions(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Replace each ``wrap_with_set_grad_enabled(False, ...)`` region of the exported graph (a
    ``torch.no_grad()`` block in the model, e.g. HF Llama's rotary embedding) by its own nodes
    with every output detached.

    torch 2.13's pipeline splitter mis-outlines these regions: the region's subgraph attribute
    becomes a zero-argument call of the enclosing module, which then fails with "Expected
    positional argument". Explicit ``_set_grad_enabled`` nodes do not work either: fx's
    ``split_module`` calls pipelining's stateful split callback twice per node when the graph
    has grad-mode nodes, and loses the partitions. Detaching the outputs of a no-grad region is
    exact for values and gradients (nothing computed inside it can receive a gradient); it only
    records a little autograd state inside the region."""
    hop = torch.ops.higher_order.wrap_with_set_grad_enabled
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not hop:
            continue
        enabled, body_ref, *operands = node.args
        if enabled:
            raise RuntimeError(
                "the model enables grad inside a no-grad region; pipelining cannot trace it"
            )
        body = getattr(gm, body_ref.target)
        meta = {k: node.meta[k] for k in ("nn_module_stack", "stack_trace") if k in node.meta}
        env: dict[torch.fx.Node, Any] = {}
        inputs = iter(operands)
        result: Any = None
        with graph.inserting_before(node):
            for inner in body.graph.nodes:
                if inner.op == "placeholder":
                    env[inner] = next(inputs)
                elif inner.op == "output":
                    result = torch.fx.map_arg(
                        inner.args[0], lambda n, env=env, meta=meta: _detach(graph, env[n], meta)
                    )
                else:
                    env[inner] = graph.node_copy(inner, lambda n, env=env: env[n])
                    if inner.op == "get_attr":  # a constant of the region: hoist it onto gm
                        name = f"_inlined_{body_ref.target}_{inner.target}"
                        setattr(gm, name, getattr(body, inner.target))
                        env[inner].target = name
                    env[inner].meta.update(meta)
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem:
                user.replace_all_uses_with(result[user.args[1]])
                graph.erase_node(user)
            else:
                user.replace_input_with(node, result)
        graph.erase_node(node)
        if not body_ref.users:
            graph.erase_node(body_ref)
    graph.lint()
    gm.recompile()
    return gm


def gather_model_outputs(split_gm: torch.fx.GraphModule, spec: Any) -> OutputLayout | None:
    """Make the last stage return every leaf of the model's output, in the order of
    ``spec`` (the exported output's structure), and return how to rebuild the output from
    them. torch's split leaves each output where it is computed: CLIP's vision hidden states
    end on the stage that runs the vision tower, and the loss, on the last, never saw them.
    The last stage now takes each such leaf as an input (``relay_skip_connections`` routes it
    there); a model input returned as an output is relayed the same way. None where the
    model returns one tensor and the last stage returns just it (nothing to rebuild)."""
    graph = split_gm.graph
    last = [n for n in graph.nodes if n.op == "call_module"][-1]
    out_node = next(n for n in graph.nodes if n.op == "output")
    flat = out_node.args[0]
    flat = tuple(flat) if isinstance(flat, (tuple, list)) else (flat,)
    if spec.is_leaf() and flat[0] is last:
        return None
    stage = split_gm.get_submodule(last.target)
    inner_out = next(n for n in stage.graph.nodes if n.op == "output")
    returned = inner_out.args[0]
    returned = tuple(returned) if isinstance(returned, (tuple, list)) else (returned,)
    constants: dict[int, Any] = {}
    leaves: list[torch.fx.Node] = []
    for pos, value in enumerate(flat):
        if not isinstance(value, torch.fx.Node):
            constants[pos] = value
        elif value is last:
            leaves.append(returned[0])
        elif value.target is operator.getitem and value.args[0] is last:
            leaves.append(returned[value.args[1]])
        else:  # computed on an earlier stage, or a model input
            leaves.append(_stage_input(split_gm, last, value))
    inner_out.args = (tuple(leaves),)
    stage.graph.lint()
    stage.recompile()
    old, fresh, anchor = list(last.users), [], last
    for i, leaf in enumerate(leaves):
        with graph.inserting_after(anchor):
            anchor = graph.call_function(operator.getitem, (last, i))
        if "val" in leaf.meta:
            anchor.meta["val"] = leaf.meta["val"]
        fresh.append(anchor)
    outputs = iter(fresh)
    out_node.args = (tuple(v if pos in constants else next(outputs) for pos, v in enumerate(flat)),)
    for user in old:
        if user is not out_node and not user.users:
            graph.erase_node(user)
    graph.lint()
    split_gm.recompile()
    return OutputLayout(spec, constants)


def _traced_value(split_gm: torch.fx.GraphModule, value: torch.fx.Node) -> Any:
    """The trace's example value of ``value``, an output of a stage (which the outer graph's
    nodes do not record) or a model input."""
    if "val" in value.meta:
        return value.meta["val"]
    index = value.args[1] if value.target is operator.getitem else None
    stage_node = value.args[0] if index is not None else value
    stage = split_gm.get_submodule(stage_node.target)
    returned = next(n for n in stage.graph.nodes if n.op == "output").args[0]
    return (returned[index] if index is not None else returned).meta.get("val")


def relay_skip_connections(split_gm: torch.fx.GraphModule) -> None:
    """Route every value that skips stages through the stages in between.

    HF Llama's stage 0 computes the rotary tables and the mask that every decoder layer reads.
    torch 2.13's pipelining refuses such skip connections: the single-stage schedules at the
    first backward when one output feeds several stages ("Backward of skip connections not
    supported yet", pipelining/stage.py) and the multi-stage schedules (interleaved 1F1B)
    outright ("only supports adjacent-stage communication"). So each intermediate stage
    receives the value as one more input and returns it as one more output; gradients come
    back the same way (the relay is an identity). A model input a later stage reads (the input
    a residual layer's shortcut takes when the cut falls inside that layer, a mask every layer
    reads) is relayed from the first stage, which torch hands all of them, read or not: only
    the first stage receives the model's inputs ("expected non-root _RecvInfo"), and it is
    called with every one ("takes 3 positional arguments but 4 were given")."""
    graph = split_gm.graph
    stages = [n for n in graph.nodes if n.op == "call_module"]
    index = {n: i for i, n in enumerate(stages)}
    roots = [n for n in graph.nodes if n.op == "placeholder"]
    for root in roots:  # torch hands the first stage every model input, read or not
        _stage_input(split_gm, stages[0], root)
    _inputs_in_model_order(split_gm, stages[0], roots)
    relayed: dict[tuple[torch.fx.Node, int], torch.fx.Node] = {}
    for j, consumer in enumerate(stages):
        for p in range(len(consumer.args)):
            value = consumer.args[p]  # re-read: a pass-through may have rewired it
            if not isinstance(value, torch.fx.Node):
                continue
            if value in roots and j > 0:  # a model input read after the first stage
                first = -1
            else:
                src = value.args[0] if value.target is operator.getitem else value
                if src not in index or index[src] >= j - 1:
                    continue
                first = index[src]
            cur = value
            for m in range(first + 1, j):
                if (value, m) not in relayed:
                    relayed[(value, m)] = _pass_through(split_gm, stages[m], cur)
                cur = relayed[(value, m)]
            consumer.update_arg(p, cur)
    for producer, consumer in zip(stages, stages[1:]):
        _align_outputs(split_gm, producer, consumer)
    graph.lint()
    split_gm.recompile()


def _inputs_in_model_order(
    split_gm: torch.fx.GraphModule, stage_node: torch.fx.Node, roots: list[torch.fx.Node]
) -> None:
    """Order the first stage's inputs as the model's: the schedule passes them positionally,
    and the split keeps them in the order the stage first reads them (BERT's embeddings read
    the ids and token types before the encoder reads the mask, so a mask and token types of
    one shape and dtype were swapped, silently)."""
    stage = split_gm.get_submodule(stage_node.target)
    inner = stage.graph
    places = [n for n in inner.nodes if n.op == "placeholder"]
    args = list(stage_node.args)
    own = dict(zip(args, places))
    order = [r for r in roots if r in own] + [a for a in args if a not in roots]
    if order != args:
        anchor = places[0].prev  # the graph's root sentinel, before every placeholder
        for a in order:
            anchor.append(own[a])
            anchor = own[a]
        stage_node.args = tuple(order)
        inner.lint()
    stage.recompile()  # inputs may just have been added (``_stage_input``)


def _align_outputs(
    split_gm: torch.fx.GraphModule, producer: torch.fx.Node, consumer: torch.fx.Node
) -> None:
    """Order the producer's outputs as the consumer's inputs. Stages send their outputs in
    output order and receive in input order over one gloo/NCCL pair; after relaying the two
    differ, and gloo aborts on the size mismatch."""
    graph = split_gm.graph
    stage = split_gm.get_submodule(producer.target)
    out_node = next(n for n in stage.graph.nodes if n.op == "output")
    outs = out_node.args[0]
    if not isinstance(outs, (tuple, list)):
        return
    old = {u.args[1]: u for u in producer.users if u.target is operator.getitem}
    order: list[int] = []
    for a in consumer.args:
        if a.target is operator.getitem and a.args[0] is producer and a.args[1] not in order:
            order.append(a.args[1])
    perm = order + [k for k in range(len(outs)) if k not in order]
    if perm == list(range(len(outs))) and len(old) == len(outs):
        return
    out_node.args = (tuple(outs[k] for k in perm),)
    stage.recompile()
    anchor = producer
    for new_index, k in enumerate(perm):
        with graph.inserting_after(anchor):
            fresh = graph.call_function(operator.getitem, (producer, new_index))
        if k in old:
            fresh.meta = dict(old[k].meta)
            old[k].replace_all_uses_with(fresh)
        else:
            fresh.meta = {"val": outs[k].meta.get("val")} if "val" in outs[k].meta else {}
        anchor = fresh
    for g in old.values():
        graph.erase_node(g)


def _stage_input(
    split_gm: torch.fx.GraphModule, stage_node: torch.fx.Node, value: torch.fx.Node
) -> torch.fx.Node:
    """The placeholder of ``stage_node``'s stage that receives ``value``, made (as its last
    input) where the stage does not take it yet."""
    inner = split_gm.get_submodule(stage_node.target).graph
    placeholders = [n for n in inner.nodes if n.op == "placeholder"]
    if value in stage_node.args:
        return placeholders[list(stage_node.args).index(value)]
    where = placeholders[-1] if placeholders else None
    with inner.inserting_after(where) if where else inner.inserting_before(next(iter(inner.nodes))):
        ph = inner.placeholder(f"input_{len(placeholders)}")
    ph.meta = dict(value.meta)
    ph.meta.setdefault("val", _traced_value(split_gm, value))
    stage_node.args = (*stage_node.args, value)
    return ph


def _pass_through(
    split_gm: torch.fx.GraphModule, stage_node: torch.fx.Node, value: torch.fx.Node
) -> torch.fx.Node:
    """Make ``stage_node``'s stage take ``value`` (unless it already does) and return it as
    its last output; the getitem of that output in the outer graph is returned."""
    graph = split_gm.graph
    stage = split_gm.get_submodule(stage_node.target)
    inner = stage.graph
    ph = _stage_input(split_gm, stage_node, value)
    out_node = next(n for n in inner.nodes if n.op == "output")
    outs = out_node.args[0]
    if not isinstance(outs, (tuple, list)):  # one output: make it a tuple, and index it outside
        users = list(stage_node.users)
        with graph.inserting_after(stage_node):
            first = graph.call_function(operator.getitem, (stage_node, 0))
        first.meta = dict(stage_node.meta)
        for user in users:
            user.replace_input_with(stage_node, first)
        outs = (outs,)
    out_node.args = ((*outs, ph),)
    stage.recompile()
    last = max(stage_node.users, key=_position(graph))
    with graph.inserting_after(last):
        got = graph.call_function(operator.getitem, (stage_node, len(outs)))
    got.meta = dict(ph.meta)
    return got


def _position(graph: torch.fx.Graph):
    order = {n: i for i, n in enumerate(graph.nodes)}
    return lambda n: order[n]


def _detach(graph: torch.fx.Graph, value: torch.fx.Node, meta: dict) -> torch.fx.Node:
    out = graph.call_function(torch.ops.aten.detach.default, (value,))
    out.meta.update(value.meta)
    out.meta.update(meta)
    return out


def _single_tensor_io(traced: nn.Module) -> bool:
    graph = getattr(traced, "graph", None)
    if not isinstance(graph, torch.fx.Graph):
        return False
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    outputs = [n for n in graph.nodes if n.op == "output"]
    return (
        len(placeholders) == 1
        and len(outputs) == 1
        and isinstance(outputs[0].args[0], torch.fx.Node)
    )


def _the_traced_output(module: nn.Module, _args: tuple, out: Any) -> Any:
    """What the traced module returned in place of the eager one's output: the one tensor in
    it that the caller reads. Swin's patch embedding returns (embeddings, output_dimensions);
    the trace folds the sizes into constants, so the traced module returns the embeddings
    alone, and its caller in the traced graph reads them as a tensor. gpt-oss's MLP returns
    (output, router scores) and its caller reads the output alone, so the trace dropped the
    scores: the tensor kept is the one of the traced output's rank (where several are, its
    shape, then its dtype)."""
    if isinstance(out, torch.Tensor):
        return out
    leaf = getattr(module, "_meshplan_output_leaf", None)
    if leaf is not None:  # known from the call signature (runtime.block_calls)
        return torch.utils._pytree.tree_leaves(out)[leaf]
    tensors = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    found = len(tensors)
    want = getattr(module, "_meshplan_traced_output", None)
    if len(tensors) > 1 and want is not None:
        # rank first: a run's dtype (mixed precision) and local shapes (TP) can differ from
        # the trace's; they only break ties
        dtype, shape = want
        for alike in (
            lambda t: t.dim() == len(shape),
            lambda t: tuple(t.shape) == shape,
            lambda t: t.dtype == dtype,
        ):
            if len(tensors) > 1:
                tensors = [t for t in tensors if alike(t)]
    if len(tensors) != 1:
        raise RuntimeError(
            f"{type(module).__name__} returns {found} tensors where its traced copy returned "
            f"one, and {len(tensors)} of them look like it: this module cannot run eagerly "
            "inside a pipeline stage"
        )
    return tensors[0]


def _traced_output(traced: nn.Module) -> tuple[torch.dtype, tuple[int, ...]] | None:
    """(dtype, shape) of the one tensor a traced module returns, from the trace's metadata."""
    out = next(n for n in traced.graph.nodes if n.op == "output").args[0]
    val = out.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    try:
        return val.dtype, tuple(int(d) for d in val.shape)
    except (TypeError, ValueError):  # a symbolic size: compare dtype and rank alone
        return val.dtype, tuple(-1 for _ in val.shape)


def adopt_eager_modules(
    stage: nn.Module,
    model: nn.Module,
    cuts: list[str],
    one_tensor: set[str] | None = None,
    calls: dict[str, BlockCall] | None = None,
) -> list[str]:
    """Swap traced submodules for the model's eager ones where exact (see the module docstring)
    and make every other parameter and buffer the model's own tensor, found by path. Returns
    the swapped paths. ``one_tensor``: the modules called with one tensor alone
    (``block_calls.module_calls``); None: every module whose forward takes one argument.
    ``calls``: the kept call signatures of blocks handed several tensors
    (``runtime.block_calls``), whose traced calls are rebuilt to call the eager module.

    ``cuts``: the split points. A module with a cut inside runs only part of its forward in
    this stage (a ResNet's ``nn.Sequential`` of blocks cut at a shortcut), so the eager module,
    which would run all of it, is never swapped in. A module called twice is traced twice
    (``embed`` and ``embed@1``: one table for source and target tokens); both call sites are
    the model's one module and share its tensors, as in one process."""
    eager = dict(model.named_modules())
    swapped: list[str] = []
    for fqn, traced in list(stage.named_modules()):
        if not fqn or any(fqn.startswith(s + ".") for s in swapped):
            continue
        if any(cut.startswith(fqn + ".") for cut in cuts):
            continue
        original = eager.get(one_call_site(fqn))
        if original is None:
            continue
        read = None  # the leaf of the eager module's output that the traced code reads
        if not (
            _single_tensor_io(traced)
            and forward_takes_one_argument(original)
            and (one_tensor is None or one_call_site(fqn) in one_tensor)
        ):
            read = call_eagerly(stage, fqn, calls[fqn]) if calls and fqn in calls else None
            if read is None:
                continue
        parent_path, _, name = fqn.rpartition(".")
        parent = stage.get_submodule(parent_path) if parent_path else stage
        setattr(parent, name, original)
        original._meshplan_traced_output = _traced_output(traced)
        original._meshplan_output_leaf = read
        if not getattr(original, "_meshplan_one_tensor", False):
            original.register_forward_hook(_the_traced_output)
            original._meshplan_one_tensor = True
        swapped.append(fqn)
    for fqn in swapped:
        # A stage that runs only a later call of a module (``layers.0@1``) also has torch's
        # holder of that module's tensors at its own path (a bare nn.Module): it becomes the
        # eager module as well, so that every path to them (the TP plan's names, the
        # checkpoint's) reaches one module, not a holder TP cannot shard
        base = one_call_site(fqn)
        if base == fqn or type(find_module(stage, base)) is not nn.Module:
            continue
        parent_path, _, name = base.rpartition(".")
        setattr(stage.get_submodule(parent_path) if parent_path else stage, name, eager[base])
    sources = dict(model.named_parameters(remove_duplicate=False))
    sources.update(dict(model.named_buffers(remove_duplicate=False)))
    held = [
        *stage.named_parameters(remove_duplicate=False),
        *stage.named_buffers(remove_duplicate=False),
    ]
    for name, tensor in held:
        src = sources.get(one_call_site(name))
        if src is None or src is tensor or src.shape != tensor.shape:
            continue
        parent_path, _, attr = name.rpartition(".")
        owner = stage.get_submodule(parent_path) if parent_path else stage
        table = owner._parameters if attr in owner._parameters else owner._buffers
        table[attr] = src
    return swapped


def keep_unused_tensors(stages: list[nn.Module], model: nn.Module, first: nn.Module) -> list[str]:
    """Hand ``first`` (the pipeline's first stage) the model's parameters and persistent buffers
    that no stage holds, as buffers under their own paths, and return their paths.

    The split keeps what each stage's traced code reads, so a tensor the forward never reads
    (DINOv2's mask token, used only with a mask the training batch does not pass) belonged to
    no stage and was missing from every checkpoint: a model saved by the pipeline could not be
    loaded back whole. It gets no gradient, as in one process, where the optimizer skips it; a
    buffer keeps the data-parallel wrappers from waiting for its gradient."""
    held = {
        one_call_site(name)
        for stage in stages
        for name, _ in [
            *stage.named_parameters(remove_duplicate=False),
            *stage.named_buffers(remove_duplicate=False),
        ]
    }
    kept = []
    wanted = model.state_dict(keep_vars=True)
    # a tied weight held under one of its names is held under all
    held_ids = {id(t) for name, t in wanted.items() if name in held}
    for name, tensor in wanted.items():
        if name in held or not isinstance(tensor, torch.Tensor) or id(tensor) in held_ids:
            continue
        owner = first
        *path, attr = name.split(".")
        for part in path:
            if not hasattr(owner, part):
                owner.add_module(part, nn.Module())
            owner = getattr(owner, part)
        if attr in owner._parameters or attr in owner._buffers:
            continue
        owner.register_buffer(attr, tensor.detach(), persistent=True)
        kept.append(name)
    return kept


def stage_module_name(index: int) -> str:
    from torch.distributed.pipelining._IR import get_submod_name

    return get_submod_name(index)


# Nodes a stage graph puts between a module call and a stage's input or output, each passing
# its first argument's value on unchanged (contiguous_boundaries' and the split's own).
def _passes_value(node: torch.fx.Node) -> bool:
    if node.op == "call_method" and node.target == "contiguous":
        return True
    return node.op == "call_function" and node.target in (
        contiguous_grad,
        torch.ops.aten.alias.default,
    )


def _through(node: Any) -> Any:
    while isinstance(node, torch.fx.Node) and _passes_value(node):
        node = node.args[0]
    return node


def _input_of(gm: nn.Module, path: str, prefix: str = "") -> int | None:
    """The index of ``gm``'s placeholder that module ``path`` is called with as its first
    argument, through the traced module calls around it (``InterpreterModule``s)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n in gm.graph.nodes:
        full = f"{prefix}{n.target}" if n.op == "call_module" else ""
        if not full or not (full == path or path.startswith(full + ".")):
            continue
        k = 0 if full == path else _input_of(gm.get_submodule(n.target), path, full + ".")
        arg = _through(n.args[k]) if k is not None and k < len(n.args) else None
        return placeholders.index(arg) if arg in placeholders else None
    return None


def _flat(args: Any) -> list:
    if isinstance(args, (tuple, list)):
        return [x for a in args for x in _flat(a)]
    return [args]


def _sharded_meta(node: torch.fx.Node, tp: int) -> None:
    """The node's traced value as one TP rank's sequence shard (dim 1 split ``tp`` ways)."""
    val = node.meta["val"]
    shape = list(val.shape)
    shape[1] //= tp
    node.meta["val"] = torch.empty(shape, dtype=val.dtype, device="meta")


class _SequenceLayout(nn.Module):
    """The stream turned from whole to each TP rank's sequence shard (``to_shard``: a slice,
    whose backward all-gathers the gradient) or back (an all-gather, whose backward slices),
    at a pipeline cut whose block on this side does not do it itself."""

    def __init__(self, mesh: Any, to_shard: bool) -> None:
        super().__init__()
        self.mesh, self.to_shard = mesh, to_shard

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor, Replicate, Shard

        have, want = (Replicate(), Shard(1)) if self.to_shard else (Shard(1), Replicate())
        dt = DTensor.from_local(x, self.mesh, [have], run_check=False)
        return dt.redistribute(self.mesh, [want]).to_local().contiguous()


def sequence_stream_links(pipe: Any, plan: Plan) -> dict[int, tuple[int, int]]:
    """Per stage that receives the stream as sequence shards (``StagePlan.
    receives_sequence_shard``): (j, k), output j of the stage before is its input k, the
    stream its first block's first module is called with (first positional argument: read
    after every stage's eager modules are adopted, whose calls pass what the model passed,
    and before ``send_sequence_shards`` changes any stage's inputs)."""
    links = {}
    top = {n.target: n for n in pipe.split_gm.graph.nodes if n.op == "call_module"}
    by_name = {b.name: b for b in plan.blocks}
    for st in plan.stages:
        if not st.receives_sequence_shard:
            continue
        stage_mod = pipe.get_stage_module(st.index)
        path = _called(stage_mod, by_name[st.blocks[0]].modules[0])
        k = _input_of(stage_mod, path)
        call = top.get(stage_module_name(st.index))
        arg = call.args[k] if call is not None and k is not None and k < len(call.args) else None
        j = 0
        if isinstance(arg, torch.fx.Node) and arg.target is operator.getitem:
            arg, j = arg.args
        if not isinstance(arg, torch.fx.Node) or arg.target != stage_module_name(st.index - 1):
            raise UserInputError(
                f"plan sends the stream into stage {st.index} as sequence shards, but {path}'s "
                "input there does not come from the stage before: plan again with --pp 1 or "
                "without sequence parallelism"
            )
        links[st.index] = (j, k)
    return links


def send_sequence_shards(
    stage_mod: nn.Module, plan: Plan, index: int, mesh: Any, links: dict[int, tuple[int, int]]
) -> None:
    """Make pipeline stage ``index`` receive and send the residual stream as each TP rank's
    sequence shard where the plan says so (``sequence_stream_links``; Megatron-Core sends
    seq_length / tp under sequence parallelism). torch's stage sizes its receive buffers, and
    the gradients it receives for its outputs, from the traced values of its inputs and
    outputs, so those become 1/tp along the sequence. Where the block beside the cut does not
    take or leave the shard itself (``BlockPlan.takes_sequence_shard``), the stage gathers
    what it receives, or slices what it sends."""
    by_name = {b.name: b for b in plan.blocks}
    stage = plan.stages[index]
    graph, tp = stage_mod.graph, mesh.size()
    if index in links:
        k = links[index][1]
        ph = [n for n in graph.nodes if n.op == "placeholder"][k]
        _sharded_meta(ph, tp)
        if not by_name[stage.blocks[0]].takes_sequence_shard:
            stage_mod.add_module("meshplan_sequence_gather", _SequenceLayout(mesh, False))
            with graph.inserting_after(ph):
                whole = graph.call_module("meshplan_sequence_gather", (ph,))
            ph.replace_all_uses_with(whole, delete_user_cb=lambda user: user is not whole)
    if index + 1 in links:
        j = links[index + 1][0]
        out = next(n for n in graph.nodes if n.op == "output")
        value = _flat(out.args[0])[j]
        if not by_name[stage.blocks[-1]].leaves_sequence_shard:
            stage_mod.add_module("meshplan_sequence_slice", _SequenceLayout(mesh, True))
            with graph.inserting_before(out):
                shard = graph.call_module("meshplan_sequence_slice", (value,))
            shard.meta = dict(value.meta)
            out.args = (_replace_at(out.args[0], j, shard),)
            value = shard
        _sharded_meta(value, tp)
    if hasattr(stage_mod, "recompile"):
        stage_mod.recompile()


def _replace_at(args: Any, j: int, new: Any) -> Any:
    """``args`` (an output's nested tuples) with its ``j``-th leaf, in ``_flat``'s order, new."""
    leaves = _flat(args)
    leaves[j] = new
    it = iter(leaves)

    def rebuild(a: Any) -> Any:
        if isinstance(a, (tuple, list)):
            return type(a)(rebuild(x) for x in a)
        return next(it)

    return rebuild(args)
