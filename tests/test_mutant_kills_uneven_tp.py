"""Tests written for mutmut's generated mutants of runtime/uneven_tp.py (pipeline stages whose
neighbours run another TP or DP degree; benchmarks/generated_mutants.py). One process: the
stage's routing on each rank of a heterogeneous mesh, against the peers worked out by hand
from the mesh's layout (below), with torch's own ops (the buffers a stage posts) stood in by
two tensors per message; the stage meshes with DeviceMesh stood in by a recorder (a real one
over ranks this process lacks needs them all). tests/test_stage_tp.py trains such a plan on
gloo ranks; docs/mutation.md names the mutants each test kills.

The mesh: pp 2; stage 0 TP 2 x DP 1 (ranks 0, 1), stage 1 TP 1 x DP 2 (ranks 2, 3), 4
micro-batches a step. Stage 1's replicas take global micro-batches in turn (replica 0: 0, 2;
replica 1: 1, 3). Stage 0's TP rank 0 sends micro-batch g forward to replica g mod 2 (rank 2
or 3) and takes its gradient back from there; its TP rank 1 sends nothing (the one TP rank of
stage 1 takes its copy from TP rank 0) and receives the gradient from rank 2 or 3 as well;
stage 1's ranks receive from rank 0 and send their gradients to both TP ranks, 0 and 1."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.pipelining.stage import _PipelineStage

from planner.schema.mesh import Mesh
from runtime import uneven_tp
from runtime.uneven_tp import UnevenStage, stage_meshes, uneven_stage

pytestmark = pytest.mark.usefixtures("gloo_one_rank")  # conftest: a one-rank gloo group

MESH = Mesh(pp=2, dp=2, tp=2, stage_tp=(2, 1), stage_dp=(1, 2))
N = 4

# rank -> (stage index, chunk -> forward receive peer, forward send peers, backward receive
# peer, backward send peers); None where the stage has no such message
WANT = {
    0: (0, {k: (None, [2 + k % 2], 2 + k % 2, None) for k in range(4)}),
    1: (0, {k: (None, [], 2 + k % 2, None) for k in range(4)}),
    2: (1, {k: (0, None, None, [0, 1]) for k in range(2)}),
    3: (1, {k: (0, None, None, [0, 1]) for k in range(2)}),
}


def _stand_in_ops(monkeypatch, stage_index: int) -> None:
    """torch's ops: two tensors a message, with a peer the stage must replace (99); none where
    the stage has no such neighbour (the first stage receives nothing forward)."""

    def ops(kind, present):  # noqa: ANN001, ANN202
        def made(self, chunk):  # noqa: ANN001, ANN202
            if not present(self):
                return []
            # torch's buffers are the chunk's own: sizes k + 1 and k + 2 tell them apart
            return [dist.P2POp(kind, torch.zeros(chunk + 1), 99),
                    dist.P2POp(kind, torch.zeros(chunk + 2), 99)]  # fmt: skip

        return made

    first = lambda s: not s.is_first  # noqa: E731
    last = lambda s: not s.is_last  # noqa: E731
    monkeypatch.setattr(_PipelineStage, "get_fwd_recv_ops", ops(dist.irecv, first))
    monkeypatch.setattr(_PipelineStage, "get_bwd_send_ops", ops(dist.isend, first))
    monkeypatch.setattr(_PipelineStage, "get_fwd_send_ops", ops(dist.isend, last))
    monkeypatch.setattr(_PipelineStage, "get_bwd_recv_ops", ops(dist.irecv, last))


def _stage(rank: int, stage_index: int, mesh: Mesh = MESH, device: str = "cpu") -> UnevenStage:
    stage = _PipelineStage.__new__(_PipelineStage)
    stage.stage_index, stage.num_stages, stage.device = stage_index, 2, torch.device(device)
    stage = uneven_stage(stage, mesh, N)
    stage.route(mesh, rank, N)
    return stage


def _messages(ops: list) -> list[tuple[object, int, int]]:
    """(irecv or isend, tensor size, peer) of each op."""
    return [(op.op, op.tensor.numel(), op.peer) for op in ops]


@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_each_message_goes_to_the_neighbour_that_holds_its_micro_batch(monkeypatch, rank):
    stage_index, chunks = WANT[rank]
    _stand_in_ops(monkeypatch, stage_index)
    stage = _stage(rank, stage_index)
    for k, (fwd_from, fwd_to, bwd_from, bwd_to) in chunks.items():
        sizes = (k + 1, k + 2)
        recv = [] if fwd_from is None else [(dist.irecv, n, fwd_from) for n in sizes]
        assert _messages(stage.get_fwd_recv_ops(k)) == recv
        sends = [(dist.isend, n, p) for n in sizes for p in (fwd_to or [])]
        assert _messages(stage.get_fwd_send_ops(k)) == sends
        recv = [] if bwd_from is None else [(dist.irecv, n, bwd_from) for n in sizes]
        assert _messages(stage.get_bwd_recv_ops(k)) == recv
        sends = [(dist.isend, n, p) for n in sizes for p in (bwd_to or [])]
        assert _messages(stage.get_bwd_send_ops(k)) == sends


@pytest.mark.parametrize(
    "rank, want",
    [
        # every micro-batch's gradient from 2 or 3, forward sends to 2 and 3
        (0, [(dist.irecv, 2), (dist.irecv, 3), (dist.isend, 2), (dist.isend, 3)]),
        (1, [(dist.irecv, 2), (dist.irecv, 3)]),  # nothing sent forward
        (2, [(dist.irecv, 0), (dist.isend, 0), (dist.isend, 1)]),
        (3, [(dist.irecv, 0), (dist.isend, 0), (dist.isend, 1)]),
    ],
)
def test_a_first_message_opens_every_link_the_schedule_will_use(monkeypatch, rank, want):
    """One-element zeros on the stage's device (the meta device here: a GPU's in a run),
    receives then sends, each peer once."""
    stage = _stage(rank, WANT[rank][0], device="meta")
    ops = stage._get_init_p2p_neighbors_ops()
    assert [(op.op, op.peer) for op in ops] == want
    assert all(op.tensor.device.type == "meta" and op.tensor.shape == (1,) for op in ops)


def test_routing_reads_this_ranks_global_rank():
    """``uneven_stage`` routes by the process's rank (0 here) and the step's micro-batches."""
    stage = _PipelineStage.__new__(_PipelineStage)
    stage.stage_index, stage.num_stages = 0, 2
    routed = uneven_stage(stage, MESH, 8)
    assert routed is stage and type(stage) is UnevenStage
    assert (stage._mesh, stage._rank, stage._n) == (MESH, 0, 8)


def test_each_stage_mesh_is_its_own_ranks_by_replica_and_tp_rank(monkeypatch):
    """Stage 0: [[[0, 1]]] (one replica of TP 2); stage 1: [[[2], [3]]] (two replicas of
    TP 1), each named (pp, dp, tp); on a one-rank group the real DeviceMesh of pp 1."""
    made = []

    def device_mesh(device_type, ranks, mesh_dim_names):  # noqa: ANN001, ANN202
        made.append((device_type, ranks.tolist(), mesh_dim_names))
        return len(made)

    with monkeypatch.context() as patch:
        patch.setattr(uneven_tp, "DeviceMesh", device_mesh)
        assert stage_meshes("cpu", MESH) == [1, 2]
    names = ("pp", "dp", "tp")
    assert made == [("cpu", [[[0, 1]]], names), ("cpu", [[[2], [3]]], names)]
    (one,) = stage_meshes("cpu", Mesh(pp=1, dp=1, tp=1))
    assert one.mesh.tolist() == [[[0]]] and one.mesh_dim_names == names


def test_a_replica_of_an_even_dp_mesh_takes_its_contiguous_share(monkeypatch):
    """pp 2 of TP 1 and TP 2, DP 2 on both (no round robin): replica 1 runs micro-batches 2
    and 3 of 4, all with its own replica on the other side: rank 1 (stage 0, replica 1)
    sends to stage 1's replica 1, ranks 4 and 5 (TP 1 takes from TP 0 mod 1)."""
    mesh = Mesh(pp=2, dp=2, tp=2, stage_tp=(1, 2))
    _stand_in_ops(monkeypatch, 0)
    stage = _stage(1, 0, mesh)
    assert [stage._peers(k, 1) for k in range(2)] == [(4, [4, 5])] * 2
    assert _messages(stage.get_fwd_send_ops(1)) == [
        (dist.isend, 2, 4), (dist.isend, 2, 5), (dist.isend, 3, 4), (dist.isend, 3, 5)
    ]  # fmt: skip
