"""The command imports only what it uses: ``plan --help`` and ``plan show`` never import torch
(about 1.4 s of the whole command on the development machine), and ``plan --help`` imports
neither the solver nor matplotlib. Each check runs the command in a fresh interpreter and reads
``sys.modules`` when it returns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.api import plan as make_plan
from planner.schema import dumps

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "matplotlib", "cvxpy", "highspy", "networkx", "scipy")


def loaded_after(argv: list[str]) -> tuple[int, set[str], str]:
    """Run ``plan ARGV`` in a fresh interpreter: its exit status, the heavy top-level packages
    it imported and what it printed."""
    code = (
        "import contextlib, io, json, sys\n"
        "from meshplan.cli import main\n"
        "printed = io.StringIO()\n"
        "with contextlib.redirect_stdout(printed):\n"
        "    try:\n"
        f"        rc = main({argv!r})\n"
        "    except SystemExit as exc:  # argparse's --help\n"
        "        rc = exc.code\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(json.dumps([rc, heavy, printed.getvalue()]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # MESHPLAN_CACHE passes on
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True
    )
    rc, heavy, printed = json.loads(out.stdout.strip().splitlines()[-1])
    return rc, set(heavy), printed


@pytest.mark.parametrize(
    "argv, status, says",
    [
        (["--help"], 0, "usage: plan"),
        (["show", "--help"], 0, "usage: plan show"),
        (["model.py", "--gpus", "zero"], 2, ""),
    ],
)
def test_help_and_bad_flags_import_nothing_heavy(argv, status, says):
    rc, heavy, printed = loaded_after(argv)
    assert (rc, heavy) == (status, set())
    assert says in printed


def test_show_draws_a_saved_plan_without_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "cache"))
    doc = make_plan(ROOT / "examples" / "mlp.py", 8, model_args={"size": "small"}).plan
    (tmp_path / "plan.json").write_text(dumps(doc))
    rc, heavy, _ = loaded_after(["show", str(tmp_path / "plan.json"), "--out", str(tmp_path / "r")])
    assert rc == 0
    assert "torch" not in heavy and "cvxpy" not in heavy and "networkx" not in heavy
    assert (tmp_path / "r" / "report.html").stat().st_size > 10_000


def test_a_replan_from_the_cache_imports_no_torch(tmp_path, monkeypatch):
    """The trace, the sharding ILP's solutions and the probe's verdicts all come from the
    cache: nothing left to run on a model, so torch stays unimported (warm 70B: -1.4 s)."""
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "cache"))
    # a named profile: without one, torch is asked whether this machine has a GPU
    argv = ["examples/gpt.py", "--gpus", "8", "--profile", "h100-sxm", "--no-report"]
    argv += ["--out", str(tmp_path / "p")]
    first = make_plan(ROOT / "examples" / "gpt.py", 8, profile="h100-sxm").plan  # fills the cache
    rc, heavy, _ = loaded_after(argv)
    assert rc == 0 and "torch" not in heavy
    again = json.loads((tmp_path / "p" / "plan.json").read_text())
    again["solver"]["solve_time_s"] = first.solver.solve_time_s
    again["model"]["file"] = first.model.file
    assert json.dumps(again, indent=2, sort_keys=True) + "\n" == dumps(first)


def test_the_process_entry_ends_as_the_interpreter_would_without_its_teardown():
    """``plan``'s entry (meshplan.cli.console) skips only the interpreter's teardown (a second
    of a 70B's first plan): main's status is the process's, a thread that is no daemon is
    waited for, the exit handlers run after it and what either stream holds is printed;
    ``python -m meshplan`` goes through it too and still says what was wrong."""
    code = (
        "import atexit, sys, threading, time\n"
        "from meshplan.cli import console\n"
        "atexit.register(lambda: print('handler', flush=False))\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), print('thread'))).start()\n"
        "sys.stderr.write('unflushed')\n"
        "console(['model.py', '--gpus', 'zero'])\n"
        "print('after console')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONUNBUFFERED", None)  # stdout to a pipe holds what it prints until flushed
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert (out.returncode, out.stdout.split()) == (2, ["thread", "handler"])
    assert out.stderr.startswith("unflushed") and "expected a positive integer" in out.stderr
    module = [sys.executable, "-m", "meshplan", "model.py", "--gpus", "zero"]
    ran = subprocess.run(module, capture_output=True, text=True, env=env, cwd=ROOT)
    assert ran.returncode == 2 and "--gpus: expected a positive integer" in ran.stderr


def test_the_api_plans_with_the_collector_paused_and_switches_it_back_on(monkeypatch):
    """``planner.api.plan`` runs under ``cycles_uncollected``, as the command does: a Python
    caller planning many models in one process is spared the collector's walks over each
    plan's heap, and finds the collector on again after, even when the plan failed."""
    import gc

    import planner.api

    seen = []

    def trace(*args, **kwargs):
        seen.append(gc.isenabled())
        raise RuntimeError("stop here")

    monkeypatch.setattr(planner.api, "trace", trace)
    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="stop here"):
        planner.api.plan(ROOT / "examples" / "mlp.py", 2, profile="cpu")
    assert seen == [False] and gc.isenabled()


def test_a_plan_leaves_its_objects_to_the_collectors_oldest_generation(thawed_collector):
    """``cycles_uncollected`` plans with the collector off and hands what the plan allocated
    to its oldest generation, so switching it back on costs no pass over all of them; a
    collector that was off stays off, and objects a caller froze stay frozen."""
    import gc

    from planner.collector import cycles_uncollected

    was = gc.isenabled()
    gc.enable()
    try:
        with cycles_uncollected():
            assert not gc.isenabled()
            made = [[i] for i in range(1000)]
        assert gc.isenabled()
        oldest = {id(o) for o in gc.get_objects(generation=2)}
        assert all(id(m) in oldest for m in made)
        gc.disable()
        with cycles_uncollected():
            pass
        assert not gc.isenabled()
        gc.enable()
        gc.freeze()
        frozen = gc.get_freeze_count()
        with cycles_uncollected():
            more = [[i] for i in range(1000)]
        assert gc.get_freeze_count() == frozen and len(more) == 1000
    finally:
        (gc.enable if was else gc.disable)()
