"""The cost model's records: one block's priced option (``BlockOption``), a configuration
(``Config``), what one configuration costs per stage and per step (``StageCost``,
``StepCost``), what every configuration of a candidate is priced from (``CostInputs``), and the
small facts a configuration implies that every term reads (its sample share, whether its
gradients are held or reduced late, its last pipeline rank, its tied weights).

Units: seconds and bytes, per device. A block's traced numbers are for ``traced_mbs`` samples;
FLOPs, bytes and activations scale linearly with the micro-batch size.

What overlaps with what (stated once, used by every term):
- tensor-parallel collectives sit on the critical path of every micro-batch (not overlapped);
- pipeline point-to-point sends are counted per micro-batch on the sending stage (hidden behind
  the stage's compute only where the framework overlaps them: ``Training.p2p_overlap``);
- the data-parallel gradient reduction overlaps with the backward of the last micro-batch; only
  the part longer than that backward is exposed. ZeRO-3's parameter all-gathers overlap with the
  micro-batch's forward and backward compute (prefetch); the excess is exposed;
- the optimizer step and offload transfers are not overlapped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from planner.hardware.cluster import Cluster
from planner.schema.mesh import Mesh
from planner.trace.blocks import Block
from planner.training import Training, num_microbatches


@dataclass(frozen=True)
class BlockOption:
    """One way to run one block on one device, for one micro-batch of a given size."""

    variant: str
    recompute: str
    offload: str
    fwd_s: float  # forward compute + forward TP collectives
    bwd_s: float  # backward compute (+ recompute) + backward TP collectives
    tp_comm_s: float  # the TP collectives inside fwd_s + bwd_s (for the breakdown)
    params: float  # parameters held per device after TP sharding (before ZeRO)
    act_bytes: float  # saved activations per in-flight micro-batch
    recompute_peak_bytes: float  # transient during backward: one block's recomputed activations
    transient_bytes: float  # working memory of the block's largest op
    tp_plan: tuple[tuple[str, str], ...] = ()
    tp_grad_sums: tuple[str, ...] = ()  # see sharding.TPVariant.grad_sums
    tp_local_attributes: tuple[str, ...] = ()  # see sharding.TPVariant.local_attributes
    param_tensors: int = 0  # parameter tensors the block owns (the optimizer steps each)
    product_params: float = 0.0  # of ``params``: products' weights (``product_share``)
    # Expert parallelism: ``expert_params`` is the share of ``params`` that is this device's
    # experts (1/ep of them); ``ep_comm_s`` the token all-to-alls inside fwd_s + bwd_s.
    ep: int = 1
    expert_params: float = 0.0
    ep_comm_s: float = 0.0
    # Channels of each BatchNorm the block normalises with batch statistics: synchronized
    # over the data-parallel replicas, they cost collectives per micro-batch
    # (``batchnorm_sync_time``).
    norm_channels: tuple[int, ...] = ()
    # A sequence-parallel variant inside the sequence-sharded stream (sharding.TPVariant's)
    takes_sequence_shard: bool = False
    leaves_sequence_shard: bool = False

    @property
    def time_s(self) -> float:
        return self.fwd_s + self.bwd_s

    @property
    def zero_params(self) -> float:
        """What ZeRO divides by dp: experts shard over the dp/ep replicas of each expert, so
        ZeRO's share of them is (expert_params * ep) / dp, the same as without EP."""
        return self.params + self.expert_params * (self.ep - 1)

    @property
    def dense_params(self) -> float:
        """Parameters held per device that are not expert-parallel experts."""
        return self.params - self.expert_params

    def comm_params(self, dp: int) -> float:
        """Parameters whose gradients (or ZeRO-3 weights) a dp-wide ring moves, as the
        equivalent count: experts reduce over their dp/ep replicas only, a ring of
        (n - 1)/n per byte with n = dp/ep instead of dp (none when ep = dp)."""
        if self.ep <= 1 or self.expert_params == 0 or dp <= 1:
            return self.params
        n = dp // self.ep
        ratio = ((n - 1) / n) / ((dp - 1) / dp)
        return self.params - self.expert_params + self.expert_params * ratio


@dataclass
class Config:
    """One point of the search space; ``choice[i]`` indexes block i's option list."""

    mesh: Mesh
    micro_batch_size: int
    schedule: str
    virtual_stages: int
    zero_stage: int
    stage_of: list[int]  # block index -> virtual stage (0 .. pp*v - 1), non-decreasing
    choice: list[int]

    @property
    def num_stages(self) -> int:
        return self.mesh.pp * self.virtual_stages


@dataclass
class StageCost:
    index: int
    pp_rank: int
    blocks: list[int]
    compute_s: float  # fwd + bwd (+ recompute) compute per micro-batch
    tp_comm_s: float  # per micro-batch
    p2p_s: float  # per micro-batch
    time_s: float  # total per micro-batch
    fwd_s: float  # forward share of time_s (compute, TP collectives, activation send)
    bwd_s: float  # backward share of time_s (incl. recompute and gradient send); the two add
    # up to time_s, the stage's loss and wrapper copies split between them (forward_backward_split)
    dp_comm_s: float  # per step, total
    dp_exposed_s: float
    optimizer_s: float
    offload_s: float
    inflight: int  # micro-batches (interleaved: chunk-micro-batches) the rank holds at its peak
    held: float = 0.0  # micro-batches' worth of this stage's activations held (chunk_held)
    sync_s: float = 0.0  # per micro-batch, of compute_s: BatchNorm statistics and DP copies
    memory: dict[str, float] = field(default_factory=dict)


@dataclass
class StepCost:
    step_time_s: float
    pipeline_s: float
    bubble_s: float
    dp_exposed_s: float
    optimizer_s: float
    offload_s: float
    stages: list[StageCost]
    rank_memory: list[dict[str, float]]  # per pp rank (sum over its virtual stages)
    peak_memory_bytes: float
    capacity_bytes: float
    model_flops_per_step: float
    mfu: float
    samples_per_s: float
    feasible: bool
    host_bytes_per_gpu: float = 0.0
    sync_s: float = 0.0  # of pipeline_s: the busiest rank's StageCost.sync_s over the step


def deferred_reduce(config: Config, training: Training) -> bool:
    """Whether a ZeRO-2/3 pipeline stage reduces its gradients once per step. torch's
    pipelining runs an FSDP stage's backward without gradient sync and without resharding
    until the last micro-batch (PipelineStage.backward_maybe_with_nosync), then reduce-scatters
    once: with several micro-batches the stage holds its weights unsharded and accumulates
    unsharded gradients all step long, and pays one reduce-scatter, not one per micro-batch."""
    m = num_microbatches(training, config.mesh.dp, config.micro_batch_size)
    return config.mesh.pp > 1 and config.zero_stage >= 2 and m > 1


def grads_held(config: Config, training: Training) -> bool:
    """Whether gradients occupy memory while activations peak: always with persistent buffers;
    with torch's lazily allocated ones only when earlier micro-batches accumulated into them
    (the first micro-batch's loss backward, where a single micro-batch peaks, comes before any
    gradient exists)."""
    m = num_microbatches(training, config.mesh.dp, config.micro_batch_size)
    return training.persistent_grad_buffers or m > 1


@dataclass
class CostInputs:
    """What every configuration of one (micro-batch, TP degree) is priced from."""

    blocks: list[Block]
    options: list[list[BlockOption]]  # per block
    traced_mbs: int
    cluster: Cluster
    training: Training
    memory_fraction: float = 1.0
    # sums every candidate sharing these options asks for (the search's bounds), kept here
    memo: dict = field(default_factory=dict, repr=False, compare=False)

    @cached_property
    def boundary_bytes(self) -> float:
        """Activation bytes crossing a pipeline cut, per traced micro-batch (the largest cut:
        transformer cuts are all equal; elsewhere this is the conservative choice). Kept: every
        stage of every candidate asks for it, and the blocks do not change."""
        return float(max((b.boundary_bytes for b in self.blocks[:-1]), default=0))

    @cached_property
    def tied(self) -> list[TiedCopy]:
        """Weights a block owns that a later block reads too (``tied_copies``)."""
        return tied_copies(self.blocks)

    @property
    def loss_bytes(self) -> float:
        """The loss's peak memory on the last stage, per traced sample-set, unsharded: three
        fp32 copies of the logits. Cross-entropy over the upcast logits saves log-softmax's
        output for backward; backward then holds that output, the dense gradient
        nll_loss's backward hands it, and the gradient log-softmax's backward writes, all at
        once (torch's tools/autograd/derivatives.yaml: ``_log_softmax`` backward is
        ``_log_softmax_backward_data(grad, result, ...)``, a new tensor)."""
        last = self.blocks[-1]
        dtype_bytes = 2 if self.training.mixed else 4
        return 3 * 4 * last.output_bytes / dtype_bytes


def sample_share(config: Config) -> float:
    """Samples' worth of activations one rank holds per micro-batch: a context-parallel rank
    holds 1/cp of each sample's sequence."""
    return config.micro_batch_size / config.mesh.cp


@dataclass(frozen=True)
class TiedCopy:
    """A parameter one block owns and a later block also reads (an output projection that is
    the token embedding)."""

    name: str
    numel: int
    owner: int  # block index
    user: int

    def spans_model(self, blocks: int) -> bool:
        """Owned by the first block and read by the last: with a pipeline they are always on
        the first and the last pipeline rank."""
        return self.owner == 0 and self.user == blocks - 1


def tied_copies(blocks: list[Block]) -> list[TiedCopy]:
    owner = {name: b.index for b in blocks for name in b.param_names}
    return [
        TiedCopy(name, numel, owner.get(name, 0), b.index)
        for b in blocks
        for name, numel in b.tied.items()
    ]


def last_rank(config: Config) -> int:
    """The pipeline rank holding the last (virtual) stage: the loss's and the head's."""
    return (config.num_stages - 1) % config.mesh.pp


def loss_shards(training: Training, config: Config) -> int:
    """How many ranks the loss's logits are split over: the TP degree under a vocab-parallel
    loss (``Training.vocab_parallel_loss``), else one (every rank holds them all)."""
    return config.mesh.tp if training.vocab_parallel_loss else 1
