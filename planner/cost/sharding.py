"""Intra-block tensor-parallel sharding: an Alpa-style ILP per block class and TP degree.

Why an ILP over the traced ops rather than a Megatron rule: the same code then finds the
column/row pairing of a GPT layer, of an off-the-shelf HuggingFace Llama layer and of a plain
MLP, and does something defensible for blocks nobody wrote a rule for. Nothing here knows about
transformers or module names; strategies come from each op's kind and shapes alone.

Sharding states of one tensor over the t devices of a TP group:

* ``R``: replicated, every device holds the whole tensor;
* ``P``: partial sum, every device holds a full-size tensor and the value is their sum;
* ``S<d>``: sharded along dimension d (contiguous chunks of size n_d / t);
* ``S<d>/<k>``: dimension d is k equal blocks, each sharded in contiguous chunks (DTensor's
  ``_StridedShard``): a fused projection's output (q | k | v) that the code splits into its k
  blocks, each of which is then ``S<d>``, so heads stay local. Offered only for the k of the
  equal splits the block makes (``block_factors``).

Each op offers strategies (output state, required state of each operand); a producer whose
state differs from what a consumer requires pays a collective (resharding). Gradients follow the
adjoint rules: a replicated operand of an op that only computes a shard of its output gets a
partial gradient (the "f" operator of Megatron, or a DP-like all-reduce for a replicated weight),
reduced once per producer however many consumers contribute to it.

Assumptions, stated once:

* block inputs and outputs (the residual stream between blocks) are ``R``, so blocks compose
  without knowing each other; a sequence-parallel variant inside Megatron's sequence-sharded
  stream drops its edge gathers (``sequence_stream``, decided per plan by
  ``search.options.sequence_stream_flags``);
* collectives cost bytes x seconds-per-byte x ring factor (no latency term), on the critical path;
* a replicated parameter whose gradient is partial is all-reduced per micro-batch (Megatron
  defers such reductions to once per step: an over-estimate that only affects unusual variants);
* per-device memory in the trade-off is saved activations plus model states, the latter taken as
  16 bytes per parameter (Adam, ZeRO's 2+2+12 in mixed precision, 4+4+8 in fp32).

Results are cached per (block class, t, cost rates, max_variants) and re-bound to each block's
node names and module paths, since blocks of one class differ only in those.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from planner.hardware.collectives import ring_factors
from planner.highs import Pattern, one_thread, pass_model, quiet_highs
from planner.modelfile import one_call_site
from planner.trace.blocks import Block, cached_core_nodes
from planner.trace.graph import arg_refs
from planner.trace.opcost import ATTENTION_OPS, is_view
from planner.vocab import (
    ELEMENT_BYTES,
    IN_OUT,
    base_style,
    by_blocks,
    on_dtensors,
    weight_in_out,
)

R, P = "R", "P"
DTYPE_BYTES = ELEMENT_BYTES
STATE_BYTES_PER_PARAM = 16  # weights + gradients + Adam states (ZeRO paper), any precision
# Objective weights on memory (relative to the replicated block's time and memory): 1e-4 is
# "time first, memory as the tie-break"; the larger ones trace the rest of the Pareto front.
LAMBDAS = (1e-4, 0.02, 0.1, 0.3, 1.0, 5.0)
OBJECTIVE_GAIN = 1e4  # the MILP's objective, in units of T0 / OBJECTIVE_GAIN (see sharding_milp)

ELEMENTWISE = {
    "add", "sub", "rsub", "mul", "div", "neg", "pow", "rsqrt", "sqrt", "exp", "log", "log1p",
    "abs", "reciprocal", "square", "sign", "floor", "ceil", "round", "clamp", "clamp_min",
    "clamp_max", "minimum", "maximum", "where", "masked_fill", "lerp", "addcmul", "addcdiv",
    "gelu", "silu", "relu", "sigmoid", "tanh", "erf", "sin", "cos", "mish", "softplus", "elu",
    "leaky_relu", "hardtanh", "hardswish", "hardsigmoid", "dropout", "native_dropout",
    "bitwise_not", "logical_not", "logical_and", "logical_or", "eq", "ne", "lt", "le", "gt", "ge",
    "to", "_to_copy", "type_as", "clone", "contiguous", "alias", "detach", "lift_fresh_copy",
}  # fmt: skip
LINEAR_UNARY = {"neg", "clone", "contiguous", "to", "_to_copy", "type_as", "alias", "detach"}
SOFTMAX_LIKE = {"softmax", "_softmax", "log_softmax", "_log_softmax", "cumsum", "cumprod"}
NORMS = {"layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm"}
DIM_REDUCTIONS = {"mean", "sum", "amax", "amin", "var", "std", "logsumexp", "prod"}
RESHAPES = {"view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "flatten", "unflatten"}
SPLITS = {"split", "split_with_sizes", "chunk", "unbind"}
TRANSPOSES = {"t", "numpy_T", "transpose"}  # of a 2-D tensor, each swaps its two dims
# Only layouts the runtime can execute with torch's ColwiseParallel / RowwiseParallel: sharded
# activations start at a sharded weight and end at a row-parallel weight (partial sums, then an
# all-reduce) or an all-gather. Slicing a replicated tensor, reduce-scatter and all-to-all are
# the sequence-parallel family: the ILP does not mix them in; ``_sequence_parallel`` derives
# Megatron's layout from the fastest sharded variant instead, as a variant of its own.
RUNTIME_REALIZABLE = True


@dataclass(frozen=True)
class TPVariant:
    """One way to run a block over a TP group of ``tp`` devices, priced per micro-batch."""

    name: str  # "replicated", or "tp{t}-v{k}" with k the rank by time among sharded variants
    tp: int
    states: dict[str, str]  # node name -> output sharding state: "R", "P" or "S<d>"
    tp_plan: dict[str, str]  # module FQN whose weight is sharded -> "colwise" | "rowwise"
    compute_fraction: float  # per-device share of the block's matmul FLOPs
    memory_bound_fraction: float  # per-device share of the block's fwd_bytes
    param_fraction: float  # per-device share of the block's parameter bytes
    saved_bytes: int  # per-device saved activations, no recompute
    saved_selective_bytes: int  # the same without tensors produced by the attention-like core
    input_bytes: int  # per-device bytes of the block input (kept under full recompute)
    comm_fwd: tuple[tuple[str, int], ...]  # (kind, full buffer bytes) per micro-batch
    comm_bwd: tuple[tuple[str, int], ...]
    # modules whose own replicated parameters get partial gradients (each rank's share of a
    # sharded computation: a per-head norm's weight under heads split): the runtime sums
    # their gradients over the TP group, as priced (the "gp" all-reduce of sharding_milp)
    grad_sums: tuple[str, ...] = ()
    # module attributes (full paths: "layers.0.self_attn.num_heads") the runtime divides by
    # ``tp`` on each rank: the head count a view of the block's code fixes (see
    # ``eager_probe._local_fix``), so the heads split as priced
    local_attributes: tuple[str, ...] = ()
    # A sequence-parallel variant's collectives at its edges, inside comm_fwd / comm_bwd: the
    # all-gather of its output at exit (forward) and of its input's gradient at entry
    # (backward, the slice's adjoint). ``sequence_stream`` drops them where the stream stays
    # sequence-sharded between two such blocks.
    exit_gather: tuple[tuple[str, int], ...] = ()
    entry_gather: tuple[tuple[str, int], ...] = ()
    takes_sequence_shard: bool = False  # entered with the stream's shard: no slice
    leaves_sequence_shard: bool = False  # left as the stream's shard: no gather


# --------------------------------------------------------------------------- the op model


@dataclass(frozen=True)
class Operand:
    """A tensor an op reads: another op's output, a parameter, or a buffer/constant."""

    kind: str  # "node" | "param" | "buffer"
    name: str
    shape: tuple[int, ...] | None
    grad: bool


@dataclass(frozen=True)
class Strategy:
    """One way to run an op: its output state and the state it needs of each operand.

    ``req[i]`` is None for buffers and constants (each device slices its own copy, no
    gradient); for a parameter, ``S<d>`` means the stored weight is sharded along d."""

    out: str
    req: tuple[str | None, ...]
    plan: str = ""  # the TPStyle of a sharded weight: "colwise" | "rowwise" (+ IN_OUT)


@dataclass
class Op:
    name: str
    op: str
    module: str
    shape: tuple[int, ...]
    operands: tuple[Operand, ...]
    strategies: tuple[Strategy, ...]
    seconds: float  # forward + backward roofline time, unsharded
    flops: int  # forward + backward matmul FLOPs
    fwd_bytes: int
    nbytes: int  # logical bytes of its output: the buffer a collective on it moves
    grad: bool
    saved: tuple[tuple[str | None, int], ...]
    # W.T of a weight (``_transposed_weight``): its consumer takes it as produced, since the
    # runtime's style splits the weight for the product that reads it, never for a collective
    pinned: bool = False


@dataclass
class BlockProblem:
    """Everything the ILP and its reference evaluator need about one block at one TP degree."""

    tp: int
    ops: list[Op]
    index: dict[str, int]
    external: dict[str, tuple[int, bool]]  # producer outside the block -> (bytes, needs grad)
    outputs: list[str]  # ops whose value leaves the block (it must be R there)
    param_bytes: dict[str, int]  # every parameter the block's ops read -> bytes
    param_numel: dict[str, int]
    owned: list[str]  # parameters the block owns (memory and param_fraction count these)
    roots: dict[str, str]  # storage root of each op: views resolve to their base
    core: frozenset[str]
    input_bytes: int
    flops: int = 0
    fwd_bytes: int = 0
    block_module: str = ""  # the block's module when it is exactly one module


def _s(d: int) -> str:
    return f"S{d}"


def _blocks(d: int, k: int) -> str:
    return f"S{d}/{k}"


def _dim(state: str | None) -> int | None:
    return int(state[1:].partition("/")[0]) if state and state[0] == "S" else None


def _factor(state: str | None) -> int:
    """k of a block-sharded state ``S<d>/<k>``; 1 for any other."""
    return int(state.partition("/")[2] or 1) if state and state[0] == "S" else 1


def _base(op: str) -> str:
    parts = op.split(".")
    return parts[1] if len(parts) > 1 else op


def _splittable(shape: Sequence[int], t: int) -> list[int]:
    return [d for d, n in enumerate(shape) if n > 0 and n % t == 0]


def _nbytes(shape: Sequence[int] | None, dtype: str | None) -> int:
    if shape is None:
        return 0
    return math.prod(shape) * DTYPE_BYTES.get(str(dtype), 4)


def _operands(graph: nx.DiGraph, attrs: dict) -> list[Operand]:
    alias = graph.graph.get("param_owner", {})
    pshapes = graph.graph.get("param_shapes", {})
    found: list[Operand] = []

    for a in arg_refs(attrs["args"]):
        if "node" in a and len(a) == 1:
            u = a["node"]
            shapes = graph.nodes[u]["shapes"] if u in graph else None
            if shapes and shapes[0] is not None:
                grad = bool(graph.nodes[u].get("requires_grad", False))
                found.append(Operand("node", u, tuple(shapes[0]), grad))
        elif "param" in a:
            p = alias.get(a["param"], a["param"])
            shape = tuple(pshapes[p]) if p in pshapes else None
            found.append(Operand("param", p, shape, True))
        else:
            found.append(Operand("buffer", a.get("buffer") or a.get("const"), None, False))
    return found


# --------------------------------------------------------------------------- strategies


def strategies_for(
    op: str,
    attrs: dict,
    operands: Sequence[Operand],
    t: int,
    factors: frozenset[int] = frozenset(),
) -> list[Strategy]:
    """Every strategy an op offers at degree t; the all-replicated one comes first.

    Derived from the op kind and shapes only (see the module docstring); a dimension is split
    only when t divides it. ``factors``: the block counts k for which block-sharded states
    ``S<d>/<k>`` are offered (the block's equal splits, ``block_factors``)."""
    shape = tuple(attrs["shapes"][0])
    rep = Strategy(R, tuple(None if o.kind == "buffer" else R for o in operands))
    if t == 1 or op == "input":
        return [rep]
    base = _base(op)
    nodes = [o for o in operands if o.kind == "node"]
    found: list[Strategy] = [rep]
    if base == "linear" and len(operands) >= 2 and operands[1].kind == "param" and nodes:
        found += _linear(shape, operands, t, factors)
    elif base in ("addmm", "mm") and _weight_in_out(base, operands):
        found += _linear_in_out(base, shape, operands, t, factors)
    elif _is_transposed_weight(base, operands):
        found += _transposed_weight(operands, t)
    elif base == "embedding" and operands and operands[0].kind == "param" and nodes:
        found += _embedding(shape, operands, t)
    elif base in ("matmul", "mm", "bmm") and len(operands) == 2 and len(nodes) == 2:
        found += _product(shape, operands, t)
    elif op in ATTENTION_OPS and len(nodes) >= 3:
        found += _attention(shape, operands, t)
    elif base in ELEMENTWISE:
        found += _elementwise(shape, operands, t, _linear_in_partials(base, attrs, operands))
        found += _unary_blocks(shape, operands, t, factors)
    elif base in SOFTMAX_LIKE | NORMS | DIM_REDUCTIONS and nodes and operands[0].kind == "node":
        found += _reduction(base, shape, operands, attrs["args"], t)
    elif base == "cat" and nodes and len(nodes) == len(operands):
        found += _cat(shape, operands, attrs["args"], t)
    elif is_view(op) and nodes and operands[0].kind == "node":
        found += _view(base, shape, operands, attrs["args"], t)
        found += _view_blocks(base, shape, operands, attrs["args"], t, factors)
        if base == "expand":
            found += _broadcast(shape, operands, t)
    elif base in COMPLEX_VIEWS and nodes and operands[0].kind == "node":
        found += _complex_view(shape, operands, t)
    elif base in LIKE_FACTORIES and nodes and operands[0].kind == "node":
        found += _like(shape, operands, t)
    elif base == "copy_" and len(nodes) == 2 and len(operands) == 2:
        found += _same_split(shape, operands, t)
    unique: dict[tuple, Strategy] = {}
    for s in found:
        unique.setdefault((s.out, s.req, s.plan), s)
    return list(unique.values())


# Complex <-> real reinterpretations (Llama 4's and Meta's reference rotary embeddings):
# [..., n, 2] real is [..., n] complex; every dimension but the pair keeps its place.
COMPLEX_VIEWS = frozenset({"view_as_complex", "view_as_real"})


def _complex_view(shape: tuple, ops: Sequence[Operand], t: int) -> list[Strategy]:
    """A dimension both sides share (all but the real side's last) passes its split on."""
    x = ops[0]
    if x.shape is None:
        return []
    shared = min(len(shape), len(x.shape)) - (1 if len(x.shape) > len(shape) else 0)
    return [
        Strategy(_s(d), (_s(d), *_rest(ops[1:])))
        for d in range(shared)
        if shape[d] % t == 0 and x.shape[d] == shape[d]
    ]


# Tensors made "like" another (its dtype and device; the values are new): split where the
# other is, along a dim of the same size. DeepSeek's MLA builds its keys as new_empty(...)
# filled by two slice copies (the heads' own part and the shared rotary part).
LIKE_FACTORIES = frozenset({"new_empty", "new_zeros", "new_ones", "new_full", "empty_like",
                            "zeros_like", "ones_like", "full_like"})  # fmt: skip


def _like(shape: tuple, ops: Sequence[Operand], t: int) -> list[Strategy]:
    src = ops[0].shape
    if src is None or len(src) != len(shape):
        return []
    return [
        Strategy(_s(d), (_s(d), *_rest(ops[1:])))
        for d in _splittable(shape, t)
        if src[d] == shape[d]
    ]


def _same_split(shape: tuple, ops: Sequence[Operand], t: int) -> list[Strategy]:
    """An in-place copy into a slice: source and destination split alike (each device copies
    its own part)."""
    return [
        Strategy(_s(d), (_s(d), _s(d)))
        for d in _splittable(shape, t)
        if all(o.shape is not None and len(o.shape) == len(shape) and o.shape[d] == shape[d]
               for o in ops)
    ]  # fmt: skip


def _rest(operands: Sequence[Operand], state: str = R) -> list[str | None]:
    return [None if o.kind == "buffer" else state for o in operands]


def _by_blocks(n: int, k: int, t: int) -> bool:
    """Can n elements be k equal blocks, each split into t equal chunks?"""
    return k > 1 and n % (k * t) == 0


def _linear(
    shape: tuple, ops: Sequence[Operand], t: int, factors: frozenset[int] = frozenset()
) -> list[Strategy]:
    """x[..., K] @ W[N, K]^T (+ b[N]): colwise W -> S(last), rowwise W on S(last) x -> P, or a
    leading dim of x split with W replicated (its gradient then is partial). Colwise by k
    blocks -> S(last)/k, W's rows and b sharded alike."""
    x, w, rest = ops[0], ops[1], ops[2:]
    if x.shape is None or w.shape is None or len(w.shape) != 2:
        return []
    last = len(shape) - 1
    out: list[Strategy] = []
    if w.shape[0] % t == 0:
        out.append(Strategy(_s(last), (R, "S0", *_rest(rest, "S0")), "colwise"))
    for k in sorted(factors):
        if _by_blocks(w.shape[0], k, t):
            b = _blocks(0, k)
            out.append(
                Strategy(_blocks(last, k), (R, b, *_rest(rest, b)), by_blocks("colwise_dtensor", k))
            )
    if w.shape[1] % t == 0:
        out.append(Strategy(P, (_s(len(x.shape) - 1), "S1", *_rest(rest)), "rowwise"))
    for d in _splittable(shape[:-1], t):
        out.append(Strategy(_s(d), (_s(d), R, *_rest(rest))))
    return out


def _weight_in_out(base: str, ops: Sequence[Operand]) -> bool:
    """x @ W (+ b) with W a 2-D parameter stored [in, out]: ``mm(x, W)`` or ``addmm(b, x, W)``
    with b a 1-D parameter (transformers' Conv1D)."""
    want = 2 if base == "mm" else 3
    if len(ops) != want or ops[-2].kind != "node" or ops[-1].kind != "param":
        return False
    w = ops[-1].shape
    if w is None or len(w) != 2:
        return False
    return base == "mm" or (ops[0].kind == "param" and ops[0].shape == (w[1],))


def _linear_in_out(
    base: str, shape: tuple, ops: Sequence[Operand], t: int, factors: frozenset[int] = frozenset()
) -> list[Strategy]:
    """The column/row split of ``_linear`` for a weight stored [in, out]: colwise splits W's
    dim 1 (and b), by k blocks or contiguously, rowwise its dim 0 on a last-dim-split x, giving
    partial sums."""
    w = ops[-1].shape
    bias = (R,) if base == "addmm" else ()
    out: list[Strategy] = []
    if w[1] % t == 0:
        col_bias = ("S0",) if base == "addmm" else ()
        out.append(Strategy(_s(len(shape) - 1), (*col_bias, R, "S1"), "colwise" + IN_OUT))
    for k in sorted(factors):
        if _by_blocks(w[1], k, t):
            col_bias = (_blocks(0, k),) if base == "addmm" else ()
            out.append(
                Strategy(
                    _blocks(len(shape) - 1, k),
                    (*col_bias, R, _blocks(1, k)),
                    by_blocks("colwise_dtensor" + IN_OUT, k),
                )
            )
    if w[0] % t == 0:
        out.append(Strategy(P, (*bias, _s(len(ops[-2].shape) - 1), "S0"), "rowwise" + IN_OUT))
    for d in _splittable(shape[:-1], t):
        out.append(Strategy(_s(d), (*bias, _s(d), R)))
    return out


def _is_transposed_weight(base: str, ops: Sequence[Operand]) -> bool:
    """W.T (or W.transpose) of a 2-D parameter."""
    w = ops[0] if ops else None
    return base in TRANSPOSES and w is not None and w.kind == "param" and len(w.shape or ()) == 2


def _transposed_weight(ops: Sequence[Operand], t: int) -> list[Strategy]:
    """W.T of a weight W[out, in] that a matrix product then reads (a Linear subclass with its
    own forward, x @ W.T: Falcon's): W's dim 0 split gives W.T's dim 1 (column-parallel, the
    product splits its output), W's dim 1 its dim 0 (row-parallel, partial sums)."""
    w = ops[0].shape
    out: list[Strategy] = []
    if w[0] % t == 0:
        out.append(Strategy("S1", ("S0", *_rest(ops[1:])), "colwise"))
    if w[1] % t == 0:
        out.append(Strategy("S0", ("S1", *_rest(ops[1:])), "rowwise"))
    return out


def _embedding(shape: tuple, ops: Sequence[Operand], t: int) -> list[Strategy]:
    """weight[V, h] gathered by idx: h split -> S(last), V split -> P (each device holds some
    rows and zeros elsewhere), or a dim of idx split with the table replicated."""
    w, idx, rest = ops[0], ops[1], ops[2:]
    if w.shape is None or len(w.shape) != 2 or idx.kind != "node":
        return []
    last = len(shape) - 1
    out: list[Strategy] = []
    if w.shape[1] % t == 0:
        out.append(Strategy(_s(last), ("S1", R, *_rest(rest)), "colwise"))
    if w.shape[0] % t == 0:
        out.append(Strategy(P, ("S0", R, *_rest(rest)), "rowwise"))
    for d in _splittable(shape[:-1], t):
        out.append(Strategy(_s(d), (R, _s(d), *_rest(rest))))
    return out


def _product(shape: tuple, ops: Sequence[Operand], t: int) -> list[Strategy]:
    """a[..., m, k] @ b[..., k, n]: a batch dim split in both (or broadcast in one) -> S;
    m split in a or n split in b -> S; k split in both -> P."""
    a, b = ops[0].shape, ops[1].shape
    if a is None or b is None or len(a) < 2 or len(b) < 2:
        return []
    r = len(shape)
    out: list[Strategy] = []
    for i in _splittable(shape[:-2], t):
        req = []
        for s in (a, b):
            j = i - (r - len(s))
            req.append(_s(j) if j >= 0 and s[j] == shape[i] else R)
        if _has_split(req):
            out.append(Strategy(_s(i), tuple(req)))
    if shape[-2] % t == 0:
        out.append(Strategy(_s(r - 2), (_s(len(a) - 2), R)))
    if shape[-1] % t == 0:
        out.append(Strategy(_s(r - 1), (R, _s(len(b) - 1))))
    if a[-1] % t == 0:
        out.append(Strategy(P, (_s(len(a) - 1), _s(len(b) - 2))))
    return out


def _has_split(req: Sequence[str | None]) -> bool:
    return any(_dim(r) is not None for r in req)


def _attention(shape: tuple, ops: Sequence[Operand], t: int) -> list[Strategy]:
    """sdpa(q, k, v, mask): batch or heads split in q, k and v alike; a mask follows the
    broadcast rule against the scores [b, heads, s_q, s_kv]."""
    q, k, v = (o.shape for o in ops[:3])
    if q is None or k is None or v is None or len(q) != 4:
        return []
    scores = (q[0], q[1], q[2], k[2])
    out: list[Strategy] = []
    for d in (0, 1):
        if any(s[d] % t for s in (q, k, v)):
            continue
        req: list[str | None] = [_s(d)] * 3
        ok = True
        for o in ops[3:]:
            if o.kind == "buffer" or o.shape is None:
                req.append(None)
                continue
            j = d - (4 - len(o.shape))
            if j < 0 or o.shape[j] == 1:
                req.append(R)
            elif o.shape[j] == scores[d]:
                req.append(_s(j))
            else:
                ok = False
        if ok:
            out.append(Strategy(_s(d), tuple(req)))
    return out


def _linear_in_partials(base: str, attrs: dict, ops: Sequence[Operand]) -> bool:
    """Can a partial sum flow through this op? Only where op(sum x_i) = sum op(x_i): casts and
    copies, negation, a sum of partials, a partial times (or over) a plain number."""
    args = attrs["args"][:-1] if attrs["args"] and isinstance(attrs["args"][-1], dict) else []
    only_nodes = all(o.kind == "node" for o in ops)
    if base in LINEAR_UNARY:
        return len(ops) == 1 and only_nodes
    if base in ("add", "sub"):
        return only_nodes and len(ops) >= 2 and all(_is_node_ref(a) for a in args)
    if base in ("mul", "div"):
        numbers = [a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
        first_is_node = bool(args) and _is_node_ref(args[0])
        return (
            only_nodes and len(ops) == 1 and len(numbers) == 1 and (base == "mul" or first_is_node)
        )
    return False


def _is_node_ref(a: object) -> bool:
    return isinstance(a, dict) and "node" in a and len(a) == 1


def _elementwise(shape: tuple, ops: Sequence[Operand], t: int, partial: bool) -> list[Strategy]:
    """Same state on every full-size operand and on the output; an operand broadcast along the
    split dim stays R (its gradient is then partial)."""
    r = len(shape)
    out: list[Strategy] = []
    for d in _splittable(shape, t):
        req: list[str | None] = []
        ok, sharded_node = True, False
        for o in ops:
            if o.kind == "buffer" or o.shape is None:
                req.append(None)
                continue
            j = d - (r - len(o.shape))
            if j < 0 or o.shape[j] == 1:
                req.append(R)
            elif o.shape[j] == shape[d]:
                req.append(_s(j))
                sharded_node |= o.kind == "node"
            else:
                ok = False
        if ok and sharded_node:
            out.append(Strategy(_s(d), tuple(req)))
    if partial:
        out.append(Strategy(P, tuple(P for _ in ops)))
    return out


def _reduction(base: str, shape: tuple, ops: Sequence[Operand], args: list, t: int) -> list:
    """Softmax-like, normalisations and dim reductions: any dim not reduced may stay split."""
    x = ops[0].shape
    if x is None:
        return []
    rank = len(x)
    if base in SOFTMAX_LIKE:
        reduced = {_norm_dim(args[1], rank)} if len(args) > 1 else set()
        keep = True
    elif base in NORMS:
        reduced = set(range(rank - len(args[1]), rank)) if isinstance(args[1], list) else set()
        keep = True
    else:
        dims = args[1] if len(args) > 1 and not isinstance(args[1], dict) else None
        if dims is None or dims == []:
            return []  # a full reduction: replicated only
        dims = dims if isinstance(dims, list) else [dims]
        reduced = {_norm_dim(d, rank) for d in dims}
        keep = len(shape) == rank
    out: list[Strategy] = []
    for d in _splittable(x, t):
        if d in reduced:
            continue
        d_out = d if keep else d - sum(1 for q in reduced if q < d)
        if d_out >= len(shape) or shape[d_out] != x[d]:
            continue
        out.append(Strategy(_s(d_out), (_s(d), *_rest(ops[1:]))))
    return out


def _cat(shape: tuple, ops: Sequence[Operand], args: list, t: int) -> list[Strategy]:
    rank = len(shape)
    dim = _norm_dim(args[1] if len(args) > 2 else 0, rank)
    out = [Strategy(P, tuple(P for _ in ops))]
    for d in _splittable(shape, t):
        if d != dim and all(o.shape is not None and len(o.shape) == rank for o in ops):
            out.append(Strategy(_s(d), tuple(_s(d) for _ in ops)))
    return out


def _norm_dim(d: object, rank: int) -> int:
    d = int(d) if isinstance(d, (int, float)) else 0
    return d + rank if d < 0 else d


def _view(base: str, shape: tuple, ops: Sequence[Operand], args: list, t: int) -> list:
    """Views move a split dim: reshapes through matching dim groups, transposes and permutes by
    index, slices/selects along another dim keep it; partial sums pass unchanged."""
    src = ops[0].shape
    if src is None:
        return []
    out = [Strategy(P, (P, *_rest(ops[1:])))]
    for d in _splittable(src, t):
        e = _map_view_dim(base, src, shape, d, args, t)
        if e is not None and 0 <= e < len(shape) and shape[e] > 0 and shape[e] % t == 0:
            out.append(Strategy(_s(e), (_s(d), *_rest(ops[1:]))))
    return out


def _broadcast(shape: tuple, ops: Sequence[Operand], t: int) -> list[Strategy]:
    """An expand that broadcasts a size-1 (or new) dim may hand a replicated tensor on split
    along it, with no communication: each device expands to its own part (multi-head latent
    attention's rotary key, one for all heads, joins the head-sharded keys). Its gradient is
    then each device's partial sum over its part, summed like any replicated operand of a
    sharded op. Only DTensor runs it so (``_splits_replicated``)."""
    src = ops[0].shape
    if src is None:
        return []
    lead = len(shape) - len(src)
    return [
        Strategy(_s(e), (R, *_rest(ops[1:])))
        for e in _splittable(shape, t)
        if shape[e] > 1 and (e < lead or src[e - lead] == 1)
    ]


def _splits_replicated(prob: BlockProblem, strat: Sequence[Strategy]) -> bool:
    """Whether the layout has an expand hand a replicated tensor on split (``_broadcast``).
    On local shards each device's plain expand would leave that tensor's gradient partial
    with nothing to sum it; on DTensors the replicated side is split locally and its
    gradient comes back partial and is reduced, as priced."""
    return any(
        _base(op.op) == "expand" and _dim(st.out) is not None and st.req[0] == R
        for op, st in zip(prob.ops, strat)
    )


def _map_view_dim(base: str, src: tuple, dst: tuple, d: int, args: list, t: int) -> int | None:
    rank = len(src)
    if base in ("alias", "detach", "lift_fresh_copy", "getitem"):
        return d if d < len(dst) and dst[d] % t == 0 else None
    if base in ("transpose", "t"):
        a, b = (
            (_norm_dim(args[1], rank), _norm_dim(args[2], rank)) if base == "transpose" else (0, 1)
        )
        return b if d == a else a if d == b else d
    if base == "permute":
        perm = [_norm_dim(p, rank) for p in args[1]]
        return perm.index(d) if d in perm else None
    if base in ("slice", "narrow", "select", *SPLITS):
        dim = _split_dim(base, args, rank)
        if d == dim:
            return None
        return d - 1 if base in ("select", "unbind") and d > dim else d
    if base == "expand":
        e = d + len(dst) - rank
        return e if dst[e] == src[d] else None
    if base in RESHAPES:
        return reshape_dim(src, dst, d, t)
    return None


def _positional(args: list) -> list:
    """The op's positional arguments (the exported node's args end with its kwargs dict)."""
    return args[:-1] if args and isinstance(args[-1], dict) else list(args)


def _sections(base: str, n: int, args: list) -> list[tuple[int, int]] | None:
    """(start, length) of each output along the split dim of a split or chunk over n
    elements; None when the op is neither or its sizes are not plain ints."""
    a = _positional(args)
    if base == "split" and len(a) > 1 and isinstance(a[1], int) and a[1] > 0:
        return [(i, min(a[1], n - i)) for i in range(0, n, a[1])]
    if base == "split_with_sizes" and len(a) > 1 and isinstance(a[1], list):
        starts = np.cumsum([0, *a[1]])[:-1]
        return [(int(s0), int(m)) for s0, m in zip(starts, a[1])]
    if base == "chunk" and len(a) > 1 and isinstance(a[1], int) and a[1] > 0:
        m = -(-n // a[1])
        return [(i, min(m, n - i)) for i in range(0, n, m)]
    return None


def _split_dim(base: str, args: list, rank: int) -> int:
    """The dim a slice, narrow, select, unbind, split or chunk cuts, read from its positional
    arguments whether or not the node's args end with a kwargs dict."""
    a = _positional(args)
    if base in ("split", "split_with_sizes", "chunk"):
        return _norm_dim(a[2] if len(a) > 2 else 0, rank)
    return _norm_dim(a[1] if len(a) > 1 else 0, rank)


def block_factors(ops: Sequence[tuple[str, tuple | None, list]]) -> frozenset[int]:
    """The block counts k of the splits into k >= 2 equal parts among (op, input shape,
    args): the only k for which block-sharded states are worth offering."""
    found = set()
    for op, src, args in ops:
        base = _base(op)
        if base not in ("split", "split_with_sizes", "chunk") or not src:
            continue
        n = src[_split_dim(base, args, len(src))]
        parts = _sections(base, n, args)
        if parts and len(parts) > 1 and len({m for _, m in parts}) == 1:
            found.add(len(parts))
    return frozenset(found)


def _unary_blocks(
    shape: tuple, ops: Sequence[Operand], t: int, factors: frozenset[int]
) -> list[Strategy]:
    """A one-operand elementwise op (a cast, dropout) keeps a block-sharded state."""
    if len(ops) != 1 or ops[0].kind != "node" or ops[0].shape != shape:
        return []
    return [
        Strategy(_blocks(d, k), (_blocks(d, k),))
        for k in sorted(factors)
        for d, n in enumerate(shape)
        if _by_blocks(n, k, t)
    ]


def _view_blocks(
    base: str,
    shape: tuple,
    ops: Sequence[Operand],
    args: list,
    t: int,
    factors: frozenset[int],
) -> list[Strategy]:
    """Block-sharded states through views: an op taking the k blocks apart (split, chunk, or a
    slice of one whole block) hands each block on as ``S<d>``; a view that keeps the dim keeps
    the blocks; a reshape of the dim into (k, n/k) is the inner dim sharded."""
    src = ops[0].shape
    if src is None:
        return []
    rest = _rest(ops[1:])
    out: list[Strategy] = []
    for k in sorted(factors):
        for d, n in enumerate(src):
            if _by_blocks(n, k, t):
                image = _blocks_image(base, src, shape, d, k, args, t)
                if image is not None:
                    out.append(Strategy(image, (_blocks(d, k), *rest)))
    return out


def _blocks_image(
    base: str, src: tuple, dst: tuple, d: int, k: int, args: list, t: int
) -> str | None:
    """The state of a view's output when its input is ``S<d>/<k>``, or None if it has none.
    Only a split or chunk into exactly the k blocks hands them on sharded: those are the calls
    the runtime does on the local tensor (``runtime.dtensor_blocks``); a slice of one block
    (Phi-3's ``qkv[..., :q_end]``) would run gathered, so it has no image here."""
    n, m = src[d], src[d] // k
    if base in ("slice", "narrow", *SPLITS) and _split_dim(base, args, len(src)) == d:
        parts = _sections(base, n, args) if base in ("split", "split_with_sizes", "chunk") else None
        whole = parts is not None and len(parts) == k and all(length == m for _, length in parts)
        return _s(d) if whole else None
    if base in RESHAPES:
        group = _reshape_group(src, dst, d)
        if group is None:
            return None
        gi, gj = group
        inner = [j for j in gj if dst[j] != 1]
        if [i for i in gi if src[i] != 1] != [d]:
            return None
        if len(inner) == 1:
            return _blocks(inner[0], k)
        if len(inner) == 2 and dst[inner[0]] == k and dst[inner[1]] % t == 0:
            return _s(inner[1])
        return None
    e = _map_view_dim(base, src, dst, d, args, 1)
    return _blocks(e, k) if e is not None and 0 <= e < len(dst) and dst[e] == n else None


def _reshape_group(src: Sequence[int], dst: Sequence[int], d: int) -> tuple[list, list] | None:
    """The runs of dims of equal product on each side of a reshape that hold src's dim d."""
    i = j = 0
    while i < len(src) and j < len(dst):
        gi, gj = [i], [j]
        pi, pj = src[i], dst[j]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj and i < len(src):
                gi.append(i)
                pi *= src[i]
                i += 1
            elif j < len(dst):
                gj.append(j)
                pj *= dst[j]
                j += 1
            else:
                return None
        if d in gi:
            return gi, gj
    return None


def reshape_dim(src: Sequence[int], dst: Sequence[int], d: int, t: int) -> int | None:
    """Where a split dim lands through a reshape: dims are grouped into runs of equal product;
    contiguous chunks of a group's leading (non-1) dim are contiguous chunks of the other side's
    leading dim, provided t divides it. A split inner dim of a group has no image."""
    group = _reshape_group(src, dst, d)
    if group is None:
        return None
    gi, gj = group
    lead_i = next((k for k in gi if src[k] != 1), None)
    lead_j = next((k for k in gj if dst[k] != 1), None)
    if lead_i != d or lead_j is None or dst[lead_j] % t:
        return None
    return lead_j


# --------------------------------------------------------------------------- the problem


def build_problem(
    graph: nx.DiGraph,
    block: Block,
    tp: int,
    flops_per_second: float = 400e12,
    bytes_per_second: float = 2e12,
    vocab_tied: bool = True,
) -> BlockProblem:
    """The block's tensor-valued ops with their strategies, costs and saved tensors.
    ``vocab_tied``: tied weights split along their first dimension where every use can
    (``vocab_parallel_tied``); off, they stay replicated.

    Long because it is one pass over the block's ops that records each op's operands,
    strategies, costs and saved tensors together."""
    nodes = [n for n in block.nodes if _has_tensor(graph, n)]
    inside = set(nodes)
    ops: list[Op] = []
    external: dict[str, tuple[int, bool]] = {}
    param_bytes: dict[str, int] = {}
    param_numel: dict[str, int] = {}
    pshapes = graph.graph.get("param_shapes", {})
    pdtype = graph.graph.get("param_dtype_bytes", {})
    updated = updated_parameters(graph)
    allowed = _Runnable(
        tied_parameters(graph) | updated,
        frozenset(graph.graph.get("tp_modules", [])),
        (vocab_parallel_tied(graph, tp) if vocab_tied else frozenset()) - updated,
    )
    operands_of = {n: _operands(graph, graph.nodes[n]) for n in nodes}
    factors = block_factors(
        [
            (graph.nodes[n]["op"], operands_of[n][0].shape if operands_of[n] else None,
             graph.nodes[n]["args"])
            for n in nodes
        ]
    )  # fmt: skip
    for n in nodes:
        d = graph.nodes[n]
        operands = operands_of[n]
        for o in operands:
            if o.kind == "node" and o.name not in inside and o.name not in external:
                u = graph.nodes[o.name]
                external[o.name] = (_nbytes(o.shape, u["dtypes"][0]), o.grad)
            if o.kind == "param":
                param_numel[o.name] = math.prod(pshapes.get(o.name, [0]))
                param_bytes[o.name] = param_numel[o.name] * pdtype.get(o.name, 4)
        seconds = max(d["fwd_flops"] / flops_per_second, d["fwd_bytes"] / bytes_per_second) + max(
            d["bwd_flops"] / flops_per_second, d["bwd_bytes"] / bytes_per_second
        )
        ops.append(
            Op(
                name=n,
                op=d["op"],
                module=d["module"],
                shape=tuple(d["shapes"][0]),
                operands=tuple(operands),
                strategies=tuple(
                    st
                    for st in strategies_for(d["op"], d, operands, tp, factors)
                    if allowed(d["module"], st, operands)
                ),
                seconds=seconds,
                flops=int(d["fwd_flops"] + d["bwd_flops"]),
                fwd_bytes=int(d["fwd_bytes"]),
                nbytes=_nbytes(d["shapes"][0], d["dtypes"][0]),
                grad=bool(d.get("requires_grad", False)),
                saved=tuple((p, int(b)) for p, b in d["saved"]),
                pinned=_is_transposed_weight(_base(d["op"]), operands),
            )
        )
    index = {op.name: i for i, op in enumerate(ops)}
    roots: dict[str, str] = {}
    for op in ops:
        first = op.operands[0] if op.operands else None
        if is_view(op.op) and first is not None and first.kind == "node":
            roots[op.name] = roots.get(first.name, first.name)
        else:
            roots[op.name] = op.name
    outputs_graph = set(graph.graph.get("outputs", []))
    # a tensorless successor (torch.export's _assert_tensor_metadata after a dtype cast)
    # reads no data: it neither makes a node a block output nor needs it whole
    outputs = [
        n
        for n in nodes
        if n in outputs_graph
        or any(v not in inside and _has_tensor(graph, v) for v in graph.successors(n))
    ]
    core = cached_core_nodes(graph)
    return BlockProblem(
        tp=tp,
        ops=ops,
        index=index,
        external=external,
        outputs=outputs,
        param_bytes=param_bytes,
        param_numel=param_numel,
        owned=[p for p in block.param_names if p in param_bytes],
        roots=roots,
        core=frozenset(core),
        input_bytes=int(block.input_bytes),
        flops=sum(op.flops for op in ops),
        fwd_bytes=sum(op.fwd_bytes for op in ops),
        block_module=block.modules[0] if len(block.modules) == 1 else "",
    )


def tied_parameters(graph: nx.DiGraph) -> frozenset[str]:
    """Canonical names of parameters that more than one module uses: reachable under more
    than one module path, or read by an op outside the module that holds them (Perceiver's
    decoder multiplies by its input embedding's weight, handed the module as an argument). A
    ParallelStyle shards a weight for its own module's forward; any other reader then meets a
    DTensor where its plain code expects a tensor, so every use must hold it alike."""
    key = "tied_parameters"
    if key in graph.graph:
        return graph.graph[key]
    alias = graph.graph.get("param_owner", {})
    seen: dict[str, int] = {}
    for canonical in alias.values():
        seen[canonical] = seen.get(canonical, 0) + 1
    shared = {p for p, n in seen.items() if n > 1}
    for _, d in graph.nodes(data=True):
        module = one_call_site(d.get("module") or "")
        for a in arg_refs(d.get("args") or []):
            if "param" in a:
                p = alias.get(a["param"], a["param"])
                if module != p.rpartition(".")[0]:
                    shared.add(p)
    found = frozenset(shared)
    graph.graph[key] = found
    return found


def updated_parameters(graph: nx.DiGraph) -> frozenset[str]:
    """Canonical names of the weights the training forward changes in place (the trace's
    ``forward_state``: an ``nn.Embedding(max_norm=...)`` renormalises the rows it looks up).
    They stay whole under TP, as a tied weight that no split suits: the in-place update runs
    on the weight itself, and DTensor has no such ops (a vocabulary-parallel max-norm
    embedding crashed every worker at TP 2)."""
    alias = graph.graph.get("param_owner", {})
    names = set(graph.graph.get("param_shapes", {})) | set(alias.values())
    state = graph.graph.get("forward_state", [])
    return frozenset(alias.get(n, n) for n in state if alias.get(n, n) in names)


def vocab_parallel_tied(graph: nx.DiGraph, tp: int) -> frozenset[str]:
    """The tied weights that shard along their first dimension in every op that reads them
    (the vocabulary of an embedding that is also the output projection: a row-parallel lookup
    and a column-parallel head, Megatron's vocab-parallel pair; and a bias the head shares with
    its parent, BERT's), in a module a ParallelStyle can shard. The runtime keeps one tensor
    for such a weight only if every use holds it alike, and the blocks that read it are
    sharded by separate ILPs: each may only take it split along dim 0 (``_Runnable``), so every
    variant of every block agrees. A weight leaves the set when some op reading it would be
    left with no strategy (it reads another tied weight that must stay whole), until none is."""
    key = ("vocab_parallel_tied", tp)
    if key in graph.graph:
        return graph.graph[key]
    tied = tied_parameters(graph) if tp > 1 else frozenset()
    found: set[str] = set(tied)
    readers = []  # (module, strategies, tied operand positions) of every op reading one
    for n, d in graph.nodes(data=True):
        if not tied or not _has_tensor(graph, n):
            continue
        operands = _operands(graph, d)
        slots = [(i, o.name) for i, o in enumerate(operands) if _tied_operand(o, tied)]
        if slots:
            readers.append((d["module"], strategies_for(d["op"], d, operands, tp), slots))
    shardable = frozenset(graph.graph.get("tp_modules", []))
    changed = True
    while changed:
        changed = False
        for module, strategies, slots in readers:
            ok = any(_keeps_ties(st, module, slots, found, shardable) for st in strategies)
            if not ok and any(name in found for _, name in slots):
                found -= {name for _, name in slots}
                changed = True
    frozen = frozenset(found)
    graph.graph[key] = frozen
    return frozen


def _tied_operand(o: Operand, tied: frozenset[str]) -> bool:
    return o.kind == "param" and o.name in tied


def _keeps_ties(
    st: Strategy, module: str, slots: list[tuple[int, str]], vocab: set[str], shardable
) -> bool:
    """Whether ``st`` holds every tied operand (position, name) as the runtime can: split along
    dim 0 if the weight is in ``vocab``, else whole; a styled strategy in a shardable module."""
    if st.plan and module not in shardable:
        return False
    return all(st.req[i] == ("S0" if name in vocab else R) for i, name in slots)


@dataclass(frozen=True)
class _Runnable:
    """Which strategies the runtime can run as priced:

    - a tied weight is held alike by every use, as one tensor: split along its first
      dimension where every use can take it so (``vocab_parallel_tied``), else replicated;
    - a weight is sharded only in a module a ParallelStyle can shard (``tp_modules``)."""

    tied: frozenset[str]
    shardable: frozenset[str]
    vocab: frozenset[str] = frozenset()

    def __call__(self, module: str, st: Strategy, operands: Sequence[Operand]) -> bool:
        slots = [(i, o.name) for i, o in enumerate(operands) if _tied_operand(o, self.tied)]
        return _keeps_ties(st, module, slots, self.vocab, self.shardable)


def _has_tensor(graph: nx.DiGraph, n: str) -> bool:
    shapes = graph.nodes[n].get("shapes") or []
    return bool(shapes) and shapes[0] is not None


def _ring(kind: str, t: int) -> float:
    """The bandwidth factor of ``kind`` over t devices (the sharding ILP prices no latency)."""
    return ring_factors(kind, t)[0]


def reshard(src: str, dst: str) -> tuple[str | None, str | None] | None:
    """(forward collective, backward collective) turning state src into dst, None if illegal.

    The backward one moves the gradient the other way: a forward slice (R -> S) gathers the
    gradient, a reduce-scatter's gradient is all-gathered, an all-to-all is its own adjoint."""
    if src == dst:
        return (None, None)
    if dst == P:
        return None  # a consumer of partial sums only takes them from a partial producer
    if RUNTIME_REALIZABLE and dst != R:
        return None
    if src == R:
        return (None, "all_gather")
    if src == P:
        return ("all_reduce", None) if dst == R else ("reduce_scatter", "all_gather")
    return ("all_gather", None) if dst == R else ("all_to_all", "all_to_all")


def gathers_midway(producer: Strategy | None, src: str, dst: str) -> bool:
    """Whether moving ``src`` to ``dst`` gathers a sharded value that no column-parallel
    module made (an op downstream of one, on its shards). Torch's styles cannot gather there:
    the runtime gathers at the column-parallel module's output (``colwise_gather``) and runs
    every op between whole, on every rank, so the layout is not priced as it runs and the ILP
    must not pick it (OPT's out_proj column-parallel on a gathered attention output: the
    whole attention priced on 1/t shards, run unsharded)."""
    if _dim(src) is None or src == dst or producer is None:
        return False
    return base_style(producer.plan) not in ("colwise", "colwise_dtensor")


def op_share(
    base: str, out: str, product: bool, t: int, table: Sequence[int] | None = None,
    out_bytes: float = 0.0,
) -> float:  # fmt: skip
    """An op's share of its unsharded work on one of t devices: 1/t when it computes a shard
    of its output (``S<d>``) or a partial product of a sharded contraction (``P`` with FLOPs);
    the whole for a partial sum through a memory-bound op, except a lookup in a table (of
    shape ``table``) split along its rows (the vocabulary-parallel embedding, ``P`` out): its
    output and the gradient it reads are full size, the dense fp32 table gradient its backward
    writes (often the bulk: BLOOM's 250k x 14336 table is 14 GB) only each rank's rows."""
    if out.startswith("S") or (out == P and product):
        return 1.0 / t
    if base == "embedding" and out == P and table:
        rows = math.prod(table) * 4.0  # the dense fp32 gradient of the table
        moved = 2 * out_bytes  # the output written, its gradient read
        return (moved + rows / t) / (moved + rows)
    return 1.0


def node_share(graph: nx.DiGraph, n: str, out: str, t: int) -> float:
    """``op_share`` of graph node n in state ``out`` (the cost model's per-op TP shares)."""
    d = graph.nodes[n]
    base, table = _base(d["op"]), None
    if base == "embedding" and out == P:  # only a lookup reads its table's shape
        ops = _operands(graph, d)
        table = ops[0].shape if ops and ops[0].kind == "param" else None
    nbytes = _nbytes(d["shapes"][0], d["dtypes"][0]) if _has_tensor(graph, n) else 0
    return op_share(base, out, d["fwd_flops"] > 0, t, table, nbytes)


def _share(op: Op, s: Strategy, t: int) -> float:
    """``op_share`` of a problem's op under strategy s."""
    table = op.operands[0].shape if op.operands and op.operands[0].kind == "param" else None
    return op_share(_base(op.op), s.out, op.flops > 0, t, table, op.nbytes)


def _partial_grads(op: Op, s: Strategy) -> list[int]:
    """Operands whose gradient this strategy leaves partial: replicated operands of an op that
    computes only a shard of its output."""
    if _dim(s.out) is None:
        return []
    return [i for i, (o, r) in enumerate(zip(op.operands, s.req)) if r == R and o.grad]


def _saved_entries(prob: BlockProblem, op: Op) -> list[tuple[str, object, int, bool]]:
    """Each saved tensor of op as (what its state depends on, key, bytes, selective-kept).

    ("slot", i): the state op requires of operand i (the saved tensor is that operand's
    storage, as this op sees it); ("self", None): the op's own sharding (a copy made inside
    the op); ("node", u): producer u's output state; ("const", None): a block input, R."""
    found = []
    for producer, nbytes in op.saved:
        kept = producer not in prob.core
        slot = None
        if producer is not None:
            for i, o in enumerate(op.operands):
                if o.kind == "node" and prob.roots.get(o.name, o.name) == producer:
                    slot = i
                    break
        if slot is not None:
            found.append(("slot", slot, nbytes, kept))
        elif producer is None:
            found.append(("self", None, nbytes, kept))
        elif producer in prob.index:
            found.append(("node", producer, nbytes, kept))
        else:
            found.append(("const", None, nbytes, kept))
    return found


def _entry_sharded(state: dict[str, str], op: Op, s: Strategy, how: str, key: object) -> bool:
    if how == "node":
        return _dim(state[key]) is not None
    if how == "const":
        return False
    return _saved_state_sharded(op, s, how, key)


def _saved_state_sharded(op: Op, s: Strategy, how: str, key: object) -> bool:
    if how == "slot":
        return _dim(s.req[key]) is not None
    return _dim(s.out) is not None or _has_split(s.req)  # "self"


# --------------------------------------------------------------------------- reference


@dataclass
class Evaluation:
    """Exact cost of one strategy choice, from the rules directly (the ILP's reference)."""

    feasible: bool
    time_s: float = math.inf
    memory: float = math.inf  # saved activations + model states per device (bytes)
    compute_s: float = 0.0
    comm_fwd: list[tuple[str, int]] = field(default_factory=list)
    comm_bwd: list[tuple[str, int]] = field(default_factory=list)
    saved_bytes: float = 0.0
    saved_selective_bytes: float = 0.0
    param_bytes: float = 0.0  # owned parameter bytes per device
    sharded_params: list[str] = field(default_factory=list)
    partial_params: list[str] = field(default_factory=list)  # replicated, gradient partial


def _derived_params(prob: BlockProblem, nodes: Iterable[str]) -> set[str]:
    """The parameters each of ``nodes`` is computed from, for the nodes computed inside the
    block from parameters (and constants) alone; nothing for a node that reads an activation."""
    memo: dict[str, frozenset[str] | None] = {}

    def sources(name: str) -> frozenset[str] | None:
        if name not in memo:
            memo[name] = None  # an input of the block, or a cycle guard
            i = prob.index.get(name)
            if i is not None:
                found: set[str] = set()
                for o in prob.ops[i].operands:
                    if o.kind == "param":
                        found.add(o.name)
                    elif o.kind == "node":
                        sub = sources(o.name)
                        if sub is None:
                            return None
                        found |= sub
                memo[name] = frozenset(found) or None
        return memo[name]

    return {p for n in nodes for p in (sources(n) or ())}


def evaluate(prob: BlockProblem, choice: Sequence[int], comm_seconds_per_byte: float) -> Evaluation:
    """Time and memory of the block when op i runs strategy choice[i]; infeasible when a
    consumer needs a partial sum its producer does not make."""
    t = prob.tp
    strat = [op.strategies[k] for op, k in zip(prob.ops, choice)]
    state = {op.name: s.out for op, s in zip(prob.ops, strat)}
    made = {op.name: s for op, s in zip(prob.ops, strat)}  # the strategy that made each value
    ev = Evaluation(feasible=True)
    pgrad_nodes: dict[str, bool] = {}
    plain_pgrad: dict[str, bool] = {}  # of those, the ones no module's style reduces
    pgrad_params: set[str] = set()
    uses: dict[str, list[bool]] = {}
    for op, s in zip(prob.ops, strat):
        ev.compute_s += _share(op, s, t) * op.seconds
        for o, r in zip(op.operands, s.req):
            if o.kind == "param":
                uses.setdefault(o.name, []).append(_dim(r) is not None)
            if o.kind != "node":
                continue
            src = state.get(o.name, R)
            moves = reshard(src, r)
            pinned = o.name in prob.index and prob.ops[prob.index[o.name]].pinned
            if moves is None or (pinned and src != r) or gathers_midway(made.get(o.name), src, r):
                return Evaluation(feasible=False)
            nbytes = _out_bytes(prob, o.name)
            if moves[0]:
                ev.comm_fwd.append((moves[0], nbytes))
            if moves[1] and o.grad:
                ev.comm_bwd.append((moves[1], nbytes))
        for i in _partial_grads(op, s):
            o = op.operands[i]
            if o.kind == "param":
                pgrad_params.add(o.name)
            else:
                pgrad_nodes[o.name] = True
                if not s.plan:  # a styled product's input: the style reduces its gradient
                    plain_pgrad[o.name] = True
        for how, key, nbytes, kept in _saved_entries(prob, op):
            b = nbytes / t if _entry_sharded(state, op, s, how, key) else nbytes
            ev.saved_bytes += b
            if kept:
                ev.saved_selective_bytes += b
    for u in prob.outputs:
        if gathers_midway(made[u], state[u], R):
            return Evaluation(feasible=False)
        fwd, _ = reshard(state[u], R)
        if fwd:
            ev.comm_fwd.append((fwd, prob.ops[prob.index[u]].nbytes))
    for u in sorted(pgrad_nodes):
        src = state.get(u, R)
        nbytes = _out_bytes(prob, u)
        ev.comm_bwd.append(("reduce_scatter" if _dim(src) is not None else "all_reduce", nbytes))
    for p in sorted(pgrad_params):
        ev.comm_bwd.append(("all_reduce", prob.param_bytes[p]))
    # a partial gradient of a value computed from parameters alone (Gemma's norms scale by
    # 1 + weight) is a partial gradient of those parameters: the runtime sums theirs. Not
    # where a column-parallel module reads the value (Perceiver's latents, normed into its
    # queries): torch's style sums that gradient at the module's input already, and a second
    # sum over the parameters doubled it
    ev.partial_params = sorted(pgrad_params | _derived_params(prob, plain_pgrad))
    ev.sharded_params = sorted(p for p, u in uses.items() if all(u))
    ev.param_bytes = sum(
        prob.param_bytes[p] / t if p in ev.sharded_params else prob.param_bytes[p]
        for p in prob.owned
    )
    comm_s = sum(b * comm_seconds_per_byte * _ring(k, t) for k, b in ev.comm_fwd + ev.comm_bwd)
    ev.time_s = ev.compute_s + comm_s
    ev.memory = ev.saved_bytes + model_state_bytes(prob, ev.sharded_params)
    return ev


def model_state_bytes(prob: BlockProblem, sharded: Sequence[str] = ()) -> float:
    """Weights, gradients and Adam states of the owned parameters per device: 16 bytes per
    parameter, 1/t of it for a sharded one."""
    keep = set(sharded)
    return sum(
        STATE_BYTES_PER_PARAM * prob.param_numel[p] / (prob.tp if p in keep else 1)
        for p in prob.owned
    )


# --------------------------------------------------------------------------- the MILP


def sharding_milp(
    prob: BlockProblem,
    comm_seconds_per_byte: float,
    lambdas: Sequence[float] = LAMBDAS,
    time_scale: float = 1.0,
    memory_scale: float = 1.0,
) -> list[tuple[tuple[int, ...], float]]:
    r"""Optimal strategy choices of one block: (choice, objective) for each memory weight lambda.

    Sets: ops v in V with strategies k in K_v; strategy k has output state o(v,k) and needs
    state q(v,k,i) of operand i. An operand made inside the block is an edge (u, v, i); one
    made outside is a block input, in state R. O: the ops whose value leaves the block.
    Shorthands, linear in x:

        X_u(s)  = sum_{k: o(u,k) = s} x_{u,k}                  u's output is in state s
        Q_vi(r) = sum_{k: q(v,k,i) = r} x_{v,k}                 v needs operand i in state r
        G_v(w)  = sum_{k: k leaves w's gradient partial} x_{v,k}    (w an op or a parameter)
        H_v(p)  = sum_{k: k stores parameter p sharded} x_{v,k}

    Variables: x_{v,k} in {0,1};  e_{v,i,s,r}, g_{u,s}, g_u, g_p, h_p in [0,1].

    Costs, seconds: c_{v,k} = share(v,k) (max(F_fwd/F, B_fwd/B) + max(F_bwd/F, B_bwd/B)),
    share = 1/t when k computes a shard or a partial product, else 1; C(s,r,u) = the forward
    and backward collectives of reshard(s -> r) on u's bytes (the backward one only when u
    needs a gradient), each bytes x seconds_per_byte x ring factor (all-reduce 2(t-1)/t,
    all-gather, reduce-scatter, all-to-all (t-1)/t); A(s,u) = reducing a partial gradient of u
    (all-reduce from R or P, reduce-scatter from S); AR_p = all-reducing parameter p's gradient.
    Memory, bytes: m_{v,k} = the saved tensors whose sharding x_{v,k} decides (1/t of their
    bytes when sharded), M_c the ones no choice decides, 16 n_p bytes of model state for each
    owned parameter p of n_p elements (1/t of it when stored sharded).

        min  1/T0 [ sum_{v,k} c_{v,k} x_{v,k} + sum_{(u,v,i)} sum_{s,r} C(s,r,u) e_{v,i,s,r}
                    + sum_{v, i from outside} sum_k C(R, q(v,k,i), u_i) x_{v,k}
                    + sum_{u in O} sum_s C(s,R,u) X_u(s)
                    + sum_{u,s} A(s,u) g_{u,s} + sum_{u outside} A(R,u) g_u + sum_p AR_p g_p ]
           + lambda/M0 [ sum_{v,k} m_{v,k} x_{v,k} + M_c + sum_p 16 n_p (1 - (1 - 1/t) h_p) ]

        s.t. one_strategy:       sum_k x_{v,k} = 1                             for all v
             edge_out:           sum_r e_{v,i,s,r} = X_u(s)                    for all (u,v,i), s
             edge_in:            sum_s e_{v,i,s,r} = Q_vi(r)                   for all (u,v,i), r
             reshard_legal:      Q_vi(P) = 0 for an operand from outside the block
             partial_grad:       g_{u,s} >= e_{v,i,s,R} - Q_vi(R) + G_v(u)    for all v reading
                                 u once (g_{u,s} >= X_u(s) + G_v(u) - 1 otherwise);
                                 g_u >= G_v(u) for a block input u
             param_partial_grad: g_p >= G_v(p)                                 for all v reading p
             param_sharded:      h_p <= H_v(p)                                 for all v reading p
             module_gather:      e_{v,i,s,r} <= sum_{k: o(u,k) = s, k column-parallel} x_{u,k}
                                 for s sharded, r != s; x_{u,k} = 0 for an output u whose
                                 k is sharded and not column-parallel (``gathers_midway``)

    e_{v,i,s,r} is the joint indicator "u is in s and v needs r" (pairs with an illegal
    reshard, r = P from s != P, have no variable, so edge_in forbids them); its two marginal
    constraints make the LP relaxation tight, so HiGHS mostly closes the problem at the root.
    g is an OR over a producer's consumers (one reduction however many consumers leave the
    gradient partial: Megatron's single all-reduce for fused or separate q/k/v), exact because
    the objective pushes g down; h is an AND over a parameter's uses, pushed up. T0 and M0, the
    replicated block's time and memory, make the terms commensurate, so one lambda grid suits
    every block. The model is loaded into HiGHS once and re-solved per lambda with new costs.

    The formulation reads top to bottom beside this math in four steps: ``_op_terms`` (each
    op's compute, its operands' reshards and parameter uses, the gradients it leaves partial,
    the activations it saves), ``_output_terms`` (block outputs replicated),
    ``_gradient_terms`` (the reductions g and shardings h), ``_solve_lambdas`` (HiGHS).
    """
    terms = _MilpTerms.of(prob, comm_seconds_per_byte)
    for v, op in enumerate(prob.ops):
        _op_terms(terms, v, op)
    _output_terms(terms)
    _gradient_terms(terms)
    return _solve_lambdas(terms, lambdas, time_scale, memory_scale)


# A family of rows: (x terms, z terms, right-hand side) each.
Rows = list[tuple[dict[int, float], dict[int, float], float]]


@dataclass
class _MilpTerms:
    """sharding_milp's columns and rows as its steps collect them: x (an op's strategy) then
    z (edges e, reductions g, shardings h), their time and memory costs, and the row
    families of its docstring (``eq_rows`` equalities, ``rows`` at most their rhs)."""

    prob: BlockProblem
    seconds_per_byte: float
    cols: list[tuple[int, int]]
    col: dict[tuple[int, int], int]
    cx_time: np.ndarray
    cx_mem: np.ndarray
    mem_const: float = 0.0
    z_names: list[tuple] = field(default_factory=list)
    cz_time: list[float] = field(default_factory=list)
    cz_mem: list[float] = field(default_factory=list)
    eq_rows: dict[str, Rows] = field(default_factory=lambda: {"edge_out": [], "edge_in": []})
    rows: dict[str, Rows] = field(
        default_factory=lambda: {
            "reshard_legal": [],
            "partial_grad": [],
            "param_partial_grad": [],
            "param_sharded": [],
            "module_gather": [],
        }
    )
    # what later steps read: each edge's joint variables, the partial gradients a producer
    # (by name) or a parameter gets from its consumers, and each parameter's sharded uses
    edge_vars: dict[tuple[int, int], dict[tuple[str, str], int]] = field(default_factory=dict)
    pgrad_node: dict[str, list[tuple[int, dict[int, float]]]] = field(default_factory=dict)
    pgrad_param: dict[str, list[dict[int, float]]] = field(default_factory=dict)
    shard_uses: dict[str, list[dict[int, float]]] = field(default_factory=dict)

    @classmethod
    def of(cls, prob: BlockProblem, seconds_per_byte: float) -> _MilpTerms:
        cols = [(v, k) for v, op in enumerate(prob.ops) for k in range(len(op.strategies))]
        col = {vk: j for j, vk in enumerate(cols)}
        return cls(prob, seconds_per_byte, cols, col, np.zeros(len(cols)), np.zeros(len(cols)))

    @property
    def t(self) -> int:
        return self.prob.tp

    def zvar(self, key: tuple, time_cost: float = 0.0, mem_cost: float = 0.0) -> int:
        self.z_names.append(key)
        self.cz_time.append(time_cost)
        self.cz_mem.append(mem_cost)
        return len(self.z_names) - 1

    def X(self, u: int, s: str) -> dict[int, float]:  # noqa: N802
        """The docstring's X_u(s): u's output is in state s."""
        strategies = self.prob.ops[u].strategies
        return {self.col[(u, k)]: 1.0 for k, st in enumerate(strategies) if st.out == s}

    def Q(self, v: int, i: int, r: str) -> dict[int, float]:  # noqa: N802
        """The docstring's Q_vi(r): v needs operand i in state r."""
        strategies = self.prob.ops[v].strategies
        return {self.col[(v, k)]: 1.0 for k, st in enumerate(strategies) if st.req[i] == r}

    def coll(self, kind: str | None, nbytes: int) -> float:
        return 0.0 if kind is None else nbytes * self.seconds_per_byte * _ring(kind, self.t)


def _plus(*terms: dict[int, float]) -> dict[int, float]:
    out: dict[int, float] = {}
    for term in terms:
        for j, a in term.items():
            out[j] = out.get(j, 0.0) + a
    return out


def _op_terms(m: _MilpTerms, v: int, op) -> None:
    """Op v's compute per strategy, its operands (reshards, parameter uses), the partial
    gradients it leaves and the activations it saves."""
    prob, col, t = m.prob, m.col, m.t
    for k, s in enumerate(op.strategies):
        m.cx_time[col[(v, k)]] += _share(op, s, t) * op.seconds
    for i, o in enumerate(op.operands):
        _operand_terms(m, v, op, i, o)
    per_operand: dict[tuple[str, str], dict[int, float]] = {}
    for k, s in enumerate(op.strategies):
        for i in _partial_grads(op, s):
            o = op.operands[i]
            per_operand.setdefault((o.kind, o.name), {})[col[(v, k)]] = 1.0
    for (kind, name), g in sorted(per_operand.items()):
        if kind == "param":
            m.pgrad_param.setdefault(name, []).append(g)
        else:
            m.pgrad_node.setdefault(name, []).append((v, g))
    for how, key, nbytes, _kept in _saved_entries(prob, op):
        if how == "const":
            m.mem_const += nbytes
        elif how == "node":
            u = prob.index[key]
            for k, s in enumerate(prob.ops[u].strategies):
                m.cx_mem[col[(u, k)]] += nbytes / t if _dim(s.out) is not None else nbytes
        else:
            for k, s in enumerate(op.strategies):
                sharded = _saved_state_sharded(op, s, how, key)
                m.cx_mem[col[(v, k)]] += nbytes / t if sharded else nbytes


def _operand_terms(m: _MilpTerms, v: int, op, i: int, o) -> None:
    """Operand i of op v: a parameter's sharded uses, a block input's reshard from R, or an
    edge's joint variables e with their two marginal rows."""
    prob, col = m.prob, m.col
    reqs = sorted({s.req[i] for s in op.strategies if s.req[i] is not None})
    if o.kind == "param":
        m.shard_uses.setdefault(o.name, []).append(
            {col[(v, k)]: 1.0 for k, s in enumerate(op.strategies) if _dim(s.req[i]) is not None}
        )
        return
    if o.kind != "node":
        return
    if o.name not in prob.index:  # block input, state R
        nbytes = prob.external[o.name][0]
        for k, s in enumerate(op.strategies):
            moves = reshard(R, s.req[i])
            if moves is None:
                m.rows["reshard_legal"].append(({col[(v, k)]: 1.0}, {}, 0.0))
                continue
            m.cx_time[col[(v, k)]] += m.coll(moves[0], nbytes) + (
                m.coll(moves[1], nbytes) if o.grad else 0.0
            )
        return
    u = prob.index[o.name]
    producer = prob.ops[u]
    outs = sorted({s.out for s in producer.strategies})
    pairs = [
        (s_out, r)
        for s_out in outs
        for r in reqs
        if reshard(s_out, r) is not None and (s_out == r or not producer.pinned)
    ]
    evars = m.edge_vars.setdefault((v, i), {})
    for s_out, r in pairs:
        fwd, bwd = reshard(s_out, r)
        cost = m.coll(fwd, producer.nbytes) + (m.coll(bwd, producer.nbytes) if o.grad else 0)
        evars[(s_out, r)] = m.zvar(("e", v, i, s_out, r), time_cost=cost)
        if any(gathers_midway(st, s_out, r) for st in producer.strategies if st.out == s_out):
            module_made = {
                m.col[(u, k)]: -1.0
                for k, st in enumerate(producer.strategies)
                if st.out == s_out and not gathers_midway(st, s_out, r)
            }
            m.rows["module_gather"].append((module_made, {evars[(s_out, r)]: 1.0}, 0.0))
    for s_out in outs:
        es = {evars[p]: 1.0 for p in pairs if p[0] == s_out}
        m.eq_rows["edge_out"].append((m.X(u, s_out), {j: -a for j, a in es.items()}, 0.0))
    for r in reqs:
        es = {evars[p]: 1.0 for p in pairs if p[1] == r}
        m.eq_rows["edge_in"].append((m.Q(v, i, r), {j: -a for j, a in es.items()}, 0.0))


def _output_terms(m: _MilpTerms) -> None:
    """Block outputs must be R: each output strategy pays its gather, which only a
    column-parallel module's own output may take (``gathers_midway``)."""
    prob = m.prob
    for u_name in prob.outputs:
        u = prob.index[u_name]
        for k, s in enumerate(prob.ops[u].strategies):
            fwd, _ = reshard(s.out, R)
            m.cx_time[m.col[(u, k)]] += m.coll(fwd, prob.ops[u].nbytes)
            if gathers_midway(s, s.out, R):
                m.rows["module_gather"].append(({m.col[(u, k)]: 1.0}, {}, 0.0))


def _gradient_terms(m: _MilpTerms) -> None:
    """One reduction g per partially-differentiated producer or parameter, and the sharding
    indicator h of each owned parameter every use of which can take it sharded."""
    prob = m.prob
    for name, gs in sorted(m.pgrad_node.items()):
        if name not in prob.index:
            g = m.zvar(("g", name), time_cost=m.coll("all_reduce", prob.external[name][0]))
            for _v, G in gs:
                m.rows["partial_grad"].append((G, {g: -1.0}, 0.0))
            continue
        u = prob.index[name]
        producer = prob.ops[u]
        for s_out in sorted({s.out for s in producer.strategies}):
            kind = "reduce_scatter" if _dim(s_out) is not None else "all_reduce"
            g = m.zvar(("g", name, s_out), time_cost=m.coll(kind, producer.nbytes))
            for v, G in gs:
                slots = [i for i, o in enumerate(prob.ops[v].operands) if o.name == name]
                e = m.edge_vars.get((v, slots[0]), {}).get((s_out, R)) if len(slots) == 1 else None
                if e is None:  # weak form: g >= X_u(s) + G_v(u) - 1
                    m.rows["partial_grad"].append((_plus(m.X(u, s_out), G), {g: -1.0}, 1.0))
                else:  # tight form through the edge's joint variable e_{s,R}
                    not_partial = {j: -a for j, a in m.Q(v, slots[0], R).items()}
                    m.rows["partial_grad"].append((_plus(not_partial, G), {e: 1.0, g: -1.0}, 0.0))
    for name, gs in sorted(m.pgrad_param.items()):
        g = m.zvar(("gp", name), time_cost=m.coll("all_reduce", prob.param_bytes[name]))
        for G in gs:
            m.rows["param_partial_grad"].append((G, {g: -1.0}, 0.0))
    m.mem_const += model_state_bytes(prob)
    owned = set(prob.owned)
    for name, hs in sorted(m.shard_uses.items()):
        if name not in owned or not all(hs):
            continue  # not stored here, or some use cannot take it sharded
        saving = model_state_bytes(prob) - model_state_bytes(prob, [name])
        h = m.zvar(("h", name), mem_cost=-saving)
        for H in hs:
            m.rows["param_sharded"].append(({j: -a for j, a in H.items()}, {h: 1.0}, 0.0))


def _solve_lambdas(
    m: _MilpTerms, lambdas: Sequence[float], time_scale: float, memory_scale: float
) -> list[tuple[tuple[int, ...], float]]:
    """Load the rows into HiGHS once and re-solve per lambda with new costs: (choice,
    objective) for each lambda solved to optimality."""
    prob, cols, col = m.prob, m.cols, m.col
    nx_ = len(cols)
    n = nx_ + len(m.z_names)
    # rows: one strategy per op (= 1), then each family (= rhs for the equalities, <= rhs else)
    rr, cc, vv = [np.array([u for u, _ in cols])], [np.arange(nx_)], [np.ones(nx_)]
    lower, upper = [np.ones(len(prob.ops))], [np.ones(len(prob.ops))]
    offset = len(prob.ops)
    for name, family in list(m.eq_rows.items()) + list(m.rows.items()):
        r, c, v, rhs = _entries(family, nx_)
        rr.append(r + offset)
        cc.append(c)
        vv.append(v)
        lower.append(rhs if name in m.eq_rows else np.full(len(rhs), -np.inf))
        upper.append(rhs)
        offset += len(rhs)
    pattern = Pattern.of(np.concatenate(rr), np.concatenate(cc), (offset, n))
    cost_time = np.concatenate([m.cx_time, m.cz_time]) / time_scale
    cost_mem = np.concatenate([m.cx_mem, m.cz_mem]) / memory_scale
    import highspy

    every = np.arange(n, dtype=np.int32)
    choices: list[tuple[tuple[int, ...], float]] = []
    with one_thread():  # a hundred small MIPs a plan: see planner.highs.one_thread
        h = quiet_highs(threads=1)
        h.setOptionValue("mip_rel_gap", 1e-9)
        h.setOptionValue("presolve", "off")  # the LP is tight and small: presolve costs more
        pass_model(
            h, cost_time, pattern, np.concatenate(vv), np.concatenate(lower),
            np.concatenate(upper), np.zeros(n), np.ones(n), np.arange(n) < nx_,
        )  # fmt: skip
        for lam in lambdas:
            # x OBJECTIVE_GAIN: HiGHS ignores reduced costs under its absolute tolerance
            # (1e-7), which would leave small memory tie-breaks (a bias's shard at
            # lambda = 1e-4) unresolved
            h.changeColsCost(n, every, OBJECTIVE_GAIN * (cost_time + lam * cost_mem))
            if h.run() == highspy.HighsStatus.kError:  # HiGHS refused to run: not "no solution"
                raise RuntimeError("HiGHS refused the sharding ILP (its thread scheduler)")
            if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
                continue
            xv = np.asarray(h.getSolution().col_value)
            value = h.getInfo().objective_function_value / OBJECTIVE_GAIN
            choice = []
            for v, op in enumerate(prob.ops):
                scores = [xv[col[(v, k)]] for k in range(len(op.strategies))]
                choice.append(int(np.argmax(scores)))
            choices.append((tuple(choice), value + lam * m.mem_const / memory_scale))
    return choices


def _entries(family: list, nx_: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(rows, columns, values, right-hand sides) of a family of rows (x terms, z terms, rhs),
    z's columns after x's."""
    r, c, v = [], [], []
    rhs = np.zeros(len(family))
    for row, (xs, zs, b) in enumerate(family):
        for j, a in xs.items():
            r.append(row)
            c.append(j)
            v.append(a)
        for j, a in zs.items():
            r.append(row)
            c.append(nx_ + j)
            v.append(a)
        rhs[row] = b
    return np.array(r, dtype=np.int64), np.array(c, dtype=np.int64), np.array(v, float), rhs


# --------------------------------------------------------------------------- variants


@dataclass(frozen=True)
class _Template:
    """A variant of a block class, with node and module names left to bind per block."""

    name: str
    choice: tuple[int, ...]
    states: tuple[str, ...]  # per tensor-valued op, in block order
    needs: tuple[tuple[str | None, ...], ...]  # per op, the state it reads each operand in
    plans: tuple[tuple[int, int, str], ...]  # (op position, weight operand index, label)
    grad_sums: tuple[tuple[int, int], ...]  # (op position, operand index) of a partial param
    compute_fraction: float
    memory_bound_fraction: float
    param_fraction: float
    saved_bytes: int
    saved_selective_bytes: int
    input_bytes: int
    comm_fwd: tuple[tuple[str, int], ...]
    comm_bwd: tuple[tuple[str, int], ...]
    time_s: float
    memory: float
    sequence_parallel: bool = False  # the block runs Megatron-style sequence parallel
    on_dtensors: bool = False  # it splits a replicated tensor (``_splits_replicated``)
    exit_gather: tuple[tuple[str, int], ...] = ()  # see TPVariant
    entry_gather: tuple[tuple[str, int], ...] = ()


def tp_variants(
    graph: nx.DiGraph,
    block: Block,
    tp: int,
    comm_seconds_per_byte: float = 1 / 100e9,
    flops_per_second: float = 400e12,
    bytes_per_second: float = 2e12,
    max_variants: int = 3,
    memo: dict | None = None,
    vocab_tied: bool = True,
    presolved: dict | None = None,
) -> list[TPVariant]:
    """The Pareto-best ways (time vs per-device memory) to run ``block`` over ``tp`` devices
    (``vocab_tied``: see ``build_problem``).

    Always includes "replicated" (the only one for tp=1; "tp{t}-tied" where the block reads a
    tied weight split along its vocabulary, the rest replicated), plus up to ``max_variants``
    sharded variants named "tp{t}-v{k}", k = 1 for the fastest, ordered by time, fastest first;
    then, where the block allows it, "tp{t}-v1-sp": the fastest with sequence parallelism.
    Solved once per (block class, tp, cost rates) when given a ``memo`` to keep the solutions in
    (blocks of a class differ only in names), and re-bound to this block's names.
    ``presolved``: solutions computed elsewhere under the same keys (a forked copy of the
    planning process: ``planner.api.ilps_beside``), moved into ``memo`` when first asked for,
    so that ``memo`` holds what it would have held had they been solved here."""
    vocab_tied = vocab_tied and bool(vocab_parallel_tied(graph, tp))
    key = (block.cls, tp, comm_seconds_per_byte, flops_per_second, bytes_per_second, max_variants)
    key += (vocab_tied,)
    memo = {} if memo is None else memo
    if key not in memo and presolved and key in presolved:
        memo[key] = presolved.pop(key)
    if key not in memo:
        prob = build_problem(graph, block, tp, flops_per_second, bytes_per_second, vocab_tied)
        memo[key] = _templates(prob, comm_seconds_per_byte, max_variants)
    # A sequence-parallel block is entered and left as one module (one block, one module), on
    # plain local shards (a layout that splits a replicated tensor needs DTensors).
    return [
        _bind(graph, block, tpl, tp)
        for tpl in memo[key]
        if (not tpl.sequence_parallel or (len(block.modules) == 1 and not tpl.on_dtensors))
        and realizable(graph, block, tpl)
    ]


def _templates(
    prob: BlockProblem, comm_seconds_per_byte: float, max_variants: int
) -> list[_Template]:
    replicated = tuple(0 for _ in prob.ops)
    base = evaluate(prob, replicated, comm_seconds_per_byte)
    found: dict[tuple[int, ...], Evaluation] = {replicated: base}
    if prob.tp > 1 and prob.ops:
        choices = sharding_milp(
            prob,
            comm_seconds_per_byte,
            time_scale=base.time_s or 1.0,
            memory_scale=base.memory or 1.0,
        )
        for choice, _objective in choices:
            if choice not in found:
                ev = evaluate(prob, choice, comm_seconds_per_byte)
                if ev.feasible:
                    found[choice] = ev
    front = [
        c
        for c, ev in found.items()
        if c == replicated
        or not any(
            o.time_s <= ev.time_s
            and o.memory <= ev.memory
            and (o.time_s, o.memory) != (ev.time_s, ev.memory)
            for o in found.values()
        )
    ]
    front.sort(key=lambda c: (found[c].time_s, found[c].memory, c))
    sharded = [c for c in front if c != replicated][:max_variants]
    keep = sorted(sharded + [replicated], key=lambda c: (found[c].time_s, found[c].memory, c))
    names = {c: f"tp{prob.tp}-v{k}" for k, c in enumerate(sharded, start=1)}
    # every op's first strategy: all replicated, unless a tied weight must be split along its
    # vocabulary in every variant (vocab_parallel_tied), which this one then shards alone
    styled = any(op.strategies[0].plan for op in prob.ops)
    names[replicated] = f"tp{prob.tp}-tied" if styled else "replicated"
    templates = [_template(prob, c, names[c], found[c]) for c in keep]
    if sharded:
        sp = _sequence_parallel(prob, sharded[0], names[sharded[0]], comm_seconds_per_byte)
        if sp is not None:
            templates.append(sp)
    return templates


# Ops a sequence-parallel region may hold: they act on each token alone, so they run on a
# shard of the sequence. Ops inside a norm module may reduce over the hidden dimension too.
SEQUENCE_LOCAL = ELEMENTWISE | LINEAR_UNARY | NORMS


def _replicated_region(prob: BlockProblem, strat: list, seeds: set[str]) -> set[str]:
    """The ops of sequence parallelism's replicated region: replicated ops linked to the block
    input through replicated ops, either way (the dropout between a row-parallel output and
    the residual add joins through the add)."""
    links: dict[str, set[str]] = {op.name: set() for op, s in zip(prob.ops, strat) if s.out == R}
    region: set[str] = set()
    for op in prob.ops:
        if op.name not in links:
            continue
        for o in op.operands:
            if o.kind == "node" and o.name in seeds:
                region.add(op.name)
            elif o.kind == "node" and o.name in links:
                links[op.name].add(o.name)
                links[o.name].add(op.name)
    todo = list(region)
    while todo:
        for v in links[todo.pop()] - region:
            region.add(v)
            todo.append(v)
    return region


def _sequence_parallel(
    prob: BlockProblem, choice: tuple[int, ...], name: str, comm_seconds_per_byte: float
) -> _Template | None:
    """Megatron-style sequence parallelism on top of a TP variant (Korthikanti et al. 2022),
    priced as the runtime runs it with torch's styles, or None when the block does not allow it.

    The replicated region (ops fed by the block's input or by each other through replicated
    states: residual adds, norms, dropout) runs on 1/t of the sequence, so its compute and its
    saved activations shrink by t. The block takes and returns replicated tensors (the runtime
    slices at entry and all-gathers at exit); the module holding column-parallel weights
    all-gathers its sequence-sharded input once ("sp_gather"; reduce-scatter of the gradient
    back) and, as Megatron does, keeps only the shard for backward and gathers it again there
    (the runtime's saved-tensor hooks); each row-parallel output is reduce-scattered instead of
    all-reduced (all-gather of the gradient back). Norm modules run
    as torch's ``SequenceParallel``; a region op outside a norm module must be token-local.

    Long because Megatron's layout is derived in one pass over the block's ops; split, its
    invariants would be spread over helpers.
    """
    t = prob.tp
    strat = [op.strategies[k] for op, k in zip(prob.ops, choice)]
    state = {op.name: s.out for op, s in zip(prob.ops, strat)}
    seeds = {n for n, (_, grad) in prob.external.items() if grad}
    if len(seeds) != 1:
        return None
    region = _replicated_region(prob, strat, seeds)
    if not region or any(u not in region for u in prob.outputs):
        return None
    lead = tuple(prob.ops[prob.index[prob.outputs[0]]].shape[:2])  # (batch, sequence)
    norms: list[tuple[int, int, str]] = []
    normed: set[str] = set()  # region ops inside norms: their outputs are sharded DTensors
    for pos, op in enumerate(prob.ops):
        if op.name not in region:
            continue
        in_norm = "norm" in op.module.rsplit(".", 1)[-1].lower() or _base(op.op) in NORMS
        if in_norm:
            normed.add(op.name)
        local = in_norm or _base(op.op) in SEQUENCE_LOCAL or _regroups_tokens(op, lead, t)
        dim = _token_dim(op.shape, lead, t)
        if not local or dim is None:
            return None  # not token by token, or not a (batch, sequence, ...) activation
        for w, o in enumerate(op.operands):
            if o.kind == "param":
                if not in_norm:
                    return None  # a weight outside a norm would need a style of its own
                norms.append((pos, w, TOKEN_STYLES["sequence"] if dim == 0 else "sequence"))
    partial_in = sorted(
        {
            o.name
            for op in prob.ops
            if op.name in region
            for o in op.operands
            if o.kind == "node" and state.get(o.name) == P
        }
    )
    fwd: list[tuple[str, int]] = [("reduce_scatter", _out_bytes(prob, u)) for u in partial_in]
    bwd: list[tuple[str, int]] = [("all_gather", _out_bytes(prob, u)) for u in partial_in]
    plans = []
    gathers: dict[tuple[str, str], int] = {}
    regathered: set[str] = set()  # column-parallel ops whose gathered input is kept as the shard
    for pos, (op, s) in enumerate(zip(prob.ops, strat)):
        if weight_in_out(s.plan):
            return None  # torch's sequence-parallel styles take Linear weights only
        if s.plan == "rowwise":
            dim = _token_dim(op.shape, lead, t)  # its output, reduce-scattered along dim
            if dim is None:
                return None
            plans.append((pos, _weight_slot(op), _sp_style("rowwise_sp", dim)))
        elif s.plan == "colwise":
            acts = [o for o in op.operands if o.kind == "node"]
            if not acts or not all(a.name in region or a.name in seeds for a in acts):
                return None
            dims = {_token_dim(a.shape, lead, t) for a in acts}
            if len(dims) != 1 or None in dims:
                return None
            parent = op.module.rpartition(".")[0]
            own = parent in ("", prob.block_module)  # no module between: the Linear gathers
            dim = dims.pop()
            # on the flattened tokens, a Linear of the block's own fed by a norm's sharded
            # output gathers it in a hook of its own that keeps the shard for backward, as a
            # module's gather does (runtime.parallelize: "colwise_sp_tokens")
            regathers = own and dim == 0 and all(a.name in normed for a in acts)
            label = _sp_style("colwise_sp", dim) if own else "colwise"
            plans.append((pos, _weight_slot(op), label))
            where = op.module if regathers else op.name if own else parent
            for a in acts:
                gathers[(where, a.name)] = _out_bytes(prob, a.name)
            if regathers or not own:
                regathered.add(op.name)
        elif s.plan:
            return None
    for (where, _), nbytes in gathers.items():
        fwd.append(("all_gather", nbytes))
        bwd.append(("reduce_scatter", nbytes))
        if where not in prob.index:  # a module's gather: again in backward, for the weights
            bwd.append(("all_gather", nbytes))
    exit_gather = tuple(("all_gather", prob.ops[prob.index[u]].nbytes) for u in prob.outputs)
    entry_gather = tuple(("all_gather", prob.external[n][0]) for n in seeds)
    fwd += exit_gather
    bwd += entry_gather
    shares = [1.0 / t if op.name in region else _share(op, s, t) for op, s in zip(prob.ops, strat)]
    saved = selective = 0.0
    for op, s in zip(prob.ops, strat):
        for how, key, nbytes, kept in _saved_entries(prob, op):
            sharded = op.name in region or _entry_sharded(state, op, s, how, key)
            if op.name in regathered and how == "slot":
                sharded = True  # the gathered input, kept as its shard until backward
            b = nbytes / t if sharded else nbytes
            saved += b
            selective += b if kept else 0.0
    compute = sum(sh * op.seconds for sh, op in zip(shares, prob.ops))
    comm = sum(b * comm_seconds_per_byte * _ring(k, t) for k, b in fwd + bwd)
    tp = evaluate(prob, choice, comm_seconds_per_byte)  # the weights are split as in TP
    owned_bytes = sum(prob.param_bytes[p] for p in prob.owned)
    cf = sum(sh * op.flops for sh, op in zip(shares, prob.ops)) / prob.flops if prob.flops else 1.0
    mb = (
        sum(sh * op.fwd_bytes for sh, op in zip(shares, prob.ops)) / prob.fwd_bytes
        if prob.fwd_bytes
        else 1.0
    )
    seq_states = tuple(("S1" if op.name in region else s.out) for op, s in zip(prob.ops, strat))
    return _Template(
        name=f"{name}-sp",
        choice=choice,
        states=seq_states,
        needs=tuple(s.req for s in strat),
        plans=tuple(sorted(plans + norms)),
        on_dtensors=_splits_replicated(prob, strat),
        grad_sums=_param_uses(prob, tp.partial_params),
        compute_fraction=cf,
        memory_bound_fraction=mb,
        param_fraction=tp.param_bytes / owned_bytes if owned_bytes else 1.0,
        saved_bytes=int(round(saved)),
        saved_selective_bytes=int(round(selective)),
        input_bytes=prob.input_bytes // t,
        comm_fwd=tuple(fwd),
        comm_bwd=tuple(bwd),
        time_s=compute + comm,
        memory=saved + model_state_bytes(prob, tp.sharded_params),
        sequence_parallel=True,
        exit_gather=exit_gather,
        entry_gather=entry_gather,
    )


# Megatron's sequence-parallel styles on a region whose tokens are flattened into dim 0
TOKEN_STYLES = {
    "sequence": "sequence_tokens",
    "colwise_sp": "colwise_sp_tokens",
    "rowwise_sp": "rowwise_sp_tokens",
}


def _sp_style(style: str, dim: int) -> str:
    """``style`` for a region sharded along ``dim``: 1, the sequence; 0, flattened tokens."""
    return TOKEN_STYLES[style] if dim == 0 else style


def _token_dim(shape: Sequence[int], lead: tuple[int, ...], t: int) -> int | None:
    """Where ``shape`` holds the stream's tokens, whose sequence (``lead``: batch, sequence)
    sequence parallelism splits t ways: 1 for a (batch, sequence, ...) activation; 0 for one
    whose batch and sequence are flattened into its first dim, (batch x sequence, ...) (OPT's
    MLP runs on ``reshape(-1, hidden)``): each rank's (batch, sequence / t) tokens flattened
    are its shard of that dim, in its own order, which the gather before a column-parallel
    product and the reduce-scatter after the row-parallel one keep (the products act on each
    token alone); None for anything else, or a sequence t does not divide."""
    if len(lead) != 2 or lead[1] % t or lead[1] < 2:
        return None
    if len(shape) >= 3 and tuple(shape[:2]) == lead:
        return 1
    if len(shape) >= 2 and shape[0] == lead[0] * lead[1]:
        return 0
    return None


def _regroups_tokens(op: Op, lead: tuple[int, ...], t: int) -> bool:
    """Whether ``op`` is a reshape that only flattens or unflattens the stream's token dims
    ((batch, sequence, ...) <-> (batch x sequence, ...), the rest kept): token-local, so it
    runs on each rank's shard as on the whole."""
    if _base(op.op) not in RESHAPES:
        return False
    src = [o for o in op.operands if o.kind == "node"]
    if len(src) != 1:
        return False
    a, b = tuple(src[0].shape), tuple(op.shape)
    da, db = _token_dim(a, lead, t), _token_dim(b, lead, t)
    return da is not None and db is not None and a[da + 1 :] == b[db + 1 :]


def _out_bytes(prob: BlockProblem, name: str) -> int:
    if name in prob.index:
        return prob.ops[prob.index[name]].nbytes
    return prob.external[name][0]


def _weight_slot(op: Op) -> int:
    return next(i for i, o in enumerate(op.operands) if o.kind == "param")


def _param_uses(prob: BlockProblem, names: Sequence[str]) -> tuple[tuple[int, int], ...]:
    """(op position, operand index) of the first use of each parameter named."""
    found = []
    for name in names:
        found.append(
            next(
                (pos, i)
                for pos, op in enumerate(prob.ops)
                for i, o in enumerate(op.operands)
                if o.kind == "param" and o.name == name
            )
        )
    return tuple(found)


def _template(prob: BlockProblem, choice: tuple[int, ...], name: str, ev: Evaluation) -> _Template:
    t = prob.tp
    strat = [op.strategies[k] for op, k in zip(prob.ops, choice)]
    shares = [_share(op, s, t) for op, s in zip(prob.ops, strat)]
    mb = (
        sum(sh * op.fwd_bytes for sh, op in zip(shares, prob.ops)) / prob.fwd_bytes
        if prob.fwd_bytes
        else 1.0
    )
    cf = sum(sh * op.flops for sh, op in zip(shares, prob.ops)) / prob.flops if prob.flops else mb
    owned_bytes = sum(prob.param_bytes[p] for p in prob.owned)
    plans = []
    for pos, (op, s) in enumerate(zip(prob.ops, strat)):
        if s.plan:
            plans.append((pos, _weight_slot(op), s.plan))
    return _Template(
        name=name,
        choice=choice,
        states=tuple(s.out for s in strat),
        needs=tuple(s.req for s in strat),
        plans=tuple(plans),
        on_dtensors=_splits_replicated(prob, strat),
        grad_sums=_param_uses(prob, ev.partial_params),
        compute_fraction=cf,
        memory_bound_fraction=mb,
        param_fraction=ev.param_bytes / owned_bytes if owned_bytes else 1.0,
        saved_bytes=int(round(ev.saved_bytes)),
        saved_selective_bytes=int(round(ev.saved_selective_bytes)),
        input_bytes=prob.input_bytes,
        comm_fwd=tuple(ev.comm_fwd),
        comm_bwd=tuple(ev.comm_bwd),
        time_s=ev.time_s,
        memory=ev.memory,
    )


def _read_sharded(
    graph: nx.DiGraph, block: Block, module: str, states: dict[str, str], whole: set[str]
) -> bool:
    """Whether a parameter of ``module``, or a value computed from parameters alone (xIELU's
    softplus(alpha)), meets a sharded activation at an op the runtime runs on the shard: the
    ops in ``whole`` run on a gathered output (``colwise_gather``) and give whole gradients.
    The ILP priced those ops on the shard, whose partial gradients it sums; the runtime must
    not sum what each rank already has whole (xIELU's alpha trained twice as fast)."""
    inside = set(block.nodes)
    prefix = module + "."
    derived: set[str] = set()
    todo = [
        n
        for n in block.nodes
        if any(o.kind == "param" and o.name.startswith(prefix)
               for o in _operands(graph, graph.nodes[n]))
    ]  # fmt: skip
    while todo:
        n = todo.pop()
        if n in derived:
            continue
        derived.add(n)
        operands = _operands(graph, graph.nodes[n])
        from_params = all(o.kind != "node" or o.name in derived for o in operands)
        if from_params and states.get(n, R) == R:  # still a value of parameters alone
            todo.extend(v for v in graph.successors(n) if v in inside and _has_tensor(graph, v))
        elif states.get(n, R) != R and n not in whole:
            return True  # it meets an activation on the shard
    return False


def _sharded_region(
    graph: nx.DiGraph,
    block: Block,
    start: str,
    states: dict[str, str],
    needs: dict[str, tuple[str | None, ...]],
) -> tuple[bool, bool, set[str]]:
    """(is the region gathered, does it also reach a row-parallel consumer, its ops) for the
    sharded region downstream of a column-parallel op: the ops that read it as the shard
    (``needs``: the state each op requires of each operand). The region is gathered where a
    consumer needs it replicated or it leaves the block; the runtime then gathers right at
    the module output (``colwise_gather``) and runs the ops between whole, so the ILP gathers
    only there (``gathers_midway``) and prices what runs."""
    inside = set(block.nodes)
    leaves = set(graph.graph.get("outputs", []))
    seen, todo = {start}, [start]
    gathered = partial = False
    while todo:
        u = todo.pop()
        succ = [v for v in graph.successors(u) if _has_tensor(graph, v)]
        if u in leaves or any(v not in inside for v in succ):
            gathered = True
        for v in succ:
            sv = states.get(v)
            if sv is None or v in seen:
                continue
            reads = {
                r
                for o, r in zip(_operands(graph, graph.nodes[v]), needs.get(v, ()))
                if o.kind == "node" and o.name == u
            }
            if reads and states[u] not in reads:
                gathered = True  # v reads u whole: its own output starts anew (a projection)
                continue
            if sv == R:
                gathered = True
            elif sv == P:
                partial = True
            else:
                seen.add(v)
                todo.append(v)
    return gathered, partial, seen


def realizable(graph: nx.DiGraph, block: Block, tpl: _Template) -> bool:
    """Can torch's styles run this layout? A column-parallel output is handed on either as the
    shard or gathered, once, at the module's output: a region that needs both (T5's relative
    position bias feeds this layer's head-sharded scores and, whole, the next layers) cannot;
    nor can a replicated tensor split by an expand where no column-parallel output stays
    sharded (``_splits_replicated``)."""
    nodes = [n for n in block.nodes if _has_tensor(graph, n)]
    states, needs = dict(zip(nodes, tpl.states)), dict(zip(nodes, tpl.needs))
    kept = False  # some column-parallel output handed on as the shard
    for pos, _w, label in tpl.plans:
        if base_style(label) in ("colwise", "colwise_dtensor"):
            gathered, partial, _ = _sharded_region(graph, block, nodes[pos], states, needs)
            if gathered and partial:
                return False
            kept = kept or not gathered
    # a replicated tensor split by an expand runs only on DTensors, which the block enters at
    # a column-parallel module that keeps its output sharded
    return kept or not tpl.on_dtensors


def _holder(graph: nx.DiGraph, node: str, weight: str) -> str:
    """The module whose style shards ``weight`` for op ``node``: the weight's own module, or,
    for a tied weight (named after its first holder), the module of the op that reads it when
    that module holds it too (a head whose weight is the token embedding)."""
    owner = weight.rpartition(".")[0]
    module = graph.nodes[node]["module"]
    leaf = weight.rpartition(".")[2]
    alias = graph.graph.get("param_owner", {})
    if module != owner and alias.get(f"{module}.{leaf}") == weight:
        return module
    return owner


def _bind(graph: nx.DiGraph, block: Block, tpl: _Template, tp: int) -> TPVariant:
    nodes = [n for n in block.nodes if _has_tensor(graph, n)]
    plan: dict[str, str] = {}
    states = dict(zip(nodes, tpl.states))
    needs = dict(zip(nodes, tpl.needs))
    whole: set[str] = set()  # ops the runtime runs on a gathered module output
    for pos, w, label in tpl.plans:
        weight = _operands(graph, graph.nodes[nodes[pos]])[w].name
        base = base_style(label)  # colwise_dtensor here: by blocks (see BLOCKS)
        if base in ("colwise", "colwise_dtensor"):
            gathered, _, region = _sharded_region(graph, block, nodes[pos], states, needs)
            if gathered:
                label = label.replace(base, "colwise_gather", 1)
                whole |= region - {nodes[pos]}
        plan[_holder(graph, nodes[pos], weight)] = label
    sums = set()
    for pos, i in tpl.grad_sums:
        module = _operands(graph, graph.nodes[nodes[pos]])[i].name.rpartition(".")[0]
        # a styled module's parameters are DTensors (DTensor reduces them); a parameter read
        # only where the runtime has gathered the shards gets its whole gradient on every rank
        if module not in plan and _read_sharded(graph, block, module, states, whole):
            sums.add(module)
    if tpl.on_dtensors:
        plan = on_dtensors(plan)
    if tpl.sequence_parallel:
        plan[block.modules[0]] = "sp_block"  # replicated in and out, sequence-sharded inside
        for pos, _, label in tpl.plans:
            if label == "colwise":  # its parent module gathers the sharded sequence once
                plan[graph.nodes[nodes[pos]]["module"].rpartition(".")[0]] = "sp_gather"
    return TPVariant(
        name=tpl.name,
        tp=tp,
        states=dict(zip(nodes, tpl.states)),
        tp_plan=plan,
        compute_fraction=tpl.compute_fraction,
        memory_bound_fraction=tpl.memory_bound_fraction,
        param_fraction=tpl.param_fraction,
        saved_bytes=tpl.saved_bytes,
        saved_selective_bytes=tpl.saved_selective_bytes,
        input_bytes=tpl.input_bytes,
        comm_fwd=tpl.comm_fwd,
        comm_bwd=tpl.comm_bwd,
        grad_sums=tuple(sorted(sums - set(plan))),
        exit_gather=tpl.exit_gather,
        entry_gather=tpl.entry_gather,
    )


def sequence_stream(v: TPVariant, takes: bool, leaves: bool) -> TPVariant:
    """A sequence-parallel variant run inside Megatron's sequence-sharded residual stream:
    entered with the shard its predecessor left (``takes``: no slice, so no all-gather of the
    input's gradient in backward) and/or left as the shard its successor takes (``leaves``:
    no all-gather of the output in forward); its input is then the 1/t shard also for a
    checkpoint that keeps it (``block_options.full_recompute_kept``). Other variants are
    returned as they are."""
    if not (v.exit_gather or v.entry_gather) or not (takes or leaves):
        return v
    fwd, bwd = list(v.comm_fwd), list(v.comm_bwd)
    if leaves:
        del fwd[len(fwd) - len(v.exit_gather) :]
    if takes:
        del bwd[len(bwd) - len(v.entry_gather) :]
    return dataclasses.replace(
        v,
        comm_fwd=tuple(fwd),
        comm_bwd=tuple(bwd),
        takes_sequence_shard=takes,
        leaves_sequence_shard=leaves,
    )
