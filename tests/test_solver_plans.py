"""Plausibility of whole plans: what an experienced engineer would pick in clear-cut cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.api import plan, trace
from planner.errors import InfeasibleError, UserInputError
from planner.schema import Mesh, dumps, load_plan, validate_plan
from planner.search import Pins
from planner.vocab import Schedule

ROOT = Path(__file__).resolve().parent.parent

GPT = "examples/gpt.py"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "cache"))


def test_small_model_large_batch_chooses_pure_data_parallel():
    res = plan(GPT, 8, model_args={"size": "small"}, global_batch_size=512, profile="h100-sxm")
    p = res.plan
    assert (p.mesh.pp, p.mesh.tp, p.mesh.dp) == (1, 1, 8)
    assert all(b.recompute == "none" and b.offload == "none" for b in p.blocks)
    validate_plan(p, "test")


def test_model_that_cannot_fit_unsharded_gets_sharded():
    # 2.7B parameters in mixed-precision Adam: 43 GB of model states, more than a 40 GB A100
    res = plan(GPT, 8, model_args={"size": "2.7b"}, global_batch_size=8, profile="a100-40g")
    p = res.plan
    sharded = p.zero_stage >= 1 or p.mesh.tp > 1 or p.mesh.pp > 1
    assert sharded
    assert p.predicted.peak_memory_bytes <= p.predicted.capacity_bytes


def test_tighter_memory_turns_on_recompute_or_offload():
    args = {"size": "1.3b"}
    loose = plan(GPT, 1, model_args=args, global_batch_size=8, profile="h100-sxm").plan
    assert all(b.recompute == "none" for b in loose.blocks)
    tight = plan(
        GPT,
        1,
        model_args=args,
        global_batch_size=8,
        profile="h100-sxm",
        # 30.4 GiB: the optimizer step's 20 bytes per parameter (fp32 states, gradients and
        # foreach AdamW's temporary) fit, the activations of no recompute do not
        pins=Pins(memory_fraction=0.38),
    ).plan
    changed = [b for b in tight.blocks if b.recompute != "none" or b.offload != "none"]
    assert changed
    assert tight.predicted.peak_memory_bytes <= tight.predicted.capacity_bytes


def test_pinning_everything_scores_that_configuration():
    pins = Pins(tp=1, pp=2, dp=4, zero=1, micro_batch_size=1, schedule="1f1b", recompute="full")
    p = plan(GPT, 8, model_args={"size": "1.3b"}, global_batch_size=32, pins=pins).plan
    assert p.mesh == Mesh(pp=2, dp=4, tp=1, ep=1, cp=1)
    assert p.zero_stage == 1 and p.schedule == "1f1b" and p.micro_batch_size == 1
    layers = [b for b in p.blocks if b.block_class == "Block"]
    assert all(b.recompute == "full" for b in layers)


def test_infeasible_request_says_by_how_much_and_what_would_fit():
    with pytest.raises(InfeasibleError) as err:
        plan(
            GPT,
            1,
            model_args={"size": "13b"},
            global_batch_size=8,
            profile="v100-16g",
            pins=Pins(offload="none"),
        )
    msg = str(err.value)
    assert "GiB" in msg and "GPUs" in msg and "offload" in msg
    assert err.value.exit_code == 3


def test_bad_pins_are_user_errors():
    with pytest.raises(UserInputError, match="divisible"):
        plan(GPT, 8, model_args={"size": "tiny"}, global_batch_size=6, pins=Pins(dp=4))


def test_same_inputs_give_byte_identical_plans(tmp_path):
    a = plan(GPT, 8, model_args={"size": "small"}, global_batch_size=64).plan
    b = plan(GPT, 8, model_args={"size": "small"}, global_batch_size=64).plan
    a.solver.solve_time_s = b.solver.solve_time_s = 0.0  # the one field that measures a clock
    assert dumps(a) == dumps(b)
    path = tmp_path / "plan.json"
    path.write_text(dumps(a))
    assert load_plan(path) == a


def test_solved_carries_sharding_solutions_to_later_plans_of_the_same_model(monkeypatch):
    """``solved`` keeps each traced model's sharding ILP solutions: the model's next plan
    (here under other pins) solves none again and comes out byte-identical to one planned
    afresh; another model's plan solves its own."""
    import planner.cost.sharding as sharding

    built = []
    real = sharding.build_problem
    monkeypatch.setattr(sharding, "build_problem", lambda *a, **k: built.append(1) or real(*a, **k))
    args = dict(model_args={"size": "small"}, global_batch_size=64)
    solved: dict = {}
    plan(GPT, 8, **args, solved=solved)
    assert built and len(solved) == 1
    built.clear()
    again = plan(GPT, 8, **args, pins=Pins(tp=2), solved=solved).plan
    assert not built  # every sharding ILP it needed was solved by the first plan
    fresh = plan(GPT, 8, **args, pins=Pins(tp=2), use_cache=False).plan
    assert built  # afresh (not even from the cache on disk), they are solved again
    again.solver.solve_time_s = fresh.solver.solve_time_s = 0.0
    assert dumps(again) == dumps(fresh)
    built.clear()
    plan(GPT, 8, model_args={"size": "1.3b"}, global_batch_size=64, solved=solved)
    assert built and len(solved) == 2  # another model: its own solutions


def test_leaving_the_baselines_out_changes_only_the_alternatives():
    args = dict(model_args={"size": "small"}, global_batch_size=64, pins=Pins(tp=2))
    full = plan(GPT, 8, **args).plan
    bare = plan(GPT, 8, **args, compare_baselines=False).plan
    assert {r.baseline for r in full.solver.alternatives} > {None}
    assert {r.baseline for r in bare.solver.alternatives} == {None}
    full.solver.alternatives = [r for r in full.solver.alternatives if r.baseline is None]
    full.solver.solve_time_s = bare.solver.solve_time_s = 0.0
    assert dumps(full) == dumps(bare)


def test_every_rank_is_used_exactly_once():
    p = plan(GPT, 8, model_args={"size": "1.3b"}, global_batch_size=64, pins=Pins(pp=2)).plan
    ranks = sorted(r for st in p.stages if st.index < p.mesh.pp for r in st.ranks)
    assert ranks == list(range(8))
    assert sorted(b.name for b in p.blocks) == sorted(n for st in p.stages for n in st.blocks)


def test_only_runnable_schedules_and_zero_stages_are_searched():
    """What the runtime can run: torch's Schedule1F1B needs m >= pp (GPipe covers m < pp, at the
    same cost), and ZeroRedundancyOptimizer holds neither DTensors nor pipeline stages, so
    ZeRO-1 is searched with tp = pp = 1 only unless --zero 1 pins it."""
    from planner.search.candidates import enumerate_candidates
    from planner.training import Training

    training = Training(8, "bf16", "adamw")
    cands = enumerate_candidates(8, 6, training, Pins(), [1, 2, 4, 8])
    for c in cands:
        m = 8 // (c.dp * c.micro_batch_size)
        if c.pp > 1 and c.schedule == "1f1b":
            assert m >= c.pp
        if c.zero == 1:
            assert c.tp == 1 and c.pp == 1
    assert any(
        c.pp > 1 and c.schedule == "gpipe" and 8 // (c.dp * c.micro_batch_size) < c.pp
        for c in cands
    )
    pinned = enumerate_candidates(8, 6, training, Pins(zero=1, tp=2), [1, 2])
    assert pinned and all(c.zero == 1 and c.tp == 2 for c in pinned)


def test_a_baseline_the_pins_excluded_says_how_much_faster_it_is():
    """A pinned 4-stage pipeline of a tiny GPT on 4 GPUs loses to the baselines; the table
    must say so (the speed-up and that the pins excluded it), never call them a tie."""
    pinned = plan(
        ROOT / "examples" / "gpt.py", 4, model_args={"size": "tiny"}, profile="h100-sxm",
        pins=Pins(pp=4, tp=1, dp=1),
    )  # fmt: skip
    chosen = pinned.plan.predicted.step_time_s
    faster = [
        a
        for a in pinned.plan.solver.alternatives
        if a.step_time_s is not None and a.step_time_s < chosen * 0.99
    ]
    assert faster, "the pinned pipeline should lose to a baseline"
    for a in faster:
        ratio = chosen / a.step_time_s
        assert "your pins" in a.why_not and f"{ratio:.2f}x as fast" in a.why_not, a.why_not
        assert "as fast (within" not in a.why_not


def test_why_a_layout_lost_names_batchnorm_synchronization_apart_from_compute():
    """A data-parallel ResNet loses to a pipeline on CPU ranks because each BatchNorm's
    statistics are all-reduced per micro-batch: the table said "compute and tensor-parallel
    communication" for a layout with no TP. The synchronization is its own part now, and the
    per-micro-batch work names TP only where a layout has it."""
    from planner.assemble import why_lost
    from planner.cost.records import StepCost
    from planner.search.candidates import Candidate

    def cost(step: float, pipeline: float, sync: float) -> StepCost:
        return StepCost(
            step_time_s=step, pipeline_s=pipeline, bubble_s=0.0, dp_exposed_s=0.0,
            optimizer_s=step - pipeline, offload_s=0.0, stages=[], rank_memory=[],
            peak_memory_bytes=1.0, capacity_bytes=2.0, model_flops_per_step=1.0, mfu=0.1,
            samples_per_s=1.0, feasible=True, sync_s=sync,
        )  # fmt: skip

    best = Candidate(2, 1, 1, 8, "gpipe", 1, 0, status="solved", cost=cost(3.0, 2.0, 0.0))
    dp = Candidate(1, 2, 1, 4, "gpipe", 1, 0, status="solved", cost=cost(17.6, 16.6, 14.0))
    assert why_lost(dp, best) == "486.7% slower, mostly BatchNorm statistics synchronization"
    slow = Candidate(1, 2, 1, 4, "gpipe", 1, 0, status="solved", cost=cost(17.6, 16.6, 1.0))
    assert why_lost(slow, best) == "486.7% slower, mostly compute"
    tp = Candidate(1, 1, 2, 8, "gpipe", 1, 0, status="solved", cost=cost(17.6, 16.6, 1.0))
    assert why_lost(tp, best).endswith("mostly compute and tensor-parallel communication")


def test_a_pinned_virtual_stage_count_is_searched_whatever_its_value():
    """--virtual-stages V is tried as pinned, also outside the search's own INTERLEAVE set
    (v = 3 here), wherever pp x V chunks of at least one block exist; 8 is in the set (one-layer
    chunks of a 126-layer model on 16 stages); a count the blocks cannot fill says so."""
    from planner.search.candidates import INTERLEAVE, _schedules, no_candidate_message
    from planner.training import Training

    assert 8 in INTERLEAVE and 3 not in INTERLEAVE
    assert _schedules(2, 4, 6, Pins(virtual_stages=3)) == [(Schedule.INTERLEAVED, 3)]
    assert _schedules(2, 4, 5, Pins(virtual_stages=3)) == []  # 2 x 3 chunks > 5 blocks
    assert _schedules(2, 3, 6, Pins(virtual_stages=3)) == []  # m = 3 not a multiple of pp
    assert (Schedule.INTERLEAVED, 8) in _schedules(16, 32, 128, Pins())
    assert (Schedule.INTERLEAVED, 8) not in _schedules(16, 32, 127, Pins())
    pinned_one = _schedules(2, 4, 6, Pins(virtual_stages=1))
    assert pinned_one == [(Schedule.GPIPE, 1), (Schedule.ONE_F_ONE_B, 1)]
    blocks = trace(GPT, {"size": "tiny"}).blocks
    msg = no_candidate_message(
        2, Training(8, "bf16", "adamw"), Pins(pp=2, virtual_stages=len(blocks)), [1, 2], blocks
    )
    assert f"--virtual-stages {len(blocks) // 2} or less" in msg and "\n" not in msg


def test_a_pipelined_block_handed_several_tensors_is_sequence_parallel():
    """A pipeline stage runs an HF Llama decoder layer (handed the stream, the mask and the
    rotary tables) as the model's eager module, from the call signature its export keeps
    (``runtime.block_calls``), as it runs a GPT block (handed the stream alone): both are
    offered sequence parallelism pipelined, as without a pipeline. (Which layers a stage runs
    as traced code, and is not offered it: tests/test_block_calls.py.)"""
    from planner.trace.blocks import reads_one_tensor, runs_eagerly_in_stage

    llama = trace("examples/llama.py", {"size": "tiny"})
    gpt = trace(GPT, {"size": "tiny"})
    assert not reads_one_tensor(llama.graph, llama.blocks[1])
    assert runs_eagerly_in_stage(llama.graph, llama.blocks[1])
    assert reads_one_tensor(gpt.graph, gpt.blocks[1])
    for pins, gpus in (
        (Pins(pp=2, tp=2, tp_variant="sequence"), 4),
        (Pins(tp=2, tp_variant="sequence"), 2),
    ):
        for path in ("examples/llama.py", GPT):
            p = plan(path, gpus, model_args={"size": "tiny"}, pins=pins).plan
            layers = [b for b in p.blocks if "sp_block" in b.tp_plan.values()]
            assert len(layers) == 2, (path, pins)
