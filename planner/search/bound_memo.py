"""The search's bounds kept beside the trace: each candidate's split bound and LP relaxation,
by a hash of exactly what they were computed from.

After the stage MILPs (milp.runs), most of a warm plan's search is bounding candidates before
any MILP: Llama-3-70B / 64 with a global batch of 1,024 takes about 600 pipelines through the LP
relaxation (a HiGHS LP each) and two dozen through split_bound's dynamic program, the same
numbers every time the same model is planned on the same cluster. Both are functions of their
inputs alone: the LP of the arrays handed to HiGHS (and its version; it is solved with fixed
options), the split bound of the StageProblem (and split_bound's own code). So a result kept
under a hash of those inputs is the one computing it would give, and the search's pruning,
certificates and plan do not change; any change to the cost model changes the inputs and so the
key.

A warm plan asks the same candidates again, and building a candidate's StageProblem (its every
option priced into the MILP's columns: on Llama-3-70B / 64 at a global batch of 1,024, a
thousand problems, most of the warm search) only to hash it cost more than the bounds it looked
up. So each candidate's two bounds are kept a second time under ``candidate_key``: a hash of
what its problem is built from (the candidate's mesh, micro-batch, schedule, chunks and ZeRO
stage; its priced options, blocks, cluster and training, exactly; the planner's code and the
numerical libraries' versions), looked up before any problem is built. The problem is built
only when a bound is missing, or for the MILP of a candidate that survives its bounds.

The candidates' priced options are kept there too (``BoundMemo.options``): pricing a block
class for a TP degree and micro-batch (``cost.block_options``, a function of its arguments and
the trace alone) was most of what a warm plan still computed once its bounds were read back. Kept
by a hash of those arguments' exact reprs (the block, its sharding variants, the micro-batch, the
TP, EP and CP degrees, the cluster, the training settings) and the planner's code, in the file
of the trace they were priced from, and read back field for field (JSON keeps each float's
repr and each int an int), so the options are the ones pricing gives.

One JSON file per trace (the variants' and probes' way), read when a plan starts and written
when it has added to it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import math
import operator
from collections.abc import Callable
from pathlib import Path

import numpy as np

from planner.atomic import write_text_atomic
from planner.cost.records import BlockOption, CostInputs
from planner.search.bounds import relaxed_bound
from planner.search.candidates import Candidate
from planner.search.milp.data import StageProblem
from planner.search.milp.runs import _highs_version, run_key
from planner.search.milp.split_bound import SplitBound, split_bound
from planner.trace.cache import cache_dir, code_hash

# the modules whose code decides a split bound from its StageProblem
SPLIT_CODE = ("search/milp/split_bound.py", "search/milp/data.py")


def problem_key(sp: StageProblem) -> str:
    """A hash of every number in ``sp``, field by field (arrays by dtype, shape and bytes,
    floats by their exact repr)."""
    digest = hashlib.sha256(code_hash(SPLIT_CODE).encode())

    def add(value) -> None:
        if isinstance(value, np.ndarray):
            a = np.ascontiguousarray(value)
            digest.update(f"a{a.dtype.str}{a.shape}".encode())
            digest.update(a.tobytes())
        elif isinstance(value, list | tuple):
            digest.update(f"l{len(value)}".encode())
            for item in value:
                add(item)
        else:
            digest.update(f"s{value!r};".encode())

    for f in dataclasses.fields(sp):
        digest.update(f.name.encode())
        add(getattr(sp, f.name))
    return digest.hexdigest()[:32]


@functools.cache
def _planner_code() -> str:
    """A hash of every module of the planner package and of the numerical libraries' versions:
    whatever code prices, builds or bounds a problem, a key holding this is never read by
    other code."""
    root = Path(__file__).resolve().parents[1]
    names = tuple(sorted(str(p.relative_to(root)) for p in root.rglob("*.py")))
    return f"{code_hash(names)}/{np.__version__}/{_highs_version()}"


# the last blocks list hashed and its hash: every CostInputs of a plan shares one list, whose
# repr (every block's nodes and parameter names) is most of a fingerprint's cost
_last_blocks: list = [None, ""]
# an option's fields in order: every one a number, string or tuple of them, so taking them as
# they are is dataclasses.astuple without its deep copy (which was a third of ``options`` on a
# pool's first plan: 850,000 recursive calls for 1,700 option lists)
_option_fields = operator.attrgetter(*(f.name for f in dataclasses.fields(BlockOption)))


def _blocks_digest(blocks: list) -> str:
    """A hash of ``repr(blocks)``, computed once for the list every CostInputs of a plan
    shares (the planner builds blocks once from the trace and never changes them)."""
    if _last_blocks[0] is not blocks:
        _last_blocks[:] = [blocks, hashlib.sha256(repr(blocks).encode()).hexdigest()]
    return _last_blocks[1]


def inputs_fingerprint(inp: CostInputs) -> str:
    """A hash of everything a StageProblem reads from ``inp``: its blocks, each block's priced
    options (by their exact reprs: floats round-trip), traced micro-batch, cluster, training
    and memory share, with the planner's code. Kept on ``inp``: its candidates all ask."""
    if "fingerprint" not in inp.memo:
        digest = hashlib.sha256(_planner_code().encode())
        for part in (inp.traced_mbs, inp.cluster, inp.training, inp.memory_fraction):
            digest.update(f"{part!r};".encode())
        digest.update(_blocks_digest(inp.blocks).encode())
        position: dict[int, int] = {}
        for opts in inp.options:  # blocks of one class share one list: each repr'd once
            if id(opts) not in position:
                position[id(opts)] = len(position)
                digest.update(f"n{position[id(opts)]}{opts!r};".encode())
            digest.update(f"b{position[id(opts)]};".encode())
        inp.memo["fingerprint"] = digest.hexdigest()
    return inp.memo["fingerprint"]


def candidate_key(inp: CostInputs, cand: Candidate) -> str:
    """The hash of what ``stage_problem(inp, cand)`` is built from, without building it."""
    fields = (cand.mesh, cand.micro_batch_size, cand.schedule, cand.virtual_stages, cand.zero)
    text = inputs_fingerprint(inp) + repr(fields)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def simpler_key(inp: CostInputs, cand: Candidate) -> str:
    """The hash of what ``driver.prefer_simpler`` starts from: the candidate's problem inputs
    (candidate_key) and its placement (stages and options of every block); the step time it
    compares against is the cost model's of that placement."""
    config = cand.config
    text = candidate_key(inp, cand) + repr((config.stage_of, config.choice))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def priced_key(*arguments) -> str:
    """The hash of what ``block_options`` prices from (beside the trace, which the file is
    of), by exact reprs, with the planner's code."""
    text = _planner_code() + repr(arguments)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _tuples(value):
    """A JSON value with its lists made tuples again (BlockOption's sequences are tuples)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


class BoundMemo:
    """Split bounds and LP relaxations by their inputs' hash; ``added`` says whether any was
    computed here (and the file needs writing)."""

    def __init__(self, entries: dict | None = None) -> None:
        self.entries: dict[str, list] = entries or {}
        self.added = 0

    def split(self, sp: StageProblem) -> SplitBound:
        """split_bound(sp), computed once."""
        key = "s" + problem_key(sp)
        if key not in self.entries:
            found = split_bound(sp)
            self.entries[key] = [found.max_stage, found.sum_stages, found.weighted_max]
            self.added += 1
        return SplitBound(*self.entries[key])

    def relaxed(self, key: str, problem: Callable[[], StageProblem]) -> float:
        """``relaxed_bound(sp, -inf)`` of the candidate ``key`` names (candidate_key), building
        its problem (``problem()``) only when it is not kept. relaxed_bound(sp, b) is
        max(b, relaxed_bound(sp, -inf)): it returns b itself or the larger of b and a value of
        sp alone."""
        name = "r" + key
        if name not in self.entries:
            self.entries[name] = relaxed_bound(problem(), -math.inf, memo=self)
            self.added += 1
        return float(self.entries[name])

    def split_of(self, key: str, problem: Callable[[], StageProblem]) -> tuple[SplitBound, float]:
        """The candidate's split bound and its ``step_bound`` (which reads the problem's
        shape and constant step time), building the problem only when they are not kept."""
        name = "p" + key
        if name not in self.entries:
            sp = problem()
            found = self.split(sp)
            self.entries[name] = [*dataclasses.astuple(found), found.step_bound(sp)]
            self.added += 1
        *fields, step = self.entries[name]
        return SplitBound(*fields), float(step)

    def options(self, key: str, price: Callable[[], list[BlockOption]]) -> list[BlockOption]:
        """``price()`` (a block class's priced options, ``key`` their priced_key), once; each
        option kept as its fields' values in order."""
        name = "o" + key
        if name not in self.entries:
            opts = price()
            self.entries[name] = [_option_fields(o) for o in opts]
            self.added += 1
            return opts
        return [
            BlockOption(*[_tuples(v) if type(v) is list else v for v in row])
            for row in self.entries[name]
        ]

    def simpler(self, key: str, choose: Callable[[], list[int]]) -> list[int]:
        """``choose()`` (prefer_simpler's options for the placement ``key`` names), once."""
        name = "t" + key
        if name not in self.entries:
            self.entries[name] = list(choose())
            self.added += 1
        return list(self.entries[name])

    def since(self, count: int) -> dict[str, list]:
        """The entries after the first ``count`` (entries are only ever added, in order): what
        a forked copy computed beyond what it was forked with, which is all its parent lacks
        (not the whole memo, which a pool's plans share and grow)."""
        return dict(itertools.islice(self.entries.items(), count, None))

    def adopt(self, entries: dict[str, list]) -> None:
        """Take the bounds another copy of this memo computed (a forked search's) where this
        one has none, to be saved as if computed here."""
        for key, entry in entries.items():
            if key not in self.entries:
                self.entries[key] = entry
                self.added += 1

    def lp(self, solve: Callable[..., tuple[str, float]], *arrays: np.ndarray) -> tuple:
        """``solve(*arrays)`` (bounds._solve_lp: min c.x over the LP those arrays are), once."""
        pattern = arrays[1]
        flat = [arrays[0], pattern.indptr, pattern.indices, pattern.data(arrays[2]), *arrays[3:]]
        key = "l" + run_key(flat, {"lp": "presolve off"})
        if key not in self.entries:
            self.entries[key] = list(solve(*arrays))
            self.added += 1
        status, value = self.entries[key]
        return status, float(value)


def bounds_path(trace_key: str) -> Path:
    return cache_dir() / "bounds" / f"{trace_key}.json"


# the entries keyed by hashes that hold the planner's code (candidate_key, priced_key,
# simpler_key): another version of the planner never reads them, so they are dropped when the
# file is read by one (the file then holds one version's, not every version's); the split
# bounds and LPs are keyed by their numbers alone and stay
CODE_KEYED = ("r", "p", "o", "t")
CODE = "code"  # the entry naming the planner code the CODE_KEYED entries were computed by


def load_bounds(trace_key: str) -> BoundMemo:
    """The bounds an earlier plan of this trace kept (none if there is no readable file)."""
    try:
        entries = json.loads(bounds_path(trace_key).read_text())
    except (OSError, ValueError):
        entries = {}
    if not isinstance(entries, dict):
        entries = {}
    if entries.get(CODE) != _planner_code():
        entries = {k: v for k, v in entries.items() if not k.startswith(CODE_KEYED)}
        entries[CODE] = _planner_code()
    return BoundMemo(entries)


def kept_bounds(kept: dict[str, BoundMemo] | None, trace_key: str) -> BoundMemo:
    """The trace's BoundMemo in ``kept`` (a caller's dict across plans, by trace key), read from
    the cache the first time it is asked for; read afresh without one."""
    if kept is None:
        return load_bounds(trace_key)
    if trace_key not in kept:
        kept[trace_key] = load_bounds(trace_key)
    return kept[trace_key]


def save_kept(kept: dict[str, BoundMemo]) -> None:
    """Save each memo of ``kept`` (kept_bounds') that gained entries, once for all the plans
    that shared it."""
    for trace_key, memo in kept.items():
        if memo.added:
            save_bounds(trace_key, memo)
            memo.added = 0


def save_bounds(trace_key: str, memo: BoundMemo) -> None:
    """Keep ``memo`` for the next plan of this trace (a failed write only costs time)."""
    path = bounds_path(trace_key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(memo.entries, separators=(",", ":")))
    except (OSError, TypeError, ValueError):
        pass
