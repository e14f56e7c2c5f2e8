"""Tests written for the mutants mutmut generated in planner/cost/memory.py that the cost
model's tests let survive (docs/mutation.md lists each survivor and the test here that kills
it). Each states bytes from a formula written out here, at an input where the surviving
change would alter them: bf16 AdamW (2 weight bytes, 4 gradient bytes with torch's fp32
.grad, 12 optimizer bytes a parameter), so that a weight width taken for a gradient width
shows, and expert parameters beside dense ones, so that ZeRO's share of them shows."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import cluster_of, make_block, make_option

from planner.cost.memory import (
    fixed_memory,
    forward_state_bytes,
    gathered_weight_bytes,
    held_boundaries,
    option_states,
    other_memory,
    reserved_peak,
    tied_memory,
)
from planner.cost.records import Config, CostInputs
from planner.hardware.profiles import load_profile
from planner.schema.mesh import Mesh
from planner.training import Training
from planner.vocab import Offload

BF16 = Training(8, "bf16", "adamw")  # (wb, gb, ob) = (2, 4, 12); fused step: no temporaries
HALF_REDUCE = replace(BF16, half_grad_reduce=True)  # reduce_bytes = 2


def _option(params: float, expert: float = 0.0, ep: int = 1, offload: str = Offload.NONE):
    return replace(make_option(1e-3, params, 0.0, offload=offload), expert_params=expert, ep=ep)


def test_bf16_adamws_widths_are_the_ones_these_tests_assume():
    assert BF16.state_bytes == (2, 4, 12) and BF16.step_temp_bytes == 0
    assert HALF_REDUCE.reduce_bytes == 2


# --------------------------------------------------------------------------- option_states


def test_zero_3_shards_dense_and_expert_parameters_by_their_zero_share():
    """4000 parameters held, 2000 of them this rank's half of the experts (ep = 2): ZeRO
    divides zero_params = 4000 + 2000 x (2 - 1) = 6000 over 4 replicas; the call's default is
    a stage that reduces every micro-batch (killed: ``deferred=True`` by default; the expert
    branch taken for any ZeRO stage; ``sharded=None``, dividing the 4000 held)."""
    sm = option_states(_option(4000, expert=2000, ep=2), 3, 4, BF16)
    assert sm == {
        "params": 6000 * 2 / 4,
        "grads": 6000 * 4 / 4,
        "optimizer": 6000 * 12 / 4,
        "host": 0.0,
        "step_temp": 0.0,
    }


def test_zero_1_offloads_both_the_dense_shard_and_the_whole_experts_optimizer_states():
    """ZeRO-1 with experts: the 2000 dense parameters' optimizer states sharded over 4
    replicas (2000 x 12 / 4), the 2000 expert parameters' whole (2000 x 12), both moved to the
    host by ZeRO-Offload; weights and gradients stay whole on the device (killed: either
    part's offload dropped, leaving its states on the device)."""
    opt = _option(4000, expert=2000, ep=2, offload=Offload.OPTIMIZER)
    sm = option_states(opt, 1, 4, BF16)
    assert sm == {
        "params": 4000 * 2,
        "grads": 4000 * 4,
        "optimizer": 0.0,
        "host": 2000 * 12 / 4 + 2000 * 12,
        "step_temp": 0.0,
    }


def test_a_deferring_stage_holds_whole_gradients_at_the_reduce_width():
    """A deferring ZeRO-3 pipeline stage (``deferred``): weights and gradients whole, as
    ZeRO-1's, the gradients at reduce_bytes = 2 under a bf16 reduce, optimizer states
    sharded over 4 (killed: ``accumulated`` not passed, holding them at the fp32 .grad's 4)."""
    sm = option_states(_option(4000), 3, 4, HALF_REDUCE, deferred=True)
    assert (sm["params"], sm["grads"], sm["optimizer"]) == (4000 * 2, 4000 * 2, 4000 * 12 / 4)


# --------------------------------------------------------------------------- what a rank holds


@pytest.mark.parametrize("held, want", [(True, 1 + 10 + 100), (False, 1 + 10)])
def test_forward_states_are_weights_and_optimizer_states_and_held_gradients(held, want):
    """forward_state_bytes (the stage MILP's and the search bound's state column): weights +
    optimizer states, + gradients only where they are held while activations peak."""
    sm = {"params": 1.0, "optimizer": 10.0, "grads": 100.0, "host": 1000.0, "step_temp": 1e4}
    assert forward_state_bytes(sm, held) == want


@pytest.mark.parametrize(
    "zero, offload, want",
    [
        (3, Offload.NONE, 2 * 1000 * 2),  # this block's and the prefetched one's bf16 weights
        (0, Offload.PARAMS, 2 * 1000 * 2),  # weights on the host come up whole too
        (2, Offload.NONE, 0.0),  # ZeRO-2 keeps whole weights: nothing gathered
    ],
)
def test_gathered_weights_are_two_blocks_of_weight_bytes(zero, offload, want):
    """2 x params x wb, the weights' width (2 in bf16), not the gradients' (4) (killed:
    ``state_bytes[1]``)."""
    assert gathered_weight_bytes(_option(1000, offload=offload), zero, BF16) == want


def _inputs(blocks, options, mesh: Mesh, zero: int, training: Training = BF16):
    config = Config(mesh, 1, "1f1b", 1, zero, [0] * len(blocks), [0] * len(blocks))
    world = mesh.pp * mesh.dp * mesh.tp
    return CostInputs(blocks, options, 1, cluster_of(world), training), config


@pytest.mark.parametrize(
    "owner_params, owner_options, tied, want",
    [
        # 4000 parameters, the most sharded option holding 2000 (vocab-parallel over TP 2):
        # share 1/2 of two tied reads (1000 and 600 elements), bf16, 3/4 not held by ZeRO-3
        (4000, [2000, 4000], {1: 1000, 2: 600}, (1000 + 600) * (2000 / 4000) * 2 * (1 - 1 / 4)),
        # an owner of one parameter (a shared scalar gain): its whole element, share 1
        (1, [1], {1: 1}, 1 * 1.0 * 2 * (1 - 1 / 4)),
    ],
)
def test_one_zero_3_stage_keeps_each_tied_weight_gathered(owner_params, owner_options, tied, want):
    """One stage under ZeRO-3 over 4 replicas: each tied weight stays gathered, numel x the
    share of its owner's parameters the most sharded option holds x wb x (1 - 1/dp), summed
    over the copies (killed: ``held * params`` for the share; ``numel / share``; the gradient
    width; ``total = ...`` keeping the last copy; ``max(params, 2)`` halving a one-parameter
    owner's share)."""
    names = {1: "wte.weight", 2: "pos.weight"}
    blocks = [make_block(i, "L", params=0, boundary=0, out=0) for i in range(3)]
    blocks[0] = replace(blocks[0], params=owner_params, param_names=list(names.values()))
    for user, numel in tied.items():
        blocks[user] = replace(blocks[user], tied={names[user]: numel})
    options = [[_option(p) for p in owner_options], [_option(0)], [_option(0)]]
    inp, config = _inputs(blocks, options, Mesh(pp=1, dp=4, tp=1), 3)
    assert tied_memory(inp, config, True) == pytest.approx(want, rel=1e-12)


def test_a_deferring_pipelines_tied_copies_accumulate_at_the_reduce_width():
    """Two stages, two replicas, ZeRO-2, two micro-batches (a deferring stage), bf16 reduce:
    the last rank keeps each of two tied copies (1000 and 600 elements) with whole weights
    (2), whole gradients at reduce_bytes (2) and optimizer states over 2 replicas (12 / 2)
    (killed: ``accumulated`` not passed, 4 bytes a gradient; ``total = ...``)."""
    blocks = [make_block(i, "L", params=0, boundary=0, out=0) for i in range(3)]
    blocks[0] = replace(blocks[0], params=1600, param_names=["wte.weight", "pos.weight"])
    blocks[2] = replace(blocks[2], tied={"wte.weight": 1000, "pos.weight": 600})
    options = [[_option(1600)], [_option(0)], [_option(0)]]
    inp, config = _inputs(
        blocks, options, Mesh(pp=2, dp=2, tp=1), 2, replace(HALF_REDUCE, global_batch_size=4)
    )
    config = replace(config, stage_of=[0, 1, 1])
    assert tied_memory(inp, config, True) == pytest.approx((1000 + 600) * (2 + 2 + 12 / 2))


def test_a_rank_holding_no_block_has_only_its_fixed_memory():
    """other_memory over no options (working memory and gathered weights default to 0):
    exactly fixed_memory, on a rank without the loss (killed: the defaults 1, None, or
    absent)."""
    blocks = [make_block(i, "L", boundary=0, out=0) for i in range(2)]
    inp, config = _inputs(blocks, [[_option(1000)]] * 2, Mesh(pp=2, dp=1, tp=1), 0)
    config = replace(config, stage_of=[0, 1])
    assert other_memory(inp, [], config, 0) == fixed_memory(inp, config, 0)


def test_the_working_set_is_the_largest_ops_memory_and_the_recomputed_activations():
    """One stage: the working set is max over options of transient + recompute peak
    (1000 + 500 and 200 + 100); the logits cost nothing here (the last block writes 0 bytes)
    (killed: ``transient - recompute_peak``)."""
    blocks = [make_block(i, "L", boundary=0, out=0) for i in range(2)]
    opts = [
        replace(_option(1000), transient_bytes=1000.0, recompute_peak_bytes=500.0),
        replace(_option(1000), transient_bytes=200.0, recompute_peak_bytes=100.0),
    ]
    inp, config = _inputs(blocks, [[o] for o in opts], Mesh(pp=1, dp=1, tp=1), 0)
    assert other_memory(inp, opts, config, 0) == fixed_memory(inp, config, 0) + 1500.0


@pytest.mark.parametrize(
    "receives, sends, released, want",
    [
        (True, False, True, 1),  # the input gradient being sent back
        (False, True, True, 3 + 1),  # held outputs + the output gradient being received
        (True, True, True, 1 + 3 + 1),
        (False, False, True, 0),
        (True, False, False, 8 - 3 + 1),
        (False, True, False, 8 + 3),
        (True, True, False, (8 - 3 + 1) + (8 + 3)),
    ],
)
def test_a_stages_buffers_hold_what_its_sends_and_receives_leave(receives, sends, released, want):
    """held_boundaries at m = 8 micro-batches, 3 held in flight, by its docstring's counts
    for released and torch's buffers (killed: every change to the released branch's terms,
    which only the gloo test in tests/test_pipeline_buffers.py otherwise reads)."""
    assert held_boundaries(8, 3, receives, sends, released) == want


@pytest.mark.parametrize("above", [1e9, -8e8])
def test_the_allocators_reserve_grows_the_allocated_bytes_beyond_the_context(above):
    """reserved_peak on the H100 profile: the CUDA context, then the allocated bytes beyond
    it times 1 + allocator_overhead; a peak below the context reserves just the context
    (no test reached it: every change to it survived)."""
    profile = load_profile("h100-sxm")
    context, overhead = profile.reserved_bytes, profile.allocator_overhead
    assert context > 1e9 and overhead > 0
    want = context + max(0.0, above) * (1 + overhead)
    assert reserved_peak(context + above, profile) == pytest.approx(want, rel=1e-12)


# --------------------------------------------------------------------------- pipeline buffers


def _two_stages(traced_mbs: int, tp: int, training: Training):
    blocks = [make_block(i, "L", boundary=8192, out=4096) for i in range(2)]
    mesh = Mesh(pp=2, dp=1, tp=tp)
    inp, config = _inputs(blocks, [[_option(1000)]] * 2, mesh, 0, training)
    return replace(inp, traced_mbs=traced_mbs), replace(config, stage_of=[0, 1])


@pytest.mark.parametrize("rank, held_buffers", [(0, 2 + 1), (1, 1)])
def test_released_buffers_hold_tp_shards_of_a_micro_batchs_boundary(rank, held_buffers):
    """Two stages, TP 2 sending sequence shards, released receive buffers, 1F1B over m = 4:
    rank 0 sends (its 2 held outputs + the one gradient being received), rank 1 receives (the
    input gradient being sent), each b = 8192 bytes a traced set of 2 samples x 1 sample /
    2 / TP 2 (killed: ``* traced_mbs``; ``b = tp``, ``b *= tp``; torch's counts for
    released buffers)."""
    from planner.cost.memory import pipeline_buffer_bytes

    training = replace(
        Training(4, "fp32", "sgd"), pipeline_sends_shards=True, released_recv_buffers=True
    )
    inp, config = _two_stages(2, 2, training)
    b = 8192 * 1 / 2 / 2
    assert pipeline_buffer_bytes(inp, config, rank) == held_buffers * b


def test_the_last_stages_logits_scale_from_the_traced_samples_to_the_micro_batch():
    """loss_memory: three fp32 copies of the last block's 4096 output bytes per traced set
    (fp32: 3 x 4 x 4096 / 4), at 1 sample of a traced 2 (killed: ``* traced_mbs``)."""
    from planner.cost.memory import loss_memory

    inp, config = _two_stages(2, 1, Training(4, "fp32", "sgd"))
    assert loss_memory(inp, config, True) == 3 * 4096 * 1 / 2
    assert loss_memory(inp, config, False) == 0.0


# --------------------------------------------------------------------------- rank_memory


def _one_rank(training: Training, act: float):
    from planner.cost.records import StageCost

    blocks = [make_block(i, "L", boundary=0, out=0) for i in range(2)]
    opts = [replace(_option(p), act_bytes=act) for p in (1000, 3000)]
    inp, config = _inputs(blocks, [[o] for o in opts], Mesh(pp=1, dp=1, tp=1), 0, training)
    stage = StageCost(0, 0, [0, 1], *[0.0] * 10, inflight=2, held=2.0)  # times unread
    return inp, config, [stage]


def test_the_activation_peak_adds_each_blocks_states_and_held_activations():
    """fp32 SGD, torch's fused step (4 + 4 + 4 bytes a parameter, no temporaries), two
    micro-batches (gradients held), blocks of 1000 and 3000 parameters with 500 bytes of
    activations each, 2 micro-batches held: the activation peak is the larger; no host bytes
    (killed: any part or the host starting at 1 byte)."""
    from planner.cost.memory import rank_memory

    inp, config, stages = _one_rank(Training(2, "fp32", "sgd"), 500.0)
    (mem,), host = rank_memory(inp, config, stages)
    fixed = fixed_memory(inp, config, 0)
    want = {"params": 16000.0, "grads": 16000.0, "optimizer": 16000.0, "activations": 2000.0}
    assert mem == {**want, "other": fixed, "total": 50000.0 + fixed}
    assert host == 0.0


def test_the_step_peak_adds_each_blocks_states_and_its_temporaries():
    """fp32 AdamW with torch's per-op step (4 + 4 + 8 bytes a parameter, 4 of temporaries)
    and no activations: the optimizer step's peak is the larger, summed over both blocks
    (killed: a part starting at 1 byte; ``step[k] = v`` keeping the last block's)."""
    from planner.cost.memory import rank_memory

    training = replace(Training(2, "fp32", "adamw"), fused_optimizer=False)
    assert training.step_temp_bytes == 4
    inp, config, stages = _one_rank(training, 0.0)
    (mem,), host = rank_memory(inp, config, stages)
    fixed = fixed_memory(inp, config, 0)
    want = {"params": 16000.0, "grads": 16000.0, "optimizer": 32000.0, "activations": 0.0}
    assert mem == {**want, "other": fixed + 16000.0, "total": 80000.0 + fixed}
    assert host == 0.0


def test_the_host_keeps_every_offloaded_blocks_optimizer_states():
    """ZeRO-Offload on both blocks (fp32 SGD, 4 optimizer bytes a parameter): the rank's
    host bytes are both blocks' states, (1000 + 3000) x 4, and none stay on the device
    (killed: ``rank_host = ...`` keeping the last block's)."""
    from planner.cost.memory import rank_memory

    inp, config, stages = _one_rank(Training(2, "fp32", "sgd"), 500.0)
    offloaded = [[replace(o[0], offload=Offload.OPTIMIZER)] for o in inp.options]
    (mem,), host = rank_memory(replace(inp, options=offloaded), config, stages)
    assert (host, mem["optimizer"]) == ((1000 + 3000) * 4, 0.0)
