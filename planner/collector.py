"""The cycle collector paused while a plan builds its heap, for the command line and the API."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def cycles_uncollected() -> Iterator[None]:
    """Plan without the cyclic garbage collector, restored after. A plan builds a large heap that
    lives to the end (the traced graph, the kept bounds, the priced options, the plan's records) and
    leaves few cycles, so the collector's full passes only walked it again and again: a fifth of a
    warm plan's CPU on Llama-3-405B / 16,384, and a quarter of tracing Llama-3-70B, whose peak
    memory grew 2% without them. A forked copy of the search then also leaves the pages it shares
    with this process unwritten. A caller of ``planner.api.plan`` that plans many models in one
    process (a pool's search, a test session) pays the same walks, over its own heap as well.

    Switched back on, the collector would first pass over every object the plan allocated (all still
    in its youngest generation): 4% of a first plan of the 70B's sampled time (py-spy, under load).
    So they move to its oldest generation first, without a pass (a freeze and a thaw move lists, in
    constant time), where only a later full collection visits them. Nested, the inner one finds the
    collector off and leaves it to the outer."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if not gc.get_freeze_count():  # a caller's frozen objects stay frozen
                gc.freeze()
                gc.unfreeze()
            gc.enable()
