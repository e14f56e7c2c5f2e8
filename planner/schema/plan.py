"""The plan as typed records: what plan.json holds (docs/plan-format.md), field for field.

``Plan.from_dict`` reads a validated plan dict (``planner.schema.validate_plan`` checks it
first and says in one line what is wrong); ``to_dict`` gives back the same dict, so writing a
loaded plan reproduces its file byte for byte. Nothing here computes anything: the runtime and
the report read these records, the planner writes them.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from planner.schema.mesh import OMIT_NONE, Mesh

# A field's JSON key when it is not the field's name (``class`` is a Python keyword).
JSON_KEY = "json"
# (OMIT_NONE: a field written only when set: the heterogeneous fields, so a single-kind plan's
# file stays as it was before they existed.)


@dataclass
class ModelInfo:
    file: str  # absolute path of the model file
    sha256: str  # of its bytes: plan run refuses a file that changed
    args: dict[str, Any] = field(default_factory=dict)  # build_model keyword arguments
    params: int = 0  # unique parameters (tied ones once)
    blocks: int = 0
    trace: str = "export"  # "export" or "hooks" (the coarser fallback)
    # parameters the traced forward never reads (no gradient reaches them); unknown under hooks
    unread_params: list[str] = field(default_factory=list)
    # modules whose forward the model calls directly, not through __call__ (their hooks never
    # fire: the runtime routes those calls through it); written only when there are some
    direct_forward: list[str] | None = field(default=None, metadata={OMIT_NONE: True})
    # weights an op outside their own module reads, or several modules hold (a data-parallel
    # unit of their module's own would hand that code a shard); written only when some are
    read_outside: list[str] | None = field(default=None, metadata={OMIT_NONE: True})


@dataclass
class ClusterInfo:
    profile: str
    nodes: int
    gpus_per_node: int
    gpus: int


@dataclass
class StagePlan:
    """One (virtual) pipeline stage: per micro-batch times unless they say "per step"."""

    index: int
    pp_rank: int  # stage i runs on pp rank i % pp
    blocks: list[str]
    ranks: list[int]  # global ranks of its pp rank (replicas x tp)
    forward_s: float
    backward_s: float
    compute_s: float = 0.0
    tp_comm_s: float = 0.0
    p2p_s: float = 0.0
    time_per_microbatch_s: float = 0.0
    dp_comm_s: float = 0.0  # per step
    dp_exposed_s: float = 0.0  # per step
    optimizer_s: float = 0.0  # per step, gradient accumulation included
    offload_s: float = 0.0  # per step
    inflight_microbatches: int = 1
    # What each data-parallel replica of this stage runs a step (planner.training.
    # replica_counts): its samples and its micro-batches, read by the runtime. Plans written
    # before they were stored get them on load (planner.schema.plan_from_dict).
    local_batch_size: int = 0
    num_microbatches: int = 0
    # The device kind (a name of Plan.kinds) its ranks are, in a heterogeneous plan; absent
    # in a single-kind one.
    kind: str | None = field(default=None, metadata={OMIT_NONE: True})
    # The stage receives the residual stream as each TP rank's sequence shard from the stage
    # before (Megatron's layout; the sending stage slices it where its last block does not
    # leave it so, this one gathers it where its first block does not take it); absent: whole.
    receives_sequence_shard: bool | None = field(default=None, metadata={OMIT_NONE: True})


@dataclass
class KindInfo:
    """One device kind of a heterogeneous plan: its name, its profile and how many of its
    GPUs the plan uses."""

    name: str
    profile: str
    gpus_per_node: int
    gpus: int


@dataclass
class BlockPlan:
    """One block and every choice the plan makes for it."""

    name: str
    modules: list[str]  # module paths (FQNs) that make the block
    stage: int
    recompute: str  # vocab.Recompute
    offload: str  # vocab.Offload
    tp_plan: dict[str, str] = field(default_factory=dict)  # module FQN -> vocab.TPStyle
    # modules whose own (replicated) parameters' gradients are summed over the TP group: each
    # rank computed its share of them (a per-head norm's weight with the heads split)
    tp_grad_sums: list[str] = field(default_factory=list)
    # module attributes ("layers.0.self_attn.num_heads") each rank divides by the TP degree:
    # the head count a view in the module's code fixes, so it views its own heads
    tp_local_attributes: list[str] = field(default_factory=list)
    block_class: str = field(default="", metadata={JSON_KEY: "class"})  # identical blocks share it
    # A sequence-parallel ("sp_block") block inside Megatron's sequence-sharded stream: it is
    # entered with the shard the block before left (no slice) / leaves its output as the shard
    # the block after takes (no gather), across a pipeline cut too (the stage sends the shard).
    # Written only where true; a plan without them slices at entry and gathers at exit.
    takes_sequence_shard: bool | None = field(default=None, metadata={OMIT_NONE: True})
    leaves_sequence_shard: bool | None = field(default=None, metadata={OMIT_NONE: True})
    params: int = 0
    tp_variant: str = "replicated"
    time_per_microbatch_s: float = 0.0
    activation_bytes_per_microbatch: float = 0.0
    memory_bytes: float = 0.0  # its states after ZeRO/offload + in-flight activations


@dataclass
class Memory:
    """Per-device bytes of one pipeline rank, by category."""

    params: float
    grads: float
    optimizer: float
    activations: float
    other: float
    total: float


@dataclass
class Prediction:
    step_time_s: float
    peak_memory_bytes: float
    capacity_bytes: float
    mfu: float
    memory_per_stage: list[Memory]
    pipeline_s: float = 0.0
    bubble_s: float = 0.0
    dp_exposed_s: float = 0.0
    optimizer_s: float = 0.0
    offload_s: float = 0.0
    samples_per_s: float = 0.0
    tokens_per_s: float = 0.0
    model_flops_per_step: float = 0.0
    host_bytes_per_gpu: float = 0.0
    # Added with error bars (plans without them still load): the measured step the published
    # runs' held-out errors allow, [fastest, slowest], how many runs the spread is read from
    # and which (cost.error_bars.ErrorBar)
    step_time_range_s: list[float] | None = field(default=None, metadata={OMIT_NONE: True})
    step_time_range_runs: int = 0
    step_time_range_scope: str = ""


@dataclass
class Alternative:
    """The best candidate of one mesh shape, or a named baseline, and why it lost."""

    label: str
    status: str
    mesh: Mesh
    micro_batch_size: int
    schedule: str
    virtual_stages: int
    zero_stage: int
    why_not: str
    # None where no placement of this candidate fits at all (its bound is infinite: JSON has
    # no number for it)
    lower_bound_step_time_s: float | None = 0.0
    step_time_s: float | None = None
    peak_memory_bytes: float | None = None
    feasible: bool | None = None
    mfu: float | None = None
    baseline: str | None = None  # only on named baselines


@dataclass
class CandidatePoint:
    label: str
    step_time_s: float
    peak_memory_bytes: float
    feasible: bool
    chosen: bool


@dataclass
class Certificate:
    """Why one outer candidate is or is not the plan: its status, its step time when its MILP
    placed it (``objective``), and the proven lower bound of its step time (``bound``: the
    MILP's dual bound, the split or LP bound that pruned it, or the incumbent a cutoff proved
    it cannot beat; None when it cannot fit or another candidate dominates it)."""

    label: str
    status: str  # solved | pruned-bound | pruned-memory | infeasible | dominated | unresolved
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None  # (objective - bound) / objective, solved candidates
    nodes: int = 0  # branch-and-bound nodes its MILP solves explored


@dataclass
class SolverRecord:
    status: str  # "optimal", or "feasible" with the gap it may be from optimal
    objective: float = 0.0
    gap: float = 0.0
    solve_time_s: float = 0.0
    candidates_total: int = 0
    candidates_solved: int = 0
    candidates_pruned: int = 0
    alternatives: list[Alternative] = field(default_factory=list)
    candidates: list[CandidatePoint] = field(default_factory=list)
    # Added with certificates (plans without them still load): the proven lower bound of the
    # optimum step time, the search's work in branch-and-bound nodes and its limits, and one
    # certificate per candidate, the chosen one included.
    bound: float | None = None
    nodes: int = 0
    work_limits: dict[str, int] = field(default_factory=dict)
    certificates: list[Certificate] = field(default_factory=list)


@dataclass
class Plan:
    schema: str
    model: ModelInfo
    cluster: ClusterInfo
    mesh: Mesh
    global_batch_size: int
    micro_batch_size: int
    num_microbatches: int  # per replica per step
    schedule: str  # vocab.Schedule
    virtual_stages: int
    zero_stage: int
    dtype: str  # vocab.DType
    optimizer: str  # vocab.Optimizer
    stages: list[StagePlan]
    blocks: list[BlockPlan]
    predicted: Prediction
    solver: SolverRecord
    lr: float = 3e-4
    mesh_order: list[str] = field(default_factory=lambda: ["pp", "dp", "cp", "tp"])
    # BatchNorm statistics over the replicas' micro-batches together, or each replica's own
    # (vocab.BatchNormStats; runtime.batchnorm says what each trains)
    batchnorm: str = "synchronized"
    # The dtype gradients are reduced and accumulated in (FSDP2's MixedPrecisionPolicy
    # reduce_dtype): fp32, or the plan's 16-bit dtype (Training.half_grad_reduce). Plans
    # written before it load with fp32, what their runtime did.
    reduce_dtype: str = "fp32"
    # Heterogeneous plans only (absent otherwise): the device kinds, and each global rank's
    # kind (rank_kinds[r] names a kind). The runtime needs neither: it runs the mesh.
    kinds: list[KindInfo] | None = field(default=None, metadata={OMIT_NONE: True})
    rank_kinds: list[str] | None = field(default=None, metadata={OMIT_NONE: True})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        return _build(cls, data)

    def to_dict(self) -> dict[str, Any]:
        return _dump(self)

    def stages_of(self, pp_rank: int) -> list[StagePlan]:
        """The (virtual) stages pipeline rank ``pp_rank`` runs, in order."""
        return [st for st in self.stages if st.pp_rank == pp_rank]


# --------------------------------------------------------------------------- dict <-> records


# Per record class: (field name, JSON key, omitted when None), read once: a plan of
# Llama-3-405B on 16,384 GPUs holds 100,000 records (certificates, ranks) to write.
_DUMPED: dict[type, list[tuple[str, str, bool]]] = {}


def _key(f: dataclasses.Field) -> str:
    return f.metadata.get(JSON_KEY, f.name)


class SchemaError(ValueError):
    """A plan dict that does not fit the records: says which field, where."""


def _build(cls: type, data: Any, where: str = "plan") -> Any:
    """A dataclass from its dict, nested records and lists of them included; keys the dict
    lacks take the field's default, and a required one missing is a SchemaError."""
    if not isinstance(data, dict):
        raise SchemaError(f"{where} must be an object")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        key = _key(f)
        if key in data:
            kwargs[f.name] = _convert(hints[f.name], data[key], f"{where}.{key}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise SchemaError(f"{where}.{key} is missing")
    return cls(**kwargs)


def _convert(hint: Any, value: Any, where: str) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return _convert(inner[0], value, where) if len(inner) == 1 else value
    if origin is list:
        if not isinstance(value, list):
            raise SchemaError(f"{where} must be a list")
        (item,) = typing.get_args(hint)
        return [_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    return _checked(hint, value, where)


def _checked(hint: Any, value: Any, where: str) -> Any:
    """A plain value of the field's type: a finite number for float (an int is one), an int
    for int, a string, a flag, an object."""
    base = typing.get_origin(hint) or hint
    if base is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = ok and value == value and abs(value) != float("inf")
    elif base is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif base in (str, bool, dict):
        ok = isinstance(value, base)
    else:
        ok = True
    if not ok:
        raise SchemaError(f"{where} must be a {getattr(base, '__name__', base)}, got {value!r}")
    return value


def _dump(obj: Any) -> Any:
    spec = _DUMPED.get(type(obj))
    if spec is None and dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        spec = _DUMPED[type(obj)] = [
            (f.name, _key(f), f.name == "baseline" or bool(f.metadata.get(OMIT_NONE)))
            for f in dataclasses.fields(obj)
        ]
    if spec is not None:
        out = {}
        for name, key, omit_none in spec:
            value = getattr(obj, name)
            if value is None and omit_none:
                continue  # only named baselines carry one; heterogeneous fields likewise
            out[key] = _dump(value)
        return out
    if isinstance(obj, (list, tuple)):
        return [_dump(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _dump(v) for k, v in obj.items()}
    return obj
