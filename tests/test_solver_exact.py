"""The stage MILP returns brute force's optimum on random small instances (same discrete space,
same cost model), and its objective is the cost model's own step time for the plan it picks."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from conftest import cluster_of, make_block, make_option

from planner.bruteforce import brute_force
from planner.costmodel import CostInputs, Mesh, Training, evaluate
from planner.search import Candidate, solve_candidate

RECOMPUTE = ("none", "selective", "full")
OFFLOAD = ("none", "optimizer", "optimizer+params")


def random_instance(seed: int):
    rng = random.Random(seed)
    n_blocks = rng.randint(3, 6)
    classes = [rng.choice("ABC") for _ in range(n_blocks)]
    gpus = rng.choice([1, 2, 4, 8])
    pp = rng.choice([d for d in (1, 2, 3, 4) if gpus % d == 0 and d <= n_blocks])
    dp = gpus // pp
    mbs = rng.choice([1, 2])
    m = rng.choice([1, 2, 4])
    gbs = dp * mbs * m
    schedule = "1f1b"
    v = 1
    if pp > 1 and rng.random() < 0.3 and pp * 2 <= n_blocks and m % pp == 0:
        schedule, v = "interleaved_1f1b", 2
    elif pp > 1 and rng.random() < 0.2:
        schedule = "gpipe"
    zero = rng.choice([0, 1, 2, 3]) if dp > 1 else 0
    options_by_class = {}
    for c in "ABC":
        k = rng.randint(1, 3)
        options_by_class[c] = [
            make_option(
                time_s=rng.uniform(0.5e-3, 5e-3),
                params=rng.uniform(1e8, 2e9),
                act=rng.uniform(1e8, 4e9),
                recompute=rng.choice(RECOMPUTE),
                offload=rng.choice(OFFLOAD),
            )
            for _ in range(k)
        ]
    # Expert parallelism on half the instances with dp > 1: part of each option's parameters
    # are experts spread over ep ranks (ZeRO shards them over dp / ep, DP reduces them there).
    ep = rng.choice([e for e in (2, 4) if dp % e == 0] or [1]) if rng.random() < 0.5 else 1
    if ep > 1:
        for c, opts in options_by_class.items():
            options_by_class[c] = [
                replace(o, ep=ep, expert_params=o.params * rng.uniform(0.0, 0.8)) for o in opts
            ]
    blocks = [
        make_block(i, c, params=int(options_by_class[c][0].params), boundary=rng.choice([0, 10**7]))
        for i, c in enumerate(classes)
    ]
    options = [options_by_class[c] for c in classes]
    capacity = rng.choice([8, 16, 24, 40, 80]) * 2**30
    cl = cluster_of(gpus, memory_bytes=capacity, reserved_bytes=2**30)
    training = Training(gbs, "bf16", "adamw")
    inp = CostInputs(blocks, options, 1, cl, training)
    cand = Candidate(pp, dp, 1, mbs, schedule, v, zero, ep)
    return inp, cand


def reference(inp, cand) -> float:
    mesh = Mesh(cand.pp, cand.dp, 1, cand.ep)
    args = (cand.micro_batch_size, cand.schedule, cand.virtual_stages, cand.zero)
    return brute_force(inp, mesh, *args)[0]


@pytest.mark.parametrize("seed", range(32))
def test_milp_equals_brute_force(seed):
    inp, cand = random_instance(seed)
    want = reference(inp, cand)
    solve_candidate(inp, cand)
    if want == float("inf"):
        assert cand.status == "infeasible"
        return
    assert cand.status == "solved"
    assert cand.milp_objective == pytest.approx(want, rel=1e-9)
    # the plan the MILP returns is priced identically by the cost model, and fits
    again = evaluate(inp, cand.config)
    assert again.feasible
    assert again.step_time_s == pytest.approx(cand.milp_objective, rel=1e-9)


def test_instances_cover_expert_parallelism():
    eps = {random_instance(seed)[1].ep for seed in range(32)}
    assert eps >= {1, 2}


def test_instances_cover_feasible_and_infeasible_cases():
    outcomes = set()
    for seed in range(24):
        inp, cand = random_instance(seed)
        want = reference(inp, cand)
        outcomes.add(want == float("inf"))
        if len(outcomes) == 2:
            break
    assert outcomes == {True, False}
