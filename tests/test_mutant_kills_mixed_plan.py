"""Tests written for mutmut's generated mutants of planner/resources/mixed_plan.py (benchmarks/
generated_mutants.py): the plan's mesh and a placement's configs worked by hand, and the mixed
plan of examples/mlp.py (size small, 8 blocks) over two CPU kinds (the measured ``cpu`` profile
and a copy at half its fp32 peak and half its memory) with each kind's step alone given, so
that the search and the record run in a fraction of a second: every field of the plan against
the search's own result (its MILP's objective, its kinds and placement) or a closed form (the
bubble, the MFU at each kind's peak, the samples a second), and the refusals' whole messages.
test_mixed_plan plans GPT over the same kinds (each kind alone too: half a minute).
docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
from pathlib import Path
from types import SimpleNamespace

import highspy
import pytest
from recorders import bound_arguments
from runs import cpu_profile

import planner.resources.mixed_plan as mixed_plan
from planner.api import plan, trace
from planner.cost.variant_cache import load_variants, variants_path
from planner.errors import InfeasibleError, UserInputError
from planner.modelfile import load_model_file
from planner.resources.mixed_plan import (
    KindSpec,
    MixedPlanResult,
    counts_to_config,
    plan_mesh,
    plan_mixed,
)
from planner.schema import plan_from_dict
from planner.schema.mesh import Mesh
from planner.search import Pins
from planner.search.mixed.cost import step_time
from planner.search.mixed.search import RunRate
from planner.training import Training, on_devices

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "examples" / "mlp.py"
ARGS = {"size": "small"}
LINK = (4.4e9, 3.1e-4)
PEAK = {"fast": 1.0e11, "slow": 5.0e10}  # fp32 FLOP/s: profiles/cpu.toml and its half
CAPACITY = {"fast": 8 * 2**30, "slow": 4 * 2**30}


@pytest.fixture(autouse=True)
def _own_highs_scheduler():
    """mutmut forks a child per mutant from the process that ran the clean tests; HiGHS's task
    scheduler's threads do not come with a fork, and the mixed MILP there would wait on them
    forever (the eighth stop's run stopped at its first mutant so): each test starts HiGHS's
    scheduler afresh (a module-scoped reset ran in the first test mutmut chose only)."""
    highspy.Highs.resetGlobalScheduler(False)


@pytest.fixture(scope="module")
def half(tmp_path_factory) -> str:
    tmp = tmp_path_factory.mktemp("kinds")
    return cpu_profile(tmp, "cpu-half", peak_flops_fp32="5.0e10", capacity_bytes=4294967296)


def mixed(half: str, fast: int = 2, slow: int = 1, **kw) -> MixedPlanResult:
    kinds = [KindSpec("fast", "cpu", fast), KindSpec("slow", half, slow)]
    common = dict(
        model_args=ARGS, global_batch_size=8, dtype="fp32", optimizer="sgd", lr=0.5,
        single={"fast": 10.0, "slow": 10.0}, stage_degrees=True,
    )  # fmt: skip
    return plan_mixed(MODEL, kinds, {("fast", "slow"): LINK}, **{**common, **kw})


@pytest.fixture
def three(half) -> MixedPlanResult:
    """Two fast ranks and one slow one. Built anew for each test (a fraction of a second):
    mutmut runs a mutant against the tests it saw call the mutated function, and a module
    fixture would be seen in the first test that asked for it only (the record's mutants
    survived every field test so)."""
    return mixed(half)


def test_plan_mesh_lists_stage_degrees_only_where_they_differ():
    assert plan_mesh(2, 2, [2, 2]) == Mesh(2, 2, 2)
    assert plan_mesh(2, 2, [1, 2]) == Mesh(2, 2, 2, stage_tp=(1, 2))
    assert plan_mesh(2, 2, [2, 2], [1, 2]) == Mesh(2, 4, 2, stage_dp=(2, 4))
    assert plan_mesh(2, 3, [1, 1], [2, 2]) == Mesh(2, 6, 1)
    assert plan_mesh(3, 2, [4, 1, 2], []) == Mesh(3, 2, 4, stage_tp=(4, 1, 2))
    assert plan_mesh(2, 1, [1, 2], [3, 1]) == Mesh(2, 3, 2, stage_tp=(1, 2), stage_dp=(3, 1))


def test_counts_to_config_places_each_segments_blocks_in_order():
    """Blocks E L L L H (segments E, LLL, H). Stage 0 takes E (option 0) and two L's (option
    1), stage 1 one L (option 0) and H (option 1): stages [0 0 0 1 1], options [0 1 1 0 1].
    Stage 0 is on variant 1, stage 1 on variant 0: variant 0's config carries the options of
    blocks 3 and 4 only, variant 1's those of blocks 0 to 2."""
    blocks = [SimpleNamespace(cls=c) for c in "ELLLH"]
    counts = [[[1, 0], [0, 2], [0, 0]], [[0, 0], [1, 0], [0, 1]]]
    meshes = [Mesh(2, 1, 2), Mesh(2, 2, 1)]
    base = SimpleNamespace(micro_batch_size=4, schedule="gpipe", zero_stage=2)
    stage_of, choice, configs = counts_to_config(base, blocks, counts, [1, 0], meshes)
    assert stage_of == [0, 0, 0, 1, 1] and choice == [0, 1, 1, 0, 1]
    assert [c.choice for c in configs] == [[0, 0, 0, 0, 1], [0, 1, 1, 0, 0]]
    for c, mesh in zip(configs, meshes, strict=True):
        assert c.mesh == mesh and c.micro_batch_size == 4 and c.schedule == "gpipe"
        assert c.virtual_stages == 1 and c.zero_stage == 2 and c.stage_of == stage_of


def test_refusals_are_one_line_errors(half):
    one = [KindSpec("fast", "cpu", 1)]
    same = [KindSpec("fast", "cpu", 1), KindSpec("fast", half, 1)]
    for kinds in (one, same, []):
        with pytest.raises(UserInputError) as exc:
            plan_mixed(MODEL, kinds, {})
        assert str(exc.value) == "a mixed plan needs at least two device kinds with distinct names"
    kinds = [KindSpec("fast", "cpu", 1), KindSpec("slow", half, 1)]
    for link in (("fast", "gone"), ("gone", "slow")):
        with pytest.raises(UserInputError) as exc:
            plan_mixed(MODEL, kinds, {link: LINK}, model_args=ARGS, single={"fast": 1.0})
        assert str(exc.value) == (
            f"a fabric names {link[0]!r} and {link[1]!r}: not both kinds of this job"
        )


def test_best_single_is_the_least_step_ties_to_the_first_name():
    res = MixedPlanResult({"b": 2.0, "a": 2.0, "c": 3.0}, {}, None, None)
    assert res.best_single == ("a", 2.0)
    assert MixedPlanResult({"b": 1.0, "a": 2.0}, {}, None, None).best_single == ("b", 1.0)
    assert res.notes == []


def test_the_plan_validates_and_round_trips(three):
    plan = three.plan
    assert plan_from_dict(json.loads(json.dumps(plan.to_dict()))).to_dict() == plan.to_dict()
    assert three.single == {"fast": 10.0, "slow": 10.0} and three.single_plans == {}
    assert three.notes == three.search.notes


def test_the_plan_is_the_searchs_best_placement(three):
    plan, search = three.plan, three.search
    best = search.best
    c, sol, mp = best.cand, best.solution, best.problem
    assert plan.mesh == plan_mesh(c.pp, c.dp, sol.tps, sol.dps)
    assert plan.mesh.pp == len(plan.stages) == 3 and plan.mesh.size == 3
    assert plan.micro_batch_size == c.micro_batch_size and plan.schedule == c.schedule
    assert plan.zero_stage == c.zero and plan.virtual_stages == 1
    assert (plan.dtype, plan.optimizer, plan.lr, plan.global_batch_size) == ("fp32", "sgd", 0.5, 8)
    assert plan.predicted.step_time_s == float(f"{sol.objective:.12g}")
    assert sol.objective == step_time(mp, sol.variants, sol.counts)
    names = [search.kinds[k].name for k in sol.kinds]
    assert [st.kind for st in plan.stages] == names
    assert sorted(names) == ["fast", "fast", "slow"]
    assert plan.rank_kinds == [names[plan.mesh.coords(r)[0]] for r in range(3)]
    # the kinds used, in the job's order, each with its GPUs in the plan
    assert [(k.name, k.profile, k.gpus_per_node, k.gpus) for k in plan.kinds] == [
        ("fast", "cpu", 8, 2),
        ("slow", "cpu-half", 8, 1),
    ]
    assert (plan.cluster.profile, plan.cluster.gpus_per_node, plan.cluster.gpus) == (
        "cpu+cpu-half",
        8,
        3,
    )
    assert plan.cluster.nodes == 1
    assert plan.solver.status == ("optimal" if search.proven else "feasible")
    assert plan.solver.objective == plan.predicted.step_time_s
    assert plan.solver.candidates_total == len(search.candidates)
    assert plan.solver.candidates_solved == search.solved
    pruned = sum(1 for x in search.candidates if x.status == "pruned-bound")
    assert plan.solver.candidates_pruned == pruned
    assert plan.solver.solve_time_s == pytest.approx(search.solve_time_s, rel=1e-9)


def test_each_stage_is_its_blocks_ranks_and_hop(three):
    plan, best = three.plan, three.search.best
    sol, mp = best.solution, best.problem
    seen = []
    for j, st in enumerate(plan.stages):
        assert st.index == j and st.pp_rank == j
        assert st.ranks == plan.mesh.stage_ranks(j)
        hop = float(mp.hop[j][sol.variants[j]][sol.variants[j + 1]]) if j < 2 else 0.0
        assert st.p2p_s == pytest.approx(hop, rel=1e-9)
        assert st.time_per_microbatch_s == pytest.approx(st.compute_s + st.tp_comm_s + hop)
        assert st.local_batch_size == 8 // plan.mesh.dp_of(j)
        assert st.num_microbatches == 8 // plan.mesh.dp_of(j) // plan.micro_batch_size
        seen += st.blocks
        for name in st.blocks:
            assert next(b for b in plan.blocks if b.name == name).stage == j
    assert seen == [b.name for b in plan.blocks]
    assert len(seen) == 10  # the input projection, 8 blocks, the head
    assert plan.stages[-1].p2p_s == 0.0 and plan.stages[0].p2p_s > 0
    # a stage's forward and backward share its hop: each carries half of it
    for st in plan.stages:
        assert st.forward_s + st.backward_s == pytest.approx(st.time_per_microbatch_s, rel=1e-6)


def test_prediction_by_closed_form(three):
    """The bubble: every stage's time but the longest; the MFU: the step's model FLOPs over
    the step times each rank's own peak; samples: 8 a step."""
    plan = three.plan
    p = plan.predicted
    times = [st.time_per_microbatch_s for st in plan.stages]
    assert p.bubble_s == pytest.approx(sum(times) - max(times), rel=1e-6)
    peak = sum(PEAK[k] for k in plan.rank_kinds)
    assert p.mfu == pytest.approx(p.model_flops_per_step / (p.step_time_s * peak), rel=1e-6)
    assert p.samples_per_s == pytest.approx(8 / p.step_time_s, rel=1e-9)
    assert p.tokens_per_s == pytest.approx(p.samples_per_s, rel=1e-9)  # a sample is a token
    assert p.model_flops_per_step > 0
    ratio = [
        m.total / CAPACITY[st.kind] for m, st in zip(p.memory_per_stage, plan.stages, strict=True)
    ]
    worst = max(range(3), key=lambda j: (ratio[j], j))
    assert p.peak_memory_bytes == pytest.approx(p.memory_per_stage[worst].total, rel=1e-9)
    assert p.capacity_bytes == CAPACITY[plan.stages[worst].kind]
    assert p.pipeline_s >= max(times)
    assert p.step_time_range_s is not None  # the published runs' spread


def test_the_mlps_flops_are_the_single_kinds(three, half):
    """The model FLOPs of a step do not depend on the placement: the 2-rank plan's equal the
    3-rank plan's."""
    two = mixed(half, fast=1, slow=1)
    assert two.plan.predicted.model_flops_per_step == three.plan.predicted.model_flops_per_step
    assert [k.gpus for k in two.plan.kinds] == [1, 1]
    assert two.plan.mesh.pp == 2


def test_a_cutoff_below_every_step_keeps_no_plan(half):
    res = mixed(half, fast=1, slow=1, single={"fast": 1e-9, "slow": 10.0})
    assert res.plan is None and res.search.best is None
    rate = RunRate(lambda g: 1.0, lambda g: math.inf)
    res = mixed(half, fast=1, slow=1, rate=rate, objective_cutoff=1e-9, single={"fast": 10.0})
    assert res.plan is None
    res = mixed(half, fast=1, slow=1, rate=rate, objective_cutoff=10.0, single={"fast": 1e-9})
    assert res.plan is not None  # the rate's cutoff, not the single steps, decides


def test_training_given_is_kept(half):
    res = mixed(half, fast=1, slow=1, training=Training(4, "fp32", "sgd", lr=0.25))
    assert res.plan.global_batch_size == 4 and res.plan.lr == 0.25


def test_kinds_alone_are_planned_when_not_given(half, tmp_path):
    """Without ``single`` each kind is planned alone on its GPUs; a kind whose memory holds
    nothing is infinitely slow and says why in a note."""
    tiny = cpu_profile(tmp_path, "cpu-tiny", capacity_bytes=1000)
    kinds = [KindSpec("fast", "cpu", 1), KindSpec("tiny", tiny, 1)]
    res = plan_mixed(
        MODEL, kinds, {("fast", "tiny"): LINK}, model_args=ARGS, global_batch_size=8,
        dtype="fp32", optimizer="sgd", lr=0.5,
    )  # fmt: skip
    assert res.single["tiny"] == math.inf
    assert res.single["fast"] == res.single_plans["fast"].predicted.step_time_s
    assert set(res.single_plans) == {"fast"}
    assert res.single_plans["fast"].global_batch_size == 8
    note = next(n for n in res.notes if n.startswith("tiny alone: "))
    assert ";" not in note and "\n" not in note
    # the note is the first clause of planning the kind alone's own error
    with pytest.raises(InfeasibleError) as exc:
        plan(MODEL, 1, profile=tiny, model_args=ARGS, global_batch_size=8, dtype="fp32",
             optimizer="sgd", lr=0.5, pins=Pins(offload="none"))  # fmt: skip
    assert note == "tiny alone: " + str(exc.value).split(";")[0]


def test_a_loaded_model_file_is_taken_as_it_is(half):
    """A ModelFile already loaded plans as its path does (it is not loaded again)."""
    loaded = mixed(half, fast=1, slow=1)
    kinds = [KindSpec("fast", "cpu", 1), KindSpec("slow", half, 1)]
    res = plan_mixed(
        load_model_file(MODEL, ARGS), kinds, {("fast", "slow"): LINK}, global_batch_size=8,
        dtype="fp32", optimizer="sgd", lr=0.5, single={"fast": 10.0, "slow": 10.0},
        stage_degrees=True,
    )  # fmt: skip
    assert res.plan.to_dict() == loaded.plan.to_dict() | {"solver": res.plan.to_dict()["solver"]}


def test_a_wide_batch_holds_each_schedules_inflight_microbatches(half):
    """256 samples: the search takes micro-batches of 64 over three stages (m = 4), where the
    schedules' counts differ from one micro-batch's: GPipe holds all m on every stage, 1F1B
    min(m, pp - j) (3, 2, 1)."""
    plan = mixed(half, global_batch_size=256).plan
    pp, m = plan.mesh.pp, plan.num_microbatches
    assert pp == 3 and plan.mesh.dp == 1 and m == 256 // plan.micro_batch_size and m > 1
    held = {"gpipe": [m] * pp, "1f1b": [min(m, pp - j) for j in range(pp)]}[plan.schedule]
    assert [st.inflight_microbatches for st in plan.stages] == held
    assert [st.num_microbatches for st in plan.stages] == [m] * pp


def test_stages_of_their_own_dp_degree(half):
    """Two stages over three ranks at a batch of 4096: the two fast ranks one stage's
    replicas, the slow rank the other stage, so the mesh lists each stage's DP degree."""
    res = mixed(half, global_batch_size=4096, pins=Pins(offload="none", pp=2))
    plan, sol = res.plan, res.search.best.solution
    assert list(sol.dps) == [2, 1] and list(sol.tps) == [1, 1]
    assert plan.mesh == Mesh(2, 2, 1, stage_dp=(2, 1))
    assert [st.kind for st in plan.stages] == ["fast", "slow"]
    assert [st.ranks for st in plan.stages] == [[0, 1], [2]]
    assert plan.rank_kinds == ["fast", "fast", "slow"]
    assert [st.local_batch_size for st in plan.stages] == [2048, 4096]
    # each replica's own micro-batches: 2048 / 512 and 4096 / 512, held by its schedule
    m = [st.num_microbatches for st in plan.stages]
    assert plan.micro_batch_size == 512 and m == [4, 8]
    held = {"gpipe": m, "1f1b": [min(m[j], 2 - j) for j in range(2)]}[plan.schedule]
    assert [st.inflight_microbatches for st in plan.stages] == held
    # two replicas sync their gradients, partly hidden; one replica syncs none; SGD steps both
    wide, lone = plan.stages
    assert wide.dp_comm_s > 0 and 0 < wide.dp_exposed_s <= wide.dp_comm_s
    assert lone.dp_comm_s == lone.dp_exposed_s == 0.0
    assert wide.optimizer_s > 0 and lone.optimizer_s > 0


def test_tp_stages_carry_their_tp_comm(half):
    """Two stages at TP 2 over two ranks of each kind: a stage's time per micro-batch is its
    compute, its TP collectives and its hop, each of them now above zero but the last hop."""
    res = mixed(half, fast=2, slow=2, pins=Pins(offload="none", pp=2, tp=2, tp_variant="sharded"))
    plan, sol = res.plan, res.search.best.solution
    assert list(sol.tps) == [2, 2] and list(sol.dps) == [1, 1]
    assert plan.mesh == Mesh(2, 1, 2)
    assert sorted(st.kind for st in plan.stages) == ["fast", "slow"]
    # the slow kind's stage comes first here: the worst stage by peak over capacity, not the last
    ratio = [
        m.total / CAPACITY[st.kind]
        for m, st in zip(plan.predicted.memory_per_stage, plan.stages, strict=True)
    ]
    worst = max(range(2), key=lambda j: (ratio[j], j))
    assert plan.predicted.capacity_bytes == CAPACITY[plan.stages[worst].kind]
    assert plan.predicted.peak_memory_bytes == plan.predicted.memory_per_stage[worst].total
    for st in plan.stages:
        assert st.tp_comm_s > 0
        t = st.compute_s + st.tp_comm_s + st.p2p_s
        assert st.time_per_microbatch_s == pytest.approx(t, rel=1e-9)


class _Calls:
    """A recorder standing in for one of plan_mixed's callees: each call's arguments by
    parameter name as the callee ``like`` would bind them (its defaults filled in, so that
    an argument left to its default reads as that default), then ``then`` (the real callee,
    or a stand-in) called with them and its result kept."""

    def __init__(self, like, then=None):
        self.signature, self.then = inspect.signature(like), then or like
        self.calls: list[dict] = []
        self.results: list = []

    def __call__(self, *args, **kwargs):
        self.calls.append(bound_arguments(self.signature, args, kwargs))
        self.results.append(self.then(*args, **kwargs))
        return self.results[-1]


def _no_mixed_plan(*args, **kwargs):
    return SimpleNamespace(best=None, notes=[])


def _alone(step: float):
    return lambda *a, **k: SimpleNamespace(plan=SimpleNamespace(predicted=SimpleNamespace(
        step_time_s=step)))  # fmt: skip


def test_each_kind_alone_and_the_search_get_the_callers_settings(half, monkeypatch):
    """Each kind alone and the search stood in by recorders (the trace and the variants
    real): each kind is planned alone on its GPUs, its own node size, the training settings
    as given (bf16 here, the model file's default being fp32), no offload by default, the
    cache flag and the caller's bound memos; the trace is the model's at one sample in that
    dtype; the search gets the training as CPU ranks run it (no fused optimizer, no device
    casts), the same pins, the run rate, the stage-degree flag, and the trace's BoundMemo
    kept in the caller's dict (``kept_bounds``). Without the cache, the kinds alone are
    planned without it too, and the search gets no kept memo."""
    alone = _Calls(plan, _alone(7.0))
    search = _Calls(mixed_plan.search_mixed, _no_mixed_plan)
    traced = _Calls(trace)
    monkeypatch.setattr(mixed_plan, "plan", alone)
    monkeypatch.setattr(mixed_plan, "search_mixed", search)
    monkeypatch.setattr(mixed_plan, "trace", traced)
    kinds = [KindSpec("fast", "cpu", 2, gpus_per_node=1), KindSpec("slow", half, 1)]
    bounds: dict = {}
    rate = RunRate(lambda g: 1.0, lambda g: 2.0)
    common = dict(
        model_args=ARGS, global_batch_size=8, dtype="bf16", optimizer="sgd", lr=0.5,
        bounds=bounds, rate=rate, stage_degrees=False,
    )  # fmt: skip
    res = plan_mixed(MODEL, kinds, {("fast", "slow"): LINK}, **common)
    settings = Training(8, "bf16", "sgd", lr=0.5)
    asked = [
        {k: call[k] for k in ("gpus", "profile", "gpus_per_node", "training", "pins", "use_cache")}
        for call in alone.calls
    ]
    want = dict(training=settings, pins=Pins(offload="none"), use_cache=True)
    assert asked == [
        dict(gpus=2, profile="cpu", gpus_per_node=1, **want),
        dict(gpus=1, profile=half, gpus_per_node=None, **want),
    ]
    assert all(call["bounds"] is bounds for call in alone.calls)
    assert res.single == {"fast": 7.0, "slow": 7.0} and res.plan is None
    (got,) = traced.results
    key = trace(MODEL, ARGS, 1, "bf16").cache_key
    assert got.traced_batch_size == 1 and got.cache_key == key
    (call,) = search.calls
    assert call["training"] == on_devices(settings, False)
    assert call["pins"] == Pins(offload="none") and call["rate"] is rate
    assert call["stage_degrees"] is False and call["cutoff"] == math.inf
    assert list(bounds) == [key] and call["kept"] is bounds[key]
    alone.calls.clear()
    search.calls.clear()
    plan_mixed(MODEL, kinds, {("fast", "slow"): LINK}, **common, use_cache=False)
    assert [call["use_cache"] for call in alone.calls] == [False, False]
    assert search.calls[0]["kept"] is None


def test_gpu_kinds_are_priced_as_gpus_train(monkeypatch):
    """Kinds that are all GPUs: the search prices the training as the runtime runs it there
    (torch's fused optimizer, parameters cast on the device); the kinds alone are planned
    with the settings as given."""
    alone = _Calls(plan, _alone(7.0))
    search = _Calls(mixed_plan.search_mixed, _no_mixed_plan)
    monkeypatch.setattr(mixed_plan, "plan", alone)
    monkeypatch.setattr(mixed_plan, "search_mixed", search)
    monkeypatch.setattr(mixed_plan, "variants_for", lambda *a: None)
    kinds = [KindSpec("h", "h100-sxm", 1), KindSpec("a", "a100-80g", 1)]
    plan_mixed(MODEL, kinds, {("h", "a"): LINK}, model_args=ARGS, global_batch_size=8,
               dtype="bf16", optimizer="sgd", lr=0.5)  # fmt: skip
    settings = Training(8, "bf16", "sgd", lr=0.5)
    assert [call["training"] for call in alone.calls] == [settings, settings]
    (call,) = search.calls
    assert call["training"] == on_devices(settings, True) and call["training"].fused_optimizer


def test_a_bad_training_setting_names_the_model_file(half):
    kinds = [KindSpec("fast", "cpu", 1), KindSpec("slow", half, 1)]
    with pytest.raises(UserInputError) as exc:
        plan_mixed(MODEL, kinds, {}, model_args=ARGS, dtype="fp64", single={"fast": 1.0})
    assert str(exc.value).startswith("mlp.py: TRAINING dtype 'fp64' is not one of ")


def test_stage_degrees_left_out_keep_one_degree_a_kind(half):
    """The batch and pins of ``test_stages_of_their_own_dp_degree`` with stage degrees left
    out: both stages at one DP degree (where the search, asked or left to choose, gives the
    fast kind's stage two replicas)."""
    res = mixed(half, global_batch_size=4096, pins=Pins(offload="none", pp=2), stage_degrees=False)
    assert res.plan.mesh.stage_dp is None and res.plan.mesh.stage_tp is None


def _callee_spies(monkeypatch):
    """Recorders of variants_for's memo (its keys as they stand at the call) and probe, and of
    save_variants' calls (each calling the real one)."""
    variants_for, seen = mixed_plan.variants_for, []

    def spy(graph, cluster, tp_variant, memo, probe):
        seen.append((set(memo) if memo is not None else None, probe))
        return variants_for(graph, cluster, tp_variant, memo, probe)

    saved = _Calls(mixed_plan.save_variants)
    monkeypatch.setattr(mixed_plan, "variants_for", spy)
    monkeypatch.setattr(mixed_plan, "save_variants", saved)
    return seen, saved


def test_a_cold_cache_is_filled_and_read_back_and_left_alone_without_the_cache(
    half, monkeypatch, tmp_path
):
    """In a cache of its own: a plan (the cache on by default) leaves the trace, at one sample
    (``api.trace``'s key), and the sharding variants it solved; a second plan reads them (the
    variants' memo and the eager probe's verdicts from the cache, nothing written again); a
    plan without the cache reads none of it and writes nothing."""
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "cache"))
    first = mixed(half, fast=1, slow=1)
    key = trace(MODEL, ARGS, 1, "fp32", use_cache=False).cache_key  # (writes nothing)
    assert [p.name for p in (tmp_path / "cache" / "traces").iterdir()] == [f"{key}.json"]
    kept = load_variants(key)
    assert kept and [p.name for p in (tmp_path / "cache" / "variants").iterdir()] == [
        variants_path(key).name
    ]
    seen, saved = _callee_spies(monkeypatch)
    again = mixed(half, fast=1, slow=1)
    assert again.plan.to_dict() == first.plan.to_dict() | {"solver": again.plan.to_dict()["solver"]}
    assert saved.calls == [] and len(seen) == 2
    for memo, probe in seen:
        assert memo == set(kept) and probe is not None and probe._path is not None
    seen.clear()
    mixed(half, fast=1, slow=1, use_cache=False)
    assert saved.calls == [] and len(seen) == 2
    memo, probe = seen[0]
    assert memo == set() and probe is not None and probe._path is None
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "none"))
    mixed(half, fast=1, slow=1, use_cache=False)
    assert not (tmp_path / "none").exists()


def test_an_unproven_search_records_a_feasible_plan(three):
    """The same search with one more candidate whose MILP found no solution (so the best is
    not proven optimal): the plan is the same but for the solver's record, which says
    "feasible" and counts the candidate."""
    search = three.search
    cut = dataclasses.replace(
        search,
        candidates=[*search.candidates, SimpleNamespace(status="no_solution", solution=None)],
    )
    assert search.proven and not cut.proven
    traced = trace(MODEL, ARGS, 1, "fp32")
    training = on_devices(Training(8, "fp32", "sgd", lr=0.5), False)
    got = mixed_plan.mixed_plan_record(traced, training, cut)
    assert got.solver.status == "feasible" and three.plan.solver.status == "optimal"
    assert got.solver.candidates_total == three.plan.solver.candidates_total + 1
    assert got.to_dict() | {"solver": None} == three.plan.to_dict() | {"solver": None}


def test_a_sequence_model_counts_its_tokens_a_second(half, monkeypatch):
    """The unit stood in (16 tokens a sample, a sequence model's): tokens a second are the
    samples a second times 16."""
    monkeypatch.setattr(mixed_plan, "_tokens_per_sample", lambda traced: 16)
    p = mixed(half).plan.predicted
    assert p.tokens_per_s == pytest.approx(16 * p.samples_per_s, rel=1e-9)


def test_an_offload_pinned_is_in_each_stages_time(half):
    """The optimizer states pinned to the host: each stage's record carries its offload time
    (above zero), and the plan's blocks say so."""
    plan = mixed(half, pins=Pins(offload="optimizer")).plan
    assert {b.offload for b in plan.blocks} == {"optimizer"}
    assert all(st.offload_s > 0 for st in plan.stages)
