"""Tests written for mutmut's generated mutants of runtime/train.py (the training loop;
benchmarks/generated_mutants.py). One process: ``train_plan`` itself on a one-rank gloo group
held in the test (a HashStore, no launch), the tiny MLP at micro-batch 4 of 8 (two micro-batches
accumulated), against the one-process oracle (tests/oracle.py): its losses, the parameters a
checkpoint holds, metrics.jsonl and the lines rank 0 prints, for a run and for a resume.
tests/test_resume_step.py runs the same resume through the worker; docs/mutation.md names the
mutants each test kills."""

from __future__ import annotations

import json
import re

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
