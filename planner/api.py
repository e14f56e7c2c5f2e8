"""The Python face of meshplan: the functions the CLI calls, usable from a notebook too."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx

from planner.collector import cycles_uncollected
from planner.modelfile import ModelFile, load_model_file
from planner.trace.blocks import Block, make_blocks, reads_one_tensor, runs_eagerly_in_stage
from planner.trace.cache import load_trace, save_trace, trace_key
from planner.training import Training, on_devices, training_from
from planner.vocab import Offload, Recompute


@dataclass
class TracedModel:
    model_file: ModelFile
    graph: nx.DiGraph
    blocks: list[Block]
    note: str  # one line for the user (fallback tracing), or ""
    from_cache: bool
    cache_key: str = ""  # the trace cache's key (what else is cached for this trace uses it)
    # the containers traced cut (planner.trace.repeats.Repeat's fields, as the cache keeps them)
    repeats: list[dict] = dataclasses.field(default_factory=list)

    @property
    def params(self) -> int:
        return int(self.graph.graph["params"])

    @property
    def traced_batch_size(self) -> int:
        """The samples the trace ran (FLOPs, bytes and activations scale from it)."""
        return int(self.graph.graph["traced_batch_size"])


def trace(
    model_file: str | Path | ModelFile,
    model_args: dict[str, Any] | None = None,
    traced_batch_size: int = 1,
    dtype: str = "bf16",
    use_cache: bool = True,
) -> TracedModel:
    """Trace a model file (or a loaded one) into its OpGraph and blocks, through the cache."""
    mf = (
        model_file
        if isinstance(model_file, ModelFile)
        else load_model_file(model_file, model_args or {})
    )
    key = trace_key(mf.sha256, mf.args, traced_batch_size, dtype)
    cached = load_trace(key) if use_cache else None
    if cached is None:
        from planner.trace.export import trace_model

        result = trace_model(mf, traced_batch_size, dtype)
        graph, note = result.graph, result.note
        graph.graph["note"] = note
        # kept with the trace: a re-plan's eager probe then captures on the cut model too,
        # not by running every layer of the full one (minutes of meta forward at 80 layers)
        graph.graph["repeats"] = [dataclasses.asdict(r) for r in result.repeats]
        blocks = make_blocks(graph)
        if use_cache:
            save_trace(key, graph, blocks)
    else:
        graph, blocks = cached
        note = graph.graph.get("note", "")
        # The key is the file's content: the same bytes may live at another path now.
        graph.graph["file"] = str(mf.path)
    repeats = list(graph.graph.get("repeats", []))
    return TracedModel(mf, graph, blocks, note, cached is not None, key, repeats)


def graph_summary(traced: TracedModel) -> dict[str, Any]:
    """The ``plan --graph --json`` document: the model and its blocks for one micro-batch."""
    g = traced.graph.graph
    classes: dict[str, int] = {}
    for b in traced.blocks:
        classes[b.label] = classes.get(b.label, 0) + 1
    return {
        "model": {
            "file": g["file"],
            "sha256": g["sha256"],
            "args": g["args"],
            "params": g["params"],
            "traced_batch_size": g["traced_batch_size"],
            "dtype": g["dtype"],
            "trace": g["method"],
            "ops": traced.graph.number_of_nodes(),
            "blocks": len(traced.blocks),
            "classes": classes,
            "fwd_flops": sum(b.fwd_flops for b in traced.blocks),
            "bwd_flops": sum(b.bwd_flops for b in traced.blocks),
            "saved_activation_bytes": sum(b.saved_bytes for b in traced.blocks),
        },
        "blocks": [
            {
                "name": b.name,
                "class": b.label,
                "modules": b.modules,
                "params": b.params,
                "fwd_flops": b.fwd_flops,
                "bwd_flops": b.bwd_flops,
                "saved_activation_bytes": b.saved_bytes,
                "saved_activation_bytes_selective": b.saved_selective_bytes,
                "input_bytes": b.input_bytes,
                "output_bytes": b.output_bytes,
            }
            for b in traced.blocks
        ],
    }


# --------------------------------------------------------------------------- planning


@dataclass
class PlanResult:
    plan: dict[str, Any]
    traced: TracedModel
    cluster: Any
    training: Any
    search: Any
    notes: list[str]


def variants_for(
    graph: nx.DiGraph,
    cluster,
    tp_variant: str = "auto",
    memo: dict | None = None,
    probe: Any = None,
    presolved: dict | None = None,
) -> Any:
    """The intra-block sharding ILP, with its cost rates taken from the cluster's profile.
    ``tp_variant="sharded"`` drops the replicated variant wherever a sharded one exists, so a
    pinned ``--tp`` really shards (used to score hand-written Megatron configs, and by tests);
    "sequence" keeps only the sequence-parallel variant where a block has one (else as
    "sharded"); "no-sequence" drops sequence-parallel variants. ``memo`` keeps the ILP's
    solutions for other calls of one planning run. ``probe`` (an ``EagerShardProbe``) drops
    the sharded variants the model's own code would run wrongly on local shards. The returned
    ``variants_of(block, tp, pipelined)``: ``pipelined``, the plan has pipeline stages, whose
    traced code reads a tied weight where no module can carry its vocabulary-parallel style
    (the last stage's head reads its own copy of the embedding), so tied weights stay
    replicated there; with the probe (meshplan's runtime), a block a stage runs as traced
    code of fixed shapes is not sequence-parallel (``trace.blocks.runs_eagerly_in_stage``).
    ``presolved``: ILP solutions a forked copy computed (``ilps_beside``), taken into ``memo``
    as they are asked for.

    Long because the ILP, the per-run binding memo and the probe's verdicts are closures over
    one run's graph, cluster and probe; split, each would take all three as arguments."""
    from planner.cost.sharding import tp_variants
    from planner.vocab import SEQUENCE_STYLES, keeps_dtensors, on_dtensors, without_sequence

    p = cluster.profile
    bw, _ = cluster.link(list(range(min(cluster.gpus_per_node, cluster.gpus))))

    def solve(block: Block, tp: int, pipelined: bool) -> list:
        return tp_variants(
            graph,
            block,
            tp,
            vocab_tied=not pipelined,
            comm_seconds_per_byte=1.0 / bw,
            flops_per_second=p.peak_flops["bf16"] * p.matmul_efficiency,
            bytes_per_second=p.memory_bandwidth * p.elementwise_efficiency,
            memo=memo,
            presolved=presolved,
        )

    # (block, tp, pipelined) -> its variants: the searches of one run (the plan's and the
    # baselines', every micro-batch size) ask for the same block's variants hundreds of times,
    # and binding the class's solutions to a block's names and checking them is most of a
    # warm plan's pricing. Keyed by the block object (kept in the value, so its id is not
    # reused): two blocks of one class bind to their own names.
    bound: dict[tuple, tuple[Block, list]] = {}

    def variants_of(block: Block, tp: int, pipelined: bool = False) -> list:
        key = (id(block), tp, pipelined)
        if key not in bound:
            bound[key] = (block, _variants_of(block, tp, pipelined))
        return list(bound[key][1])

    def _variants_of(block: Block, tp: int, pipelined: bool) -> list:
        found = solve(block, tp, pipelined)
        if probe is not None:
            found = _runnable(block, tp, found)
            if pipelined and not reads_one_tensor(graph, block):
                # a stage runs a block handed several tensors eagerly from its kept call
                # signature, but not one on DTensors (``runtime.stages.traced_pipe``)
                eager = runs_eagerly_in_stage(graph, block)
                found = [
                    v
                    for v in found
                    if not any(s in SEQUENCE_STYLES for s in v.tp_plan.values())
                    or (eager and not keeps_dtensors(v.tp_plan))
                ]
        if tp_variant == "no-sequence":
            return [v for v in found if not v.name.endswith("-sp")]
        sharded = [v for v in found if v.name != "replicated"]
        sequence = [v for v in sharded if v.name.endswith("-sp")]
        if tp_variant == "sequence" and sequence:
            return sequence
        return sharded if tp_variant in ("sharded", "sequence") and sharded else found

    def _runnable(block: Block, tp: int, found: list) -> list:
        """The variants the model's eager code runs as priced. Where it misreads a local
        shard (a view that fixes the head count), the attributes it reads the count from are
        set to their local values on each rank where the probe finds them
        (``EagerShardProbe.local_attributes``), the split by heads Megatron runs; else the
        block's column-parallel outputs stay DTensors (``colwise_dtensor``): the code then
        reads global shapes and DTensor runs each op sharded as priced. A variant whose code
        fails on local shards for another reason, or a sequence-parallel one, is dropped."""
        kept = []
        for v in found:
            # the replicated variant, or the one that splits only a tied weight's vocabulary
            # (every variant of the block does), is what the block falls back to
            if v.name == "replicated" or v.name.endswith("-tied"):
                kept.append(v)
                continue
            rejected, unsafe, fixed, local = False, False, True, []
            # a sequence-parallel variant's attention reads the same shards as its TP twin's
            probed = without_sequence(v.tp_plan)
            for i, (module, plan) in enumerate(_probed_parts(block.modules, probed)):
                cls = block.cls if len(block.modules) == 1 else f"{block.cls}:{i}"
                if probe.reject(cls, module, plan, tp):
                    rejected = True
                    unsafe = unsafe or bool(probe.unsafe_outputs(cls, module, plan, tp))
                    fix = probe.local_attributes(cls, module, plan, tp)
                    fixed, local = fixed and bool(fix), local + fix
            if not rejected:
                kept.append(v)
            elif fixed:  # a view by a fixed head count: the head counts set per rank
                kept.append(dataclasses.replace(v, local_attributes=tuple(local)))
            elif unsafe and not any(s in SEQUENCE_STYLES for s in v.tp_plan.values()):
                kept.append(dataclasses.replace(v, tp_plan=on_dtensors(v.tp_plan)))
        return kept

    return variants_of


def _probed_parts(modules: list[str], tp_plan: dict[str, str]) -> list[tuple[str, dict]]:
    """What the eager probe runs for a block: its module with the whole plan, or, for a block
    of several (CANINE's embeddings, character encoder and downsampling taken together), each
    module with its own part of the plan, so every styled module's code runs on its local
    shards (only the first had been probed, which held none of the attention the others'
    styles split). Each part alone, not the module around them all: that is often the whole
    model, and a full-size model's meta forward per variant tripled its planning time."""
    if len(modules) == 1:
        return [(modules[0], tp_plan)]
    parts = []
    for m in modules:
        own = {k: s for k, s in tp_plan.items() if k == m or k.startswith(m + ".")}
        if own:
            parts.append((m, own))
    return parts


@cycles_uncollected()  # contextlib's managers decorate too, made afresh per call
def plan(
    model_file: str | Path | ModelFile,
    gpus: int | None = None,
    *,
    model_args: dict[str, Any] | None = None,
    profile: str | None = None,
    gpus_per_node: int | None = None,
    nodes: int | None = None,
    training: Training | None = None,
    global_batch_size: int | None = None,
    dtype: str | None = None,
    optimizer: str | None = None,
    lr: float | None = None,
    pins: Any = None,
    use_cache: bool = True,
    progress: Any = None,
    compare_baselines: bool = True,
    solved: dict | None = None,
    draft: Callable[[Any], None] | None = None,
    bounds: dict | None = None,
) -> PlanResult:
    """Trace, price and solve: the plan dict of docs/plan-format.md, plus what made it.

    ``compare_baselines``: also solve the hand-written baselines the plan's alternatives list
    (pure DP, FSDP, Megatron's rule), a quarter of a pinned plan's planning time; a caller that
    only runs the plan (the runtime's tests) leaves them out. ``solved``: a dict the caller
    keeps across plans, where each traced model's sharding ILP solutions are kept (by the
    trace's cache key), so that planning a model again, under other pins or on another
    cluster, solves none of them twice. ``draft``: called with the plan as it stands when its
    own search ends, before the baselines' rows are in its alternatives (the report worker
    draws the figures from it while the baselines are searched). ``bounds``: a dict the caller
    keeps across plans, where each trace's bound_memo.BoundMemo is kept (by the trace's cache
    key), read from the cache once and saved by the caller (``bound_memo.save_kept``) when its
    plans are done: a pool's fifteen plans read and wrote a growing file each.

    ``training``: the settings (planner.training); without it they are built from the model
    file's TRAINING with ``global_batch_size``, ``dtype``, ``optimizer`` and ``lr`` over it.

    Raises UserInputError for bad input and InfeasibleError when nothing fits.

    Planned with the cycle collector paused (``planner.collector``): a plan's heap lives to its
    end and leaves few cycles. Long because it composes trace, probe, search, baselines and notes
    in the order they run, a few lines each."""
    from planner.assemble import build_plan
    from planner.cost.eager_probe import EagerShardProbe
    from planner.cost.variant_cache import load_variants, save_variants
    from planner.errors import InfeasibleError
    from planner.hardware.cluster import make_cluster
    from planner.search import Pins, search
    from planner.search.memo import SearchMemo

    mf = (
        model_file
        if isinstance(model_file, ModelFile)
        else load_model_file(model_file, model_args or {})
    )
    cluster, notes = make_cluster(gpus, profile, gpus_per_node, nodes)
    if training is None:
        training = training_from(
            mf.training,
            mf.path.name,
            global_batch_size=global_batch_size,
            dtype=dtype,
            optimizer=optimizer,
            lr=lr,
        )
    training = on_devices(training, cluster.profile.device == "gpu")
    pins = pins or Pins()
    if progress:
        progress("trace", 0, 1)
    traced = trace(mf, traced_batch_size=1, dtype=training.dtype, use_cache=use_cache)
    if traced.note:
        notes.append(traced.note)
    memo = SearchMemo(variants={} if solved is None else solved.setdefault(traced.cache_key, {}))
    if use_cache:  # the stage MILPs and bounds an earlier plan computed are read back
        from planner.search.bound_memo import kept_bounds
        from planner.search.milp.runs import RunStore

        memo.runs, memo.bounds = RunStore(), kept_bounds(bounds, traced.cache_key)
    if use_cache and not memo.variants:  # the sharding ILP's solutions from an earlier plan
        memo.variants.update(load_variants(traced.cache_key))
    known = len(memo.variants)
    probe = EagerShardProbe(
        mf, training.dtype, traced.cache_key if use_cache else None, traced.repeats
    )
    presolved: dict = {}  # ILP solutions of a forked copy (ilps_beside), taken as asked for
    variants_of = variants_for(
        traced.graph, cluster, pins.tp_variant, memo.variants, probe, presolved
    )
    # Hand-written baselines as published (Narayanan et al. 2021: no sequence parallelism),
    # searched in a forked copy while the plan's own search runs here.
    pending = None
    if compare_baselines:
        presolved.update(ilps_beside(traced, cluster, training, pins, memo, probe))
        pending = baselines_beside(traced, cluster, training, pins, variants_of, memo, probe)
    try:
        result = search(
            traced.graph, traced.blocks, cluster, training, pins, variants_of, progress, memo=memo
        )
    except BaseException:
        if pending is not None:
            pending.cancel()
        raise
    if result.best is None:
        if pending is not None:
            pending.cancel()
        raise InfeasibleError(infeasible_message(traced, cluster, training, result, pins))
    if draft is not None:
        draft(build_plan(traced, cluster, training, result, []))
    baselines = []
    if pending is not None:
        baselines = adopt_baselines(pending.result(), pending.forked, memo, probe)
    elif compare_baselines:
        hand = variants_for(traced.graph, cluster, "no-sequence", memo.variants, probe)
        baselines = baseline_candidates(traced, cluster, training, pins, hand, memo)
    notes += probe.notes()
    probe.save()
    if use_cache and len(memo.variants) > known:
        save_variants(traced.cache_key, memo.variants)
    if memo.bounds is not None and memo.bounds.added and bounds is None:
        from planner.search.bound_memo import save_bounds

        save_bounds(traced.cache_key, memo.bounds)
    doc = build_plan(traced, cluster, training, result, baselines)
    notes += batch_statistics_notes(traced.graph, doc)
    notes += loss_sample_notes(traced.graph, doc, lambda: mf.loss_gathers)
    notes += forward_state_notes(traced.graph, doc)
    notes += random_draw_notes(traced.graph, doc)
    notes += numpy_draw_notes(traced.graph, doc)
    return PlanResult(doc, traced, cluster, training, result, notes)


def batch_statistics_notes(graph, doc) -> list[str]:
    """Where the plan's BatchNorms see fewer samples together than the global batch: each
    normalises one micro-batch (over the replicas when synchronized), so the model trains as
    one process would with that micro-batch and gradient accumulation, not with the whole
    batch at once. Said, since it changes what is trained, with the pin that avoids it."""
    from planner.cost.block_options import batch_statistics_shapes

    if not batch_statistics_shapes(graph):
        return []
    dp = doc.mesh.dp
    together = doc.micro_batch_size * (dp if doc.batchnorm == "synchronized" else 1)
    if together >= doc.global_batch_size:
        return []
    return [
        f"BatchNorm: statistics over {together} samples per micro-batch, where one process "
        f"taking the global batch at once normalises all {doc.global_batch_size}; pin "
        f"--micro-batch-size {doc.global_batch_size // dp} (one micro-batch per replica) to "
        "train as that process does"
    ]


def loss_sample_notes(graph, doc, gathers: Callable[[], bool] = lambda: False) -> list[str]:
    """Where the plan splits the batch and the model file's loss is not a mean over samples
    (``planner.trace.loss_samples``): each micro-batch of each replica computes it over its own
    samples and the step averages those, which trains another model than one process taking
    the global batch at once. Said with the numbers that showed it and the pin that avoids it.
    ``gathers()``: the ``loss_fn`` takes ``gather`` (``runtime/gather.py``), so the replicas'
    micro-batches of one round are one batch: only several rounds split it. Asked only for a
    loss that couples samples: it runs the model file (a cached re-plan otherwise imports no
    torch)."""
    from planner.trace.loss_samples import couples_samples

    check = graph.graph.get("loss_samples", {})
    if not couples_samples(check):
        return []
    gathers = gathers()
    parts = doc.num_microbatches * (1 if gathers else doc.mesh.dp)
    if parts <= 1:
        return []
    if gathers:
        return [
            f"loss: not a mean over samples, and loss_fn gathers the {doc.mesh.dp} replicas' "
            f"outputs: each of {parts} micro-batch rounds is a batch of its own of "
            f"{doc.micro_batch_size * doc.mesh.dp} samples, not one process's "
            f"{doc.global_batch_size}; pin --micro-batch-size "
            f"{doc.global_batch_size // doc.mesh.dp} (one micro-batch per replica)"
        ]
    return [
        f"loss: not a mean over samples (two samples together {check['together']:.6g}, the "
        f"mean of each alone {check['apart']:.6g}: a sum, in-batch negatives or a token mean "
        f"over targets of unequal length); this plan averages it over {parts} parts of "
        f"{doc.micro_batch_size} samples, which trains another model than one process taking "
        f"all {doc.global_batch_size} at once; pin --micro-batch-size {doc.global_batch_size} "
        "--dp 1, or make loss_fn a mean of per-sample losses"
    ]


def forward_state_notes(graph, doc) -> list[str]:
    """Where data-parallel replicas each run only their own micro-batches' forwards on buffers
    or weights the forward updates (``planner.trace.export.forward_state``): said, since it
    changes what is trained, with the pin that avoids it."""
    state = graph.graph.get("forward_state", [])
    if not state or doc.mesh.dp <= 1:
        return []
    shown = ", ".join(state[:3]) + (", ..." if len(state) > 3 else "")
    m = doc.num_microbatches
    return [
        f"buffers or weights the forward updates in place ({shown}): one process runs all "
        f"{m * doc.mesh.dp} micro-batches' forwards on them each step, each of the "
        f"{doc.mesh.dp} data-parallel replicas only its {m}, so they, and any output reading "
        "them, drift from one process; pin --dp 1 to keep them"
    ]


def numpy_draw_notes(graph, doc) -> list[str]:
    """Where the forward draws from numpy's generator (``planner.trace.randomness.
    numpy_draws``): torch's seed does not reach it, and a pipeline's traced stages keep the
    numbers drawn while tracing as constants, replayed every step."""
    drawn = graph.graph.get("numpy_draws", [])
    if not drawn or doc.mesh.size * doc.num_microbatches <= 1:
        return []
    frozen = (
        "; this plan's pipeline stages are traced once and replay the numbers drawn then, "
        "every step (another model, with nothing failing)"
        if doc.mesh.pp > 1
        else ""
    )
    return [
        f"the forward draws from numpy's generator ({', '.join(drawn[:3])}; transformers' "
        "SpecAugment masks: mask_time_prob > 0): torch's seed does not reach it, so no plan "
        f"repeats one process's numbers{frozen}; set that noise to 0 or draw it with torch"
    ]


def random_draw_notes(graph, doc) -> list[str]:
    """Where the forward draws random numbers (``planner.trace.randomness``) and the plan runs
    it on more than one rank or micro-batch: each draws its own numbers, so the plan trains
    like one process in distribution only. Said, as a user comparing a plan's losses with one
    device's would otherwise take the difference for a bug."""
    from planner.trace.randomness import random_draws

    draws = random_draws(graph)
    if not draws or doc.mesh.size * doc.num_microbatches <= 1:
        return []
    shown = ", ".join(f"{op} in {module}" for op, module in draws[:3])
    more = f" and {len(draws) - 3} more" if len(draws) > 3 else ""
    return [
        f"the forward draws random numbers ({shown}{more}): each rank and micro-batch of this "
        "plan draws its own, so it trains like one process in distribution, not number for "
        "number; set dropout and other noise to 0 to compare its losses with one device's"
    ]


def ilps_beside(traced, cluster, training, pins, memo, probe) -> dict:
    """On a first plan of a model: the sharding ILPs ``baselines_beside`` computes before its
    fork (Megatron's TP degree, ``driver.prepare``), solved in a forked copy while this process
    builds the eager probe's meta model and captures its inputs (``EagerShardProbe.load``);
    the two are independent (HiGHS on the graph; the model's torch code) and each about 0.4 s
    of CPU on Llama-3-70B, all of it before the baselines' copy can start. Returns the copy's
    solutions by ``tp_variants``' keys, which ``variants_for(presolved=...)`` takes as the
    searches ask for them, so the memo holds what it would have: the copy runs ``prepare``
    without the probe and may solve keys no search here asks for, which stay unused. {} where
    nothing is to gain (solutions or verdicts read from the cache, TP 1, no fork) or the copy
    failed: then everything is computed here as before."""
    from dataclasses import replace

    from planner.search.driver import prepare
    from planner.search.overlap import Forked, forking_allowed

    megatron = replace(pins, tp=megatron_tp(cluster))
    if memo.variants or probe.verdicts or megatron.tp == 1 or not forking_allowed():
        return {}

    def solve() -> dict:
        solved: dict = {}
        unprobed = variants_for(traced.graph, cluster, pins.tp_variant, solved)
        prepare(traced.graph, traced.blocks, cluster, training, megatron, unprobed)
        return solved

    pending = Forked(solve, fallback=dict)
    try:
        probe.load()
    except BaseException:
        pending.cancel()
        raise
    return pending.result()


def baselines_beside(traced, cluster, training, pins, variants_of, memo, probe) -> Any:
    """The baselines' search (``baseline_candidates``) started in a forked copy of this process
    (``planner.search.overlap.Forked``; computed here on ``result()`` where none could be
    made), while this process goes on with the plan's own search. Their long part is
    Megatron's rule, whose sharding ILPs and eager probes (one TP degree, ``megatron_tp``) are
    computed here first, as the plan's search asks for them (``driver.prepare``): the copy
    finds them, and this process keeps them for its own search. What the copy adds to the memo
    (other ILPs, probe verdicts, bounds) comes back with its baselines (``adopt_baselines``)."""
    from dataclasses import replace

    from planner.search.driver import prepare
    from planner.search.overlap import Forked

    prepare(
        traced.graph,
        traced.blocks,
        cluster,
        training,
        replace(pins, tp=megatron_tp(cluster)),
        variants_of,
    )
    hand = variants_for(traced.graph, cluster, "no-sequence", memo.variants, probe)

    def compute() -> tuple:
        known = len(memo.bounds.entries) if memo.bounds is not None else 0
        found = baseline_candidates(traced, cluster, training, pins, hand, memo)
        bounds = memo.bounds.since(known) if memo.bounds is not None else {}
        return found, memo.variants, probe.verdicts, bounds

    return Forked(compute)


def adopt_baselines(computed: tuple, forked: bool, memo, probe) -> list:
    """The baselines of ``baselines_beside``; a forked copy's ILP solutions, probe verdicts and
    bounds joined to this process's, to be noted and kept as if computed here."""
    found, variants, verdicts, bounds = computed
    if forked:
        for key, templates in variants.items():
            memo.variants.setdefault(key, templates)
        probe.adopt(verdicts)
        if memo.bounds is not None:
            memo.bounds.adopt(bounds)
    return found


def baseline_candidates(traced, cluster, training, pins, variants_of, memo=None) -> list:
    """Pure DP, pure FSDP and Megatron's rule, each solved under the same cost model."""
    from dataclasses import replace

    from planner.search import search
    from planner.search.candidates import divisors, enumerate_candidates

    found = []
    rules = [
        ("pure data parallel", dict(tp=1, pp=1, zero=0, cp=1, ep=1)),
        ("FSDP (ZeRO-3)", dict(tp=1, pp=1, zero=3, cp=1, ep=1)),
    ]
    tp = megatron_tp(cluster)
    rules.append(("Megatron: TP in node, PP across nodes, full recompute", dict(tp=tp, cp=1, ep=1)))
    for name, fixed in rules:
        p = replace(pins, **fixed)
        if name.startswith("Megatron"):
            p = replace(
                p, recompute=Recompute.FULL, pp=cluster.nodes if cluster.nodes > 1 else None
            )
        layouts = enumerate_candidates(
            cluster.gpus, len(traced.blocks), training, p, divisors(cluster.gpus), traced.blocks
        )
        if not layouts:  # the rule contradicts the user's pins: nothing to price
            continue
        try:
            res = search(traced.graph, traced.blocks, cluster, training, p, variants_of, memo=memo)
        except Exception:  # a baseline that cannot be formed is simply not listed
            continue
        best = res.best or min(
            (c for c in res.candidates if c.status == "solved"),
            key=lambda c: c.cost.step_time_s,
            default=None,
        )
        if best is not None:
            found.append((name, best))
    return found


def megatron_tp(cluster) -> int:
    """Megatron's rule's TP degree: the largest of 8, 4, 2 within a node dividing the GPUs."""
    for t in (8, 4, 2):
        if t <= cluster.gpus_per_node and cluster.gpus % t == 0:
            return t
    return 1


def infeasible_message(traced, cluster, training, result, pins) -> str:
    from planner.report.console import human_bytes as size

    cap = cluster.profile.memory_bytes * pins.memory_fraction
    need = min(c.min_memory for c in result.candidates)
    # fewest GPUs of this profile whose ZeRO-3 share of the model states would fit
    wb, gb, ob = training.state_bytes
    states = traced.params * (wb + gb + ob)
    room = cap - cluster.profile.reserved_bytes
    fewest = int(-(-states // room)) if room > 0 else 0
    if pins.tp and pins.pp and pins.dp:  # the pinned layout fixes the GPU count
        hints = ["a larger --pp or --tp (or leave --dp to the search)"]
    else:
        hints = [f"at least {max(fewest, cluster.gpus + 1)} GPUs of {cluster.profile.name}"]
    hints.append("a profile with more memory (e.g. --profile h200)")
    if pins.offload == Offload.NONE:
        hints.append("allowing offload (--offload auto)")
    if pins.recompute not in ("auto", Recompute.FULL):
        hints.append("--recompute auto")
    if need > cap:
        miss = (
            f"the best candidate needs at least {size(need)} per device "
            f"({size(need - cap)} over the {size(cap)} usable)"
        )
    else:
        miss = (
            f"model states fit ({size(need)} of {size(cap)} usable per device) "
            "but with activations and buffers no placement does"
        )
    return f"no plan fits: {miss}; try " + ", or ".join(hints)
