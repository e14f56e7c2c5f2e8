"""The tracer and blocks against independent references: closed-form FLOPs, Korthikanti's
activation memory, and exact parameter counts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from planner.api import graph_summary, trace
from planner.modelfile import load_model_file

GPT = "examples/gpt.py"


def gpt_closed_form_flops(b: int, s: int, h: int, L: int, V: int) -> int:
    """Forward matmul FLOPs of our GPT, derived from its definition (not from the tracer).

    Per layer: Q, K, V and the output projection are four h x h products, the MLP two
    h x 4h products: 12 h^2 multiply-adds per token; QK^T and PV are b*s*s*h each. The head is
    an h x V product per token. 2 FLOPs per multiply-add; backward is twice forward."""
    per_token = 12 * L * h * h + V * h
    forward = 2 * b * s * per_token + 2 * 2 * b * s * s * h * L
    return 3 * forward


@pytest.mark.parametrize(
    "dims",
    [
        dict(layers=3, hidden=256, heads=4, seq_len=128, vocab=1000),
        dict(layers=2, hidden=1024, heads=16, seq_len=512, vocab=8192),
    ],
)
def test_gpt_flops_match_closed_form(dims, tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    b = 2
    traced = trace(GPT, {"size": "tiny", **dims}, traced_batch_size=b)
    total = sum(x.fwd_flops + x.bwd_flops for x in traced.blocks)
    expected = gpt_closed_form_flops(
        b, dims["seq_len"], dims["hidden"], dims["layers"], dims["vocab"]
    )
    assert abs(total - expected) / expected < 0.01


def _layer(traced):
    layers = [x for x in traced.blocks if x.label == "Block"]
    assert layers, [x.label for x in traced.blocks]
    return layers[0]


@pytest.mark.parametrize("s,h,a", [(2048, 2048, 16), (1024, 1024, 8)])
def test_saved_activations_with_dropout_match_korthikanti(s, h, a, tmp_path, monkeypatch):
    """16-bit activations, 1-byte dropout masks: s*b*h*(34 + 5*a*s/h) per layer."""
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    b = 1
    args = dict(size="tiny", layers=2, hidden=h, heads=a, seq_len=s, vocab=512, dropout=0.1)
    traced = trace(GPT, args, traced_batch_size=b, dtype="bf16")
    expected = s * b * h * (34 + 5 * a * s / h)
    assert abs(_layer(traced).saved_bytes - expected) / expected < 0.05


def test_saved_activations_without_dropout_match_derived_formula(tmp_path, monkeypatch):
    """Without dropout the three masks (2 x sbh residual, a*s*s*b attention) and the dropout
    output (2*a*s*s*b) disappear, and PV reads the softmax output itself:
    s*b*h*(34 - 2) + 2*a*s*s*b = s*b*h*(32 + 2*a*s/h)."""
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    s, h, a, b = 2048, 2048, 16, 1
    args = dict(size="tiny", layers=2, hidden=h, heads=a, seq_len=s, vocab=512, dropout=0.0)
    traced = trace(GPT, args, traced_batch_size=b, dtype="bf16")
    expected = s * b * h * (32 + 2 * a * s / h)
    assert abs(_layer(traced).saved_bytes - expected) / expected < 0.05


def test_selective_recompute_drops_the_attention_scores(tmp_path, monkeypatch):
    """Korthikanti's selective recompute keeps s*b*h*34 per layer."""
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    s, h, a, b = 2048, 2048, 16, 1
    args = dict(size="tiny", layers=2, hidden=h, heads=a, seq_len=s, vocab=512, dropout=0.1)
    traced = trace(GPT, args, traced_batch_size=b, dtype="bf16")
    expected = s * b * h * 34
    assert abs(_layer(traced).saved_selective_bytes - expected) / expected < 0.05


@pytest.mark.parametrize(
    "path,args",
    [
        ("examples/gpt.py", {"size": "tiny"}),
        ("examples/llama.py", {"size": "tiny"}),
        ("examples/mlp.py", {"size": "tiny"}),
    ],
)
def test_parameter_counts_are_exact(path, args, tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    traced = trace(path, args, dtype="fp32")
    model = load_model_file(path, args).build()
    unique = sum(p.numel() for p in model.parameters())  # parameters() skips tied duplicates
    assert traced.params == unique
    assert sum(b.params for b in traced.blocks) == unique
    assert traced.note == ""  # traced by torch.export, no fallback


def test_tied_embedding_counts_once(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    src = (
        "import torch\nfrom torch import nn\n"
        "class M(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.emb = nn.Embedding(50, 8)\n"
        "        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))\n"
        "        self.head = nn.Linear(8, 50, bias=False)\n"
        "        self.head.weight = self.emb.weight\n"
        "    def forward(self, x):\n"
        "        h = self.emb(x)\n"
        "        for l in self.layers:\n"
        "            h = torch.relu(l(h))\n"
        "        return self.head(h)\n"
        "def build_model():\n    return M()\n"
        "def make_batch(b, step=0):\n"
        "    x = torch.zeros(b, 4, dtype=torch.long)\n    return x, x\n"
    )
    f = tmp_path / "tied.py"
    f.write_text(src)
    traced = trace(f, dtype="fp32")
    expected = 50 * 8 + 3 * (8 * 8 + 8)
    assert traced.params == expected
    assert sum(b.params for b in traced.blocks) == expected
    assert [b.name for b in traced.blocks] == ["emb", "layers.0", "layers.1", "layers.2", "head"]


def test_96_layer_gpt_is_one_class_of_96(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    args = dict(size="gpt3-175b", hidden=64, heads=4, seq_len=32, vocab=128)
    traced = trace(GPT, args, dtype="bf16")
    summary = graph_summary(traced)
    assert summary["model"]["classes"]["Block"] == 96
    assert len(traced.blocks) == 98  # embeddings, 96 layers, final norm + head
    assert len({b.cls for b in traced.blocks if b.label == "Block"}) == 1


def test_llama_and_mlp_trace_into_blocks(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    llama = trace("examples/llama.py", {"size": "tiny"})
    names = [b.name for b in llama.blocks]
    assert "model.layers.0" in names and "model.layers.1" in names
    assert llama.blocks[0].params > 0 and llama.blocks[-1].params > 0
    assert llama.blocks[1].cls == llama.blocks[2].cls
    assert sum(b.fwd_flops for b in llama.blocks) > 0
    mlp = trace("examples/mlp.py", {"size": "tiny"}, dtype="fp32")
    layer_classes = {b.cls for b in mlp.blocks if b.member}
    assert len(layer_classes) == 1 and sum(b.member for b in mlp.blocks) >= 4


def test_cache_hit_returns_the_same_graph(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    first = trace(GPT, {"size": "tiny"})
    second = trace(GPT, {"size": "tiny"})
    assert not first.from_cache and second.from_cache
    assert graph_summary(first) == graph_summary(second)
    other_batch = trace(GPT, {"size": "tiny"}, traced_batch_size=2)
    assert not other_batch.from_cache
    # activations scale with the batch; the s x s causal mask does not (it is 2% of this one)
    assert other_batch.blocks[1].saved_bytes == pytest.approx(
        2 * first.blocks[1].saved_bytes, rel=0.02
    )


def test_cache_hit_names_the_file_it_was_asked_for(tmp_path, monkeypatch):
    """The cache is keyed by content: a copy elsewhere hits it, but the graph (and so the plan)
    must name the copy, which is the file that exists now."""
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "cache"))
    copy = tmp_path / "copy" / "gpt.py"
    copy.parent.mkdir()
    copy.write_bytes(Path(GPT).read_bytes())
    first = trace(GPT, {"size": "tiny"})
    second = trace(copy, {"size": "tiny"})
    assert second.from_cache
    assert graph_summary(first)["model"]["file"] == str(Path(GPT).resolve())
    assert graph_summary(second)["model"]["file"] == str(copy.resolve())


def test_fallback_to_module_hooks_when_export_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    src = (
        "import torch\nfrom torch import nn\n"
        "class M(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))\n"
        "    def forward(self, x):\n"
        "        for l in self.layers:\n"
        "            x = l(x)\n"
        "            if x.sum() > 0:  # data-dependent control flow: export cannot trace it\n"
        "                x = x * 2\n"
        "        return x\n"
        "def build_model():\n    return M()\n"
        "def make_batch(b, step=0):\n"
        "    return torch.ones(b, 8), torch.zeros(b, dtype=torch.long)\n"
    )
    f = tmp_path / "branchy.py"
    f.write_text(src)
    # On meta tensors the branch itself cannot run either: the error names the module.
    from planner.errors import UserInputError

    with pytest.raises(UserInputError, match="cannot trace"):
        trace(f, dtype="fp32")


ODD_OUTPUT = (
    "import torch\nfrom torch import nn\n"
    "class Out:\n"
    "    def __init__(self, logits):\n"
    "        self.logits = logits\n"
    "class Odd(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))\n"
    "    def forward(self, x):\n"
    "        for l in self.layers:\n"
    "            x = l(x)\n"
    "        return Out(x)\n"
    "def build_model():\n    return Odd()\n"
    "def make_batch(b, step=0):\n"
    "    return torch.ones(b, 8), torch.zeros(b, dtype=torch.long)\n"
)


def test_a_model_export_cannot_trace_gets_no_pipeline(tmp_path, monkeypatch):
    """torch's pipelining cuts a model into stages by tracing it with torch.export: a model
    only the module-level trace could follow is planned without a pipeline (LongT5's was
    planned with one, and every worker then crashed building its stages), and a pinned --pp
    is refused in one line."""
    from planner.api import plan
    from planner.errors import UserInputError
    from planner.search import Pins

    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    f = tmp_path / "odd.py"
    f.write_text(ODD_OUTPUT)
    result = plan(f, 4, profile="cpu", dtype="fp32", global_batch_size=8)
    assert result.plan.mesh.pp == 1
    assert all(c.pp == 1 for c in result.search.candidates)
    with pytest.raises(UserInputError, match="--pp 2: torch.export could not trace the model"):
        plan(f, 4, profile="cpu", dtype="fp32", global_batch_size=8, pins=Pins(pp=2))


def test_hook_fallback_graph(tmp_path, monkeypatch):
    """A model that export rejects (its output is an unregistered class) but that runs on meta
    tensors is traced by module hooks, and the user is told so."""
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    f = tmp_path / "odd.py"
    f.write_text(ODD_OUTPUT)
    traced = trace(f, dtype="fp32", traced_batch_size=4)
    assert "fell back to module-level tracing" in traced.note
    assert traced.params == 3 * (8 * 8 + 8)
    assert sum(b.params for b in traced.blocks) == traced.params
    assert [b.name for b in traced.blocks] == ["layers.0", "layers.1", "layers.2"]
    # three Linear layers of 4 x 8 x 8 multiply-adds
    assert sum(b.fwd_flops for b in traced.blocks) == 3 * 2 * 4 * 8 * 8
    # both tracing paths write the OpGraph's documented node schema, and the cache keeps it
    from planner.trace.graph import OpGraph, check_op_graph

    assert isinstance(traced.graph, OpGraph) and check_op_graph(traced.graph) == []
    exported = trace(GPT, {"size": "tiny"}, dtype="fp32")
    assert check_op_graph(exported.graph) == []
    again = trace(GPT, {"size": "tiny"}, dtype="fp32")
    assert again.from_cache and isinstance(again.graph, OpGraph)
    assert check_op_graph(again.graph) == []


def test_matmul_inner_dimensions():
    from planner.trace.export import matmul_inner_dims

    # x[2, 16, 64] @ W[32, 64]^T: forward over 64, dX over 32, dW over all 32 tokens
    assert matmul_inner_dims("aten.linear.default", [[2, 16, 64], [32, 64]], [2, 16, 32]) == [
        64,
        32,
        32,
        True,
    ]
    # scores q[2, 4, 16, 8] @ k^T[2, 4, 8, 16]: per head, over 8, 16 and 16 (not the batch)
    assert matmul_inner_dims(
        "aten.matmul.default", [[2, 4, 16, 8], [2, 4, 8, 16]], [2, 4, 16, 16]
    ) == [8, 16, 16, False]
    assert matmul_inner_dims("aten.addmm.default", [[32], [10, 64], [64, 32]], [10, 32]) == [
        64,
        32,
        10,
        True,
    ]
    assert matmul_inner_dims("aten.add.Tensor", [[2, 3], [2, 3]], [2, 3]) is None


def test_attention_with_narrower_value_heads_has_the_value_head_size():
    """DeepSeek's MLA: query/key heads of 24, value heads of 16. The fused kernel's output
    has the value's head size (the meta kernel shapes it like q; the tracer pads v and cuts
    the output back), so the output projection reads 4 heads x 16."""
    traced = trace(
        "tests/models/deepseek_v3.py",
        {"dense": True},
        traced_batch_size=2,
        dtype="fp32",
        use_cache=False,
    )
    g = traced.graph
    sdpa = [n for n in g.nodes if g.nodes[n]["op"] == "aten.scaled_dot_product_attention.default"]
    assert sdpa and all(g.nodes[n]["shapes"][0] == [2, 4, 32, 16] for n in sdpa)


def test_a_shape_error_export_reached_is_not_reported_as_data_dependent_code():
    """The module trace that follows a failed torch.export runs on meta tensors and may stop
    at an ``.item()`` that export's fake tensors passed (a transformers config whose rotary
    size does not match its heads failed so): the error names export's shape error, not
    data-dependent sizes. A data-dependent export failure keeps its hint."""
    from types import SimpleNamespace

    from planner.errors import UserInputError
    from planner.trace.export import _trace_with_hooks

    class ReadsAValue(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.l(x) * x.sum().item()

    mf = SimpleNamespace(path=Path("m.py"))
    with torch.device("meta"):
        model, x = ReadsAValue(), torch.randn(2, 4)
    shape = RuntimeError("a and b must have same reduction dim, but got [2, 8] X [7, 3].")
    with pytest.raises(UserInputError) as err:
        _trace_with_hooks(mf, model, (x,), shape)
    assert "its forward fails under torch.export: RuntimeError: a and b must" in str(err.value)
    assert "tensor values" not in str(err.value)
    data = RuntimeError("Could not guard on data-dependent expression u0 > 0")
    with pytest.raises(UserInputError) as err:
        _trace_with_hooks(mf, model, (x,), data)
    # a dense model: the hint is about its branch or check, not about experts
    assert "decides what to do from tensor values" in str(err.value)
    assert "depend on shapes only" in str(err.value) and "grouped_mm" not in str(err.value)
    with torch.device("meta"):
        moe = torch.nn.ModuleDict({"experts": ReadsAValue()})
    moe.forward = moe["experts"].forward
    with pytest.raises(UserInputError) as err:
        _trace_with_hooks(mf, moe, (x,), data)
    assert "sizes its work from tensor values" in str(err.value)
    assert "grouped_mm" in str(err.value)


POOLED_BATCHNORM = (
    "import torch\nfrom torch import nn\n"
    "TRAINING = {'global_batch_size': 8, 'optimizer': 'sgd', 'dtype': 'fp32'}\n"
    "class Net(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.layers = nn.ModuleList(\n"
    "            nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU())\n"
    "            for _ in range(4)\n"
    "        )\n"
    "        self.head = nn.Linear(16, 4)\n"
    "    def forward(self, x):\n"
    "        for layer in self.layers:\n"
    "            x = layer(x)\n"
    "        return self.head(x)\n"
    "def build_model():\n    return Net()\n"
    "def make_batch(b, step=0):\n"
    "    g = torch.Generator().manual_seed(step)\n"
    "    return torch.randn(b, 16, generator=g), torch.randint(0, 4, (b,), generator=g)\n"
)


def test_a_batchnorm_over_features_is_traced_and_never_given_one_sample(tmp_path, monkeypatch):
    """A BatchNorm over [batch, features] (LeViT's, MobileViT's after pooling) has one value
    per channel per sample, and torch refuses a training forward on one: such models could
    not be traced at all (the trace ran one sample). The trace now runs two, its per-sample
    numbers unchanged, and no plan gives such a BatchNorm a lone sample: a pipeline without
    data parallelism gets micro-batches of at least 2, and a pinned micro-batch of 1 is
    refused in one line."""
    from planner.api import plan
    from planner.errors import UserInputError
    from planner.search import Pins

    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    f = tmp_path / "pooled_bn.py"
    f.write_text(POOLED_BATCHNORM)
    traced = trace(f, dtype="fp32")
    assert traced.traced_batch_size == 2
    four = trace(f, dtype="fp32", traced_batch_size=4)
    assert four.traced_batch_size == 4
    assert sum(b.fwd_flops for b in four.blocks) == 2 * sum(b.fwd_flops for b in traced.blocks)
    result = plan(f, 2, profile="cpu", pins=Pins(pp=2, dp=1))
    assert result.plan.micro_batch_size >= 2
    assert all(c.micro_batch_size * c.dp >= 2 for c in result.search.candidates)
    # with two replicas a synchronized BatchNorm spans their micro-batches of one together
    assert plan(f, 2, profile="cpu", pins=Pins(dp=2, micro_batch_size=1)).plan.mesh.dp == 2
    with pytest.raises(UserInputError, match="pin --micro-batch-size 2 or more"):
        plan(f, 2, profile="cpu", pins=Pins(pp=2, dp=1, micro_batch_size=1))


def test_a_plan_says_when_batchnorm_sees_less_than_the_global_batch(tmp_path, monkeypatch):
    """Micro-batches change what a BatchNorm normalises: the plan says so, with the pin that
    keeps one process's statistics, and says nothing when one micro-batch per replica keeps
    them."""
    from planner.api import plan
    from planner.search import Pins

    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    f = tmp_path / "pooled_bn.py"
    f.write_text(POOLED_BATCHNORM)
    split = plan(f, 2, profile="cpu", pins=Pins(pp=2, dp=1, micro_batch_size=2))
    said = [n for n in split.notes if n.startswith("BatchNorm:")]
    assert said == [
        "BatchNorm: statistics over 2 samples per micro-batch, where one process taking the "
        "global batch at once normalises all 8; pin --micro-batch-size 8 (one micro-batch per "
        "replica) to train as that process does"
    ]
    whole = plan(f, 2, profile="cpu", pins=Pins(dp=2, micro_batch_size=4))
    assert not [n for n in whole.notes if n.startswith("BatchNorm:")]


def test_parameters_the_forward_never_reads_are_listed_in_the_plan(tmp_path, monkeypatch):
    """A parameter no op of the traced forward reads gets no gradient: the plan lists it, for
    the runtime's DDP to skip (it waited for it and failed the second step)."""
    from planner.api import plan

    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    f = tmp_path / "unread.py"
    f.write_text(
        "import torch\nfrom torch import nn\n"
        "class M(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))\n"
        "        self.mask_token = nn.Parameter(torch.zeros(8))\n"
        "    def forward(self, x, mask=None):\n"
        "        if mask is not None:\n"
        "            x = torch.where(mask[..., None], self.mask_token, x)\n"
        "        for layer in self.layers:\n"
        "            x = layer(x)\n"
        "        return x\n"
        "def build_model():\n    return M()\n"
        "def make_batch(b, step=0):\n"
        "    return torch.ones(b, 8), torch.zeros(b, dtype=torch.long)\n"
    )
    traced = trace(f, dtype="fp32")
    assert traced.graph.graph["unread_params"] == ["mask_token"]
    assert plan(f, 2, profile="cpu", dtype="fp32").plan.model.unread_params == ["mask_token"]


def test_layers_whose_forward_the_model_calls_directly_are_named_in_the_plan():
    """``layer.forward(h)`` skips the layer's hooks (the runtime's FSDP2, checkpoint and
    sequence-parallel styles live there): the trace names the layers so called, only them
    (not the ModuleList holding them, nor their submodules, called as usual), and plan.json
    carries the names and loads them back; a model calling everything through ``__call__``
    writes no such key."""
    import json

    from planner.api import plan
    from planner.schema import dumps, plan_from_dict

    models = Path(__file__).parent / "models"
    layers = [f"encoder.layers.{i}" for i in range(3)]
    assert trace(models / "direct_forward.py", dtype="fp32").graph.graph["direct_forward"] == layers
    written = json.loads(dumps(plan(models / "direct_forward.py", 2, profile="cpu").plan))
    assert written["model"]["direct_forward"] == layers
    assert plan_from_dict(written).model.direct_forward == layers
    usual = plan(models / "masked_logits.py", 2, profile="cpu").plan
    assert usual.model.direct_forward is None
    assert "direct_forward" not in json.loads(dumps(usual))["model"]


def test_a_parameter_made_by_a_legacy_constructor_is_traced_on_meta(tmp_path, monkeypatch):
    """``torch.FloatTensor(...)`` allocates on the CPU whatever the default device (XLNet
    builds its attention weights so): the meta trace met a CPU weight and refused the model.
    Such parameters are moved to the meta device, ties kept."""
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    f = tmp_path / "legacy.py"
    f.write_text(
        "import torch\nfrom torch import nn\n"
        "class M(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.q = nn.Parameter(torch.FloatTensor(8, 2, 4).normal_())\n"
        "        self.inner = nn.Module()\n"
        "        self.inner.q = self.q\n"
        "        self.out = nn.Linear(8, 8)\n"
        "    def forward(self, x):\n"
        "        h = torch.einsum('bh,hnd->bnd', x, self.inner.q).flatten(1)\n"
        "        return self.out(h)\n"
        "def build_model():\n    return M()\n"
        "def make_batch(b, step=0):\n"
        "    return torch.ones(b, 8), torch.zeros(b, dtype=torch.long)\n"
    )
    traced = trace(f, dtype="fp32")
    assert traced.params == 8 * 2 * 4 + 8 * 8 + 8  # the shared weight once
    assert traced.graph.graph["param_owner"]["inner.q"] == "q"


CUSTOM_BACKWARD = (
    "import torch\nfrom torch import nn\n"
    "class RoundSTE(torch.autograd.Function):\n"
    "    @staticmethod\n"
    "    def forward(ctx, x):\n"
    "        return torch.round(x * 4) / 4\n"
    "    @staticmethod\n"
    "    def backward(ctx, g):\n"
    "        return g  # straight through: not the gradient of round\n"
    "class M(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))\n"
    "    def forward(self, x):\n"
    "        for layer in self.layers:\n"
    "            x = RoundSTE.apply(layer(x))\n"
    "        return x\n"
    "def build_model():\n    return M()\n"
    "def make_batch(b, step=0):\n"
    "    return torch.ones(b, 8), torch.zeros(b, dtype=torch.long)\n"
)


def test_a_model_with_its_own_backward_gets_no_pipeline(tmp_path, monkeypatch):
    """torch's pipelining runs each stage as the exported forward and differentiates its ops,
    so a torch.autograd.Function's own backward (YOSO's attention, a straight-through
    estimator) is lost: YOSO trained another model under PP 2 (its first step matched, every
    later one drifted). The trace records such functions; no pipeline is planned for them,
    and a pinned --pp is refused in one line naming the function."""
    from planner.api import plan
    from planner.errors import UserInputError
    from planner.search import Pins

    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    f = tmp_path / "ste.py"
    f.write_text(CUSTOM_BACKWARD)
    traced = trace(f, dtype="fp32")
    assert traced.graph.graph["custom_backward"] == ["RoundSTE"]
    result = plan(f, 4, profile="cpu", dtype="fp32", global_batch_size=8)
    assert all(c.pp == 1 for c in result.search.candidates)
    with pytest.raises(UserInputError, match="--pp 2: the model applies RoundSTE"):
        plan(f, 4, profile="cpu", dtype="fp32", global_batch_size=8, pins=Pins(pp=2))
    # inside a module of one tensor in and out a stage runs it eagerly, its backward kept
    # (the oracle case ste-custom-backward-pp2 trains it so)
    kept = trace(Path(__file__).parent / "models" / "ste.py", dtype="fp32")
    assert kept.graph.graph["custom_backward"] == []


TIED_AUTOENCODER = """
import torch
import torch.nn.functional as F
from torch import nn

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}


class TiedAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(32, 128)
        self.dec_bias = nn.Parameter(torch.zeros(32))

    def forward(self, x):
        return F.linear(torch.tanh(self.enc(x)), self.enc.weight.t(), self.dec_bias)


def build_model():
    return TiedAE()


def make_batch(batch_size, step=0):
    x = torch.randn(batch_size, 32, generator=torch.Generator().manual_seed(step))
    return x, x


def loss_fn(out, y):
    return F.mse_loss(out, y)
"""


def test_a_pinned_tp_with_nothing_to_split_says_why(tmp_path, monkeypatch):
    """The autoencoder's only weight is also its decoder's transpose, so it stays whole (a
    weight read outside its module counts as tied): --tp 2 is refused saying that no layer can
    be split, not that 2 fails to divide the GPU count or the dimensions."""
    from planner.api import plan
    from planner.errors import UserInputError
    from planner.search import Pins

    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    f = tmp_path / "tied_ae.py"
    f.write_text(TIED_AUTOENCODER)
    with pytest.raises(UserInputError, match="--tp 2: no layer of this model can be split"):
        plan(f, 2, profile="cpu", dtype="fp32", pins=Pins(tp=2))


SPECTRAL_NORM = """
import torch
from torch import nn

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.utils.parametrizations.spectral_norm(nn.Linear(16, 64))
        self.norm = nn.BatchNorm1d(64)
        self.b = nn.Linear(64, 10)

    def forward(self, x):
        return self.b(torch.tanh(self.norm(self.a(x))))


def build_model():
    return Net()


def make_batch(batch_size, step=0):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(batch_size, 16, generator=g)
    return x, torch.randint(0, 10, (batch_size,), generator=g)
"""


def test_buffers_the_forward_updates_are_found_and_named_under_data_parallelism(
    tmp_path, monkeypatch
):
    """A spectral norm runs a power iteration on its buffers in every training forward (DP 2
    trained it off one process from the first loss, by 9e-5): the trace finds them (torch.export
    lists no such update), not the BatchNorm's running statistics, which the plan's batchnorm
    field keeps; a plan with data-parallel replicas names them with the pin that keeps them."""
    from planner.api import plan
    from planner.search import Pins

    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    f = tmp_path / "spectral.py"
    f.write_text(SPECTRAL_NORM)
    traced = trace(f, dtype="fp32")
    assert traced.graph.graph["forward_state"] == [
        "a.parametrizations.weight.0._u",
        "a.parametrizations.weight.0._v",
    ]
    replicas = plan(f, 2, profile="cpu", dtype="fp32", pins=Pins(dp=2))
    notes = [n for n in replicas.notes if n.startswith("buffers or weights the forward updates")]
    assert len(notes) == 1 and "a.parametrizations.weight.0._u" in notes[0]
    assert "--dp 1" in notes[0]
    one = plan(f, 2, profile="cpu", dtype="fp32", pins=Pins(dp=1))
    assert not [n for n in one.notes if n.startswith("buffers or weights the forward updates")]
    resnet = trace(Path(__file__).parent.parent / "examples" / "resnet.py", dtype="fp32")
    assert resnet.graph.graph["forward_state"] == []


MAX_NORM = """
import torch
from torch import nn

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 16, max_norm=1.0)
        self.head = nn.Linear(16, 64)

    def forward(self, x):
        return self.head(self.embed(x))


def build_model():
    return Net()


def make_batch(batch_size, step=0):
    g = torch.Generator().manual_seed(step)
    x = torch.randint(0, 64, (batch_size, 4), generator=g)
    return x, torch.randint(0, 64, (batch_size, 4), generator=g)


def loss_fn(out, y):
    return nn.functional.cross_entropy(out.reshape(-1, 64), y.reshape(-1))
"""


def test_a_weight_the_forward_renormalises_in_place_is_named_under_data_parallelism(
    tmp_path, monkeypatch
):
    """An ``nn.Embedding(max_norm=...)`` rescales the rows it looks up in place in every
    forward: each data-parallel replica renormalises only its own samples' rows, so the
    replicas and one process part (DDP at DP 2 ended 7.35 from one process in the embedding,
    exit 0). The trace finds the weight among what the forward updates, and a plan with
    replicas says so with the pin that keeps one process's numbers."""
    from planner.api import plan
    from planner.search import Pins

    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    f = tmp_path / "max_norm.py"
    f.write_text(MAX_NORM)
    assert trace(f, dtype="fp32").graph.graph["forward_state"] == ["embed.weight"]
    notes = plan(f, 2, profile="cpu", dtype="fp32", pins=Pins(dp=2)).notes
    said = [n for n in notes if n.startswith("buffers or weights the forward updates")]
    assert len(said) == 1 and "embed.weight" in said[0] and "--dp 1" in said[0]
    # under TP the weight stays whole (DTensor has no embedding_renorm_: a vocabulary-parallel
    # split crashed every worker); the head still splits
    blocks = plan(f, 2, profile="cpu", dtype="fp32", pins=Pins(tp=2, tp_variant="sharded"))
    styles = {b.name: b.tp_plan for b in blocks.plan.blocks}
    assert styles["embed"] == {} and styles["head"]


LISTED_TWICE = """
import torch
from torch import nn

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.proj = nn.Linear(16, 16)

    def forward(self, h):
        return h + self.proj(self.norm(h))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 16)
        shared = Block()
        self.layers = nn.ModuleList([Block(), shared, shared, shared, Block()])
        self.head = nn.Linear(16, 64)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def build_model():
    return Net()


def make_batch(batch_size, step=0):
    g = torch.Generator().manual_seed(step)
    x = torch.randint(0, 64, (batch_size, 4), generator=g)
    return x, torch.randint(0, 64, (batch_size, 4), generator=g)


def loss_fn(out, y):
    return nn.functional.cross_entropy(out.reshape(-1, 64), y.reshape(-1))
"""


def test_a_block_listed_twice_gets_no_pipeline(tmp_path, monkeypatch):
    """``nn.ModuleList([block] * n)`` lists one module under several names; torch.export's
    unflatten, with which torch's pipelining cuts stages, then refuses cuts at the blocks
    (every worker stopped with "cannot cut"): the trace names the listing, the search plans
    no pipeline for it, and a pinned --pp is refused in one line naming it."""
    from planner.api import plan
    from planner.errors import UserInputError
    from planner.search import Pins

    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    f = tmp_path / "listed_twice.py"
    f.write_text(LISTED_TWICE)
    listed = [["layers.1", "layers.2", "layers.3"]]
    assert trace(f, dtype="fp32").graph.graph["shared_modules"] == listed
    assert plan(f, 4, profile="cpu", dtype="fp32").plan.mesh.pp == 1
    with pytest.raises(UserInputError, match=r"--pp 2: .*layers\.1, layers\.2, layers\.3"):
        plan(f, 2, profile="cpu", dtype="fp32", pins=Pins(pp=2))


def test_long_messages_are_cut_at_a_word_with_an_ellipsis():
    """torch's messages are cut for one-line errors at a word boundary, marked, never mid-word;
    short ones stay whole and on one line."""
    from planner.errors import brief

    text = "Could not guard on\nmodel.layers.0.lifted_tensor_0 " + "word " * 200
    cut = brief(text, 60)
    assert cut.endswith(" ...") and len(cut) <= 64
    assert all(w in text.split() for w in cut[:-4].split())
    assert brief("short\nmessage") == "short message"


def test_the_trace_records_no_stack_traces_and_is_the_graph_it_was_with_them(tmp_path, monkeypatch):
    """The tracer's export runs with torch.fx's stack-trace recording off (planner.fx_stacks:
    a fifth of a small model's tracing CPU). The graph and blocks are those of a trace that
    records them, the switch is on inside the export and back to the caller's after it, also
    after an export that fails."""
    import contextlib

    import torch.fx.config

    import planner.trace.export as export_mod
    from planner.fx_stacks import stack_traces_off
    from planner.trace.export import trace_model

    inside = []
    real_export = torch.export.export

    def watched(*args, **kwargs):
        inside.append(torch.fx.config.do_not_emit_stack_traces)
        program = real_export(*args, **kwargs)
        inside.append(sum("stack_trace" in n.meta for n in program.graph.nodes))
        return program

    monkeypatch.setattr(torch.export, "export", watched)
    mf = load_model_file(GPT, {"size": "tiny"})
    quiet = trace_model(mf, 2, "fp32")
    assert inside == [True, 0]
    assert torch.fx.config.do_not_emit_stack_traces is False
    monkeypatch.setattr(export_mod, "stack_traces_off", contextlib.nullcontext)
    inside.clear()
    loud = trace_model(load_model_file(GPT, {"size": "tiny"}), 2, "fp32")
    assert inside[0] is False and inside[1] > 0  # the switch is live: torch records them
    assert list(quiet.graph.nodes(data=True)) == list(loud.graph.nodes(data=True))
    assert list(quiet.graph.edges(data=True)) == list(loud.graph.edges(data=True))
    assert quiet.graph.graph == loud.graph.graph
    with pytest.raises(RuntimeError), stack_traces_off():
        raise RuntimeError("an export that fails")
    assert torch.fx.config.do_not_emit_stack_traces is False
