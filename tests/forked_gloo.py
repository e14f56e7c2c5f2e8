"""Gloo ranks forked from the test process (torch already imported: no launch), for the
one-process kill files that need a few real ranks. Each rank runs ``target(rank, store_path,
queue)`` and puts its results, or its traceback, on the queue."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from pathlib import Path


def run_ranks(
    target: Callable, world: int, store: Path, messages: int, check: Callable[[tuple], None]
) -> list[tuple]:
    """The first ``messages`` items the ``world`` ranks put on the queue, each handed to
    ``check`` as it arrives (so a rank's traceback fails the test before the others' wait
    at their barrier does), then every rank joined with exit status 0. A rank still running
    when anything fails is killed, so a failing test never leaves ranks behind."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, str(store), queue)) for r in range(world)]
    for p in procs:
        p.daemon = True  # a rank still waiting when the test fails ends with it
        p.start()
    got = []
    try:
        for _ in range(messages):
            item = queue.get(timeout=120)
            check(item)
            got.append(item)
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.exitcode is None:
                p.kill()
                p.join()
    return got
