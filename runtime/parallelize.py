"""Apply a plan's per-block choices to a module with torch.distributed's own implementations.

The same functions serve the whole model (pp == 1) and one pipeline stage module (pp > 1):
pipeline stage modules keep the model's module paths, so the plan's FQNs address both. The
order is torchtitan's: tensor parallel, then activation checkpointing, then data parallel.
"""

from __future__ import annotations

import weakref
from functools import partial

import torch
from torch import nn
from torch.distributed._composable import checkpoint as composable_checkpoint
from torch.distributed._composable.replicate_with_fsdp import ReplicateModule, replicate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.placement_types import _StridedShard
from torch.nn.parallel import DistributedDataParallel

from planner.checkpoint_policy import RESHARDED_STYLES, selective_context
from planner.errors import UserInputError
from planner.modelfile import DTYPES
from planner.schema import BlockPlan, Plan
from planner.vocab import (
    HALF_DTYPES,
    SEQUENCE_STYLES,
    Offload,
    Recompute,
    base_style,
    split_factor,
    weight_in_out,
)
from runtime.batchnorm import recompute_context
from runtime.dtensor_blocks import fsdp_placement, register_cpu_attention_sharding, run_on_dtensors
from runtime.local_attributes import set_local_attributes
from runtime.selective import checkpoint_holding_shard, resharded_running, track_resharded
from runtime.tied import splits_tie, tied_groups

HALF = {name: DTYPES[name] for name in HALF_DTYPES}


def find_module(root: nn.Module, fqn: str) -> nn.Module | None:
    try:
        return root.get_submodule(fqn)
    except AttributeError:
        return None


def scalar_parameters(root: nn.Module, besides: set | None = None) -> list[nn.Parameter]:
    """The 0-dim parameters (a gate, CLIP's logit scale, a temperature), less ``besides``.
    FSDP2's ``fully_shard`` and ``replicate`` refuse them ("doesn't support scalar
    parameters"; a ZeRO-3 plan of such a model crashed every worker), so every data-parallel
    wrapper leaves them out and ``Built.sync_gradients`` averages theirs over the replicas."""
    besides = besides or set()
    return [p for p in root.parameters() if p.dim() == 0 and p not in besides]


def dense_embedding_gradients(root: nn.Module) -> list[str]:
    """Give the weights of embeddings built with ``sparse=True`` dense gradients instead; the
    paths of those changed. FSDP2 (ZeRO-2/3, and the ``replicate`` that holds TP's and a
    pipeline's replicas) cannot reduce a sparse gradient (no sparse ``chunk_cat``) and DTensor
    has no sparse ops: each crashed every worker. A dense gradient holds the same numbers,
    zeros in the rows no sample looked up, so SGD's step, momentum included, is the same (5
    steps of a sparse and a dense embedding under SGD with momentum ended 5e-7 apart in fp32);
    AdamW refuses sparse gradients even in one process. The cost model prices dense ones."""
    changed = []
    for name, module in root.named_modules():
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.sparse:
            module.sparse = False
            changed.append(name)
    return changed


def route_direct_forwards(root: nn.Module, paths: list[str]) -> None:
    """Make ``module.forward(x)``, called directly by the model's code (``plan.model.
    direct_forward``: SqueezeBERT's encoder calls its layers so), go through ``module(x)``.
    FSDP2 gathers a unit's weights, the composable checkpoint saves and recomputes, and
    sequence parallelism slices and gathers, all in the module's forward hooks, which a
    direct call skips: a ZeRO-3 SqueezeBERT ran its layer on the shards and failed ("mixed
    torch.Tensor and DTensor"). The instance's ``forward`` becomes a function that enters
    ``__call__`` when called from outside it and runs the class's forward when ``__call__``
    calls it (a pre-hook marks the call). Hooks registered later (FSDP2's, the checkpoint's)
    fire as for any other module."""
    for path in paths:
        module = find_module(root, path)
        if module is None or "forward" in vars(module):
            continue
        inner = module.forward  # the class's forward, bound
        calls: list[bool] = []

        def enter(_m, _args, calls=calls) -> None:
            calls.append(True)

        def leave(_m, _args, _out, calls=calls) -> None:
            if calls:
                calls.pop()

        def forward(*args, module=module, inner=inner, calls=calls, **kwargs):
            return inner(*args, **kwargs) if calls else module(*args, **kwargs)

        module.register_forward_pre_hook(enter, prepend=True)
        module.register_forward_hook(leave, always_call=True)
        module.forward = forward


def called_paths(root: nn.Module, fqn: str) -> list[str]:
    """The paths of the modules a block's path stands for when it runs, in order: the module
    itself, or for a ModuleList or ModuleDict, which is never called (ConvNeXt's one-layer
    ``stages.1.layers``), its children's, whose calls FSDP's and the checkpoint's hooks, and a
    pipeline's cuts, must meet."""
    module = find_module(root, fqn)
    if module is None:
        return []
    if isinstance(module, (nn.ModuleList, nn.ModuleDict)):
        return [
            p for name, _ in module.named_children() for p in called_paths(root, f"{fqn}.{name}")
        ]
    return [fqn]


def called_modules(root: nn.Module, fqn: str) -> list[nn.Module]:
    """The modules of ``called_paths``."""
    return [root.get_submodule(p) for p in called_paths(root, fqn)]


def tp_style(
    module: nn.Module,
    style: str,
    fqn: str,
    traced_parent: bool = False,
    stream: tuple[bool, bool] = (False, False),
) -> ParallelStyle:
    """The plan's style name for one nn.Linear / nn.Embedding as a torch ParallelStyle.

    ``traced_parent``: the code around this module is a traced pipeline-stage graph, whose
    shapes were fixed at trace time (HF Llama's ``repeat_kv`` expands to the traced head
    count), so it cannot consume a local shard: a "colwise" output is gathered right away and
    a "rowwise" module takes a replicated input and shards it itself. Same numbers, more
    communication than the plan priced.

    Sequence parallel (activations split along dim 1 between the norms): "sp_block" slices the
    block's input and gathers its output, so the code around the block sees full tensors;
    "sequence" runs a norm on the local slice (its DTensor output keeps global shapes for the
    code that reads them); "colwise_sp" gathers its own input, "rowwise_sp" reduce-scatters its
    output to the sequence shard. Their "_tokens" forms do the same along dim 0 of a region
    whose (batch, sequence) the code flattened into one dim (OPT's MLP): each rank's shard is
    its own tokens flattened, and the gather and the reduce-scatter keep that order.
    ``stream``: (takes, leaves) of an "sp_block" inside Megatron's sequence-sharded stream
    (``BlockPlan.takes_sequence_shard``): it is entered with the shard the block before left,
    and/or leaves its output as the shard."""
    if traced_parent and style in SEQUENCE_STYLES:
        raise UserInputError(
            f"plan runs {fqn} sequence-parallel, but a pipeline stage runs its block as traced "
            "code with fixed shapes: plan again with --pp 1, or without sequence parallelism"
        )
    if style == "sp_block":
        takes, leaves = stream
        return PrepareModuleInputOutput(
            input_layouts=(Shard(1) if takes else Replicate(),),
            desired_input_layouts=(Shard(1),),
            use_local_input=True,
            output_layouts=(Shard(1),),
            desired_output_layouts=(Shard(1) if leaves else Replicate(),),
            use_local_output=True,
        )
    if style in ("sequence", "sequence_tokens"):
        return SequenceParallel(sequence_dim=_sharded_dim(style))
    if style in ("colwise_sp", "colwise_sp_tokens"):
        return ColwiseParallel(input_layouts=Shard(_sharded_dim(style)))
    if style in ("rowwise_sp", "rowwise_sp_tokens"):
        return _Rowwise(output_layouts=Shard(_sharded_dim(style)))
    if weight_in_out(style):
        return _in_out_style(base_style(style), traced_parent, split_factor(style))
    if not isinstance(module, (nn.Linear, nn.Embedding)):
        raise UserInputError(
            f"plan shards {fqn} ({type(module).__name__}) with tensor parallelism, but only "
            "nn.Linear and nn.Embedding can be sharded: plan again with --tp 1"
        )
    if base_style(style) == "colwise_dtensor":
        k = split_factor(style)
        if k > 1:
            if traced_parent:
                return _BlocksColwise(k, output_layouts=Replicate())
            return _BlocksColwise(k, use_local_output=False)
        if traced_parent:
            return _GatheredColwise(output_layouts=Replicate())
        return ColwiseParallel(use_local_output=False)
    if base_style(style) == "colwise_gather" and split_factor(style) > 1:
        return _BlocksColwise(split_factor(style), output_layouts=Replicate())
    if style == "colwise" and not traced_parent:
        return ColwiseParallel()
    if style in ("colwise", "colwise_gather"):
        return _GatheredColwise(output_layouts=Replicate())
    if isinstance(module, nn.Embedding) or traced_parent:
        # rowwise: an embedding's vocabulary split (ids arrive replicated), or see above
        return _Rowwise(input_layouts=Replicate())
    return _Rowwise()


# One DTensor per plain tensor that column-parallel modules read (see _shared_input):
# (id of the tensor, id of the mesh, layouts) -> weak references to the tensor and the DTensor
_SHARED_INPUTS: dict[tuple, tuple[weakref.ref, weakref.ref]] = {}


def _shared_input(input_layouts, desired_input_layouts, mod, inputs, device_mesh):  # noqa: ANN001, ANN201
    """ColwiseParallel's input preparation, with one DTensor however many column-parallel
    modules read the same plain tensor (q, k and v; gate and up). Their input gradients,
    partial sums, then add up before one all-reduce, Megatron's one per producer, which the
    plan prices (``cost.sharding``); torch's style converts and reduces per module, one
    all-reduce of the layer's input per projection in backward."""
    x = inputs[0]
    if not isinstance(x, DTensor):
        key = (id(x), id(device_mesh), tuple(input_layouts))
        hit = _SHARED_INPUTS.get(key)
        shared = hit[1]() if hit is not None and hit[0]() is x else None
        if shared is None:
            shared = DTensor.from_local(x, device_mesh, input_layouts, run_check=False)
            if len(_SHARED_INPUTS) > 4096:  # forget the tensors that are gone
                for k in [k for k, (t, d) in _SHARED_INPUTS.items() if t() is None or d() is None]:
                    del _SHARED_INPUTS[k]
            _SHARED_INPUTS[key] = (weakref.ref(x), weakref.ref(shared))
        x = shared
    if input_layouts != desired_input_layouts:
        x = x.redistribute(placements=desired_input_layouts, async_op=True)
    return x


def _sharing_inputs(style: ParallelStyle) -> ParallelStyle:
    if isinstance(style, ColwiseParallel):
        style._prepare_input_fn = _shared_input  # _apply reads it from the instance
    return style


def _sharded_dim(style: str) -> int:
    """The dim a sequence-parallel style shards: the sequence (1), or for a "_tokens" style
    the flattened (batch x sequence) tokens (0)."""
    return 0 if style.endswith("_tokens") else 1


class _Rowwise(RowwiseParallel):
    """RowwiseParallel whose local output is its own tensor, not a view DTensor's to_local
    made inside an autograd Function: model code adds to it in place (Falcon's
    ``mlp_output += attention_output``), which autograd forbids on such a view. One copy of
    the block's output per row-parallel module."""

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):  # noqa: ANN001, ANN205
        out = RowwiseParallel._prepare_output_fn(
            output_layouts, use_local_output, mod, outputs, device_mesh
        )
        return out.clone() if use_local_output else out


def _output_split(dim: int, blocks: int) -> Shard:
    """The placement of a column-parallel weight's output dim: contiguous, or by blocks (each
    rank holds its slice of each of the ``blocks`` equal blocks: ``runtime.dtensor_blocks``)."""
    return _StridedShard(dim, split_factor=blocks) if blocks > 1 else Shard(dim)


def _gathered_output(output_layouts, use_local_output, mod, outputs, device_mesh):  # noqa: ANN001, ANN201
    """ColwiseParallel's output conversion; a gathered (replicated) local output is its own
    tensor, not the view DTensor's to_local makes inside an autograd Function: model code
    writes into the gathered output in place (Chameleon masks its image tokens' logits with
    ``logits[:, :, ids] = min``), which autograd forbids on such a view. One copy of the
    gathered output, as ``_Rowwise`` copies its own."""
    out = ColwiseParallel._prepare_output_fn(
        output_layouts, use_local_output, mod, outputs, device_mesh
    )
    gathered = isinstance(output_layouts[0], Replicate)
    own = use_local_output and gathered and not isinstance(out, DTensor)
    return out.clone() if own else out


class _GatheredColwise(ColwiseParallel):
    """ColwiseParallel with its output gathered into a tensor of its own (``_gathered_output``)."""

    _prepare_output_fn = staticmethod(_gathered_output)


def _blocks_output(output_layouts, use_local_output, mod, outputs, device_mesh):  # noqa: ANN001, ANN201
    """ColwiseParallel's output conversion, except that an output sharded by blocks stays so
    (the code after it splits the blocks apart) unless a replicated one is asked for."""
    if (
        isinstance(outputs, DTensor)
        and isinstance(outputs.placements[0], _StridedShard)
        and not isinstance(output_layouts[0], Replicate)
    ):
        return outputs.to_local() if use_local_output else outputs
    return _gathered_output(output_layouts, use_local_output, mod, outputs, device_mesh)


class _BlocksColwise(ColwiseParallel):
    """ColwiseParallel for an nn.Linear whose output is ``blocks`` equal blocks sharded alike:
    the weight's rows and the bias split by blocks; its output a DTensor in that layout."""

    def __init__(self, blocks: int, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.blocks = blocks

    _prepare_output_fn = staticmethod(_blocks_output)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return _apply_own(self, module, device_mesh, lambda p: _output_split(0, self.blocks))


class _InOutColwise(ColwiseParallel):
    """ColwiseParallel for a weight stored [in, out] and applied as x @ W + b (transformers'
    Conv1D), which torch's styles do not take: W split along dim 1 and b along dim 0
    (contiguously, or by ``blocks``). The module's own forward then runs on DTensors."""

    def __init__(self, blocks: int = 1, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.blocks = blocks

    _prepare_output_fn = staticmethod(_blocks_output)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return _apply_own(
            self, module, device_mesh, lambda p: _output_split(p.dim() - 1, self.blocks)
        )


class _InOutRowwise(_Rowwise):
    """RowwiseParallel for a weight stored [in, out]: W split along dim 0, b replicated."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        self.desired_input_layouts = (Shard(-1),)  # x's last dim split, as W's dim 0
        return _apply_own(
            self, module, device_mesh, lambda p: Shard(0) if p.dim() == 2 else Replicate()
        )


def _apply_own(style, module: nn.Module, mesh: DeviceMesh, placement) -> nn.Module:  # noqa: ANN001
    """``style``'s input and output conversions around ``module``, whose own parameters
    become DTensors placed by ``placement(param)``."""

    def partition(_name: str, mod: nn.Module, _mesh: DeviceMesh) -> None:
        for name, param in list(mod.named_parameters(recurse=False)):
            shard = distribute_tensor(
                param, mesh, [placement(param)], src_data_rank=style.src_data_rank
            )
            mod.register_parameter(name, nn.Parameter(shard, requires_grad=param.requires_grad))

    return distribute_module(
        module,
        mesh,
        partition,
        partial(style._prepare_input_fn, style.input_layouts, style.desired_input_layouts),
        partial(style._prepare_output_fn, style.output_layouts, style.use_local_output),
    )


def _in_out_style(base: str, traced_parent: bool, blocks: int = 1) -> ParallelStyle:
    if base == "colwise_dtensor" and not traced_parent:
        return _InOutColwise(blocks, use_local_output=False)
    if base == "colwise" and not traced_parent:
        return _InOutColwise()
    if base.startswith("colwise"):
        return _InOutColwise(blocks, output_layouts=Replicate())
    if traced_parent:
        return _InOutRowwise(input_layouts=Replicate())
    return _InOutRowwise()


def grad_sum_modules(
    root: nn.Module, blocks: list[BlockPlan], gathered: list[str] = ()
) -> list[nn.Module]:
    """The modules in ``root`` whose own parameters' gradients the plan sums over the TP group
    (``BlockPlan.tp_grad_sums``: replicated weights of a sharded computation, such as a
    per-head norm with the heads split, whose gradient each rank holds only its share of).

    Not where traced pipeline-stage code runs the computation on whole tensors: a module whose
    input crosses traced code (``_meets_traced_code``), or one in the same eager subtree as a
    column-parallel module ``apply_tensor_parallel`` had to gather (``gathered``): each rank
    then holds the whole gradient already."""
    found = []
    for block in blocks:
        for fqn in block.tp_grad_sums:
            module = find_module(root, fqn)
            if module is None or _meets_traced_code(root, fqn, block.tp_plan):
                continue
            scope = _traced_scope(root, fqn)
            if scope is not None and any(in_module(g, scope) for g in gathered):
                continue
            found.append(module)
    return found


def sum_partial_gradients(modules: list[nn.Module], tp_mesh: DeviceMesh) -> None:
    """All-reduce (sum) over the TP group the gradients of these modules' own parameters that
    are not TP DTensors (DTensor reduces those itself); once per step, after backward."""
    if tp_mesh.size() == 1:
        return
    group = tp_mesh.get_group()
    for module in modules:
        for p in module.parameters(recurse=False):
            if p.grad is None or (
                isinstance(p, DTensor) and "tp" in (p.device_mesh.mesh_dim_names or ())
            ):
                continue
            if not isinstance(p, DTensor) and isinstance(p.grad, DTensor):
                continue  # read inside a DTensor block: DTensor tracks the sum (whole_gradients)
            local = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            torch.distributed.all_reduce(local, group=group)


def gather_sequence(module: nn.Module, regather_in_backward: bool = False) -> None:
    """Before ``module`` runs, turn every sequence-sharded DTensor it is given (a norm's output
    under SequenceParallel) into a replicated one: one all-gather that the column-parallel
    weights inside share, wherever the model passes it (positionally or by keyword).

    ``regather_in_backward``: what the module saves for backward of the gathered tensor is kept
    as the shard and gathered again when backward needs it (Megatron's sequence parallelism,
    through torch's saved-tensor hooks): 1/t of the memory for one more all-gather. Only where
    no checkpoint of the block holds its own saved-tensor hooks (recompute "none")."""
    gathered: list[tuple[torch.Tensor, DTensor]] = []  # (full local tensor, its shard)
    regathered: dict[int, list] = {}  # shard id -> [full local tensor, handles left]
    contexts: list = []

    def full(x: object) -> object:
        if isinstance(x, DTensor) and any(isinstance(p, Shard) for p in x.placements):
            out = x.redistribute(placements=[Replicate()] * len(x.placements))
            if regather_in_backward:
                gathered.append((out.to_local(), x))
            return out
        return x

    def local_of(t: torch.Tensor) -> torch.Tensor:
        return t._local_tensor if isinstance(t, DTensor) else t

    def pack(t: torch.Tensor) -> object:
        loc = local_of(t)
        for whole, shard in gathered:
            if loc.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr():
                entry = regathered.setdefault(id(shard), [None, 0])
                entry[1] += 1
                spec = (loc.size(), loc.stride(), loc.storage_offset())
                mesh = (t.device_mesh, t.placements, t.size(), t.stride()) if t is not loc else None
                return ("regather", shard, spec, mesh)
        return t

    def unpack(packed: object) -> torch.Tensor:
        if not (isinstance(packed, tuple) and packed and packed[0] == "regather"):
            return packed
        _, shard, (size, stride, offset), mesh = packed
        entry = regathered[id(shard)]
        if entry[0] is None:
            with torch.no_grad():
                entry[0] = shard.redistribute(
                    placements=[Replicate()] * len(shard.placements)
                ).to_local()
        loc = entry[0].as_strided(size, stride, offset)
        entry[1] -= 1
        if entry[1] == 0:
            del regathered[id(shard)]
        if mesh is None:
            return loc
        device_mesh, placements, shape, dstride = mesh
        return DTensor.from_local(loc, device_mesh, placements, shape=shape, stride=dstride)

    def pre(_m: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        gathered.clear()
        result = tuple(full(a) for a in args), {k: full(v) for k, v in kwargs.items()}
        if gathered and torch.is_grad_enabled():
            ctx = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
            ctx.__enter__()
            contexts.append(ctx)
        return result

    def post(_m: nn.Module, _args: tuple, output: object) -> object:
        while contexts:
            contexts.pop().__exit__(None, None, None)
        gathered.clear()
        return output

    module.register_forward_pre_hook(pre, with_kwargs=True)
    module.register_forward_hook(post)


def is_traced(module: nn.Module) -> bool:
    from torch.export.unflatten import InterpreterModule

    return isinstance(module, (InterpreterModule, torch.fx.GraphModule))


def in_module(fqn: str, module: str) -> bool:
    return not module or fqn == module or fqn.startswith(module + ".")


def _traced_scope(root: nn.Module, fqn: str) -> str | None:
    """The outermost eager module around ``fqn`` (``fqn`` itself included) whose parent is
    traced code, or None where no ancestor is traced (an eager model or stage)."""
    scope = fqn
    while scope:
        parent_path = scope.rpartition(".")[0]
        parent = find_module(root, parent_path) if parent_path else root
        if parent is None:
            return None
        if is_traced(parent):
            return scope
        scope = parent_path
    return None


def _meets_traced_code(root: nn.Module, fqn: str, tp_plan: dict[str, str]) -> bool:
    """Whether the local shard of a column- or row-parallel module would cross traced code.

    A pipeline stage runs traced code with its eager submodules swapped back where exact
    (``runtime.stages``): a column-parallel module whose row-parallel partner sits in the same
    eager subtree hands its shard over in eager code; one whose output leaves that subtree
    (BERT's intermediate projection, read by a traced output module) must gather, and a
    row-parallel module with no column-parallel partner in its subtree gets whole inputs."""
    scope = _traced_scope(root, fqn)
    if scope is None:
        return False
    if scope == fqn:
        return True
    partner = "rowwise" if tp_plan.get(fqn, "").startswith("colwise") else "colwise"
    return not any(
        other.startswith(scope + ".") and base_style(style).startswith(partner)
        for other, style in tp_plan.items()
    )


def apply_tensor_parallel(
    root: nn.Module, blocks: list[BlockPlan], tp_mesh: DeviceMesh
) -> list[str]:
    """parallelize_module with every tp_plan entry whose module lives in ``root``; returns the
    paths whose sharded output had to be gathered because traced code consumes it."""
    if tp_mesh.size() == 1:
        return []
    styles: dict[str, ParallelStyle] = {}
    gathered: list[str] = []
    scopes: set[str] = set()  # modules running on DTensors (runtime.dtensor_blocks)
    # parallelize_module walks named_children, which name a module held twice once (a stage
    # running a later call of a module holds it at ``layers.0@1`` and ``layers.0``): a style
    # goes under the path that walk reaches
    reached: dict[int, str] = {}
    for path, m in root.named_modules():
        reached.setdefault(id(m), path)
    for block in blocks:
        for fqn, style in block.tp_plan.items():
            module = find_module(root, fqn)
            if module is None:
                continue
            traced = base_style(style) != "colwise_gather" and _meets_traced_code(
                root, fqn, block.tp_plan
            )
            if style == "sp_block":  # entered and left with full tensors: any caller will do
                traced = is_traced(module)
            if style == "sp_gather":
                if traced or is_traced(module):
                    tp_style(module, style, fqn, True)  # raises: traced code cannot
                # a checkpoint of the block holds its own saved-tensor hooks: keep the gathered
                # tensor there (its recompute gathers again anyway)
                gather_sequence(module, regather_in_backward=block.recompute == Recompute.NONE)
                continue
            if style == "colwise_sp_tokens":  # gathers its norm's sharded output in its own
                # hook (before its style's), keeping the shard for backward as "sp_gather" does
                gather_sequence(module, regather_in_backward=block.recompute == Recompute.NONE)
            stream = (bool(block.takes_sequence_shard), bool(block.leaves_sequence_shard))
            styles[reached.get(id(module), fqn)] = _sharing_inputs(
                tp_style(module, style, fqn, traced, stream)
            )
            if traced:
                gathered.append(fqn)
            elif base_style(style) == "colwise_dtensor":
                scope = _traced_scope(root, fqn)
                scopes.add(scope or next((m for m in block.modules if in_module(fqn, m)), ""))
    if styles:
        ties = tied_groups(root)
        parallelize_module(root, tp_mesh, styles)
        if scopes:
            register_cpu_attention_sharding()
        for scope in sorted(scopes):
            run_on_dtensors(find_module(root, scope) if scope else root)
        retie(root, ties)
    set_local_attributes(root, blocks, tp_mesh.size(), gathered)
    return gathered


def retie(root: nn.Module, ties: dict[str, list[str]]) -> None:
    """Make each tied weight one tensor again after parallelize_module: it distributes each
    module's weight on its own, so a vocabulary-parallel embedding and the head that shares its
    weight come out as two DTensors with the same shards. Every path is pointed at the sharded
    one, also the paths of holders no style touched (a parent that only keeps its head's bias,
    BERT's: a holder that read it whole would fail loudly on the DTensor); holders that shard
    it differently would train two tensors: an error."""
    for canonical, names in ties.items():
        params = [root.get_parameter(n) for n in names]
        if all(p is params[0] for p in params):
            continue
        sharded = [p for p in params if isinstance(p, DTensor)]
        if len({(p.device_mesh, tuple(p.placements)) for p in sharded}) != 1:
            raise UserInputError(
                f"the plan shards the tied weight {canonical} ({', '.join(names)}) differently "
                "in its modules, which would train two tensors: plan again with this version "
                "of meshplan (it splits a tied weight along its first dimension everywhere or "
                "nowhere) or with --tp 1"
            )
        for name in names:
            parent_path, _, attr = name.rpartition(".")
            parent = root.get_submodule(parent_path) if parent_path else root
            setattr(parent, attr, sharded[0])


def is_sequence_parallel(block: BlockPlan) -> bool:
    return "sp_block" in block.tp_plan.values()


def apply_recompute(
    root: nn.Module,
    blocks: list[BlockPlan],
    before_tp: bool = False,
    tp_mesh: DeviceMesh | None = None,
) -> None:
    """Non-reentrant checkpointing of each module of a recomputed block (``Recompute.FULL``),
    or the same with a policy that saves matrix-product outputs (``Recompute.SELECTIVE``). The
    checkpoint works through hooks, so module paths (and checkpoint keys) do not change.

    A sequence-parallel block is checkpointed before its TP styles are applied (``before_tp``,
    with the TP group ``tp_mesh``): the checkpoint's hooks then run outside the block's
    slice-at-entry and gather-at-exit, so the recompute slices the same replicated input
    again (entered inside the slice, a hook-based checkpoint's recompute, which calls the
    block with its hooks, would slice the shard again; and a selective policy's cache needs
    the forward's ops re-run in order); it keeps that input as this rank's sequence shard
    (``runtime.selective``). After
    the styles (the others, torchtitan's order), the selective policy of such a block learns
    where its row-parallel modules run, to keep their reduce-scattered outputs."""
    for block in blocks:
        if block.recompute == Recompute.NONE:
            continue
        sequence_parallel = is_sequence_parallel(block)
        if sequence_parallel and not before_tp:
            if block.recompute == Recompute.SELECTIVE:
                track_resharded(
                    [
                        module
                        for fqn, style in block.tp_plan.items()
                        if style in RESHARDED_STYLES
                        for module in called_modules(root, fqn)
                    ]
                )
        elif sequence_parallel == before_tp:
            if sequence_parallel and tp_mesh is None:
                raise ValueError(f"checkpointing sequence-parallel {block.name} needs its TP mesh")
            # a block that takes the stream's shard receives it: the checkpoint holds it as is
            slices = sequence_parallel and not block.takes_sequence_shard
            for module in (m for fqn in block.modules for m in called_modules(root, fqn)):
                _checkpoint(module, block.recompute, sequence_parallel, tp_mesh if slices else None)


def _checkpoint(
    module: nn.Module, recompute: Recompute, resharded: bool, tp_mesh: DeviceMesh | None
) -> None:
    """Checkpoint ``module`` (see ``apply_recompute``); ``resharded``: a sequence-parallel
    block, whose row-parallel modules keep their reduce-scattered outputs; ``tp_mesh``: that of
    one entered with the replicated input, which the checkpoint keeps as this rank's shard."""
    if recompute == Recompute.FULL:
        inner = None
    elif resharded:
        inner = partial(selective_context, resharded_running)
    else:
        inner = selective_context
    context = recompute_context(module, inner)
    if tp_mesh is not None:
        checkpoint_holding_shard(module, tp_mesh, context)
    else:
        composable_checkpoint(module, **({"context_fn": context} if context else {}))


def _trained(module: nn.Module) -> bool:
    """Whether ``module`` holds a parameter that trains. A unit of several modules gets FSDP's
    pre-backward hook on its last module's output only; a frozen last module (Pegasus'
    sinusoidal positions, after its encoder's final norm) gives it no gradient to fire on, and
    the norm's backward then found its weight resharded. Frozen modules stay with the root."""
    return any(p.requires_grad for p in module.parameters())


def block_units(
    root: nn.Module,
    blocks: list[BlockPlan],
    keep_empty: bool = False,
    read_outside: frozenset[str] = frozenset(),
) -> list[list[nn.Module]]:
    """Per block, the modules that form its data-parallel unit (FSDP2's fully_shard or
    replicate): the block's trained modules, less any that hold a tied weight (those join the
    root unit with the weight's other holders) or a weight code outside them reads
    (``read_outside``, ``plan.model.read_outside``: ``h @ self.embed.weight.T`` in the
    model's own forward met the embedding's unit resharded, a DTensor, under ZeRO-3).
    ``keep_empty``: one entry per block, an empty list where nothing is left."""
    ties = tied_groups(root)
    units: list = []
    for block in blocks:
        fqns = [
            f
            for f in block.modules
            if not splits_tie(f, ties) and not any(p.startswith(f + ".") for p in read_outside)
        ]
        modules = [m for f in fqns for m in called_modules(root, f) if _trained(m)]
        if modules or keep_empty:
            units.append(modules)
    return units


def _unit(modules: list[nn.Module]) -> nn.Module | list[nn.Module]:
    """One module as itself (FSDP2 names a unit of one after it), several as a list."""
    return modules[0] if len(modules) == 1 else modules


def apply_data_parallel(
    root: nn.Module,
    blocks: list[BlockPlan],
    plan: Plan,
    dp_mesh: DeviceMesh,
    device: torch.device,
    ignored: set | None = None,
) -> nn.Module:
    """ZeRO 0: DDP, or replicate (FSDP2's DDP) with TP, PP or GPU mixed precision, or nothing
    for one replica (unless replicate must cast parameters for GPU mixed precision);
    1: DDP plus ZeroRedundancyOptimizer; 2: fully_shard per block, parameters kept unsharded
    between forward and backward;
    3: fully_shard per block, resharded after forward. ``ignored``: parameters that keep their
    own gradient sync (expert-parallel experts). Returns the module to call.

    Long because the choice of torch wrapper per ZeRO stage reads as one decision list in this
    docstring's order."""
    ignored = ignored or set()
    read_outside = frozenset(plan.model.read_outside or [])
    zero = plan.zero_stage
    on_gpu = device.type == "cuda"
    mp = mixed_precision(plan, device)
    has_dtensors = any(
        isinstance(p, torch.distributed.tensor.DTensor)
        for p in root.parameters()
        if p not in ignored
    )
    pipelined = plan.mesh.pp > 1
    if dp_mesh.size() == 1 and zero in (0, 1) and mp.param_dtype is None:
        # One replica: nothing to reduce. A wrapper would only add its hooks to every micro-batch
        # and (replicate) turn the parameters into DTensors whose optimizer step dispatches
        # several times slower on a CPU: a GPT-small 2-stage pipeline, 4 micro-batches, ran
        # 84-94 ms a step with it and 71-79 ms without on the development VM.
        return root
    if zero == 0 and (has_dtensors or mp.param_dtype is not None or pipelined):
        # DDP can neither hold TP's DTensors nor cast parameters for mixed precision, and a
        # pipeline stage must stay the GraphModule torch's pipelining split out (DDP wraps it).
        # One unit per block, as fully_shard's below: each block's gradients are reduced as
        # its backward ends (the overlap the cost model prices) and its cast and reduce
        # buffers live one block at a time. One unit over the whole model reduced everything
        # after the last backward and held every 16-bit gradient beside its fp32 reduce
        # buffer: a Llama-3B step on an H200 peaked 6.9 GiB above its forward (2026-11-26).
        for modules in block_units(root, blocks, read_outside=read_outside):
            replicate(_unit(modules), mesh=dp_mesh, mp_policy=mp, ignored_params=ignored or None)
        return replicate(root, mesh=dp_mesh, mp_policy=mp, ignored_params=ignored or None)
    if zero in (0, 1):
        # Plain DDP otherwise: replicate keeps every parameter as a DTensor, and the optimizer
        # step's per-tensor DTensor dispatch costs several times a plain step on the CPU.
        if zero == 1 and has_dtensors:
            raise UserInputError(
                "ZeRO-1 with tensor parallelism: torch's ZeroRedundancyOptimizer cannot hold "
                "DTensor parameters; plan again with --zero 0, 2 or 3"
            )
        ids = [device.index] if on_gpu else None
        # DDP waits for every parameter's gradient and fails the next step when one never
        # comes: parameters the forward never reads carry no gradient in one process either,
        # so DDP skips them; a model traced by hooks has no list, and DDP looks for them
        # itself each step
        unread = set(plan.model.unread_params)
        names = [n for n, p in root.named_parameters() if p in ignored or n in unread]
        if names:
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(root, names)
        return DistributedDataParallel(
            root,
            device_ids=ids,
            process_group=dp_mesh.get_group(),
            find_unused_parameters=plan.model.trace == "hooks",
        )
    reshard = zero == 3
    offloaded = []
    units = block_units(root, blocks, keep_empty=True, read_outside=read_outside)
    for block, modules in zip(blocks, units):
        if not modules:
            continue
        offload = block.offload == Offload.PARAMS
        offloaded.append(offload)
        policy = CPUOffloadPolicy(pin_memory=on_gpu) if offload else None
        fully_shard(
            _unit(modules),
            mesh=dp_mesh,
            reshard_after_forward=reshard,
            mp_policy=mp,
            ignored_params=ignored or None,
            shard_placement_fn=fsdp_placement,
            **({"offload_policy": policy} if policy else {}),
        )
    root_offload = bool(offloaded) and all(offloaded)
    fully_shard(
        root,
        mesh=dp_mesh,
        reshard_after_forward=reshard,
        mp_policy=mp,
        ignored_params=ignored or None,
        shard_placement_fn=fsdp_placement,
        **({"offload_policy": CPUOffloadPolicy(pin_memory=on_gpu)} if root_offload else {}),
    )
    return root


def mixed_precision(plan: Plan, device: torch.device) -> MixedPrecisionPolicy:
    """FSDP2's (and replicate's) precision for the plan on ``device``: on GPUs a 16-bit plan
    computes in its dtype and reduces gradients in the plan's ``reduce_dtype`` (fp32, or the
    16-bit dtype itself: the unsharded gradients then accumulate over micro-batches and are
    reduce-scattered in 16 bits, the reduced shard cast back to the fp32 parameter's dtype);
    CPU ranks train in fp32 and cast nothing."""
    if device.type != "cuda" or plan.dtype not in HALF:
        return MixedPrecisionPolicy()
    reduce = HALF.get(plan.reduce_dtype, torch.float32)
    return MixedPrecisionPolicy(param_dtype=HALF[plan.dtype], reduce_dtype=reduce)


def ddp_autocast_dtype(model: nn.Module, plan: Plan, device: torch.device) -> torch.dtype | None:
    """The 16-bit dtype a GPU plan's forward must run under ``torch.autocast`` when DDP holds
    the model (ZeRO-1: torch's ZeroRedundancyOptimizer cannot hold replicate's DTensors):
    DDP casts nothing, as FSDP2's MixedPrecisionPolicy does, so the plan would train in fp32
    while the cost model priced 16-bit products. Autocast keeps the fp32 parameters (the
    optimizer's master weights) and caches one 16-bit copy of each weight per forward, the
    2 bytes per parameter the cost model counts. None: nothing to do."""
    if device.type != "cuda" or plan.dtype not in HALF:
        return None
    return HALF[plan.dtype] if isinstance(model, DistributedDataParallel) else None


def shard_experts(
    root: nn.Module, experts: list, edp_mesh: DeviceMesh, plan: Plan, device: torch.device
) -> list:
    """ZeRO 2/3 for expert-parallel experts: each experts module is its own FSDP unit over the
    ranks that hold the same experts (``edp``, dp / ep of them), so its gradients and optimizer
    states (and under ZeRO-3 its weights) shard over them, as the cost model prices it. Their
    gradient already sums the tokens of the whole ep group; FSDP sums over edp and divides by
    dp, the average every other gradient gets. Returns the expert parameters that still need
    ``sync_expert_grads`` (all of them below ZeRO-2, or with one copy of each expert)."""
    if plan.zero_stage < 2 or edp_mesh.size() == 1 or not experts:
        return experts
    ids = {id(p) for p in experts}
    mp = mixed_precision(plan, device)
    modules = [
        m
        for m in root.modules()
        if (own := list(m.parameters(recurse=False))) and all(id(p) in ids for p in own)
    ]
    for module in modules:
        fully_shard(module, mesh=edp_mesh, reshard_after_forward=plan.zero_stage == 3, mp_policy=mp)
        module.set_force_sum_reduction_for_comms(True)  # gloo has no pre-scaled sum
        module.set_gradient_divide_factor(float(plan.mesh.dp))
    return []


def make_optimizers(
    parts: list[nn.Module], plan: Plan, dp_mesh: DeviceMesh, experts: list | None = None
) -> list:
    """One optimizer per module part (and per device its parameters live on); ZeRO-1 shards
    its states with ZeroRedundancyOptimizer.
    ``experts``: expert-parallel parameters (compared by identity: a pipeline stage's move to
    its device swaps DTensor parameters' contents in place, so no mark on them survives)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from runtime.optim import optimizer_class, optimizer_kwargs, step_kwargs

    cls = optimizer_class(plan.optimizer)
    kwargs = optimizer_kwargs(plan.optimizer, float(plan.lr))
    if plan.zero_stage == 1:
        kwargs.update(step_kwargs([q for p in parts for q in p.parameters()]))
        # Expert-parallel experts differ between dp ranks: ZeRO-1 over dp would overwrite them
        # with their owner's copy, so they keep a plain optimizer.
        own = {id(q) for q in experts or []}
        plain = [cls(list(experts), **kwargs)] if experts else []
        return plain + [
            ZeroRedundancyOptimizer(
                [q for q in p.parameters() if id(q) not in own],
                optimizer_class=cls,
                process_group=dp_mesh.get_group(),
                # One broadcast per bucket after the step, not one per parameter: on gloo each
                # call costs ~0.3 ms, and the cost model prices one all-gather.
                parameters_as_bucket_view=True,
                **kwargs,
            )
            for p in parts
        ]
    # one optimizer per device a part's parameters live on: the GPU's step fused, the host's
    # (blocks offloaded with FSDP2's CPUOffloadPolicy) torch's default, as the plan prices them
    out = []
    for p in parts:
        params = list(p.parameters())
        for on_gpu in (True, False):
            group = [q for q in params if (q.device.type == "cuda") == on_gpu]
            if group:
                out.append(cls(group, **kwargs, **step_kwargs(group)))
    return out


def gradient_sync(parts: list[nn.Module], enabled: bool) -> None:
    """Skip the data-parallel reduction on all but the last micro-batch (pp == 1 only) where
    it reduces whole gradients: DDP and replicate (ZeRO 0/1). FSDP (ZeRO 2/3) keeps
    reduce-scattering every micro-batch: skipping it would accumulate unsharded gradients,
    (1 - 1/dp) of the gradient bytes more than the plan's memory holds."""
    for p in parts:
        if isinstance(p, ReplicateModule):
            p.set_requires_gradient_sync(enabled)
        elif isinstance(p, DistributedDataParallel):
            p.require_backward_grad_sync = enabled
