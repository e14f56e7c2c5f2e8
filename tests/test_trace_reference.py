"""What the tracer measures on the meta device against what torch measures on a real CPU step.

FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` over a real forward and a real backward of
the same model and batch, for every matrix product, attention and convolution (our counts
follow its convention: 2 per multiply-add). torch 2.13's counter sees 0 FLOPs in the CPU's
fused attention kernel, so the real step runs SDPA's math path (its matrix products are
counted); expert layers run an eager per-expert loop of ordinary products (their grouped
products are custom ops the counter cannot see into): both compute what the fused forms do.

Saved activations: a real forward under ``saved_tensors_hooks``, counting each storage autograd
keeps once (parameters and buffers excluded), credited to the block whose forward first saves
it: the layer that keeps a tensor pays for it, whoever made it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from planner.api import trace
from planner.modelfile import load_model_file

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "models"
BATCH = 2


def eager_grouped_mm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """examples/moe.py's grouped product as a loop of ordinary products FlopCounterMode sees."""
    out, start = [], 0
    for e, end in enumerate(offsets.tolist()):
        out.append(x[start:end] @ w[e])
        start = end
    return torch.cat(out)


def real_model(path: Path, eager_experts: bool = False):
    mf = load_model_file(path, {"size": "tiny"})
    torch.manual_seed(0)
    model = mf.build()
    model.train()
    if not eager_experts:
        return mf, model
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")  # per-expert F.linear on routed rows
    if hasattr(mf.module, "grouped_mm"):
        mf.module.grouped_mm = eager_grouped_mm
    return mf, model


def real_flops(path: Path) -> tuple[int, int]:
    mf, model = real_model(path, eager_experts=True)
    inputs, targets = mf.batch(BATCH, step=0)
    with sdpa_kernel(SDPBackend.MATH):
        forward = FlopCounterMode(display=False)
        with forward:
            out = model(*inputs)
        loss = mf.loss(out, targets)
        backward = FlopCounterMode(display=False)
        with backward:
            loss.backward()
    return forward.get_total_flops(), backward.get_total_flops()


FLOP_CASES = [
    ROOT / "examples" / "llama.py",
    ROOT / "examples" / "mixtral.py",
    ROOT / "examples" / "mlp.py",
    ROOT / "examples" / "gpt.py",
    ROOT / "examples" / "moe.py",
    MODELS / "sdpa_layer.py",
    MODELS / "convnet.py",
    MODELS / "frozen_mlp.py",
]


@pytest.mark.parametrize("path", FLOP_CASES, ids=[p.stem for p in FLOP_CASES])
def test_forward_and_backward_flops_equal_flop_counter_on_a_real_step(path):
    traced = trace(path, {"size": "tiny"}, traced_batch_size=BATCH, dtype="fp32")
    nodes = traced.graph.nodes
    fwd = sum(nodes[n]["fwd_flops"] for n in nodes)
    bwd = sum(nodes[n]["bwd_flops"] for n in nodes)
    want_fwd, want_bwd = real_flops(path)
    assert want_fwd > 0 and want_bwd > 0
    assert (fwd, bwd) == (want_fwd, want_bwd)
    assert sum(b.fwd_flops for b in traced.blocks) == fwd
    assert sum(b.bwd_flops for b in traced.blocks) == bwd


def test_frozen_operands_cost_no_backward_products():
    """The frozen input projection and first block: no weight gradient, and no input gradient
    below the first trainable layer, so backward is far less than twice the forward."""
    traced = trace(MODELS / "frozen_mlp.py", {"size": "tiny"}, traced_batch_size=BATCH)
    by_param = {}
    for n in traced.graph.nodes:
        d = traced.graph.nodes[n]
        for p in d["params"]:
            if p.endswith("weight"):
                by_param[p] = (d["fwd_flops"], d["bwd_flops"])
    assert by_param["0.weight"][1] == 0 and by_param["1.0.weight"][1] == 0
    fwd2, bwd2 = by_param["2.0.weight"]
    assert bwd2 == fwd2  # its weight's gradient only: its input comes from frozen layers
    fwd3, bwd3 = by_param["3.weight"]
    assert bwd3 == fwd3  # addmm with a frozen weight: the input's gradient only
    fwd4, bwd4 = by_param["4.weight"]
    assert bwd4 == 2 * fwd4


def real_saved_bytes(path: Path, layers: list[str]) -> dict[str, int]:
    mf, model = real_model(path)
    static = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: set[int] = set()
    found = dict.fromkeys(layers, 0)
    current: list[str] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage().data_ptr()
        if current and key not in static and key not in seen:
            seen.add(key)
            found[current[-1]] += t.untyped_storage().nbytes()
        return t

    def enter(name: str):
        def hook(_module, _args) -> None:
            current.append(name)

        return hook

    def leave(_module, _args, _output) -> None:
        current.pop()

    for name in layers:
        module = model.get_submodule(name)
        module.register_forward_pre_hook(enter(name))
        module.register_forward_hook(leave)
    inputs, _ = mf.batch(BATCH, step=0)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*inputs)
    return found


SAVED_CASES = [
    (ROOT / "examples" / "llama.py", ["model.layers.0", "model.layers.1"], 0.0),
    (ROOT / "examples" / "gpt.py", ["layers.0", "layers.1"], 0.0),
    (ROOT / "examples" / "moe.py", ["layers.0", "layers.1"], 0.0),
    # the real grouped product also keeps its int32 row offsets (16 bytes a layer)
    (ROOT / "examples" / "mixtral.py", ["model.layers.0", "model.layers.1"], 1e-4),
    (MODELS / "sdpa_layer.py", ["layers.0", "layers.1"], 0.0),
]


@pytest.mark.parametrize("path,layers,rel", SAVED_CASES, ids=[p.stem for p, _, _ in SAVED_CASES])
def test_saved_activations_per_layer_equal_a_real_forward(path, layers, rel):
    traced = trace(path, {"size": "tiny"}, traced_batch_size=BATCH, dtype="fp32")
    by_module = {b.modules[0]: b for b in traced.blocks}
    real = real_saved_bytes(path, layers)
    for name in layers:
        assert real[name] > 0
        assert by_module[name].saved_bytes == pytest.approx(real[name], rel=rel, abs=0), name


@pytest.mark.parametrize(
    "path,outputs",
    [
        (ROOT / "examples" / "gpt.py", ["drop", "layers.0", "layers.1"]),
        (ROOT / "examples" / "mlp.py", ["proj", "layers.0", "layers.1", "layers.2", "layers.3"]),
    ],
    ids=["gpt", "mlp"],
)
def test_pipeline_cuts_carry_what_the_previous_block_returns(path, outputs):
    """In a model whose blocks pass one tensor on, the bytes crossing the cut after each block
    are that block's output, as a real forward returns it."""
    traced = trace(path, {"size": "tiny"}, traced_batch_size=BATCH, dtype="fp32")
    mf, model = real_model(path)
    sizes: dict[str, int] = {}
    for name in outputs:
        model.get_submodule(name).register_forward_hook(
            lambda _m, _a, out, name=name: sizes.__setitem__(name, out.numel() * out.element_size())
        )
    inputs, _ = mf.batch(BATCH, step=0)
    model(*inputs)
    cuts = [b.boundary_bytes for b in traced.blocks[:-1]]
    assert cuts == [sizes[name] for name in outputs]
