"""Tests written for mutmut's generated mutants of runtime/stop.py (the stop file through which
the workers hand ``plan run`` the reason they stopped; benchmarks/generated_mutants.py). One
process, and one short interpreter without torch for ``exit_worker`` (it ends its process).
tests/test_runtime_fault.py runs the same file through ``plan run``; docs/mutation.md names the
mutants each test kills."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import runtime.stop as stop
from planner.errors import InfeasibleError, UserInputError


def test_the_reason_and_its_exit_status_travel_through_the_file(tmp_path):
    stop.write_stop(tmp_path, InfeasibleError("the loss diverged at step 3"))
    text = (tmp_path / "stopped.json").read_text()
    assert json.loads(text) == {"message": "the loss diverged at step 3", "exit_code": 3}
    assert text.endswith("}\n") and text.count("\n") == 1
    got = stop.read_stop(tmp_path)
    assert type(got) is stop.RunStopped and got.exit_code == 3
    assert str(got) == "the loss diverged at step 3"
    stop.write_stop(str(tmp_path), UserInputError("bad batch"))  # a str run_dir too
    assert (stop.read_stop(tmp_path).exit_code, str(stop.read_stop(tmp_path))) == (2, "bad batch")
    stop.clear_stop(tmp_path)
    assert not (tmp_path / "stopped.json").exists() and stop.read_stop(tmp_path) is None
    stop.clear_stop(tmp_path)  # nothing to clear is no error


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{not json",
        '{"exit_code": 2}',
        '{"message": "m"}',
        "[1]",
        '{"message": "m", "exit_code": "x"}',
    ],
    ids=["empty", "half-written", "no-message", "no-status", "a-list", "status-not-a-number"],
)
def test_an_unreadable_stop_file_is_no_stop(tmp_path, text):
    (tmp_path / "stopped.json").write_text(text)
    assert stop.read_stop(tmp_path) is None


def test_a_run_stopped_carries_its_status():
    got = stop.RunStopped("why", 5)
    assert str(got) == "why" and got.exit_code == 5 and got.args == ("why",)


def _watchers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "meshplan-stop-watch"]


def test_the_watch_starts_only_under_plan_run_and_ends_the_worker_once_the_file_appears(
    tmp_path, monkeypatch
):
    """Without ``MESHPLAN_STOP_FILE=1`` no watch starts; with it, a daemon thread polls the
    file and ends the worker with status 0 once it is written (not before)."""
    ended: list[int] = []
    done = threading.Event()
    monkeypatch.setattr(stop, "exit_worker", lambda code: (ended.append(code), done.set()))
    before = len(_watchers())
    monkeypatch.delenv(stop.ENV, raising=False)
    stop.watch_stop(tmp_path, 0.01)
    monkeypatch.setenv(stop.ENV, "0")
    stop.watch_stop(tmp_path, 0.01)
    assert len(_watchers()) == before
    monkeypatch.setenv(stop.ENV, "1")
    stop.watch_stop(tmp_path, 0.01)
    new = _watchers()[before:]
    assert len(new) == 1 and new[0].daemon
    assert not done.wait(0.3) and ended == []
    stop.write_stop(tmp_path, UserInputError("stop"))
    assert done.wait(10) and ended == [0]
    new[0].join(10)
    assert not new[0].is_alive()


def test_exit_worker_flushes_both_streams_and_exits_with_the_code(tmp_path):
    root = Path(stop.__file__).resolve().parents[1]
    script = (
        "import sys\nfrom runtime.stop import exit_worker\n"
        "sys.stdout.write('out')\nsys.stderr.write('err')\nexit_worker(3)\nprint('after')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout, done.stderr) == (3, "out", "err")


def test_the_watch_polls_every_half_second_by_default(tmp_path, monkeypatch):
    """Each poll sleeps the default interval (recorded, slept 10 ms instead)."""
    import time

    real_sleep, slept = time.sleep, []
    done = threading.Event()
    monkeypatch.setattr(stop, "exit_worker", lambda code: done.set())
    monkeypatch.setattr(time, "sleep", lambda s: (slept.append(s), real_sleep(0.01)))
    monkeypatch.setenv(stop.ENV, "1")
    stop.watch_stop(tmp_path)
    while len(slept) < 2:
        real_sleep(0.01)
    stop.write_stop(tmp_path, UserInputError("stop"))
    assert done.wait(10)
    assert len(slept) >= 2 and set(slept) == {0.5}
