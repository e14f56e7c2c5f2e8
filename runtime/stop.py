"""Why the workers stopped on purpose, handed from rank 0 to ``plan run``.

A diverged loss (or any other MeshplanError the workers raise) must end the run, not be retried:
torchrun restarts every failed worker up to ``--max-restarts`` times whatever the reason. So
under ``plan run`` rank 0 writes the one-line reason to ``run_dir/stopped.json`` and the workers
exit cleanly; the launcher reads the file and fails with that message and exit status.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from planner.atomic import write_text_atomic
from planner.errors import MeshplanError

STOP_FILE = "stopped.json"
ENV = "MESHPLAN_STOP_FILE"  # set by plan run: workers report through the file


class RunStopped(MeshplanError):
    """The workers' own one-line reason, with their exit status."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def exit_worker(code: int) -> None:
    """End a worker process with ``code`` and without C++ teardown: gloo's threads can abort a
    process on its way out after the work is done ("terminate called without an active
    exception", seen in CI-like runs), which torchrun reports as a failed worker. Everything
    the process wrote is closed; its streams are flushed here."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def write_stop(run_dir: Path, exc: MeshplanError) -> None:
    payload = {"message": str(exc), "exit_code": exc.exit_code}
    write_text_atomic(Path(run_dir) / STOP_FILE, json.dumps(payload) + "\n")


def read_stop(run_dir: Path) -> RunStopped | None:
    path = Path(run_dir) / STOP_FILE
    try:
        payload = json.loads(path.read_text())
        return RunStopped(str(payload["message"]), int(payload["exit_code"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def watch_stop(run_dir: Path, interval_s: float = 0.5) -> None:
    """Under ``plan run``, end this worker cleanly once the stop file appears. A rank that errs
    alone (an error of its own stage's) writes it and leaves; its peers may be waiting for
    its pipeline messages, which never come, and torchrun would wait with them."""
    if os.environ.get(ENV) != "1":
        return

    def watch() -> None:
        while read_stop(run_dir) is None:
            time.sleep(interval_s)
        exit_worker(0)

    threading.Thread(target=watch, name="meshplan-stop-watch", daemon=True).start()


def clear_stop(run_dir: Path) -> None:
    (Path(run_dir) / STOP_FILE).unlink(missing_ok=True)
