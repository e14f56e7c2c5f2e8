"""Pipeline stages whose neighbours run another TP or DP degree (a heterogeneous plan's).

torch's pipeline stage talks to one peer rank per neighbouring stage, found through one process
group that holds a rank of every stage: it assumes each stage has as many ranks as the next.
With ``plan.mesh.stage_tp`` / ``stage_dp``, stage i has dp_i x tp_i ranks, so there is no such
group. Each stage here keeps torch's schedule, buffers, loss and data-parallel handling and
changes only who its point-to-point messages go to (``Mesh.neighbours``): the boundary tensors
are whole on every TP rank (a TP block's output is replicated, and so is its input's gradient),
so a rank receives its one copy from one TP rank of the neighbour and sends a copy to every
rank that takes one from it; and where the DP degrees differ, each micro-batch goes to the
neighbour's replica whose slice holds it. The stage is built with a one-rank group (torch's own
check wants a group no larger than the pipeline); the messages name global ranks in the default
group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining.stage import _PipelineStage

from planner.schema.mesh import Mesh


def stage_meshes(device_type: str, mesh: Mesh) -> list[DeviceMesh]:
    """A (pp 1, dp_i, tp_i) DeviceMesh per pipeline rank i, over its own ranks. Collective:
    every rank builds every stage's mesh, in stage order (process groups are made by all)."""
    out = []
    for i in range(mesh.pp):
        ranks = torch.tensor(mesh.stage_ranks(i)).reshape(1, mesh.dp_of(i), mesh.tp_of(i))
        out.append(DeviceMesh(device_type, ranks, mesh_dim_names=("pp", "dp", "tp")))
    return out


class UnevenStage(_PipelineStage):
    """A traced pipeline stage whose messages go to ``Mesh.neighbours``' ranks."""

    def route(self, mesh: Mesh, rank: int, micro_batches: int) -> None:
        """``micro_batches``: the step's, over all replicas (global batch / micro-batch)."""
        self._mesh, self._rank, self._n = mesh, rank, micro_batches

    def _peers(self, chunk: int, side: int) -> tuple[int, list[int]]:
        """(the rank this one receives chunk ``chunk`` from, those it sends it to) on the
        previous (side -1) or next (+1) stage."""
        g = self._mesh.local_micro_batch(self._rank, chunk, self._n)
        return self._mesh.neighbours(self._rank, self.stage_index + side, g, self._n)

    @staticmethod
    def _receive(ops: list[dist.P2POp], peer: int) -> list[dist.P2POp]:
        return [dist.P2POp(dist.irecv, op.tensor, peer) for op in ops]

    @staticmethod
    def _send(ops: list[dist.P2POp], peers: list[int]) -> list[dist.P2POp]:
        return [dist.P2POp(dist.isend, op.tensor, peer) for op in ops for peer in peers]

    def get_fwd_recv_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
        ops = super().get_fwd_recv_ops(fwd_chunk_id)
        return self._receive(ops, self._peers(fwd_chunk_id, -1)[0]) if ops else []

    def get_bwd_recv_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
        ops = super().get_bwd_recv_ops(bwd_chunk_id)
        return self._receive(ops, self._peers(bwd_chunk_id, 1)[0]) if ops else []

    def get_fwd_send_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
        ops = super().get_fwd_send_ops(fwd_chunk_id)
        return self._send(ops, self._peers(fwd_chunk_id, 1)[1]) if ops else []

    def get_bwd_send_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
        ops = super().get_bwd_send_ops(bwd_chunk_id)
        return self._send(ops, self._peers(bwd_chunk_id, -1)[1]) if ops else []

    def _get_init_p2p_neighbors_ops(self) -> list[dist.P2POp]:
        """A first message each way along every link the schedule will use (NCCL builds a
        link's communicator on its first message, and both ends must be in it)."""
        chunks = range(self._n // self._mesh.dp_of(self.stage_index))
        ops: list[dist.P2POp] = []
        for side, present in ((-1, not self.is_first), (1, not self.is_last)):
            if not present:
                continue
            sources = sorted({self._peers(k, side)[0] for k in chunks})
            sinks = sorted({r for k in chunks for r in self._peers(k, side)[1]})
            for peer in sources:
                ops.append(dist.P2POp(dist.irecv, torch.zeros(1, device=self.device), peer))
            for peer in sinks:
                ops.append(dist.P2POp(dist.isend, torch.zeros(1, device=self.device), peer))
        return ops


def uneven_stage(stage: _PipelineStage, mesh: Mesh, micro_batches: int) -> UnevenStage:
    """``stage`` (from ``Pipe.build_stage``) routed by ``mesh``'s per-stage degrees."""
    stage.__class__ = UnevenStage
    assert isinstance(stage, UnevenStage)
    stage.route(mesh, dist.get_rank(), micro_batches)
    return stage
