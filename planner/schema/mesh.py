"""The device mesh's dimensions, and the one place that says which global rank sits where."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mesh:
    """pp x dp x cp x tp ranks, rank = ((pp_i * dp + dp_i) * cp + cp_i) * tp + tp_i: the
    row-major order of ``init_device_mesh(device, (pp, dp, cp, tp))``, TP innermost (inside a
    node), then CP, DP, PP.

    ``dp`` splits the batch; ``cp`` (context parallel) splits each sample's sequence, so the
    dp * cp ``replicas`` of the weights are what gradients reduce over and ZeRO shards over.
    ``ep`` (expert parallel) divides dp: each run of ep consecutive dp ranks holds one copy of
    every expert, 1/ep of them each (ep shares devices with dp)."""

    pp: int
    dp: int
    tp: int
    ep: int = 1
    cp: int = 1

    @property
    def replicas(self) -> int:
        return self.dp * self.cp

    @property
    def size(self) -> int:
        return self.pp * self.replicas * self.tp

    def rank(self, pp_i: int, replica_i: int, tp_i: int) -> int:
        """``replica_i`` = dp_i * cp + cp_i."""
        return (pp_i * self.replicas + replica_i) * self.tp + tp_i

    def coords(self, rank: int) -> tuple[int, int, int, int]:
        """(pp_i, dp_i, cp_i, tp_i) of a global rank: the inverse of ``rank``."""
        tp_i = rank % self.tp
        replica_i = rank // self.tp % self.replicas
        return rank // (self.tp * self.replicas), replica_i // self.cp, replica_i % self.cp, tp_i

    def tp_group(self, pp_i: int = 0) -> list[int]:
        return [self.rank(pp_i, 0, t) for t in range(self.tp)]

    def dp_group(self, pp_i: int = 0) -> list[int]:
        """The ranks one weight is replicated on (data and context parallel)."""
        return [self.rank(pp_i, d, 0) for d in range(self.replicas)]

    def ep_group(self, pp_i: int = 0) -> list[int]:
        return [self.rank(pp_i, d * self.cp, 0) for d in range(self.ep)]

    def cp_group(self, pp_i: int = 0) -> list[int]:
        return [self.rank(pp_i, c, 0) for c in range(self.cp)]

    def stage_ranks(self, pp_i: int) -> list[int]:
        """Every rank of pipeline rank ``pp_i`` (its replicas x its TP group), in rank order."""
        return [self.rank(pp_i, d, t) for d in range(self.replicas) for t in range(self.tp)]

    def to_dict(self) -> dict[str, int]:
        return {"pp": self.pp, "dp": self.dp, "tp": self.tp, "ep": self.ep, "cp": self.cp}
