"""Pipeline stages whose neighbours run another TP degree (a heterogeneous plan's stages).

torch's pipeline stage talks to one peer rank per neighbouring stage, found through one process
group that holds a rank of every stage: it assumes each stage has as many ranks as the next.
With ``plan.mesh.stage_tp``, stage i has dp x tp_i ranks, so there is no such group. Each stage
here keeps torch's schedule, buffers, loss and data-parallel handling and changes only who its
point-to-point messages go to: the boundary tensors are whole on every TP rank (a TP block's
output is replicated, and so is its input's gradient), so a rank receives its one copy from the
neighbour's TP rank ``Mesh.neighbours`` names and sends a copy to every rank that takes one
from it. The stage is built with a one-rank group (torch's own check wants a group no larger
than the pipeline); the messages name global ranks in the default group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining.stage import _PipelineStage

from planner.schema.mesh import Mesh


def stage_meshes(device_type: str, mesh: Mesh) -> list[DeviceMesh]:
    """A (pp 1, dp, tp_i) DeviceMesh per pipeline rank i, over its own ranks. Collective:
    every rank builds every stage's mesh, in stage order (process groups are made by all)."""
    out = []
    for i in range(mesh.pp):
        ranks = torch.tensor(mesh.stage_ranks(i)).reshape(1, mesh.dp, mesh.tp_of(i))
        out.append(DeviceMesh(device_type, ranks, mesh_dim_names=("pp", "dp", "tp")))
    return out


class UnevenTPStage(_PipelineStage):
    """A traced pipeline stage whose messages go to ``Mesh.neighbours``' ranks."""

    def route(self, mesh: Mesh, rank: int) -> None:
        j, last = self.stage_index, mesh.pp - 1
        self._prev = mesh.neighbours(rank, j - 1) if j > 0 else (None, [])
        self._next = mesh.neighbours(rank, j + 1) if j < last else (None, [])

    @staticmethod
    def _receive(ops: list[dist.P2POp], peer: int | None) -> list[dist.P2POp]:
        return [dist.P2POp(dist.irecv, op.tensor, peer) for op in ops]

    @staticmethod
    def _send(ops: list[dist.P2POp], peers: list[int]) -> list[dist.P2POp]:
        return [dist.P2POp(dist.isend, op.tensor, peer) for op in ops for peer in peers]

    def get_fwd_recv_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
        return self._receive(super().get_fwd_recv_ops(fwd_chunk_id), self._prev[0])

    def get_bwd_recv_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
        return self._receive(super().get_bwd_recv_ops(bwd_chunk_id), self._next[0])

    def get_fwd_send_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
        return self._send(super().get_fwd_send_ops(fwd_chunk_id), self._next[1])

    def get_bwd_send_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
        return self._send(super().get_bwd_send_ops(bwd_chunk_id), self._prev[1])

    def _get_init_p2p_neighbors_ops(self) -> list[dist.P2POp]:
        """A first message each way along every link the schedule will use (NCCL builds a
        link's communicator on its first message, and both ends must be in it)."""

        def box(op) -> dist.P2POp:  # noqa: ANN001
            return dist.P2POp(op, torch.zeros(1, device=self.device), dist.get_rank())

        ops: list[dist.P2POp] = []
        if not self.is_first:
            ops += self._receive([box(dist.irecv)], self._prev[0])
            ops += self._send([box(dist.isend)], self._prev[1])
        if not self.is_last:
            ops += self._send([box(dist.isend)], self._next[1])
            ops += self._receive([box(dist.irecv)], self._next[0])
        return ops


def uneven_stage(stage: _PipelineStage, mesh: Mesh) -> UnevenTPStage:
    """``stage`` (from ``Pipe.build_stage``) routed by ``mesh``'s per-stage TP degrees."""
    stage.__class__ = UnevenTPStage
    assert isinstance(stage, UnevenTPStage)
    stage.route(mesh, dist.get_rank())
    return stage
