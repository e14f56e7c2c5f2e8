"""Tests written for mutmut's generated mutants of planner/recsys/milp.py
(benchmarks/generated_mutants.py). The placement helpers on shards written by hand (the
greedy's choice of rank, the exchanges, the memory edges), the step's terms by hand, and the
MILPs on tiny instances against test_recsys_solver's brute force over every assignment
(test_recsys_solver's 36 seeds take a minute; these take seconds). docs/mutation.md names the
mutants each test kills."""

from __future__ import annotations

import os
from types import SimpleNamespace

import cvxpy as cp
import highspy
import numpy as np
import pytest

from planner.recsys import milp
from planner.recsys.cost import Costed, DenseCost, TableOption
from planner.recsys.tables import TableBlock
from tests.test_recsys_solver import _instance, brute_force

MS = 1e-3
GB = 2.0**30


@pytest.fixture(autouse=True)
def _own_highs_scheduler():
    """mutmut forks a child per mutant from the process that ran the clean tests; HiGHS's task
    scheduler's threads do not come with a fork (planner/search/overlap.py), and a MILP there
    would wait on them forever: each test starts HiGHS's scheduler afresh."""
    highspy.Highs.resetGlobalScheduler(False)


def opt(table, lookup, *, placement="rank", count=1, comm=0.0, dev=0.0, host=0.0, ar=0.0,
        optim=0.0, sharding="table_wise", label="tw") -> TableOption:  # fmt: skip
    return TableOption(table, label, sharding, "fused", placement, count, lookup, comm, dev, host,
                       allreduce_bytes=ar, optimizer_s=optim)  # fmt: skip


def dense(**kw) -> DenseCost:
    base = dict(compute_s=2 * MS, backward_s=1 * MS, optimizer_s=0.5 * MS, allreduce_fixed_s=0.0,
                allreduce_s_per_byte=0.0, comm_overlap=0.0, a2a_latency_s=0.0,
                dp_allreduce_latency_s=0.0, device_bytes=0.0, params=10)  # fmt: skip
    return DenseCost(**{**base, **kw})


def costed(options: dict[str, list[TableOption]], ranks=2, per_node=None, cap=1e15, hcap=1e15,
           d=None) -> Costed:  # fmt: skip
    tables = [TableBlock(name, "ebc", (f"f{name}",), 100, 8, 1.0, 0.0) for name in options]
    return Costed(tables, options, d or dense(), ranks, per_node or ranks, cap, hcap, "cuda", 64)


# ----------------------------------------------------------------------------- helpers


def test_usable_keeps_the_options_whose_shard_fits_to_the_byte():
    at, over = opt("a", 1, dev=10.0, host=5.0), opt("a", 1, dev=11.0, label="cw")
    host_over = opt("a", 1, dev=1.0, host=6.0, label="host")
    c = costed({"a": [at, over, host_over]}, cap=10.0, hcap=5.0)
    assert milp.usable(c, "a") == [at]


def test_counts_and_the_ranks_each_option_spreads_over():
    opts = [opt("a", 1, count=3), opt("b", 1, placement="all", count=4),
            opt("c", 1, placement="node")]  # fmt: skip
    counts = milp._counts(opts, [0, 2])
    assert counts.tolist() == [3.0, 1.0] and counts.dtype == float
    spread = milp._spread_counts(opts, 8, 4)
    assert spread.tolist() == [3.0, 8.0, 4.0] and spread.dtype == float


def test_the_joint_size_counts_rank_placed_options_times_ranks():
    c = costed({"a": [opt("a", 1), opt("a", 1, count=2, label="cw")],
                "b": [opt("b", 1, placement="all", count=3), opt("b", 1, placement="node")]},
               ranks=3)  # fmt: skip
    assert milp._joint_size(c) == 3 * 2


def test_the_groups_a_move_takes_are_one_or_two_shards_and_the_empty_one():
    assert milp._combos([3, 5, 7], False) == [(3,), (5,), (7,), (3, 5), (3, 7), (5, 7)]
    assert milp._combos([3, 5], True) == [(), (3,), (5,), (3, 5)]
    assert milp._combos([], True) == [()]


def test_an_exchange_keeps_each_tables_shards_on_distinct_ranks():
    o = opt("a", 1)
    where = [("a", o, 0), ("b", o, 0), ("a", o, 1), ("c", o, 1), ("c", o, 2)]
    ranks = {"a": [0, 1], "b": [0], "c": [1, 2]}
    assert milp._distinct(where, ranks, (1,), (), 0, 2) is True  # b onto rank 2
    assert milp._distinct(where, ranks, (1,), (3,), 0, 1) is True  # b for c between 0 and 1
    assert milp._distinct(where, ranks, (0,), (), 0, 2) is True  # a onto rank 2
    assert milp._distinct(where, ranks, (0,), (), 0, 1) is False  # a is on rank 1 already
    assert milp._distinct(where, ranks, (1,), (4,), 0, 2) is True  # c onto rank 0: free
    assert milp._distinct(where, ranks, (1,), (2,), 0, 1) is False  # a back onto rank 0
    assert milp._distinct(where, ranks, (0,), (2,), 0, 1) is False  # a both ways
    assert milp._distinct(where, ranks, (1,), (1,), 0, 2) is False  # one shard twice


def test_a_move_shifts_the_shards_time_and_memory_and_its_rank():
    o = opt("a", 2.0, comm=1.0, dev=5.0, host=7.0, optim=0.5)
    where = [("a", o, 0)]
    ranks = {"a": [0]}
    load, dev, host = np.array([3.5, 1.0]), np.array([5.0, 0.0]), np.array([7.0, 2.0])
    milp._move(where, ranks, load, dev, host, 0, 1)
    assert load.tolist() == [0.0, 4.5] and dev.tolist() == [0.0, 5.0]
    assert host.tolist() == [0.0, 9.0]
    assert ranks == {"a": [1]} and where == [("a", o, 1)]


def test_the_best_bound_is_read_from_either_form_of_the_solvers_stats():
    assert milp._best_bound(SimpleNamespace(extra_stats=SimpleNamespace(mip_dual_bound=2.5))) == 2.5
    assert milp._best_bound(SimpleNamespace(extra_stats={"mip_dual_bound": 3})) == 3.0
    assert milp._best_bound(SimpleNamespace(extra_stats={"mip_dual_bound": np.inf})) is None
    assert milp._best_bound(SimpleNamespace(extra_stats={})) is None
    assert milp._best_bound(SimpleNamespace(extra_stats=None)) is None
    assert milp._best_bound(SimpleNamespace()) is None


def test_the_variables_are_counted_by_size():
    assert milp._count(cp.Variable(3), None, cp.Variable((2, 4)), cp.Variable()) == 3 + 8 + 1


# --------------------------------------------------------------------- the step by hand


def test_rank_loads_and_the_step_by_hand():
    d = dense(allreduce_fixed_s=3 * MS, allreduce_s_per_byte=1e-6, comm_overlap=0.5,
              backward_s=2 * MS, a2a_latency_s=0.1 * MS,
              dp_allreduce_latency_s=0.7 * MS)  # fmt: skip
    a = opt("a", 1 * MS, comm=0.5 * MS, dev=4.0, host=1.0)
    b = opt("b", 0.25 * MS, placement="all", count=2, optim=0.125 * MS, dev=2.0, ar=1000.0,
            sharding="data_parallel", label="dp")  # fmt: skip
    c = opt("c", 2 * MS, count=2, comm=0.25 * MS, dev=3.0, sharding="column_wise", label="cw")
    cd = costed({"a": [a], "b": [b], "c": [c]}, ranks=3, d=d)
    choice, ranks = {"a": a, "b": b, "c": c}, {"a": [1], "b": [0, 1, 2], "c": [0, 1]}
    loads = milp.rank_loads(cd, choice, ranks)
    want1 = {"lookup_s": 3.25 * MS, "comm_s": 0.75 * MS, "optimizer_s": 0.125 * MS,
             "device": 9.0, "host": 1.0}  # fmt: skip
    want2 = {"lookup_s": 0.25 * MS, "comm_s": 0.0, "optimizer_s": 0.125 * MS, "device": 2.0,
             "host": 0.0}  # fmt: skip
    assert loads[1] == pytest.approx(want1) and loads[2] == pytest.approx(want2)
    # exposed: 3 ms + 1e-6 s/B x 1000 B - 0.5 x 2 ms = 3 ms
    assert milp.exposed_allreduce(cd, choice) == pytest.approx(3 * MS)
    # two all-to-all types (5 x 0.1 ms each) and the data-parallel all-reduce's 0.7 ms
    assert milp.choice_latency(cd, choice) == pytest.approx(1.7 * MS)
    # 2 + 0.5 (dense) + 3 + 1.7 + the slowest rank (rank 1: 3.25 + 0.75 + 0.125)
    assert milp.step_time(cd, choice, ranks) == pytest.approx((7.2 + 4.125) * MS)
    hidden = costed({"b": [b]}, ranks=3, d=dense(allreduce_fixed_s=1 * MS, backward_s=4 * MS,
                                                comm_overlap=1.0))  # fmt: skip
    assert milp.exposed_allreduce(hidden, {"b": b}) == 0.0


# ------------------------------------------------------------------ greedy and exchanges


def test_the_greedy_places_by_load_then_rank_and_refuses_a_shard_that_fits_nowhere():
    a, b = opt("a", 3.0, dev=2.0), opt("b", 1.0, dev=1.0, host=1.0)
    load, dev, host = np.array([1.0, 0.0, 0.0]), np.zeros(3), np.zeros(3)
    got = milp._greedy([("a", a), ("a", a), ("b", b)], {}, load, dev, host, 3.0, 1.0)
    where, ranks, load, dev, host = got
    assert [r for *_, r in where] == [1, 2, 0]  # tie of ranks 1 and 2 at 0: the lower first
    assert ranks == {"a": [1, 2], "b": [0]}
    assert load.tolist() == [2.0, 3.0, 3.0] and dev.tolist() == [1.0, 2.0, 2.0]
    assert host.tolist() == [1.0, 0.0, 0.0]
    # device and host exactly at capacity fit; a byte more does not
    one = milp._greedy([("b", b)], {}, np.zeros(1), np.array([2.0]), np.zeros(1), 3.0, 1.0)
    assert one is not None and one[0][0][2] == 0
    assert milp._greedy([("b", b)], {}, np.zeros(1), np.array([2.5]), np.zeros(1), 3.0, 1.0) is None
    assert milp._greedy([("b", b)], {}, np.zeros(1), np.zeros(1), np.array([0.5]), 3.0, 1.0) is None
    # a table's shards on distinct ranks: a second shard of a on one rank fits nowhere
    assert (
        milp._greedy([("a", a), ("a", a)], {}, np.zeros(1), np.zeros(1), np.zeros(1), 9, 9) is None
    )
    # the ranks given are kept: a table placed on rank 0 already goes to rank 1
    got = milp._greedy([("a", a)], {"a": [0]}, np.zeros(2), np.zeros(2), np.zeros(2), 9, 9)
    assert got[1] == {"a": [0, 1]}


def lpt_case():
    """Shards of 3, 3, 2, 2, 2 on two ranks: longest first gives 7 and 5; 6 and 6 is best."""
    opts = {name: [opt(name, t)] for name, t in zip("abcde", (3.0, 3.0, 2.0, 2.0, 2.0))}
    return costed(opts, ranks=2, d=dense(compute_s=0.0, optimizer_s=0.0))


def test_the_exchanges_lower_the_slowest_rank_to_the_best():
    c = lpt_case()
    choice = {name: os[0] for name, os in c.options.items()}
    ranks = milp.place(c, choice)
    loads = sorted(sum(choice[n].time_s for n, rs in ranks.items() if r in rs) for r in range(2))
    assert loads == [6.0, 6.0]
    assert all(rs == sorted(rs) for rs in ranks.values())


def test_the_exchanges_stop_at_the_good_enough_time_or_after_their_rounds():
    c = lpt_case()
    choice = {name: os[0] for name, os in c.options.items()}
    assert milp.step_time(c, choice, milp.place(c, choice, stop_at=7.0)) == 7.0
    assert milp.step_time(c, choice, milp.place(c, choice, stop_at=6.9)) == 6.0
    order = [(n, choice[n]) for n in "abcde"]
    where, ranks, load, dev, host = milp._greedy(order, {}, np.zeros(2), np.zeros(2), np.zeros(2),
                                                 9, 9)  # fmt: skip
    milp._improve(where, ranks, load, dev, host, 9, 9, rounds=0)
    assert load.tolist() == [7.0, 5.0]
    milp._improve(where, ranks, load, dev, host, 9, 9, rounds=1)
    assert sorted(load.tolist()) == [6.0, 6.0]


@pytest.mark.parametrize("kind", ["device", "host"])
def test_an_exchange_that_would_overfill_a_rank_is_not_made(kind):
    """Longest first puts a, c, e (3, 2, 2 s; 1, 1, 3 bytes) on rank 0 and b, d (3, 2 s; 1, 2
    bytes) on rank 1. Each exchange that balances them at 6 s leaves 6 bytes on one rank: a
    for d on rank 0, c and e for b on rank 1. At a room of 5 neither is made; at 6, the edge,
    one is."""
    size = dict(zip("abcde", (1.0, 1.0, 1.0, 2.0, 3.0)))
    choice = {n: opt(n, t, **{kind[:4] if kind == "host" else "dev": size[n]})
              for n, t in zip("abcde", (3.0, 3.0, 2.0, 2.0, 2.0))}  # fmt: skip
    for room, want in ((5.0, [7.0, 5.0]), (6.0, [6.0, 6.0])):
        order = [(n, choice[n]) for n in "abcde"]
        where, ranks, load, dev, host = milp._greedy(order, {}, np.zeros(2), np.zeros(2),
                                                     np.zeros(2), 99, 99)  # fmt: skip
        assert load.tolist() == [7.0, 5.0]
        cap, hcap = (room, 99) if kind == "device" else (99, room)
        milp._improve(where, ranks, load, dev, host, cap, hcap)
        assert load.tolist() == want if room == 5.0 else sorted(load.tolist()) == want
        assert max(dev if kind == "device" else host) <= room


def test_place_puts_node_tables_on_the_least_loaded_node_and_all_tables_everywhere():
    everywhere = opt("all", 1.0, placement="all", count=4, dev=1.0, host=0.5)
    node_big, node_small = (opt("n1", 5.0, placement="node", dev=2.0),
                            opt("n2", 4.0, placement="node", dev=3.0))  # fmt: skip
    shard = opt("s", 6.0, count=1)
    c = costed({"all": [everywhere], "n1": [node_big], "n2": [node_small], "s": [shard]},
               ranks=4, per_node=2)  # fmt: skip
    choice = {"all": everywhere, "n1": node_big, "n2": node_small, "s": shard}
    ranks = milp.place(c, choice)
    # n1 (5 s, the longer) to node 0, n2 to node 1 (node 0 is busier), s to rank 2 (load 5
    # beats rank 0's 6 and ties rank 3, the lower first)
    assert ranks == {"all": [0, 1, 2, 3], "n1": [0, 1], "n2": [2, 3], "s": [2]}
    assert milp.step_time(c, choice, ranks) == pytest.approx(2.5 * MS + 1.0 + 4.0 + 6.0)


def test_node_tables_go_longest_first_each_onto_its_least_loaded_node():
    """Two node tables named against their lengths ("b" 3 s before "a" 2 s): b to node 0, a
    to node 1 (node 0 now busier), then the rank shards c (1.5 s) and d (1 s) onto the least
    loaded ranks, 2 and 3. With five ranks in nodes of two the ranks make no whole node: one
    node of two (ranks 0 and 1) takes both node tables, as the MILP's ``nodes`` counts it."""
    b, a = opt("b", 3.0, placement="node"), opt("a", 2.0, placement="node")
    c_, d_ = opt("c", 1.5), opt("d", 1.0)
    choice = {"a": a, "b": b, "c": c_, "d": d_}
    opts = {n: [o] for n, o in choice.items()}
    ranks = milp.place(costed(opts, ranks=4, per_node=2), choice)
    assert ranks == {"b": [0, 1], "a": [2, 3], "c": [2], "d": [3]}
    odd = milp.place(costed(opts, ranks=5, per_node=2), choice)
    assert odd == {"b": [0, 1], "a": [0, 1], "c": [2], "d": [3]}


def test_place_falls_back_to_largest_first_and_refuses_what_fits_nowhere():
    # longest first puts the two 2-byte shards on both ranks before the 3-byte one, which then
    # fits neither rank of 4 bytes; largest first places it first (3 + 1 and 2 + 2 bytes)
    opts = {"a": [opt("a", 5.0, dev=2.0)], "b": [opt("b", 4.0, dev=2.0)],
            "c": [opt("c", 1.0, dev=3.0)], "d": [opt("d", 0.5, dev=1.0)]}  # fmt: skip
    choice = {n: os[0] for n, os in opts.items()}
    c = costed(opts, ranks=2, cap=4.0)
    ranks = milp.place(c, choice)
    per_rank = [sum(choice[n].device_bytes for n, rs in ranks.items() if r in rs) for r in (0, 1)]
    assert max(per_rank) <= 4.0 and sorted(per_rank) == [4.0, 4.0]
    tight = costed(opts, ranks=2, cap=3.5)
    assert milp.place(tight, choice) is None


# ------------------------------------------------------------------------------ the MILPs


def three_equal(**kw) -> Costed:
    """Three 1 ms tables on two ranks: the aggregate bound is 1.5 ms of tables, every
    placement 2 ms."""
    return costed({n: [opt(n, 1 * MS)] for n in "abc"}, ranks=2, **kw)


def test_the_aggregate_milp_bounds_by_the_average_and_the_largest_shard():
    c = three_equal()
    choice, bound, variables, ranks, k = milp._solve_model(c, True, 100, 1e-3)
    assert set(choice) == {"a", "b", "c"} and ranks is None and k == 0
    assert bound == pytest.approx(2.5 * MS + 1.5 * MS, rel=1e-6)
    assert variables == 3 + 1 + 1  # y, w, u
    big = costed({"a": [opt("a", 3 * MS)], "b": [opt("b", 1 * MS)]}, ranks=4)
    assert milp._solve_model(big, True, 100, 1e-3)[1] == pytest.approx(5.5 * MS, rel=1e-6)


def test_the_joint_milp_places_every_shard():
    c = three_equal()
    choice, bound, variables, ranks, k = milp._solve_model(c, False, 100, 1e-9)
    assert bound == pytest.approx(4.5 * MS, rel=1e-6)
    assert variables == 3 + 3 * 2 + 1 + 1  # y, x, w, u
    assert sorted(len(rs) for rs in ranks.values()) == [1, 1, 1]
    assert milp.step_time(c, choice, ranks) == pytest.approx(4.5 * MS)


def test_a_placement_short_of_the_bound_is_feasible_with_its_gap_unless_the_joint_milp_runs():
    got = milp.solve(three_equal(), joint_limit=0)
    assert got.status == "feasible" and got.step_time_s == pytest.approx(4.5 * MS)
    assert got.gap == pytest.approx((4.5 - 4.0) / 4.5, rel=1e-5)
    assert got.variables == 5 and 0 < got.solve_time_s < 60
    exact = milp.solve(three_equal(), joint_limit=6)
    assert exact.status == "optimal" and exact.gap == pytest.approx(0.0, abs=1e-6)
    assert exact.variables == 5 + 3 + 6 + 2
    assert exact.step_time_s == pytest.approx(4.5 * MS)
    assert milp.solve(three_equal(), joint_limit=5).status == "feasible"


def test_no_assignment_when_a_table_fits_no_rank():
    c = costed({"a": [opt("a", 1, dev=5 * GB)], "b": [opt("b", 1, dev=1 * GB)]}, cap=4 * GB)
    assert milp._solve_model(c, True, 100, 1e-3) is None
    assert milp.solve(c) is None
    # (in GiB: the MILP's rows are in GiB, within HiGHS's feasibility tolerance of 1e-7)
    full = costed({n: [opt(n, 1, dev=3 * GB)] for n in "abc"}, ranks=2, cap=4 * GB)
    assert milp.solve(full) is None


# (seed, what binds): the eight first, then instances whose optimum takes node-placed tables
# (5, 29, 34 with nothing binding: two, one and one of them) or all-ranks ones (28, "none"),
# which no seed above does
INSTANCES = [(s, ("none", "device", "host")[s % 3]) for s in (0, 1, 2, 4, 5, 7, 8, 11)] + [
    (5, "none"),
    (29, "none"),
    (34, "none"),
    (0, "none"),
]


@pytest.mark.parametrize("seed, binds", INSTANCES)
def test_solve_is_the_brute_force_optimum(seed, binds):
    c = _instance(seed, binds)
    want = brute_force(c)
    got = milp.solve(c, rel_gap=1e-9, node_limit=1_000_000)
    if want is None:
        assert got is None
        return
    assert got.step_time_s == pytest.approx(want, rel=1e-6)
    assert got.step_time_s == pytest.approx(milp.step_time(c, got.choice, got.ranks), rel=1e-12)
    assert got.status == "optimal" and got.gap <= 1e-6
    assert got.costed is c
    joint = milp._solve_model(c, False, 1_000_000, 1e-9)
    assert milp.step_time(c, joint[0], joint[3]) == pytest.approx(want, rel=1e-6)
    assert joint[1] <= want * (1 + 1e-6)
    assert milp._solve_model(c, True, 1_000_000, 1e-9)[1] <= want * (1 + 1e-6)


def test_the_joint_milp_may_give_the_node_tables_node_a_rank_busier_than_the_other_nodes():
    """Four ranks in nodes of two, 10 GiB each. A node table (0.1 s, 8 GiB on each rank of its
    node) leaves its node room only for c (5 s, 1 GiB); a and b (1 s, 9 GiB) each need a rank
    of the other node. c is best beside the node table (5.1 s) rather than beside a or b (6 s),
    so that node holds the busiest rank and an idle one, the other node two of 1 s: the ranks'
    own times are in no single order across nodes, only within each (the symmetry rows)."""
    opts = {"n": [opt("n", 0.1, placement="node", dev=8 * GB)],
            "a": [opt("a", 1.0, dev=9 * GB)], "b": [opt("b", 1.0, dev=9 * GB)],
            "c": [opt("c", 5.0, dev=1 * GB)]}  # fmt: skip
    c = costed(opts, ranks=4, per_node=2, cap=10 * GB)
    want = brute_force(c)
    assert want == pytest.approx(2.5 * MS + 5.1)
    choice, _, _, ranks, *_ = milp._solve_model(c, False, 1_000_000, 1e-9)
    assert milp.step_time(c, choice, ranks) == pytest.approx(want, rel=1e-9)
    assert ranks["c"][0] in ranks["n"]


def test_the_dense_strategy_is_chosen_inside_the_milp():
    """DDP: 2.5 ms of dense work and 4 GiB left per rank; ZeRO-3: 3.5 ms and 8 GiB. Two
    4 GiB 1 ms tables fit both; three only ZeRO-3's (two on one rank)."""
    ddp, zero = dense(), dense(compute_s=3 * MS, strategy="zero3")
    for names, want_k, want in (("ab", 0, 3.5 * MS), ("abc", 1, 5.5 * MS)):
        opts = {n: [opt(n, 1 * MS, dev=4 * GB)] for n in names}
        base = costed(opts, ranks=2, cap=4 * GB, d=ddp)
        other = costed(opts, ranks=2, cap=8 * GB, d=zero)
        c = base.choosing_dense([other])
        got = milp.solve(c, rel_gap=1e-9)
        assert got.step_time_s == pytest.approx(want, rel=1e-6)
        assert got.costed.dense == (ddp, zero)[want_k]
        assert got.costed.device_capacity == (4 * GB, 8 * GB)[want_k]
        assert got.costed.dense_choices == ()
        agg = milp._solve_model(c, True, 100, 1e-9)
        assert agg[4] == want_k


def test_the_solvers_banner_is_hidden_and_stdout_given_back(capfd):
    with milp._quiet_stdout():
        os.write(1, b"hidden\n")
    os.write(1, b"shown\n")
    assert capfd.readouterr().out == "shown\n"
