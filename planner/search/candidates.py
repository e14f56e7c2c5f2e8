"""The outer search space: what the user pinned (Pins), one candidate (mesh, micro-batch,
schedule, ZeRO stage, expert and context parallel degrees), and their enumeration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.cost.records import Config, StepCost
from planner.errors import UserInputError
from planner.schema.mesh import Mesh
from planner.trace.blocks import Block
from planner.training import Training
from planner.vocab import Offload, Schedule

# Chunks per rank the search tries for an interleaved schedule; a pinned --virtual-stages is
# tried whatever its value. 8 reaches one-layer chunks of a 126-layer model on 16 stages,
# Llama 3 405B's layout, whose bubble (p - 1) / (v m) halves from v = 4.
INTERLEAVE = (2, 4, 8)


@dataclass
class Pins:
    """What the user fixed; None / "auto" leaves it to the solver."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    ep: int | None = None
    cp: int | None = None
    zero: int | None = None
    micro_batch_size: int | None = None
    schedule: str | None = None
    virtual_stages: int | None = None
    recompute: str = "auto"
    offload: str = "auto"
    memory_fraction: float = 1.0
    tp_variant: str = "auto"  # "sharded": every block that can be TP-sharded is


@dataclass
class Candidate:
    pp: int
    dp: int
    tp: int
    micro_batch_size: int
    schedule: str
    virtual_stages: int
    zero: int
    ep: int = 1
    cp: int = 1
    bound: float = 0.0
    status: str = "pending"  # solved | infeasible | pruned-bound | pruned-memory | dominated
    reason: str = ""
    config: Config | None = None
    cost: StepCost | None = None
    milp_objective: float = math.inf
    solve_time_s: float = 0.0
    min_memory: float = 0.0  # lower bound of peak memory (for infeasibility messages)
    gap: float = 0.0  # (step time - bound) / step time of its solved placement
    nodes: int = 0  # branch-and-bound nodes its MILP solves explored
    proven: bool = False  # its MILP finished (optimal within stage_milp.MIP_REL_GAP)
    # Megatron's sequence-sharded residual stream: the blocks that can pass it run
    # sequence-parallel only (``options.price_options``' ``stream``)
    stream: bool = False

    @property
    def mesh_key(self) -> tuple[int, int, int]:
        return (self.pp, self.dp, self.tp)

    @property
    def key(self) -> tuple[int, int, int, int, bool]:
        """What its block options are priced for: (TP degree, micro-batch, EP and CP degrees,
        whether TP meets a pipeline: tied weights then stay replicated, see
        ``cost.sharding.vocab_parallel_tied``; whether the stream stays sequence-sharded)."""
        return (self.tp, self.micro_batch_size, self.ep, self.cp, self.pipelined_tp, self.stream)

    @property
    def pipelined_tp(self) -> bool:
        return self.pp > 1 and self.tp > 1

    @property
    def mesh(self) -> Mesh:
        return Mesh(self.pp, self.dp, self.tp, self.ep, self.cp)

    def label(self, dp: str | None = None, tp: str | None = None) -> str:
        """The candidate in one line (plan.json's alternatives, the search's progress). ``dp``
        and ``tp``: the degrees' text where a mixed cell's stages range over several."""
        sched = Schedule(self.schedule).tag(self.virtual_stages) if self.pp > 1 else "no pipeline"
        ep = f" ep{self.ep}" if self.ep > 1 else ""
        cp = f" cp{self.cp}" if self.cp > 1 else ""
        sp = " (sequence-sharded stream)" if self.stream else ""
        return (
            f"pp{self.pp} dp{dp or self.dp}{ep}{cp} tp{tp or self.tp}{sp}, "
            f"micro-batch {self.micro_batch_size}, {sched}, ZeRO-{self.zero}"
        )


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def expert_counts(blocks: list[Block]) -> list[int]:
    """The expert count of every mixture-of-experts layer (none for a dense model)."""
    return sorted({b.extra["moe"]["num_experts"] for b in blocks if b.extra.get("moe")})


def ep_degrees(blocks: list[Block], dp: int, pins: Pins) -> list[int]:
    """Expert-parallel degrees for a data-parallel degree: divisors of dp that divide every
    mixture-of-experts layer's expert count (1 alone for a model without experts)."""
    return _ep_of(expert_counts(blocks), dp, pins)


def _ep_of(counts: list[int], dp: int, pins: Pins) -> list[int]:
    """``ep_degrees`` from the expert counts (found once per enumeration, not per layout)."""
    if not counts:
        return [1]
    found = [e for e in divisors(dp) if all(c % e == 0 for c in counts)]
    if pins.ep:
        found = [e for e in found if e == pins.ep]
    return found


def cp_degrees(sequence: int, room: int, pins: Pins) -> list[int]:
    """Context-parallel degrees: divisors of the devices left after TP and PP that split the
    sequence into 2 * cp equal chunks (causal load balancing gives each rank two); 1 alone for
    a model whose attention is not one fused attention op per layer (``sequence`` 0)."""
    found = [c for c in divisors(room) if c == 1 or (sequence and sequence % (2 * c) == 0)]
    if pins.cp:
        found = [c for c in found if c == pins.cp]
    return found


def _cp_dominated(gbs: int, dp: int, cp: int, mbs: int, pins: Pins) -> bool:
    """Whether data parallelism does the same work with no ring: dp * cp replicas of
    micro-batch mbs / cp give each rank the same tokens, the same micro-batch count, the same
    activations and the same gradient reduction, without the key/value ring, so the cost
    model prices that candidate no slower. Then the context-parallel one is left out (unless
    the user pinned what makes the two differ)."""
    if pins.cp or pins.dp or pins.micro_batch_size:
        return False
    return mbs % cp == 0 and gbs % (dp * cp) == 0


def enumerate_candidates(
    gpus: int,
    n_blocks: int,
    training: Training,
    pins: Pins,
    tp_degrees: list[int],
    blocks: list[Block] | None = None,
    sequence: int = 0,
) -> list[Candidate]:
    gbs = training.global_batch_size
    counts = expert_counts(blocks or [])
    moe = bool(counts)
    meshes = [
        (tp, pp, cp)
        for tp in tp_degrees
        for pp in divisors(gpus // tp)
        # experts spread over dp ranks, which context parallelism would regroup
        for cp in ([1] if moe else cp_degrees(sequence, gpus // (tp * pp), pins))
    ]
    out: list[Candidate] = []
    for tp, pp, cp in meshes:
        if (pins.tp and tp != pins.tp) or pp > n_blocks or (pins.pp and pp != pins.pp):
            continue
        dp = gpus // (tp * pp * cp)
        if (pins.dp and dp != pins.dp) or gbs % dp:
            continue
        per_replica = gbs // dp
        for mbs in divisors(per_replica):
            if pins.micro_batch_size and mbs != pins.micro_batch_size:
                continue
            if cp > 1 and _cp_dominated(gbs, dp, cp, mbs, pins):
                continue
            m = per_replica // mbs
            for schedule, v in _schedules(pp, m, n_blocks, pins):
                for zero in _zero_stages(dp * cp, pins):
                    if pins.zero is not None and zero != pins.zero:
                        continue
                    if zero == 1 and (tp > 1 or pp > 1) and pins.zero != 1:
                        continue  # the runtime has no ZeRO-1 for DTensors or pipeline stages
                    for ep in _ep_of(counts, dp, pins):
                        out.append(Candidate(pp, dp, tp, mbs, schedule, v, zero, ep, cp))
    return out


def _zero_stages(replicas: int, pins: Pins) -> tuple[int, ...]:
    """ZeRO stages worth pricing. With one replica nothing is sharded, so only ZeRO-3 differs
    from none: it is FSDP2 on a one-rank mesh, the only way torch keeps weights and optimizer
    states on the host (CPUOffloadPolicy), which a model too big for one device needs."""
    if replicas > 1:
        return (0, 1, 2, 3)
    return (0,) if pins.offload == Offload.NONE and pins.zero != 3 else (0, 3)


def _schedules(pp: int, m: int, n_blocks: int, pins: Pins) -> list[tuple[str, int]]:
    if pp == 1:
        if pins.schedule and pins.schedule != Schedule.ONE_F_ONE_B:
            return [(pins.schedule, 1)] if pins.schedule == Schedule.GPIPE else []
        return [(Schedule.ONE_F_ONE_B, 1)]
    # torch's Schedule1F1B needs at least as many micro-batches as stages; with fewer, 1F1B
    # has no steady state and runs as GPipe does (same time and in-flight activations).
    found = [(Schedule.GPIPE, 1)] + ([(Schedule.ONE_F_ONE_B, 1)] if m >= pp else [])
    for v in (pins.virtual_stages,) if pins.virtual_stages else INTERLEAVE:
        if v > 1 and pp * v <= n_blocks and m % pp == 0:
            found.append((Schedule.INTERLEAVED, v))
    if pins.schedule:
        found = [(s, v) for s, v in found if s == pins.schedule]
    if pins.virtual_stages:
        found = [(s, v) for s, v in found if v == pins.virtual_stages]
    return found


# --------------------------------------------------------------------------- options


def attention_sequence(graph) -> int:
    """The sequence length context parallelism would split: that of the model's fused attention
    ops, when every attention is one (a matrix product of two activations elsewhere would see
    only a chunk of the sequence), else 0."""
    from planner.trace.blocks import cached_core_nodes
    from planner.trace.opcost import ATTENTION_OPS, MATMUL_OPS

    lengths = {
        graph.nodes[n]["shapes"][0][-2]
        for n in graph.nodes
        if graph.nodes[n]["op"] in ATTENTION_OPS and graph.nodes[n].get("shapes")
    }
    if len(lengths) != 1:
        return 0
    if any(graph.nodes[n]["op"] in MATMUL_OPS for n in cached_core_nodes(graph)):
        return 0
    return int(lengths.pop())


def check_ep_pin(blocks: list[Block], pins: Pins) -> None:
    if not pins.ep or pins.ep == 1:
        return
    counts = expert_counts(blocks)
    if not counts:
        raise UserInputError(
            f"--ep {pins.ep}: the model has no mixture-of-experts layer (no module whose "
            "parameters are stacked per expert) to spread: drop --ep"
        )
    if any(c % pins.ep for c in counts):
        raise UserInputError(
            f"--ep {pins.ep} does not divide the expert count ({', '.join(map(str, counts))}): "
            "choose a divisor of it"
        )


def no_candidate_message(
    gpus: int, training: Training, pins: Pins, tps: list[int], blocks: list[Block] | None = None
) -> str:
    if blocks is not None and pins.pp and pins.pp > len(blocks):
        names = ", ".join(b.name for b in blocks[:3]) + (", ..." if len(blocks) > 3 else "")
        return (
            f"--pp {pins.pp} needs {pins.pp} pipeline stages, but the model traced to "
            f"{len(blocks)} block{'s' if len(blocks) != 1 else ''} ({names}): a pipeline cuts "
            "only between blocks, which follow the module tree (each child of a ModuleList or "
            f"Sequential of two or more is one): pin --pp {len(blocks)} or less"
        )
    if pins.tp and pins.tp > 1 and tps == [1]:
        return (
            f"--tp {pins.tp}: no layer of this model can be split by tensor parallelism (none "
            "has a weight that only its own module reads, in dimensions the degree divides; a "
            "weight also read elsewhere, as a tied decoder's transpose, stays whole): drop --tp"
        )
    if pins.tp and pins.tp not in tps:
        return (
            f"--tp {pins.tp} cannot shard this model on {gpus} GPUs: it must divide the GPU "
            f"count and the dimensions it shards; possible degrees: {', '.join(map(str, tps))}"
        )
    if pins.dp and training.global_batch_size % pins.dp:
        return (
            f"the global batch {training.global_batch_size} is not divisible by --dp {pins.dp}: "
            "choose a global batch that is a multiple of the data-parallel degree"
        )
    if pins.ep and pins.ep > 1 and (gpus % pins.ep or (pins.dp and pins.dp % pins.ep)):
        return (
            f"--ep {pins.ep} must divide the data-parallel degree (experts are spread over "
            "data-parallel ranks): pin a --dp that it divides, or a smaller --ep"
        )
    fixed = [(k, v) for k, v in (("pp", pins.pp), ("dp", pins.dp), ("tp", pins.tp)) if v]
    product = math.prod(v for _, v in fixed)
    if gpus % product or (len(fixed) == 3 and product != gpus):
        shown = " x ".join(f"--{k} {v}" for k, v in fixed)
        return f"{shown} = {product} devices, which does not fit --gpus {gpus}: make them agree"
    if pins.virtual_stages and pins.virtual_stages > 1 and blocks is not None and pins.pp:
        if pins.pp * pins.virtual_stages > len(blocks):
            return (
                f"--pp {pins.pp} x --virtual-stages {pins.virtual_stages} needs "
                f"{pins.pp * pins.virtual_stages} chunks of at least one block, but the model "
                f"traced to {len(blocks)} blocks: pin --virtual-stages "
                f"{max(1, len(blocks) // pins.pp)} or less"
            )
    if pins.micro_batch_size and pins.dp:
        per_replica = training.global_batch_size // pins.dp
        if per_replica % pins.micro_batch_size:
            return (
                f"--micro-batch-size {pins.micro_batch_size} does not divide the per-replica "
                f"batch {per_replica} (global {training.global_batch_size} / --dp {pins.dp})"
            )
    return (
        f"no parallel layout of {gpus} GPUs matches the pinned flags and a global batch of "
        f"{training.global_batch_size}: relax --tp/--pp/--dp/--micro-batch-size or change "
        "--global-batch-size"
    )
