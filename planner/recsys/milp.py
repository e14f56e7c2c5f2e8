"""Place every embedding table: its option and the ranks (or node) of its shards.

Notation (planner.recsys.cost): tables t, their options o with per-shard time a_o, device
bytes m_o and host bytes h_o; options placed on ranks (table-wise, column-wise, host), on a
node (table-row-wise) or on every rank (data-parallel, row-wise). Ranks r = 0..N-1, node(r).

**The joint MILP** (exact):

    y[t,o]     in {0,1}   table t runs as option o                 sum_o y[t,o] = 1
    x[t,o,r]   in {0,1}   a shard of a rank-placed o on rank r      sum_r x[t,o,r] = count_o y[t,o]
    z[t,o,k]   in {0,1}   a node-placed o on node k                 sum_k z[t,o,k] = y[t,o]
    E >= 0               the dense all-reduce's exposed part:
                          E >= AR_0 + beta sum_t bytes_t y[t,dp] - overlap * backward

    time_r = C + E + sum_{o on all} a_o y + sum_{o on ranks} a_o x[.,.,r] + sum_{o on nodes}
             a_o z[.,.,node(r)]                                       <= T       (slowest)
    mem_r  = (the same sums with m)  <= device capacity     host_r (with h) <= host capacity

    minimize T

C is the dense part every rank runs (products, optimizer). L = sum_s l_s u[s] is the collectives'
latency, u[s] in {0,1} >= y[t,o] for every option o of sharding type s (TorchRec runs each type
as a group with its own all-to-alls, and data-parallel tables with an all-reduce of their own).
When the dense part may run as DDP or ZeRO-3 (``Costed.dense_choices``), a one-hot w picks it
inside the same MILP: C, the collectives' AR_0 and the device capacity become sums over w of
each strategy's constants, so the model stays linear and the choice is exact. The column
shards of one table go on distinct ranks (x is binary), as TorchRec's column_wise(ranks=...)
expects. Ranks of one node are interchangeable, so each node's ranks are ordered by their
placed time (time_r >= time_{r+1} inside a node): every solution has an ordered twin, and the
solver does not explore the N! copies of each placement. Ties between equally fast plans break
toward fewer bytes (a weight of 1e-6 ms per GiB of device memory).

**The aggregate MILP** (what makes 500 tables on 64 ranks take seconds): ranks are identical,
so drop x and z and keep only y, as if shards could be split over ranks at will:

    T >= C + E + L + common(y) + (1/N) sum_{t,o} count_o a_o y[t,o]      the average rank
    T >= C + E + L + common(y) + a_o y[t,o]        for every placed o     its largest shard
    (the same two forms <= capacity for device and host memory)

Every real placement satisfies these, so its optimum is a lower bound on the joint optimum.
``place`` then puts the chosen shards on ranks (longest first on the least loaded rank that
has room, then exchanges of one or two shards off the slowest rank). If the placement is
within ``rel_gap`` (0.1%) of the bound it is returned with that certified gap; otherwise the
joint MILP solves the instance when it is small enough (at most ``joint_limit`` placement
variables), and else the placement is returned as ``feasible`` with its gap.

Solved with cvxpy + HiGHS, in milliseconds and GiB so the coefficients stay within a few
orders of magnitude.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from dataclasses import dataclass

import cvxpy as cp
import numpy as np

from planner.recsys.cost import Costed, TableOption, collective_latency

TIE_WEIGHT = 1e-6  # milliseconds per GiB of device memory: breaks ties, never a trade-off
# The MILP's units: milliseconds and GiB keep its coefficients within a few orders of magnitude
# (seconds and bytes span twenty), which HiGHS's tolerances need.
MS, GIB = 1e3, 2.0**30


@dataclass
class Assignment:
    """The solver's answer: per table its option and the ranks (or node) of its shards."""

    choice: dict[str, TableOption]
    ranks: dict[str, list[int]]  # rank-placed: the shards' ranks; node: the node's ranks; all
    step_time_s: float
    status: str  # "optimal" | "feasible"
    gap: float
    solve_time_s: float
    variables: int
    costed: Costed | None = None  # the prices with the dense strategy the solver chose


# Branch-and-bound node limits, not clocks, so the same inputs give the same plan on any
# machine (issue 23): the aggregate MILP closes at its root on every benchmark instance; the
# joint MILP runs about 70-130 nodes a second on the development VM (16 tables x 16 ranks).
AGGREGATE_NODES = 10_000
JOINT_NODES = 500


def solve(
    costed: Costed,
    rel_gap: float = 1e-3,
    joint_limit: int = 20_000,
    node_limit: int = JOINT_NODES,
) -> Assignment | None:
    """The placement of every table; None when none fits in memory.

    First the aggregate MILP (module docstring, second part) picks the options and proves a
    lower bound; its shards are then placed on ranks (``place``). When that placement is within
    ``rel_gap`` of the bound it is returned, certified; otherwise the joint MILP, when it has
    at most ``joint_limit`` placement variables, solves the placement exactly (within
    ``node_limit`` branch-and-bound nodes; the gap to the bound is recorded either way)."""
    start = time.perf_counter()
    full = costed
    agg = _solve_model(full, aggregate=True, node_limit=AGGREGATE_NODES, rel_gap=rel_gap)
    if agg is None:
        return None
    choice, bound, agg_vars, _, k = agg
    costed = full.with_dense(k) if full.dense_choices else full
    d = costed.dense
    fixed = d.fixed_s + exposed_allreduce(costed, choice) + choice_latency(costed, choice)
    # Placed time at which the step is within half the gap of the bound: stop improving there.
    ranks = place(costed, choice, stop_at=bound * (1 + rel_gap / 2) - fixed)
    variables = agg_vars
    best = step_time(costed, choice, ranks) if ranks is not None else float("inf")
    if best > bound * (1 + rel_gap) and _joint_size(costed) <= joint_limit:
        joint = _solve_model(full, aggregate=False, node_limit=node_limit, rel_gap=rel_gap)
        if joint is not None:
            j_choice, j_bound, j_vars, j_ranks, j_k = joint
            j_costed = full.with_dense(j_k) if full.dense_choices else full
            variables += j_vars
            bound = max(bound, j_bound)
            if j_ranks is not None and step_time(j_costed, j_choice, j_ranks) < best:
                choice, ranks, costed = j_choice, j_ranks, j_costed
                best = step_time(costed, choice, ranks)
    if ranks is None:
        return None
    gap = max(0.0, (best - bound) / best) if best > 0 else 0.0
    status = "optimal" if gap <= rel_gap else "feasible"
    elapsed = time.perf_counter() - start
    return Assignment(choice, ranks, best, status, gap, elapsed, variables, costed)


def _joint_size(costed: Costed) -> int:
    return costed.ranks * sum(
        1 for opts in costed.options.values() for o in opts if o.placement == "rank"
    )


def _solve_model(costed: Costed, aggregate: bool, node_limit: int, rel_gap: float):
    """Build and solve the joint or the aggregate MILP: (choice, lower bound in seconds,
    variables, ranks or None for the aggregate), or None when infeasible.

    Long because the joint and the aggregate models share their variables and rows; split, the
    index arithmetic they share would pass between functions."""
    n, g = costed.ranks, costed.gpus_per_node
    nodes = n // g if n % g == 0 else 1
    flat = [(t.name, o) for t in costed.tables for o in usable(costed, t.name)]
    placed = [i for i, (_, o) in enumerate(flat) if o.placement == "rank"]
    on_node = [i for i, (_, o) in enumerate(flat) if o.placement == "node"]
    everywhere = [i for i, (_, o) in enumerate(flat) if o.placement == "all"]
    opts = [o for _, o in flat]
    if {name for name, _ in flat} != {t.name for t in costed.tables}:
        return None  # a table none of whose options fits one rank

    y = cp.Variable(len(flat), boolean=True)
    x = cp.Variable((len(placed), n), boolean=True) if placed and not aggregate else None
    z = cp.Variable((len(on_node), nodes), boolean=True) if on_node and not aggregate else None
    e = cp.Variable(nonneg=True)
    t_max = cp.Variable()

    def coef(rows: list[int], attr: str, unit: float) -> np.ndarray:
        return np.array([getattr(opts[i], attr) * unit for i in rows])

    table_of = {t.name: k for k, t in enumerate(costed.tables)}
    one_hot = np.zeros((len(costed.tables), len(flat)))
    for i, (name, _) in enumerate(flat):
        one_hot[table_of[name], i] = 1
    cons = [one_hot @ y == 1]
    d = costed.dense
    # The dense strategy: a one-hot w over ``dense_choices`` shifts three constants (the fixed
    # time, the collectives' fixed time, the tables' device capacity), so the MILP stays linear.
    choices = costed.dense_choices or ((d, costed.device_capacity),)
    w = cp.Variable(len(choices), boolean=True)
    cons.append(cp.sum(w) == 1)
    fixed = MS * (np.array([c.fixed_s for c, _ in choices]) @ w)
    # The collectives' latency: u[s] = 1 once any table runs with sharding type s.
    types = sorted({o.sharding for o in opts})
    u = cp.Variable(len(types), boolean=True)
    for k, sharding in enumerate(types):
        cons.append(y[[i for i, o in enumerate(opts) if o.sharding == sharding]] <= u[k])
    fixed = fixed + MS * (np.array([d.sharding_latency_s(s) for s in types]) @ u)
    collectives = np.array([c.allreduce_fixed_s for c, _ in choices]) @ w
    device_cap = np.array([cap / GIB for _, cap in choices]) @ w
    ar_bytes = np.array([o.allreduce_bytes for o in opts])
    cons.append(
        e >= MS * (collectives + d.allreduce_s_per_byte * (ar_bytes @ y)
                   - d.comm_overlap * d.backward_s)
    )  # fmt: skip
    limits = (("time_s", MS, None), ("device_bytes", 1 / GIB, device_cap),
              ("host_bytes", 1 / GIB, costed.host_capacity / GIB))  # fmt: skip

    # What every rank carries (options on all ranks): one variable per resource, so the
    # constraints below each hold it once instead of every data-parallel/row-wise y.
    base = cp.Variable(3)
    for k, (attr, unit, _) in enumerate(limits):
        rhs = coef(everywhere, attr, unit) @ y[everywhere] if everywhere else 0.0
        cons.append(base[k] == rhs)

    if aggregate:
        # Shards divisible over ranks: the average rank, and no rank below its largest shard.
        single = placed + on_node
        for k, (attr, unit, cap) in enumerate(limits):
            total = base[k]
            if placed:
                total = total + (coef(placed, attr, unit) * _counts(opts, placed)) @ y[placed] / n
            if on_node:
                total = total + (coef(on_node, attr, unit) * g) @ y[on_node] / n
            largest = base[k] + cp.multiply(coef(single, attr, unit), y[single]) if single else None
            if cap is None:
                cons.append(t_max >= fixed + e + total)
                if largest is not None:
                    cons.append(t_max >= fixed + e + largest)
            else:
                cons.append(total <= cap)
                if largest is not None:
                    cons.append(largest <= cap)
    else:
        spread = np.kron(np.eye(nodes), np.ones((1, g)))  # node -> its ranks
        for k, (attr, unit, cap) in enumerate(limits):
            expr = base[k] * np.ones(n)
            if x is not None:
                expr = expr + coef(placed, attr, unit) @ x
            if z is not None:
                expr = expr + (coef(on_node, attr, unit) @ z) @ spread
            cons.append(t_max >= fixed + e + expr if cap is None else expr <= cap)
        if x is not None:
            cons.append(cp.sum(x, axis=1) == cp.multiply(_counts(opts, placed), y[placed]))
            placed_time = coef(placed, "time_s", MS) @ x
            first = [r for k in range(nodes) for r in range(k * g, (k + 1) * g - 1)]
            if first:
                cons.append(placed_time[first] >= placed_time[[r + 1 for r in first]])
        if z is not None:
            cons.append(cp.sum(z, axis=1) == y[on_node])
    dev = coef(list(range(len(flat))), "device_bytes", 1 / GIB) * _spread_counts(opts, n, g)
    problem = cp.Problem(cp.Minimize(t_max + TIE_WEIGHT * (dev @ y) / n), cons)
    try:
        with warnings.catch_warnings(), _quiet_stdout():
            warnings.simplefilter("ignore")  # node-limited solves warn; the gap is reported
            problem.solve(
                solver=cp.HIGHS,
                mip_max_nodes=int(node_limit),
                time_limit=float("inf"),
                mip_rel_gap=rel_gap / 10,
            )
    except cp.error.SolverError:
        return None
    if problem.status in ("infeasible", "infeasible_inaccurate"):
        return None
    if y.value is None or np.isnan(y.value).any():
        raise TimeoutError(f"HiGHS found no assignment within {node_limit} nodes")
    chosen = np.round(y.value).astype(int)
    strategy = int(np.argmax(w.value))
    choice = {name: o for i, (name, o) in enumerate(flat) if chosen[i]}
    bound = _best_bound(problem.solver_stats)
    if bound is None or problem.status == "optimal":
        bound = max(bound or 0.0, problem.value * (1 - rel_gap / 10))
    bound = (bound - TIE_WEIGHT * float(dev @ chosen) / n) / MS
    ranks = None
    if not aggregate:
        ranks = {name: list(range(n)) for name, o in choice.items() if o.placement == "all"}
        if x is not None:
            xv = np.round(x.value).astype(int)
            for row, i in enumerate(placed):
                if chosen[i]:
                    ranks[flat[i][0]] = [int(r) for r in np.flatnonzero(xv[row])]
        if z is not None:
            zv = np.round(z.value).astype(int)
            for row, i in enumerate(on_node):
                if chosen[i]:
                    k = int(np.flatnonzero(zv[row])[0])
                    ranks[flat[i][0]] = list(range(k * g, (k + 1) * g))
    return choice, bound, _count(y, x, z, w, u), ranks, strategy


@contextlib.contextmanager
def _quiet_stdout():
    """HiGHS prints its banner from C++ on the first solve of a process, whatever the
    options: hide file descriptor 1 while it solves, so ``plan`` prints only its summary."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def usable(costed: Costed, name: str) -> list[TableOption]:
    """The table's options whose one shard fits a rank's memory (the others can never be
    chosen, so leaving them out changes no optimum)."""
    return [
        o
        for o in costed.options[name]
        if o.device_bytes <= costed.device_capacity and o.host_bytes <= costed.host_capacity
    ]


def _counts(opts: list[TableOption], rows: list[int]) -> np.ndarray:
    return np.array([float(opts[i].count) for i in rows])


def _spread_counts(opts: list[TableOption], n: int, g: int) -> np.ndarray:
    """How many ranks each option's shards occupy in total."""
    return np.array([float(n if o.placement == "all" else g if o.placement == "node"
                           else o.count) for o in opts])  # fmt: skip


def place(
    costed: Costed, choice: dict[str, TableOption], stop_at: float = 0.0
) -> dict[str, list[int]] | None:
    """Shards of the chosen options onto ranks: node-placed tables to the least loaded node,
    then rank shards longest first onto the least loaded rank where they fit (a table's column
    shards on distinct ranks), then exchanges off the slowest rank while they lower it
    (``_improve``, until the slowest is down to ``stop_at``). None when a shard fits nowhere."""
    n, g = costed.ranks, costed.gpus_per_node
    nodes = n // g if n % g == 0 else 1
    load = np.zeros(n)
    dev = np.zeros(n)
    host = np.zeros(n)
    ranks: dict[str, list[int]] = {}
    items: list[tuple[str, TableOption]] = []
    for name, o in sorted(choice.items()):
        if o.placement == "all":
            ranks[name] = list(range(n))
            load += o.time_s
            dev += o.device_bytes
            host += o.host_bytes
        elif o.placement == "node":
            items.insert(0, (name, o))
        else:
            items.extend((name, o) for _ in range(o.count))
    cap, hcap = costed.device_capacity, costed.host_capacity
    nodes_first = [it for it in items if it[1].placement == "node"]
    for name, o in sorted(nodes_first, key=lambda it: -it[1].time_s):
        k = min(range(nodes), key=lambda k: (load[k * g : (k + 1) * g].max(), k))
        span = slice(k * g, (k + 1) * g)
        load[span] += o.time_s
        dev[span] += o.device_bytes
        host[span] += o.host_bytes
        ranks[name] = list(range(k * g, (k + 1) * g))
    shards = [it for it in items if it[1].placement == "rank"]
    by_time = sorted(shards, key=lambda it: (-it[1].time_s, -it[1].device_bytes, it[0]))
    by_memory = sorted(shards, key=lambda it: (-it[1].device_bytes, -it[1].host_bytes, it[0]))
    for order in (by_time, by_memory):  # longest first; when memory blocks it, largest first
        state = _greedy(order, {k: list(v) for k, v in ranks.items()}, load.copy(), dev.copy(),
                        host.copy(), cap, hcap)  # fmt: skip
        if state is not None:
            break
    else:
        return None
    where, ranks, load, dev, host = state
    _improve(where, ranks, load, dev, host, cap, hcap, stop_at)
    return {name: sorted(rs) for name, rs in ranks.items()}


def _greedy(order, ranks, load, dev, host, cap, hcap):
    """Each shard in ``order`` onto the least loaded rank where it fits and its table has no
    shard yet: (shard placements, ranks, load, device, host), or None when one fits nowhere."""
    where: list[tuple[str, TableOption, int]] = []
    for name, o in order:
        taken = ranks.get(name, [])
        fits = [
            r for r in range(len(load))
            if r not in taken and dev[r] + o.device_bytes <= cap and host[r] + o.host_bytes <= hcap
        ]  # fmt: skip
        if not fits:
            return None
        r = min(fits, key=lambda r: (load[r], r))
        load[r] += o.time_s
        dev[r] += o.device_bytes
        host[r] += o.host_bytes
        ranks.setdefault(name, []).append(r)
        where.append((name, o, r))
    return where, ranks, load, dev, host


def _combos(idx: list[int], with_empty: bool) -> list[tuple[int, ...]]:
    """The groups of one or two shards (and the empty group) a move may take from a rank."""
    out: list[tuple[int, ...]] = [()] if with_empty else []
    out += [(i,) for i in idx]
    out += [(i, j) for k, i in enumerate(idx) for j in idx[k + 1 :]]
    return out


def _improve(
    where, ranks, load, dev, host, cap, hcap, stop_at: float = 0.0, rounds: int = 3000
) -> None:
    """Local search on the slowest rank: exchange a group of one or two of its shards with a
    group of none, one or two shards of another rank, choosing the exchange that lowers the
    larger of the two ranks' times the most, until none lowers it, the slowest rank is down
    to ``stop_at`` (good enough to certify the gap), or ``rounds`` ends. Memory stays within
    both capacities, and a table's shards stay on distinct ranks."""
    n = len(load)
    by_rank: list[list[int]] = [[] for _ in range(n)]
    for k, (_, _, r) in enumerate(where):
        by_rank[r].append(k)
    groups: dict[tuple[int, bool], tuple] = {}  # (rank, with_empty) -> combos and their sums

    def combos_of(r: int, with_empty: bool) -> tuple:
        if (r, with_empty) not in groups:
            cs = _combos(by_rank[r], with_empty)
            sums = [
                np.array([sum(getattr(where[k][1], a) for k in c) for c in cs])
                for a in ("time_s", "device_bytes", "host_bytes")
            ]
            groups[(r, with_empty)] = (cs, *sums)
        return groups[(r, with_empty)]

    for _ in range(rounds):
        top = int(np.argmax(load))
        if load[top] <= stop_at:
            return
        give, g_t, g_d, g_h = combos_of(top, False)
        if not give:
            return
        best = (load[top], None, None, None)
        for r in range(n):
            if r == top or load[r] >= load[top]:
                continue
            take, t_t, t_d, t_h = combos_of(r, True)
            delta = g_t[:, None] - t_t[None, :]  # time moved from top to r
            pair = np.maximum(load[top] - delta, load[r] + delta)
            ok = (delta > 0) & (pair < best[0] - 1e-15)
            dd = g_d[:, None] - t_d[None, :]
            hh = g_h[:, None] - t_h[None, :]
            ok &= (dev[r] + dd <= cap) & (dev[top] - dd <= cap)
            ok &= (host[r] + hh <= hcap) & (host[top] - hh <= hcap)
            while ok.any():
                i, j = np.unravel_index(np.argmin(np.where(ok, pair, np.inf)), pair.shape)
                if _distinct(where, ranks, give[i], take[j], top, r):
                    best = (pair[i, j], r, give[i], take[j])
                    break
                ok[i, j] = False
        _, r, out, back = best
        if r is None:
            return
        for k in out:
            _move(where, ranks, load, dev, host, k, r)
            by_rank[top].remove(k)
            by_rank[r].append(k)
        for k in back:
            _move(where, ranks, load, dev, host, k, top)
            by_rank[r].remove(k)
            by_rank[top].append(k)
        for key in [(top, False), (top, True), (r, False), (r, True)]:
            groups.pop(key, None)


def _distinct(where, ranks, out, back, top: int, r: int) -> bool:
    """Whether exchanging the groups keeps every table's shards on distinct ranks."""
    moving = [where[k][0] for k in out] + [where[k][0] for k in back]
    if len(set(moving)) < len(moving):
        return False
    return not any(r in ranks[where[k][0]] for k in out) and not any(
        top in ranks[where[k][0]] for k in back
    )


def _move(where, ranks, load, dev, host, k: int, to: int) -> None:
    name, o, frm = where[k]
    for arr, v in ((load, o.time_s), (dev, o.device_bytes), (host, o.host_bytes)):
        arr[frm] -= v
        arr[to] += v
    ranks[name].remove(frm)
    ranks[name].append(to)
    where[k] = (name, o, to)


def _best_bound(stats) -> float | None:
    extra = getattr(stats, "extra_stats", None)
    info = getattr(extra, "mip_dual_bound", None) if extra is not None else None
    if info is None and isinstance(extra, dict):
        info = extra.get("mip_dual_bound")
    return float(info) if info is not None and np.isfinite(info) else None


def _count(*variables) -> int:
    return sum(v.size for v in variables if v is not None)


def rank_loads(
    costed: Costed, choice: dict[str, TableOption], ranks: dict[str, list[int]]
) -> list[dict[str, float]]:
    """Per rank: lookup, communication and optimizer seconds and device and host bytes of the
    tables it holds (the dense part excluded), summed shard by shard from ``ranks``."""
    loads = [
        {"lookup_s": 0.0, "comm_s": 0.0, "optimizer_s": 0.0, "device": 0.0, "host": 0.0}
        for _ in range(costed.ranks)
    ]
    for name, o in choice.items():
        for r in ranks[name]:
            loads[r]["lookup_s"] += o.lookup_s
            loads[r]["comm_s"] += o.comm_s
            loads[r]["optimizer_s"] += o.optimizer_s
            loads[r]["device"] += o.device_bytes
            loads[r]["host"] += o.host_bytes
    return loads


def exposed_allreduce(costed: Costed, choice: dict[str, TableOption]) -> float:
    """The dense all-reduce (with the data-parallel tables' gradients) past what hides."""
    d = costed.dense
    extra = sum(o.allreduce_bytes for o in choice.values())
    return max(
        0.0, d.allreduce_fixed_s + d.allreduce_s_per_byte * extra - d.comm_overlap * d.backward_s
    )


def choice_latency(costed: Costed, choice: dict[str, TableOption]) -> float:
    """The collectives' latency of the sharding types the tables use."""
    return collective_latency(costed.dense, (o.sharding for o in choice.values()))


def step_time(costed: Costed, choice: dict[str, TableOption], ranks: dict[str, list[int]]) -> float:
    """The slowest rank's step under an assignment (the MILP's objective, evaluated)."""
    d = costed.dense
    fixed = d.fixed_s + exposed_allreduce(costed, choice) + choice_latency(costed, choice)
    loads = rank_loads(costed, choice, ranks)
    return fixed + max(v["lookup_s"] + v["comm_s"] + v["optimizer_s"] for v in loads)
