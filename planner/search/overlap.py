"""Work handed to a forked copy of the planning process while the process goes on with its own.

A plan's search and the baselines its alternatives list (pure DP, FSDP, Megatron's rule) are
independent searches under one cost model: on the first plan of Llama-3-70B / 64 the baselines
were about 5 s of CPU after the plan's own search (the stage MILPs of Megatron's interleaved
pipeline, most of it), with the second core idle. ``Forked(compute)`` runs ``compute`` in a
forked copy of the process (the graph, the memo, the probe's verdicts shared as they are at the
fork) and hands back what it returned; ``result()`` computes it here instead where the copy
could not be made or failed, so the answer is the same either way, only later.

Two things a forked copy must not inherit: HiGHS's global task scheduler, whose worker threads
exist in the parent only (a MILP in the copy would wait on them forever:
``highspy.Highs.resetGlobalScheduler`` drops it, and the copy builds its own), and the parent's
exit handlers and buffered output (the copy leaves through ``os._exit``).
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


def forking_allowed() -> bool:
    """Whether work may go to a forked copy: where the platform forks, unless
    ``MESHPLAN_NO_FORK`` is set (tests compare both ways; a user may want one process)."""
    return hasattr(os, "fork") and not os.environ.get("MESHPLAN_NO_FORK")


class Forked(Generic[T]):
    """``compute()`` running in a forked copy of this process from construction on.
    ``fallback``: what ``result()`` computes here instead of ``compute`` where no copy ran or
    it failed (work that only saves time elsewhere: ``planner.api.ilps_beside``)."""

    def __init__(self, compute: Callable[[], T], fallback: Callable[[], T] | None = None) -> None:
        self._compute = compute
        self._fallback = compute if fallback is None else fallback
        self._pid: int | None = None
        self._read: int | None = None
        self.forked = False  # whether the copy's answer was used (tests read it)
        if not forking_allowed():
            return
        read, write = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(read)
            os.close(write)
            return
        if pid == 0:  # the copy: compute, send, leave
            code = 1
            try:
                os.close(read)
                _fresh_highs_scheduler()
                data = pickle.dumps(compute(), protocol=pickle.HIGHEST_PROTOCOL)
                with os.fdopen(write, "wb") as pipe:
                    pipe.write(data)
                code = 0
            except BaseException:  # noqa: BLE001 (the parent computes it again and raises)
                code = 1
            finally:
                os._exit(code)
        os.close(write)
        self._pid, self._read = pid, read

    def result(self) -> T:
        """What ``compute()`` returned in the copy; computed here (``fallback``) if the copy
        failed."""
        if self._pid is None:
            return self._fallback()
        with os.fdopen(self._read, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(self._pid, 0)
        self._pid = None
        if os.waitstatus_to_exitcode(status) != 0 or not data:
            return self._fallback()
        self.forked = True
        return pickle.loads(data)

    def cancel(self) -> None:
        """Stop the copy (its answer is not needed: the plan's own search failed)."""
        if self._pid is None:
            return
        import signal

        try:
            os.kill(self._pid, signal.SIGKILL)
        except OSError:
            pass
        os.waitpid(self._pid, 0)
        os.close(self._read)
        self._pid = None


def _fresh_highs_scheduler() -> None:
    """Drop HiGHS's scheduler copied from the parent (its threads were not)."""
    highspy = sys.modules.get("highspy")
    if highspy is not None:
        highspy.Highs.resetGlobalScheduler(False)
