"""Tests written for mutmut's generated mutants of runtime/build.py (each rank's share of a
plan; benchmarks/generated_mutants.py). One process: ``build`` itself on a one-rank gloo group
held in the test (a HashStore, no launch), the tiny MLP planned without a pipeline, against the
model a plain ``torch.manual_seed(seed); mf.build()`` gives; the small helpers against values
stated by hand, with stand-in meshes where one rank cannot make the mesh (two replicas).
The pipeline path needs two ranks: the torchrun tests run it. docs/mutation.md names the
mutants each test kills."""

from __future__ import annotations

import copy
import gc
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from runs import forced_plan

import runtime.build as b
import runtime.gather
from planner.modelfile import load_model_file
from planner.schema import load_plan

pytestmark = pytest.mark.usefixtures("gloo_one_rank")  # conftest: a one-rank gloo group

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """The tiny MLP on one rank, ZeRO 0 and ZeRO 3 (a plan each), and its model file."""
    out = tmp_path_factory.mktemp("plan")
    plans = {}
    for zero in (0, 3):
        path = forced_plan("mlp", 1, out / f"z{zero}", tp=1, dp=1, pp=1, zero=zero,
                           micro_batch_size=4, recompute="none")  # fmt: skip
        plans[zero] = load_plan(path)
    plan = plans[0]
    return plans, load_model_file(plan.model.file, plan.model.args)


def _reference(mf, seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: v.detach().clone() for k, v in mf.build().state_dict().items()}


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: _full(v).detach() for k, v in module.state_dict().items()}


class _Mesh(dict):
    """A stand-in DeviceMesh: its dimensions by name, each with ``size`` and ``get_group``."""

    def __init__(self, sizes: dict[str, int]) -> None:
        super().__init__({n: SimpleNamespace(size=lambda s=s: s, get_group=lambda n=n: f"group-{n}")
                          for n, s in sizes.items()})  # fmt: skip
        self.mesh_dim_names = tuple(sizes)


def test_build_holds_the_seeded_model_in_train_mode(mlp):
    """ZeRO 0 on one rank: one part, the whole model, its parameters those of the model
    seeded and built in one process (fp32), in train mode; no schedule, no stages, no notes,
    one optimizer over every parameter; the mesh (pp, dp, tp) of one rank each."""
    plans, mf = mlp
    built = b.build(plans[0], mf, CPU, seed=3)
    assert len(built.parts) == 1
    model = built.parts[0]
    assert model.training and all(m.training for m in model.modules())
    ref = _reference(mf, 3)
    got = _state(model)
    assert sorted(got) == sorted(ref) and len(ref) == 30
    for k in ref:
        assert got[k].dtype == torch.float32
        assert torch.equal(got[k], ref[k]), k
    assert built.schedule is None and built.stage_indices == [] and built.notes == []
    assert built.mesh.mesh_dim_names == ("pp", "dp", "tp")
    assert tuple(built.mesh.shape) == (1, 1, 1)
    assert built.plan is plans[0] and built.gather is None and built.autocast is None
    assert built.expert_params == [] and built.edp_group is None and built.scalars == []
    assert built.tp_grad_sums == [] and built.aliases == {}
    assert len(built.optimizers) == 1
    opt_params = [p for g in built.optimizers[0].param_groups for p in g["params"]]
    assert {id(p) for p in opt_params} == {id(p) for p in model.parameters()}
    assert built.holds_first and built.holds_last
    assert built.coords == (0, 0, 0) and built.cp_mesh is None


def test_the_seed_decides_the_weights(mlp):
    """Seeds 0 and 1 build their own seeded models, which differ in each random weight (the
    linear layers'; the norms' start at ones and zeros whatever the seed)."""
    plans, mf = mlp
    zero = _state(b.build(plans[0], mf, CPU, seed=0).parts[0])
    one = _state(b.build(plans[0], mf, CPU, seed=1).parts[0])
    for seed, got in ((0, zero), (1, one)):
        ref = _reference(mf, seed)
        assert all(torch.equal(got[k], ref[k]) for k in ref)
    differ = {k for k in zero if not torch.equal(zero[k], one[k])}
    assert differ and all(k.endswith("weight") or k.endswith("bias") for k in differ)
    assert differ == {
        k for k in zero if not torch.equal(_reference(mf, 0)[k], _reference(mf, 1)[k])
    }


def test_zero3_shards_the_same_weights(mlp):
    """ZeRO 3: the model is FSDP2's, its parameters DTensors whose whole tensors are the
    seeded model's, and the optimizer takes them."""
    plans, mf = mlp
    built = b.build(plans[3], mf, CPU, seed=2)
    model = built.parts[0]
    assert type(model).__name__.startswith("FSDP")
    assert all(hasattr(p, "full_tensor") for p in model.parameters())
    ref = _reference(mf, 2)
    got = _state(model)
    assert all(torch.equal(got[k], ref[k]) for k in ref)
    assert model.training and len(built.optimizers) == 1


def test_a_cache_keeps_the_mesh_for_the_next_plan(mlp):
    """The same cache: the second plan's mesh is the first's object, keyed by its shape."""
    plans, mf = mlp
    cache = b.RuntimeCache()
    first = b.build(plans[0], mf, CPU, 0, cache)
    second = b.build(plans[3], mf, CPU, 0, cache)
    assert first.mesh is second.mesh
    assert list(cache.meshes) == [("cpu", 1, 1, 1, 1, None)]
    assert cache.pipes == {} and cache.groups == {}


def test_expert_mesh_names_its_dimensions_and_is_cached():
    cache = b.RuntimeCache()
    mesh = b.expert_mesh(CPU, 1, 1, 1, 1, cache)
    assert mesh.mesh_dim_names == ("pp", "edp", "ep", "tp") and tuple(mesh.shape) == (1, 1, 1, 1)
    assert list(cache.meshes) == [("cpu-ep", 1, 1, 1, 1)]
    assert b.expert_mesh(CPU, 1, 1, 1, 1, cache) is mesh


def test_replica_mesh_is_dp_or_dp_cp():
    assert b.replica_mesh(_Mesh({"pp": 1, "dp": 2, "tp": 1})) is not None
    plain = _Mesh({"pp": 1, "dp": 2, "tp": 1})
    assert b.replica_mesh(plain) is plain["dp"]
    cp = _Mesh({"pp": 1, "dp": 2, "cp": 2, "dp_cp": 4, "tp": 1})
    assert b.replica_mesh(cp) is cp["dp_cp"]


def test_first_names():
    assert b._first_names(["a"]) == "a"
    assert b._first_names(["a", "b", "c"]) == "a, b, c"
    assert b._first_names(["a", "b", "c", "d"]) == "a, b, c ..."


def _plan_for_notes(dtype="fp32", offloads=("none",), zero=0):
    blocks = [SimpleNamespace(offload=o) for o in offloads]
    return SimpleNamespace(dtype=dtype, blocks=blocks, zero_stage=zero)


def test_notes_each_setting_the_cpu_run_does_not_apply():
    cuda = torch.device("cuda")
    assert b._notes(_plan_for_notes(), CPU) == []
    assert b._notes(_plan_for_notes("bf16"), CPU) == [
        "dtype bf16: the CPU run trains in fp32 (mixed precision is GPU-only)"
    ]
    assert b._notes(_plan_for_notes("bf16"), cuda) == []
    assert b._notes(_plan_for_notes(offloads=("none", "optimizer")), cuda) == [
        "offload 'optimizer': torch's FSDP2 offloads parameters and optimizer states "
        "together only, so optimizer-only offload is not applied"
    ]
    params = "offload 'optimizer+params' needs ZeRO 2 or 3 (FSDP2); not applied"
    for zero, want in ((0, [params]), (1, [params]), (2, []), (3, [])):
        assert b._notes(_plan_for_notes(offloads=("optimizer+params",), zero=zero), cuda) == want


def test_sparse_embeddings_are_noted(mlp, monkeypatch):
    """The names ``dense_embedding_gradients`` returns, the first three, in the notes."""
    plans, mf = mlp
    monkeypatch.setattr(b, "dense_embedding_gradients", lambda model: ["e1", "e2", "e3", "e4"])
    built = b.build(plans[0], mf, CPU, seed=0)
    assert built.notes == [
        "e1, e2, e3 ...: sparse=True embeddings train with dense gradients (the same numbers, "
        "zeros where no sample looked up a row): FSDP2 and DTensor hold no sparse gradients"
    ]


def test_batchnorm_is_synchronized_over_more_than_one_replica(monkeypatch):
    calls = []
    monkeypatch.setattr(b, "synchronize_batchnorm", lambda *a: calls.append(a))
    sync = SimpleNamespace(batchnorm="synchronized")
    own = SimpleNamespace(batchnorm="per_replica")
    b._batchnorm("root", sync, _Mesh({"dp": 1}), CPU)
    b._batchnorm("root", own, _Mesh({"dp": 2}), CPU)
    assert calls == []
    b._batchnorm("root", sync, _Mesh({"dp": 2}), CPU)
    b._batchnorm("root", sync, _Mesh({"dp": 1, "cp": 2, "dp_cp": 2}), CPU)
    assert calls == [("root", "group-dp", CPU), ("root", "group-dp_cp", CPU)]


def test_gather_over_the_dp_replicas_when_the_loss_takes_it(monkeypatch):
    monkeypatch.setattr(runtime.gather, "batch_gather", lambda group: ("gather", group))
    takes, plain = SimpleNamespace(loss_gathers=True), SimpleNamespace(loss_gathers=False)
    assert b._gather(takes, _Mesh({"dp": 1})) is None
    assert b._gather(plain, _Mesh({"dp": 2})) is None
    assert b._gather(takes, _Mesh({"dp": 2})) == ("gather", "group-dp")


def test_loss_fn_rebuilds_the_outputs_and_passes_the_gather():
    seen = []
    mf = SimpleNamespace(loss=lambda out, y, gather: seen.append((out, y, gather)) or 7)
    assert b._loss_fn(mf, None)("out", "y") == 7
    layout = SimpleNamespace(rebuild=lambda out: ("rebuilt", out))
    assert b._loss_fn(mf, layout, "g")("out", "y") == 7
    assert seen == [("out", "y", None), (("rebuilt", "out"), "y", "g")]


def test_sync_gradients_calls_each_sum_with_its_group(monkeypatch):
    """Partial sums over tp, expert gradients over edp by dp, each scalar group by its size,
    then the tied copies: recorded in order."""
    calls = []
    monkeypatch.setattr(b, "sum_partial_gradients", lambda mods, tp: calls.append(("tp", mods, tp)))
    monkeypatch.setattr(b, "whole_gradients", lambda parts: calls.append(("whole", parts)))
    monkeypatch.setattr(b, "sync_expert_grads", lambda p, g, n: calls.append(("sum", p, g, n)))
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: {"s1": 3, "s2": 5}[group])
    tied = SimpleNamespace(sum_gradients=lambda parts: calls.append(("tied", parts)))
    plan = SimpleNamespace(mesh=SimpleNamespace(dp=4))
    scalars = [(["a"], "s1"), (["c"], "s2")]
    built = b.Built(plan, {"tp": "TP"}, ["part"], [], expert_params=["e"], edp_group="edp",
                    tied=tied, tp_grad_sums=["m"], scalars=scalars)  # fmt: skip
    built.sync_gradients()
    assert calls == [("tp", ["m"], "TP"), ("whole", ["part"]), ("sum", ["e"], "edp", 4),
                     ("sum", ["a"], "s1", 3), ("sum", ["c"], "s2", 5),
                     ("tied", ["part"])]  # fmt: skip
    calls.clear()
    b.Built(plan, {"tp": "TP"}, ["part"], [], tied=tied).sync_gradients()
    assert [c[0] for c in calls] == ["tp", "whole", "tied"]


def test_holds_first_and_last_by_stage_index():
    plan = SimpleNamespace(stages=[0, 1, 2])
    middle = b.Built(plan, None, [], [], schedule="s", stage_indices=[1])
    first = b.Built(plan, None, [], [], schedule="s", stage_indices=[0])
    last = b.Built(plan, None, [], [], schedule="s", stage_indices=[2])
    assert (middle.holds_first, middle.holds_last) == (False, False)
    assert (first.holds_first, first.holds_last) == (True, False)
    assert (last.holds_first, last.holds_last) == (False, True)


def test_cp_mesh_is_the_cp_dimension():
    mesh = _Mesh({"pp": 1, "dp": 1, "cp": 2, "tp": 1})
    assert b.Built(None, mesh, [], []).cp_mesh is mesh["cp"]


def test_release_drops_the_modules_and_the_schedule():
    parts, optimizers = ["m"], ["o"]
    built = b.Built(None, None, parts, optimizers, schedule="s")
    b.release(built)
    assert parts == [] and optimizers == [] and built.schedule is None


def test_freeze_launch_state_freezes_what_is_alive(thawed_collector):
    kept = [object() for _ in range(10)]
    b.freeze_launch_state()
    assert gc.get_freeze_count() >= len(kept)


def test_expert_parallelism_takes_the_ep_and_edp_dimensions(mlp, monkeypatch):
    """ep 2 (the MLP's plan with its mesh's ep set by hand; the expert functions stood in, as
    one rank has no two-rank mesh): build asks for the (1, dp, ep, tp) expert mesh with its
    cache, hands ``ep`` to expert parallelism and ``edp`` to the sharding of what it returned,
    and keeps edp's group and the experts the sharding returns."""
    plans, mf = mlp
    plan = copy.copy(plans[0])
    plan.mesh = copy.copy(plan.mesh)
    object.__setattr__(plan.mesh, "ep", 2)  # frozen, and its checks want dp % ep == 0
    calls, marker, sharded = [], [], []
    emesh = _Mesh({"pp": 1, "edp": 1, "ep": 2, "tp": 1})

    def expert_mesh(*args):
        calls.append(("mesh", *args))
        return emesh

    def apply(model, ep_mesh):
        calls.append(("apply", type(model).__name__, ep_mesh))
        return marker

    def shard(model, experts, edp, plan_, device):
        calls.append(("shard", type(model).__name__, experts is marker, edp, plan_ is plan, device))
        return sharded

    monkeypatch.setattr(b, "check_runnable", lambda p: None)
    monkeypatch.setattr(b, "expert_mesh", expert_mesh)
    monkeypatch.setattr(b, "apply_expert_parallel", apply)
    monkeypatch.setattr(b, "shard_experts", shard)
    cache = b.RuntimeCache()
    built = b.build(plan, mf, CPU, 0, cache)
    model_name = type(mf.build()).__name__
    assert calls == [
        ("mesh", CPU, 1, 1, 2, 1, cache),
        ("apply", model_name, emesh["ep"]),
        ("shard", model_name, True, emesh["edp"], True, CPU),
    ]
    assert built.edp_group == "group-edp" and built.expert_params is sharded


class _Recorded:
    """A stand-in DeviceMesh as ``init_device_mesh`` made it, recording ``_flatten``."""

    def __init__(self, device, shape, mesh_dim_names):
        self.args, self.flattened = (device, shape, mesh_dim_names), []

    def __getitem__(self, names):
        return SimpleNamespace(_flatten=lambda name: self.flattened.append((names, name)))


def test_a_context_parallel_mesh_flattens_dp_and_cp(monkeypatch):
    monkeypatch.setattr(b, "init_device_mesh", _Recorded)
    plan_mesh = SimpleNamespace(pp=2, dp=3, tp=5, cp=4, uneven=False)
    cache = b.RuntimeCache()
    mesh = b.device_mesh(CPU, plan_mesh, cache)
    assert mesh.args == ("cpu", (2, 3, 4, 5), ("pp", "dp", "cp", "tp"))
    assert mesh.flattened == [(("dp", "cp"), "dp_cp")]
    assert cache.meshes == {("cpu", 2, 3, 5, 4, None): mesh}
    assert b.device_mesh(CPU, plan_mesh, cache) is mesh
    plain = b.device_mesh(CPU, SimpleNamespace(pp=2, dp=3, tp=5, cp=1, uneven=False), cache)
    assert plain.args == ("cpu", (2, 3, 5), ("pp", "dp", "tp")) and plain.flattened == []


def test_an_uneven_mesh_is_this_ranks_stage_mesh(monkeypatch):
    """A TP degree per stage: rank 3's stage (its coords' first) picks its mesh from
    ``stage_meshes``, keyed by the degrees per stage as well."""
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 3)
    monkeypatch.setattr(b, "stage_meshes", lambda kind, m: [f"{kind}-tp{t}" for t in m.stage_tp])
    plan_mesh = SimpleNamespace(pp=3, dp=1, tp=1, cp=1, uneven=True, stage_tp=(1, 2, 1),
                                stage_dp=(1, 1, 1), coords=lambda r: (r // 2, 7, 8, 9))  # fmt: skip
    cache = b.RuntimeCache()
    assert b.device_mesh(CPU, plan_mesh, cache) == "cpu-tp2"
    assert cache.meshes == {("cpu", 3, 1, 1, 1, ((1, 2, 1), (1, 1, 1))): "cpu-tp2"}


def test_build_hands_each_step_the_model_the_plan_and_the_meshes(mlp, monkeypatch):
    """Each step of the wrapping, called through and recorded: it is handed the model being
    built, the plan's blocks and the tp or dp mesh, in order; recompute once before TP (with
    the tp mesh) and once after; what the steps return is what ``Built`` keeps."""
    plans, mf = mlp
    plan = plans[0]
    calls = []
    gathered = object()

    def spy(name, returns=None):
        real = getattr(b, name)

        def call(*args, **kwargs):
            out = real(*args, **kwargs) if returns is None else returns
            calls.append((name, args, kwargs, out))
            return out

        monkeypatch.setattr(b, name, call)

    for name in ("route_direct_forwards", "_batchnorm", "apply_recompute",
                 "apply_tensor_parallel", "grad_sum_modules", "scalar_parameters",
                 "apply_data_parallel", "ddp_autocast_dtype", "make_optimizers"):  # fmt: skip
        spy(name)
    spy("_gather", gathered)
    built = b.build(plan, mf, CPU, 0)
    by = {}
    for name, args, kwargs, out in calls:
        by.setdefault(name, []).append((args, kwargs, out))
    model = by["route_direct_forwards"][0][0][0]
    assert type(model).__name__ == type(mf.build()).__name__
    assert by["route_direct_forwards"][0][0][1] == []
    (bn,) = by["_batchnorm"]
    assert bn[0][0] is model and bn[0][1] is plan and bn[0][2] is built.mesh and bn[0][3] == CPU
    before, after = by["apply_recompute"]
    assert before[0][0] is model and before[0][1] is plan.blocks
    assert set(before[1]) == {"before_tp", "tp_mesh"} and before[1]["before_tp"] is True
    assert before[1]["tp_mesh"].mesh_dim_names == ("tp",)
    assert after[0][0] is model and after[0][1] is plan.blocks and after[1] == {}
    (tp,) = by["apply_tensor_parallel"]
    assert tp[0][0] is model and tp[0][1] is plan.blocks and tp[0][2].mesh_dim_names == ("tp",)
    (sums,) = by["grad_sum_modules"]
    assert sums[0] == (model, plan.blocks) and built.tp_grad_sums is sums[2]
    (sc,) = by["scalar_parameters"]
    assert sc[0] == (model, set())
    (dp,) = by["apply_data_parallel"]
    assert dp[0][:3] == (model, plan.blocks, plan) and dp[0][3].mesh_dim_names == ("dp",)
    assert dp[0][4:] == (CPU, set()) and built.parts == [dp[2]]
    (ac,) = by["ddp_autocast_dtype"]
    assert ac[0] == (dp[2], plan, CPU)
    (opt,) = by["make_optimizers"]
    assert opt[0][0] is built.parts and opt[0][1] is plan
    assert opt[0][2].mesh_dim_names == ("dp",) and opt[0][3] == [] and len(opt[0]) == 4
    assert built.optimizers is opt[2]
    (g,) = by["_gather"]
    assert g[0] == (mf, built.mesh) and built.gather is gathered
