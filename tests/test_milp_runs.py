"""What a warm plan reads back instead of computing again: the stage MILPs' HiGHS runs
(planner.search.milp.runs) and the candidates' split bounds and LP relaxations
(planner.search.bound_memo). A run read back gives the stage MILP exactly what solving gives
(placement, objective, proven bound, node count), also where the node limit stops the solve and
under a cutoff; another node limit or cutoff is another run; and a re-plan that reads every
MILP, LP and split bound back, computing none, writes the plan byte for byte (solve time aside)
that computing them wrote."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
from test_search_certificates import _pipeline, _record

from planner.api import plan
from planner.schema import dumps
from planner.search import bounds, driver, options
from planner.search.bound_memo import bounds_path
from planner.search.milp import solve
from planner.search.milp.runs import RunStore
from planner.search.milp.solve import solve_stage_milp

ROOT = Path(__file__).resolve().parent.parent


ARGS = dict(model_args={"size": "tiny"}, global_batch_size=64, profile="h100-sxm")


def _plan_gpt():
    return plan(ROOT / "examples" / "gpt.py", 16, gpus_per_node=4, **ARGS)


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    """GPT tiny on 16 GPUs planned once from an empty cache, and that cache: each test plans
    again from its own copy (warm_cache), so the copies see exactly what one cold plan kept."""
    cache = tmp_path_factory.mktemp("cold-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MESHPLAN_CACHE", str(cache))
        return _plan_gpt(), cache


@pytest.fixture
def warm_cache(cold, tmp_path, monkeypatch):
    """A copy of the cold plan's cache, set as this test's MESHPLAN_CACHE."""
    kept = tmp_path / "cache"
    shutil.copytree(cold[1], kept)
    monkeypatch.setenv("MESHPLAN_CACHE", str(kept))
    return kept


def _no_highs(*args, **kwargs):
    raise AssertionError("a run kept on disk must be read back, not solved")


def _no_bound(*args, **kwargs):
    raise AssertionError("a bound kept on disk must be read back, not computed")


@pytest.mark.parametrize("cutoff", [None, "above"])
def test_a_run_read_back_is_the_run_solved(tmp_path, monkeypatch, cutoff):
    sp = _pipeline(45.0)
    alone = solve_stage_milp(sp, node_limit=50)
    assert alone.status == "node_limit"  # the limit binds: the hardest case to reproduce
    limit = alone.objective * 1.01 if cutoff else None
    direct = solve_stage_milp(sp, node_limit=50, cutoff=limit)
    store = RunStore(tmp_path)
    kept = solve_stage_milp(sp, node_limit=50, cutoff=limit, runs=store)
    assert store.read == 0 and len(list(tmp_path.iterdir())) == 1
    monkeypatch.setattr(solve, "_highs", _no_highs)
    read = solve_stage_milp(sp, node_limit=50, cutoff=limit, runs=store)
    assert store.read == 1
    assert _record(read) == _record(kept) == _record(direct)
    with pytest.raises(AssertionError, match="read back"):  # another limit: another run
        solve_stage_milp(sp, node_limit=5, cutoff=limit, runs=store)


def test_a_corrupt_run_is_solved_again(tmp_path):
    sp = _pipeline(60.0)
    store = RunStore(tmp_path)
    first = solve_stage_milp(sp, node_limit=5, runs=store)
    (path,) = tmp_path.iterdir()
    path.write_text(path.read_text()[:20])
    again = solve_stage_milp(sp, node_limit=5, runs=store)
    assert store.read == 0 and _record(again) == _record(first)


def test_a_replan_reads_every_stage_milp_and_writes_the_same_plan(cold, warm_cache, monkeypatch):
    first = cold[0]
    runs = list((warm_cache / "milp").iterdir())
    assert first.search.solved >= 1 and runs  # stage MILPs were solved and kept
    kept = bounds_path(first.traced.cache_key).read_text()
    assert '"s' in kept and '"l' in kept  # split bounds and LPs were computed and kept
    monkeypatch.setattr(solve, "_highs", _no_highs)
    monkeypatch.setattr(driver, "split_bound", _no_bound)
    monkeypatch.setattr(bounds, "_solve_lp", _no_bound)
    monkeypatch.setattr(options, "block_options", _no_bound)  # the priced options are kept too
    second = _plan_gpt()
    assert sorted((warm_cache / "milp").iterdir()) == sorted(runs)  # nothing solved anew
    expected = copy.deepcopy(first.plan)
    expected.solver.solve_time_s = second.plan.solver.solve_time_s = 0.0
    assert dumps(second.plan) == dumps(expected)


def test_a_candidates_kept_bounds_need_no_problem_and_equal_computed_ones(cold):
    """bound_memo keeps each candidate's relaxed and split bounds under candidate_key (what its
    problem is built from): read back, neither builds a problem, and both equal the bounds
    computed from the problem; relaxed_bound(sp, b) is max(b, the kept value) for any b; a
    candidate or option that differs is another key."""
    import dataclasses
    import json
    import math

    from planner.search.bound_memo import BoundMemo, candidate_key
    from planner.search.milp.candidate import stage_problem
    from planner.search.milp.split_bound import split_bound

    result = cold[0].search
    pipelines = [c for c in result.candidates if c.pp > 1][:6]
    assert pipelines
    memo = BoundMemo()
    for c in pipelines:
        inp = result.inputs[c.key]
        sp = stage_problem(inp, c)
        key = candidate_key(inp, c)
        relaxed = memo.relaxed(key, lambda sp=sp: sp)
        split, step = memo.split_of(key, lambda sp=sp: sp)
        fresh = split_bound(sp)
        assert split == fresh and step == fresh.step_bound(sp)
        for b in (0.0, relaxed * 0.5, relaxed * 2, math.inf):
            assert bounds.relaxed_bound(sp, b) == max(b, relaxed)
        read = BoundMemo(json.loads(json.dumps(memo.entries)))  # as a warm plan reads them

        def no_problem():
            raise AssertionError("a kept bound must not build its problem")

        assert read.relaxed(key, no_problem) == relaxed
        assert read.split_of(key, no_problem) == (split, step)
        assert read.added == 0
        other = dataclasses.replace(c, zero=3 - c.zero)
        assert candidate_key(inp, other) != key
    c = pipelines[0]
    inp = result.inputs[c.key]
    options = [list(opts) for opts in inp.options]
    first = options[0][0]
    options[0][0] = dataclasses.replace(first, fwd_s=first.fwd_s * (1 + 1e-15) + 1e-300)
    changed = dataclasses.replace(inp, options=options, memo={})
    assert candidate_key(changed, c) != candidate_key(inp, c)


def test_a_replan_builds_a_stage_problem_only_for_a_milp(cold, warm_cache, monkeypatch):
    """Bounding a candidate on a warm plan reads its bounds back by candidate_key: the only
    problems built are those of the MILPs (at most one each), and the plan is the same."""
    from planner.search.milp import candidate

    first = cold[0]
    counts = {"built": 0, "milps": 0}
    build, solve_one = candidate.stage_problem, driver.solve_candidate

    def counted_build(*a, **k):
        counts["built"] += 1
        return build(*a, **k)

    def counted_solve(inp, cand, *a, sp=None, **k):
        counts["milps"] += 1
        return solve_one(inp, cand, *a, sp=counted_build(inp, cand) if sp is None else sp, **k)

    monkeypatch.setattr(driver, "stage_problem", counted_build)
    monkeypatch.setattr(driver, "solve_candidate", counted_solve)
    second = _plan_gpt()
    bounded = sum(1 for c in second.search.candidates if c.status != "dominated")
    assert 0 < counts["milps"] and counts["built"] <= counts["milps"] < bounded
    expected = copy.deepcopy(first.plan)
    expected.solver.solve_time_s = second.plan.solver.solve_time_s = 0.0
    assert dumps(second.plan) == dumps(expected)


def test_priced_options_read_back_are_the_options_priced(cold, warm_cache):
    """BoundMemo.options keeps a block class's priced options as their fields' values: read
    back from the file, each option equals one the plan priced, field for field and type for
    type (tuples stay tuples, ints ints), and every option the plan priced is read back."""
    import dataclasses
    import json

    from planner.search.bound_memo import BoundMemo

    first = cold[0]
    entries = json.loads(bounds_path(first.traced.cache_key).read_text())
    read = BoundMemo(entries)
    back = [o for k in entries if k.startswith("o") for o in read.options(k[1:], _no_bound)]
    priced = {o: o for inp in first.search.inputs.values() for opts in inp.options for o in opts}
    assert back and set(back) >= set(priced)  # every option priced is kept
    for o in back:
        same = priced.get(o)
        if same is None:
            continue  # priced, then filtered out by the plan's pins or not used
        for f in dataclasses.fields(o):
            assert type(getattr(o, f.name)) is type(getattr(same, f.name)), f.name
    assert any(o.tp_plan for o in back)  # nested tuples among them


def test_prefer_simpler_read_back_is_prefer_simpler_computed(cold, monkeypatch):
    """prefer_simpler's choice kept (BoundMemo.simpler) and read back gives the placement and
    cost that running its trials gives, without running them; here from a placement whose
    blocks all recompute fully where recomputing gains nothing."""
    import json

    from planner.cost.step import evaluate
    from planner.search.bound_memo import BoundMemo
    from planner.vocab import Recompute

    result = cold[0].search
    best = result.best
    inp = result.inputs[best.key]
    heavy = copy.deepcopy(best)
    choice = []
    for i, k in enumerate(best.config.choice):
        opts = inp.options[i]
        full = [
            j
            for j, o in enumerate(opts)
            if o.variant == opts[k].variant
            and o.recompute == Recompute.FULL
            and o.offload == opts[k].offload
        ]
        choice.append(full[0] if full else k)
    assert choice != best.config.choice
    heavy.config.choice = choice
    heavy.cost = evaluate(inp, heavy.config)
    computed, kept = copy.deepcopy(heavy), BoundMemo()
    driver.prefer_simpler(inp, computed, kept)
    plain = copy.deepcopy(heavy)
    driver.prefer_simpler(inp, plain)
    assert computed.config == plain.config and computed.cost == plain.cost
    assert computed.config.choice != heavy.config.choice  # the trials did simplify
    monkeypatch.setattr(driver, "_prefer_simpler", _no_bound)
    read = copy.deepcopy(heavy)
    driver.prefer_simpler(inp, read, BoundMemo(json.loads(json.dumps(kept.entries))))
    assert read.config == plain.config and read.cost == plain.cost


def test_entries_keyed_by_another_planners_code_are_dropped_when_read(tmp_path, monkeypatch):
    """The bounds file holds one planner version's code-keyed entries (candidates' bounds,
    priced options, prefer_simpler's choices): those another version wrote are dropped when
    the file is read, the split bounds and LPs (keyed by their numbers alone) stay, and a
    file written by this version is read back whole."""
    import json

    from planner.search.bound_memo import CODE, _planner_code, load_bounds, save_bounds

    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    old = {CODE: "another", "r1": 2.0, "p1": [1.0, 2.0, 3.0, 4.0], "o1": [], "t1": [0]}
    old |= {"s1": [1.0, 2.0, 3.0], "l1": ["optimal", 5.0]}
    path = bounds_path("trace")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(old))
    memo = load_bounds("trace")
    assert memo.entries == {CODE: _planner_code(), "s1": [1.0, 2.0, 3.0], "l1": ["optimal", 5.0]}
    memo.entries["r2"] = 3.0
    memo.added = 1
    save_bounds("trace", memo)
    assert load_bounds("trace").entries == memo.entries


SIZES = (16, 8)


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """GPT tiny at each of SIZES planned on its own, everything in one process, from an empty
    cache, and the bounds file those plans left: the reference for plans sharing a memo."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MESHPLAN_CACHE", str(tmp_path_factory.mktemp("alone")))
        mp.setenv("MESHPLAN_NO_FORK", "1")
        plans = []
        for gpus in SIZES:
            plans.append(plan(ROOT / "examples" / "gpt.py", gpus, gpus_per_node=4, **ARGS))
            plans[-1].plan.solver.solve_time_s = 0.0
        from planner.search.bound_memo import load_bounds

        return plans, load_bounds(plans[0].traced.cache_key).entries


@pytest.mark.parametrize("fork", [True, False])
def test_plans_sharing_a_kept_memo_read_the_file_once_save_once_and_plan_alike(
    alone, tmp_path, monkeypatch, fork
):
    """A pool's plans share one BoundMemo (``plan(bounds=...)``): the bounds file is read by
    the first plan only and written by ``save_kept`` alone, once; the plans are those planned
    each on its own; the memo holds what the plans computed, the baselines' forked copy's
    entries included (it sends back only those it added: ``since``), and the file saved is
    read back whole."""
    import json

    from planner.search import bound_memo
    from planner.search.bound_memo import BoundMemo, save_kept

    gpt = ROOT / "examples" / "gpt.py"
    args = ARGS
    sizes = SIZES
    alone, on_its_own = alone
    if not fork:
        monkeypatch.setenv("MESHPLAN_NO_FORK", "1")
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "kept"))
    adopted, reads, load, adopt = [], [], bound_memo.load_bounds, BoundMemo.adopt
    monkeypatch.setattr(BoundMemo, "adopt", lambda self, e: adopted.append(e) or adopt(self, e))
    monkeypatch.setattr(bound_memo, "load_bounds", lambda key: reads.append(key) or load(key))
    kept: dict = {}
    for gpus, want in zip(sizes, alone, strict=True):
        got = plan(gpt, gpus, gpus_per_node=4, bounds=kept, **args)
        got.plan.solver.solve_time_s = 0.0
        assert dumps(got.plan) == dumps(want.plan)
    key = alone[0].traced.cache_key
    assert reads == [key] and list(kept) == [key]
    assert not bounds_path(key).exists()  # the plans saved nothing
    assert set(kept[key].entries) == set(on_its_own)
    assert fork == bool(adopted) and all(0 < len(e) < len(on_its_own) for e in adopted)
    save_kept(kept)
    assert kept[key].added == 0 and reads == [key]
    assert load(key).entries == BoundMemo(json.loads(json.dumps(kept[key].entries))).entries


def test_since_gives_the_entries_added_after_a_count():
    from planner.search.bound_memo import BoundMemo

    memo = BoundMemo({"a": [1], "b": [2]})
    memo.adopt({"c": [3], "a": [9]})
    assert memo.since(0) == {"a": [1], "b": [2], "c": [3]}
    assert memo.since(2) == {"c": [3]} and memo.since(3) == {}
