"""The report drawn beside the search, in a process of its own.

``plan MODEL.py`` starts this worker before it traces: the worker imports matplotlib and the
figure modules (about a second of CPU) while the planner traces and searches on the other
core, then waits for the plan on its stdin (the plan, the report folder, the command line,
whether SVG is wanted), draws (on both cores: by then the planner only waits; see
``figures.render_all``), and answers with the files written (or the one-line error) on
its stdout.

A draft comes first: the plan as it stands when the plan's own search ends, before the
hand-written baselines' search (in a forked copy of the planner) is done. The figures read
nothing the baselines add (they only add rows to ``solver.alternatives``, report.html's
table), so the worker draws them from the draft while the baselines are searched, and when the
plan comes keeps them if the plan equals the draft but for those rows
(``report.figures_hold``), drawing them again otherwise; only report.html waits for the plan.
The planner writes to the worker from a thread of its own, so that a request larger than the
pipe does not hold it up while the worker draws.

The plan travels as the planner's own record, pickled between these two processes of one
command: the worker draws exactly what ``write_report`` would in the planner (reading
plan.json back would also re-validate it, and refuse a plan the planner may write, such as one
whose alternative has an infinite lower bound). The planner prints its summary as soon as
plan.json is written, and waits for the report only at the end, so report.html is complete when
the command returns.

Started with ``python -m planner.report.worker``; a planner that ends before asking (an error,
an infeasible request) closes the worker's stdin and it leaves without drawing.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from planner.errors import UserInputError
from planner.process_end import exit_without_teardown
from planner.schema import Plan


class ReportWorker:
    """The running worker; ``draw`` sends the one request, ``result`` waits for its answer."""

    def __init__(self) -> None:
        root = str(Path(__file__).resolve().parents[2])  # the folder holding ``planner``
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}
        # its warnings go to a file, not a pipe nobody reads until the end (a full pipe would
        # block it)
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "planner.report.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
        )
        self._asked = False
        self._writer: threading.Thread | None = None

    def draft(self, plan: Plan, svg: bool) -> None:
        """Let the worker draw the figures of ``plan`` before the plan itself comes (``draw``):
        the plan before its baselines are in."""
        self._send({"draft": plan, "svg": svg}, last=False)

    def draw(self, plan: Plan, out_dir: Path, command: str, svg: bool) -> None:
        """Ask for the report of ``plan``."""
        request = {"plan": plan, "out": str(out_dir), "command": command, "svg": svg}
        self._send(request, last=True)
        self._asked = True

    def _send(self, request: dict, last: bool) -> None:
        """Write ``request`` (pickled here, as it is now) to the worker from a thread, after
        the request before it; ``last`` closes the worker's stdin after it."""
        data = pickle.dumps(request)
        if self._writer is not None:
            self._writer.join()
        self._writer = threading.Thread(target=self._write, args=(data, last), daemon=True)
        self._writer.start()

    def _write(self, data: bytes, last: bool) -> None:
        stdin = self._proc.stdin
        assert stdin is not None
        try:
            stdin.write(data)
            stdin.flush()
            if last:
                stdin.close()
        except OSError:
            pass  # the worker is gone: ``result`` says why

    def result(self) -> list[Path]:
        """The files the worker wrote; its UserInputError raised here, as one line."""
        if self._writer is not None:
            self._writer.join()
        assert self._proc.stdout is not None
        out = self._proc.stdout.read().decode()
        self._proc.wait()
        try:
            answer = json.loads(out.strip().splitlines()[-1])
        except (IndexError, ValueError):
            self._stderr.seek(0)
            why = _last_line(self._stderr.read())
            raise RuntimeError(f"the report worker failed: {why}") from None
        if "error" in answer:
            raise UserInputError(answer["error"])
        return [Path(p) for p in answer["written"]]

    def close(self) -> None:
        """Let a worker that was never asked leave (it sees its stdin end)."""
        if self._writer is not None:
            self._writer.join()
        if not self._asked and self._proc.poll() is None:
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.close()
            except OSError:
                pass
            self._proc.wait()
        self._stderr.close()

    def __enter__(self) -> ReportWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def serve() -> int:
    """The worker's side: import the figures, draw the draft's figures if one comes, then
    answer the plan's request from stdin. Without the cyclic garbage collector: matplotlib's
    artists refer to each other, so its passes found the figures' objects alive over and
    again (a sixth of drawing Llama-3-405B / 16,384's figures' CPU), for some 20 MB of
    garbage this short-lived process leaves to its exit."""
    gc.disable()
    import planner.report.html  # noqa: F401
    from planner.report import figure_formats, figures_hold, write_report
    from planner.report.figures import render_all  # matplotlib: the import this worker hides

    drafted = None  # (draft plan, svg, its figures' bytes)
    while True:
        try:
            request = pickle.load(sys.stdin.buffer)  # from the planner that started this process
        except (EOFError, pickle.UnpicklingError):
            return 0  # the planner ended without a plan
        if "draft" not in request:
            break
        draft, svg = request["draft"], request["svg"]
        drafted = (draft, svg, render_all(draft, figure_formats(svg), split=True))
    plan, svg = request["plan"], request["svg"]
    rendered = None
    if drafted is not None and drafted[1] == svg and figures_hold(drafted[0], plan):
        rendered = drafted[2]
    try:
        written = write_report(
            plan, Path(request["out"]), request["command"], svg, split=True, rendered=rendered
        )
    except UserInputError as exc:
        print(json.dumps({"error": str(exc)}))
        return 0
    print(json.dumps({"written": [str(p) for p in written]}))
    return 0


if __name__ == "__main__":
    # the planner reads this process's answer to its end, so it waits for the exit too
    exit_without_teardown(serve())
