"""What issue 52's speed-ups keep or compute another way gives what the plain computation gives:
the mesh's groups written as ranges against ``Mesh.rank`` rank by rank, the data-parallel
collectives kept on the cost inputs against pricing them afresh, the expert-parallel degrees of
one enumeration against ``ep_degrees``, the bounds' sums over distinct option lists against
block-by-block sums, and plan.json's records dumped from kept field lists against dumping
them field by field."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

import pytest
from conftest import cluster_of, make_block, make_option

from planner.api import plan
from planner.cost.data_parallel import _affine, dp_rates
from planner.cost.memory import forward_state_bytes, option_states, step_state_bytes
from planner.cost.optimizer import offload_allowed
from planner.cost.records import Config, CostInputs
from planner.schema import dumps
from planner.schema.mesh import OMIT_NONE, Mesh
from planner.search.bounds import _distinct_lists, _min_device_bytes, lower_bounds
from planner.search.candidates import Candidate, Pins, enumerate_candidates, ep_degrees
from planner.training import Training

MESHES = [
    Mesh(pp=1, dp=4, tp=2),
    Mesh(pp=3, dp=2, tp=4, cp=2),
    Mesh(pp=2, dp=8, tp=1, ep=4),
    Mesh(pp=4, dp=2, tp=2, ep=2, cp=2),
    # a heterogeneous pipeline: each pipeline rank its own TP and DP degree
    Mesh(pp=3, dp=4, tp=4, cp=1, stage_tp=(1, 2, 4), stage_dp=(4, 2, 1)),
    Mesh(pp=2, dp=2, tp=2, cp=2, stage_tp=(2, 1), stage_dp=(1, 2)),
]


@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_each_group_is_the_ranks_rank_gives_one_coordinate_apart(mesh):
    for pp_i in range(mesh.pp):
        tp, replicas = mesh.tp_of(pp_i), mesh.replicas_of(pp_i)
        assert mesh.tp_group(pp_i) == [mesh.rank(pp_i, 0, t) for t in range(tp)]
        assert mesh.dp_group(pp_i) == [mesh.rank(pp_i, d, 0) for d in range(replicas)]
        assert mesh.cp_group(pp_i) == [mesh.rank(pp_i, c, 0) for c in range(mesh.cp)]
        assert mesh.ep_group(pp_i) == [mesh.rank(pp_i, d * mesh.cp, 0) for d in range(mesh.ep)]
        every = [mesh.rank(pp_i, d, t) for d in range(replicas) for t in range(tp)]
        assert mesh.stage_ranks(pp_i) == every
    # the stages tile the ranks: each rank once, in order
    assert list(itertools.chain(*map(mesh.stage_ranks, range(mesh.pp)))) == list(range(mesh.size))


def test_the_kept_dp_collectives_are_those_priced_afresh():
    """dp_rates keeps each group's collectives on its CostInputs; the rates read back equal
    those of a fresh CostInputs and the collectives priced directly over ``dp_group``."""
    training = Training(64, "bf16", "adamw")
    blocks = [make_block(i, "L", params=10**7) for i in range(4)]
    opts = [[make_option(1e-3, 1e7, 1e6)] for _ in blocks]
    cl = cluster_of(64)
    kept = CostInputs(blocks, opts, 1, cl, training)
    for mesh, zero in itertools.product(MESHES[:4], (0, 1, 2, 3)):
        if mesh.size > cl.gpus:
            continue
        config = Config(mesh, 1, "1f1b", 1, zero, [0] * len(blocks), [0] * len(blocks))
        for pp_i in range(mesh.pp):
            first = dp_rates(kept, config, pp_i)
            again = dp_rates(kept, config, pp_i)  # read back
            fresh = dp_rates(CostInputs(blocks, opts, 1, cl, training), config, pp_i)
            assert first == again == fresh
            ranks = mesh.dp_group(pp_i)
            gb = training.reduce_bytes if zero != 1 else training.state_bytes[1]
            assert fresh.all_reduce == _affine("all_reduce", cl, ranks, gb)
            assert fresh.reduce_scatter == _affine("reduce_scatter", cl, ranks, gb)
            assert fresh.all_gather == _affine("all_gather", cl, ranks, training.state_bytes[0])
    assert len(kept.memo["dp_collectives"]) > 1


def test_one_enumeration_gives_each_layout_the_ep_degrees_of_ep_degrees():
    blocks = [make_block(i, "L") for i in range(4)]
    for b, experts in zip(blocks, (8, 8, 4, 8)):
        b.extra["moe"] = {"num_experts": experts}
    training = Training(32, "bf16", "adamw")
    pins = Pins()
    cands = enumerate_candidates(32, len(blocks), training, pins, [1, 2], blocks)
    by_layout: dict[tuple, set[int]] = {}
    for c in cands:
        by_layout.setdefault((c.pp, c.dp, c.tp, c.micro_batch_size, c.zero), set()).add(c.ep)
    assert by_layout
    for (_, dp, _, _, _), eps in by_layout.items():
        assert sorted(eps) == ep_degrees(blocks, dp, pins)
    assert {4} <= set().union(*by_layout.values())


def _min_device_bytes_block_by_block(inp, zero: int, dp: int) -> float:
    """bounds._min_device_bytes as it read before the distinct lists were kept: each block's
    least forward and step bytes, summed block by block."""
    forward = step = 0.0
    for opts in inp.options:
        allowed = [o for o in opts if offload_allowed(o.offload, zero)]
        states = [option_states(o, zero, dp, inp.training) for o in allowed]
        forward += min(
            (forward_state_bytes(sm, False) + o.act_bytes for o, sm in zip(allowed, states)),
            default=math.inf,
        )
        step += min((step_state_bytes(sm, inp.training) for sm in states), default=math.inf)
    return max(forward, step)


def test_the_bounds_over_distinct_option_lists_are_the_block_by_block_sums():
    """lower_bounds reads each distinct option list once and sums per block in block order:
    the same floats, bit for bit, as summing block by block (shared lists, as price_options
    gives blocks of one class, and lists of their own)."""
    training = Training(64, "bf16", "adamw")
    shared = [
        make_option(1.1e-3, 3.3e7, 7.7e6),
        make_option(1.7e-3, 3.3e7, 1.3e6, recompute="full"),
        make_option(1.2e-3, 3.3e7, 2.9e6, offload="optimizer"),
    ]
    blocks = [make_block(i, "L", params=33 * 10**6) for i in range(9)]
    own = [[make_option(0.3e-3 * (i + 1), 1.9e7 * (i + 1), 3.1e5)] for i in range(3)]
    opts = [own[0], shared, shared, own[1], shared, shared, shared, own[2], shared]
    inp = CostInputs(blocks, opts, 1, cluster_of(64), training)
    lists, which = _distinct_lists(inp)
    assert [lists[k] for k in which] == opts and len(lists) == 4
    for zero, dp in itertools.product((0, 1, 2, 3), (1, 4, 8)):
        assert _min_device_bytes(inp, zero, dp) == _min_device_bytes_block_by_block(inp, zero, dp)
    cand = Candidate(2, 8, 4, 1, "1f1b", 1, 3)
    lower_bounds(inp, cand)
    by_block = 0
    for o in opts:
        by_block += min(x.time_s for x in o)
    assert inp.memo["least_time"] == by_block


def _dump_field_by_field(obj):
    """plan.py's _dump as it read before the field lists were kept per class."""
    if dataclasses.is_dataclass(obj):
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if value is None and (f.name == "baseline" or f.metadata.get(OMIT_NONE)):
                continue
            out[f.metadata.get("json", f.name)] = _dump_field_by_field(value)
        return out
    if isinstance(obj, list | tuple):
        return [_dump_field_by_field(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _dump_field_by_field(v) for k, v in obj.items()}
    return obj


def test_a_plan_dumps_as_field_by_field():
    gpt = Path(__file__).resolve().parent.parent / "examples" / "gpt.py"
    planned = plan(gpt, 8, model_args={"size": "tiny"}, profile="cpu", pins=Pins(tp=2, pp=2))
    doc = planned.plan
    assert doc.to_dict() == _dump_field_by_field(doc)
    assert dumps(doc) == json.dumps(_dump_field_by_field(doc), indent=2, sort_keys=True) + "\n"
    assert doc.to_dict()["solver"]["certificates"]  # records nested in lists were dumped
