"""The outer search space (planner/search/candidates.py) at cases worked by hand, written for
the module's generated mutants (docs/mutation.md): a candidate's key, mesh and label; the
degrees, schedules and ZeRO stages it may take; the enumeration against a brute force over
every layout; and each message that says why no layout fits."""

from __future__ import annotations

import itertools

import pytest
from conftest import make_block

from planner.errors import UserInputError
from planner.search.candidates import (
    INTERLEAVE,
    Candidate,
    Pins,
    _cp_dominated,
    _schedules,
    _zero_stages,
    check_ep_pin,
    cp_degrees,
    divisors,
    enumerate_candidates,
    ep_degrees,
    expert_counts,
    no_candidate_message,
)
from planner.training import Training


def test_a_candidates_key_mesh_and_label():
    c = Candidate(2, 4, 2, 3, "interleaved_1f1b", 4, 1, ep=2, cp=1)
    assert c.mesh_key == (2, 4, 2)
    assert c.key == (2, 3, 2, 1, True, False)
    m = c.mesh
    assert (m.pp, m.dp, m.tp, m.ep, m.cp) == (2, 4, 2, 2, 1)
    assert c.label() == "pp2 dp4 ep2 tp2, micro-batch 3, interleaved 1F1B x4, ZeRO-1"
    assert c.label("1..4", "2..8") == (
        "pp2 dp1..4 ep2 tp2..8, micro-batch 3, interleaved 1F1B x4, ZeRO-1"
    )
    one = Candidate(1, 2, 4, 1, "1f1b", 1, 3, cp=2, stream=True)
    assert one.key == (4, 1, 1, 2, False, True)
    assert not one.pipelined_tp and not Candidate(2, 1, 1, 1, "gpipe", 1, 0).pipelined_tp
    assert one.mesh.cp == 2 and one.mesh.ep == 1
    assert one.label() == (
        "pp1 dp2 cp2 tp4 (sequence-sharded stream), micro-batch 1, no pipeline, ZeRO-3"
    )
    assert Candidate(2, 1, 1, 1, "gpipe", 1, 0).label() == (
        "pp2 dp1 tp1, micro-batch 1, gpipe, ZeRO-0"
    )
    fresh = Candidate(1, 1, 1, 1, "1f1b", 1, 0)
    assert (fresh.ep, fresh.cp, fresh.bound, fresh.status, fresh.stream) == (
        1, 1, 0.0, "pending", False
    )  # fmt: skip


def test_divisors_and_the_degrees_experts_and_sequences_allow():
    assert divisors(12) == [1, 2, 3, 4, 6, 12] and divisors(1) == [1]
    dense = [make_block(0, "a")]
    moe = [make_block(i, "m") for i in range(3)]
    moe[0].extra = {"moe": {"num_experts": 8}}
    moe[2].extra = {"moe": {"num_experts": 4}}
    assert expert_counts(moe) == [4, 8] and expert_counts(dense) == []
    assert ep_degrees(moe, 8, Pins()) == [1, 2, 4]  # divisors of dp 8 dividing 4 and 8
    assert ep_degrees(moe, 6, Pins()) == [1, 2]
    assert ep_degrees(moe, 8, Pins(ep=2)) == [2]
    assert ep_degrees(moe, 8, Pins(ep=8)) == []
    assert ep_degrees(dense, 8, Pins(ep=2)) == [1]
    # 2 * cp equal chunks of the sequence
    assert cp_degrees(64, 8, Pins()) == [1, 2, 4, 8]
    assert cp_degrees(12, 8, Pins()) == [1, 2]
    assert cp_degrees(8, 8, Pins()) == [1, 2, 4]
    assert cp_degrees(0, 8, Pins()) == [1]
    assert cp_degrees(64, 8, Pins(cp=2)) == [2]
    assert cp_degrees(12, 6, Pins()) == [1, 2, 3, 6]
    assert cp_degrees(10, 6, Pins()) == [1]


@pytest.mark.parametrize(
    "gbs,dp,cp,mbs,pins,dominated",
    [
        (8, 2, 2, 2, Pins(), True),  # dp 4 of micro-batch 1 does the same
        (8, 2, 2, 1, Pins(), False),  # mbs 1 cannot split over 2
        (4, 4, 2, 2, Pins(), False),  # 8 replicas for 4 samples
        (8, 2, 2, 2, Pins(cp=2), False),
        (8, 2, 2, 2, Pins(dp=2), False),
        (8, 2, 2, 2, Pins(micro_batch_size=2), False),
        (12, 2, 3, 3, Pins(), False),  # 12 % 6 == 0, mbs 3 % 3 == 0: dominated
    ][:6]
    + [(12, 2, 3, 3, Pins(), True), (12, 4, 3, 3, Pins(), True), (6, 4, 3, 3, Pins(), False)],
)
def test_context_parallelism_is_left_out_where_data_parallelism_does_its_work(
    gbs, dp, cp, mbs, pins, dominated
):
    assert _cp_dominated(gbs, dp, cp, mbs, pins) is dominated


def test_the_schedules_a_pipeline_may_run():
    assert INTERLEAVE == (2, 4, 8)
    assert _schedules(1, 4, 6, Pins()) == [("1f1b", 1)]
    assert _schedules(1, 4, 6, Pins(schedule="gpipe")) == [("gpipe", 1)]
    assert _schedules(1, 4, 6, Pins(schedule="1f1b")) == [("1f1b", 1)]
    assert _schedules(1, 4, 6, Pins(schedule="interleaved_1f1b")) == []
    # m = 4 >= pp = 2: 1F1B; 2 x 2 chunks of 8 blocks; m % pp == 0
    assert _schedules(2, 4, 8, Pins()) == [
        ("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("interleaved_1f1b", 4)
    ]  # fmt: skip
    assert _schedules(2, 2, 16, Pins()) == [
        ("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("interleaved_1f1b", 4),
        ("interleaved_1f1b", 8),
    ]  # fmt: skip
    assert _schedules(4, 3, 16, Pins()) == [("gpipe", 1)]  # m < pp; 3 % 4
    assert _schedules(2, 3, 16, Pins()) == [("gpipe", 1), ("1f1b", 1)]  # 3 % 2
    assert _schedules(2, 4, 3, Pins()) == [("gpipe", 1), ("1f1b", 1)]  # 2 x 2 > 3 blocks
    assert _schedules(2, 4, 4, Pins()) == [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)]
    assert _schedules(2, 4, 8, Pins(schedule="1f1b")) == [("1f1b", 1)]
    assert _schedules(2, 4, 8, Pins(virtual_stages=3)) == [
        ("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 3)
    ][2:]  # fmt: skip
    assert _schedules(2, 4, 8, Pins(virtual_stages=1)) == [("gpipe", 1), ("1f1b", 1)]


def test_the_zero_stages_worth_pricing():
    assert _zero_stages(2, Pins()) == (0, 1, 2, 3)
    assert _zero_stages(1, Pins()) == (0, 3)  # offload "auto": FSDP2 on one rank may offload
    assert _zero_stages(1, Pins(offload="none")) == (0,)
    assert _zero_stages(1, Pins(offload="none", zero=3)) == (0, 3)
    assert _zero_stages(1, Pins(offload="optimizer+params")) == (0, 3)


def _brute_force(gpus, n_blocks, gbs, pins, tps, counts, sequence):
    """Every (pp, dp, tp, mbs, schedule, v, zero, ep, cp) over wide ranges, kept when it
    obeys each rule of the search space as docs/search.md states it."""
    out = []
    rng = range(1, 17)
    for tp, pp, dp, cp in itertools.product(tps, rng, rng, rng):
        if pp * dp * tp * cp != gpus or pp > n_blocks or gbs % dp:
            continue
        if counts and cp != 1 or (cp > 1 and (not sequence or sequence % (2 * cp))):
            continue
        if any(p and p != x for p, x in ((pins.tp, tp), (pins.pp, pp), (pins.dp, dp))):
            continue
        if pins.cp and cp != pins.cp:
            continue
        for mbs in rng:
            if (gbs // dp) % mbs or (pins.micro_batch_size and mbs != pins.micro_batch_size):
                continue
            if cp > 1 and not (pins.cp or pins.dp or pins.micro_batch_size):
                if mbs % cp == 0 and gbs % (dp * cp) == 0:
                    continue
            m = gbs // dp // mbs
            for sched, v in [("1f1b", 1), ("gpipe", 1)] + [("interleaved_1f1b", v) for v in rng]:
                if pp == 1:
                    ok = v == 1 and (
                        sched == (pins.schedule or "1f1b")
                        or (sched == "1f1b" and pins.schedule == "1f1b")
                    )
                else:
                    ok = (
                        sched == "gpipe"
                        or (sched == "1f1b" and m >= pp)
                        or (v > 1 and pp * v <= n_blocks and m % pp == 0
                            and v in ((pins.virtual_stages,) if pins.virtual_stages else (2, 4, 8)))
                    )  # fmt: skip
                    ok = ok and (not pins.schedule or sched == pins.schedule)
                    ok = ok and (not pins.virtual_stages or v == pins.virtual_stages)
                if not ok:
                    continue
                for zero in range(4):
                    if pins.zero is not None and zero != pins.zero:
                        continue
                    if dp * cp == 1 and zero in (1, 2):
                        continue
                    if dp * cp == 1 and zero == 3 and pins.offload == "none" and pins.zero != 3:
                        continue
                    if zero == 1 and (tp > 1 or pp > 1) and pins.zero != 1:
                        continue
                    for ep in rng:
                        if dp % ep or any(c % ep for c in counts) or (not counts and ep > 1):
                            continue
                        if pins.ep and counts and ep != pins.ep:
                            continue
                        out.append((pp, dp, tp, mbs, sched, v, zero, ep, cp))
    return sorted(out)


@pytest.mark.parametrize(
    "gpus,n_blocks,gbs,pins,tps,moe,sequence",
    [
        (8, 4, 8, Pins(), [1, 2, 4], False, 64),
        (8, 6, 16, Pins(), [1, 2], False, 0),
        (4, 8, 8, Pins(offload="none"), [1, 2], False, 12),
        (8, 4, 8, Pins(), [1, 2], True, 64),
        (8, 4, 8, Pins(ep=2, zero=1), [1, 2], True, 0),
        (8, 16, 16, Pins(pp=2, schedule="interleaved_1f1b"), [1, 2], False, 0),
        (8, 16, 16, Pins(pp=4, virtual_stages=2, micro_batch_size=1), [1, 2], False, 0),
        (8, 4, 8, Pins(cp=2, tp=2), [1, 2], False, 64),
        (8, 4, 16, Pins(micro_batch_size=2), [1, 2], False, 64),
        (8, 4, 8, Pins(dp=2), [1, 2, 4], False, 64),
        (2, 1, 4, Pins(schedule="gpipe"), [1, 2], False, 0),
        (6, 3, 6, Pins(zero=3, offload="none"), [1, 2, 3], False, 24),
    ],
)
def test_the_enumeration_is_every_layout_the_rules_allow(
    gpus, n_blocks, gbs, pins, tps, moe, sequence
):
    blocks = [make_block(i, "b") for i in range(n_blocks)]
    if moe:
        blocks[0].extra = {"moe": {"num_experts": 4}}
    training = Training(gbs, "bf16", "adamw")
    got = enumerate_candidates(gpus, n_blocks, training, pins, tps, blocks, sequence)
    keys = [(c.pp, c.dp, c.tp, c.micro_batch_size, c.schedule, c.virtual_stages, c.zero, c.ep,
             c.cp) for c in got]  # fmt: skip
    counts = [4] if moe else []
    assert sorted(keys) == _brute_force(gpus, n_blocks, gbs, pins, tps, counts, sequence)
    assert len(set(keys)) == len(keys) and keys
    assert all(c.status == "pending" and not c.stream for c in got)


def test_the_enumeration_without_blocks_is_a_dense_models():
    training = Training(4, "bf16", "adamw")
    got = enumerate_candidates(2, 2, training, Pins(), [1, 2])
    assert {(c.pp, c.dp, c.tp, c.ep, c.cp) for c in got} == {
        (1, 2, 1, 1, 1), (2, 1, 1, 1, 1), (1, 1, 2, 1, 1)
    }  # fmt: skip


def test_an_ep_pin_needs_experts_it_divides():
    blocks = [make_block(0, "m"), make_block(1, "m")]
    check_ep_pin(blocks, Pins(ep=1))
    check_ep_pin(blocks, Pins())
    with pytest.raises(UserInputError) as e:
        check_ep_pin(blocks, Pins(ep=2))
    assert str(e.value) == (
        "--ep 2: the model has no mixture-of-experts layer (no module whose parameters are "
        "stacked per expert) to spread: drop --ep"
    )
    blocks[0].extra = {"moe": {"num_experts": 8}}
    blocks[1].extra = {"moe": {"num_experts": 6}}
    check_ep_pin(blocks, Pins(ep=2))
    with pytest.raises(UserInputError) as e:
        check_ep_pin(blocks, Pins(ep=4))
    assert str(e.value) == "--ep 4 does not divide the expert count (6, 8): choose a divisor of it"


T8 = Training(8, "bf16", "adamw")


@pytest.mark.parametrize(
    "gpus,pins,tps,n_blocks,message",
    [
        (8, Pins(pp=5), [1, 2], 4,
         "--pp 5 needs 5 pipeline stages, but the model traced to 4 blocks (b0, b1, b2, ...): a "
         "pipeline cuts only between blocks, which follow the module tree (each child of a "
         "ModuleList or Sequential of two or more is one): pin --pp 4 or less"),
        (8, Pins(pp=2), [1, 2], 1,
         "--pp 2 needs 2 pipeline stages, but the model traced to 1 block (b0): a "
         "pipeline cuts only between blocks, which follow the module tree (each child of a "
         "ModuleList or Sequential of two or more is one): pin --pp 1 or less"),
        (8, Pins(pp=4), [1], 3,
         "--pp 4 needs 4 pipeline stages, but the model traced to 3 blocks (b0, b1, b2): a "
         "pipeline cuts only between blocks, which follow the module tree (each child of a "
         "ModuleList or Sequential of two or more is one): pin --pp 3 or less"),
        (8, Pins(tp=2), [1], 4,
         "--tp 2: no layer of this model can be split by tensor parallelism (none has a weight "
         "that only its own module reads, in dimensions the degree divides; a weight also read "
         "elsewhere, as a tied decoder's transpose, stays whole): drop --tp"),
        (8, Pins(tp=4), [1, 2], 4,
         "--tp 4 cannot shard this model on 8 GPUs: it must divide the GPU count and the "
         "dimensions it shards; possible degrees: 1, 2"),
        (8, Pins(pp=4, dp=3), [1, 2], 4,  # as many stages as blocks is no reason
         "the global batch 8 is not divisible by --dp 3: choose a global batch that is a "
         "multiple of the data-parallel degree"),
        (8, Pins(dp=3), [1, 2], 4,
         "the global batch 8 is not divisible by --dp 3: choose a global batch that is a "
         "multiple of the data-parallel degree"),
        (6, Pins(ep=4), [1, 2], 4,
         "--ep 4 must divide the data-parallel degree (experts are spread over data-parallel "
         "ranks): pin a --dp that it divides, or a smaller --ep"),
        (9, Pins(ep=2), [1], 4,
         "--ep 2 must divide the data-parallel degree (experts are spread over data-parallel "
         "ranks): pin a --dp that it divides, or a smaller --ep"),
        (8, Pins(ep=4, dp=2), [1, 2], 4,
         "--ep 4 must divide the data-parallel degree (experts are spread over data-parallel "
         "ranks): pin a --dp that it divides, or a smaller --ep"),
        (8, Pins(pp=3, dp=2), [1, 2], 4,
         "--pp 3 x --dp 2 = 6 devices, which does not fit --gpus 8: make them agree"),
        (8, Pins(pp=2, dp=2, tp=1), [1, 2], 4,
         "--pp 2 x --dp 2 x --tp 1 = 4 devices, which does not fit --gpus 8: make them agree"),
        (8, Pins(pp=2, virtual_stages=3), [1, 2], 4,
         "--pp 2 x --virtual-stages 3 needs 6 chunks of at least one block, but the model "
         "traced to 4 blocks: pin --virtual-stages 2 or less"),
        (8, Pins(pp=4, virtual_stages=2), [1, 2], 3,
         "--pp 4 needs 4 pipeline stages, but the model traced to 3 blocks (b0, b1, b2): a "
         "pipeline cuts only between blocks, which follow the module tree (each child of a "
         "ModuleList or Sequential of two or more is one): pin --pp 3 or less"),
        (8, Pins(pp=2, virtual_stages=2), [1, 2], 3,
         "--pp 2 x --virtual-stages 2 needs 4 chunks of at least one block, but the model "
         "traced to 3 blocks: pin --virtual-stages 1 or less"),
        (8, Pins(micro_batch_size=3, dp=2), [1, 2], 4,
         "--micro-batch-size 3 does not divide the per-replica batch 4 (global 8 / --dp 2)"),
        (8, Pins(tp=2, pp=2, dp=2, micro_batch_size=2, zero=1), [1, 2], 4,
         "no parallel layout of 8 GPUs matches the pinned flags and a global batch of 8: "
         "relax --tp/--pp/--dp/--micro-batch-size or change --global-batch-size"),
    ],
)  # fmt: skip
def test_each_reason_no_layout_fits_is_said(gpus, pins, tps, n_blocks, message):
    blocks = [make_block(i, "b") for i in range(n_blocks)]
    assert no_candidate_message(gpus, T8, pins, tps, blocks) == message


def test_messages_that_need_the_blocks_are_skipped_without_them():
    assert no_candidate_message(8, T8, Pins(pp=4, virtual_stages=3), [1, 2]).startswith(
        "no parallel layout of 8 GPUs"
    )
    one = [make_block(0, "b")]
    assert no_candidate_message(8, T8, Pins(tp=1), [1], one).startswith("no parallel layout")
    # a virtual-stage pin of 1, or one without --pp, names no chunks
    four = [make_block(i, "b") for i in range(4)]
    assert no_candidate_message(8, T8, Pins(pp=2, virtual_stages=1), [1], four).startswith("no ")
    assert no_candidate_message(8, T8, Pins(pp=2), [1], four).startswith("no ")
    assert no_candidate_message(8, T8, Pins(virtual_stages=8), [1], four).startswith("no ")
    assert no_candidate_message(8, T8, Pins(pp=2, virtual_stages=2), [1], four).startswith("no ")
    assert no_candidate_message(8, T8, Pins(ep=1, dp=3), [1], four).startswith("the global")
    assert no_candidate_message(8, T8, Pins(micro_batch_size=3), [1], four).startswith("no ")
    assert no_candidate_message(8, T8, Pins(dp=2, ep=2), [1], four).startswith("no ")


_KEPT: dict = {}  # traces kept in the module: mutmut's forked children reuse the session's


def _traced(name: str, **args):
    from pathlib import Path

    from planner.api import trace

    path = Path(__file__).resolve().parent.parent / "examples" / name
    key = (name, tuple(sorted(args.items())))
    if key not in _KEPT:
        _KEPT[key] = trace(str(path), args, traced_batch_size=1, dtype="bf16")
    return _KEPT[key]


def test_context_parallelism_splits_the_sequence_of_fused_attention_only():
    """The tiny Llama (SDPA, 32 tokens a sample) splits its 32; the tiny GPT's explicit
    softmax(QK^T)V (products of two activations in the core) none; attentions of two lengths,
    or none at all, none."""
    from planner.search.candidates import attention_sequence
    from planner.trace.opcost import ATTENTION_OPS

    llama = _traced("llama.py", size="tiny").graph
    assert attention_sequence(llama) == 32
    assert attention_sequence(_traced("gpt.py", size="tiny").graph) == 0
    g = llama.copy()
    attn = [n for n in g.nodes if g.nodes[n]["op"] in ATTENTION_OPS]
    assert len(attn) == 2
    shape = list(g.nodes[attn[0]]["shapes"][0])
    g.nodes[attn[0]]["shapes"] = [shape[:-2] + [16, shape[-1]]]
    assert attention_sequence(g) == 0  # 16 and 32
    g.nodes[attn[0]]["shapes"] = []  # an attention without shapes is not counted
    assert attention_sequence(g) == 32
    for n in attn:  # queries of three dimensions: the sequence is still the second to last
        g.nodes[n]["shapes"] = [[8, 32, 16]]
    assert attention_sequence(g) == 32
    g.remove_nodes_from(attn)
    assert attention_sequence(g) == 0
    # one fused attention beside the GPT's products of two activations: no ring either
    gpt = _traced("gpt.py", size="tiny").graph.copy()
    gpt.add_node("fa", op=sorted(ATTENTION_OPS)[0], shapes=[[1, 4, 32, 16]], order=-1, args=[],
                 params=[])  # fmt: skip
    assert attention_sequence(gpt) == 0
