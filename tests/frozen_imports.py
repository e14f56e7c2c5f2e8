"""Imported last by the forked ranks' server (``PRELOAD`` in tests/forked_ranks.py), after torch,
the runtime and transformers' models: freeze what those imports left alive, some 400,000
objects, before any rank is forked. A rank's cycle collections then walk only what the rank
made (the runtime's full collection after each plan, ``runtime.build.release``, and those its
first plan's heap sets off before ``freeze_launch_state``), and, writing no collector header
of an imported object, leave the pages the rank shares with the server shared: 15-20% less CPU
for the ranks of four launching files (tests/test_sequence_parallel_runtime.py,
test_stage_tp.py, test_half_reduce.py, test_pipeline_buffers.py; 39.9 and 38.4 CPU-s without,
34.9 and 30.6 with, run alternately). The server thaws them as it exits, so that the exit frees
them (triton's nanobind bindings, where installed, report every instance still alive then as a
leak); a rank ends with ``os._exit`` and never runs it."""

import atexit
import gc

from runtime.build import freeze_launch_state  # imported above, with runtime.worker

freeze_launch_state()  # what a launch does between plans: collect, then freeze what is left
atexit.register(gc.unfreeze)
