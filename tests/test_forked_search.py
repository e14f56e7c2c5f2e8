"""The baselines searched in a forked copy of the planning process (``planner.search.overlap``)
give what searching them in this process, after the plan's own search, gives: the same plan
document, the same ILP solutions, probe verdicts and bounds kept for the next plan; a copy that
fails leaves the work to this process; a MILP solved in a copy after this process solved one
finishes (HiGHS's scheduler threads are not copied by fork)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from planner.api import plan
from planner.search.overlap import Forked

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork: POSIX only")


def test_the_copy_computes_and_hands_back_its_answer():
    parent = os.getpid()
    pending = Forked(lambda: (os.getpid(), [1.5, "x"]))
    pid, value = pending.result()
    assert pending.forked and pid != parent and value == [1.5, "x"]


def test_a_copy_that_fails_leaves_the_work_to_this_process():
    parent = os.getpid()

    def compute() -> int:
        if os.getpid() != parent:
            raise RuntimeError("only in the copy")
        return 7

    pending = Forked(compute)
    assert pending.result() == 7 and not pending.forked


def test_no_fork_computes_here(monkeypatch):
    monkeypatch.setenv("MESHPLAN_NO_FORK", "1")
    pending = Forked(os.getpid)
    assert pending.result() == os.getpid() and not pending.forked


def test_a_milp_in_the_copy_finishes_after_one_solved_here():
    """Without resetting HiGHS's scheduler the copy's MILP waits forever on threads that only
    the parent has (checked: it hangs); here it returns the parent's optimum."""
    script = textwrap.dedent(
        """
        from highs_mips import knapsack
        from planner.search.overlap import Forked

        def solve():
            h = knapsack()
            h.run()
            return h.getInfo().objective_function_value

        here = solve()
        pending = Forked(solve)
        print(here == pending.result(), pending.forked)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.split() == ["True", "True"], out.stderr


def _kept(cache: Path) -> dict:
    """What a plan kept for the next one: ILP solutions, probe verdicts, bounds (each file's
    JSON; the ILP solutions as a set of entries, their order being the order computed), and
    the names of the kept MILP runs."""
    kept = {}
    for kind in ("variants", "probes", "bounds"):
        for path in (cache / kind).iterdir():
            doc = json.loads(path.read_text())
            if kind == "variants":
                doc = sorted(json.dumps(entry) for entry in doc)
            kept[f"{kind}/{path.name}"] = doc
    kept["milp"] = sorted(p.name for p in (cache / "milp").iterdir())
    return kept


def test_forked_baselines_plan_and_keep_what_the_serial_search_does(tmp_path, monkeypatch):
    """GPT (tiny) on two nodes of 4, the three baselines: Megatron's rule is TP 4 over a
    2-stage pipeline, its ILPs and probes computed before the fork; the serial run first,
    then the forked one on its trace with what the search kept dropped."""
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    gpt = ROOT / "examples" / "gpt.py"
    runs = {}
    for way in ("serial", "forked"):
        if way == "serial":
            monkeypatch.setenv("MESHPLAN_NO_FORK", "1")
        else:
            monkeypatch.delenv("MESHPLAN_NO_FORK", raising=False)
            for kind in ("variants", "probes", "bounds", "milp"):
                shutil.rmtree(tmp_path / kind)
        done = plan(
            gpt, 8, model_args={"size": "tiny"}, profile="h100-sxm", nodes=2, gpus_per_node=4
        )
        doc = done.plan.to_dict()
        doc["solver"]["solve_time_s"] = 0
        runs[way] = (doc, _kept(tmp_path))
    baselines = [a for a in runs["forked"][0]["solver"]["alternatives"] if a.get("baseline")]
    assert len(baselines) == 3
    assert runs["forked"][0] == runs["serial"][0]
    assert runs["forked"][1] == runs["serial"][1]


def test_a_fallback_replaces_the_work_where_no_copy_answers(monkeypatch):
    parent = os.getpid()

    def compute() -> int:
        if os.getpid() != parent:
            raise RuntimeError("only in the copy")
        return 7

    failed = Forked(compute, fallback=lambda: 0)
    assert failed.result() == 0 and not failed.forked
    monkeypatch.setenv("MESHPLAN_NO_FORK", "1")
    assert Forked(compute, fallback=lambda: 0).result() == 0


def _first_plan_setup(tmp_path, monkeypatch):
    """A tiny GPT's trace, on two nodes of 4 (Megatron's rule: TP 4), with empty stores."""
    from planner.api import trace
    from planner.cost.eager_probe import EagerShardProbe
    from planner.hardware.cluster import make_cluster
    from planner.search import Pins
    from planner.search.memo import SearchMemo
    from planner.training import training_from

    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    monkeypatch.delenv("MESHPLAN_NO_FORK", raising=False)
    traced = trace(ROOT / "examples" / "gpt.py", {"size": "tiny"}, use_cache=False)
    cluster, _ = make_cluster(8, "h100-sxm", 4, 2)
    training = training_from(traced.model_file.training, "gpt.py")
    probe = EagerShardProbe(traced.model_file, training.dtype, None, traced.repeats)
    return traced, cluster, training, Pins(), SearchMemo(variants={}), probe


def test_the_ilps_solved_in_a_copy_are_those_solved_here(tmp_path, monkeypatch):
    """``ilps_beside``: the copy's solutions under each key the first search asks for equal
    the ones solved in this process (the probe's model built here meanwhile), and taking them
    leaves the memo holding exactly the serial run's entries, in its order."""
    from planner.api import ilps_beside, variants_for
    from planner.search.driver import prepare

    traced, cluster, training, pins, memo, probe = _first_plan_setup(tmp_path, monkeypatch)
    presolved = ilps_beside(traced, cluster, training, pins, memo, probe)
    assert presolved and probe._model is not None  # the copy answered; the model is built
    runs = {}
    for way, given in (("serial", {}), ("presolved", dict(presolved))):
        solved: dict = {}
        variants_of = variants_for(traced.graph, cluster, "auto", solved, probe, given)
        prepare(traced.graph, traced.blocks, cluster, training, replace(pins, tp=4), variants_of)
        runs[way] = solved
    assert list(runs["presolved"]) == list(runs["serial"])
    assert runs["presolved"] == runs["serial"]
    assert {k: presolved[k] for k in runs["serial"]} == runs["serial"]


def test_a_failing_ilp_copy_leaves_the_ilps_to_this_process(tmp_path, monkeypatch):
    """The copy fails (its ``prepare`` raises there only): nothing is presolved, no copy is
    left running, and the plan's ILPs are solved here as before."""
    import planner.search.driver as driver
    from planner.api import ilps_beside

    traced, cluster, training, pins, memo, probe = _first_plan_setup(tmp_path, monkeypatch)
    parent, prepare = os.getpid(), driver.prepare

    def failing(*args, **kwargs):
        if os.getpid() != parent:
            raise RuntimeError("only in the copy")
        return prepare(*args, **kwargs)

    forked, fork = [], os.fork

    def recorded() -> int:
        pid = fork()
        forked.append(pid)
        return pid

    monkeypatch.setattr(driver, "prepare", failing)
    monkeypatch.setattr(os, "fork", recorded)
    assert ilps_beside(traced, cluster, training, pins, memo, probe) == {}
    assert len(forked) == 1 and probe._model is not None
    with pytest.raises(ChildProcessError):
        os.waitpid(forked[0], os.WNOHANG)  # the copy is gone, reaped
