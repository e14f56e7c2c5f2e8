"""Tests written for the mutants mutmut generated in planner/cost/data_parallel.py that the
cost model's tests let survive (docs/mutation.md lists each survivor and the test here that
kills it). Each states a time or a byte count from a formula written out here, at an input
where the surviving change would alter it. Collectives are priced by
planner.hardware.collectives.collective_time (tested against closed forms in
tests/test_collectives.py), over the ranks each term should use: the layouts below put one
pipeline rank's data-parallel group inside a node and the other's across two, so that a term
taken over the wrong group shows."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import make_block, make_option

from planner.cost.data_parallel import (
    DPRates,
    batchnorm_sync_time,
    block_extra_time,
    dp_block_terms,
    dp_comm,
    dp_copy_bytes,
    dp_stage_terms,
    stage_sync_time,
    tied_sync_time,
)
from planner.cost.records import Config, CostInputs
from planner.hardware.cluster import Cluster
from planner.hardware.collectives import collective_time
from planner.hardware.profiles import load_profile
from planner.schema.mesh import Mesh
from planner.training import Training

SGD32 = Training(8, "fp32", "sgd", dp_copies="none")  # 4 gradient bytes; no wrapper copies


def _split_layout(training: Training = SGD32, blocks=None, options=None):
    """PP 2 x DP 2 on nodes of 3 GPUs: pipeline rank 0's replicas are ranks 0 and 1 (one
    node), pipeline rank 1's ranks 2 and 3 (two nodes)."""
    cluster = Cluster(load_profile("h100-sxm"), nodes=2, gpus_per_node=3)
    blocks = blocks or [make_block(i, "L") for i in range(2)]
    options = options or [[make_option(3e-3, 1e6, 0.0)]] * len(blocks)
    config = Config(Mesh(pp=2, dp=2, tp=1), 1, "1f1b", 1, 0, [0, 1], [0] * len(blocks))
    inp = CostInputs(blocks, options, 1, cluster, training)
    assert cluster.link([0, 1]) != cluster.link([2, 3])
    return inp, config


# --------------------------------------------------------------------------- BatchNorm


def test_batch_statistics_sync_over_the_stages_own_replicas():
    """nn.SyncBatchNorm of 64 channels over 2 replicas (GPU): an all-gather of 2 x (2C + 1)
    fp32 numbers and an all-reduce of 2C, over the calling pipeline rank's replicas; rank 0 by
    default (killed: 0 at 2 replicas; the default rank 1; block_extra_time and
    stage_sync_time passing no rank, or stage / pp for its rank)."""
    inp, config = _split_layout()
    o = replace(make_option(3e-3, 1e6, 0.0), norm_channels=(64,))

    def want(ranks):
        fwd = collective_time("all_gather", 2 * (2 * 64 + 1) * 4, inp.cluster, ranks)
        return fwd + collective_time("all_reduce", 2 * 64 * 4, inp.cluster, ranks)

    assert want([2, 3]) > want([0, 1]) > 0
    assert batchnorm_sync_time(inp, o, config) == pytest.approx(want([0, 1]), rel=1e-12)
    assert batchnorm_sync_time(inp, o, config, 1) == pytest.approx(want([2, 3]), rel=1e-12)
    assert block_extra_time(inp, o, config) == pytest.approx(want([0, 1]), rel=1e-12)
    assert block_extra_time(inp, o, config, 1) == pytest.approx(want([2, 3]), rel=1e-12)
    assert stage_sync_time(inp, [o, o], config, 1) == pytest.approx(2 * want([2, 3]), rel=1e-12)


# --------------------------------------------------------------------------- wrapper copies


@pytest.mark.parametrize(
    "zero, pp, dp, params, per_param",
    [
        # FSDP at one replica, fp32: the gather's copy in 2w f + out 2w + the collective's
        # own 2w; the reduce's w + 4 into the buffer, 8 f out and the collective's 8
        (2, 1, 1, 1e6, (8 + 8 + 8) + (4 + 4 + 8 + 8)),
        (0, 1, 2, 1e6, 16),  # DDP (no TP, no PP, no cast): buckets in and out, 16
        # ZeRO-0 under PP is replicate (FSDP2) over 2: (8/2 + 8) + (4 + 4 + 8/2)
        (0, 2, 2, 1e6, (8 / 2 + 8) + (4 + 4 + 8 / 2)),
        (2, 1, 1, 1, (8 + 8 + 8) + (4 + 4 + 8 + 8)),  # a block of one parameter copies it
    ],
)
def test_the_wrappers_copies_in_fp32_by_wrapper(zero, pp, dp, params, per_param):
    """dp_copy_bytes without casts (the CPU runtime), one micro-batch (killed: one replica's
    ZeRO-2 wrapping nothing; replicate for every TP degree or every pipeline, or only beyond
    2 stages; a one-parameter block skipped)."""
    tr = Training(dp * 2, device_casts=False)
    config = Config(Mesh(pp=pp, dp=dp, tp=1), 2, "1f1b", 1, zero, [0], [0])
    o = make_option(1e-3, params, 0.0)
    assert dp_copy_bytes(o, config, tr) == pytest.approx(per_param * params, rel=1e-12)


def test_ddp_at_one_replica_casts_but_fills_no_buckets():
    """ZeRO-1 at one replica under autocast: DDP's casts of each weight (4 + 2) and of its
    gradient back (2 + 4), and no gradient buckets (killed: the buckets' 16 at one replica;
    1 byte for none)."""
    tr = Training(2, device_casts=True)  # bf16
    config = Config(Mesh(pp=1, dp=1, tp=1), 2, "1f1b", 1, 1, [0], [0])
    assert dp_copy_bytes(make_option(1e-3, 1e6, 0.0), config, tr) == pytest.approx(12 * 1e6)


@pytest.mark.parametrize("zero, kind, grad_bytes", [
    (0, "all_reduce", 2), (1, "all_reduce", 4), (2, "reduce_scatter", 2), (3, "reduce_scatter", 2),
])  # fmt: skip
def test_gradients_reduce_at_the_plans_reduce_width_but_zero_1s_in_fp32(zero, kind, grad_bytes):
    """bf16 with a bf16 reduce (reduce_dtype): FSDP2 and replicate reduce 2 bytes a
    gradient; ZeRO-1's DDP reduces its fp32 .grad, 4 (killed: either width for every stage;
    the test inverted, or asked of ZeRO-2)."""
    from planner.cost.data_parallel import dp_rates

    half = Training(8, "bf16", "adamw", half_grad_reduce=True)
    inp, config = _split_layout(half)
    config = replace(config, zero_stage=zero)
    slope, latency = getattr(dp_rates(inp, config, 1), kind)
    want = collective_time(kind, 1e6 * grad_bytes, inp.cluster, [2, 3])
    assert slope * 1e6 + latency == pytest.approx(want, rel=1e-9)


# --------------------------------------------------------------------------- dp terms

AR, RS, AG = (1e-9, 1e-5), (2e-9, 2e-5), (3e-9, 3e-5)  # (s per parameter, s per call)
UNIT, OVERLAP, M = 7e-5, 0.5, 3


def _rates(replicas: int = 2, zero: int = 3, deferred: bool = False) -> DPRates:
    return DPRates(
        replicas=replicas, zero=zero, m=M, deferred=deferred, regather=True, overlap=OVERLAP,
        unit=UNIT, all_reduce=AR, reduce_scatter=RS, all_gather=AG,
    )  # fmt: skip


def _fsdp_terms(zero: int, deferred: bool, params: float):
    """(a, b, t) by the docstring of dp_block_terms: forward 1 ms and backward 2 ms, half of
    each hiding collectives; rs and ag a unit's reduce-scatter and all-gather."""
    owns = 1.0 if params > 0 else 0.0
    rs, ag = (RS[0] * params + RS[1]) * owns, (AG[0] * params + AG[1]) * owns
    unit, fwd, bwd = UNIT * owns, OVERLAP * 1e-3, OVERLAP * 2e-3
    if deferred and zero == 2:  # one reduce-scatter a step; the gather once, behind forward
        return rs + M * unit, ag - fwd, rs + M * unit + ag
    if deferred:  # gathers for forward and backward every micro-batch, one reduce-scatter
        return M * (2 * ag + unit - fwd - bwd), rs, M * (2 * ag + unit) + rs
    if zero == 2:  # FSDP2 regathers each micro-batch
        return M * (rs + unit - bwd), M * (ag - fwd), M * (rs + unit) + M * ag
    return M * (2 * ag + rs + unit - fwd - bwd), 0.0, M * (2 * ag + rs + unit)


@pytest.mark.parametrize("zero, deferred", [(2, True), (3, True), (2, False), (3, False)])
@pytest.mark.parametrize("params", [1e6, 1.0, 0.0])
def test_each_fsdp_units_terms_over_two_replicas(zero, deferred, params):
    """Killed: the terms zeroed at 2 replicas; ``-`` for ``+`` (or ``+`` for ``-``) on the
    unit overhead and the hidden shares; ``/`` for ``*``; 3 gathers for 2; a block of no
    parameters (or of one) paying a unit's latency and overhead, or none."""
    o = make_option(3e-3, params, 0.0)
    got = dp_block_terms(o, _rates(2, zero, deferred))
    assert got == pytest.approx(_fsdp_terms(zero, deferred, params), rel=1e-12, abs=1e-18)


def test_one_replica_has_no_data_parallel_terms():
    o = make_option(3e-3, 1e6, 0.0)
    assert dp_block_terms(o, _rates(1)) == (0.0, 0.0, 0.0)
    assert dp_stage_terms(_rates(1, 0)) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    "zero, want", [(0, (AR[1], 0.0, AR[1])), (1, (AR[1], AG[1], AR[1] + AG[1])), (2, (0, 0, 0))]
)
def test_a_stage_pays_its_bucketed_collectives_latency_once(zero, want):
    """dp_stage_terms over 2 replicas (killed: zeroed at 2 replicas)."""
    assert dp_stage_terms(_rates(2, zero)) == want


def test_a_stage_reduces_over_its_own_replicas():
    """dp_comm at ZeRO-0, one block of 1e6 parameters, fp32 gradients (4 bytes): one
    all-reduce over pipeline rank 1's replicas, ranks 2 and 3 across two nodes (killed: the
    rank not passed to dp_rates)."""
    inp, config = _split_layout()
    total, _ = dp_comm(inp, [make_option(3e-3, 1e6, 0.0)], config, 1)
    want = collective_time("all_reduce", 1e6 * 4, inp.cluster, [2, 3])
    assert total == pytest.approx(want, rel=1e-9)
    assert want != pytest.approx(collective_time("all_reduce", 1e6 * 4, inp.cluster, [0, 1]))


@pytest.mark.parametrize("dp, params, nothing", [(1, 1e6, True), (2, 0.0, True), (2, 1.0, False)])
def test_a_stage_without_replicas_or_parameters_communicates_nothing(dp, params, nothing):
    """dp_comm is (0, 0) at one replica and for blocks without parameters (no all-reduce
    latency for them); a block of one parameter still reduces it (killed: ``and`` for ``or``;
    ``>= 0``, ``> 1``; ``replicas == 2``; 1.0 for nothing)."""
    inp, config = _split_layout()
    config = replace(config, mesh=Mesh(pp=1, dp=dp, tp=1), stage_of=[0, 0])
    total, exposed = dp_comm(inp, [make_option(3e-3, params, 0.0)], config, 0)
    if nothing:
        assert (total, exposed) == (0.0, 0.0)
    else:
        want = collective_time("all_reduce", params * 4, inp.cluster, [0, 1])
        assert total == pytest.approx(want, rel=1e-9) and want > 0


# --------------------------------------------------------------------------- tied weights


def _tied_blocks(numels: list[int]):
    names = [f"w{i}" for i in range(len(numels))]
    blocks = [make_block(i, "L") for i in range(2)]
    blocks[0] = replace(blocks[0], param_names=names)
    blocks[1] = replace(blocks[1], tied=dict(zip(names, numels, strict=True)))
    return blocks


def test_a_tied_copys_gradient_crosses_between_the_first_and_last_pipeline_rank():
    """Two pipeline ranks, one GPU each on two nodes, one replica: the 1000-element tied
    weight's fp32 gradients are summed by an all-reduce between ranks 0 and 1, through the
    NIC (killed: either end of the pair moved to another rank, which puts both on one node
    or outside the cluster)."""
    cluster = Cluster(load_profile("h100-sxm"), nodes=2, gpus_per_node=1)
    config = Config(Mesh(pp=2, dp=1, tp=1), 1, "1f1b", 1, 0, [0, 1], [0, 0])
    inp = CostInputs(_tied_blocks([1000]), [[make_option(1e-3, 1e3, 0.0)]] * 2, 1, cluster, SGD32)
    want = collective_time("all_reduce", 1000 * 4, cluster, [0, 1])
    assert want > collective_time("all_reduce", 1000 * 4, cluster, [1, 1])
    assert tied_sync_time(inp, config) == pytest.approx(want, rel=1e-12)


def test_zero_2_reduce_scatters_each_tied_copy_then_sums_the_shards():
    """ZeRO-2 over 2 replicas, two tied copies (1000 and 600 elements): each copy's gradient
    is reduce-scattered over the last pipeline rank's replicas (ranks 2 and 3, across nodes),
    then its half shard all-reduced between ranks 0 and 2 (killed: ZeRO-2 taken as ZeRO-0/1,
    an all-reduce of the whole copy; ``total = ...``; the first rank's replicas)."""
    inp, config = _split_layout(blocks=_tied_blocks([1000, 600]))
    config = replace(config, zero_stage=2)
    cl = inp.cluster
    want = sum(
        collective_time("reduce_scatter", n * 4, cl, [2, 3])
        + collective_time("all_reduce", n * 4 / 2, cl, [0, 2])
        for n in (1000, 600)
    )
    assert tied_sync_time(inp, config) == pytest.approx(want, rel=1e-12)
