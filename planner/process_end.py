"""How a process of the planner ends: ``plan`` (meshplan.cli.console) and the report worker
(planner.report.worker), whose heaps live until they exit."""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_without_teardown(status: int) -> NoReturn:
    """End the process as the interpreter would, less its teardown. A plan's heap (torch,
    transformers, the traced graph, the search's records) lives until the process ends, and the
    teardown frees it object by object after a full cyclic collection over all of it, for memory the
    operating system takes back anyway: on a first plan of Llama-3-70B under load, 7.8-9.8 s of
    56-76 s, 0.3 s without it (docs/benchmarks.md, ninth stop). Everything a user can see still
    happens: the threads that are not daemons are waited for and the exit handlers run (logging's
    flush, finalizers registered for exit, libraries' own), in the interpreter's order, and both
    streams are flushed. Freezing the heap instead would skip only the collection, but then
    libraries that count their objects at teardown (triton's nanobind bindings, which torch.export
    imports) print leak warnings. ``main`` stays free of this, for callers that go on living (the
    tests)."""
    threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's exit, in order
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
