"""Work handed to a forked copy (planner/search/overlap.py), written for its generated mutants
(docs/mutation.md): which process computed each answer (its pid), what the copy's failure,
a refused fork and a cancel leave, and the HiGHS scheduler the copy drops first."""

from __future__ import annotations

import os
import sys
import types

import pytest

from planner.search import overlap
from planner.search.overlap import Forked, forking_allowed


@pytest.fixture(autouse=True)
def _forking(monkeypatch):
    """Forking allowed; no signal to a process group (a mutant whose forked copy takes the
    parent's branch holds the pid 0 that ``os.fork`` gave the copy, and its ``cancel`` would
    signal the whole group: under mutmut, the run itself)."""
    monkeypatch.delenv("MESHPLAN_NO_FORK", raising=False)
    real = os.kill

    def kill(pid: int, sig: int) -> None:
        if pid <= 0:
            raise AssertionError(f"a signal to a process group: os.kill({pid}, {sig})")
        real(pid, sig)

    monkeypatch.setattr(os, "kill", kill)
    # and the test's own process never leaves through os._exit (only a forked copy may): a
    # mutant whose caller took the copy's branch would end the test run with status 0
    main, leave = os.getpid(), os._exit

    def exit_copy(code: int) -> None:
        if os.getpid() == main:
            raise AssertionError(f"the test process itself left: os._exit({code})")
        leave(code)

    monkeypatch.setattr(os, "_exit", exit_copy)


def _in_a_child(body) -> tuple[list[tuple[int, str]], int]:
    """Run ``body`` in a forked child of the test: the child's pid, and every (pid, repr of
    what body returned or raised) written to the pipe by whichever process gets to the end
    of it. A Forked whose copy does not leave (or whose caller does) shows as a line too many
    or too few."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            try:
                out = repr(body())
            except BaseException as e:  # noqa: BLE001 (reported to the test)
                out = f"raised {type(e).__name__}"
            os.write(write, f"{os.getpid()} {out}\n".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        lines = pipe.read().splitlines()
    os.waitpid(pid, 0)
    return [(int(a), b) for a, b in (line.split(" ", 1) for line in lines)], pid


def test_only_the_caller_comes_back_from_a_fork():
    """The caller gets the copy's answer; the copy computes, sends and leaves, reaching none
    of the caller's code."""
    lines, child = _in_a_child(lambda: Forked(lambda: 5).result())
    assert lines == [(child, "5")]


def test_a_copy_that_fails_leaves_too():
    """First of the failing copies: a copy that ran on would run the rest of the test
    session beside it, where its failures are not this run's."""

    def fail():
        raise ValueError("in the copy")

    lines, child = _in_a_child(lambda: Forked(fail, fallback=lambda: 6).result())
    assert lines == [(child, "6")]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_the_answer_is_computed_in_a_forked_copy():
    here = os.getpid()
    job = Forked(lambda: (os.getpid(), os.getppid(), "x" * 300_000))  # beyond a pipe's buffer
    pid, parent, text = job.result()
    assert pid != here and parent == here and text == "x" * 300_000
    assert job.forked


def test_without_forking_it_is_computed_here(monkeypatch):
    monkeypatch.setenv("MESHPLAN_NO_FORK", "1")
    assert not forking_allowed()
    job = Forked(lambda: os.getpid(), fallback=lambda: -1)
    assert job.forked is False  # a bool before the result
    assert job.result() == -1 and job.forked is False  # the fallback, here
    job = Forked(lambda: os.getpid())
    assert job.result() == os.getpid() and not job.forked  # compute itself by default
    monkeypatch.setenv("MESHPLAN_NO_FORK", "")
    assert forking_allowed()


def test_a_failed_copy_is_computed_again_here():
    def fail():
        raise RuntimeError("in the copy")

    job = Forked(fail, fallback=lambda: ("here", os.getpid()))
    assert job.result() == ("here", os.getpid()) and not job.forked
    with pytest.raises(RuntimeError, match="in the copy"):
        Forked(fail).result()  # compute again here: its error raised here


@pytest.mark.parametrize("code", [0, 4])
def test_a_copy_that_leaves_without_an_answer_is_not_trusted(code):
    """A copy that exits (cleanly or not) before sending anything: computed here."""
    job = Forked(lambda: os._exit(code), fallback=lambda: "here")
    assert job.result() == "here" and not job.forked


def test_a_refused_fork_leaves_no_pipe_open(monkeypatch):
    def refuse():
        raise OSError("no more processes")

    monkeypatch.setattr(os, "fork", refuse)
    before = _open_fds()
    job = Forked(lambda: os.getpid())
    assert _open_fds() == before
    assert job.result() == os.getpid() and not job.forked


def test_cancel_stops_the_copy_and_closes_its_pipe():
    before = _open_fds()
    job = Forked(lambda: (__import__("time").sleep(60), os.getpid())[1], fallback=lambda: "here")
    pid = job._pid
    assert _open_fds() == before + 1  # the read end
    job.cancel()
    assert _open_fds() == before
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, 0)  # reaped
    assert job.result() == "here" and not job.forked
    job.cancel()  # again: nothing left to stop


def test_the_result_reaps_the_copy_and_closes_its_pipe():
    before = _open_fds()
    job = Forked(lambda: 7)
    pid = job._pid
    assert job.result() == 7
    assert _open_fds() == before
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, 0)
    job.cancel()  # after the result: nothing to stop


def test_the_copy_drops_highs_scheduler_first(monkeypatch):
    calls = []

    class Highs:
        @staticmethod
        def resetGlobalScheduler(blocking):  # noqa: N802 (highspy's name)
            calls.append(blocking)

    monkeypatch.setitem(sys.modules, "highspy", types.SimpleNamespace(Highs=Highs))
    job = Forked(lambda: list(calls))
    assert job.result() == [False] and job.forked
    assert calls == []  # in the copy only
    overlap._fresh_highs_scheduler()
    assert calls == [False]
    monkeypatch.delitem(sys.modules, "highspy")
    overlap._fresh_highs_scheduler()  # not imported: nothing to drop
    assert calls == [False]
