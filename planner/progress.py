"""Progress bars on stderr for the long steps (tracing, the search, the pool search, runs).

A bar is for a person watching a terminal: it is drawn only when stderr is a terminal, CI is
not set and ``--quiet`` was not given, and it leaves nothing behind (``transient``), so the
result that follows is the same whether a bar was drawn or not, and a log or a pipe never holds
one. Lines a search used to print per candidate ("planning pp6 dp4 tp2, ...") are ``verbose``
lines: printed only with ``--verbose``, above the bars when there are any.

This module sits low (planner.errors level) so the runtime's workers can draw the run's bar
without importing the planner.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable
from typing import Any


def bars_enabled(quiet: bool = False) -> bool:
    """Whether a bar may be drawn: not ``--quiet``, stderr a terminal, and not in CI."""
    return not quiet and sys.stderr.isatty() and not os.environ.get("CI")


class Bars:
    """A rich Progress on stderr, or nothing: every method is a no-op when disabled.

    ``with Bars(quiet, verbose) as bars:`` then ``bars.task(...)`` for a bar of its own,
    ``bars.search_callback(name)`` for planner.api.plan's ``progress=`` callback, and
    ``bars.say(text)`` for a verbose line."""

    def __init__(self, quiet: bool = False, verbose: bool = False) -> None:
        self.enabled = bars_enabled(quiet)
        self.verbose = verbose and not quiet
        self._progress: Any = None

    def __enter__(self) -> Bars:
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(bar_width=24),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._progress.__enter__()
            # a run that raises never reaches __exit__: stop the bar (and show the cursor
            # again) when the process ends
            atexit.register(self.__exit__)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)
            self._progress = None

    def task(self, description: str, total: float | None = None) -> Task:
        """A bar of its own (``total`` None: no known end, the bar pulses)."""
        if self._progress is None:
            return Task(None, None)
        return Task(self._progress, self._progress.add_task(description, total=total, info=""))

    def say(self, text: str) -> None:
        """A verbose line on stderr (above the bars); nothing without ``--verbose``."""
        if not self.verbose:
            return
        if self._progress is not None:
            self._progress.console.print(text, highlight=False, markup=False)
        else:
            print(text, file=sys.stderr)

    def search_callback(self, name: str = "planning") -> Callable[..., None]:
        """planner.api.plan's ``progress(phase, done, total, pruned=0)``: one bar that traces,
        then prices the (TP, micro-batch) pairs, then counts candidates solved, pruned and left."""
        task = self.task(f"{name}: tracing")

        def update(phase: str, done: int, total: int, pruned: int = 0) -> None:
            if phase == "trace":
                task.update(description=f"{name}: tracing", total=None, completed=0)
            elif phase == "price":
                task.update(description=f"{name}: pricing", total=total, completed=done)
            else:
                left = max(0, total - done - pruned)
                task.update(
                    description=f"{name}: search",
                    total=total,
                    completed=done + pruned,
                    info=f"{done} solved · {pruned} pruned · {left} left",
                )

        return update


class Task:
    """One bar; updates are dropped when there is no bar."""

    def __init__(self, progress: Any, task_id: Any) -> None:
        self._progress, self._id = progress, task_id

    def update(self, **fields: Any) -> None:
        if self._progress is not None:
            self._progress.update(self._id, **fields)

    def advance(self, steps: float = 1, info: str | None = None) -> None:
        if self._progress is not None:
            self._progress.advance(self._id, steps)
            if info is not None:
                self._progress.update(self._id, info=info)
