"""Tests written for mutmut's generated mutants of planner/cost/records.py (benchmarks/
generated_mutants.py): each of the small facts a configuration implies (its option's derived
parameter counts, the stage count, whether gradients are reduced late or held, its last rank,
the loss's shards and bytes, the tied weights, the largest cut) stated by hand at values where
each condition's edge is live. docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import make_block

from planner.cost.records import (
    BlockOption,
    Config,
    CostInputs,
    TiedCopy,
    deferred_reduce,
    grads_held,
    last_rank,
    loss_shards,
    sample_share,
    tied_copies,
)
from planner.hardware.cluster import Cluster
from planner.hardware.profiles import load_profile
from planner.schema.mesh import Mesh
from planner.training import Training

OPTION = BlockOption(
    variant="replicated", recompute="none", offload="none", fwd_s=0.25, bwd_s=0.5,
    tp_comm_s=0.0, params=100.0, act_bytes=0.0, recompute_peak_bytes=0.0, transient_bytes=0.0,
)  # fmt: skip


def test_an_options_time_and_parameter_shares():
    assert OPTION.time_s == 0.75
    experts = replace(OPTION, ep=4, expert_params=60.0)
    assert experts.dense_params == 40.0
    # ZeRO's share: the dense 40 and the experts' 60 x 4 (every expert over dp/ep replicas)
    assert experts.zero_params == 40.0 + 240.0
    assert OPTION.zero_params == 100.0 and OPTION.dense_params == 100.0


@pytest.mark.parametrize(
    "ep, expert, dp, moved",
    [
        (1, 0.0, 8, 100.0),  # no experts
        (2, 0.0, 8, 100.0),  # EP without expert parameters in this block
        (2, 60.0, 1, 100.0),  # one replica: dp's ring is empty, the whole count stands
        # dp 4, ep 2: experts reduce over n = 2 replicas, (1/2) / (3/4) of dp's ring per byte
        (2, 60.0, 4, 40.0 + 60.0 * (1 / 2) / (3 / 4)),
        # dp 8, ep 2: n = 4, (3/4) / (7/8)
        (2, 60.0, 8, 40.0 + 60.0 * (3 / 4) / (7 / 8)),
        (4, 60.0, 4, 40.0),  # ep = dp: experts are not reduced at all
        (2, 60.0, 2, 40.0),  # the same on two replicas
        (2, 1.0, 4, 99.0 + (1 / 2) / (3 / 4)),  # one expert parameter is still an expert's
    ],
)
def test_expert_gradients_move_over_their_own_replicas_only(ep, expert, dp, moved):
    option = replace(OPTION, ep=ep, expert_params=expert)
    assert option.comm_params(dp) == pytest.approx(moved, rel=1e-12)


def _config(pp=2, dp=2, tp=1, cp=1, mbs=2, v=1, zero=0) -> Config:
    return Config(
        mesh=Mesh(pp, dp, tp, cp=cp), micro_batch_size=mbs, schedule="1f1b", virtual_stages=v,
        zero_stage=zero, stage_of=[], choice=[],
    )  # fmt: skip


def test_stages_are_pipeline_ranks_times_virtual_stages():
    assert _config(pp=4, v=3).num_stages == 12


@pytest.mark.parametrize(
    "pp, zero, gbs, late",
    [
        (2, 2, 8, True),  # dp 2, mbs 2: 2 micro-batches a replica
        (2, 3, 8, True),
        (2, 1, 8, False),  # ZeRO-1 reduces per micro-batch
        (1, 2, 8, False),  # no pipeline: FSDP's own no_sync choice
        (2, 2, 4, False),  # one micro-batch: nothing to defer past
    ],
)
def test_a_zero_2_pipeline_stage_reduces_once_a_step(pp, zero, gbs, late):
    assert deferred_reduce(_config(pp=pp, zero=zero), Training(gbs)) is late


@pytest.mark.parametrize(
    "persistent, gbs, held",
    [(False, 4, False), (False, 8, True), (True, 4, True), (True, 8, True)],
)
def test_gradients_are_held_when_buffers_persist_or_micro_batches_accumulate(persistent, gbs, held):
    training = Training(gbs, persistent_grad_buffers=persistent)
    assert grads_held(_config(), training) is held


def test_a_context_parallel_rank_holds_its_share_of_each_sample():
    assert sample_share(_config(mbs=6, cp=4)) == 1.5
    assert sample_share(_config(mbs=3)) == 3


@pytest.mark.parametrize("pp, v, rank", [(1, 1, 0), (4, 1, 3), (4, 2, 3), (3, 2, 2), (2, 3, 1)])
def test_the_last_stage_sits_on_the_last_rank(pp, v, rank):
    assert last_rank(_config(pp=pp, v=v)) == rank


def test_a_vocab_parallel_loss_splits_the_logits_over_tp():
    assert loss_shards(Training(8, vocab_parallel_loss=True), _config(tp=4)) == 4
    assert loss_shards(Training(8), _config(tp=4)) == 1


def _blocks():
    blocks = [make_block(i, "L", boundary=b, out=o) for i, (b, o) in
              enumerate([(100, 10), (300, 20), (200, 30), (900, 4000)])]  # fmt: skip
    blocks[0] = replace(blocks[0], param_names=["emb.weight", "pos"])
    blocks[2] = replace(blocks[2], param_names=["mid.weight"], tied={"pos": 7})
    blocks[3] = replace(blocks[3], tied={"emb.weight": 50, "mid.weight": 3, "ghost": 2})
    return blocks


def _inputs(blocks, dtype="bf16") -> CostInputs:
    cluster = Cluster(load_profile("cpu"), 1, 4)
    return CostInputs(blocks, [[OPTION]] * len(blocks), 1, cluster, Training(8, dtype=dtype))


def test_tied_weights_are_named_with_their_owner_and_user():
    copies = tied_copies(_blocks())
    assert copies == [
        TiedCopy("pos", 7, 0, 2),
        TiedCopy("emb.weight", 50, 0, 3),
        TiedCopy("mid.weight", 3, 2, 3),
        TiedCopy("ghost", 2, 0, 3),  # an owner no block lists: the first
    ]
    assert [c.spans_model(4) for c in copies] == [False, True, False, True]
    assert _inputs(_blocks()).tied == copies


def test_the_cut_is_the_largest_boundary_but_the_last_blocks():
    inputs = _inputs(_blocks())
    assert inputs.boundary_bytes == 300.0 and isinstance(inputs.boundary_bytes, float)
    one = _inputs(_blocks()[:1]).boundary_bytes
    assert one == 0.0 and isinstance(one, float)


def test_the_loss_holds_three_fp32_copies_of_the_logits():
    """The last block's output of 4000 bytes: 2000 bf16 logits, three fp32 copies 24,000 bytes;
    in fp32, 1000 logits, 12,000 bytes."""
    assert _inputs(_blocks()).loss_bytes == 24000.0
    assert _inputs(_blocks(), dtype="fp32").loss_bytes == 12000.0


def test_without_expert_parallelism_every_parameter_moves_exactly():
    """ep = 1: the whole count, exactly (a TP share's fractional count, where the expert
    formula's params - experts + experts x 1.0 rounds one unit in the last place off; plans
    are byte-identical for the same inputs)."""
    params, experts = 113175 / 7, 21457 / 3
    option = replace(OPTION, params=params, ep=1, expert_params=experts)
    assert params - experts + experts * 1.0 != params  # the case is live
    assert option.comm_params(4) == params
