"""Blocks whose code reads column-parallel outputs by their global shape run on DTensors.

A column-parallel module hands on a local shard, and model code that fixes the head count
and infers another dimension (OPT's ``view(bsz, -1, heads, head_dim)``) reads it wrongly. The
plan marks such a block's column-parallel modules ``colwise_dtensor``: their outputs stay
DTensors, so the code around them sees global shapes and DTensor runs each op sharded as the
plan priced (attention by heads, whatever its form: SDPA, or matmul, mask, softmax and
dropout). The row-parallel module closing the region takes the DTensor and returns a plain
replicated tensor. Inside the block plain tensors (masks, rotary tables) meet DTensors, so the
block runs under DTensor's implicit replication; it is safe there because every sharded
activation of the block is a DTensor, so a plain tensor is a whole one.

A fused projection whose output the code splits into k equal blocks (GPT-2's
``c_attn(x).split(hidden)`` into q, k, v) is sharded by blocks (``_StridedShard``): each rank
holds its slice of every block. DTensor's own split gathers such a tensor (its strategy
unshards a split dimension), so inside these blocks a split or chunk into exactly those k
blocks is done on the local tensor, each part handed on as ``Shard(d)``: each rank keeps its
heads, as the plan priced. Autograd runs through ``to_local`` and ``from_local``, so the
gradient is the local parts concatenated, in the same block layout, with no collective.

torch has no DTensor strategy for the CPU flash-attention kernel that SDPA runs on CPU; one is
registered here (heads or batch sharded, as torch's CUDA kernels have).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.experimental import implicit_replication, register_sharding
from torch.distributed.tensor.placement_types import _StridedShard
from torch.overrides import TorchFunctionMode

from planner.vocab import keeps_dtensors

aten = torch.ops.aten
_registered: list[bool] = []


def _mask_placement(mask: object, d: int) -> object:
    """A mask [b|1, heads|1, q, k] follows the split of dim ``d`` unless it broadcasts there."""
    if mask is None:
        return None
    shape = getattr(mask, "shape", None)
    if shape is None or len(shape) < 4 or shape[d] == 1:
        return Replicate()
    return Shard(d)


def register_cpu_attention_sharding() -> None:
    """DTensor strategies for SDPA's CPU kernel and its backward: all replicated, or q, k, v,
    the output and the log-sum-exp split alike along batch (dim 0) or heads (dim 1)."""
    if _registered:
        return
    _registered.append(True)

    @register_sharding(aten._scaled_dot_product_flash_attention_for_cpu.default)
    def _forward(query, key, value, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):  # noqa: ANN001, ANN202
        found = [([Replicate(), Replicate()], [Replicate()] * 3 + [None, None, None, None])]
        for d in (0, 1):
            s = Shard(d)
            found.append(([s, s], [s, s, s, None, None, _mask_placement(attn_mask, d), None]))
        if attn_mask is not None:
            found[0][1][5] = Replicate()
        return found

    @register_sharding(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
    def _backward(  # noqa: ANN202
        grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask=None,  # noqa: ANN001
        scale=None,  # noqa: ANN001
    ):  # fmt: skip
        rep = [Replicate()] * 6 + [None, None, Replicate() if attn_mask is not None else None]
        found = [([Replicate()] * 3, rep + [None])]
        for d in (0, 1):
            s = Shard(d)
            found.append(([s] * 3, [s] * 6 + [None, None, _mask_placement(attn_mask, d), None]))
        return found


_SPLITS = {torch.Tensor.split, torch.split, torch.Tensor.chunk, torch.chunk}


def _split_args(func: object, args: tuple, kwargs: dict) -> tuple[object, int]:
    """(split size, sections or chunks; dim) of a split or chunk call."""
    how = args[1] if len(args) > 1 else kwargs.get("split_size_or_sections", kwargs.get("chunks"))
    if how is None:
        how = kwargs.get("split_size", kwargs.get("sections"))
    dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
    return how, dim


def split_blocks_locally(func: object, args: tuple, kwargs: dict) -> tuple | None:
    """The parts of a split or chunk of a block-sharded DTensor into exactly its k blocks, each
    ``Shard(d)`` of the local tensor's block; None for any other call (DTensor runs it)."""
    x = args[0] if args else None
    if func not in _SPLITS or not isinstance(x, DTensor) or x.device_mesh.ndim != 1:
        return None
    (placement,) = x.placements
    how, dim = _split_args(func, args, kwargs)
    if not isinstance(placement, _StridedShard) or not isinstance(dim, int):
        return None
    d, k, n = placement.dim, placement.split_factor, x.shape[placement.dim]
    if dim % x.dim() != d or n % k:
        return None
    chunks = func in (torch.Tensor.chunk, torch.chunk)
    if (chunks and how != k) or (not chunks and how not in (n // k, [n // k] * k)):
        return None
    local = x.to_local()
    parts = local.split(local.shape[d] // k, dim=d)
    return tuple(DTensor.from_local(p, x.device_mesh, [Shard(d)], run_check=False) for p in parts)


# Where a block splits a replicated tensor without a style: an expand of a broadcast dim
# (``cost.sharding._broadcast``). Its input's gradient comes back partial over TP.
_EXPANDS = {torch.Tensor.expand, torch.Tensor.expand_as, torch.broadcast_to}


_NEW_LIKE = {torch.Tensor.new_empty, torch.Tensor.new_zeros, torch.Tensor.new_ones}


def new_like_locally(func: object, args: tuple, kwargs: dict) -> DTensor | None:
    """A new tensor made like a DTensor split along a dim whose size it keeps, split alike
    (each rank makes its part), as the plan prices it (``cost.sharding._like``); None for any
    other call. DTensor's own rule keeps the split only for the very same shape, and makes
    DeepSeek's keys, ``new_empty`` with a narrower head size, whole: an all-gather of the
    heads' keys to fill it."""
    x = args[0] if args else None
    if func not in _NEW_LIKE or not isinstance(x, DTensor) or x.device_mesh.ndim != 1:
        return None
    (placement,) = x.placements
    rest = args[1:]
    size = list(rest[0] if len(rest) == 1 and not isinstance(rest[0], int) else rest)
    if type(placement) is not Shard or not all(isinstance(n, int) for n in size):
        return None
    d = placement.dim
    if len(size) != x.dim() or size[d] != x.shape[d]:
        return None
    local = list(size)
    local[d] = x.to_local().shape[d]
    out = func(x.to_local(), local, **kwargs)
    stride = torch.empty(size, device="meta").stride()
    return DTensor.from_local(
        out, x.device_mesh, [Shard(d)], run_check=False, shape=torch.Size(size), stride=stride
    )


class _SplitBlocksLocally(TorchFunctionMode):
    """Inside a block run on DTensors: splits of block-sharded tensors done locally, tensors
    made like a split one split alike, and the partial gradient of a plain tensor that an
    expand hands to DTensors summed right there: the collectives the plan priced, the
    all-reduce of the expand's input (not of what it was cut from) and no all-gather."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if func in _EXPANDS and args:
            plain_gradients(args[0])
        made = new_like_locally(func, args, kwargs)
        if made is not None:
            return made
        parts = split_blocks_locally(func, args, kwargs)
        return parts if parts is not None else func(*args, **kwargs)


def _whole(grad: torch.Tensor) -> torch.Tensor:
    return grad.full_tensor() if isinstance(grad, DTensor) else grad


def plain_gradients(tree: object) -> None:
    """Make the gradient of each plain tensor in ``tree`` whole and plain when it comes back
    a DTensor. Inside a block run on DTensors a plain tensor meets DTensors under implicit
    replication, and its gradient is then a DTensor: partial over the TP group where the block
    split a replicated value without a module's style (DeepSeek's rotary key, broadcast into
    head-sharded keys). The code that made the tensor (torch's styles, whose local outputs
    take plain gradients, or the code before the block) gets the sum. A tensor hook, not a
    view: model code may modify these tensors in place."""
    for t in torch.utils._pytree.tree_leaves(tree):
        if isinstance(t, torch.Tensor) and not isinstance(t, DTensor) and t.requires_grad:
            t.register_hook(_whole)


def run_on_dtensors(module: nn.Module) -> None:
    """For every call of ``module`` (nested calls included), enter DTensor's implicit
    replication and the local split of block-sharded tensors, and leave both when the call
    returns; the gradients of its plain inputs and of its submodules' plain outputs come back
    whole (``plain_gradients``)."""
    depth: list = []

    def enter(_m: nn.Module, args: tuple, kwargs: dict) -> None:
        contexts = (implicit_replication(), _SplitBlocksLocally())
        for ctx in contexts:
            ctx.__enter__()
        depth.append(contexts)
        if len(depth) == 1:
            plain_gradients((args, kwargs))

    def leave(_m: nn.Module, _args: tuple, _kwargs: dict, _out: object) -> None:
        if depth:
            for ctx in reversed(depth.pop()):
                ctx.__exit__(None, None, None)

    module.register_forward_pre_hook(enter, with_kwargs=True)
    module.register_forward_hook(leave, with_kwargs=True, always_call=True)
    for sub in module.modules():
        if sub is not module:
            sub.register_forward_hook(lambda _m, _a, out: plain_gradients(out))


def backward_replication(plan: object):
    """The context a step's backward runs in: DTensor's implicit replication where some block
    runs on DTensors. Its forward ran under it (``run_on_dtensors``), so autograd saved plain
    tensors beside DTensors (StableLM's and Qwen2-MoE's rotary tables multiply q and k); their
    backward ops meet the DTensor gradients outside the block's call. Elsewhere no op mixes the
    two (torch's ParallelStyles hand plain local tensors on), so nothing else changes."""
    on_dtensors = any(keeps_dtensors(block.tp_plan) for block in plan.blocks)
    return implicit_replication() if on_dtensors else contextlib.nullcontext()


def whole_gradients(parts: list[nn.Module]) -> None:
    """Plain gradients for plain parameters. A replicated weight read inside a block that runs
    on DTensors (Qwen3-MoE's per-head q/k norms, applied to head-sharded queries) is a
    replica there, so autograd hands it a DTensor gradient, partial over the TP ranks; its
    full tensor is the sum the one-process gradient is (the optimizer cannot add a DTensor
    to a plain parameter)."""
    for part in parts:
        for p in part.parameters():
            if not isinstance(p, DTensor) and isinstance(p.grad, DTensor):
                p.grad = p.grad.full_tensor()


def _blocks_dim(placements: tuple) -> int | None:
    """The mesh dim that holds a tensor dim by blocks: a ``_StridedShard`` that no later mesh
    dim shards further (FSDP2's own strided placement over a TP shard is followed by it)."""
    for i, p in enumerate(placements):
        if isinstance(p, _StridedShard) and not any(
            isinstance(q, (Shard, _StridedShard)) and q.dim == p.dim for q in placements[i + 1 :]
        ):
            return i
    return None


def _submesh(mesh: object, i: int) -> object:
    return mesh[mesh.mesh_dim_names[i]] if mesh.ndim > 1 else mesh


def _fsdp_dim(placements: tuple, i: int) -> int | None:
    """The earlier mesh dim (FSDP's) that shards the same tensor dim as blocks dim ``i``."""
    d = placements[i].dim
    found = [
        j
        for j in range(i)
        if isinstance(placements[j], (Shard, _StridedShard)) and placements[j].dim == d
    ]
    return found[0] if found else None


def _blocks_to_full(tp_local: torch.Tensor, tp_mesh: object, d: int, k: int) -> torch.Tensor:
    """The whole tensor from each TP rank's slice of its k blocks (a gather over TP, then the
    slices put back in block order)."""
    tp = tp_mesh.size()
    g = DTensor.from_local(tp_local, tp_mesh, [Shard(d)], run_check=False).full_tensor()
    x = g.movedim(d, 0)
    rest = x.shape[1:]
    x = x.reshape(tp, k, -1, *rest).transpose(0, 1).reshape(-1, *rest)
    return x.movedim(0, d)


def _full_to_blocks(full: torch.Tensor, rank: int, tp: int, d: int, k: int) -> torch.Tensor:
    """TP rank ``rank``'s slice of each of the k blocks of ``full``, in block order."""
    x = full.movedim(d, 0)
    rest = x.shape[1:]
    x = x.reshape(k, tp, -1, *rest)[:, rank].reshape(-1, *rest)
    return x.movedim(0, d)


def _tp_shape(v: DTensor, d: int, tp: int) -> tuple[torch.Size, tuple]:
    shape = list(v.shape)
    shape[d] //= tp
    return torch.Size(shape), torch.empty(shape, device="meta").stride()


def contiguous_copy(v: DTensor) -> DTensor:
    """``v`` (sharded by blocks) as the same tensor sharded contiguously, as
    torch.distributed.checkpoint takes it (one chunk per rank).

    TP alone: a redistribution. Where FSDP2 shards the same dim (a bias), the rank holds a
    contiguous piece of its TP slice, a layout DTensor's placements cannot name (FSDP2 labels
    it, but ``full_tensor`` of the label is wrong): the tensor is gathered whole (small: FSDP
    shards weights along another dim, ``fsdp_placement``) and the rank keeps its chunk of it
    sharded over FSDP's dim, then TP's."""
    mesh, pl = v.device_mesh, v.placements
    i = _blocks_dim(pl)
    d, k = pl[i].dim, pl[i].split_factor
    j = _fsdp_dim(pl, i)
    if j is None:
        return v.redistribute(placements=[Shard(d) if m == i else p for m, p in enumerate(pl)])
    tp_mesh, dp_mesh = _submesh(mesh, i), _submesh(mesh, j)
    shape, stride = _tp_shape(v, d, tp_mesh.size())
    tp_local = DTensor.from_local(
        v.to_local(), dp_mesh, [Shard(d)], run_check=False, shape=shape, stride=stride
    ).full_tensor()
    full = _blocks_to_full(tp_local, tp_mesh, d, k)
    piece = torch.chunk(full, dp_mesh.size(), dim=d)[dp_mesh.get_local_rank()]
    piece = torch.chunk(piece, tp_mesh.size(), dim=d)[tp_mesh.get_local_rank()]
    want = list(pl)
    want[j] = want[i] = Shard(d)
    return DTensor.from_local(
        piece.contiguous(), mesh, want, run_check=False, shape=v.shape, stride=v.stride()
    )


def blocks_copy(v: DTensor, placements: tuple) -> DTensor:
    """The inverse of ``contiguous_copy``: ``v`` back in ``placements`` (by blocks)."""
    mesh = v.device_mesh
    i = _blocks_dim(placements)
    d, k = placements[i].dim, placements[i].split_factor
    j = _fsdp_dim(placements, i)
    if j is None:
        return v.redistribute(placements=placements)
    tp_mesh, dp_mesh = _submesh(mesh, i), _submesh(mesh, j)
    full = v.full_tensor()
    tp_local = _full_to_blocks(full, tp_mesh.get_local_rank(), tp_mesh.size(), d, k)
    piece = torch.chunk(tp_local, dp_mesh.size(), dim=d)[dp_mesh.get_local_rank()]
    return DTensor.from_local(
        piece.contiguous(), mesh, placements, run_check=False, shape=v.shape, stride=v.stride()
    )


def fsdp_placement(param: torch.Tensor) -> Shard | None:
    """FSDP2's shard dim for a parameter: a weight sharded by blocks along one dim is sharded
    along another, so its checkpoint copy needs no gather (None: FSDP2's default, dim 0)."""
    if not isinstance(param, DTensor) or param.dim() < 2:
        return None
    i = _blocks_dim(param.placements)
    if i is None or param.placements[i].dim != 0:
        return None
    return Shard(1)


def contiguous_copies(state: dict) -> dict:
    """Replace, in ``state``, each DTensor sharded by blocks with a ``contiguous_copy``;
    returns {key: the placements to give it back with ``restore_blocks``}."""
    found = {}
    for key, value in state.items():
        if isinstance(value, DTensor) and _blocks_dim(value.placements) is not None:
            found[key] = value.placements
            state[key] = contiguous_copy(value)
    return found


def restore_blocks(state: dict, placements: dict) -> None:
    """Undo ``contiguous_copies`` on the loaded copies."""
    for key, want in placements.items():
        state[key] = blocks_copy(state[key], want)
