"""Tests written for mutmut's generated mutants of runtime/recsys.py (a recommendation plan run
with TorchRec; benchmarks/generated_mutants.py). One process: ``train`` on a one-rank gloo
group (the tiny DLRM, its tables table-wise, column-wise and data-parallel on the fused SGD
kernel; AdamW on the dense kernel; the MLPs under FSDP2) against one process's plain training
on the same batches, every parameter and each step's loss; the helpers (generators, fused
parameters, optimizers, keys, batch slices, the command line) by hand; ``run_recplan`` with
``subprocess.run`` recording the torchrun command. tests/test_recsys_oracle.py runs the same
plans on two gloo ranks. docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

import runtime.recsys as recsys
from planner.errors import UserInputError
from planner.modelfile import file_sha256, load_model_file
from planner.recsys.plan import ADAMW
from planner.recsys.planning import plan_recsys
from planner.training import training_from
from runtime.launch import worker_env

pytestmark = pytest.mark.usefixtures("gloo_one_rank")  # conftest: a one-rank gloo group
ROOT = Path(__file__).resolve().parent.parent
DLRM = ROOT / "examples" / "dlrm.py"
GBS, STEPS = 32, 2
SGD = {"global_batch_size": GBS, "optimizer": "sgd", "dtype": "fp32", "lr": 0.5}
KINDS = ("table_wise", "column_wise", "data_parallel", "table_wise")


def _plan(training: dict, kernel: str, strategy: str = "ddp") -> dict:
    """The planner's one-rank plan of the tiny DLRM, its four tables set to KINDS."""
    mf = load_model_file(DLRM, {"size": "tiny"})
    plan, _ = plan_recsys(mf, 1, profile="cpu", training=training_from(training, "t"), device="cpu")
    plan = copy.deepcopy(plan)
    for t, kind in zip(plan["tables"], KINDS, strict=True):
        t.update(sharding=kind, ranks=[0], kernel="dense" if kind == "data_parallel" else kernel)
    plan["dense"]["strategy"] = strategy
    return plan


def _reference(training: dict) -> tuple[dict, list[float]]:
    """One process: STEPS steps of plain SGD (or torch's AdamW) on the global batches; the
    final parameters and each step's loss."""
    mf = load_model_file(DLRM, {"size": "tiny"})
    torch.manual_seed(0)
    model = mf.build()
    if training["optimizer"] == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=training["lr"])
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=training["lr"])
    losses = []
    for step in range(STEPS):
        inputs, labels = mf.module.make_batch(GBS, step=step)
        loss = mf.module.loss_fn(model(*inputs), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


def _train(plan: dict, run_dir: Path, capsys) -> tuple[dict, list[dict]]:
    """The trained parameters and the metrics' records; each step's line printed as its
    record says, and each step's time within the whole call's."""
    capsys.readouterr()
    start = time.perf_counter()
    recsys.train(plan, run_dir, STEPS, 0, torch.device("cpu"), dump_params=True)
    took = time.perf_counter() - start
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(x) for x in lines]
    printed = [ln for ln in capsys.readouterr().out.splitlines() if "loss" in ln]
    assert printed == [
        f"step {m['step']}: loss {m['loss']:.6f} ({m['step_time_s']:.3f} s)" for m in metrics
    ]
    assert all(0 < m["step_time_s"] < took for m in metrics)
    return torch.load(run_dir / "params.pt"), metrics


def _check(got: dict, metrics: list[dict], training: dict, sharded: int) -> None:
    want, losses = _reference(training)
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, rtol=1e-5, atol=1e-6, msg=name)
    assert [m["step"] for m in metrics] == list(range(STEPS))
    assert [m["sharded_dense_params"] for m in metrics] == [sharded] * STEPS
    for m, loss in zip(metrics, losses, strict=True):
        assert m["loss"] == pytest.approx(loss, rel=1e-6) and m["step_time_s"] > 0


def test_sgd_tables_of_each_sharding_train_like_one_process(tmp_path, capsys):
    """Fused EXACT_SGD on table-wise and column-wise shards, the dense kernel on a
    data-parallel table, DDP for the MLPs: one process's SGD (weights copied from it)."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 9}\n')  # an old run's: replaced
    got, metrics = _train(_plan(SGD, "fused"), tmp_path / "run", capsys)
    _check(got, metrics, SGD, 0)


def test_adamw_on_the_dense_kernel_and_fsdp_mlps_train_like_one_process(tmp_path, capsys):
    """AdamW (torch's defaults) for every table on the dense kernel and for the MLPs, the
    MLPs under FSDP2 (each of their parameters a DTensor): one process's AdamW."""
    adamw = {**SGD, "optimizer": "adamw", "lr": 0.01}
    got, metrics = _train(_plan(adamw, "dense", "fsdp"), tmp_path / "a" / "b", capsys)
    mf = load_model_file(DLRM, {"size": "tiny"})
    mlp = sum(1 for n, _ in mf.build().named_parameters() if "embedding" not in n)
    assert mlp > 0
    _check(got, metrics, adamw, mlp)


class _Stop(Exception):
    """Raised by the stand-in DistributedModelParallel: what build handed it is recorded."""


def _build_handed(monkeypatch, plan: dict, world: int, seed: int) -> dict:
    """What ``build`` hands TorchRec for ``plan`` at a world size of ``world``: each module's
    ``construct_module_sharding_plan`` call and DistributedModelParallel's arguments (stood in,
    so nothing is sharded)."""
    import torchrec.distributed.model_parallel as mp
    import torchrec.distributed.sharding_plan as sp

    seen: dict = {"construct": {}}

    def construct(module, gens, **kw):
        seen["construct"][id(module)] = (set(gens), kw)
        return {name: SimpleNamespace(cache_params=None) for name in gens}

    def dmp(model, **kw):
        seen["dmp"] = (model, kw)
        raise _Stop

    monkeypatch.setattr(sp, "construct_module_sharding_plan", construct)
    monkeypatch.setattr(mp, "DistributedModelParallel", dmp)
    monkeypatch.setattr(recsys.dist, "get_world_size", lambda *a: world)
    mf = load_model_file(DLRM, {"size": "tiny"})
    with pytest.raises(_Stop):
        recsys.build(plan, mf, torch.device("cpu"), seed)
    return seen


@pytest.mark.parametrize(("gpn", "world", "local"), [(2, 4, 2), (8, 4, 4)])
def test_build_hands_torchrec_the_plans_tables_world_node_and_host_caches(
    monkeypatch, gpn, world, local
):
    """Each table module's sharding plan is made for the world, the node's ranks (at most the
    world) and the CPU, by the sharder on the plan's fused optimizer; a host table gets its
    cache share; the model handed over holds the weights of ``manual_seed(seed); build()``."""
    plan = _plan(SGD, "fused")
    plan["cluster"]["gpus_per_node"] = gpn
    plan["tables"][1]["cache_ratio"] = 0.25
    seen = _build_handed(monkeypatch, plan, world, 7)
    model, kw = seen["dmp"]
    (sharder,) = kw["sharders"]
    assert sharder.fused_params == recsys.fused_params("sgd", 0.5)
    assert kw["device"] == torch.device("cpu") and kw["data_parallel_wrapper"] is None
    modules = dict(model.named_modules())
    want = {}
    for t in plan["tables"]:
        want.setdefault(t["module"], set()).add(t["name"])
    assert set(kw["plan"].plan) == set(want)
    for path, names in want.items():
        gens, args = seen["construct"][id(modules[path])]
        assert gens == names
        assert args == {
            "sharder": sharder,
            "local_size": local,
            "world_size": world,
            "device_type": "cpu",
        }
    for i, t in enumerate(plan["tables"]):
        cache = kw["plan"].plan[t["module"]][t["name"]].cache_params
        if i == 1:
            assert cache.load_factor == 0.25
        else:
            assert cache is None
    torch.manual_seed(7)
    fresh = load_model_file(DLRM, {"size": "tiny"}).build().state_dict()
    for name, value in model.state_dict().items():
        assert torch.equal(value, fresh[name]), name


def test_the_dense_part_is_wrapped_in_fsdp_only_when_the_plan_says_so(monkeypatch):
    """No ``dense`` record, or DDP: TorchRec's own DDP wrapper (None); FSDP: FullyShardDense."""
    plan = _plan(SGD, "fused")
    for strategy, wrapped in (("ddp", False), ("fsdp", True), (None, False)):
        if strategy is None:
            del plan["dense"]
        else:
            plan["dense"]["strategy"] = strategy
        wrapper = _build_handed(monkeypatch, plan, 1, 0)["dmp"][1]["data_parallel_wrapper"]
        assert (type(wrapper).__name__ == "FullyShardDense") is wrapped
        assert wrapped or wrapper is None


def test_train_builds_the_model_file_with_the_plans_arguments(monkeypatch, tmp_path):
    """The plan's model arguments reach the model file (DLRM's ``size`` has a default, so a
    model built without them looks the same at ``tiny``): recorded, nothing trained."""
    seen = []

    def load(path, args=None):
        seen.append((path, args))
        raise _Stop

    monkeypatch.setattr(recsys, "load_model_file", load)
    plan = _plan(SGD, "fused")
    plan["model"]["args"] = {"size": "tiny", "tables": 2}
    with pytest.raises(_Stop):
        recsys.train(plan, tmp_path / "r", 1, 0, torch.device("cpu"))
    assert seen == [(plan["model"]["file"], {"size": "tiny", "tables": 2})]


def test_each_steps_batch_goes_to_the_runs_device(monkeypatch, tmp_path):
    """The rank's slice of the batch is moved to the run's device (a GPU run's batch leaves
    the host): the first step's move recorded, then stopped."""
    moved = []

    def to(inputs, device):
        moved.append(device)
        raise _Stop

    monkeypatch.setattr(recsys, "_to", to)
    with pytest.raises(_Stop):
        recsys.train(_plan(SGD, "fused"), tmp_path / "r", 1, 0, torch.device("cpu"))
    assert moved == [torch.device("cpu")]


def test_a_run_saves_its_parameters_only_when_asked(tmp_path):
    """By default one step trains and writes its metrics, and no params.pt."""
    recsys.train(_plan(SGD, "fused"), tmp_path / "r", 1, 0, torch.device("cpu"))
    assert len((tmp_path / "r" / "metrics.jsonl").read_text().splitlines()) == 1
    assert not (tmp_path / "r" / "params.pt").exists()


def test_a_model_file_without_a_loss_is_refused(tmp_path):
    model = tmp_path / "dlrm_noloss.py"
    model.write_text(DLRM.read_text().replace("def loss_fn(", "def _no_loss_fn("))
    plan = _plan(SGD, "fused")
    plan["model"]["file"] = str(model)
    with pytest.raises(UserInputError) as err:
        recsys.train(plan, tmp_path / "r", 1, 0, torch.device("cpu"))
    assert str(err.value) == "dlrm_noloss.py: a recommendation model file must define loss_fn"


def test_each_tables_generator_is_torchrecs_helper_with_the_plans_ranks(monkeypatch):
    import torchrec.distributed.sharding_plan as sp

    for name in ("column_wise", "data_parallel", "row_wise", "table_row_wise", "table_wise"):
        monkeypatch.setattr(sp, name, lambda *a, _n=name, **k: (_n, a, k))
    plan = {
        "cluster": {"gpus_per_node": 4},
        "tables": [
            {"module": "m", "name": "a", "sharding": "data_parallel", "ranks": [0], "kernel": "x"},
            {"module": "m", "name": "b", "sharding": "table_wise", "ranks": [3], "kernel": "k"},
            {"module": "n", "name": "c", "sharding": "column_wise", "ranks": (1, 2), "kernel": "k"},
            {"module": "n", "name": "d", "sharding": "row_wise", "ranks": [0], "kernel": "k"},
            {"module": "n", "name": "e", "sharding": "table_row_wise", "ranks": [5], "kernel": "k"},
            {"module": "n", "name": "f", "sharding": "table_row_wise", "ranks": [3], "kernel": "k"},
        ],
    }
    assert recsys.sharding_generators(plan) == {
        "m": {
            "a": ("data_parallel", (), {}),
            "b": ("table_wise", (), {"rank": 3, "compute_kernel": "k"}),
        },
        "n": {
            "c": ("column_wise", (), {"ranks": [1, 2], "compute_kernel": "k"}),
            "d": ("row_wise", (), {}),
            "e": ("table_row_wise", (), {"host_index": 1}),
            "f": ("table_row_wise", (), {"host_index": 0}),
        },
    }


def test_the_fused_kernels_step_with_exact_sgd_or_decoupled_adam():
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import WeightDecayMode

    assert recsys.fused_params("sgd", 0.5) == {
        "optimizer": EmbOptimType.EXACT_SGD,
        "learning_rate": 0.5,
    }
    assert recsys.fused_params("adamw", 0.01) == {
        "optimizer": EmbOptimType.ADAM,
        "learning_rate": 0.01,
        "beta1": 0.9,
        "beta2": 0.999,
        "eps": 1e-8,
        "weight_decay": 0.01,
        "weight_decay_mode": WeightDecayMode.DECOUPLE,
    }


def test_the_dense_optimizer_is_plain_sgd_or_torchs_adamw():
    p = [torch.nn.Parameter(torch.zeros(2))]
    sgd = recsys.dense_optimizer("sgd", 0.5)(p)
    assert type(sgd) is torch.optim.SGD
    assert sgd.defaults["lr"] == 0.5 and sgd.defaults["momentum"] == 0
    adamw = recsys.dense_optimizer("adamw", 0.01)(p)
    assert type(adamw) is torch.optim.AdamW and adamw.defaults["lr"] == 0.01
    for key, value in ADAMW.items():
        assert adamw.defaults[key] == value


def test_a_state_key_is_named_as_the_unwrapped_model_names_it():
    assert recsys._plain("_dmp_wrapped_module.module.top.0.weight") == "top.0.weight"
    assert recsys._plain("module.sparse.t0.weight") == "sparse.t0.weight"
    assert recsys._plain("top.bias") == "top.bias"


def test_a_batch_is_cut_at_the_same_samples_in_every_tensor():
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b"],
        values=torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 9]),
        lengths=torch.tensor([2, 0, 1, 3, 1, 0, 2, 0]),
    )  # a: samples [1 2], [], [3], [4 5 6]; b: [7], [], [8 9], []
    dense = torch.arange(8.0).reshape(4, 2)
    out = recsys.slice_batch((dense, [kjt, torch.arange(4)]), 1, 3)
    assert type(out) is tuple and type(out[1]) is list
    assert torch.equal(out[0], dense[1:3]) and torch.equal(out[1][1], torch.tensor([1, 2]))
    cut = out[1][0]
    assert cut.keys() == ["a", "b"]
    assert cut["a"].lengths().tolist() == [0, 1] and cut["a"].values().tolist() == [3]
    assert cut["b"].lengths().tolist() == [0, 2] and cut["b"].values().tolist() == [8, 9]
    assert recsys.slice_batch(kjt, 0, 4)["a"].values().tolist() == [1, 2, 3, 4, 5, 6]
    with pytest.raises(UserInputError) as err:
        recsys.slice_batch({"x": dense}, 0, 1)
    assert str(err.value) == "make_batch returned a dict, which cannot be split"


def test_a_batch_moves_to_the_device_tensor_by_tensor():
    out = recsys._to((torch.zeros(1), [torch.ones(1)]), torch.device("meta"))
    assert type(out) is tuple and type(out[1]) is list
    assert out[0].device.type == "meta" and out[1][0].device.type == "meta"


def test_the_workers_command_line():
    opts = recsys.parse(["--plans", "a", "b", "--run-dirs", "x", "y"])
    assert (opts.plans, opts.run_dirs, opts.steps, opts.seed) == (["a", "b"], ["x", "y"], 5, 0)
    assert (opts.device, opts.dump_params) == ("cpu", False)
    opts = recsys.parse(["--plans", "a", "--run-dirs", "x", "--steps", "2", "--seed", "3",
                         "--device", "cuda", "--dump-params"])  # fmt: skip
    assert (opts.steps, opts.seed, opts.device, opts.dump_params) == (2, 3, "cuda", True)
    # run_recplan names the CPU explicitly: a misspelt choice would refuse every CPU run
    assert recsys.parse(["--plans", "a", "--run-dirs", "x", "--device", "cpu"]).device == "cpu"
    with pytest.raises(SystemExit):
        recsys.parse(["--plans", "a", "b", "--run-dirs", "x"])


@pytest.fixture
def recplan(tmp_path) -> Path:
    """The one-rank plan written to a file, for the model file copied beside it."""
    model = tmp_path / "dlrm.py"
    model.write_text(DLRM.read_text())
    plan = _plan(SGD, "fused")
    plan["model"].update(file=str(model), sha256=file_sha256(model))
    path = tmp_path / "plan" / "plan.json"
    path.parent.mkdir()
    path.write_text(json.dumps(plan))
    return path


class _Torchrun:
    def __init__(self, rc: int) -> None:
        self.rc, self.calls = rc, []

    def __call__(self, cmd, env=None, check=None):
        self.calls.append((cmd, env, check))
        return subprocess.CompletedProcess(cmd, self.rc)


def _opts(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"steps": 4, "seed": 1, **kw})


def test_a_recommendation_run_starts_torchrun_with_this_module(recplan, monkeypatch, capsys):
    run = _Torchrun(0)
    monkeypatch.setattr(subprocess, "run", run)
    assert recsys.run_recplan(recplan, _opts(device="cpu")) == 0
    ((cmd, env, check),) = run.calls
    assert cmd == [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
        "-m", "runtime.recsys", "--plans", str(recplan.resolve()),
        "--run-dirs", str(recplan.parent.resolve()), "--steps", "4", "--seed", "1",
        "--device", "cpu",
    ]  # fmt: skip
    assert env == worker_env() and check is False
    assert capsys.readouterr().out == f"metrics: {recplan.parent / 'metrics.jsonl'}\n"
    monkeypatch.setattr(subprocess, "run", _Torchrun(4))
    assert recsys.run_recplan(recplan, _opts(run_dir=recplan.parent / "r")) == 4
    assert capsys.readouterr().err == "plan run: the workers failed (exit status 4)\n"


@pytest.mark.parametrize(
    "flag, opts",
    [
        ("--checkpoint-every", {"checkpoint_every": 2}),
        ("--resume", {"resume": True}),
        ("--max-restarts", {"max_restarts": 1}),
        ("--nnodes", {"nnodes": 2}),
    ],
)
def test_what_a_recommendation_run_lacks_is_refused_by_name(recplan, monkeypatch, flag, opts):
    monkeypatch.setattr(subprocess, "run", _Torchrun(0))
    with pytest.raises(UserInputError) as err:
        recsys.run_recplan(recplan, _opts(**opts))
    assert str(err.value) == (
        f"{flag} is not supported for recommendation plans yet (no checkpoints or multi-node "
        "launch in runtime/recsys.py): run without it"
    )
    assert recsys.run_recplan(recplan, _opts(nnodes=1, checkpoint_every=0)) == 0


def test_a_changed_model_or_a_gpu_plan_on_the_cpu_is_refused(recplan, monkeypatch):
    monkeypatch.setattr(subprocess, "run", _Torchrun(0))
    data = json.loads(recplan.read_text())
    data["device"] = "cuda"
    recplan.write_text(json.dumps(data))
    with pytest.raises(UserInputError) as err:
        recsys.run_recplan(recplan, _opts(device="cpu"))
    assert str(err.value) == (
        f"plan {recplan} was made for GPUs (row-wise and host tables need CUDA): plan again "
        "with --device cpu"
    )
    model = Path(data["model"]["file"])
    model.write_text(model.read_text() + "\n")
    with pytest.raises(UserInputError) as err:
        recsys.run_recplan(recplan, _opts(device="cpu"))
    assert str(err.value) == (
        f"model file {model} is missing or changed since plan {recplan} was made: plan again"
    )
    model.unlink()
    with pytest.raises(UserInputError, match="is missing or changed"):
        recsys.run_recplan(recplan, _opts(device="cpu"))


def _launched(run: _Torchrun, flag: str) -> str:
    """The value torchrun's command line gave ``flag`` (the one launch recorded)."""
    ((cmd, _, _),) = run.calls
    return cmd[cmd.index(flag) + 1]


def test_the_device_asked_for_is_used_and_a_visible_gpu_otherwise(recplan, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU stood in as visible
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for opts, device in (({"device": "cpu"}, "cpu"), ({}, "cuda"), ({"device": None}, "cuda")):
        run = _Torchrun(0)
        monkeypatch.setattr(subprocess, "run", run)
        assert recsys.run_recplan(recplan, _opts(**opts)) == 0
        assert _launched(run, "--device") == device


def test_a_gpu_run_needs_as_many_gpus_as_the_plan_has_ranks(recplan, monkeypatch):
    """The one-rank plan on a node of one GPU starts; on a node of none it is refused."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    run = _Torchrun(0)
    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert recsys.run_recplan(recplan, _opts(device="cuda")) == 0
    assert _launched(run, "--device") == "cuda"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(UserInputError) as err:
        recsys.run_recplan(recplan, _opts(device="cuda"))
    assert str(err.value) == "the plan needs 1 GPUs, this node has 0"
    assert len(run.calls) == 1


def test_the_run_directory_asked_for_is_handed_to_the_workers(recplan, monkeypatch, capsys):
    run = _Torchrun(0)
    monkeypatch.setattr(subprocess, "run", run)
    where = recplan.parent / "elsewhere"
    assert recsys.run_recplan(recplan, _opts(device="cpu", run_dir=where)) == 0
    assert _launched(run, "--run-dirs") == str(where.resolve())
    assert capsys.readouterr().out == f"metrics: {where / 'metrics.jsonl'}\n"


def test_a_node_count_left_unset_is_one_node(recplan, monkeypatch):
    """``--nnodes`` unset (None, as launch's options may carry it) is one node, not refused."""
    run = _Torchrun(0)
    monkeypatch.setattr(subprocess, "run", run)
    assert recsys.run_recplan(recplan, _opts(device="cpu", nnodes=None)) == 0
    assert len(run.calls) == 1


class _Worker:
    """torch.distributed's group calls and ``train`` as ``main`` makes them, recorded (the
    module's one-rank group stays up: ``main`` neither makes nor ends it here)."""

    def __init__(self, monkeypatch, error: Exception | None = None) -> None:
        self.calls: list[tuple] = []
        self.error = error
        monkeypatch.setattr(recsys.dist, "init_process_group", self._init)
        monkeypatch.setattr(recsys.dist, "destroy_process_group", self._destroy)
        monkeypatch.setattr(recsys.dist, "barrier", self._barrier)
        monkeypatch.setattr(recsys, "train", self._train)
        monkeypatch.setattr(torch.cuda, "set_device", self._set_device)

    def _init(self, *args, **kwargs) -> None:
        self.calls.append(("init", args, kwargs))

    def _destroy(self, *args) -> None:
        self.calls.append(("destroy", *args))

    def _barrier(self, *args) -> None:
        self.calls.append(("barrier", *args))

    def _set_device(self, device) -> None:
        self.calls.append(("set_device", device))

    def _train(self, *args, **kwargs) -> None:
        self.calls.append(("train", args, kwargs))
        if self.error is not None:
            raise self.error


def test_the_worker_trains_each_plan_in_its_run_directory_then_leaves_with_the_others(
    recplan, monkeypatch, tmp_path
):
    """gloo on the CPU; each plan file read and trained in order, then one barrier for all
    plans and the group ended; sys.argv read when no arguments are given."""
    second = tmp_path / "second.json"
    data = json.loads(recplan.read_text())
    data["lr"] = 0.25
    second.write_text(json.dumps(data))
    worker = _Worker(monkeypatch)
    argv = ["--plans", str(recplan), str(second), "--run-dirs", "x", "y", "--steps", "2",
            "--seed", "3", "--dump-params"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["runtime.recsys", *argv])
    assert recsys.main() == 0
    first = json.loads(recplan.read_text())
    cpu = torch.device("cpu")
    assert worker.calls == [
        ("init", ("gloo",), {}),
        ("train", (first, Path("x"), 2, 3, cpu, True), {}),
        ("train", (data, Path("y"), 2, 3, cpu, True), {}),
        ("barrier",),
        ("destroy",),
    ]


@pytest.mark.parametrize("local_rank, index", [("3", 3), (None, 0)])
def test_a_gpu_worker_takes_nccl_and_its_local_rank_s_gpu(recplan, monkeypatch, local_rank, index):
    worker = _Worker(monkeypatch)
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    argv = ["--plans", str(recplan), "--run-dirs", "x", "--device", "cuda"]
    assert recsys.main(argv) == 0
    gpu = torch.device("cuda", index)
    plan = json.loads(recplan.read_text())
    assert worker.calls == [
        ("init", ("nccl",), {}),
        ("set_device", gpu),
        ("train", (plan, Path("x"), 5, 0, gpu, False), {}),
        ("barrier",),
        ("destroy",),
    ]


def test_a_worker_that_meets_a_users_error_says_it_and_exits_with_its_status(
    recplan, monkeypatch, capsys
):
    """The error printed on stderr, its exit status returned, no barrier, the group ended."""
    worker = _Worker(monkeypatch, UserInputError("a.py: a recommendation model file must ..."))
    assert recsys.main(["--plans", str(recplan), "--run-dirs", "x"]) == 2
    assert [c[0] for c in worker.calls] == ["init", "train", "destroy"]
    assert capsys.readouterr().err == (
        "plan run: error: a.py: a recommendation model file must ...\n"
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--plans", "a", "b", "--run-dirs", "x"],
         "--plans and --run-dirs need the same number of entries"),
        (["--run-dirs", "x"], "the following arguments are required: --plans"),
        (["--plans", "a"], "the following arguments are required: --run-dirs"),
    ],
)  # fmt: skip
def test_a_bad_worker_command_line_is_refused_under_the_modules_name(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        recsys.parse(argv)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"runtime.recsys: error: {message}"


def test_a_device_other_than_cpu_or_cuda_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        recsys.parse(["--plans", "a", "--run-dirs", "x", "--device", "tpu"])
    assert exit_.value.code == 2
    line = capsys.readouterr().err.splitlines()[-1]
    # argparse quotes the choices on some Python versions and not on others
    assert line.replace("'", "") == (
        "runtime.recsys: error: argument --device: invalid choice: tpu (choose from cpu, cuda)"
    )


def test_the_workers_help_says_what_dump_params_is_for(capsys, monkeypatch):
    """``--help`` names --dump-params' use (a file for the tests, not for users); the help is
    wrapped to a fixed width so that the line is the same on every terminal."""
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exit_:
        recsys.parse(["--help"])
    assert exit_.value.code == 0
    lines = [ln.strip() for ln in capsys.readouterr().out.splitlines()]
    assert "--dump-params         save params.pt (for tests)" in lines
