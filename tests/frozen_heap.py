"""Freeze a test process's heap until it exits: the test session once its tests are collected
(tests/conftest.py), the forked ranks' server once its imports are done
(tests/frozen_imports.py).

Frozen, what is alive then is walked by no later cycle collection. The thaw waits for the
interpreter's exit, and not for an earlier hook: pytest's own teardown runs five full
collections after the session's last hook (its search for unraisable exceptions), and each
walked the whole thawed heap, some 600,000 objects. It still comes before the exit frees the
heap, because triton's nanobind bindings, where installed, report every instance still alive
then as a leak. A forked rank ends with ``os._exit`` and never runs it."""

import atexit
import gc


def freeze_until_exit() -> None:
    """Collect, freeze what is left (``runtime.build.freeze_launch_state``, what a launch does
    between plans), and thaw it when the interpreter exits."""
    from runtime.build import freeze_launch_state

    freeze_launch_state()
    atexit.register(gc.unfreeze)
