"""The search's certificates and its work limits.

- A MILP stopped by its node limit returns the same placement, objective, bound and node count
  every time, with a core of the machine burned by another process or not: the limits are work,
  not wall-clock time.
- plan.json records one certificate per candidate; they agree with each other (the chosen
  plan's gap is (objective - bound) / objective, every pruned candidate's bound is at least the
  chosen step time less the search tolerance, no solved candidate is faster than the chosen
  one), and a plan written before certificates existed still loads.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cluster_of, make_block, make_option

from planner.api import plan
from planner.cost.records import CostInputs
from planner.schema import plan_from_dict
from planner.search import Candidate
from planner.search.driver import SEARCH_REL_TOL
from planner.search.milp.candidate import stage_problem
from planner.search.milp.solve import solve_stage_milp
from planner.training import Training

ROOT = Path(__file__).resolve().parent.parent
GPT = ROOT / "examples" / "gpt.py"


def _pipeline(memory_gib: float):
    """30 layers with six recompute/offload options, an embedding and a two-option head, on
    8 stages under 1F1B and ZeRO-3: a MILP that needs branching, not its root alone."""
    variants = [
        (1.0, 1, "none", "none"),
        (1.25, 3, "selective", "none"),
        (1.4, 12, "full", "none"),
        (1.02, 1, "none", "optimizer+params"),
        (1.3, 3, "selective", "optimizer+params"),
        (1.45, 12, "full", "optimizer+params"),
    ]
    layer = [make_option(1e-3 * f, 1e9, 3e9 / s, recompute=r, offload=o) for f, s, r, o in variants]
    head = [make_option(2.1e-3, 5e8, 4e9), make_option(2.6e-3, 5e8, 1e9, recompute="full")]
    blocks = [make_block(0, "E", params=int(5e8))]
    blocks += [make_block(i, "L", params=int(1e9)) for i in range(1, 31)]
    blocks += [make_block(31, "H", params=int(5e8))]
    options = [[make_option(0.3e-3, 5e8, 1e8)]] + [layer] * 30 + [head]
    cl = cluster_of(
        16, memory_bytes=memory_gib * 2**30, reserved_bytes=2**30, host_memory_bytes=1600 * 2**30
    )
    # 16-bit gradient buffers: the instance was sized so that the node limit binds
    inp = CostInputs(blocks, options, 1, cl, Training(64, persistent_grad_buffers=True))
    return stage_problem(inp, Candidate(8, 2, 1, 1, "1f1b", 1, 3))


def _record(sol):
    return (sol.status, sol.objective, sol.dual_bound, sol.nodes, sol.counts)


@pytest.mark.parametrize("memory_gib,nodes", [(60.0, 5), (45.0, 50)])
def test_a_node_limited_milp_gives_the_same_answer_with_a_core_burned(memory_gib, nodes):
    sp = _pipeline(memory_gib)
    first = solve_stage_milp(sp, node_limit=nodes)
    assert first.status == "node_limit"  # the limit binds: this is what must not vary
    assert first.dual_bound < first.objective
    again = solve_stage_milp(sp, node_limit=nodes)
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        loaded = solve_stage_milp(sp, node_limit=nodes)
    finally:
        burner.kill()
        burner.wait()
    assert _record(again) == _record(first)
    assert _record(loaded) == _record(first)
    full = solve_stage_milp(sp)
    assert full.status == "optimal"
    assert first.dual_bound <= full.objective * (1 + 1e-9) <= first.objective * (1 + 1e-9)


@pytest.fixture(scope="module")
def gpt_plan():
    return plan(GPT, 8, model_args={"size": "tiny"}, profile="h100-sxm").plan.to_dict()


def test_every_candidate_has_a_consistent_certificate(gpt_plan):
    sol = gpt_plan["solver"]
    certs = sol["certificates"]
    assert len(certs) == sol["candidates_total"]
    (chosen,) = [c for c in certs if c["status"] == "chosen"]
    t = gpt_plan["predicted"]["step_time_s"]
    assert chosen["objective"] == pytest.approx(t, rel=1e-12)
    # objective and bound are written to 12 significant digits: their difference (the gap's
    # numerator) carries up to one unit in the 12th digit of each
    rounding = 2 * 10 ** (math.floor(math.log10(t)) - 11) / t
    assert chosen["gap"] == pytest.approx((t - chosen["bound"]) / t, abs=rounding)
    assert sol["bound"] <= t * (1 + 1e-12)
    assert sol["gap"] == pytest.approx((t - sol["bound"]) / t, rel=1e-9, abs=1e-15)
    assert (sol["status"] == "optimal") == (sol["gap"] == 0)
    pruned = [c for c in certs if c["status"] == "pruned-bound"]
    assert pruned, "the tiny GPT's search prunes by bound"
    for c in pruned:
        assert c["bound"] >= t * (1 - SEARCH_REL_TOL) * (1 - 1e-12), c["label"]
    for c in certs:
        if c["status"] == "solved":
            assert c["objective"] >= t * (1 - 1e-12), c["label"]
            assert c["bound"] <= c["objective"] * (1 + 1e-12), c["label"]
        if c["status"] in ("pruned-memory", "infeasible"):
            assert c["bound"] is None and c["objective"] is None, c["label"]
    assert sol["work_limits"]["first_pass_nodes"] > 0
    assert sol["nodes"] == sum(c["nodes"] for c in certs)


def test_a_plan_without_certificates_still_loads(gpt_plan):
    old = {**gpt_plan, "solver": dict(gpt_plan["solver"])}
    for key in ("bound", "nodes", "work_limits", "certificates"):
        del old["solver"][key]
    loaded = plan_from_dict(old)
    assert loaded.solver.certificates == [] and loaded.solver.bound is None
    assert (
        plan_from_dict(gpt_plan).solver.certificates[0].label
        == gpt_plan["solver"]["certificates"][0]["label"]
    )


def test_pipelines_are_solved_in_order_of_their_strongest_bound(monkeypatch):
    """The first pass orders pipelines by their first (cheap) bound, but solves one only when
    it comes up again at its stronger bounds (LP relaxation, split bound): a deep pipeline
    whose cheap bound is low and whose split bound is not waits, and the MILP of the
    candidate that wins meanwhile prunes it unsolved. Solving in the cheap order (what the
    search did before) builds both MILPs. Each candidate here states its bounds and its
    optimum; the search's own code decides which MILPs run."""
    from types import SimpleNamespace

    import planner.search.driver as driver

    def cand(mbs: int, cheap: float, strong: float, optimum: float) -> Candidate:
        c = Candidate(pp=2, dp=1, tp=1, micro_batch_size=mbs, schedule="1f1b",
                      virtual_stages=1, zero=0, bound=cheap)  # fmt: skip
        facts[id(c)] = (strong, optimum)
        return c

    facts: dict[int, tuple[float, float]] = {}
    deep = cand(1, cheap=1.0, strong=3.0, optimum=3.5)
    wins = cand(2, cheap=2.0, strong=2.2, optimum=2.5)
    never = cand(4, cheap=2.6, strong=2.6, optimum=2.7)
    solved: list[int] = []

    def relaxed(sp, bound, memo=None):
        return max(bound, facts[id(sp)][0] - 0.1)

    def split(sp):
        return SimpleNamespace(feasible=True, step_bound=lambda _sp: facts[id(sp)][0])

    def solve(inp, c, cutoff, nodes, sp=None, split=None, runs=None):
        solved.append(c.micro_batch_size)
        optimum = facts[id(c)][1]
        if cutoff is not None and optimum >= cutoff:
            c.status, c.bound = "pruned-bound", max(c.bound, cutoff)
            return
        c.status, c.proven, c.bound = "solved", True, optimum
        c.cost = SimpleNamespace(step_time_s=optimum, peak_memory_bytes=1.0, feasible=True)

    monkeypatch.setattr(driver, "stage_problem", lambda inp, c: c)  # sp is the candidate
    monkeypatch.setattr(driver, "relaxed_bound", relaxed)
    monkeypatch.setattr(driver, "split_bound", split)
    monkeypatch.setattr(driver, "solve_candidate", solve)
    cands = [deep, wins, never]
    state = driver._Incumbent({c.key: None for c in cands})
    state.first_pass(cands, cands, driver.Pins(), None)
    assert solved == [2]
    assert state.best is wins
    assert (deep.status, deep.bound) == ("pruned-bound", 3.0)
    assert (never.status, never.bound) == ("pruned-bound", 2.6)
