"""Imported last by the forked ranks' server (``PRELOAD`` in tests/forked_ranks.py), after torch,
the runtime and transformers' models: freeze what those imports left alive, some 400,000
objects, before any rank is forked. A rank's cycle collections then walk only what the rank
made (the runtime's full collection after each plan, ``runtime.build.release``, and those its
first plan's heap sets off before ``freeze_launch_state``), and, writing no collector header
of an imported object, leave the pages the rank shares with the server shared: 15-20% less CPU
for the ranks of four launching files (tests/test_sequence_parallel_runtime.py,
test_stage_tp.py, test_half_reduce.py, test_pipeline_buffers.py; 39.9 and 38.4 CPU-s without,
34.9 and 30.6 with, run alternately). The server thaws them as it exits (tests/frozen_heap.py)."""

from frozen_heap import freeze_until_exit

freeze_until_exit()
