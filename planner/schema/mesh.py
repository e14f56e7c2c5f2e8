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

    ``stage_tp`` (a heterogeneous pipeline's): each pipeline rank's own TP degree, ``tp``
    then their largest. Pipeline rank i holds the dp x tp_i ranks after those of ranks < i,
    in the same order inside (replica, then TP rank); the DP degree stays one for all."""

    pp: int
    dp: int
    tp: int
    ep: int = 1
    cp: int = 1
    stage_tp: tuple[int, ...] | None = field(default=None, metadata={OMIT_NONE: True})

    def __post_init__(self) -> None:
        if self.stage_tp is not None:
            object.__setattr__(self, "stage_tp", tuple(self.stage_tp))

    @property
    def replicas(self) -> int:
        return self.dp * self.cp

    @property
    def uneven(self) -> bool:
        """Whether pipeline ranks differ in their TP degree."""
        return self.stage_tp is not None and len(set(self.stage_tp)) > 1

    def tp_of(self, pp_i: int) -> int:
        """The TP degree of pipeline rank ``pp_i``."""
        return self.tp if self.stage_tp is None else self.stage_tp[pp_i]

    def first_rank(self, pp_i: int) -> int:
        """The global rank where pipeline rank ``pp_i``'s ranks begin."""
        return self.replicas * sum(self.tp_of(i) for i in range(pp_i))

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

    def tp_group(self, pp_i: int = 0) -> list[int]:
        return [self.rank(pp_i, 0, t) for t in range(self.tp_of(pp_i))]

    def dp_group(self, pp_i: int = 0) -> list[int]:
        """The ranks one weight is replicated on (data and context parallel)."""
        return [self.rank(pp_i, d, 0) for d in range(self.replicas)]

    def ep_group(self, pp_i: int = 0) -> list[int]:
        return [self.rank(pp_i, d * self.cp, 0) for d in range(self.ep)]

    def cp_group(self, pp_i: int = 0) -> list[int]:
        return [self.rank(pp_i, c, 0) for c in range(self.cp)]

    def stage_ranks(self, pp_i: int) -> list[int]:
        """Every rank of pipeline rank ``pp_i`` (its replicas x its TP group), in rank order."""
        tp = self.tp_of(pp_i)
        return [self.rank(pp_i, d, t) for d in range(self.replicas) for t in range(tp)]

    def neighbours(self, rank: int, other: int) -> tuple[int, list[int]]:
        """The rank of pipeline rank ``other`` that ``rank`` receives from, and those it sends
        to, at their boundary. Both sides' TP ranks hold the same whole boundary tensor, so
        TP rank u of the receiving side takes it from TP rank u mod (the sender's degree):
        each rank receives one copy, and a sender with more receivers than it has TP peers
        sends several (one TP degree per stage is then the identity)."""
        pp_i, dp_i, cp_i, tp_i = self.coords(rank)
        replica = dp_i * self.cp + cp_i
        mine, theirs = self.tp_of(pp_i), self.tp_of(other)
        sends = [self.rank(other, replica, u) for u in range(theirs) if u % mine == tp_i]
        return self.rank(other, replica, tp_i % theirs), sends

    @property
    def tp_label(self) -> str:
        """The TP degree as printed: "2" or, stage by stage, "1/2"."""
        return "/".join(map(str, self.stage_tp)) if self.uneven else str(self.tp)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "pp": self.pp,
            "dp": self.dp,
            "tp": self.tp,
            "ep": self.ep,
            "cp": self.cp,
        }
        if self.stage_tp is not None:
            out["stage_tp"] = list(self.stage_tp)
        return out
