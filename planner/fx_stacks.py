"""torch.export without the Python stack trace torch.fx records on every node it traces.

For each op a trace records, torch.fx walks the interpreter's frames and keeps the stack that
made it (``node.meta["stack_trace"]``). Neither the planner nor the runtime reads them, and
they were a fifth of the CPU of tracing a small model (``trace_model`` on eight tiny models:
3.31 CPU-s with them, 2.60 without, the means of three runs each). torch has a switch for it,
``torch.fx.config.do_not_emit_stack_traces``; the planner's trace and calibration's op count
turn it on for the length of their export, and put back what the caller had. (The runtime's
pipeline trace, where it was 2% of the ranks' CPU, showed no difference that the machine's
noise did not hide, so it keeps torch's default.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.fx.config


@contextlib.contextmanager
def stack_traces_off() -> Iterator[None]:
    """torch.fx records no Python stack trace on the nodes traced inside."""
    was = torch.fx.config.do_not_emit_stack_traces
    torch.fx.config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        torch.fx.config.do_not_emit_stack_traces = was
