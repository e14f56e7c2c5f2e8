"""The search's lower bounds (planner/search/bounds.py) at numbers worked by hand, written for
its generated mutants (docs/mutation.md): ``lower_bounds``' step-time and peak-memory bounds
over option lists written here, and ``relaxed_bound``'s LP over stage problems written here,
each small enough that its optimum follows from a line of arithmetic (the docstrings)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import cluster_of, make_block, make_option

from planner.cost.records import CostInputs
from planner.search import Candidate
from planner.search.bounds import lower_bounds, relaxed_bound
from planner.search.milp.data import GIB, StageProblem
from planner.search.milp.split_bound import SplitBound
from planner.training import Training

# bf16 weights (2 bytes), fp32 gradients (4) and AdamW's fp32 master weights and moments (12)
A = [
    make_option(4e-3, 1000, 50_000),
    make_option(2e-3, 1000, 90_000),  # the fastest
    make_option(6e-3, 1000, 10_000, offload="optimizer"),
    make_option(3e-3, 1000, 100, offload="optimizer+params"),  # only under ZeRO-3
]
B = [make_option(1e-3, 3000, 100)]


def _inputs() -> CostInputs:
    """Three blocks: the first and the last share option list A (one list object, as blocks
    of one class do), the middle one has B. Global batch 16."""
    blocks = [make_block(0, "a"), make_block(1, "b", params=3000), make_block(2, "a")]
    return CostInputs(blocks, [A, B, A], 1, cluster_of(8), Training(16))


@pytest.mark.parametrize(
    "pp,dp,mbs,v,time",
    [
        # least times 2 + 1 + 2 = 5 ms; m = 16 / (dp mbs)
        (2, 2, 2, 1, 5e-3 * (1 + 3 / 2)),  # m = 4: the sum times 1 + (m - 1) / p
        (2, 2, 2, 2, 4 * 5e-3 / 2 + 5e-3 / 4),  # interleaved: m S / p + (p - 1) S / (p v)
        (1, 4, 2, 1, 5e-3 * 2),  # one stage, m = 2: m times the sum
        (4, 1, 1, 1, 5e-3 * (1 + 15 / 4)),  # m = 16 over 4 stages
    ],
)
def test_the_step_time_bound_is_the_least_times_through_the_pipelines_floor(pp, dp, mbs, v, time):
    inp = _inputs()
    cand = Candidate(pp, dp, 1, mbs, "interleaved_1f1b" if v > 1 else "1f1b", v, 0)
    assert lower_bounds(inp, cand)[0] == pytest.approx(time, rel=1e-12)


def test_the_memory_bound_is_the_larger_phases_least_bytes_over_the_stages():
    """Per option (P parameters, bf16 AdamW): activations peak over weights 2P, optimizer
    states 12P (0 offloaded) and its activations; the step over gradients 4P and optimizer
    states 12P (none offloaded; the bf16 weights are freed). Each block's least of each,
    summed over the blocks, the larger sum over the pipeline ranks, plus the reserve.

    ZeRO-0 (weights on the host are not allowed): A's least forward is the optimizer-offloaded
    option's 2000 + 10000, its least step 4000; B's 6000 + 36000 + 100 and 12000 + 36000.
    Forward 12000 + 42100 + 12000 = 66100 beats the step's 4000 + 48000 + 4000 = 56000.

    ZeRO-3 over 4 replicas: A's least forward is the offloaded weights' 100 (activations
    only), its least step 0; B's 1500 + 9000 + 100 and 3000 + 9000. Forward 100 + 10600 + 100
    = 10800 is below the step's 0 + 12000 + 0 = 12000. Both asked of one CostInputs (the
    bounds keep each (stage, replicas) pair's)."""
    inp = _inputs()
    reserve = inp.cluster.profile.reserved_bytes
    zero0 = Candidate(2, 4, 1, 1, "1f1b", 1, 0)
    zero3 = Candidate(2, 4, 1, 1, "1f1b", 1, 3)
    single = Candidate(1, 4, 1, 1, "1f1b", 1, 3)
    assert lower_bounds(inp, zero0)[1] == pytest.approx(66100 / 2 + reserve, rel=1e-15)
    assert lower_bounds(inp, zero3)[1] == pytest.approx(12000 / 2 + reserve, rel=1e-15)
    assert lower_bounds(inp, single)[1] == pytest.approx(12000 + reserve, rel=1e-15)
    assert lower_bounds(inp, zero0)[1] == pytest.approx(66100 / 2 + reserve, rel=1e-15)
    # ZeRO-3 over 2 replicas: B's 3000 + 18000 + 100 and 6000 + 18000 (A's as over 4)
    two = Candidate(2, 2, 1, 1, "1f1b", 1, 3)
    assert lower_bounds(inp, two)[1] == pytest.approx(24000 / 2 + reserve, rel=1e-15)


def test_a_block_without_an_allowed_option_makes_the_memory_bound_infinite():
    blocks = [make_block(0, "a"), make_block(1, "b")]
    only_host = [make_option(1e-3, 1000, 100, offload="optimizer+params")]
    inp = CostInputs(blocks, [B, only_host], 1, cluster_of(8), Training(16))
    assert lower_bounds(inp, Candidate(1, 4, 1, 1, "1f1b", 1, 0))[1] == math.inf
    # under ZeRO-3 it may: 3000 (2 + 12) / 4 + 100 + 100 = 10700 against the step's 12000
    ok = lower_bounds(inp, Candidate(1, 4, 1, 1, "1f1b", 1, 3))[1]
    assert ok == pytest.approx(12000 + inp.cluster.profile.reserved_bytes, rel=1e-15)


def _problem(pp, v, m, seg_len, time, const_time, **kw) -> StageProblem:
    """A stage problem written by hand: per segment one array per coefficient (``time``,
    ``optim``, ``offl``, ``state``, ``act``, ``host``; those not given 0), the rest open."""
    segs = len(seg_len)
    k = [len(t) for t in time]

    def per(name):
        given = kw.pop(name, None)
        if given is None:
            return [np.zeros(n) for n in k]
        return [np.asarray(x, dtype=float) for x in given]

    cols = {name: per(name) for name in ("optim", "offl", "state", "act", "host")}
    zeros = [np.zeros(n) for n in k]
    return StageProblem(
        pp=pp,
        v=v,
        m=m,
        seg_len=list(seg_len),
        time=[np.asarray(t, dtype=float) for t in time],
        ws=zeros,
        gather=zeros,
        dp_first=zeros,
        dp_second=zeros,
        has_params=[True] * segs,
        const_time=list(const_time),
        inflight=kw.pop("inflight", [1.0] * (pp * v)),
        const_mem=kw.pop("const_mem", [0.0] * pp),
        capacity=kw.pop("capacity", 1e6 * GIB),
        host_capacity=kw.pop("host_capacity", 1e6 * GIB),
        **cols,
        **kw,
    )


def test_one_chunk_lp_pays_the_busiest_stage_m_minus_1_times_and_the_optimizer_once():
    """p = 2, m = 4, three blocks of 1 s over two stages (hops 0.1 s and 0.3 s): some stage
    holds ceil(3/2) = 2 blocks, so T_max >= 2 + min hop = 2.1 (the stages' balance alone
    gives only (3 + 0.4) / 2 = 1.7). Sum of T_j = 3.4, plus (m - 1) 2.1 = 6.3; the optimizer
    step (0.25 s a block) at least ceil(3/2) blocks on one rank: 0.5, the offload 0.25; the
    per-step constant 0.05. 3.4 + 6.3 + 0.5 + 0.25 + 0.05 = 10.5."""
    sp = _problem(
        2, 1, 4, [3], [[1.0]], [0.1, 0.3], optim=[[0.25]], offl=[[0.125]], const_step=0.05
    )
    assert relaxed_bound(sp, 0.0) == pytest.approx(10.5, rel=1e-9)
    assert relaxed_bound(sp, 11.0) == 11.0  # a higher bound given stays
    # the split's T* = 2.5 raises T_max: 3.4 + 3 x 2.5 + 0.75 + 0.05
    split = SplitBound(2.5, 3.4)
    assert relaxed_bound(sp, 0.0, split) == pytest.approx(11.7, rel=1e-9)
    # its S* + P* + const_step when larger
    assert relaxed_bound(sp, 0.0, SplitBound(2.0, 3.4, 20.0)) == pytest.approx(23.45, rel=1e-12)
    assert relaxed_bound(sp, 0.0, SplitBound(math.inf, math.inf)) == math.inf


def test_interleaved_lp_pays_the_busiest_rank_m_times_and_the_busiest_chunk_p_minus_1():
    """p = 2, v = 2 (four chunks, rank 0 holds chunks 0 and 2), m = 4, five blocks of 1 s,
    hops 0.1 s and the last chunk's 0.3 s. A rank holds ceil(5/2) = 3 blocks and v hops:
    R_max >= 3 + 2 x 0.1 = 3.2 (the balance gives (5 + 0.6) / 2 = 2.8); a chunk holds ceil(5/4)
    = 2: T_max >= 2.1. m R_max + (p - 1) T_max = 12.8 + 2.1 = 14.9."""
    sp = _problem(2, 2, 4, [5], [[1.0]], [0.1, 0.1, 0.1, 0.3])
    assert relaxed_bound(sp, 0.0) == pytest.approx(14.9, rel=1e-9)
    # P* + (p - 1) T* + const_step
    assert relaxed_bound(sp, 0.0, SplitBound(2.0, 5.0, 30.0)) == pytest.approx(32.0, rel=1e-12)


def test_the_granularity_cut_takes_the_segment_that_needs_most():
    """Segments of three 1 s blocks and of one 5 s block: the 5 s block alone makes a stage
    of 5 s (ceil(1/2) x 5 > ceil(3/2) x 1), which the other three fit beside: 8 + 3 x 5."""
    sp = _problem(2, 1, 4, [3, 1], [[1.0], [5.0]], [0.0, 0.0])
    assert relaxed_bound(sp, 0.0) == pytest.approx(23.0, rel=1e-9)


def test_the_lp_keeps_each_ranks_memory_with_its_stages_in_flight_activations():
    """Four blocks of 1 s on two stages, m = 4; each block 1 GiB of states and 0.5 GiB of
    activations; stage 0 holds 2 micro-batches in flight, stage 1 one; 4.5 GiB a rank, 1 GiB
    of it fixed on rank 0. Rank 0: 2 GiB a block in 3.5 GiB, at most 1.75 blocks; so stage 1
    holds 2.25: 4 + 3 x 2.25 = 10.75 (10 without memory). A 1.5 GiB loss on rank 1 leaves it
    3 GiB, 2 blocks: 3.75 < 4 fit, no placement."""
    kw = dict(state=[[1.0 * GIB]], act=[[0.5 * GIB]], inflight=[2.0, 1.0])
    kw |= dict(const_mem=[1.0 * GIB, 0.0], capacity=4.5 * GIB)
    sp = _problem(2, 1, 4, [4], [[1.0]], [0.0, 0.0], **kw)
    assert relaxed_bound(sp, 0.0) == pytest.approx(10.75, rel=1e-9)
    kw["loss_mem"] = [0.0, 1.5 * GIB]
    assert relaxed_bound(_problem(2, 1, 4, [4], [[1.0]], [0.0, 0.0], **kw), 0.0) == math.inf
    free = _problem(2, 1, 4, [4], [[1.0]], [0.0, 0.0], capacity=2.0 * GIB, state=[[GIB]])
    assert relaxed_bound(free, 0.0) == pytest.approx(10.0, rel=1e-9)  # two blocks a rank fit
    free = _problem(2, 1, 4, [4], [[1.0]], [0.0, 0.0], capacity=1.9 * GIB, state=[[GIB]])
    assert relaxed_bound(free, 0.0) == math.inf  # two blocks a rank need 2 GiB


def test_the_lp_keeps_each_ranks_host_memory():
    """1 GiB of host states a block, four blocks over two ranks: 2 GiB a rank fits, 1.5 not."""
    base = dict(host=[[GIB]], state=[[0.0]])
    sp = _problem(2, 1, 4, [4], [[1.0]], [0.0, 0.0], host_capacity=2 * GIB, **base)
    assert relaxed_bound(sp, 0.0) == pytest.approx(10.0, rel=1e-9)
    sp = _problem(2, 1, 4, [4], [[1.0]], [0.0, 0.0], host_capacity=1.5 * GIB, **base)
    assert relaxed_bound(sp, 0.0) == math.inf


def test_only_the_candidates_allowed_options_bound_it():
    """A 1 s option the candidate may not use beside a 2 s one it may: three blocks over two
    stages at 2 s, 2 x 2 = 4 s on the busier: 6 + 3 x 4 = 18 (with the 1 s option's granularity,
    15). None allowed: no placement."""
    kw = dict(optim=[[0.0, 0.0]])
    sp = _problem(2, 1, 4, [3], [[1.0, 2.0]], [0.0, 0.0], allowed=[np.array([False, True])], **kw)
    assert relaxed_bound(sp, 0.0) == pytest.approx(18.0, rel=1e-9)
    sp = _problem(2, 1, 4, [3], [[1.0, 2.0]], [0.0, 0.0], allowed=[np.array([False, False])])
    assert relaxed_bound(sp, 0.0) == math.inf


def test_every_stage_holds_a_block():
    """Four blocks of 1 s and 1 GiB on two ranks of 4 GiB, 3 GiB of rank 0's fixed: rank 0
    holds one block (a stage may not stay empty), rank 1 the other three: 4 + 3 x 3 = 13.
    With 3.5 GiB fixed rank 0 has room for half a block: no placement (an empty stage 0
    would leave all four to rank 1's 4 GiB)."""
    kw = dict(state=[[GIB]], capacity=4 * GIB)
    sp = _problem(2, 1, 4, [4], [[1.0]], [0.0, 0.0], const_mem=[3 * GIB, 0.0], **kw)
    assert relaxed_bound(sp, 0.0) == pytest.approx(13.0, rel=1e-9)
    sp = _problem(2, 1, 4, [4], [[1.0]], [0.0, 0.0], const_mem=[3.5 * GIB, 0.0], **kw)
    assert relaxed_bound(sp, 0.0) == math.inf


def test_the_lp_is_the_same_in_milliseconds_and_kept_in_the_memo():
    """The first problem above in milliseconds (no split given: none of its terms may add a
    whole second); with a BoundMemo the LP is solved once and read back after."""
    from planner.search.bound_memo import BoundMemo

    kw = dict(optim=[[0.25e-3]], offl=[[0.125e-3]], const_step=0.05e-3)
    sp = _problem(2, 1, 4, [3], [[1e-3]], [0.1e-3, 0.3e-3], **kw)
    assert relaxed_bound(sp, 0.0) == pytest.approx(10.5e-3, rel=1e-9)
    memo = BoundMemo()
    assert relaxed_bound(sp, 0.0, memo=memo) == pytest.approx(10.5e-3, rel=1e-9)
    assert memo.added == 1
    assert relaxed_bound(sp, 0.0, memo=memo) == pytest.approx(10.5e-3, rel=1e-9)
    assert memo.added == 1
