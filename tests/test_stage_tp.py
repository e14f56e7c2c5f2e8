"""A TP degree per pipeline stage (``Mesh.stage_tp``, heterogeneous plans): where each rank
sits, who sends to whom at a boundary between two degrees, the plan file, and torchrun running
such plans like one process.

The plans here are made by hand from two pinned plans of one model (the same split, one at TP 1
and one at TP 2): each stage takes the TP choices of the plan of its degree, so the runtime is
checked apart from the search that chooses such plans (tests/test_mixed_*)."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
from oracle import (
    checkpoint_model_state,
    parameter_mismatches,
    reference_for_plan,
    unmoved_parameters,
)
from runs import forced_plan, launch, losses_of, model_path

from meshplan.cli import main as plan_main
from planner.errors import UserInputError
from planner.schema import dumps, load_plan, plan_from_dict, write_plan
from planner.schema.mesh import Mesh
from planner.training import replica_counts
from runtime.capability import check_runnable


def _meshes() -> list[Mesh]:
    rnd = random.Random(7)
    out = [Mesh(2, 1, 2, stage_tp=(1, 2)), Mesh(3, 2, 4, stage_tp=(1, 4, 2))]
    out.append(Mesh(3, 4, 2, stage_tp=(2, 1, 2), stage_dp=(4, 2, 1)))
    for _ in range(20):
        pp = rnd.randint(2, 5)
        stage_tp = tuple(rnd.choice([1, 2, 4, 8]) for _ in range(pp))
        stage_dp = (
            tuple(rnd.choice([1, 2, 3, 6]) for _ in range(pp)) if rnd.random() < 0.6 else None
        )
        dp = max(stage_dp) if stage_dp else rnd.choice([1, 2, 3])
        out.append(Mesh(pp, dp, max(stage_tp), stage_tp=stage_tp, stage_dp=stage_dp))
    return out


def _label(mesh: Mesh) -> str:
    return f"dp{mesh.dp_label}-tp{mesh.tp_label}"


@pytest.mark.parametrize("mesh", _meshes(), ids=_label)
def test_ranks_are_laid_stage_after_stage(mesh):
    """Stage i holds dp_i x tp_i consecutive ranks, (replica, TP rank) row-major inside;
    coords inverts rank; every rank is in exactly one stage, one TP group and one DP group."""
    seen: list[int] = []
    for i in range(mesh.pp):
        ranks = mesh.stage_ranks(i)
        tp, dp = mesh.tp_of(i), mesh.dp_of(i)
        assert ranks == list(range(len(seen), len(seen) + dp * tp))
        seen += ranks
        for d in range(dp):
            assert [mesh.rank(i, d, t) for t in range(tp)] == ranks[d * tp : (d + 1) * tp]
        assert mesh.tp_group(i) == ranks[:tp]
        assert mesh.dp_group(i) == ranks[::tp]
    widths = [mesh.dp_of(i) * mesh.tp_of(i) for i in range(mesh.pp)]
    assert seen == list(range(mesh.size)) and mesh.size == sum(widths)
    for r in range(mesh.size):
        pp_i, dp_i, cp_i, tp_i = mesh.coords(r)
        assert cp_i == 0 and mesh.rank(pp_i, dp_i, tp_i) == r


def _runs(mesh: Mesh, rank: int, n: int) -> list[int]:
    """The global micro-batches ``rank`` runs, in its order."""
    return [
        mesh.local_micro_batch(rank, k, n) for k in range(n // mesh.dp_of(mesh.coords(rank)[0]))
    ]


@pytest.mark.parametrize("mesh", _meshes(), ids=_label)
def test_every_boundary_message_has_one_sender_and_one_receiver(mesh):
    """Each stage's replicas run the step's micro-batches once between them, each in order
    (in turns where the stages' DP degrees differ, else contiguous shares); and at
    each boundary, for each micro-batch, in each direction, the messages the senders post are
    exactly those the receivers wait for: every rank running it receives it once, from a rank
    of the neighbouring stage that runs it too, whose TP rank agrees with its own modulo the
    sender's degree."""
    n = 12
    for i in range(mesh.pp):
        runs = [_runs(mesh, mesh.rank(i, d, 0), n) for d in range(mesh.dp_of(i))]
        assert sorted(g for run in runs for g in run) == list(range(n))
        assert all(run == sorted(run) for run in runs)
        if not mesh.round_robin:  # a plain DP rank's contiguous share
            assert [g for run in runs for g in run] == list(range(n))
    for i, j in itertools.permutations(range(mesh.pp), 2):
        if abs(i - j) != 1:
            continue
        for g in range(n):
            senders = [r for r in mesh.stage_ranks(i) if g in _runs(mesh, r, n)]
            takers = [r for r in mesh.stage_ranks(j) if g in _runs(mesh, r, n)]
            posted = sorted((r, dst) for r in senders for dst in mesh.neighbours(r, j, g, n)[1])
            awaited = sorted((mesh.neighbours(r, i, g, n)[0], r) for r in takers)
            assert posted == awaited and len(awaited) == len(takers)
            for src, dst in awaited:
                s, d = mesh.coords(src), mesh.coords(dst)
                assert (s[0], d[0]) == (i, j) and src in senders
                assert d[3] % mesh.tp_of(i) == s[3]


def test_one_degree_for_all_is_the_uniform_mesh():
    """Degrees listed but equal everywhere place every rank where the plain mesh does, and a
    boundary rank talks to the rank of its own coordinates only, whatever the micro-batch."""
    plain = Mesh(3, 2, 2)
    listed = Mesh(3, 2, 2, stage_tp=(2, 2, 2), stage_dp=(2, 2, 2))
    assert not listed.uneven and listed.size == plain.size and listed.tp_label == "2"
    for r in range(plain.size):
        assert listed.coords(r) == plain.coords(r)
        p = plain.coords(r)
        for other in (p[0] - 1, p[0] + 1):
            if 0 <= other < 3:
                twin = plain.rank(other, p[1], p[3])
                g = listed.local_micro_batch(r, 1, 8)
                assert listed.neighbours(r, other, g, 8) == (twin, [twin])


# name: (schedule, ZeRO stage, TP by stage, DP by stage); TP 1/2 with DDP under 1F1B, 2/1 with
# FSDP2 under GPipe, DP mixes (2/1: the second stage runs both replicas' micro-batches) under
# GPipe, the one schedule they run (test_uneven_dp_under_1f1b_is_refused)
MIXES = {
    "tp12": ("1f1b", 0, [1, 2], [1, 1]),
    "tp21": ("gpipe", 3, [2, 1], [1, 1]),
    "dp21": ("gpipe", 0, [1, 1], [2, 1]),
    "tp12-dp21": ("gpipe", 0, [1, 2], [2, 1]),
    "dp12": ("gpipe", 3, [1, 1], [1, 2]),
    "tp21-dp12": ("gpipe", 3, [2, 1], [1, 2]),
}


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, Path]:
    """gpt (tiny, 2 layers) cut in two at TP 1 / DP 1, TP 2 and DP 2, and hand-made mixes."""
    tmp = tmp_path_factory.mktemp("stage_tp")
    common = {"pp": 2, "micro_batch_size": 2}
    pinned = {}
    for schedule, zero in {(m[0], m[1]) for m in MIXES.values()}:
        for tp, dp in ((1, 1), (2, 1), (1, 2)):
            out = tmp / f"{schedule}-z{zero}-tp{tp}-dp{dp}"
            path = forced_plan(
                "gpt", 2 * tp * dp, out, tp=tp, dp=dp, schedule=schedule, zero=zero, **common
            )
            pinned[schedule, zero, tp, dp] = json.loads(path.read_text())
    out = {}
    for name, (schedule, zero, stage_tp, stage_dp) in MIXES.items():
        base = pinned[schedule, zero, 1, max(stage_dp)]
        wide = pinned[schedule, zero, 2, 1]
        out[name] = write_plan(mixed_degrees(base, wide, stage_tp, stage_dp), tmp / name)
    return out


def mixed_degrees(
    one: dict, two: dict, stage_tp: list[int], stage_dp: list[int] | None = None
) -> dict:
    """Plan ``one`` (TP 1) with each stage of TP 2 taking plan ``two``'s TP choices for its
    blocks; both plans cut the model at the same block. ``stage_dp``: DP degrees by stage
    (``one``'s DP degree the largest), else ``one``'s for all."""
    assert [b["stage"] for b in one["blocks"]] == [b["stage"] for b in two["blocks"]]
    doc = json.loads(json.dumps(one))
    by_name = {b["name"]: b for b in two["blocks"]}
    for blk in doc["blocks"]:
        if stage_tp[blk["stage"]] > 1:
            for key in ("tp_plan", "tp_grad_sums", "tp_variant"):
                blk[key] = by_name[blk["name"]][key]
    dp = doc["mesh"]["dp"]
    stage_dp = stage_dp or [dp] * len(stage_tp)
    assert max(stage_dp) == dp
    mesh = Mesh(
        doc["mesh"]["pp"],
        dp,
        max(stage_tp),
        stage_tp=tuple(stage_tp),
        stage_dp=tuple(stage_dp) if len(set(stage_dp)) > 1 else None,
    )
    doc["mesh"] = mesh.to_dict()
    for st in doc["stages"]:
        st["ranks"] = mesh.stage_ranks(st["pp_rank"])
        st["local_batch_size"], st["num_microbatches"] = replica_counts(
            doc["global_batch_size"], mesh.dp_of(st["pp_rank"]), doc["micro_batch_size"]
        )
    doc["cluster"]["gpus"] = mesh.size
    doc["cluster"]["nodes"] = -(-mesh.size // doc["cluster"]["gpus_per_node"])
    return doc


def test_plan_file_keeps_stage_degrees_and_refuses_bad_ones(plans):
    path = plans["tp12"]
    plan = load_plan(path)
    assert plan.mesh.stage_tp == (1, 2) and plan.mesh.tp_label == "1/2"
    assert dumps(plan) == path.read_text()  # a loaded plan writes its file byte for byte
    doc = json.loads(path.read_text())
    for bad, words in (
        ([1, 2, 2], "mesh.stage_tp must list 2 positive TP degrees"),
        ([1, 4], "the largest equal to mesh.tp (2)"),
        ([0, 2], "positive TP degrees"),
    ):
        broken = json.loads(json.dumps(doc))
        broken["mesh"]["stage_tp"] = bad
        with pytest.raises(UserInputError, match="stage_tp") as err:
            plan_from_dict(broken, "x")
        assert words in str(err.value) and "\n" not in str(err.value)
    dp_doc = json.loads(plans["dp21"].read_text())
    assert load_plan(plans["dp21"]).mesh.dp_label == "2/1"
    for bad, words in (
        ([2, 1, 1], "mesh.stage_dp must list 2 positive DP degrees"),
        ([1, 1], "the largest equal to mesh.dp (2)"),
    ):
        broken = json.loads(json.dumps(dp_doc))
        broken["mesh"]["stage_dp"] = bad
        with pytest.raises(UserInputError, match="stage_dp") as err:
            plan_from_dict(broken, "x")
        assert words in str(err.value)
    broken = json.loads(json.dumps(doc))
    broken["stages"][1]["ranks"] = [1, 2, 3]
    with pytest.raises(UserInputError, match="stage 1 ranks are not"):
        plan_from_dict(broken, "x")


@pytest.mark.distributed
@pytest.mark.parametrize(
    "world", [3, pytest.param(4, marks=pytest.mark.long)], ids=["3-ranks", "4-ranks"]
)
def test_runtime_runs_stages_of_different_degrees_like_one_process(plans, world, tmp_path):
    """Each mix trains to the one-process losses and final parameters: activations fan out to
    the wider stage's TP ranks and gradients come back from one of them; where DP differs,
    each micro-batch goes to the replica whose turn it is. DDP and FSDP2 (ZeRO 3). The
    three-rank mixes in one launch, about 30 s."""
    steps = 3
    names = sorted(n for n in plans if load_plan(plans[n]).mesh.size == world)
    assert len(names) == (4 if world == 3 else 2)
    runs = [tmp_path / n for n in names]
    rc, log = launch(
        [plans[n] for n in names], runs, world, "--checkpoint-every", str(steps), steps=steps
    )
    for name, run in zip(names, runs, strict=True):
        got = losses_of(run)
        assert len(got) == steps, f"{name}: torchrun exit {rc}\n{log[-6000:]}"
        doc = json.loads(plans[name].read_text())
        mesh = doc["mesh"]
        label = f"dp {'/'.join(map(str, mesh.get('stage_dp', [mesh['dp']])))}"
        assert label.replace("dp 1/1", "dp 1").replace("dp 2/2", "dp 2") in log
        ref = reference_for_plan(doc, steps)
        assert not unmoved_parameters(ref)
        for g, w in zip(got, ref.losses, strict=True):
            assert abs(g - w) <= 1e-4 * abs(w), name
        state = checkpoint_model_state(run / "checkpoints" / f"step_{steps:06d}")
        assert not parameter_mismatches(state, ref), name


@pytest.mark.distributed
@pytest.mark.long
def test_a_tied_weight_across_two_degrees_is_refused_in_one_line(tmp_path, capfd):
    """GPT-2 ties its head to its token embedding: on stages of TP 1 and 2 the two copies
    hold different shards, so the run stops with one line saying so."""
    model = model_path("gpt2")
    one = json.loads(
        forced_plan(model, 2, tmp_path / "a", pp=2, tp=1, zero=0, micro_batch_size=2).read_text()
    )
    two = json.loads(
        forced_plan(model, 4, tmp_path / "b", pp=2, tp=2, zero=0, micro_batch_size=2).read_text()
    )
    path = write_plan(mixed_degrees(one, two, [1, 2]), tmp_path / "mix")
    assert plan_main(["run", str(path), "--device", "cpu", "--steps", "1"]) == 2
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
    last = err.strip().splitlines()[-1]
    assert "sits on pipeline stages of TP degrees [1, 2]" in last, err[-3000:]


def _one_f_one_b(pp: int, j: int, m: int) -> list[tuple[str, int]]:
    """torch's Schedule1F1B order on pipeline rank j of pp with m micro-batches."""
    warm = min(pp - 1 - j, m)
    order = [("F", k) for k in range(warm)]
    for k in range(m - warm):
        order += [("F", warm + k), ("B", k)]
    return order + [("B", k) for k in range(m - warm, m)]


def _completes(mesh: Mesh, n: int, schedule) -> bool:
    """Whether every rank, running ``schedule``'s order on its own micro-batches (their global
    indices by ``Mesh.local_micro_batch``), finishes: a forward waits for the previous stage's
    forward of that micro-batch, a backward for the next stage's backward (the last stage's
    for its own forward). False when some ranks wait on each other for ever."""
    orders, done = {}, set()
    for j in range(mesh.pp):
        for d in range(mesh.dp_of(j)):
            r = mesh.rank(j, d, 0)
            local = schedule(mesh.pp, j, n // mesh.dp_of(j))
            orders[j, d] = [(op, mesh.local_micro_batch(r, k, n)) for op, k in local]
    moved = True
    while moved:
        moved = False
        for (j, _), order in orders.items():
            while order:
                op, g = order[0]
                after = ("F", j - 1, g) if op == "F" else ("B", j + 1, g)
                if op == "F" and j == 0 or op == "B" and j == mesh.pp - 1:
                    after = ("F", j, g) if op == "B" else None
                if after is not None and after not in done:
                    break
                done.add((op, j, g))
                order.pop(0)
                moved = True
    return not any(orders.values())


def _gpipe(pp: int, j: int, m: int) -> list[tuple[str, int]]:
    return [("F", k) for k in range(m)] + [("B", k) for k in range(m)]


@pytest.mark.parametrize("stage_dp", [(1, 4, 1), (1, 2, 2, 2), (2, 1, 4), (4, 2, 1)])
def test_uneven_dp_under_1f1b_is_refused(plans, stage_dp):
    """Stages of different DP degrees, each replica running torch's 1F1B order on its turns:
    some meshes wait for ever (a replica's warm-up needs a micro-batch its narrower neighbour
    sends only after a backward that waits on that replica), while GPipe's order always
    completes; so the runtime refuses 1F1B there in one line, before any process starts."""
    mesh = Mesh(len(stage_dp), max(stage_dp), 1, stage_dp=stage_dp)
    assert _completes(mesh, 8, _gpipe)
    if stage_dp in ((1, 4, 1), (1, 2, 2, 2)):
        assert not _completes(mesh, 8, _one_f_one_b)
    doc = json.loads(plans["dp21"].read_text())
    doc["schedule"] = "1f1b"
    path = write_plan(doc, plans["dp21"].parent.parent / "dp21-1f1b")
    with pytest.raises(UserInputError, match="run GPipe only") as err:
        check_runnable(load_plan(path))
    assert "\n" not in str(err.value)
