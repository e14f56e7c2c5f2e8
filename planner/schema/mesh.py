"""The device mesh's dimensions, and the one place that says which global rank sits where."""

from __future__ import annotations

from dataclasses import dataclass, field

# Written only when set (planner.schema.plan reads the key): a plan whose stages all share one
# TP degree keeps the file it had before per-stage degrees existed.
OMIT_NONE = "omit_none"


@dataclass(frozen=True)
class Mesh:
    """pp x dp x cp x tp ranks, rank = ((pp_i * dp + dp_i) * cp + cp_i) * tp + tp_i: the
    row-major order of ``init_device_mesh(device, (pp, dp, cp, tp))``, TP innermost (inside a
    node), then CP, DP, PP.

    ``dp`` splits the batch; ``cp`` (context parallel) splits each sample's sequence, so the
    dp * cp ``replicas`` of the weights are what gradients reduce over and ZeRO shards over.
    ``ep`` (expert parallel) divides dp: each run of ep consecutive dp ranks holds one copy of
    every expert, 1/ep of them each (ep shares devices with dp).

    ``stage_tp`` and ``stage_dp`` (a heterogeneous pipeline's): each pipeline rank's own TP
    and DP degrees, ``tp`` and ``dp`` then their largest. Pipeline rank i holds the
    dp_i x tp_i ranks after those of ranks < i, in the same order inside (replica, then TP
    rank). Every stage runs the whole batch in micro-batches of one size. Where the stages'
    DP degrees differ, replica r of stage i runs global micro-batches r, r + dp_i, r + 2 dp_i,
    ... of the step's n (round robin, so that a stage's replicas take turns feeding a
    narrower neighbour and run side by side; a contiguous share would make a replica wait
    for the one before it under 1F1B); elsewhere, a plain DP rank's contiguous share."""

    pp: int
    dp: int
    tp: int
    ep: int = 1
    cp: int = 1
    stage_tp: tuple[int, ...] | None = field(default=None, metadata={OMIT_NONE: True})
    stage_dp: tuple[int, ...] | None = field(default=None, metadata={OMIT_NONE: True})

    def __post_init__(self) -> None:
        for name in ("stage_tp", "stage_dp"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def replicas(self) -> int:
        return self.dp * self.cp

    @property
    def round_robin(self) -> bool:
        """Whether replicas take micro-batches in turn (stages differ in DP degree)."""
        return self.stage_dp is not None and len(set(self.stage_dp)) > 1

    @property
    def uneven(self) -> bool:
        """Whether pipeline ranks differ in their TP or DP degree."""
        return any(d is not None and len(set(d)) > 1 for d in (self.stage_tp, self.stage_dp))

    def tp_of(self, pp_i: int) -> int:
        """The TP degree of pipeline rank ``pp_i``."""
        return self.tp if self.stage_tp is None else self.stage_tp[pp_i]

    def dp_of(self, pp_i: int) -> int:
        """The DP degree of pipeline rank ``pp_i``."""
        return self.dp if self.stage_dp is None else self.stage_dp[pp_i]

    def replicas_of(self, pp_i: int) -> int:
        return self.dp_of(pp_i) * self.cp

    def first_rank(self, pp_i: int) -> int:
        """The global rank where pipeline rank ``pp_i``'s ranks begin."""
        if self.stage_tp is None and self.stage_dp is None:  # every rank alike: no sum needed
            return pp_i * self.dp * self.cp * self.tp
        return sum(self.replicas_of(i) * self.tp_of(i) for i in range(pp_i))

    @property
    def size(self) -> int:
        return self.first_rank(self.pp)

    def rank(self, pp_i: int, replica_i: int, tp_i: int) -> int:
        """``replica_i`` = dp_i * cp + cp_i."""
        return self.first_rank(pp_i) + replica_i * self.tp_of(pp_i) + tp_i

    def coords(self, rank: int) -> tuple[int, int, int, int]:
        """(pp_i, dp_i, cp_i, tp_i) of a global rank: the inverse of ``rank``."""
        pp_i = 0
        while pp_i + 1 < self.pp and self.first_rank(pp_i + 1) <= rank:
            pp_i += 1
        tp = self.tp_of(pp_i)
        local = rank - self.first_rank(pp_i)
        replica_i = local // tp
        return pp_i, replica_i // self.cp, replica_i % self.cp, local % tp

    # The groups below are ``rank`` over one coordinate, written as ranges: ``rank`` is affine
    # in each (replica_i steps by the stage's TP degree, tp_i by 1), and a data-parallel group
    # of Llama-3-405B on 16,384 GPUs holds thousands of ranks that pricing asks for thousands
    # of times (636,000 ``rank`` calls were a tenth of that plan's CPU).

    def tp_group(self, pp_i: int = 0) -> list[int]:
        first = self.first_rank(pp_i)
        return list(range(first, first + self.tp_of(pp_i)))

    def dp_group(self, pp_i: int = 0) -> list[int]:
        """The ranks one weight is replicated on (data and context parallel)."""
        first, tp = self.first_rank(pp_i), self.tp_of(pp_i)
        return list(range(first, first + self.replicas_of(pp_i) * tp, tp))

    def ep_group(self, pp_i: int = 0) -> list[int]:
        first, step = self.first_rank(pp_i), self.cp * self.tp_of(pp_i)
        return list(range(first, first + self.ep * step, step))

    def cp_group(self, pp_i: int = 0) -> list[int]:
        first, tp = self.first_rank(pp_i), self.tp_of(pp_i)
        return list(range(first, first + self.cp * tp, tp))

    def stage_ranks(self, pp_i: int) -> list[int]:
        """Every rank of pipeline rank ``pp_i`` (its replicas x its TP group), in rank order."""
        first = self.first_rank(pp_i)
        return list(range(first, first + self.replicas_of(pp_i) * self.tp_of(pp_i)))

    def neighbours(
        self, rank: int, other: int, micro_batch: int = 0, micro_batches: int = 1
    ) -> tuple[int, list[int]]:
        """The rank of pipeline rank ``other`` that ``rank`` receives global micro-batch
        ``micro_batch`` (of the step's ``micro_batches``) from, and those it sends it to, at
        their boundary. The micro-batch fixes the replica on each side (``round_robin``; else
        the same replica index on both, whatever the micro-batch). Both sides' TP ranks hold
        the same whole boundary tensor, so TP rank u of the receiving side takes it from TP
        rank u mod (the sender's degree): each rank receives one copy, and a sender with more
        receivers than it has TP peers sends several."""
        pp_i, dp_i, cp_i, tp_i = self.coords(rank)
        replica = micro_batch % self.dp_of(other) if self.round_robin else dp_i * self.cp + cp_i
        mine, theirs = self.tp_of(pp_i), self.tp_of(other)
        sends = [self.rank(other, replica, u) for u in range(theirs) if u % mine == tp_i]
        return self.rank(other, replica, tp_i % theirs), sends

    def local_micro_batch(self, rank: int, k: int, micro_batches: int) -> int:
        """The global index of the ``k``-th micro-batch ``rank`` runs of the step's
        ``micro_batches``: round robin over its stage's replicas, or its replica's contiguous
        share."""
        pp_i, dp_i, _, _ = self.coords(rank)
        if self.round_robin:
            return k * self.dp_of(pp_i) + dp_i
        return dp_i * (micro_batches // self.dp_of(pp_i)) + k

    @property
    def tp_label(self) -> str:
        """The TP degree as printed: "2" or, stage by stage, "1/2"."""
        return _label(self.stage_tp, self.tp)

    @property
    def dp_label(self) -> str:
        """The DP degree as printed: "4" or, stage by stage, "4/2"."""
        return _label(self.stage_dp, self.dp)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "pp": self.pp,
            "dp": self.dp,
            "tp": self.tp,
            "ep": self.ep,
            "cp": self.cp,
        }
        for name in ("stage_tp", "stage_dp"):
            if getattr(self, name) is not None:
                out[name] = list(getattr(self, name))
        return out


def _label(by_stage: tuple[int, ...] | None, whole: int) -> str:
    if by_stage is None or len(set(by_stage)) == 1:
        return str(whole)
    return "/".join(map(str, by_stage))
