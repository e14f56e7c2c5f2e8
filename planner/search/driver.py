"""The outer search: mesh shapes, micro-batch sizes, schedules and ZeRO stages, pruned by lower
bounds, each survivor solved exactly by the stage MILP.

Candidates are solved in order of their lower bound; once the best solved step time is no
larger than a candidate's bound, that candidate (and every later one) cannot win and is pruned
without building a MILP. The first bound is valid because the pipeline time is at least
sum_j T_j (1 + (m-1)/p) for 1F1B (max_j T_j >= mean) and m sum T / p + (p-1) sum T / (p v) for the
interleaved schedule, and sum_j T_j is at least the sum over blocks of their fastest option;
then come the LP relaxation (bounds.relaxed_bound) and, for pipelines, the exact dynamic program
over integer splits (split_bound), each only when the cheaper one did not prune. Pipelines are
ordered by the strongest bound they have: one goes back in line at its stronger bounds before
its MILP is built (_Incumbent.first_pass).

Every candidate ends with a certificate: solved (its step time and its MILP's proven bound),
pruned by a bound at or above the best plan's time (or within SEARCH_REL_TOL of it, then
counted in the reported gap, and solved again at the end while the node budget lasts),
pruned because even the relaxations do not fit in memory, infeasible, dominated, or
unresolved (its node limit found no placement; its bound is in the gap).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from planner.cost.block_options import batch_statistics_floor
from planner.cost.optimizer import offload_allowed
from planner.cost.records import Config, CostInputs
from planner.cost.step import evaluate
from planner.errors import UserInputError
from planner.hardware.cluster import Cluster
from planner.highs import quiet_highs
from planner.search.bound_memo import BoundMemo, candidate_key, simpler_key
from planner.search.bounds import lower_bounds, relaxed_bound
from planner.search.candidates import (
    Candidate,
    Pins,
    attention_sequence,
    check_ep_pin,
    divisors,
    enumerate_candidates,
    no_candidate_message,
)
from planner.search.memo import SearchMemo
from planner.search.milp.candidate import solve_candidate, stage_problem
from planner.search.milp.data import StageProblem
from planner.search.milp.split_bound import SplitBound, split_bound
from planner.search.options import cuts_send_shards, price_options, sequence_stream_flags
from planner.trace.blocks import Block
from planner.trace.graph import pipeline_refusal
from planner.training import Training, num_microbatches
from planner.vocab import Offload, Recompute, Schedule

# Work limits (branch-and-bound nodes), never the clock, so the same inputs give the same plan
# and certificates on any machine, idle or loaded. First pass: each MILP gets FIRST_PASS_NODES;
# those it stops are solved again with SECOND_PASS_NODES, best bound first, until the second
# pass has spent SECOND_PASS_BUDGET nodes in all. With split_bound's cuts, deep-pipeline MILPs
# are mostly pruned before they are built, and the ones solved finish in tens of nodes.
FIRST_PASS_NODES = 300
SECOND_PASS_NODES = 2_000
SECOND_PASS_BUDGET = 4_000
WORK_LIMITS = {
    "first_pass_nodes": FIRST_PASS_NODES,
    "second_pass_nodes": SECOND_PASS_NODES,
    "second_pass_budget_nodes": SECOND_PASS_BUDGET,
}
# The search stops proving improvements smaller than this share of the best step time: a
# candidate whose lower bound is within it of the best plan is not solved, and MILPs run with
# the best time less this share as their cutoff. The plan's solver.gap then says at most this
# much (a cost model is not that accurate; proving the last 0.1% took most of the time).
SEARCH_REL_TOL = 1e-3
# The band is closed with a cutoff this share above the best step time, so that a placement
# exactly as fast is found and _better's tie-break (less memory, then the simpler mesh)
# chooses between them, rather than whichever candidate happened to be solved first.
TIE_REL_TOL = 1e-9


@dataclass
class SearchResult:
    best: Candidate | None
    candidates: list[Candidate]
    inputs: dict[tuple, CostInputs]  # Candidate.key -> priced options
    solve_time_s: float
    total: int = 0
    solved: int = 0
    notes: list[str] = field(default_factory=list)
    gap: float = 0.0  # how far the best plan may be from the optimum (0: proven optimal)
    bound: float = 0.0  # proven lower bound of the optimum step time over every candidate
    nodes: int = 0  # branch-and-bound nodes spent: the search's work, the same on any machine


# --------------------------------------------------------------------------- enumeration


def search(
    graph,
    blocks: list[Block],
    cluster: Cluster,
    training: Training,
    pins: Pins,
    variants_of: Callable[[Block, int], list],
    progress: Callable[..., None] | None = None,
    memo: SearchMemo | None = None,
) -> SearchResult:
    """``search_space`` without context parallelism first, then, when nothing fits, with it
    (or with it at once when ``--cp`` pins a degree).

    Context parallelism is for sequences whose activations do not fit: elsewhere the cost
    model prices a context-parallel plan like data parallelism over a fraction of a sample
    (each rank the same tokens, activations and gradient reduction, plus the key/value ring),
    an equivalence real kernels break at small per-rank token counts; and the larger space
    costs seconds of solving at scale. ``memo``: what searches of one planning run share."""
    memo = SearchMemo() if memo is None else memo
    args = (graph, blocks, cluster, training)
    if pins.cp is None and attention_sequence(graph):
        first = search_space(*args, replace(pins, cp=1), variants_of, progress, memo)
        if first.best is not None:
            return first
    return search_space(*args, pins, variants_of, progress, memo)


def prepare(
    graph, blocks: list[Block], cluster: Cluster, training: Training, pins: Pins, variants_of
) -> bool:
    """Ask ``variants_of`` what ``search``'s first pass under ``pins`` asks before pricing
    (each TP degree's sharding ILPs and eager probes, block classes in the same order), so
    that a search forked after this finds them computed as a search would have left them;
    False where that search has no candidate (it raises the error itself)."""
    quiet_highs()
    first = replace(pins, cp=1) if pins.cp is None and attention_sequence(graph) else pins
    try:
        _candidates(graph, blocks, cluster, training, first, variants_of)
    except UserInputError:
        return False
    return True


def search_space(
    graph,
    blocks: list[Block],
    cluster: Cluster,
    training: Training,
    pins: Pins,
    variants_of: Callable[[Block, int], list],
    progress: Callable[..., None] | None = None,
    memo: SearchMemo | None = None,
) -> SearchResult:
    """Every candidate, cheapest bound first; each is pruned by its bounds or solved exactly.
    A MILP stopped by its node limit keeps its best placement and its proven bound, and the
    result's ``gap`` says how far from optimal the returned plan can be (0 = proven optimal);
    every candidate keeps its certificate (status, bound, and its step time when solved)."""
    start = time.perf_counter()
    quiet_highs()  # before the first HiGHS instance, ours or cvxpy's (the sharding ILP)
    cands = _candidates(graph, blocks, cluster, training, pins, variants_of)
    memo = SearchMemo() if memo is None else memo
    inputs = _price(graph, blocks, cluster, training, pins, variants_of, cands, progress, memo)
    state = _Incumbent(inputs, memo.runs, memo.bounds)
    order = _order(cands, training, pins, cluster)
    state.first_pass(cands, order, pins, progress)
    spent = state.second_pass(cands)
    state.close_band(spent)
    best = state.best
    if best is not None:
        prefer_simpler(inputs[best.key], best, memo.bounds)
    return SearchResult(
        best=best,
        candidates=cands,
        inputs=inputs,
        solve_time_s=time.perf_counter() - start,
        total=len(cands),
        solved=state.done,
        gap=state.gap(cands),
        bound=state.lower_bound(cands),
        nodes=sum(c.nodes for c in cands),
    )


def _candidates(graph, blocks, cluster, training, pins, variants_of) -> list[Candidate]:
    """Every outer candidate the pins allow, or a one-line error saying why there is none."""
    gpus = cluster.gpus

    def useful(degrees: list[int]) -> list[int]:
        return [t for t in degrees if _tp_useful(graph, blocks, t, variants_of)]

    # a pinned degree is the only one priced (each other degree is a sharding ILP per block
    # and an eager probe of the model's code); the error below names every possible one
    tp_degrees = useful([t for t in divisors(gpus) if not pins.tp or t == pins.tp])
    check_ep_pin(blocks, pins)
    sequence = attention_sequence(graph)
    if pins.cp and pins.cp > 1 and not sequence:
        raise UserInputError(
            f"--cp {pins.cp}: context parallelism splits attention computed by fused attention "
            "ops (scaled_dot_product_attention); this model computes its attention with plain "
            "matrix products and softmax: drop --cp"
        )
    cands = enumerate_candidates(gpus, len(blocks), training, pins, tp_degrees, blocks, sequence)
    cands = stream_twins(graph, blocks, cands, pins, variants_of)
    refusal = pipeline_refusal(graph)
    if refusal:
        # a pipeline would be priced and then not run, or run another model
        if pins.pp and pins.pp > 1:
            raise UserInputError(
                f"--pp {pins.pp}: {refusal}: drop --pp (data, tensor parallelism and ZeRO run "
                "the model's own code)"
            )
        cands = [c for c in cands if c.pp == 1]
    floor = batch_statistics_floor(graph)
    if cands and floor > 1:
        # a synchronized BatchNorm spans the replicas' micro-batches together
        cands = [c for c in cands if c.micro_batch_size * c.dp >= floor]
        if not cands:
            raise UserInputError(
                f"a BatchNorm of this model normalises one value per channel per sample, so "
                f"its statistics need at least {floor} samples together, and every layout the "
                "pins allow gives it a micro-batch of 1 on one replica: pin --micro-batch-size "
                f"{floor} or more, or more data-parallel replicas (--dp)"
            )
    if not cands:
        tp_degrees = useful(divisors(gpus))
        message = no_candidate_message(gpus, training, pins, tp_degrees, blocks)
        if graph.graph.get("method") == "hooks" and tp_degrees == [1]:
            message += (
                "; torch.export could not trace the model (its note says why; a transformers"
                " model that returns its KV cache is the usual case: build it with"
                " use_cache=False), and the module-level trace it fell back to shards no weight"
            )
        raise UserInputError(message)
    return cands


def stream_twins(graph, blocks, cands: list[Candidate], pins: Pins, variants_of) -> list:
    """Each candidate whose TP degree lets a block pass Megatron's sequence-sharded stream to
    its neighbour, also with that stream (``Candidate.stream``: those blocks sequence-parallel
    only), in its place where ``tp_variant`` is "sequence"; none with "no-sequence"."""
    if pins.tp_variant == "no-sequence":
        return cands
    chained: dict[tuple[int, bool], bool] = {}
    out = []
    for c in cands:
        key = (c.tp, c.pipelined_tp)
        if key not in chained:
            flags = sequence_stream_flags(graph, blocks, c.tp, c.pipelined_tp, variants_of)
            chained[key] = any(takes or leaves for takes, leaves in flags)
        if not chained[key] or pins.tp_variant != "sequence":
            out.append(c)
        if chained[key]:
            out.append(replace(c, stream=True))
    return out


def _price(graph, blocks, cluster, training, pins, variants_of, cands, progress, memo):
    """Priced options per (TP, micro-batch, EP, CP), and each candidate's lower bounds."""
    traced_mbs = int(graph.graph["traced_batch_size"])
    inputs: dict[tuple, CostInputs] = {}
    keys = len({d.key for d in cands})
    for c in cands:
        if c.key not in inputs:
            if progress:
                progress("price", len(inputs), keys)
            opts = price_options(
                graph, blocks, c.tp, c.micro_batch_size, cluster, training, pins, variants_of,
                c.ep, c.cp, memo.priced, c.pipelined_tp, c.stream, memo.bounds,
            )  # fmt: skip
            inputs[c.key] = CostInputs(
                blocks, opts, traced_mbs, cluster, stream_training(graph, blocks, c, training,
                variants_of), pins.memory_fraction,
            )  # fmt: skip
        c.bound, c.min_memory = lower_bounds(inputs[c.key], c)
    return inputs


def stream_training(graph, blocks, c: Candidate, training, variants_of):
    """The settings a candidate is priced under: with the sequence-sharded stream, pipeline
    sends carry each TP rank's shard where every cut can send it (``cuts_send_shards``)."""
    if not c.stream or c.pp == 1:
        return training
    flags = sequence_stream_flags(graph, blocks, c.tp, c.pipelined_tp, variants_of)
    if not cuts_send_shards(graph, blocks, flags):
        return training
    return replace(training, pipeline_sends_shards=True)


def _order(cands: list[Candidate], training, pins: Pins, cluster) -> list[Candidate]:
    """Drop what is dominated or cannot fit, then cheapest bound first, with every one-stage
    candidate (milliseconds each: a one-row LP and a one-stage MILP) up front to seed the
    incumbent: the many-stage MILPs that follow then meet a tight cutoff, and a pipeline is
    never solved only to lose to a one-stage plan whose first bound sorted it later (on
    Llama-3-70B / 64 a 329-node 8-stage MILP did). Order never changes the optimum."""
    capacity = cluster.profile.memory_bytes * pins.memory_fraction
    for c in cands:
        m = num_microbatches(training, c.dp, c.micro_batch_size)
        if c.schedule == Schedule.GPIPE and not pins.schedule and c.pp > 1 and m >= c.pp:
            c.status, c.reason = "dominated", "GPipe: same time as 1F1B, more memory"
        elif c.min_memory > capacity:
            c.status, c.reason = "pruned-memory", "model states alone exceed memory"
    order = sorted(
        (c for c in cands if c.status == "pending"),
        key=lambda c: (c.bound, c.pp, c.tp, -c.micro_batch_size, c.zero, c.virtual_stages, c.ep),
    )
    seeds = [c for c in order if c.pp * c.virtual_stages == 1]
    return seeds + [c for c in order if c.pp * c.virtual_stages > 1]


class _Incumbent:
    """The best plan so far and what the search left unproven: the bounds of candidates the
    tolerance pruned (``band``) and of MILPs stopped by their node limit."""

    def __init__(self, inputs: dict, runs=None, bounds=None) -> None:
        self.inputs = inputs
        self.runs = runs  # HiGHS runs kept from earlier plans (milp.runs), or None
        self.bounds = bounds  # split bounds and LPs computed before (bound_memo), or None
        self.best: Candidate | None = None
        self.band: list[Candidate] = []  # pruned by a bound within the tolerance of the best
        self.done = 0
        self.problems: dict[int, tuple] = {}  # id(candidate) -> (StageProblem, SplitBound)

    def solve(self, c: Candidate, nodes: int, tol: float = SEARCH_REL_TOL) -> None:
        """The candidate's MILP under the best plan's cutoff less the tolerance."""
        best = self.best
        cutoff = best.cost.step_time_s * (1 - tol) if best is not None else None
        sp, split = self.kept_problem(c)
        solve_candidate(self.inputs[c.key], c, cutoff, nodes, sp=sp, split=split, runs=self.runs)
        if c.status == "pruned-bound":  # no placement under the cutoff; one within it may be
            self.band.append(c)

    def kept_problem(self, c: Candidate) -> tuple[StageProblem | None, SplitBound | None]:
        """What ``c``'s MILP reads that its bounds built: its problem (None: not built) and
        its split bound; the split bound from the memo when its bounds stopped before it (a
        candidate in the band), so that the MILP does not compute it again."""
        sp, split = self.problems.get(id(c), (None, None))
        if split is None and self.bounds is not None:
            inp = self.inputs[c.key]
            sp = stage_problem(inp, c) if sp is None else sp
            split, _ = self.bounds.split_of(candidate_key(inp, c), lambda: sp)
        return sp, split

    def beaten(self, c: Candidate) -> bool:
        return self.best is not None and _beaten(c, self.best, self.band)

    def offer(self, c: Candidate) -> None:
        if (
            c.status == "solved"
            and c.cost.feasible
            and (self.best is None or _better(c, self.best))
        ):
            self.best = c

    def first_pass(self, cands, order, pins: Pins, progress) -> None:
        """Each candidate once, with the first-pass node limit, unless a bound prunes it. The
        one-stage candidates go first, in order (their MILPs take milliseconds and seed the
        incumbent). The pipelines then go best bound first, lazily: a pipeline comes up at its
        first bound, gets its stronger ones (the LP relaxation, milliseconds, then the exact
        split bound) and goes back in line at those; it is solved when it comes up again with
        nothing lower ahead of it. So a deep pipeline whose first bound was low but whose split
        bound is not waits behind the candidates that may beat it, whose MILPs then give it a
        tight cutoff or prune it unsolved (on ResNet-50 / 8 an interleaved 16-stage MILP was
        solved to its node limit before the 8-stage plan that won had been looked at)."""
        handled = 0

        def report() -> None:
            if progress:
                pruned = len(cands) - len(order) + handled - self.done
                progress("solve", self.done, len(cands), pruned=pruned)

        for c in order:
            if c.pp * c.virtual_stages > 1:
                continue
            report()
            if self._bounded(c):
                self._solve_first(c, pins)
            handled += 1
        rank = {id(c): i for i, c in enumerate(order)}
        line = [(c.bound, rank[id(c)], c) for c in order if c.pp * c.virtual_stages > 1]
        heapq.heapify(line)  # ranks are distinct: candidates themselves are never compared
        bounded: set[int] = set()
        while line:
            _, r, c = heapq.heappop(line)
            if r not in bounded:
                bounded.add(r)
                if self._bounded(c):
                    heapq.heappush(line, (c.bound, r, c))
                    continue
            elif self.beaten(c):
                _prune_by_bound(c, self.best)
            else:
                report()
                self._solve_first(c, pins)
            handled += 1

    def _bounded(self, c: Candidate) -> bool:
        """Raise ``c``'s bound by its LP relaxation and, for pipelines, its split bound, each
        only while the cheaper one has not pruned it; False when one did (its status says
        why). The problem and split bound are kept for its MILP."""
        if self.beaten(c):
            _prune_by_bound(c, self.best)
            return False
        inp = self.inputs[c.key]
        built: list[StageProblem] = []

        def problem() -> StageProblem:
            if not built:
                built.append(stage_problem(inp, c))
            return built[0]

        if self.bounds is None:
            c.bound = relaxed_bound(problem(), c.bound)
        else:  # kept by what the problem is built from: a warm plan builds none of these
            key = candidate_key(inp, c)
            c.bound = max(c.bound, self.bounds.relaxed(key, problem))
        if c.bound == math.inf:
            _prune_by_memory(c)
            return False
        if self.beaten(c):
            _prune_by_bound(c, self.best)
            return False
        if self.bounds is None:
            split = split_bound(problem())
            step = split.step_bound(problem())
        else:
            split, step = self.bounds.split_of(key, problem)
        if not split.feasible:
            _prune_by_memory(c)
            return False
        c.bound = max(c.bound, step)
        if self.beaten(c):
            _prune_by_bound(c, self.best)
            return False
        self.problems[id(c)] = (built[0] if built else None, split)
        return True

    def _solve_first(self, c: Candidate, pins: Pins) -> None:
        """``c``'s first-pass MILP, and the incumbent it may become."""
        self.solve(c, FIRST_PASS_NODES)
        self.done += 1
        if c.status == "solved" and c.tp > 1 and not pins.tp and _tp_unused(self.inputs, c):
            c.status = "dominated"
            c.reason = f"TP degree {c.tp} shards no block: {c.tp} devices repeat the same work"
        self.offer(c)

    def second_pass(self, cands) -> int:
        """The MILPs the first pass stopped, again with the second-pass node limit: the best
        plan's own first (to prove it), then the others most promising first, until the pass's
        node budget is spent; what stays open is in the gap. Work, not time, decides where
        it stops. Returns the nodes spent."""
        spent = self.prove_best()
        stopped = sorted((c for c in cands if _open(c)), key=lambda c: c.bound)
        for c in stopped:
            if spent >= SECOND_PASS_BUDGET:
                break
            if c is self.best:
                continue
            if self.beaten(c):
                if c.status == "unresolved":
                    _prune_by_bound(c, self.best)
                continue
            before = c.nodes
            self.solve(c, SECOND_PASS_NODES)
            spent += c.nodes - before
            self.offer(c)
        return spent

    def prove_best(self) -> int:
        """The best plan's MILP again, when its node limit stopped it, on a copy with the
        best step time as cutoff: "cutoff" proves no placement of that candidate is faster
        (its bound becomes its step time); a faster placement replaces the best plan's; a
        node limit again keeps the higher of the two bounds. Returns the nodes spent."""
        c = self.best
        if c is None or c.proven:
            return 0
        trial = replace(c, nodes=0, solve_time_s=0.0)
        t = c.cost.step_time_s
        sp, split = self.kept_problem(c)
        inp = self.inputs[c.key]
        solve_candidate(inp, trial, t, SECOND_PASS_NODES, sp=sp, split=split, runs=self.runs)
        c.nodes += trial.nodes
        c.solve_time_s += trial.solve_time_s
        if trial.status == "pruned-bound":
            c.bound, c.gap, c.proven = t, 0.0, True
        elif trial.status == "solved" and trial.cost.feasible and _better(trial, c):
            c.config, c.cost, c.milp_objective = trial.config, trial.cost, trial.milp_objective
            c.bound, c.gap, c.proven = trial.bound, trial.gap, trial.proven
        else:
            c.bound = min(max(c.bound, trial.bound), t)
            c.gap = (t - c.bound) / t if t > 0 else 0.0
        return trial.nodes

    def close_band(self, spent: int) -> None:
        """The candidates the tolerance pruned (their bound within SEARCH_REL_TOL of the best
        plan), solved with the best plan's own step time (and TIE_REL_TOL) as cutoff, lowest
        bound first, while the second pass's node budget lasts: each one either beats or ties
        the best plan, or is proven no better, or stays open in the gap. Usually a handful,
        proven at the root."""
        for c in sorted(self.band, key=lambda c: c.bound):
            if spent >= SECOND_PASS_BUDGET or self.best is None:
                break
            if c.status != "pruned-bound" or c.bound > self.best.cost.step_time_s:
                continue
            before = c.nodes
            self.solve(c, SECOND_PASS_NODES, tol=-TIE_REL_TOL)
            spent += c.nodes - before
            self.offer(c)

    def gap(self, cands: list[Candidate]) -> float:
        """How far the best plan may be from the optimum: 0 when nothing is left unproven."""
        if self.best is None:
            return 0.0
        t = self.best.cost.step_time_s
        lowest = self.lower_bound(cands)
        return (t - lowest) / t if lowest < t else 0.0

    def lower_bound(self, cands: list[Candidate]) -> float:
        """The least step time any candidate may still reach: the best plan's own time when
        everything else is proven no better, else the lowest open bound."""
        if self.best is None:
            return 0.0
        t = self.best.cost.step_time_s
        band = [c.bound for c in self.band if c.status == "pruned-bound"]
        open_bounds = band + [c.bound for c in cands if _open(c)]
        return min([t, *open_bounds])


def _open(c: Candidate) -> bool:
    """A MILP its node limit stopped: unresolved, or solved without a proof."""
    return c.status == "unresolved" or (c.status == "solved" and not c.proven)


def prefer_simpler(inp: CostInputs, cand: Candidate, kept: BoundMemo | None = None) -> None:
    """On ties, run blocks without recompute or offload: for each (stage, option) group of
    blocks, switch them to the same TP variant with less recompute and offload when the cost
    model says the step is no slower and it still fits. The step time never grows, so an
    optimal plan stays optimal; it only stops recomputing when recomputing gains nothing.

    ``kept``: a bound_memo.BoundMemo holding the options an earlier plan chose here for the
    same candidate and placement (Llama-3-405B / 16,384: 125 configurations evaluated, a third
    of its warm search); the cost is that of the chosen configuration, evaluated once."""
    if kept is None:
        _prefer_simpler(inp, cand)
        return
    choice = kept.simpler(simpler_key(inp, cand), lambda: _prefer_simpler(inp, cand))
    if choice != cand.config.choice:  # read back: the configuration the trials ended at
        cand.config = replace(cand.config, choice=choice)
        cand.cost = evaluate(inp, cand.config)


def _prefer_simpler(inp: CostInputs, cand: Candidate) -> list[int]:
    """prefer_simpler's trials; returns the options chosen."""
    rank = {
        Recompute.NONE: 0,
        Recompute.SELECTIVE: 1,
        Recompute.FULL: 2,
        Offload.OPTIMIZER: 1,
        Offload.PARAMS: 2,
    }
    cfg = cand.config
    groups = sorted({(cfg.stage_of[i], k) for i, k in enumerate(cfg.choice)})
    for stage, k in groups:
        members = [i for i, kk in enumerate(cfg.choice) if kk == k and cfg.stage_of[i] == stage]
        opts = inp.options[members[0]]
        cur = opts[k]
        simpler = sorted(
            (
                j
                for j, o in enumerate(opts)
                if o.variant == cur.variant
                and rank[o.recompute] + rank[o.offload] < rank[cur.recompute] + rank[cur.offload]
                and offload_allowed(o.offload, cfg.zero_stage)
            ),
            key=lambda j: (rank[opts[j].recompute] + rank[opts[j].offload], j),
        )
        for j in simpler:
            choice = list(cfg.choice)
            for i in members:
                choice[i] = j
            trial = Config(
                cfg.mesh,
                cfg.micro_batch_size,
                cfg.schedule,
                cfg.virtual_stages,
                cfg.zero_stage,
                cfg.stage_of,
                choice,
            )
            cost = evaluate(inp, trial)
            if cost.feasible and cost.step_time_s <= cand.cost.step_time_s:
                cand.config, cand.cost, cfg = trial, cost, trial
                break
    return cfg.choice


def _tp_unused(inputs: dict, c: Candidate) -> bool:
    """Every block runs its replicated variant: the TP group computes the same thing tp times,
    which the cost model prices as free of communication, so it can look fast on tiny models."""
    opts = inputs[c.key].options
    return all(opts[i][k].variant == "replicated" for i, k in enumerate(c.config.choice))


def _better(a: Candidate, b: Candidate) -> bool:
    """Strictly faster, ties broken deterministically (less memory, then simpler mesh)."""
    ka = (a.cost.step_time_s, a.cost.peak_memory_bytes, a.pp, a.tp, a.zero, a.ep, a.cp)
    kb = (b.cost.step_time_s, b.cost.peak_memory_bytes, b.pp, b.tp, b.zero, b.ep, b.cp)
    return ka < kb


def _tp_useful(graph, blocks: list[Block], tp: int, variants_of) -> bool:
    if tp == 1:
        return True
    for blk in {b.cls: b for b in blocks}.values():
        if any(v.name != "replicated" for v in variants_of(blk, tp)):
            return True
    return False


def _beaten(c: Candidate, best: Candidate, band: list[Candidate]) -> bool:
    """Whether ``c``'s lower bound leaves it no room to beat ``best`` by more than the search
    tolerance; a bound inside the tolerance, or one that may tie, goes to ``band`` (the
    reported gap; close_band solves them)."""
    t = best.cost.step_time_s
    if c.bound > t * (1 + TIE_REL_TOL):
        return True
    if c.bound >= t * (1 - SEARCH_REL_TOL):
        band.append(c)
        return True
    return False


def _prune_by_memory(c: Candidate) -> None:
    c.status, c.bound = "pruned-memory", math.inf
    c.reason = "even split fractionally over the ranks, the model does not fit in memory"


def _prune_by_bound(c: Candidate, best: Candidate) -> None:
    c.status = "pruned-bound"
    c.reason = (
        f"lower bound {c.bound:.4g} s is no better than the best plan's "
        f"{best.cost.step_time_s:.4g} s"
    )
