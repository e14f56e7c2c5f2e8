"""What a warm ``plan`` computes less of, checked against the long way.

``bounds._min_device_bytes`` takes each option list's options by what their states are priced
from (a third as many on Llama-3-405B): its bound must be the least over every option, priced
one by one. The timeline hatches the interleaved schedule's odd chunks with one compound path:
it must hold exactly the odd chunks' boxes. The ``plan`` command runs without the cyclic
garbage collector and gives it back."""

from __future__ import annotations

import dataclasses
import gc
import itertools
import math

import pytest
from conftest import cluster_of, make_block, make_option
from test_command_memos import _min_device_bytes_block_by_block as _every_option

from planner.cost.records import CostInputs
from planner.search.bounds import _min_device_bytes
from planner.training import Training


def _options() -> list:
    """Options sharing states but not activations (recompute), others with experts, and
    offloaded ones, which only ZeRO-3 allows."""
    found = []
    for params, act, offload, experts in itertools.product(
        (3e9, 1.7e9), (4e9, 1.1e9, 2.5e9), ("none", "optimizer", "optimizer+params"), (0.0, 1e9)
    ):
        o = make_option(1e-3 * act / 1e9, params, act, offload=offload)
        found.append(dataclasses.replace(o, expert_params=experts, ep=2 if experts else 1))
    return found


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("dp", [1, 2, 8])
def test_the_device_bound_is_the_least_over_every_option(zero, dp):
    opts = _options()
    # another class, with no option that needs ZeRO-3
    attention = [o for o in opts if o.offload != "optimizer+params"]
    blocks = [make_block(i, "LA"[i % 2]) for i in range(5)]
    options = [opts if i % 2 == 0 else attention for i in range(5)]
    inp = CostInputs(blocks, options, 1, cluster_of(8), Training(16))
    assert _min_device_bytes(inp, zero, dp) == _every_option(inp, zero, dp)


def test_the_device_bound_of_a_block_without_an_allowed_option_is_infinite():
    offloaded = [make_option(1e-3, 1e9, 1e9, offload="optimizer+params")]
    inp = CostInputs([make_block(0, "L")], [offloaded], 1, cluster_of(8), Training(16))
    assert _min_device_bytes(inp, 0, 8) == math.inf
    assert _min_device_bytes(inp, 3, 8) == _every_option(inp, 3, 8) < math.inf


def test_the_odd_chunks_hatching_holds_exactly_their_boxes():
    """One compound path whose closed polygons are the boxes given, hatched as the separate
    boxes were (the pixels differ only in the hatch's phase)."""
    from planner.report.timeline import _corners, _hatched

    boxes = [_corners(0.25 * k, (k % 3) + 0.1, 0.2 + 0.01 * k) for k in range(40)]
    hatched = _hatched(boxes)
    (path,) = hatched.get_paths()
    polygons = path.to_polygons(closed_only=True)
    assert len(polygons) == len(boxes)
    for polygon, corners in zip(polygons, boxes):
        assert polygon.tolist() == [list(c) for c in [*corners, corners[0]]]
    assert hatched.get_hatch() == "///" and hatched.get_gid() == "odd-chunk"
    assert list(hatched.get_facecolor()) == [] or hatched.get_facecolor()[0][3] == 0


def test_the_plan_command_plans_without_the_cycle_collector_and_gives_it_back(monkeypatch):
    from planner import cli

    seen = []

    def plan(*args, **kwargs):
        seen.append(gc.isenabled())
        raise cli.UserInputError("stop here")

    monkeypatch.setattr("planner.api.plan", plan)
    assert gc.isenabled()
    code = cli.main(["examples/mlp.py", "--gpus", "2", "--no-report", "--quiet"])
    assert code == 2 and seen == [False]
    assert gc.isenabled()
