"""Tests written for mutmut's generated mutants of runtime/train.py (the training loop;
benchmarks/generated_mutants.py). One process: ``train_plan`` itself on a one-rank gloo group
held in the test (a HashStore, no launch), the tiny MLP at micro-batch 4 of 8 (two micro-batches
accumulated), against the one-process oracle (tests/oracle.py): its losses, the parameters a
checkpoint holds, metrics.jsonl and the lines rank 0 prints, for a run and for a resume.
tests/test_resume_step.py runs the same resume through the worker; docs/mutation.md names the
mutants each test kills."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import sys
import time
from types import SimpleNamespace

import pytest
import torch
from oracle import checkpoint_model_state, parameter_mismatches, reference_for_plan
from runs import forced_plan

from planner.modelfile import load_model_file
from planner.schema import load_plan
from runtime.train import LossNotFinite, train_plan

RTOL = 1e-4


pytestmark = pytest.mark.usefixtures("gloo_one_rank")  # conftest: a one-rank gloo group


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    path = forced_plan("mlp", 1, tmp_path_factory.mktemp("plan"), tp=1, dp=1, pp=1, zero=0,
                       micro_batch_size=4, recompute="none")  # fmt: skip
    doc = json.loads(path.read_text())
    plan = load_plan(path)
    return plan, load_model_file(plan.model.file, plan.model.args), reference_for_plan(doc, 3)


def _close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert abs(g - w) <= RTOL * abs(w), (got, want)


def _metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_three_steps_train_as_one_process_does(mlp, tmp_path, capsys):
    """Losses and the checkpoint at step 3 equal the oracle's; metrics.jsonl has a line per
    step (its loss, a positive rate in samples per second, this rank's peak) and rank 0
    prints each step and the checkpoint."""
    plan, mf, ref = mlp
    run = tmp_path / "run"
    losses = train_plan(plan, mf, torch.device("cpu"), steps=3, seed=0, run_dir=run,
                        checkpoint_every=3)  # fmt: skip
    _close(losses, ref.losses)
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_000003"]
    got = checkpoint_model_state(run / "checkpoints" / "step_000003")
    assert parameter_mismatches(got, ref) == []
    records = _metrics(run)
    assert [r["step"] for r in records] == [1, 2, 3]
    _close([r["loss"] for r in records], ref.losses)
    for r in records:
        assert set(r) == {"step", "loss", "step_time_s", "samples_per_s", "peak_memory_bytes"}
        assert r["step_time_s"] > 0 and r["samples_per_s"] > 0
        assert abs(r["samples_per_s"] * r["step_time_s"] - 8) < 1e-6 * 8  # 8 samples a step
        assert len(r["peak_memory_bytes"]) == 1 and r["peak_memory_bytes"][0] > 2**20
    out = capsys.readouterr().out
    printed = [float(x) for x in re.findall(r"^step [123]/3  loss ([0-9.]+)  ", out, re.M)]
    assert len(printed) == 3 and max(abs(g - w) for g, w in zip(printed, ref.losses)) < 1e-5
    assert f"checkpoint {run / 'checkpoints' / 'step_000003'}\n" in out
    assert "resuming" not in out


def test_a_resume_after_step_2_trains_step_3_once(mlp, tmp_path, capsys):
    """Steps 1-2 with a checkpoint every step, then a resume to step 3: it trains step 3
    alone (one loss, the oracle's third), its checkpoint equals the oracle's parameters after
    step 3, and metrics.jsonl keeps steps 1 and 2 and adds 3."""
    plan, mf, ref = mlp
    run = tmp_path / "run"
    _close(train_plan(plan, mf, torch.device("cpu"), steps=2, seed=0, run_dir=run,
                      checkpoint_every=1), ref.losses[:2])  # fmt: skip
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step_000001",
        "step_000002",
    ]
    capsys.readouterr()
    losses = train_plan(plan, mf, torch.device("cpu"), steps=3, seed=0, run_dir=run,
                        checkpoint_every=1, resume=True)  # fmt: skip
    _close(losses, ref.losses[2:])
    got = checkpoint_model_state(run / "checkpoints" / "step_000003")
    assert parameter_mismatches(got, ref) == []
    assert [r["step"] for r in _metrics(run)] == [1, 2, 3]
    out = capsys.readouterr().out
    assert f"resuming from {run / 'checkpoints' / 'step_000002'} (step 2)\n" in out
    assert "step 3/3" in out and "step 2/3" not in out


def test_without_resume_a_run_starts_at_step_1(mlp, tmp_path):
    """A checkpoint in the run directory is ignored unless ``resume``."""
    plan, mf, ref = mlp
    run = tmp_path / "run"
    train_plan(plan, mf, torch.device("cpu"), steps=1, seed=0, run_dir=run, checkpoint_every=1)
    losses = train_plan(plan, mf, torch.device("cpu"), steps=2, seed=0, run_dir=run)
    _close(losses, ref.losses[:2])
    assert [r["step"] for r in _metrics(run)] == [1, 2]


def test_a_loss_that_is_not_finite_stops_the_run_in_one_line(mlp, tmp_path, monkeypatch):
    """A model whose loss is inf at step 1 (its loss function scaled by inf)."""
    plan, mf, _ = mlp
    loss = mf.loss
    monkeypatch.setattr(mf, "loss", lambda out, y, gather=None: loss(out, y, gather) * torch.inf)
    with pytest.raises(LossNotFinite) as err:
        train_plan(plan, mf, torch.device("cpu"), steps=2, seed=0, run_dir=tmp_path / "run")
    assert str(err.value) == (
        "loss became inf at step 1: lower the learning rate or check the model's numerics"
    )
    assert err.value.exit_code == 3


def test_accumulated_micro_batches_average_their_gradients_under_sgd(tmp_path):
    """AdamW's update does not see a gradient's scale; SGD's does: two steps of SGD with
    momentum over two micro-batches of 4 equal the oracle's parameters only if each
    micro-batch's loss is divided by 2."""
    path = forced_plan("mlp", 1, tmp_path / "plan", optimizer="sgd", lr=0.1, tp=1, dp=1, pp=1,
                       zero=0, micro_batch_size=4, recompute="none")  # fmt: skip
    plan = load_plan(path)
    mf = load_model_file(plan.model.file, plan.model.args)
    ref = reference_for_plan(json.loads(path.read_text()), 2)
    run = tmp_path / "run"
    _close(train_plan(plan, mf, torch.device("cpu"), steps=2, seed=0, run_dir=run,
                      checkpoint_every=2), ref.losses)  # fmt: skip
    got = checkpoint_model_state(run / "checkpoints" / "step_000002")
    assert parameter_mismatches(got, ref) == []


def test_a_batch_moves_to_the_device_tensors_only():
    """The meta device stands for a GPU (a batch left on the host would not run there)."""
    from runtime.train import _to

    x, n, (y,) = _to((torch.ones(2), 3, [torch.zeros(1)]), torch.device("meta"))
    assert x.device.type == "meta" and y.device.type == "meta" and n == 3


def test_the_watchdog_is_armed_for_a_positive_timeout_only(monkeypatch):
    import faulthandler

    from runtime.train import arm_watchdog

    armed = []
    monkeypatch.setattr(faulthandler, "dump_traceback_later", lambda *a, **k: armed.append((a, k)))
    arm_watchdog(0.0)
    arm_watchdog(0.5)
    arm_watchdog(30)
    assert armed == [((0.5,), {"exit": True}), ((30,), {"exit": True})]


def test_autocast_runs_the_forward_in_the_wrappers_dtype():
    """float16, not the CPU's default autocast dtype (bfloat16)."""
    from types import SimpleNamespace

    from runtime.train import _autocast

    with _autocast(SimpleNamespace(autocast=torch.float16), torch.device("cpu")):
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.float16
    with _autocast(SimpleNamespace(autocast=None), torch.device("cpu")):
        assert not torch.is_autocast_enabled("cpu")


def test_an_optimizer_step_syncs_then_steps_and_drops_the_gradients():
    from types import SimpleNamespace

    from runtime.train import _optimizer_step

    w = torch.nn.Parameter(torch.ones(2))
    w.grad = torch.full((2,), 2.0)
    calls = []
    opt = torch.optim.SGD([w], lr=0.5)
    built = SimpleNamespace(sync_gradients=lambda: calls.append(w.grad.tolist()), optimizers=[opt])
    _optimizer_step(built)
    assert calls == [[2.0, 2.0]] and w.grad is None and w.tolist() == [0.0, 0.0]


# -- the survivors of mutmut's first pass (docs/mutation.md) ---------------------------------


def _pipeline_built(plan, holds_first, holds_last, losses_out):
    """A pipeline stage stood in: its schedule records what ``step`` is given and, on the
    last stage, appends each micro-batch's loss (the schedule's ``losses`` list)."""
    calls = []

    class Schedule:
        def step(self, *args, **kwargs):
            calls.append((args, kwargs))
            if "losses" in kwargs:
                kwargs["losses"].extend(torch.tensor(v) for v in losses_out)

    built = SimpleNamespace(plan=plan, coords=(0, 5, 0), schedule=Schedule(),
                            holds_first=holds_first, holds_last=holds_last)  # fmt: skip
    return built, calls


@pytest.mark.parametrize("first,last", [(True, True), (True, False), (False, True), (False, False)])
def test_a_pipeline_stage_hands_the_schedule_its_inputs_and_targets(mlp, first, last):
    """The first stage passes the batch (moved to the device: meta stands for a GPU), the last
    the targets and a list the schedule fills; the last returns the micro-batches' mean
    loss, the others None. Coordinates (pp 0, dp 5): the stage is read from pp."""
    from runtime.train import _local_step

    plan, mf, _ = mlp
    built, calls = _pipeline_built(plan, first, last, [1.0, 2.5])
    got = _local_step(built, mf, 2, torch.device("meta"))
    ((args, kwargs),) = calls
    x, y = mf.batch(plan.global_batch_size, step=2)
    if first:
        assert len(args) == len(x) and all(a.device.type == "meta" for a in args)
        assert [a.shape for a in args] == [t.shape for t in x]
    else:
        assert args == ()
    if last:
        assert set(kwargs) == {"target", "losses"} and kwargs["target"].device.type == "meta"
        assert kwargs["target"].shape == y.shape and len(kwargs["losses"]) == 2
        assert got == 1.75
    else:
        assert kwargs == {} and got is None


def test_only_the_last_micro_batch_syncs_gradients(mlp, monkeypatch, tmp_path):
    """Data parallelism's all-reduce waits for the accumulated gradient: off for the first
    micro-batch, on for the last (one rank has nothing to sync, so the flag is recorded)."""
    import runtime.train as train

    plan, mf, ref = mlp
    flags = []
    sync = train.gradient_sync
    monkeypatch.setattr(
        train, "gradient_sync", lambda parts, on: (flags.append(on), sync(parts, on))
    )
    _close(train_plan(plan, mf, torch.device("cpu"), steps=2, seed=0, run_dir=tmp_path),
           ref.losses[:2])  # fmt: skip
    assert flags == [False, True, False, True]


def test_the_loss_gets_the_gather_and_the_forward_the_sequence_shares_kwargs(
    mlp, monkeypatch, tmp_path
):
    """What ``built.gather`` and ``_sequence_share`` hand on reach the loss and the model (one
    rank has no gather and no context parallelism: both stood in), and the forward runs
    under the built's autocast on the step's device."""
    import runtime.train as train
    from runtime.build import build

    plan, mf, _ = mlp
    built = build(plan, mf, torch.device("cpu"), 0, None)
    gather = object()
    built.gather = gather
    built.autocast = torch.bfloat16
    seen = []
    loss = mf.loss
    monkeypatch.setattr(mf, "loss", lambda out, y, g=None: (seen.append(g), loss(out, y))[1])

    @contextlib.contextmanager
    def share(built, x, y):
        yield x, {"extra": 7}, y

    model = built.parts[0]
    forward = model.forward
    kwargs_seen = []
    monkeypatch.setattr(model, "forward", lambda *a, **k: (kwargs_seen.append(k), forward(*a))[1])
    monkeypatch.setattr(train, "_sequence_share", share)
    got = train._local_step(built, mf, 1, torch.device("cpu"))
    assert seen == [gather, gather] and kwargs_seen == [{"extra": 7}] * 2
    assert isinstance(got, float) and math.isfinite(got)


def test_a_run_without_checkpoint_every_writes_none_and_builds_with_the_launchs_cache(
    mlp, monkeypatch, tmp_path
):
    import runtime.train as train
    from runtime.build import RuntimeCache

    plan, mf, ref = mlp
    caches, devices = [], []
    build, local_step = train.build, train._local_step
    monkeypatch.setattr(
        train, "build", lambda p, m, d, s, c: (caches.append(c), build(p, m, d, s, c))[1]
    )
    monkeypatch.setattr(
        train, "_local_step", lambda b, m, s, d: (devices.append(d), local_step(b, m, s, d))[1]
    )
    cache = RuntimeCache()
    t0 = time.perf_counter()
    _close(train_plan(plan, mf, torch.device("cpu"), steps=2, seed=0, run_dir=tmp_path,
                      cache=cache), ref.losses[:2])  # fmt: skip
    wall = time.perf_counter() - t0
    assert caches == [cache] and devices == [torch.device("cpu")] * 2
    assert not (tmp_path / "checkpoints").exists()
    # each step's time is measured from its start: together no longer than the whole run
    assert sum(r["step_time_s"] for r in _metrics(tmp_path)) <= wall


class _Recorder(io.StringIO):
    """stdout stood in: what had been written at each flush."""

    def __init__(self):
        super().__init__()
        self.flushed = []

    def flush(self):
        self.flushed.append(self.getvalue())


def _bars(enabled: bool, calls: list):
    """planner.progress.Bars stood in: ``enabled`` as given, every call recorded."""

    class Bars:
        def __init__(self, quiet=False):
            calls.append(("init", quiet))
            self.enabled = enabled

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            calls.append(("exit",))

        def task(self, name, total=None):
            calls.append(("task", name, total))
            return SimpleNamespace(update=lambda **k: calls.append(("update", k)))

    return Bars


@pytest.mark.parametrize("enabled", [False, True])
def test_rank_0_flushes_each_line_and_draws_its_bar(mlp, monkeypatch, tmp_path, enabled):
    """Under torchrun stdout is a pipe: each line is flushed as it is printed (a note, the
    resume, each step or, under a bar, the last, each checkpoint); the bar counts steps from
    the resumed one, says each step's loss, and goes before the last step's line."""
    import runtime.train as train

    plan, mf, ref = mlp
    train_plan(plan, mf, torch.device("cpu"), steps=1, seed=0, run_dir=tmp_path,
               checkpoint_every=1)  # fmt: skip
    build = train.build

    def noted(*a):
        built = build(*a)
        built.notes.append("a note")
        return built

    calls = []
    monkeypatch.setattr(train, "build", noted)
    monkeypatch.setattr(train, "Bars", _bars(enabled, calls))
    out = _Recorder()
    monkeypatch.setattr(sys, "stdout", out)
    losses = train_plan(plan, mf, torch.device("cpu"), steps=3, seed=0, run_dir=tmp_path,
                        checkpoint_every=1, resume=True)  # fmt: skip
    monkeypatch.undo()
    _close(losses, ref.losses[1:])
    lines = out.getvalue().splitlines(keepends=True)
    assert lines[0] == "note: a note\n" and lines[1].startswith("resuming from ")
    steps = [ln for ln in lines if ln.startswith("step ")]
    assert [ln.split()[1] for ln in steps] == (["3/3"] if enabled else ["2/3", "3/3"])
    assert sum(ln.startswith("checkpoint ") for ln in lines) == 2
    # every line was flushed as soon as it was written
    ends = {"".join(lines[: i + 1]) for i in range(len(lines))}
    assert ends <= set(out.flushed)
    assert calls[:3] == [("init", False), ("task", "training", 3), ("update", {"completed": 1})]
    updates = [c[1] for c in calls if c[0] == "update"][1:]
    assert [u["completed"] for u in updates] == [2, 3]
    for u, want in zip(updates, ref.losses[1:]):
        assert u["info"].startswith(f"loss {want:.6f} · ") and u["info"].endswith(" s/step")
    assert calls.count(("exit",)) == 1 and calls.index(("exit",)) > calls.index(
        ("update", updates[-1])
    )


def test_the_step_vector_carries_the_loss_and_each_ranks_peaks(mlp, monkeypatch, tmp_path):
    """Rank 1 of 2 stood in (dist's rank and size; the all-reduce adds rank 0's vector): the
    one float64 all-reduce holds the loss divided by the last stage's replicas (stood in: 4),
    this rank's peak and reserved bytes in its own slots (2^40 + 1: exact in float64 only);
    a rank not on the last stage adds no loss. The rate counts the unit's per-sample size."""
    import runtime.train as train

    plan, mf, _ = mlp
    sent = []

    def all_reduce(vec):
        sent.append(vec.clone())
        vec += torch.tensor([0.5, 7.0, 0.0, 9.0, 0.0], dtype=vec.dtype)

    fake = SimpleNamespace(get_rank=lambda: 1, get_world_size=lambda: 2, all_reduce=all_reduce)
    replicas_of = type(plan.mesh).replicas_of
    asked = []
    monkeypatch.setattr(type(plan.mesh), "replicas_of",
                        lambda self, i: (asked.append(i), replicas_of(self, i) * 4)[1])  # fmt: skip
    monkeypatch.setattr(train, "dist", fake)
    monkeypatch.setattr(train, "peak_memory_bytes", lambda d: 2**40 + 1)
    monkeypatch.setattr(train, "peak_reserved_bytes", lambda d: 2**41 + 1)
    local = iter([3.0, None])
    monkeypatch.setattr(train, "_local_step", lambda *a: next(local))
    losses = train_plan(plan, mf, torch.device("cpu"), steps=2, seed=0, run_dir=tmp_path)
    assert asked == [plan.mesh.pp - 1]
    assert [v.dtype for v in sent] == [torch.float64] * 2
    assert [v.tolist() for v in sent] == [
        [0.75, 0.0, 2**40 + 1, 0.0, 2**41 + 1],
        [0.0, 0.0, 2**40 + 1, 0.0, 2**41 + 1],
    ]
    assert losses == [1.25, 0.5]
    assert not (tmp_path / "metrics.jsonl").exists()  # rank 0 writes it


def test_on_a_gpu_each_step_is_timed_on_its_device_and_records_reserved_bytes(
    mlp, monkeypatch, tmp_path
):
    """A GPU stood in (cuda:1 handed on; the build on the host, the step, the peaks, the
    all-reduce and torch.cuda's calls recorded; the step vector asked for on cuda:1 and made
    on the host), rank 0 of 2: the peak statistics reset on that device once before the
    first step, the step vector made on it, the device synchronized after each all-reduce
    (before the step's time is read), and each record carries both ranks' reserved bytes
    from their own slots (rank 1's added by the all-reduce)."""
    import runtime.train as train

    plan, mf, _ = mlp
    gpu = torch.device("cuda", 1)
    calls = []
    build, zeros = train.build, torch.zeros

    def host_build(p, m, device, *a):
        calls.append(("build", device))
        return build(p, m, torch.device("cpu"), *a)

    def host_zeros(*a, device=None, **k):
        if k.get("dtype") is torch.float64:  # the step vector (other callers pass through)
            calls.append(("vector", device))
            return zeros(*a, **k)
        return zeros(*a, device=device, **k)

    def all_reduce(vec):
        calls.append(("all_reduce",))
        vec += torch.tensor([0.0, 0.0, 7.0, 0.0, 9.0], dtype=vec.dtype)

    fake = SimpleNamespace(get_rank=lambda: 0, get_world_size=lambda: 2, all_reduce=all_reduce)
    monkeypatch.setattr(train, "dist", fake)
    monkeypatch.setattr(train, "build", host_build)
    monkeypatch.setattr(
        train, "_local_step", lambda b, m, s, d: (calls.append(("step", d)), 3.0)[1]
    )
    monkeypatch.setattr(train, "peak_memory_bytes", lambda d: 2**40 + 1)
    monkeypatch.setattr(train, "peak_reserved_bytes", lambda d: 2**41 + 1)
    monkeypatch.setattr(torch, "zeros", host_zeros)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d: calls.append(("reset", d)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d: calls.append(("sync", d)))
    losses = train_plan(plan, mf, gpu, steps=2, seed=0, run_dir=tmp_path)
    monkeypatch.undo()
    step = [("step", gpu), ("vector", gpu), ("all_reduce",), ("sync", gpu)]
    assert calls == [("build", gpu), ("reset", gpu), *step, *step]
    assert losses == [3.0, 3.0]
    for r in _metrics(tmp_path):
        assert r["peak_memory_bytes"] == [2**40 + 1, 7]
        assert r["peak_reserved_bytes"] == [2**41 + 1, 9]


def test_the_rate_counts_tokens_per_sample(mlp, monkeypatch, tmp_path):
    """A model of token ids (the unit stood in: 16 tokens a sample) reports tokens per second,
    the global batch's tokens over the step's time; the unit is read from one sample's
    inputs."""
    import runtime.train as train

    plan, mf, _ = mlp
    seen = []
    monkeypatch.setattr(train, "throughput_unit", lambda x: (seen.append(x), ("tokens", 16))[1])
    train_plan(plan, mf, torch.device("cpu"), steps=1, seed=0, run_dir=tmp_path)
    (x,) = seen
    want = mf.batch(1, step=0)[0]
    assert len(x) == len(want) and all(torch.equal(a, b) for a, b in zip(x, want))
    (r,) = _metrics(tmp_path)
    assert abs(r["tokens_per_s"] * r["step_time_s"] - 8 * 16) < 1e-6 * 8 * 16
