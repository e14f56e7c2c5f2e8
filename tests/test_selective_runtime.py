"""Selective recompute priced as meshplan's runtime runs it (``SelectivePolicy.RUNTIME_OP``).

The reference is the runtime itself: a real layer checkpointed by ``runtime.parallelize.
apply_recompute`` (the runtime's own checkpoint and policy), run on the CPU in bf16. What it
holds is counted by a dispatch mode outside the checkpoint that keeps a weak reference to the
storage of every tensor the layer's ops create: after the forward, the storages still alive
(less the layer's output, which the next block holds) are what the checkpoint keeps, and the
checkpoint also holds the layer's input. What it re-runs is the backward's ops with the
checkpoint less those of the same backward without it (the recompute happens inside the
backward). Neither route reads the planner's trace or policy."""

from __future__ import annotations

import gc
import importlib.util
import weakref
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import cluster_of
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from planner.schema.plan import BlockPlan
from planner.training import Training
from planner.vocab import Recompute

ROOT = Path(__file__).resolve().parent.parent
S, H, HEADS = 64, 256, 8
# examples' arguments, as planned and as built: one layer class per model
ARGS = {
    # eager attention: q @ k^T -> scale -> mask -> softmax -> dropout -> @ v
    "gpt": dict(size="tiny", layers=2, hidden=H, heads=HEADS, seq_len=S, vocab=1000, dropout=0.1),
    # transformers' Llama: RMSNorm in fp32, rotary positions, SDPA, SwiGLU
    "llama": dict(
        size="tiny", layers=2, hidden=H, heads=HEADS, kv_heads=2, ffn=512, seq_len=S, vocab=1000
    ),
}
LAYER = {"gpt": "layers.0", "llama": "model.layers.0"}
TRAINING = Training(8, "bf16", "adamw")


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


class _Storages(TorchDispatchMode):
    """Every op run: its name and the bytes of the storages it created (not its inputs');
    while ``keep``, a weak reference to each such storage."""

    def __init__(self) -> None:
        super().__init__()
        self.keep = True
        self.created: list[tuple[weakref.ref, int]] = []
        self.ops: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in _tensors((args, kwargs))}
        new = {}
        for t in _tensors(out):
            s = t.untyped_storage()
            if s.data_ptr() not in inputs:
                new[s.data_ptr()] = s
        self.ops.append((str(func), sum(s.nbytes() for s in new.values())))
        if self.keep:
            self.created += [(weakref.ref(s), s.nbytes()) for s in new.values()]
        return out


def _layer_call(model_name: str, recompute: Recompute):
    """(the layer's call on a fixed input, that input): the example's model built as planned,
    in bf16, its first layer checkpointed as the runtime checkpoints a block."""
    spec = importlib.util.spec_from_file_location(
        model_name, ROOT / "examples" / f"{model_name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model = module.build_model(**ARGS[model_name]).to(torch.bfloat16).train()
    fqn = LAYER[model_name]
    if recompute != Recompute.NONE:
        from runtime.parallelize import apply_recompute

        block = BlockPlan(name=fqn, modules=[fqn], stage=0, recompute=recompute, offload="none")
        apply_recompute(model, [block])
    layer = model.get_submodule(fqn)
    x = torch.randn(1, S, H, dtype=torch.bfloat16, requires_grad=True)
    if model_name == "llama":
        positions = model.model.rotary_emb(x, torch.arange(S)[None])
        return lambda: layer(x, attention_mask=None, position_embeddings=positions), x
    return lambda: layer(x), x


def held_bytes(model_name: str) -> int:
    """Bytes the runtime's selective checkpoint keeps for one layer's backward: the storages
    its forward created that outlive it, less its output's, plus its input."""
    call, x = _layer_call(model_name, Recompute.SELECTIVE)
    seen = _Storages()
    with seen:
        y = call()
    gc.collect()
    alive = {id(r()): b for r, b in seen.created if r() is not None}
    return sum(alive.values()) - y.untyped_storage().nbytes() + x.untyped_storage().nbytes()


def backward_ops(model_name: str, recompute: Recompute) -> Counter:
    """(op, bytes created) of one backward of the layer, counted."""
    call, _ = _layer_call(model_name, recompute)
    y = call()
    seen = _Storages()
    with seen:
        y.backward(torch.ones_like(y))
    return Counter(seen.ops)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    import os

    os.environ["MESHPLAN_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    from planner.api import trace

    return {
        m: trace(str(ROOT / "examples" / f"{m}.py"), a, traced_batch_size=1, dtype="bf16")
        for m, a in ARGS.items()
    }


def _layer_options(t):
    from planner.cost.block_options import block_options
    from planner.cost.sharding import tp_variants

    layer = t.blocks[1]
    cluster = cluster_of(1)
    opts = block_options(
        t.graph, layer, tp_variants(t.graph, layer, 1)[:1], 1, cluster, [0], TRAINING
    )
    return layer, cluster, {o.recompute: o for o in opts if o.offload == "none"}


@pytest.mark.parametrize("model_name", ["gpt", "llama"])
def test_priced_selective_bytes_are_what_the_runtime_holds(traced, model_name):
    """GPT: the input, q, k, v, QK^T (heads x s^2), scores @ V, the projection, fc1 (4h) and
    fc2: 2 x (7 x 64 x 256 + 8 x 64 x 64 + 64 x 1024) = 425,984 bytes. Llama: the
    input, q, k and v (2 of 8 heads), SDPA's output and fp32 log-sum-exp, o, gate, up, down."""
    assert TRAINING.selective_policy == "runtime-op"  # meshplan's plans' default
    _, _, by = _layer_options(traced[model_name])
    held = held_bytes(model_name)
    assert by[Recompute.SELECTIVE].act_bytes == held
    expected = {
        "gpt": 2 * (7 * S * H + HEADS * S * S + S * 4 * H),
        "llama": 2 * (S * H * 5 + 2 * S * 64 + 2 * S * 512) + 4 * HEADS * S,
    }[model_name]
    assert held == expected


def test_priced_selective_recompute_is_what_the_runtime_re_runs(traced):
    """The Llama layer's ops the recompute re-runs (the backward's ops with the checkpoint less
    those without) are the priced recomputed ops, op for op, and the priced recompute time is
    their forward: everything but the seven products and SDPA, up to the last op that saves
    a tensor (the checkpoint stops there: the final residual add is not re-run). The trace's
    ``contiguous`` of attention's output copies on the meta device only: a flash kernel's output
    is laid out [b, s, heads, d], so its transpose is already contiguous and the runtime runs
    nothing for it."""
    from planner.cost.block_options import selective_kept
    from planner.cost.compute import block_node_times, op_counts, overhead_times

    t = traced["llama"]
    layer, cluster, by = _layer_options(t)
    _, recomputed = selective_kept(t.graph, layer, TRAINING)
    rerun = backward_ops("llama", Recompute.SELECTIVE) - backward_ops("llama", Recompute.NONE)
    priced = _priced_runs(t.graph, recomputed)
    measured = Counter({(op.split(".")[1], b): k for (op, b), k in rerun.items() if b})
    assert measured == priced
    assert sum(priced.values()) == 29  # 4 casts, 2 pow, mean, rsqrt, 9 mul, 5 add, 2 neg, cat, silu
    times = block_node_times(t.graph, layer, 1.0, cluster, "bf16")
    forward = sum(times.ops[n][0] + times.ops[n][1] for n in recomputed)
    overhead = overhead_times(op_counts(t.graph, layer), {}, 1, cluster)[2]
    extra = by[Recompute.SELECTIVE].bwd_s - by[Recompute.NONE].bwd_s
    assert extra == pytest.approx(forward + overhead, rel=1e-12)
    last = max(i for i, n in enumerate(layer.nodes) if n in recomputed)
    assert t.graph.nodes[layer.nodes[last]]["op"] == "aten.mul.Tensor"  # SwiGLU's product


def _tp2_options(t):
    """The Llama layer's TP 2 variants and their priced options (as the planner prices them)."""
    from planner.cost.block_options import block_options
    from planner.cost.sharding import tp_variants

    layer = t.blocks[1]
    variants = {v.name: v for v in tp_variants(t.graph, layer, 2)}
    opts = block_options(t.graph, layer, list(variants.values()), 1, cluster_of(2), [0, 1],
                         TRAINING)  # fmt: skip
    return layer, variants, opts


@pytest.fixture(scope="module")
def sp_layer(traced, tmp_path_factory):
    """One rank's view of the Llama layer run as its TP 2 sequence-parallel variant on gloo
    (``tests/scripts/sp_selective_held.py``): bytes its selective checkpoint keeps, and its
    backward's ops with the checkpoint and without."""
    import json
    import sys

    import forked_ranks

    from runtime.launch import worker_env

    _, variants, _ = _tp2_options(traced["llama"])
    plan = {"recompute": "selective", "tp_plan": variants["tp2-v1-sp"].tp_plan}
    env = {**worker_env(), "LAYER_PLAN": json.dumps(plan)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += [str(ROOT / "tests" / "scripts" / "sp_selective_held.py")]
    proc = forked_ranks.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads([x for x in proc.stdout.splitlines() if x.startswith("{")][-1])


def test_priced_selective_bytes_per_tp_rank(traced):
    """One TP rank of the Llama layer at TP 2, with and without sequence parallelism. Without,
    the runtime saves each product's output as DTensor gives it: q, k, v, gate and up split by
    columns (half each), SDPA's output and log-sum-exp split by heads (half), o and down the
    row-parallel partial sums (whole: saved before their all-reduce), and the layer's input
    whole: 2 x 64 x (256 + 128 + 32 + 32 + 128 + 256 + 256 + 256 + 256) + 4 x 4 x 64 =
    205,824. With, o and down are kept as their reduce-scattered sequence shards and the input
    as its shard (128 each): 156,672."""
    _, _, opts = _tp2_options(traced["llama"])
    kept = {o.variant: o.act_bytes for o in opts if o.recompute == Recompute.SELECTIVE}
    per_token = 256 + 128 + 32 + 32 + 128 + 256 + 256 + 256 + 256
    sp_per_token = 128 + 128 + 32 + 32 + 128 + 128 + 256 + 256 + 128
    assert kept == {
        "replicated": 2 * S * (5 * H + 2 * 64 + 2 * 512) + 4 * HEADS * S,
        "tp2-v1": 2 * S * per_token + 4 * (HEADS // 2) * S,
        "tp2-v1-sp": 2 * S * sp_per_token + 4 * (HEADS // 2) * S,
    }


@pytest.mark.distributed
def test_runtime_holds_the_priced_bytes_per_tp_rank(traced, sp_layer):
    """The TP 2 sequence-parallel layer's checkpoint holds, on one gloo rank, the priced
    156,672 bytes (``test_priced_selective_bytes_per_tp_rank``), less than the same layer
    keeps there without recompute."""
    _, _, opts = _tp2_options(traced["llama"])
    kept = {o.variant: o.act_bytes for o in opts if o.recompute == Recompute.SELECTIVE}
    assert sp_layer["held"] == kept["tp2-v1-sp"] == 156_672
    assert sp_layer["held"] < sp_layer["held_none"]


# ops the runtime runs that the trace has no node for, each (name, bytes on one rank): the
# reduce-scatter's input laid out as one buffer of the partial sums (the whole sequence), the
# row-parallel module's copy of its reduce-scattered output (``parallelize._Rowwise``) and the
# slice-at-entry's copy of the input's shard
SP_RUNTIME_COPIES = Counter({("cat", 2 * S * H): 1, ("clone", 2 * S * H // 2): 2})


@pytest.mark.distributed
def test_priced_selective_recompute_per_tp_rank(traced, sp_layer):
    """What the TP 2 sequence-parallel layer's recompute re-runs on one rank (its backward's ops
    with the checkpoint less those without) is the priced recomputed ops, op for op at one
    rank's bytes (a sequence-sharded or column-split output 1/2, a partial sum whole), plus
    ``SP_RUNTIME_COPIES``: the 29 element-wise ops of the one-process layer and o's product,
    re-run for its reduce-scatter's kept output (down's is not: the recompute stops at its
    input). The priced recompute time is their forward, the overhead, and one all-gather of
    the layer's input."""
    from planner.cost.block_options import runtime_selective, selective_ops
    from planner.cost.compute import block_node_times, op_counts, overhead_times, tp_shares
    from planner.hardware.collectives import collective_time

    t = traced["llama"]
    layer, variants, opts = _tp2_options(t)
    v = variants["tp2-v1-sp"]
    saved, _ = selective_ops(t.graph, layer, TRAINING)
    _, recomputed = runtime_selective(t.graph, layer, saved, v)
    priced = _priced_runs(t.graph, recomputed, lambda n: 2 if v.states[n].startswith("S") else 1)
    rerun = Counter(tuple(x) for x in sp_layer["backward"])
    rerun -= Counter(tuple(x) for x in sp_layer["backward_none"])
    measured = Counter({(op.split(".")[1], b): k for (op, b), k in rerun.items() if b})
    assert measured == priced + SP_RUNTIME_COPIES
    assert sum(priced.values()) == 30 and priced[("mm", 2 * S * H)] == 1
    cluster = cluster_of(2)
    times = block_node_times(t.graph, layer, 1.0, cluster, "bf16")
    forward = times.sharded(tp_shares(v, times, t.graph), recomputed)[0]
    overhead = overhead_times(op_counts(t.graph, layer), v.tp_plan, 2, cluster)[2]
    regather = collective_time("all_gather", 2 * S * H, cluster, [0, 1])
    by = {o.recompute: o for o in opts if o.variant == v.name and o.offload == "none"}
    extra = by[Recompute.SELECTIVE].bwd_s - by[Recompute.NONE].bwd_s
    assert extra == pytest.approx(forward + overhead + regather, rel=1e-12)


def _priced_runs(graph, recomputed, share=lambda n: 1) -> Counter:
    """(op as the runtime's dispatcher names it, output bytes on one rank) -> count, of the
    priced re-run ops that launch a kernel (views and no-op contiguous calls do not);
    ``share``: how many ranks an op's output is split over."""
    from planner.trace.opcost import is_view

    runtime_names = {"to": "_to_copy", "linear": "mm"}
    priced = Counter()
    for n in recomputed:
        d = graph.nodes[n]
        name = d["op"].split(".")[1]
        if is_view(d["op"]) or name == "contiguous":
            continue
        priced[(runtime_names.get(name, name), d["out_bytes"] // share(n))] += 1
    return priced
