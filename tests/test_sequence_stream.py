"""Megatron's sequence-sharded residual stream, priced by hand (tiny Llama, fp32, TP 2).

A sequence-parallel layer entered and left replicated runs, per traced sample, two
reduce-scatters and three all-gathers forward (the attention's and the MLP's inputs, the
layer's output at exit) and seven collectives backward (the two reduce-scatters' adjoint
gathers, the two input gathers' adjoint reduce-scatters, their regathers, and the gather of
the input's gradient at the entry slice); each moves the stream, s x h x 4 = 32 x 64 x 4 =
8192 bytes. Inside the stream, a layer that leaves its output sharded loses the forward
exit gather and one that takes its input sharded loses the backward entry gather, and its
full recompute keeps the 4096-byte shard. A pipeline cut sends 1/2 of the boundary
(runtime.stages.send_sequence_shards). A model that reads each layer's output after the
next layer keeps today's layout.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from runs import forced_plan

from planner.api import trace, variants_for
from planner.cost.memory import pipeline_buffer_bytes
from planner.cost.pipeline import stage_time_parts
from planner.cost.records import Config, CostInputs
from planner.cost.sharding import sequence_stream
from planner.errors import UserInputError
from planner.hardware.cluster import make_cluster
from planner.hardware.collectives import collective_time, p2p_time
from planner.modelfile import load_model_file
from planner.schema import validate_plan
from planner.schema.mesh import Mesh
from planner.search import Pins
from planner.search.candidates import Candidate
from planner.search.driver import stream_training, stream_twins
from planner.search.options import cuts_send_shards, price_options, sequence_stream_flags
from planner.trace.stream import stream_at_cuts
from planner.training import Training
from planner.vocab import Recompute

ROOT = Path(__file__).resolve().parent.parent
STREAM = 32 * 64 * 4  # one traced sample's residual stream, fp32
TP = 2
PINS = Pins(tp=TP, recompute="auto", offload="none", tp_variant="sequence")
TRAINING = Training(8, "fp32", "sgd", released_recv_buffers=True)


@pytest.fixture(scope="module")
def llama():
    mf = load_model_file(ROOT / "examples" / "llama.py", {"size": "tiny"})
    traced = trace(mf, traced_batch_size=1, dtype="fp32")
    cluster, _ = make_cluster(4, "h100-sxm")
    return traced, cluster, variants_for(traced.graph, cluster, "sequence", {}, None)


def _kinds(comm) -> Counter:
    assert {b for _, b in comm} == {STREAM}  # every collective moves the whole stream
    return Counter(k for k, _ in comm)


def test_a_layer_inside_the_stream_drops_its_exit_and_entry_gathers(llama):
    traced, cluster, variants_of = llama
    (sp,) = [v for v in variants_of(traced.blocks[1], TP) if v.exit_gather]
    assert _kinds(sp.comm_fwd) == {"reduce_scatter": 2, "all_gather": 3}
    assert _kinds(sp.comm_bwd) == {"all_gather": 5, "reduce_scatter": 2}
    inside = sequence_stream(sp, takes=True, leaves=True)
    assert _kinds(inside.comm_fwd) == {"reduce_scatter": 2, "all_gather": 2}
    assert _kinds(inside.comm_bwd) == {"all_gather": 4, "reduce_scatter": 2}
    # the embedding before and the final norm after are no sequence-parallel blocks
    flags = sequence_stream_flags(traced.graph, traced.blocks, TP, False, variants_of)
    assert flags == [(False, False), (False, True), (True, False), (False, False)]


def test_the_priced_options_lose_one_gather_each_way_and_keep_the_shard(llama):
    traced, cluster, variants_of = llama
    args = (traced.graph, traced.blocks, TP, 1, cluster, TRAINING, PINS, variants_of)
    before = price_options(*args)
    after = price_options(*args, stream=True)
    gather = collective_time("all_gather", STREAM, cluster, list(range(TP)))
    assert gather > 0

    def option(opts, i, rc):
        (o,) = [o for o in opts[i] if o.recompute == rc]
        return o

    first, second = option(after, 1, Recompute.NONE), option(after, 2, Recompute.NONE)
    whole = option(before, 1, Recompute.NONE)
    assert (first.leaves_sequence_shard, second.takes_sequence_shard) == (True, True)
    assert first.fwd_s == pytest.approx(whole.fwd_s - gather, rel=1e-12)
    assert first.bwd_s == pytest.approx(whole.bwd_s, rel=1e-12)
    assert second.fwd_s == pytest.approx(whole.fwd_s, rel=1e-12)
    assert second.bwd_s == pytest.approx(whole.bwd_s - gather, rel=1e-12)
    # full recompute keeps the input's shard: a layer entered replicated slices it for its
    # checkpoint (runtime.selective), one entered with the shard keeps what it takes
    assert option(after, 1, Recompute.FULL).act_bytes == STREAM / TP
    assert option(after, 2, Recompute.FULL).act_bytes == STREAM / TP
    assert option(before, 2, Recompute.FULL).act_bytes == STREAM / TP


def test_a_cut_sends_the_shard_into_half_the_buffers_and_half_the_hop(llama):
    """Two stages, 1F1B, micro-batch 2, m = 4: rank 0 holds its 2 in-flight outputs and the
    gradient being received (3 buffers), rank 1 the input gradient being sent (1), each the
    boundary (the stream 8192 + the rotary cos and sin 2 x 32 x 16 x 4 = 4096 bytes) x 2
    samples / TP 2 = 12288 bytes; the hop sends that 12288 each way."""
    traced, cluster, variants_of = llama
    graph, blocks = traced.graph, traced.blocks
    flags = sequence_stream_flags(graph, blocks, TP, True, variants_of)
    assert cuts_send_shards(graph, blocks, flags)
    cand = Candidate(2, 1, TP, 2, "1f1b", 1, 0, stream=True)
    training = stream_training(graph, blocks, cand, TRAINING, variants_of)
    assert training.pipeline_sends_shards and not TRAINING.pipeline_sends_shards
    opts = price_options(graph, blocks, TP, 2, cluster, TRAINING, PINS, variants_of, stream=True)
    config = Config(Mesh(2, 1, TP), 2, "1f1b", 1, 0, [0, 0, 1, 1], [0] * 4)
    boundary = 12288 * 2 / TP
    for tr, b in ((training, boundary), (TRAINING, 2 * boundary)):
        inp = CostInputs(blocks, opts, 1, cluster, tr)
        assert inp.boundary_bytes == 12288
        assert pipeline_buffer_bytes(inp, config, 0) == 3 * b
        assert pipeline_buffer_bytes(inp, config, 1) == 1 * b
        bw, lat = cluster.link([config.mesh.rank(0, 0, 0), config.mesh.rank(1, 0, 0)])
        p2p = stage_time_parts(inp, opts[0][:1], config, 0)[2]
        assert p2p == pytest.approx(2 * p2p_time(b, bw, lat), rel=1e-12)


def test_a_model_reading_each_layers_output_later_keeps_the_stream_whole():
    """Each layer's output feeds the next layer and the head's mean: no cut hands the stream
    over, so no layer takes or leaves a shard, no candidate prices the sharded stream, and
    examples/gpt.py's own layers (the same code) do."""
    cluster, _ = make_cluster(4, "h100-sxm")
    for name, chained in (("tests/models/hidden_states_gpt.py", False), ("examples/gpt.py", True)):
        mf = load_model_file(ROOT / name, {"size": "tiny"})
        traced = trace(mf, traced_batch_size=1, dtype="fp32")
        graph, blocks = traced.graph, traced.blocks
        variants_of = variants_for(graph, cluster, "sequence", {}, None)
        assert any(v.exit_gather for v in variants_of(blocks[1], TP))  # layers can run SP
        cuts = stream_at_cuts(graph, blocks)
        assert cuts[1].handed_over is chained, name
        flags = sequence_stream_flags(graph, blocks, TP, False, variants_of)
        assert any(t or leaves for t, leaves in flags) is chained
        cand = Candidate(1, 2, TP, 2, "1f1b", 1, 0)
        twins = stream_twins(graph, blocks, [cand], PINS, variants_of)
        assert [c.stream for c in twins] == ([True] if chained else [False])


def _plan(layers: list[dict], receives: bool | None = None) -> dict:
    """A minimal two-stage plan dict of ``layers`` (stage 0, then stage 1)."""
    blocks = [
        {"name": f"l{i}", "modules": [f"l{i}"], "recompute": "none", "offload": "none",
         "tp_plan": {f"l{i}": "sp_block"}, "stage": i, **extra}
        for i, extra in enumerate(layers)
    ]  # fmt: skip
    stages = [{"index": 0}, {"index": 1, **({"receives_sequence_shard": True} if receives else {})}]
    return {"blocks": blocks, "stages": stages}


def test_the_plan_file_flags_must_agree():
    from planner.schema.checks import _check_sequence_stream

    _check_sequence_stream(_plan([{}, {}]), "p")  # an old plan: whole everywhere
    shard = [{"leaves_sequence_shard": True}, {"takes_sequence_shard": True}]
    _check_sequence_stream(_plan(shard, receives=True), "p")
    with pytest.raises(UserInputError, match="disagree"):  # a shard the cut does not send
        _check_sequence_stream(_plan(shard), "p")
    with pytest.raises(UserInputError, match="first block cannot take"):
        _check_sequence_stream(_plan([{"takes_sequence_shard": True}, {}]), "p")
    one_stage = _plan(shard)
    one_stage["blocks"][1]["stage"] = 0
    _check_sequence_stream(one_stage, "p")
    one_stage["blocks"][1].pop("takes_sequence_shard")
    with pytest.raises(UserInputError, match="disagree"):
        _check_sequence_stream(one_stage, "p")


def test_a_pinned_sequence_plan_records_the_stream(tmp_path):
    """Tiny GPT at TP 2 x PP 2 with sequence parallelism pinned: the layers hand the stream
    over across the cut, the second stage receives shards, and the plan file validates; with
    the second stage's flag dropped it does not."""
    pins = dict(tp=2, dp=1, pp=2, zero=0, micro_batch_size=2, schedule="1f1b")
    path = forced_plan("gpt", 4, tmp_path, tp_variant="sequence", recompute="none", **pins)
    plan = json.loads(path.read_text())
    layers = [b for b in plan["blocks"] if "sp_block" in b["tp_plan"].values()]
    assert [b.get("takes_sequence_shard", False) for b in layers] == [False, True]
    assert [b.get("leaves_sequence_shard", False) for b in layers] == [True, False]
    assert [b["stage"] for b in layers] == [0, 1]
    assert [s.get("receives_sequence_shard", False) for s in plan["stages"]] == [False, True]
    assert "sequence-sharded stream" in plan["solver"]["alternatives"][0]["label"]
    validate_plan(plan, "test")
    del plan["stages"][1]["receives_sequence_shard"]
    with pytest.raises(UserInputError, match="disagree"):
        validate_plan(plan, "test")
