"""``planner.highs.one_thread``: the sharding ILP's HiGHS runs without scheduler workers, and the
search's MILPs after it get the scheduler they ask for (HiGHS keeps one per process, and an
instance asking another thread count than the running scheduler's is refused). Each check runs
in a fresh interpreter, so that HiGHS's scheduler starts as a plan's does."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The knapsack MIP of tests/highs_mips.py: a few hundred nodes, so HiGHS's scheduler is used.
MIP = """
import highspy
from planner.highs import one_thread
from highs_mips import knapsack


def threads() -> int:
    with open(f"/proc/{__import__('os').getpid()}/status") as f:
        return int(f.read().split("Threads:")[1].split()[0])

def mip(threads=None):
    h = knapsack(threads)
    status = h.run()
    return status == highspy.HighsStatus.kOk, round(h.getInfo().objective_function_value, 9)
"""


def _run(body: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    script = MIP + textwrap.dedent(body)
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_a_one_thread_run_follows_a_two_thread_scheduler_and_gives_it_back():
    """Two-thread MIP, then one-thread MIPs inside one_thread, then two threads again: each run
    accepted, with the same optimum. Without the reset on entry the one-thread run is refused
    (the scheduler runs two); without the one on exit the last run is."""
    out = _run(
        """
        ok2, first = mip(2)
        with one_thread():
            inside = [mip(1) for _ in range(3)]
        ok_after, after = mip(2)
        print(ok2, all(ok for ok, _ in inside), ok_after)
        print(first == after == inside[0][1])
        """
    )
    assert out == ["True", "True", "True", "True"]


def test_refused_without_one_thread():
    """What one_thread guards against, so the test above can fail: HiGHS refuses an instance
    whose thread count differs from the running scheduler's."""
    out = _run(
        """
        ok2, _ = mip(2)
        ok1, _ = mip(1)
        print(ok2, ok1)
        """
    )
    assert out == ["True", "False"]


def test_the_sharding_ilp_starts_no_scheduler_worker_and_leaves_the_default_to_the_search():
    """The sharding ILP after a MIP of the default scheduler (as a search that priced one TP
    degree then asks for another): it runs, with no HiGHS worker thread from its instance's
    creation to its last solve, and a default MIP after it gets the default scheduler back
    (its worker threads again)."""
    out = _run(
        """
        from planner.api import trace
        from planner.cost.sharding import build_problem, evaluate, sharding_milp
        import planner.cost.sharding as sharding

        traced = trace("examples/gpt.py", {"size": "tiny"}, use_cache=False)
        block = traced.blocks[1]
        prob = build_problem(traced.graph, block, 2)
        base = evaluate(prob, [0] * len(prob.ops), 1e-11)
        bare = threads()
        mip()
        seen = []
        run = sharding.quiet_highs

        class Counted:  # the ILP's instance, the process's threads seen after each run
            def __init__(self, h):
                self.h = h

            def __getattr__(self, name):
                return getattr(self.h, name)

            def run(self):
                status = self.h.run()
                seen.append(threads())
                return status

        def counted(**options):
            seen.append(threads())
            return Counted(run(**options))

        sharding.quiet_highs = counted
        solved = sharding_milp(prob, 1e-11, time_scale=base.time_s, memory_scale=base.memory)
        mip()
        # no worker: never more threads than before the first MIP (another library's
        # short-lived thread may have ended since), and the default's worker back after
        alone = len(seen) == 1 + len(sharding.LAMBDAS) and max(seen) <= bare
        print(len(solved) == len(sharding.LAMBDAS), alone, threads() > max(seen))
        """
    )
    assert out == ["True", "True", "True"]
