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

from planner.cli import main as plan_main
from planner.errors import UserInputError
from planner.schema import dumps, load_plan, plan_from_dict, write_plan
from planner.schema.mesh import Mesh


def _meshes() -> list[Mesh]:
    rnd = random.Random(7)
    out = [Mesh(2, 1, 2, stage_tp=(1, 2)), Mesh(3, 2, 4, stage_tp=(1, 4, 2))]
    for _ in range(20):
        pp, dp = rnd.randint(2, 5), rnd.choice([1, 2, 3])
        stage_tp = tuple(rnd.choice([1, 2, 4, 8]) for _ in range(pp))
        out.append(Mesh(pp, dp, max(stage_tp), stage_tp=stage_tp))
    return out


@pytest.mark.parametrize("mesh", _meshes(), ids=lambda m: f"dp{m.dp}-tp{m.tp_label}")
def test_ranks_are_laid_stage_after_stage(mesh):
    """Stage i holds dp x tp_i consecutive ranks, (replica, TP rank) row-major inside; coords
    inverts rank; every rank is in exactly one stage, one TP group and one DP group."""
    seen = []
    for i in range(mesh.pp):
        ranks = mesh.stage_ranks(i)
        assert ranks == list(range(seen[-1] + 1 if seen else 0, len(seen) + len(ranks)))
        seen += ranks
        for d in range(mesh.dp):
            assert [mesh.rank(i, d, t) for t in range(mesh.tp_of(i))] == ranks[
                d * mesh.tp_of(i) : (d + 1) * mesh.tp_of(i)
            ]
        assert mesh.tp_group(i) == ranks[: mesh.tp_of(i)]
        assert mesh.dp_group(i) == ranks[:: mesh.tp_of(i)]
    assert seen == list(range(mesh.size)) and mesh.size == mesh.dp * sum(mesh.stage_tp)
    for r in range(mesh.size):
        pp_i, dp_i, cp_i, tp_i = mesh.coords(r)
        assert cp_i == 0 and mesh.rank(pp_i, dp_i, tp_i) == r


@pytest.mark.parametrize("mesh", _meshes(), ids=lambda m: f"dp{m.dp}-tp{m.tp_label}")
def test_every_boundary_message_has_one_sender_and_one_receiver(mesh):
    """At each boundary, in each direction, the messages the senders post are exactly those the
    receivers wait for: every rank receives once, from its own replica, and from a rank of the
    neighbouring stage whose TP rank agrees with its own modulo the sender's degree."""
    for i, j in itertools.permutations(range(mesh.pp), 2):
        if abs(i - j) != 1:
            continue
        posted = sorted((r, dst) for r in mesh.stage_ranks(i) for dst in mesh.neighbours(r, j)[1])
        awaited = sorted((mesh.neighbours(r, i)[0], r) for r in mesh.stage_ranks(j))
        assert posted == awaited
        for src, dst in awaited:
            s, d = mesh.coords(src), mesh.coords(dst)
            assert (s[0], d[0]) == (i, j) and s[1] == d[1]
            assert d[3] % mesh.tp_of(i) == s[3]


def test_one_degree_for_all_is_the_uniform_mesh():
    """stage_tp equal everywhere places every rank where the plain mesh does, and a boundary
    rank talks to the rank of its own coordinates only."""
    plain, listed = Mesh(3, 2, 2), Mesh(3, 2, 2, stage_tp=(2, 2, 2))
    assert not listed.uneven and listed.size == plain.size
    for r in range(plain.size):
        assert listed.coords(r) == plain.coords(r)
        pp_i = plain.coords(r)[0]
        for other in (pp_i - 1, pp_i + 1):
            if 0 <= other < 3:
                p = plain.coords(r)
                twin = plain.rank(other, p[1], p[3])
                assert listed.neighbours(r, other) == (twin, [twin])


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, Path]:
    """gpt (tiny, 2 layers) cut in two at TP 1 and at TP 2, and hand-made mixes of them."""
    tmp = tmp_path_factory.mktemp("stage_tp")
    common = {"pp": 2, "micro_batch_size": 2}
    out = {}
    for schedule, zero in (("1f1b", 0), ("gpipe", 3)):
        one = json.loads(
            forced_plan(
                "gpt", 2, tmp / f"a{zero}", tp=1, schedule=schedule, zero=zero, **common
            ).read_text()
        )
        two = json.loads(
            forced_plan(
                "gpt", 4, tmp / f"b{zero}", tp=2, schedule=schedule, zero=zero, **common
            ).read_text()
        )
        for stage_tp in ([1, 2], [2, 1]):
            name = f"tp{''.join(map(str, stage_tp))}-{schedule}-zero{zero}"
            out[name] = write_plan(mixed_degrees(one, two, stage_tp), tmp / name)
    return out


def mixed_degrees(one: dict, two: dict, stage_tp: list[int]) -> dict:
    """Plan ``one`` (TP 1) with each stage of degree 2 taking plan ``two``'s TP choices for its
    blocks; both plans cut the model at the same block."""
    assert [b["stage"] for b in one["blocks"]] == [b["stage"] for b in two["blocks"]]
    doc = json.loads(json.dumps(one))
    by_name = {b["name"]: b for b in two["blocks"]}
    for blk in doc["blocks"]:
        if stage_tp[blk["stage"]] > 1:
            for key in ("tp_plan", "tp_grad_sums", "tp_variant"):
                blk[key] = by_name[blk["name"]][key]
    mesh = Mesh(doc["mesh"]["pp"], doc["mesh"]["dp"], max(stage_tp), stage_tp=tuple(stage_tp))
    doc["mesh"] = mesh.to_dict()
    for st in doc["stages"]:
        st["ranks"] = mesh.stage_ranks(st["pp_rank"])
    doc["cluster"]["gpus"] = mesh.size
    doc["cluster"]["nodes"] = -(-mesh.size // doc["cluster"]["gpus_per_node"])
    return doc


def test_plan_file_keeps_stage_tp_and_refuses_bad_ones(plans):
    path = plans["tp12-1f1b-zero0"]
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
    broken = json.loads(json.dumps(doc))
    broken["stages"][1]["ranks"] = [1, 2, 3]
    with pytest.raises(UserInputError, match="stage 1 ranks are not"):
        plan_from_dict(broken, "x")


@pytest.mark.distributed
def test_runtime_runs_stages_of_different_tp_like_one_process(plans, tmp_path):
    """Each mix trains to the one-process losses and final parameters: activations fan out to
    the wider stage's TP ranks and gradients come back from one of them, under 1F1B with DDP
    and GPipe with FSDP2 (ZeRO 3). One launch of three ranks, about 25 s."""
    steps = 3
    names = sorted(plans)
    runs = [tmp_path / n for n in names]
    rc, log = launch(
        [plans[n] for n in names], runs, 3, "--checkpoint-every", str(steps), steps=steps
    )
    assert "x tp 1/2" in log and "x tp 2/1" in log, log[-3000:]
    for name, run in zip(names, runs, strict=True):
        got = losses_of(run)
        assert len(got) == steps, f"{name}: torchrun exit {rc}\n{log[-6000:]}"
        doc = json.loads(plans[name].read_text())
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
