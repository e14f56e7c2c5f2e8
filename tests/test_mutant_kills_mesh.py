"""Tests written for mutmut's generated mutants of planner/schema/mesh.py (benchmarks/
generated_mutants.py). Each mesh's ranks are laid out here by brute force, stage after stage,
(replica, then context rank, then TP rank) row-major inside a stage, as the Mesh docstring
states; every method is compared with what that table says, on meshes with context
parallelism, expert parallelism and stages of different TP and DP degrees. docs/mutation.md
names the mutants each test kills."""

from __future__ import annotations

import pytest

from planner.schema.mesh import Mesh

MESHES = {
    "uniform": Mesh(3, 2, 2),
    "cp2": Mesh(2, 2, 2, cp=2),
    "ep2-cp2": Mesh(2, 4, 2, ep=2, cp=2),
    "ep2-cp3": Mesh(1, 2, 3, ep=2, cp=3),
    "tp-by-stage-cp2": Mesh(2, 2, 2, cp=2, stage_tp=(1, 2)),
    "tp-dp-by-stage": Mesh(3, 2, 2, stage_tp=(1, 2, 2), stage_dp=(2, 1, 2)),
    "dp-by-stage": Mesh(2, 3, 2, stage_dp=(3, 1)),
    "listed-alike": Mesh(3, 2, 4, ep=2, stage_tp=(4, 4, 4), stage_dp=(2, 2, 2)),
}


def _table(mesh: Mesh) -> list[tuple[int, int, int, int]]:
    """(pp_i, dp_i, cp_i, tp_i) of each global rank, in rank order."""
    stage_tp = mesh.stage_tp or (mesh.tp,) * mesh.pp
    stage_dp = mesh.stage_dp or (mesh.dp,) * mesh.pp
    return [
        (i, d, c, t)
        for i in range(mesh.pp)
        for d in range(stage_dp[i])
        for c in range(mesh.cp)
        for t in range(stage_tp[i])
    ]


def _where(mesh: Mesh, **fixed: int) -> list[int]:
    """The ranks whose coordinates match ``fixed`` (names pp, dp, cp, tp), in rank order."""
    index = {"pp": 0, "dp": 1, "cp": 2, "tp": 3}
    return [
        r for r, co in enumerate(_table(mesh)) if all(co[index[k]] == v for k, v in fixed.items())
    ]


@pytest.mark.parametrize("mesh", MESHES.values(), ids=MESHES.keys())
def test_every_rank_sits_where_the_brute_force_layout_puts_it(mesh):
    table = _table(mesh)
    assert mesh.size == len(table)
    for r, (i, d, c, t) in enumerate(table):
        assert mesh.coords(r) == (i, d, c, t)
        assert mesh.rank(i, d * mesh.cp + c, t) == r
    for i in range(mesh.pp):
        tp = (mesh.stage_tp or (mesh.tp,) * mesh.pp)[i]
        dp = (mesh.stage_dp or (mesh.dp,) * mesh.pp)[i]
        assert (mesh.tp_of(i), mesh.dp_of(i), mesh.replicas_of(i)) == (tp, dp, dp * mesh.cp)
        assert mesh.first_rank(i) == _where(mesh, pp=i)[0]
        assert mesh.stage_ranks(i) == _where(mesh, pp=i)
    assert mesh.first_rank(mesh.pp) == len(table)
    assert mesh.replicas == mesh.dp * mesh.cp


@pytest.mark.parametrize("mesh", MESHES.values(), ids=MESHES.keys())
def test_each_group_holds_the_ranks_that_differ_in_its_coordinate_only(mesh):
    for i in range(mesh.pp):
        assert mesh.tp_group(i) == _where(mesh, pp=i, dp=0, cp=0)
        assert mesh.cp_group(i) == _where(mesh, pp=i, dp=0, tp=0)
        assert mesh.dp_group(i) == _where(mesh, pp=i, tp=0)  # every replica: dp x cp
        ep = [r for r in _where(mesh, pp=i, cp=0, tp=0) if mesh.coords(r)[1] < mesh.ep]
        assert mesh.ep_group(i) == ep
    # the default pipeline rank is the first
    assert mesh.tp_group() == mesh.tp_group(0) and mesh.dp_group() == mesh.dp_group(0)
    assert mesh.ep_group() == mesh.ep_group(0) and mesh.cp_group() == mesh.cp_group(0)


def test_the_uniform_ranks_of_a_later_stage_start_after_every_earlier_rank():
    """The uniform mesh's shortcut (no sum over stages) with every degree above 1."""
    mesh = Mesh(3, 2, 5, ep=2, cp=3)
    assert [mesh.first_rank(i) for i in range(4)] == [0, 30, 60, 90]
    assert mesh.coords(89) == (2, 1, 2, 4) and mesh.coords(30) == (1, 0, 0, 0)


@pytest.mark.parametrize("mesh", MESHES.values(), ids=MESHES.keys())
def test_a_boundary_rank_talks_to_its_replica_and_tp_rank_modulo_the_senders_degree(mesh):
    """Without round robin the neighbour is the rank of the same replica (dp_i, cp_i) whose
    TP rank is this one's modulo the neighbour's degree (a receiver), and the ranks sent to are
    the neighbour's of that replica whose TP rank is this one's modulo this stage's degree."""
    if mesh.round_robin:
        return
    for r, (i, d, c, t) in enumerate(_table(mesh)):
        for other in (i - 1, i + 1):
            if not 0 <= other < mesh.pp:
                continue
            mine, theirs = mesh.tp_of(i), mesh.tp_of(other)
            (source,) = _where(mesh, pp=other, dp=d, cp=c, tp=t % theirs)
            sends = [s for s in _where(mesh, pp=other, dp=d, cp=c) if mesh.coords(s)[3] % mine == t]
            for g in (0, 3):
                assert mesh.neighbours(r, other, g, 4) == (source, sends)
    # the micro-batch's defaults: the first of one
    assert mesh.neighbours(0, 1) == mesh.neighbours(0, 1, 0, 1)


def test_round_robin_replicas_take_micro_batches_in_turn():
    """Stages of DP 2, 1, 2 (TP 1, 2, 2): replica r of a stage of DP 2 runs micro-batches r,
    r + 2, ...; global micro-batch g goes to replica g mod 2 of a DP-2 neighbour, and to the
    one replica of the DP-1 stage."""
    mesh = MESHES["tp-dp-by-stage"]
    assert mesh.round_robin and mesh.uneven
    # ranks: stage 0: 0 (replica 0), 1 (replica 1); stage 1: 2, 3 (TP 0, 1);
    # stage 2: 4, 5 (replica 0, TP 0, 1), 6, 7 (replica 1)
    assert [mesh.local_micro_batch(1, k, 8) for k in range(4)] == [1, 3, 5, 7]
    assert [mesh.local_micro_batch(0, k, 8) for k in range(4)] == [0, 2, 4, 6]
    assert [mesh.local_micro_batch(3, k, 8) for k in range(8)] == list(range(8))
    assert [mesh.local_micro_batch(7, k, 8) for k in range(4)] == [1, 3, 5, 7]
    # stage 0 (TP 1) sends micro-batch 5 from its replica 1 to both TP ranks of stage 1
    assert mesh.neighbours(1, 1, 5, 8) == (2, [2, 3])
    # stage 1's TP ranks both receive micro-batch 5's gradient from stage 0's replica 1; only
    # TP rank 0 sends it (stage 0 has one TP rank)
    assert mesh.neighbours(3, 0, 5, 8) == (1, [])
    assert mesh.neighbours(2, 0, 5, 8) == (1, [1])
    # stage 1's TP rank 1 sends micro-batch 5 to replica 1 of stage 2, TP rank 1 only
    assert mesh.neighbours(3, 2, 5, 8) == (7, [7])
    assert mesh.neighbours(3, 2, 4, 8) == (5, [5])
    assert mesh.neighbours(4, 1, 4, 8) == (2, [2])


@pytest.mark.parametrize("mesh", MESHES.values(), ids=MESHES.keys())
def test_a_replica_without_turns_runs_its_contiguous_share(mesh):
    if mesh.round_robin:
        return
    n = 12
    for r, (i, d, _, _) in enumerate(_table(mesh)):
        share = n // mesh.dp_of(i)
        runs = [mesh.local_micro_batch(r, k, n) for k in range(share)]
        assert runs == list(range(d * share, (d + 1) * share))


def test_stage_degrees_are_kept_as_tuples_and_labelled_stage_by_stage():
    mesh = Mesh(2, 2, 2, stage_tp=[1, 2], stage_dp=[2, 1])
    assert mesh.stage_tp == (1, 2) and mesh.stage_dp == (2, 1)
    assert hash(mesh) == hash(Mesh(2, 2, 2, stage_tp=(1, 2), stage_dp=(2, 1)))
    assert (mesh.tp_label, mesh.dp_label) == ("1/2", "2/1")
    assert mesh.uneven and mesh.round_robin
    only_tp = Mesh(2, 2, 2, stage_tp=[1, 2])
    assert only_tp.stage_tp == (1, 2) and only_tp.stage_dp is None
    assert (only_tp.tp_label, only_tp.dp_label) == ("1/2", "2")
    assert only_tp.uneven and not only_tp.round_robin
    only_dp = Mesh(2, 3, 2, stage_dp=[3, 1])
    assert only_dp.stage_dp == (3, 1) and only_dp.stage_tp is None
    assert (only_dp.tp_label, only_dp.dp_label) == ("2", "3/1")
    assert only_dp.uneven and only_dp.round_robin
    alike = MESHES["listed-alike"]
    assert (alike.tp_label, alike.dp_label) == ("4", "2")
    assert not alike.uneven and not alike.round_robin
    plain = Mesh(2, 3, 4)
    assert (plain.tp_label, plain.dp_label) == ("4", "3")
    assert not plain.uneven and not plain.round_robin
    # differing TP degrees alone make no turns; equal DP listed with differing TP neither
    assert not Mesh(2, 2, 2, stage_tp=(1, 2), stage_dp=(2, 2)).round_robin
    assert Mesh(2, 2, 2, stage_tp=(2, 2), stage_dp=(2, 1)).uneven


def test_the_plan_file_holds_every_degree_and_the_stage_lists_only_when_set():
    assert Mesh(2, 4, 2, ep=2, cp=3).to_dict() == {"pp": 2, "dp": 4, "tp": 2, "ep": 2, "cp": 3}
    listed = Mesh(2, 2, 2, stage_tp=(1, 2), stage_dp=(2, 1)).to_dict()
    assert listed == {
        "pp": 2, "dp": 2, "tp": 2, "ep": 1, "cp": 1, "stage_tp": [1, 2], "stage_dp": [2, 1],
    }  # fmt: skip
    assert isinstance(listed["stage_tp"], list) and isinstance(listed["stage_dp"], list)
    assert Mesh(2, 3, 2, stage_dp=(3, 1)).to_dict() == {
        "pp": 2, "dp": 3, "tp": 2, "ep": 1, "cp": 1, "stage_dp": [3, 1],
    }  # fmt: skip


def test_a_micro_batch_index_is_an_int():
    """The runtime indexes the step's micro-batches with it: a float (``/`` for ``//``) is
    no index, though it equals one."""
    for mesh in MESHES.values():
        for r in range(mesh.size):
            dp = mesh.dp_of(mesh.coords(r)[0])
            assert all(type(mesh.local_micro_batch(r, k, 4 * dp)) is int for k in range(4))


def test_the_default_micro_batch_is_the_first():
    """Round robin: micro-batch 0 goes to replica 0 of a DP-2 neighbour (rank 4), micro-batch
    1 to replica 1 (rank 6)."""
    mesh = MESHES["tp-dp-by-stage"]
    assert mesh.neighbours(2, 2) == (4, [4])
    assert mesh.neighbours(2, 2, 1, 8) == (6, [6])
