"""Tests written for mutmut's generated mutants of runtime/build.py's ``_build_pipeline`` (a
pipeline rank's stages and schedule; benchmarks/generated_mutants.py). It runs only at pp > 1,
which no one-rank ``build`` reaches, so it is called here directly, two ways:

- every step stood in and recorded (a stand-in pipe, mesh and model; the plan's mesh a real
  ``Mesh``), each call's arguments bound to the real function's signature, against the calls
  written by hand for an interleaved plan with expert parallelism on a GPU, an uneven
  1F1B plan and a GPipe plan, from a rank of either pipeline rank (milliseconds each);
- the real build of the tiny MLP's pp = 2 plan in one process, as rank 0 and as rank 1 (the
  rank stood in: ``dist.get_rank`` of build.py alone; the mesh a real one-rank (1, 1, 1)
  one): each holds its stage's layers, the seeded model's own tensors, and the two stages
  chained compute the model's output and loss.

Real ranks training pipeline plans against the one-process oracle are
tests/test_runtime_oracle.py's pp 2 cases (a launch each, too slow for a kill file: a two-rank
launch here doubled the file's CPU time; ranks forked from this process hung in torch's
export machinery now and then, as a fork of a process with torch's threads may).

docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import inspect
from types import SimpleNamespace as NS

import pytest
import torch
import torch.distributed.pipelining as pipelining
import torch.distributed.pipelining._IR as pipelining_ir
from kept_traces import traced_pipeline_kept
from recorders import bound_arguments
from runs import forced_plan

import runtime.block_calls
import runtime.build as b
from planner.modelfile import load_model_file
from planner.schema import Mesh, load_plan
from runtime import stages

CPU = torch.device("cpu")
CUDA = torch.device("cuda")  # a device object only: every step that would use it is stood in

# --------------------------------------------------------------------------- stand-ins


class _Dim:
    """One dimension of a stand-in DeviceMesh: its group is a label."""

    def __init__(self, name: str) -> None:
        self.name = name

    def get_group(self) -> str:
        return f"group-{self.name}"

    def __repr__(self) -> str:
        return f"<dim {self.name}>"


class _Mesh(dict):
    """A stand-in DeviceMesh: ``mesh[name]`` is its dimension (a KeyError for any other)."""

    def __init__(self, *names: str) -> None:
        super().__init__({n: _Dim(n) for n in names})


class _StageMod:
    """A stage module of the stand-in pipe: ``to`` is recorded."""

    def __init__(self, i: int, log: list) -> None:
        self.i, self.log = i, log

    def to(self, device):  # noqa: ANN001, ANN201
        self.log.append(("to", self, device))
        return self

    def __repr__(self) -> str:
        return f"<stage module {self.i}>"


class _Pipe:
    """torch's Pipe as ``_build_pipeline`` uses it: stage modules, the split graph module
    (``register_module`` recorded), ``build_stage`` recorded, and what ``traced_pipe`` sets."""

    def __init__(self, n: int, log: list) -> None:
        self.num_stages = n
        self.mods = [_StageMod(i, log) for i in range(n)]
        self.meshplan_block_calls = {"layers.0": "kept call"}
        self.meshplan_outputs = "layout"
        self.log = log
        self.split_gm = NS(register_module=self._register)

    def _register(self, name, module) -> None:  # noqa: ANN001
        self.log.append(("register_module", name, module))

    def get_stage_module(self, i: int) -> _StageMod:
        return self.mods[i]

    def build_stage(self, stage_index, device, group=None) -> str:  # noqa: ANN001
        self.log.append(("build_stage", stage_index, device, group))
        return f"stage-{stage_index}"


def _recorder(log: list, name: str, real, returns, keep: int | None = None):  # noqa: ANN001
    """A stand-in for ``real``: its arguments bound to ``real``'s signature (defaults filled
    in; a missing or unknown argument is a TypeError, as for the real one) and recorded as
    ``(name, *values)`` (the first ``keep`` only, where given); ``returns(*values)`` is what
    it returns, where callable, else ``returns`` itself."""
    sig = inspect.signature(real)

    def call(*args, **kwargs):  # noqa: ANN202
        values = tuple(bound_arguments(sig, args, kwargs).values())
        log.append((name, *values[:keep]))
        return returns(*values) if callable(returns) else returns

    return call


def _batch(batch_size: int, step: int = 0):  # noqa: ANN202 - ModelFile.batch's signature
    raise AssertionError("stood in")


INPUTS, SLICE, MB0, MB1 = "inputs", "slice", "micro-batch 0", "micro-batch 1"
MODEL, TIED, OPTS, LINKS = "model", "tied", "optimizers", "links"
NAMES = {"w": ["w"]}  # parameter_names: one name each, so no aliases
POINTS = ["layers.2"]
NOTE_KEPT = (
    "stage 0 keeps u1, u2, u3 ...: the forward reads them nowhere, so no stage's code holds "
    "them; they are checkpointed as they are"
)
NOTE_GATHERED = (
    "stage 0: g1, g2 run with replicated activations: the code around them is traced with "
    "fixed shapes, so it cannot take local shards"
)
NOTE_AUTOCAST = (
    "stage 2: ZeRO-1 holds it in DDP, which casts nothing, and the pipeline's schedule runs "
    "backward beside forward, where torch.autocast does not belong: it trains in fp32, not "
    "the plan's 16-bit dtype (plan with ZeRO 0, 2 or 3)"
)


def _plan(mesh: Mesh, schedule: str, stage_list: list[NS]) -> NS:
    """The fields of a plan ``_build_pipeline`` reads; the stages' own fields by hand."""
    return NS(
        global_batch_size=24,
        micro_batch_size=2,
        mesh=mesh,
        schedule=schedule,
        blocks=["block a", "block b"],
        stages=stage_list,
        stages_of=lambda r: [st for st in stage_list if st.pp_rank == r],
    )


def _stage(index: int, pp_rank: int, local: int, m: int) -> NS:
    return NS(index=index, pp_rank=pp_rank, local_batch_size=local, num_microbatches=m)


def _stood_in(monkeypatch, rank: int, plan: NS, n_stages: int, calls, gathered, autocast):  # noqa: ANN001, ANN202
    """Every step of ``_build_pipeline`` stood in and recorded; returns the log, the pipe,
    the cache and the expert mesh.
    ``gathered`` and ``autocast``: what TP gathers and the DDP autocast dtype, per stage."""
    log: list = []
    pipe = _Pipe(n_stages, log)
    pipe.calls_handed = calls  # what module_calls returns, handed on to traced_pipe
    cache = b.RuntimeCache()

    def rec(where, name, returns, keep=None):  # noqa: ANN001, ANN202
        monkeypatch.setattr(where, name, _recorder(log, name, getattr(where, name), returns, keep))

    monkeypatch.setattr(b, "dist", NS(get_rank=lambda: rank))
    rec(b, "dp_slice", SLICE)
    rec(b, "micro_batches", [MB0, MB1])
    rec(runtime.block_calls, "module_calls", calls)
    rec(stages, "traced_pipe", pipe)
    rec(stages, "split_points", POINTS)
    rec(stages, "adopt_eager_modules", ["swapped"])
    rec(stages, "sequence_stream_links", LINKS)
    rec(stages, "keep_unused_tensors", ["u1", "u2", "u3", "u4"])
    rec(b, "untie_between", None)
    rec(b, "parameter_names", NAMES)
    rec(b, "tied_grads", TIED)
    emesh = _Mesh("pp", "edp", "ep", "tp")
    rec(b, "expert_mesh", emesh)
    rec(b, "apply_expert_parallel", lambda mod, *_: [f"ea{mod.i}"])
    rec(pipelining_ir, "_modify_graph_op_device", None)
    rec(b, "_batchnorm", None)
    rec(b, "apply_recompute", None)
    rec(b, "apply_tensor_parallel", lambda mod, *_: gathered[mod.i])
    rec(stages, "send_sequence_shards", None)
    rec(b, "grad_sum_modules", lambda mod, *_: [f"sum{mod.i}"])
    rec(b, "shard_experts", lambda mod, *_: [f"x{mod.i}"])
    rec(b, "scalar_parameters", lambda mod, *_: [f"s{mod.i}"] if mod.i == 0 else [])
    rec(b, "apply_data_parallel", lambda mod, *_: f"wrapped{mod.i}")
    rec(b, "ddp_autocast_dtype", lambda wrapped, *_: autocast[int(wrapped[-1])])
    rec(stages, "stage_module_name", lambda i: f"submod_{i}")
    rec(b, "release_consumed_buffers", lambda s: f"released {s}")
    rec(b, "uneven_stage", lambda s, *_: f"uneven {s}")
    rec(b, "_gather", "gather")
    rec(b, "_loss_fn", "loss")
    for cls in ("ScheduleInterleaved1F1B", "Schedule1F1B", "ScheduleGPipe"):
        rec(pipelining, cls, f"a {cls}", keep=3)
    rec(b, "make_optimizers", OPTS)
    return log, pipe, cache, emesh


def _mf(log: list) -> NS:
    return NS(batch=_recorder(log, "batch", _batch, (INPUTS, "targets")))


# --------------------------------------------------------------------------- recorded builds


def _interleaved(monkeypatch, rank: int):  # noqa: ANN001, ANN202
    """An interleaved plan of 4 stages on pp 2 (stages 0 and 2 on pipeline rank 0, 1 and 3
    on 1), dp 6 = 3 copies of ep 2 experts, tp 5; on a GPU; the blocks' calls known (one
    tensor for "a" and "c"); stage 0's TP gathers two blocks, stage 2's DDP would autocast."""
    mesh = Mesh(pp=2, dp=6, tp=5, ep=2)
    st = [_stage(i, i % 2, 4, 2) for i in range(4)]
    plan = _plan(mesh, "interleaved_1f1b", st)
    calls = {"a": NS(one_tensor=True), "b": NS(one_tensor=False), "c": NS(one_tensor=True)}
    gathered = {0: ["g1", "g2"], 1: [], 2: [], 3: []}
    autocast = {0: None, 1: None, 2: torch.bfloat16, 3: None}
    log, pipe, cache, emesh = _stood_in(monkeypatch, rank, plan, 4, calls, gathered, autocast)
    dev_mesh = _Mesh("pp", "dp", "tp")
    mf = _mf(log)
    notes = ["given"]
    built = b._build_pipeline(plan, mf, MODEL, dev_mesh, CUDA, notes, cache)
    return built, log, pipe, cache, emesh, plan, mf, dev_mesh, notes


def _preamble(plan, pipe, cache, one_tensor, local: int):  # noqa: ANN001, ANN202
    """The calls before the stages' own: the example micro-batch, the trace, each stage's
    eager modules adopted, the stream's links."""
    out = [
        ("batch", plan.global_batch_size, 0),
        ("dp_slice", INPUTS, 0, local),
        ("micro_batches", SLICE, local, 2),
        ("module_calls", MODEL, MB0),
        ("traced_pipe", plan, MODEL, MB0, cache.pipes, pipe.calls_handed),
    ]
    for mod in pipe.mods:
        out += [
            ("split_points", plan, MODEL),
            ("adopt_eager_modules", mod, MODEL, POINTS, one_tensor, {"layers.0": "kept call"}),
        ]
    return out + [("sequence_stream_links", pipe, plan)]


def test_an_interleaved_rank_builds_stages_0_and_2_with_experts_on_a_gpu(monkeypatch):
    """Rank 7 of 60 (pp 2 x dp 6 x tp 5: pipeline rank 0, dp rank 1): stages 0 and 2 built in
    order, every step handed the stage module, the plan's blocks and the mesh dimension it
    reduces or shards over; the unused tensors kept on stage 0 and noted; the experts of
    both stages gathered, the scalars of stage 0 with the dp group; the interleaved
    schedule over both stages; each note in order."""
    built, log, pipe, cache, emesh, plan, mf, mesh, notes = _interleaved(monkeypatch, 7)
    m0, m1, m2, m3 = pipe.mods
    tp, dp = mesh["tp"], mesh["dp"]
    want = _preamble(plan, pipe, cache, {"a", "c"}, 4)
    want += [
        ("keep_unused_tensors", [m0, m1, m2, m3], MODEL, m0),
        ("untie_between", [m0, m2]),
        ("parameter_names", MODEL),
        ("tied_grads", NAMES, [m0, m2], plan.mesh, cache.groups),
    ]
    for mod, gathered, experts, scalars in (
        (m0, ["g1", "g2"], {"x0"}, ["s0"]),
        (m2, [], {"x0", "x2"}, []),
    ):
        i = mod.i
        want += [
            ("to", mod, CUDA),
            ("expert_mesh", CUDA, 2, 6, 2, 5, cache),
            ("apply_expert_parallel", mod, emesh["ep"], True),
            ("_modify_graph_op_device", mod, CUDA),
            ("_batchnorm", mod, plan, mesh, CUDA),
            ("apply_recompute", mod, plan.blocks, True, tp),
            ("apply_tensor_parallel", mod, plan.blocks, tp),
            ("send_sequence_shards", mod, plan, i, tp, LINKS),
            ("grad_sum_modules", mod, plan.blocks, gathered),
            ("apply_recompute", mod, plan.blocks, False, None),
            ("shard_experts", mod, [f"ea{i}"], emesh["edp"], plan, CUDA),
            ("scalar_parameters", mod, experts),
            ("apply_data_parallel", mod, plan.blocks, plan, dp, CUDA, experts | set(scalars)),
            ("ddp_autocast_dtype", f"wrapped{i}", plan, CUDA),
            ("stage_module_name", i),
            ("register_module", f"submod_{i}", f"wrapped{i}"),
            ("build_stage", i, CUDA, "group-pp"),
            ("release_consumed_buffers", f"stage-{i}"),
        ]
    want += [
        ("_gather", mf, mesh),
        ("_loss_fn", mf, "layout", "gather"),
        ("ScheduleInterleaved1F1B", ["released stage-0", "released stage-2"], 2, "loss"),
        ("make_optimizers", ["wrapped0", "wrapped2"], plan, dp, ["x0", "x2"]),
    ]
    assert log == want
    assert built.plan is plan and built.mesh is mesh
    assert built.parts == ["wrapped0", "wrapped2"] and built.optimizers == OPTS
    assert built.schedule == "a ScheduleInterleaved1F1B" and built.stage_indices == [0, 2]
    assert built.notes is notes
    assert notes == ["given", NOTE_KEPT, NOTE_GATHERED, NOTE_AUTOCAST]
    assert built.expert_params == ["x0", "x2"] and built.edp_group == "group-edp"
    assert built.tied == TIED and built.aliases == {}
    assert built.tp_grad_sums == ["sum0", "sum2"]
    assert built.scalars == [(["s0"], "group-dp")]
    assert built.autocast is None and built.gather is None


def test_the_other_pipeline_rank_builds_stages_1_and_3_and_keeps_nothing(monkeypatch):
    """Rank 31 (pipeline rank 1, dp rank 0): stages 1 and 3, no unused tensors kept (stage 0
    is not its), the first stage's batch still the example."""
    built, log, pipe, cache, emesh, plan, mf, mesh, notes = _interleaved(monkeypatch, 31)
    m0, m1, m2, m3 = pipe.mods
    assert [e[0] for e in log[:5]] == ["batch", "dp_slice", "micro_batches", "module_calls",
                                       "traced_pipe"]  # fmt: skip
    assert ("untie_between", [m1, m3]) in log
    assert not [e for e in log if e[0] == "keep_unused_tensors"]
    assert [e[1] for e in log if e[0] == "to"] == [m1, m3]
    assert [e[1:] for e in log if e[0] == "build_stage"] == [(1, CUDA, "group-pp"),
                                                           (3, CUDA, "group-pp")]  # fmt: skip
    assert built.stage_indices == [1, 3] and notes == ["given"]
    assert built.expert_params == ["x1", "x3"] and built.scalars == []
    assert ("ScheduleInterleaved1F1B", ["released stage-1", "released stage-3"], 2, "loss") in log


def _uneven(monkeypatch, rank: int, schedule: str = "1f1b"):  # noqa: ANN001, ANN202
    """pp 2 with dp 1 then 2 (an uneven mesh: ranks 0 | 1, 2), one stage each; global batch
    24 in micro-batches of 2: stage 0 runs 24 rows in 12, each replica of stage 1 12 rows
    in 6; on the CPU, no expert parallelism, the blocks' calls not known."""
    mesh = Mesh(pp=2, dp=2, tp=1, stage_dp=(1, 2))
    st = [_stage(0, 0, 24, 12), _stage(1, 1, 12, 6)]
    plan = _plan(mesh, schedule, st)
    none = {0: [], 1: []}
    log, pipe, cache, emesh = _stood_in(monkeypatch, rank, plan, 2, None, none, {0: None, 1: None})
    dev_mesh = _Mesh("pp", "dp", "tp")
    mf = _mf(log)
    built = b._build_pipeline(plan, mf, MODEL, dev_mesh, CPU, [], cache)
    return built, log, pipe, cache, plan, mf, dev_mesh


def test_an_uneven_rank_of_the_second_stage_routes_its_stage(monkeypatch):
    """Rank 1 (pipeline rank 1, the first of its two replicas): the example is stage 0's
    batch (24 rows), no expert mesh, no device rewrite on the CPU, the blocks' calls None;
    its stage routed by the uneven mesh over its replicas' 6 x 2 micro-batches of a step;
    the 1F1B schedule over its one stage, 6 micro-batches."""
    built, log, pipe, cache, plan, mf, mesh = _uneven(monkeypatch, 1)
    m0, m1 = pipe.mods
    tp, dp = mesh["tp"], mesh["dp"]
    want = _preamble(plan, pipe, cache, None, 24)
    want += [
        ("untie_between", [m1]),
        ("parameter_names", MODEL),
        ("tied_grads", NAMES, [m1], plan.mesh, cache.groups),
        ("to", m1, CPU),
        ("_batchnorm", m1, plan, mesh, CPU),
        ("apply_recompute", m1, plan.blocks, True, tp),
        ("apply_tensor_parallel", m1, plan.blocks, tp),
        ("send_sequence_shards", m1, plan, 1, tp, LINKS),
        ("grad_sum_modules", m1, plan.blocks, []),
        ("apply_recompute", m1, plan.blocks, False, None),
        ("scalar_parameters", m1, set()),
        ("apply_data_parallel", m1, plan.blocks, plan, dp, CPU, set()),
        ("ddp_autocast_dtype", "wrapped1", plan, CPU),
        ("stage_module_name", 1),
        ("register_module", "submod_1", "wrapped1"),
        ("build_stage", 1, CPU, "group-pp"),
        ("release_consumed_buffers", "stage-1"),
        ("uneven_stage", "released stage-1", plan.mesh, 12),
        ("_gather", mf, mesh),
        ("_loss_fn", mf, "layout", "gather"),
        ("Schedule1F1B", "uneven released stage-1", 6, "loss"),
        ("make_optimizers", ["wrapped1"], plan, dp, []),
    ]
    assert log == want
    assert isinstance(log[-2][2], int)
    assert built.schedule == "a Schedule1F1B" and built.stage_indices == [1]
    assert built.edp_group is None and built.expert_params == [] and built.notes == []
    assert built.tp_grad_sums == ["sum1"] and built.scalars == []


def test_an_uneven_first_stage_keeps_its_own_count(monkeypatch):
    """Rank 0 (pipeline rank 0, one replica): stage 0's 12 micro-batches; GPipe."""
    built, log, pipe, cache, plan, mf, mesh = _uneven(monkeypatch, 0, "gpipe")
    assert ("uneven_stage", "released stage-0", plan.mesh, 12) in log
    assert log[-2] == ("ScheduleGPipe", "uneven released stage-0", 12, "loss")
    assert built.schedule == "a ScheduleGPipe" and built.stage_indices == [0]
    assert built.parts == ["wrapped0"] and built.scalars == [(["s0"], "group-dp")]


def test_an_even_mesh_leaves_the_stage_to_torch(monkeypatch):
    """pp 2 x dp 1: rank 1 builds stage 1 with torch's stage as it is (no routing)."""
    mesh = Mesh(pp=2, dp=1, tp=1)
    plan = _plan(mesh, "1f1b", [_stage(0, 0, 24, 12), _stage(1, 1, 24, 12)])
    log, pipe, cache, _ = _stood_in(monkeypatch, 1, plan, 2, None, {0: [], 1: []}, {1: None})
    built = b._build_pipeline(plan, _mf(log), MODEL, _Mesh("pp", "dp", "tp"), CPU, [], cache)
    assert not [e for e in log if e[0] == "uneven_stage"]
    assert log[-2] == ("Schedule1F1B", "released stage-1", 12, "loss")
    assert built.stage_indices == [1] and built.edp_group is None


def test_aliases_are_each_parameters_other_names(monkeypatch):
    """A tied weight's other names, by its first; a parameter of one name has none."""
    mesh = Mesh(pp=2, dp=1, tp=1)
    plan = _plan(mesh, "1f1b", [_stage(0, 0, 24, 12), _stage(1, 1, 24, 12)])
    log, pipe, cache, _ = _stood_in(monkeypatch, 0, plan, 2, None, {0: [], 1: []}, {0: None})
    names = {"w": ["w"], "emb": ["emb", "head"], "t": ["t", "t2", "t3"]}
    monkeypatch.setattr(b, "parameter_names", lambda model: names)
    built = b._build_pipeline(plan, _mf(log), MODEL, _Mesh("pp", "dp", "tp"), CPU, [], cache)
    assert built.aliases == {"emb": ["head"], "t": ["t2", "t3"]}


# --------------------------------------------------------------------------- the real build


@pytest.fixture(autouse=True)
def _kept_traces(monkeypatch):
    """torch's split of each model traced once a session (tests/kept_traces.py)."""
    monkeypatch.setattr(stages, "traced_pipeline", traced_pipeline_kept)


@pytest.fixture(scope="module")
def mlp_pp2(tmp_path_factory):
    """The tiny MLP's plan on two ranks, pp 2 (1F1B, micro-batches of 2: 4 a step), SGD at
    lr 0.1 (not the model file's AdamW at 1e-3: the optimizer shows it is the plan's), and
    its file."""
    path = forced_plan("mlp", 2, tmp_path_factory.mktemp("pp2"), tp=1, dp=1, pp=2, zero=0,
                       micro_batch_size=2, recompute="none", schedule="1f1b",
                       optimizer="sgd", lr=0.1)  # fmt: skip
    plan = load_plan(path)
    return plan, load_model_file(plan.model.file, plan.model.args)


# Each pipeline rank's stage: the MLP's modules it holds (the plan's cut, written out)
HELD = {0: ("proj.", "layers.0."), 1: ("layers.1.", "layers.2.", "layers.3.", "norm.", "head.")}


def _seeded(mf, seed: int = 0):  # noqa: ANN001, ANN202
    torch.manual_seed(seed)
    model = mf.build()
    model.train()
    return model


def test_each_rank_holds_its_stages_layers_the_models_own_tensors(mlp_pp2, one_rank, monkeypatch):
    """The real build in one process, as pipeline rank 0 and then 1 (build.py's
    ``dist.get_rank`` stood in; a real one-rank mesh): each rank holds one stage, its
    layers' parameters the seeded model's own tensors; its schedule 1F1B over that stage
    (4 micro-batches, the mesh's pp group) with the model file's loss; one SGD optimizer at
    lr 0.1 over the stage's parameters; the two stages chained compute the model's output,
    loss and gradients."""
    from torch.distributed.device_mesh import init_device_mesh

    plan, mf = mlp_pp2
    assert [(s.index, s.pp_rank) for s in plan.stages] == [(0, 0), (1, 1)]
    mesh = init_device_mesh("cpu", (1, 1, 1), mesh_dim_names=("pp", "dp", "tp"))
    ref = dict(_seeded(mf).named_parameters())
    cache = b.RuntimeCache()
    parts = {}
    for r in (0, 1):
        monkeypatch.setattr(b, "dist", NS(get_rank=lambda r=r: r))
        model = _seeded(mf)
        built = b._build_pipeline(plan, mf, model, mesh, CPU, [], cache)
        assert built.stage_indices == [r] and built.plan is plan and built.mesh is mesh
        (part,) = built.parts
        held = dict(part.named_parameters())
        own = dict(model.named_parameters())
        assert sorted(held) == sorted(k for k in ref if k.startswith(HELD[r]))
        for k, p in held.items():
            assert p is own[k] and torch.equal(p, ref[k]), k
        schedule = built.schedule
        assert type(schedule).__name__ == "Schedule1F1B"
        assert schedule._n_microbatches == 4
        assert schedule._stage.stage_index == r and schedule._stage.num_stages == 2
        assert schedule._stage.group is mesh["pp"].get_group()
        (opt,) = built.optimizers
        assert type(opt) is torch.optim.SGD and opt.param_groups[0]["lr"] == 0.1
        assert [id(p) for p in opt.param_groups[0]["params"]] == [id(p) for p in part.parameters()]
        assert built.notes == [] and built.aliases == {} and built.tied.names == {}
        assert built.expert_params == [] and built.edp_group is None and built.scalars == []
        assert built.tp_grad_sums == []
        parts[r] = (part, schedule)
    x, y = mf.batch(8, step=0)
    whole = _seeded(mf)
    want = whole(x[0][:2])
    mf.loss(want, y[:2]).backward()
    out = parts[1][0](parts[0][0](x[0][:2]))
    assert torch.allclose(out, want, atol=1e-6)
    loss = parts[1][1]._loss_fn(out, y[:2])
    assert torch.allclose(loss, mf.loss(want, y[:2]), atol=1e-6)
    loss.backward()
    grads = {n: p.grad for r in (0, 1) for n, p in parts[r][0].named_parameters()}
    assert sorted(grads) == sorted(ref)
    for n, p in whole.named_parameters():
        assert torch.allclose(grads[n], p.grad, atol=1e-6), n


def test_build_hands_a_pipeline_plan_to_build_pipeline(mlp_pp2, monkeypatch):
    """``build`` of a pp 2 plan (its mesh stood in: one rank cannot make a (2, 1, 1) one)
    hands ``_build_pipeline`` the plan, the model file, the model seeded and built in train
    mode, the mesh, the device, its notes and the cache, and returns what it builds."""
    plan, mf = mlp_pp2
    mesh, cache, seen = object(), b.RuntimeCache(), []
    monkeypatch.setattr(b, "device_mesh", lambda device, plan_mesh, cache_: mesh)

    def build_pipeline(plan_, mf_, model, mesh_, device, notes, cache_):  # noqa: ANN001, ANN202
        seen.append((plan_, mf_, model, mesh_, device, notes, cache_))
        return "built"

    monkeypatch.setattr(b, "_build_pipeline", build_pipeline)
    assert b.build(plan, mf, CPU, seed=3, cache=cache) == "built"
    ((plan_, mf_, model, mesh_, device, notes, cache_),) = seen
    assert plan_ is plan and mf_ is mf and mesh_ is mesh and device == CPU
    assert notes == [] and cache_ is cache
    assert model.training
    ref = dict(_seeded(mf, 3).named_parameters())
    got = dict(model.named_parameters())
    assert sorted(got) == sorted(ref) and all(torch.equal(got[k], ref[k]) for k in ref)
