"""The ``plan`` command's entry: the one module that composes the planner and the runtime.

The planner never imports the runtime (pyproject's import contracts); a command that plans and
then runs (``plan MODEL.py --run``, ``plan run PLAN.json``) meets both here, and the planner
receives the runtime only as the ``run`` function this package hands it."""
