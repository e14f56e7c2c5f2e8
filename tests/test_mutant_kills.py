"""Tests written for mutants mutmut generated that the suite let survive (docs/mutation.md lists
each survivor and the test here that kills it). Each states a number from a formula written
out here, at an input where the surviving change would alter it."""

from __future__ import annotations

import pytest

from planner.hardware.cluster import Cluster
from planner.hardware.collectives import collective_time, p2p_time, ring_factors
from planner.hardware.profiles import load_profile
from planner.vocab import Offload

B = 360e9  # bytes/s
ALPHA = 5e-6  # s


@pytest.mark.parametrize("nbytes", [0.5, 1.0, 2.0])
def test_a_send_of_a_byte_or_less_still_pays_its_latency(nbytes):
    """p2p_time's guard is "nothing to move" (S <= 0), not "little to move": S/B + alpha for
    any S > 0 (killed: ``if nbytes <= 1: return 0.0``)."""
    assert p2p_time(nbytes, B, ALPHA) == pytest.approx(nbytes / B + ALPHA, rel=1e-12)


def test_an_all_to_all_of_one_byte_across_nodes_goes_through_each_ranks_nic():
    """2 nodes x 8 H100s, 1 byte per rank: 8/16 of it crosses each rank's own NIC while 7/16
    crosses NVLink, as for a gigabyte (tests/test_collectives.py); the NIC path is taken for
    any S > 0 (killed: ``nbytes > 1`` sending a byte by the ring formula)."""
    cluster = Cluster(load_profile("h100-sxm"), nodes=2, gpus_per_node=8)
    p = cluster.profile
    nic = p.inter_node_bandwidth * p.collective_efficiency
    nvl = p.intra_node_bandwidth * p.collective_efficiency
    want = max(8 / 16 / nic, 7 / 16 / nvl) + 15 * p.inter_node_latency + p.collective_sync
    assert collective_time("all_to_all", 1.0, cluster, list(range(16))) == pytest.approx(
        want, rel=1e-12
    )


def test_an_unknown_collective_kind_is_named_in_the_error():
    """ring_factors says which kind it does not know (killed: ``ValueError(None)``)."""
    with pytest.raises(ValueError, match="unknown collective 'allreduce'"):
        ring_factors("allreduce", 4)


# --------------------------------------------------------------------------- make_cluster
# (its surviving mutants: tests of the flags' messages and of the node count's type)


def test_nodes_alone_give_full_nodes_of_the_profile():
    from planner.hardware.cluster import make_cluster

    c, notes = make_cluster(None, "h100-sxm", nodes=2)
    assert (c.profile.name, c.nodes, c.gpus_per_node, c.gpus, notes) == ("h100-sxm", 2, 8, 16, [])


@pytest.mark.parametrize("gpus, nodes", [(16, None), (8, None), (None, 2)])
def test_whole_nodes_are_counted_in_integers(gpus, nodes):
    """plan.json records the node count: 2, never 2.0."""
    from planner.hardware.cluster import cluster_to_dict, make_cluster

    c, notes = make_cluster(gpus, "h100-sxm", nodes=nodes)
    d = cluster_to_dict(c)
    assert type(d["nodes"]) is int and type(d["gpus"]) is int
    assert d["gpus"] == (gpus or 16) and notes == []  # a whole node is no "part of one"


def test_a_partial_node_is_said():
    from planner.hardware.cluster import make_cluster

    c, notes = make_cluster(4, "h100-sxm")
    assert (c.nodes, c.gpus_per_node) == (1, 4)
    assert notes == ["4 GPUs fill part of one 8-GPU node: planning 1 node of 4"]


@pytest.mark.parametrize(
    "gpus, nodes, message",
    [
        (None, None, "say how many GPUs to plan for: --gpus N (or --nodes M)"),
        (2.5, None, "--gpus must be a positive integer, got 2.5"),
        (True, None, "--gpus must be a positive integer, got True"),
        (12, None, "--gpus 12 does not fill nodes of 8 GPUs: use a multiple of 8 (e.g. 8 or 16)"),
        (24, 2, "(e.g. --gpus-per-node 12)"),
        (13, 2, "hold 16 GPUs, not --gpus 13: make them agree (e.g. --gpus 16)"),
    ],
)
def test_cluster_flags_that_disagree_say_what_would_agree(gpus, nodes, message):
    from planner.errors import UserInputError
    from planner.hardware.cluster import make_cluster

    with pytest.raises(UserInputError) as err:
        make_cluster(gpus, "h100-sxm", nodes=nodes)
    assert message in str(err.value)
    if gpus is None:  # the whole line
        assert str(err.value) == message


def test_one_rank_exchanges_nothing_in_an_all_to_all():
    cluster = Cluster(load_profile("h100-sxm"), nodes=2, gpus_per_node=8)
    assert cluster.all_to_all_seconds_per_byte([9]) == 0.0


def test_a_cluster_without_nodes_or_gpus_is_refused_by_name():
    prof = load_profile("h100-sxm")
    for nodes, per_node in ((0, 8), (1, 0)):
        with pytest.raises(ValueError, match="a cluster needs >= 1 node and GPU per node"):
            Cluster(prof, nodes, per_node)
    with pytest.raises(ValueError, match="rank 16 is outside a cluster of 16 GPUs"):
        Cluster(prof, 2, 8).node_of(16)


def test_one_rank_on_each_of_three_nodes_runs_at_one_nic():
    """g = 1 rank per node on k = 3 nodes, n = 3: busbw = B_nic g k (n - 1) / (n (k - 1)) =
    B_nic (Cluster.link); at 2 nodes (k - 1 = 1) a slip between n (k - 1) and n / (k - 1)
    would not show, at 3 it is 4 times off."""
    cluster = Cluster(load_profile("h100-sxm"), nodes=3, gpus_per_node=8)
    p = cluster.profile
    bw, latency = cluster.link([0, 8, 16])
    assert bw == pytest.approx(p.inter_node_bandwidth * p.collective_efficiency, rel=1e-12)
    assert latency == p.inter_node_latency


# --------------------------------------------------------------------------- offload_time
# (planner/cost/optimizer.py's survivors: the host<->device traffic of offloaded blocks)


def _offload_inputs(options, dp: int, zero: int):
    from conftest import cluster_of, make_block

    from planner.cost.records import Config, CostInputs
    from planner.schema.mesh import Mesh
    from planner.training import Training

    blocks = [make_block(i, "L", params=int(o.params)) for i, o in enumerate(options)]
    inp = CostInputs(blocks, [[o] for o in options], 1, cluster_of(dp), Training(8, "fp32", "sgd"))
    config = Config(
        Mesh(pp=1, dp=dp, tp=1), 1, "1f1b", 1, zero, [0] * len(options), [0] * len(options)
    )
    return inp, config


def _offloaded(offload: str, params: float, expert: float = 0.0, ep: int = 1):
    from dataclasses import replace

    from conftest import make_option

    return replace(make_option(1e-3, params, 0.0, offload=offload), expert_params=expert, ep=ep)


# fp32 SGD: 4 weight bytes and 4 gradient bytes per parameter; FP32_BYTES = 4
@pytest.mark.parametrize(
    "dp, zero, per_block",
    [
        (1, 0, [1e6, 3e6]),  # one replica: whole blocks
        (2, 0, [1e6, 3e6]),  # replicated weights (ZeRO-0): whole blocks on every replica
        (2, 3, [1e6 / 2, 3e6 / 2]),  # sharded over 2 replicas
        (4, 1, [1e6 / 4, 3e6 / 4]),
    ],
)
def test_zero_offload_moves_each_blocks_gradients_down_and_weights_up(dp, zero, per_block):
    """ZeRO-Offload (``Offload.OPTIMIZER``): per step, each block's shard of gradients goes
    down and its updated weights come up, (gb + wb) bytes a parameter at the host bandwidth,
    summed over blocks (killed: ``t = ...`` keeping the last block; the shard taken at
    ZeRO-0 or one replica; the shard only beyond 2 replicas)."""
    from planner.cost.optimizer import offload_time

    opts = [_offloaded(Offload.OPTIMIZER, 1e6), _offloaded(Offload.OPTIMIZER, 3e6)]
    inp, config = _offload_inputs(opts, dp, zero)
    bw = inp.cluster.profile.host_bandwidth
    want = sum(n * (4 + 4) / bw for n in per_block)
    assert offload_time(inp, opts, config, 3) == pytest.approx(want, rel=1e-12)


def test_expert_blocks_offload_their_zero_share_only_when_sharded():
    """At one replica a block's traffic is its ``params`` as held, not ``zero_params`` (which
    counts every expert replica's copy); over 2 replicas, zero_params / 2 (killed: the shard
    formula at one replica)."""
    from planner.cost.optimizer import offload_time

    opt = _offloaded(Offload.OPTIMIZER, 4e6, expert=2e6, ep=2)  # zero_params = 4e6 + 2e6 = 6e6
    for dp, zero, n in [(1, 3, 4e6), (2, 3, 6e6 / 2)]:
        inp, config = _offload_inputs([opt], dp, zero)
        bw = inp.cluster.profile.host_bandwidth
        assert offload_time(inp, [opt], config, 1) == pytest.approx(n * 8 / bw, rel=1e-12)


def test_offloaded_weights_travel_every_micro_batch_for_every_block():
    """FSDP2's CPU offload (``Offload.PARAMS``): each micro-batch copies the fp32 weights up
    twice and the gradient shard down, m (2 * 4 + gb) bytes a parameter, summed over blocks (killed:
    ``t = ...``)."""
    from planner.cost.optimizer import offload_time

    opts = [_offloaded(Offload.PARAMS, 2e6), _offloaded(Offload.PARAMS, 6e6)]
    inp, config = _offload_inputs(opts, 2, 3)
    bw = inp.cluster.profile.host_bandwidth
    want = (2e6 / 2 + 6e6 / 2) * 3 * (2 * 4 + 4) / bw
    assert offload_time(inp, opts, config, 3) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(
    "offload, zero, allowed",
    [
        (Offload.NONE, 0, True),
        (Offload.OPTIMIZER, 1, True),
        (Offload.PARAMS, 2, False),
        (Offload.PARAMS, 3, True),
    ],
)
def test_weights_live_on_the_host_only_under_zero_3(offload, zero, allowed):
    """killed: ``offload == PARAMS or zero >= 3`` (refusing every block that keeps its
    weights on the device below ZeRO-3)."""
    from planner.cost.optimizer import offload_allowed

    assert offload_allowed(offload, zero) is allowed


# fp32 SGD with torch's fused step: 2 * 4 + 4 + 2 * 4 = 20 bytes a parameter on the device;
# the host's per-op step 8 accesses of 4 bytes = 32; each accumulated micro-batch after the
# first reads two gradients and writes one, 3 * 4 = 12 bytes a parameter
@pytest.mark.parametrize(
    "offload, dp, zero, micro_batches, stepped, accumulated",
    [
        (Offload.NONE, 1, 0, 2, 1000 + 3000, 1000 + 3000),  # whole gradients accumulated
        (Offload.NONE, 1, 0, 1, 1000 + 3000, 0),  # one micro-batch: nothing to accumulate
        (Offload.NONE, 2, 2, 2, (1000 + 3000) / 2, (1000 + 3000) / 2),  # FSDP adds shards
        (Offload.NONE, 2, 0, 3, 1000 + 3000, 1000 + 3000),  # DDP's no_sync: whole
        (Offload.PARAMS, 2, 3, 2, (1000 + 3000) / 2, (1000 + 3000) / 2),  # all on the host
    ],
)
def test_the_optimizer_step_and_accumulation_passes_over_each_blocks_parameters(
    offload, dp, zero, micro_batches, stepped, accumulated
):
    """optimizer_time's memory-bound terms, summed over two blocks of 1000 and 3000
    parameters, at the device's or (offloaded) the host's bandwidth: stepped x bytes of the
    step + accumulated x (m - 1) x 12 (killed: the accumulation starting at 1 parameter, or
    skipped at 2 micro-batches; ``acc = n`` keeping the last block; ``-`` for the host's
    accumulation; the FSDP shard only beyond 2 replicas)."""
    from dataclasses import replace as with_

    from planner.cost.optimizer import optimizer_time

    opts = [_offloaded(offload, 1000), _offloaded(offload, 3000)]
    inp, config = _offload_inputs(opts, dp, zero)
    inp = with_(inp, training=with_(inp.training, global_batch_size=dp * micro_batches))
    p = inp.cluster.profile
    acc_bytes = (micro_batches - 1) * 12
    if offload == Offload.PARAMS:
        want = (stepped * 32 + accumulated * acc_bytes) / (
            p.host_memory_bandwidth * p.elementwise_efficiency
        )
    else:
        want = (stepped * 20 + accumulated * acc_bytes) / (
            p.memory_bandwidth * p.elementwise_efficiency
        )
    assert optimizer_time(inp, opts, config) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(
    "tp, dp, pp, zero, tensors, dtensors",
    [
        (1, 1, 1, 0, 10, False),  # one replica: plain parameters
        (2, 1, 1, 0, 10, True),  # TP's parameters are DTensors
        (1, 2, 1, 2, 10, True),  # FSDP2 (ZeRO 2/3)
        (1, 2, 1, 1, 10 / 2, False),  # ZeRO-1 steps 1/dp of the tensors, plain
        (1, 2, 2, 0, 10, True),  # pipelined ZeRO-0 over replicas: replicate's DTensors
        (1, 1, 2, 0, 10, False),  # a pipeline at one replica: plain
    ],
)
def test_the_optimizer_step_pays_each_parameter_tensors_dispatch(
    tp, dp, pp, zero, tensors, dtensors
):
    """On the CPU profile the per-tensor step adds tensors x 3 SGD ops x the plain or the
    DTensor op's dispatch cost (two blocks of 4 and 6 tensors; the difference from the same
    blocks with no tensors counted). Killed: DTensors only beyond TP 2 or from ZeRO-3; the
    pipeline's replicate case dropped, taken at ZeRO-1, beyond 2 stages or 2 replicas, or at
    one replica."""
    from dataclasses import replace as with_

    from conftest import cluster_of, make_block

    from planner.cost.optimizer import optimizer_time
    from planner.cost.records import Config, CostInputs
    from planner.schema.mesh import Mesh
    from planner.training import Training

    bare = [_offloaded(Offload.NONE, 1000), _offloaded(Offload.NONE, 3000)]
    counted = [with_(bare[0], param_tensors=4), with_(bare[1], param_tensors=6)]
    world = tp * dp * pp
    blocks = [make_block(i, "L", params=int(o.params)) for i, o in enumerate(bare)]
    config = Config(Mesh(pp=pp, dp=dp, tp=tp), 1, "1f1b", 1, zero, [0, pp - 1], [0, 0])
    training = Training(dp, "fp32", "sgd")  # one micro-batch: no accumulation
    cluster = cluster_of(world, "cpu")

    def priced(opts):
        inp = CostInputs(blocks, [[o] for o in opts], 1, cluster, training)
        return optimizer_time(inp, opts, config)

    p = cluster.profile
    per_op = p.dtensor_op_overhead if dtensors else p.optimizer_op_overhead
    assert p.dtensor_op_overhead != p.optimizer_op_overhead
    assert priced(counted) - priced(bare) == pytest.approx(tensors * 3 * per_op, rel=1e-9)


# --------------------------------------------------------------------------- pipeline.py
# (its surviving mutants: the heterogeneous hop, the stage's parts, the step's helpers)

BW_P2P, LAT_P2P = 50e9, 2e-6  # bytes/s, s


def _sent(nbytes: float) -> float:
    """One point-to-point message: S / B + alpha."""
    return nbytes / BW_P2P + LAT_P2P


@pytest.mark.parametrize(
    "t, t_next, shards, want",
    [
        (2, 2, True, 2 * _sent(1e6 / 2)),  # each TP rank sends its 1/t shard, and back
        (2, 2, False, 2 * _sent(1e6)),  # whole copies rank to rank
        (1, 2, False, _sent(2 * 1e6) + _sent(1e6)),  # one sender, two receivers: two copies
        (4, 2, False, _sent(1e6) + _sent(2 * 1e6)),  # gradients back: two senders each
        (2, 8, True, _sent(4 * 1e6) + _sent(1e6)),  # shards apply to one degree only
    ],
)
def test_a_pipeline_hop_between_tp_degrees_sends_a_copy_per_receiver(t, t_next, shards, want):
    """hop_time at equal and at different TP degrees of the two stages (killed: 28 mutants of
    the heterogeneous branch, which the cost model's tests never reached)."""
    from planner.cost.pipeline import hop_time

    assert hop_time(1e6, t, t_next, BW_P2P, LAT_P2P, shards) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("m, pp, floor", [(1, 4, 1.0), (5, 2, 3.0), (9, 4, 3.0)])
def test_the_one_chunk_floor_is_one_plus_the_busiest_stages_share(m, pp, floor):
    from planner.cost.pipeline import one_chunk_floor

    assert one_chunk_floor(m, pp) == floor


def test_a_pipeline_with_a_missing_stage_count_is_refused():
    """one_chunk_pipeline zips stage times with micro-batch counts strictly: a list one short
    is a caller's bug, not a shorter pipeline (killed: ``strict`` dropped)."""
    from planner.cost.pipeline import one_chunk_pipeline

    assert one_chunk_pipeline([1.0, 2.0], [3, 3]) == 1.0 + 2.0 + 2 * 2.0
    with pytest.raises(ValueError):
        one_chunk_pipeline([1.0, 2.0], [3])


def test_the_schedule_figures_split_the_hop_evenly_and_the_rest_by_proportion():
    """forward_backward_split: blocks' forward 1 ms and backward 2 ms, a micro-batch of 4 ms
    with 0.6 ms of point-to-point: the rest 4 - 3 - 0.6 = 0.4 ms goes 1/3 to forward; a
    stage whose blocks take no time splits it half and half (killed: ``+ p2p``; the 1/3
    share only above a second of blocks; dividing by a zero time)."""
    from conftest import make_option

    from planner.cost.pipeline import forward_backward_split

    opt = make_option(3e-3, 1e6, 0.0)  # fwd 1 ms, bwd 2 ms
    f, b = forward_backward_split([opt], 4e-3, 0.6e-3)
    want = (1e-3 + 0.3e-3 + 0.4e-3 / 3, 2e-3 + 0.3e-3 + 0.8e-3 / 3)
    assert (f, b) == pytest.approx(want, rel=1e-12)
    assert forward_backward_split([], 2.0, 0.4) == pytest.approx((1.0, 1.0), rel=1e-12)


def test_an_interleaved_chunk_on_a_single_rank_holds_one_micro_batch():
    """At pp = 1 a rank runs each micro-batch through its chunks and back before the next:
    each chunk holds one micro-batch, not 1/v of one (killed: ``pp >= 1``)."""
    from planner.cost.pipeline import chunk_held
    from planner.vocab import Schedule

    assert chunk_held(Schedule.INTERLEAVED, 4, 1, 2, 0) == 1.0
    # p = 2, v = 2, m = 4: rank 0 peaks at chunk 0 for 3 micro-batches and chunk 1 for 2
    assert chunk_held(Schedule.INTERLEAVED, 4, 2, 2, 0) == (3 + 2) / 2


def _four_stage_inputs(traced_mbs: int, block_s: float = 3e-3, **training):
    from dataclasses import replace as with_

    from conftest import make_block, make_option

    from planner.cost.records import Config, CostInputs
    from planner.schema.mesh import Mesh
    from planner.training import Training

    blocks = [make_block(i, "L", boundary=8192) for i in range(4)]
    # forward 1/3 and backward 2/3 of block_s, a third of it TP collectives
    opt = with_(make_option(block_s, 1e6, 0.0), tp_comm_s=block_s / 3)
    cluster = Cluster(load_profile("h100-sxm"), nodes=2, gpus_per_node=2)
    train = Training(8, "fp32", "sgd", **training)
    inp = CostInputs(blocks, [[opt]] * 4, traced_mbs, cluster, train)
    config = Config(Mesh(pp=4, dp=1, tp=1), 2, "1f1b", 1, 0, [0, 1, 2, 3], [0] * 4)
    return inp, [opt], config


@pytest.mark.parametrize("traced_mbs", [1, 2])
def test_a_first_stage_sends_its_micro_batchs_boundary_to_the_next_rank(traced_mbs):
    """Stage 0 of 4 (2 ranks a node): compute is its blocks' time less their TP share (that
    goes to tp_comm), and the hop to rank 1 (same node, not rank 3 on the other) carries
    8192 bytes a traced sample-set x 2 samples / traced_mbs, each way (killed: ``+ tp_comm``;
    ``* traced_mbs``; the previous rank's link; ``p2p = ...``)."""
    from planner.cost.pipeline import stage_time_parts

    inp, opts, config = _four_stage_inputs(traced_mbs)
    compute, tp_comm, p2p = stage_time_parts(inp, opts, config, 0, sync=0.0)
    assert (compute, tp_comm) == pytest.approx((2e-3, 1e-3), rel=1e-12)
    bw, lat = inp.cluster.link([0, 1])
    assert (bw, lat) != inp.cluster.link([0, 3])
    nbytes = 8192 * 2 / traced_mbs
    assert p2p == pytest.approx(2 * (nbytes / bw + lat), rel=1e-12)


def test_a_stage_computes_its_sync_time_when_not_given_it():
    """``sync=None`` (the default) prices stage_sync_time itself: the same parts as passing it
    (killed: the default path skipped, inverted, or called without the config)."""
    from planner.cost.data_parallel import stage_sync_time
    from planner.cost.pipeline import stage_time_parts

    inp, opts, config = _four_stage_inputs(1)
    sync = stage_sync_time(inp, opts, config, 1)
    assert stage_time_parts(inp, opts, config, 1) == stage_time_parts(inp, opts, config, 1, sync)


def test_an_overlapped_hop_hides_the_profiles_share_of_the_stages_compute():
    """With p2p_overlap only what exceeds comm_overlap x compute stays exposed (killed:
    ``/ compute``)."""
    from planner.cost.pipeline import stage_time_parts

    inp, opts, config = _four_stage_inputs(1, 6e-6)  # compute 4 us, the hop about 10 us
    _, _, plain = stage_time_parts(inp, opts, config, 0, sync=0.0)
    inp2, opts2, _ = _four_stage_inputs(1, 6e-6, p2p_overlap=True)
    compute, _, hidden = stage_time_parts(inp2, opts2, config, 0, sync=0.0)
    overlap = inp2.cluster.profile.comm_overlap
    assert 0 < overlap * compute < plain
    assert hidden == pytest.approx(plain - overlap * compute, rel=1e-12)


# --------------------------------------------------------------------------- step.py
# (its surviving mutants: the fields of the stage and step records no test read)


def test_each_stage_record_holds_its_parts_and_its_schedules_count():
    """stage_costs on 4 one-block stages, 1F1B, 4 micro-batches: stage s is pipeline rank s,
    its time is compute + TP + point-to-point, split forward/backward with the hop halved
    and the rest in the blocks' 1 : 2 proportion, and it holds min(m, p - r) micro-batches."""
    from planner.cost.data_parallel import stage_sync_time
    from planner.cost.pipeline import stage_time_parts
    from planner.cost.step import stage_costs

    inp, opts, config = _four_stage_inputs(1)
    for s, st in enumerate(stage_costs(inp, config)):
        compute, tp_comm, p2p = stage_time_parts(inp, opts, config, s, sync=None)
        time_s = compute + tp_comm + p2p
        assert (st.index, st.pp_rank, st.inflight) == (s, s, min(4, 4 - s))
        assert (st.tp_comm_s, st.time_s) == pytest.approx((tp_comm, time_s), rel=1e-12)
        assert tp_comm == pytest.approx(1e-3, rel=1e-12)
        rest = time_s - 3e-3 - p2p
        fwd, bwd = 1e-3 + p2p / 2 + rest / 3, 2e-3 + p2p / 2 + 2 * rest / 3
        assert (st.fwd_s, st.bwd_s) == pytest.approx((fwd, bwd), rel=1e-12)
        assert st.sync_s == stage_sync_time(inp, opts, config, s)


def test_the_step_record_reports_throughput_mfu_and_memory_against_its_capacity():
    """evaluate's derived fields: samples/s = batch / step; MFU = the traced model's flops
    scaled from its traced sample-set (2 here) to the batch, over step x GPUs x peak;
    capacity = memory x memory_fraction (killed: the fields set to None; ``* traced_mbs``;
    ``/ memory_fraction``)."""
    from dataclasses import replace as with_

    from planner.cost.step import evaluate

    inp, _, config = _four_stage_inputs(2)
    inp = with_(inp, memory_fraction=0.5)
    cost = evaluate(inp, config)
    p = inp.cluster.profile
    assert cost.samples_per_s == pytest.approx(8 / cost.step_time_s, rel=1e-12)
    flops = 4 * (10**9 + 2 * 10**9) * 8 / 2  # make_block: 1 and 2 GFLOP per traced set
    assert cost.model_flops_per_step == pytest.approx(flops, rel=1e-12)
    want_mfu = flops / (cost.step_time_s * 4 * p.peak_flops["fp32"])
    assert cost.mfu == pytest.approx(want_mfu, rel=1e-12)
    assert cost.capacity_bytes == pytest.approx(p.memory_bytes * 0.5, rel=1e-12)
    assert cost.peak_memory_bytes == max(mm["total"] for mm in cost.rank_memory)
    assert cost.sync_s == pytest.approx(4 * max(st.sync_s for st in cost.stages), rel=1e-12)


@pytest.mark.parametrize("zero, feasible", [(2, False), (3, True)])
def test_a_step_with_weights_on_the_host_is_feasible_only_under_zero_3(zero, feasible):
    """evaluate's feasibility asks ``offload_allowed`` of each chosen option (killed: asking it
    of no offload, which allows weights on the host at any stage)."""
    from dataclasses import replace as with_

    from planner.cost.step import evaluate
    from planner.schema.mesh import Mesh

    inp, opts, config = _four_stage_inputs(1)
    host = with_(opts[0], offload=Offload.PARAMS)
    inp = with_(inp, options=[[host]] * 4)
    config = with_(config, mesh=Mesh(pp=1, dp=4, tp=1), zero_stage=zero, stage_of=[0] * 4)
    assert evaluate(inp, config).feasible is feasible
