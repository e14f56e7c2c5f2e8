"""Tests written for mutmut's generated mutants of runtime/worker.py (the process torchrun
starts; benchmarks/generated_mutants.py). One process: ``main`` itself on a one-rank gloo group
made in the test (a HashStore, no launch), with the plan, the model file, ``train_plan``, the
stop-file watch and ``exit_worker`` stood in by recorders, so a test sees what ``main`` passes
on, prints and returns on each way a rank ends. tests/test_worker_alone.py and the runtime's
torchrun tests run the same code in real workers; docs/mutation.md names the mutants each test
kills."""

from __future__ import annotations

import datetime
import io
import logging
import sys
import threading
import time
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

import runtime.worker as w
from planner.errors import InfeasibleError, UserInputError
from runtime.build import RuntimeCache
from runtime.stop import ENV as STOP_ENV
from runtime.stop import RunStopped, read_stop, write_stop


class _Exited(Exception):
    """``exit_worker`` stood in: the code it was given, without ending the test process."""

    def __init__(self, code: int) -> None:
        self.code = code


def _plan(pp=1, dp_label=1, ep=1, cp=1, tp_label=1, schedule="1f1b", zero=0, name="m.py"):
    mesh = SimpleNamespace(pp=pp, dp_label=dp_label, ep=ep, cp=cp, tp_label=tp_label)
    model = SimpleNamespace(file=name, args={"size": name})
    return SimpleNamespace(mesh=mesh, schedule=schedule, zero_stage=zero, model=model)


@pytest.fixture
def worker(monkeypatch, tmp_path):
    """``main``'s collaborators recorded; its process group a real one-rank gloo group."""
    for key in ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "LOCAL_RANK",
                STOP_ENV, "MESHPLAN_DEBUG"):  # fmt: skip
        monkeypatch.delenv(key, raising=False)
    rec = SimpleNamespace(inits=[], watched=[], trains=[], models=[], frozen=0, exits=[],
                          plans={}, raises=None, barriers=[])  # fmt: skip

    def init(backend, **kwargs):
        rec.inits.append((backend, kwargs))
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    def train(plan, mf, device, **kwargs):
        rec.trains.append((plan, mf, device, kwargs))
        if rec.raises is not None:
            raise rec.raises

    def freeze():
        rec.frozen += 1

    def load_model(file, args):
        rec.models.append((file, args))
        return ("model", file)

    monkeypatch.setattr(w, "init_process_group", init)
    monkeypatch.setattr(w, "watch_stop", rec.watched.append)
    monkeypatch.setattr(w, "load_plan", lambda path: rec.plans[path])
    monkeypatch.setattr(w, "load_model_file", load_model)
    monkeypatch.setattr(w, "train_plan", train)
    monkeypatch.setattr(w, "freeze_launch_state", freeze)
    monkeypatch.setattr(w, "exit_worker", rec.exits.append)
    rec.dir = tmp_path
    try:
        yield rec
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_parse_defaults_and_every_flag():
    a = w.parse(["--plans", "p.json", "--run-dirs", "r"])
    assert (a.plans, a.run_dirs, a.steps, a.seed, a.checkpoint_every) == (
        ["p.json"],
        ["r"],
        5,
        0,
        0,
    )
    assert (a.resume, a.device, a.hang_timeout) == (False, "cpu", 0.0)
    a = w.parse("--plans a b --run-dirs x y --steps 3 --seed 7 --checkpoint-every 2 --resume "
                "--device cuda --hang-timeout 1.5".split())  # fmt: skip
    assert (a.plans, a.run_dirs, a.steps, a.seed, a.checkpoint_every) == (
        ["a", "b"], ["x", "y"], 3, 7, 2)  # fmt: skip
    assert (a.resume, a.device, a.hang_timeout) == (True, "cuda", 1.5)


@pytest.mark.parametrize(
    "argv",
    [["--run-dirs", "r"], ["--plans", "p"], ["--plans", "p", "--run-dirs", "r", "--device", "tpu"]],
)
def test_parse_refuses_a_missing_or_bad_flag(argv):
    with pytest.raises(SystemExit) as err:
        w.parse(argv)
    assert err.value.code == 2


def test_parse_refuses_plans_and_run_dirs_of_different_counts(capsys):
    with pytest.raises(SystemExit) as err:
        w.parse(["--plans", "a", "b", "--run-dirs", "x"])
    assert err.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: runtime.worker ")
    assert err.endswith(": error: --plans and --run-dirs need the same number of entries\n")


def test_parse_takes_each_device_by_name_and_says_what_hang_timeout_means(capsys):
    assert [w.parse(["--plans", "p", "--run-dirs", "r", "--device", d]).device
            for d in ("cpu", "cuda")] == ["cpu", "cuda"]  # fmt: skip
    with pytest.raises(SystemExit):
        w.parse(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("usage: runtime.worker ")
    assert "--hang-timeout HANG_TIMEOUT seconds per step; 0: off" in out


def test_restarted_needs_a_restart_and_a_complete_checkpoint(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    assert not w.restarted(tmp_path)
    (tmp_path / "checkpoints" / "step_000002").mkdir(parents=True)
    assert not w.restarted(tmp_path)  # not restarted: a fresh run
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert not w.restarted(tmp_path)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert w.restarted(tmp_path)
    assert not w.restarted(tmp_path / "other")  # restarted, but nothing to continue from


def test_outside_torchrun_the_group_is_made_as_asked(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    calls = []
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: calls.append((a, k)))
    monkeypatch.setattr(dist, "rendezvous", lambda *a: pytest.fail("no rendezvous"))
    w.init_process_group("gloo", device_id=3)
    assert calls == [(("gloo",), {"device_id": 3})]


def test_under_torchrun_each_attempt_gets_its_own_store_prefix(monkeypatch):
    """The attempt's keys are written under ``meshplan/attempt_<n>/`` of the agent's store."""
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    base = dist.HashStore()
    calls = []

    def rendezvous(url):
        calls.append(url)
        return iter([(base, 5, 8)])

    monkeypatch.setattr(dist, "rendezvous", rendezvous)
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: calls.append((a, k)))
    w.init_process_group("nccl", device_id=1)
    assert calls[0] == "env://"
    (args, kwargs) = calls[1]
    assert args == ("nccl",) and set(kwargs) == {"store", "rank", "world_size", "device_id"}
    assert (kwargs["rank"], kwargs["world_size"], kwargs["device_id"]) == (5, 8, 1)
    kwargs["store"].set("k", "v")
    assert base.get("meshplan/attempt_2/k") == b"v"


def test_main_trains_each_plan_in_its_run_directory_and_says_so(worker, capsys):
    rec = worker
    rec.plans["a.json"] = _plan()
    rec.plans["b.json"] = _plan(pp=2, dp_label=4, ep=2, cp=2, tp_label="2/1", schedule="gpipe",
                                zero=3, name="n.py")  # fmt: skip
    ra, rb = rec.dir / "ra", rec.dir / "rb"
    argv = ["--plans", "a.json", "b.json", "--run-dirs", str(ra), str(rb), "--steps", "3",
            "--seed", "4", "--checkpoint-every", "2", "--hang-timeout", "9.5"]  # fmt: skip
    assert w.main(argv) == 0
    assert not dist.is_initialized()  # the group is destroyed at the end
    assert rec.inits == [("gloo", {})] and rec.watched == [ra]
    assert rec.models == [("m.py", {"size": "m.py"}), ("n.py", {"size": "n.py"})]
    assert rec.frozen == 2 and rec.exits == []
    assert [t[0] for t in rec.trains] == [rec.plans["a.json"], rec.plans["b.json"]]
    for (_, mf, device, kwargs), run, name in zip(rec.trains, [ra, rb], ["m.py", "n.py"]):
        assert mf == ("model", name) and device == torch.device("cpu")
        cache = kwargs.pop("cache")
        assert type(cache) is RuntimeCache
        assert kwargs == dict(steps=3, seed=4, run_dir=run, checkpoint_every=2, resume=False,
                              hang_timeout_s=9.5)  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "running a.json: pp 1 x dp 1 x tp 1, no pipeline, ZeRO 0, 3 steps on cpu"
    assert out[1].startswith("done a.json in ") and out[1].endswith(" s")
    assert out[2] == (
        "running b.json: pp 2 x dp 4 (ep 2) x cp 2 x tp 2/1, gpipe, ZeRO 3, 3 steps on cpu"
    )
    assert out[3].startswith("done b.json in ") and len(out) == 4
    float(out[3][len("done b.json in ") : -2])


def test_one_cache_serves_every_plan_of_the_launch(worker):
    rec = worker
    rec.plans["a.json"] = rec.plans["b.json"] = _plan()
    w.main(["--plans", "a.json", "b.json", "--run-dirs", "x", "y"])
    assert rec.trains[0][3]["cache"] is rec.trains[1][3]["cache"]
    assert [t[3]["steps"] for t in rec.trains] == [5, 5]


def test_resume_is_asked_or_follows_a_restart_with_a_checkpoint(worker, monkeypatch):
    rec = worker
    rec.plans["a.json"] = _plan()
    run = rec.dir / "run"
    w.main(["--plans", "a.json", "--run-dirs", str(run), "--resume"])
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setattr(w, "init_process_group", lambda backend, **k: dist.init_process_group(
        "gloo", store=dist.HashStore(), rank=0, world_size=1))  # fmt: skip
    w.main(["--plans", "a.json", "--run-dirs", str(run)])
    w.main(["--plans", "a.json", "--run-dirs", str(rec.dir / "fresh")])
    assert [t[3]["resume"] for t in rec.trains] == [True, True, False]


def test_on_cuda_the_rank_takes_its_local_device_and_nccl(worker, monkeypatch, capsys):
    rec = worker
    rec.plans["a.json"] = _plan()
    monkeypatch.setenv("LOCAL_RANK", "3")
    devices = []
    monkeypatch.setattr(torch.cuda, "set_device", devices.append)
    assert w.main(["--plans", "a.json", "--run-dirs", "r", "--device", "cuda"]) == 0
    assert devices == [3]
    assert rec.inits == [("nccl", {"device_id": torch.device("cuda", 3)})]
    assert rec.trains[0][2] == torch.device("cuda", 3)
    assert capsys.readouterr().out.splitlines()[0].endswith(", 5 steps on cuda")


def _barriers(monkeypatch, rec, fail=False):
    """dist's two barriers recorded (the monitored one's timeout); ``fail``: a peer never came."""

    def monitored(timeout=None):
        rec.barriers.append(("monitored", timeout))
        if fail:
            raise RuntimeError("rank 1 did not reach the barrier")

    monkeypatch.setattr(dist, "monitored_barrier", monitored)
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: rec.barriers.append(("plain", None)))


class _Timer:
    made: list = []

    def __init__(self, interval, function, args):
        self.interval, self.function, self.args = interval, function, args
        self.daemon, self.started, self.cancelled = False, False, False
        _Timer.made.append(self)

    def start(self):
        self.started = True

    def cancel(self):
        self.cancelled = True


def test_a_meshplan_error_meets_the_peers_then_ends_with_its_line(worker, monkeypatch, capsys):
    rec = worker
    rec.plans["a.json"] = _plan()
    rec.raises = InfeasibleError("the loss diverged")
    _barriers(monkeypatch, rec)
    _Timer.made = []
    monkeypatch.setattr(threading, "Timer", _Timer)
    run = rec.dir / "run"
    assert w.main(["--plans", "a.json", "--run-dirs", str(run)]) == 3
    assert not dist.is_initialized() and rec.frozen == 0 and rec.exits == []
    assert rec.barriers == [("monitored", datetime.timedelta(seconds=30))]
    (timer,) = _Timer.made
    assert (timer.interval, timer.function) == (35.0, w._err_alone)
    assert timer.args == (rec.raises, run)
    assert timer.daemon and timer.started and timer.cancelled
    captured = capsys.readouterr()
    assert captured.err == "error: the loss diverged\n"
    assert read_stop(run) is None


def test_under_plan_run_a_meshplan_error_is_written_to_the_stop_file(worker, monkeypatch, capsys):
    rec = worker
    rec.plans["a.json"] = _plan()
    rec.raises = UserInputError("bad batch")
    monkeypatch.setenv(STOP_ENV, "1")
    run = rec.dir / "run"
    run.mkdir()
    assert w.main(["--plans", "a.json", "--run-dirs", str(run)]) == 0
    got = read_stop(run)
    assert (str(got), got.exit_code) == ("bad batch", 2)
    assert capsys.readouterr().err == ""


def test_a_peer_that_never_meets_ends_the_rank_alone(worker, monkeypatch, capsys):
    rec = worker
    rec.plans["a.json"] = _plan()
    rec.raises = InfeasibleError("stage 1 cannot fit")
    _barriers(monkeypatch, rec, fail=True)
    assert w.main(["--plans", "a.json", "--run-dirs", str(rec.dir / "r")]) == 3
    assert rec.exits == [3]
    assert capsys.readouterr().err.startswith("error: stage 1 cannot fit\n")


def test_on_nccl_the_error_meets_at_the_plain_barrier(worker, monkeypatch):
    rec = worker
    rec.plans["a.json"] = _plan()
    rec.raises = InfeasibleError("x")
    _barriers(monkeypatch, rec)
    monkeypatch.setattr(dist, "get_backend", lambda *a: "nccl")
    assert w.main(["--plans", "a.json", "--run-dirs", "r"]) == 3
    assert rec.barriers == [("plain", None)]


def test_a_bug_is_one_line_or_raised_under_debug(worker, monkeypatch, capsys):
    rec = worker
    rec.plans["a.json"] = _plan()
    rec.raises = KeyError("wq")
    run = rec.dir / "run"
    assert w.main(["--plans", "a.json", "--run-dirs", str(run)]) == 1
    assert capsys.readouterr().err == (
        "error: rank 0: internal error: KeyError: 'wq' (run again with --debug for the "
        "traceback, and please report it)\n"
    )
    dist.destroy_process_group()
    monkeypatch.setenv("MESHPLAN_DEBUG", "1")
    with pytest.raises(KeyError):
        w.main(["--plans", "a.json", "--run-dirs", str(run)])


def test_err_alone_under_plan_run_writes_the_stop_file_once_and_exits_cleanly(
    worker, monkeypatch, capsys
):
    rec = worker
    monkeypatch.setattr(w, "exit_worker", lambda code: (_ for _ in ()).throw(_Exited(code)))
    monkeypatch.setenv(STOP_ENV, "1")
    with pytest.raises(_Exited) as err:
        w._err_alone(InfeasibleError("mine"), rec.dir)
    assert err.value.code == 0
    assert str(read_stop(rec.dir)) == "mine" and read_stop(rec.dir).exit_code == 3
    with pytest.raises(_Exited):
        w._err_alone(UserInputError("later"), rec.dir)
    assert str(read_stop(rec.dir)) == "mine"  # the first reason stays
    assert capsys.readouterr().err == ""


def test_err_alone_outside_plan_run_says_it_and_fails(worker, monkeypatch, capsys):
    rec = worker
    monkeypatch.setattr(w, "exit_worker", lambda code: (_ for _ in ()).throw(_Exited(code)))
    with pytest.raises(_Exited) as err:
        w._err_alone(InfeasibleError("mine"), rec.dir)
    assert err.value.code == 3
    assert capsys.readouterr().err == "error: mine\n"
    assert read_stop(rec.dir) is None


LINE = ("error: rank 2: internal error: ValueError: a b (run again with --debug for the "
        "traceback, and please report it)\n")  # fmt: skip


def test_a_bug_outside_plan_run_fails_the_worker(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(STOP_ENV, raising=False)
    monkeypatch.delenv("TORCHELASTIC_MAX_RESTARTS", raising=False)
    assert w.report_bug(2, ValueError("a\n  b"), tmp_path) == 1
    assert capsys.readouterr().err == LINE and read_stop(tmp_path) is None


def test_a_bug_under_plan_run_with_restarts_fails_the_worker(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(STOP_ENV, "1")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    assert w.report_bug(2, ValueError("a b"), tmp_path) == 1
    assert capsys.readouterr().err == LINE and read_stop(tmp_path) is None


@pytest.mark.parametrize("backend,code", [("gloo", 0), ("nccl", 1)])
def test_a_bug_under_plan_run_writes_the_stop_file(tmp_path, monkeypatch, capsys, backend, code):
    monkeypatch.setenv(STOP_ENV, "1")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    monkeypatch.setattr(dist, "get_backend", lambda *a: backend)
    assert w.report_bug(2, ValueError("a b"), tmp_path) == code
    assert capsys.readouterr().err == LINE
    got = read_stop(tmp_path)
    assert (str(got), got.exit_code) == (LINE[len("error: ") : -1], 1)


def test_a_bug_after_a_peer_stopped_is_its_consequence(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(STOP_ENV, "1")
    monkeypatch.delenv("TORCHELASTIC_MAX_RESTARTS", raising=False)
    write_stop(tmp_path, RunStopped("peer's reason", 4))
    assert w.report_bug(2, ValueError("a b"), tmp_path) == 0
    assert capsys.readouterr().err == ""
    assert str(read_stop(tmp_path)) == "peer's reason"


class _Recorder(io.StringIO):
    """stdout stood in: what had been written at each flush (torchrun's pipe is
    block-buffered: a line not flushed reaches the launcher late, out of order with stderr)."""

    def __init__(self):
        super().__init__()
        self.flushed = []

    def flush(self):
        self.flushed.append(self.getvalue())


def test_rank_0s_lines_are_flushed_and_timed_from_the_plans_start(worker, monkeypatch):
    rec = worker
    rec.plans["a.json"] = rec.plans["b.json"] = _plan()
    out = _Recorder()
    monkeypatch.setattr(sys, "stdout", out)
    t0 = time.perf_counter()
    w.main(["--plans", "a.json", "b.json", "--run-dirs", "x", "y"])
    wall = time.perf_counter() - t0
    monkeypatch.undo()
    lines = out.getvalue().splitlines(keepends=True)
    assert len(lines) == 4
    assert {"".join(lines[: i + 1]) for i in range(4)} <= set(out.flushed)
    for done in lines[1], lines[3]:
        assert float(done.split(" in ")[1][: -len(" s\n")]) <= wall + 0.05


def test_without_argv_main_reads_the_command_line(worker, monkeypatch):
    rec = worker
    rec.plans["a.json"] = _plan()
    monkeypatch.setattr(sys, "argv", ["worker.py", "--plans", "a.json", "--run-dirs", "r",
                                      "--steps", "2"])  # fmt: skip
    assert w.main() == 0
    assert [t[3]["steps"] for t in rec.trains] == [2]


def test_main_quiets_the_pipeline_tracers_warnings_and_torchs_own_leafspec_one(worker, monkeypatch):
    """Only those two: the logger ``torch.distributed.pipelining._IR`` at ERROR, and the
    FutureWarning whose message names ``isinstance(treespec, LeafSpec)`` (warnings match
    messages without case)."""
    rec = worker
    rec.plans["a.json"] = _plan()
    logger = logging.getLogger("torch.distributed.pipelining._IR")
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    leaf = "torch: isinstance(treespec, LeafSpec) is deprecated"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        w.main(["--plans", "a.json", "--run-dirs", "r"])
        warnings.warn(leaf, FutureWarning, stacklevel=1)
        warnings.warn("another future", FutureWarning, stacklevel=1)
        warnings.warn(leaf, DeprecationWarning, stacklevel=1)
    assert [(str(x.message), x.category) for x in seen] == [
        ("another future", FutureWarning),
        (leaf, DeprecationWarning),
    ]
    assert logger.level == logging.ERROR


def test_under_plan_run_a_peer_that_never_meets_ends_through_the_stop_file(
    worker, monkeypatch, capsys
):
    rec = worker
    rec.plans["a.json"] = _plan()
    rec.raises = InfeasibleError("stage 1 cannot fit")
    _barriers(monkeypatch, rec, fail=True)
    monkeypatch.setenv(STOP_ENV, "1")
    run = rec.dir / "run"
    run.mkdir()
    monkeypatch.setattr(w, "exit_worker", lambda code: (_ for _ in ()).throw(_Exited(code)))
    monkeypatch.setattr(threading, "Timer", _Timer)  # the rank ends before it cancels it
    with pytest.raises(_Exited) as err:
        w.main(["--plans", "a.json", "--run-dirs", str(run)])
    assert err.value.code == 0
    got = read_stop(run)
    assert (str(got), got.exit_code) == ("stage 1 cannot fit", 3)
    assert capsys.readouterr().err == ""


def test_under_plan_run_a_bug_is_written_to_the_first_run_directory(worker, monkeypatch, capsys):
    rec = worker
    rec.plans["a.json"] = rec.plans["b.json"] = _plan()
    rec.raises = KeyError("wq")
    monkeypatch.setenv(STOP_ENV, "1")
    ra, rb = rec.dir / "ra", rec.dir / "rb"
    ra.mkdir()
    assert w.main(["--plans", "a.json", "b.json", "--run-dirs", str(ra), str(rb)]) == 0
    got = read_stop(ra)
    assert got.exit_code == 1 and str(got).startswith("rank 0: internal error: KeyError: 'wq'")
