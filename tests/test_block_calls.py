"""A pipeline stage runs a block handed several tensors as the model's eager module.

An HF Llama decoder layer is called ``layer(h, attention_mask=m, position_embeddings=(cos,
sin), position_ids=p, ...)``; torch's pipelining traces it into a module taking four tensors
in the order its code reads them. The stage's export keeps the layer's call signature and each
stage rebuilds the call as the model made it (``runtime.block_calls``), so the stage runs the
model's own layer: its column-parallel outputs meet its row-parallel modules in eager code
(none gathered), and sequence parallelism can slice it. Before, the layer stayed the traced
module (``InterpreterModule``) and these tests failed.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import torch
from torch.distributed.pipelining import SplitPoint
from torch.distributed.pipelining._IR import annotate_split_points
from torch.export.unflatten import InterpreterModule

from planner.api import trace
from planner.modelfile import load_model_file
from planner.trace.blocks import reads_one_tensor, runs_eagerly_in_stage
from runtime.block_calls import module_calls, signature_modules
from runtime.model_outputs import traced_pipeline
from runtime.parallelize import _meets_traced_code
from runtime.stages import (
    adopt_eager_modules,
    contiguous_boundaries,
    inline_grad_mode_regions,
    relay_skip_connections,
)

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("model.layers.0", "model.layers.1")
# Megatron's pairs in one layer: q, k, v, gate, up column-parallel, o and down row-parallel
MEGATRON = {
    **{f"self_attn.{p}_proj": "colwise" for p in "qkv"},
    "self_attn.o_proj": "rowwise",
    "mlp.gate_proj": "colwise",
    "mlp.up_proj": "colwise",
    "mlp.down_proj": "rowwise",
}


def _split(path: Path, cut: str, paths: list[str], batch: int = 2):
    """The model of ``path`` cut before module ``cut`` as the runtime cuts it, with the eager
    modules adopted (the call signatures of ``paths`` kept); the model, its micro-batch."""
    mf = load_model_file(path, {"size": "tiny"})
    torch.manual_seed(0)
    model = mf.build()
    inputs, _ = mf.batch(batch, step=0)
    example = inputs if isinstance(inputs, tuple) else (inputs,)
    preserve = signature_modules(paths, module_calls(model, example))
    traced = copy.deepcopy(model)
    annotate_split_points(traced, {cut: SplitPoint.BEGINNING})
    pipe, _, calls = traced_pipeline(traced, example, inline_grad_mode_regions, preserve)
    relay_skip_connections(pipe.split_gm)
    contiguous_boundaries(pipe.split_gm)
    for i in range(pipe.num_stages):
        adopt_eager_modules(pipe.get_stage_module(i), model, [cut], None, calls)
    return pipe, model, example, calls


@functools.cache
def _split_llama():
    path = ROOT / "examples" / "llama.py"
    return _split(path, LAYERS[1], ["model.embed_tokens", *LAYERS, "model.norm", "lm_head"])


def test_each_stage_runs_the_model_s_own_layer_as_the_model_calls_it():
    pipe, model, example, calls = _split_llama()
    assert set(LAYERS) <= set(calls)
    for i, path in enumerate(LAYERS):
        stage = pipe.get_stage_module(i)
        layer = stage.get_submodule(path)
        assert layer is model.get_submodule(path)
        assert not isinstance(layer, InterpreterModule)
        tp_plan = {f"{path}.{k}": v for k, v in MEGATRON.items()}
        # q's shard reaches o in eager code: kept local, as the plan prices it
        assert not _meets_traced_code(stage, f"{path}.self_attn.q_proj", tp_plan)
        assert not _meets_traced_code(stage, f"{path}.mlp.up_proj", tp_plan)
    # the same numbers as one process, bit for bit: cos and sin (one shape, one dtype) and
    # the mask reach the keywords the model passed them by, in the second stage too
    with torch.no_grad():
        got = pipe(*example)
        want = model(*example).logits
    got = got[0] if isinstance(got, (tuple, list)) else got
    assert torch.equal(got, want)


def test_the_stream_is_the_layer_s_first_argument_in_every_stage():
    """What the stage's sequence-sharded links read (``runtime.stages._input_of``): the
    traced layer's first input was the mask."""
    from runtime.stages import _input_of, stage_module_name

    pipe, *_ = _split_llama()
    stage = pipe.get_stage_module(1)
    places = [n for n in stage.graph.nodes if n.op == "placeholder"]
    k = _input_of(stage, LAYERS[1])
    top = next(n for n in pipe.split_gm.graph.nodes if n.target == stage_module_name(1))
    stream = top.args[k]
    assert places[k].meta["val"].shape == (2, 32, 64)  # batch, sequence, hidden
    assert stream.args[0].target == stage_module_name(0)


def _eager_in_stage(pipe, path: str) -> bool:
    stages = [pipe.get_stage_module(i) for i in range(pipe.num_stages)]
    held = [st.get_submodule(path) for st in stages if path in dict(st.named_modules())]
    return not isinstance(held[0], InterpreterModule)


def test_the_planner_offers_sequence_parallelism_where_the_stage_runs_the_layer_eagerly():
    """``trace.blocks.runs_eagerly_in_stage`` (the planner offers a pipelined layer sequence
    parallelism for meshplan's runtime) agrees with what a stage runs, layer by layer: Llama's
    layers and the last of ``paired_layers`` (handed two tensors, leaving one) eagerly; the
    others, which pass on a second tensor the next layer reads, as traced code."""
    paired = ROOT / "tests" / "models" / "paired_layers.py"
    layers = [f"layers.{i}" for i in range(3)]
    cases = (
        ("examples/llama.py", _split_llama()[0], LAYERS, (True, True)),
        (
            paired,
            _split(paired, layers[1], ["embed", *layers, "head"])[0],
            layers,
            (False, False, True),
        ),
    )
    for path, pipe, names, want in cases:
        traced = trace(path, {"size": "tiny"})
        blocks = {b.modules[0]: b for b in traced.blocks}
        assert not any(reads_one_tensor(traced.graph, blocks[n]) for n in names)
        planner = tuple(runs_eagerly_in_stage(traced.graph, blocks[n]) for n in names)
        runtime = tuple(_eager_in_stage(pipe, n) for n in names)
        assert planner == runtime == want, path
