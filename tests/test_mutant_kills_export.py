"""planner/trace/export.py on one tiny model traced with no cache, and its helpers on inputs
small enough to state by hand, for its generated mutants (benchmarks/generated_mutants.py).

The session's trace cache (tests/conftest.py) is never read here: mutmut's children share it,
and the trace key's code hash is the same for every mutant, so a mutated tracer would read the
clean trace. ``trace_model`` (which has no cache) runs in the test body, once a model.

The model (fp32, one sample of 3 tokens, hidden 8): a frozen embedding (16 x 8), a Linear
8 -> 8 with bias, ReLU, dropout, a product with an 8-wide buffer, grouped-query attention with a
causal mask built from shapes (2 query heads of 4, 1 key/value head repeated as transformers
repeats it), a Linear 8 -> 16 head; an unread parameter and a buffer counted in place.
"""

from __future__ import annotations

import operator
from types import SimpleNamespace

import pytest
import torch
import torch.fx
from torch import nn

from planner.errors import UserInputError
from planner.modelfile import load_model_file
from planner.trace.export import (
    _compact_grouped,
    _data_dependent,
    _depends_on,
    _export_failure,
    _param_aliases,
    _trace_with_hooks,
    batch_statistics_samples,
    build_meta_model,
    data_dependent_hint,
    direct_forwards,
    element_bytes,
    forward_state,
    matmul_inner_dims,
    meta_inputs,
    op_name,
    shared_modules,
    state_versions,
    tensor_bytes,
    tp_shardable_modules,
    trace_model,
)

NET = """
import torch
from torch import nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.emb.weight.requires_grad_(False)
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(8, 16, bias=False)
        self.spare = nn.Parameter(torch.zeros(2))
        self.register_buffer("scale", torch.ones(8))
        self.register_buffer("steps", torch.zeros(1))

    def forward(self, ids):
        with torch.no_grad():
            self.steps.add_(1)
        x = self.emb(ids)
        h = self.drop(torch.relu(self.fc(x))) * self.scale
        q = h.view(-1, 3, 2, 4).transpose(1, 2)
        kv = h[..., :4].reshape(-1, 1, 3, 4)
        kv = kv.unsqueeze(2).expand(-1, 1, 2, 3, 4).reshape(-1, 2, 3, 4)
        mask = torch.ones(3, 3, dtype=torch.bool).tril()
        a = F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask)
        a = a.transpose(1, 2).reshape(-1, 3, 8)
        return self.head(a)


def build_model():
    return Net()


def make_batch(batch_size, step=0):
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, 16, (batch_size, 3), generator=g)
    return ids, ids
"""
LIN = "aten.linear.default"
# six identical layers on a float input: the first reads the input, the other five repeat
# (one irregular member, a period of one), so the model is traced cut to four and expanded
STACK = """
import torch
from torch import nn


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4, bias=False)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Layer() for _ in range(6)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def build_model():
    return Stack()


def make_batch(batch_size, step=0):
    x = torch.ones(batch_size, 4)
    return (x,), x
"""


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("export") / "net.py"
    path.write_text(NET)
    return load_model_file(path)


# The traces are made in the tests' bodies, one test a model. mutmut records which tests reach
# a function from the calls made while each test runs (a module fixture's calls count for the
# first test using it only) and times each test without its fixtures' setup, killing a mutant's
# run at 15 times that time on the wall clock: a trace made in a fixture would be checked by one
# test only, and time out every mutant that reaches it on a loaded machine.


def test_a_repeating_stack_is_traced_cut_and_written_out_whole(tmp_path, monkeypatch):
    """Defaults: 1 sample in bf16, so each 1 x 4 activation is 8 bytes, each 4 x 4 weight 32;
    a layer's product 2 x 4 x 4 = 32 FLOPs, twice that backward but in the first layer (its
    input needs no gradient); every figure the cut trace could not see written for layers
    4 and 5 as for the others."""
    from planner.trace.repeats import Repeat

    path = tmp_path / "stack.py"
    path.write_text(STACK)
    stack = trace_model(load_model_file(path))  # the defaults: one sample, bf16
    g = stack.graph
    assert (stack.method, stack.repeats) == ("export", [Repeat("layers", 6, 1, 1)])
    names = ["x"] + [f"{op}_{k}" if k else op for k in range(6) for op in ("linear", "relu")]
    assert list(g.nodes) == names
    assert [g.nodes[n]["order"] for n in names] == list(range(13))
    assert g.nodes["x"]["shapes"] == [[1, 4]] and g.nodes["x"]["dtypes"] == ["bfloat16"]
    for k in range(6):
        lin, act = g.nodes[f"linear_{k}" if k else "linear"], g.nodes[f"relu_{k}" if k else "relu"]
        assert (lin["module"], lin["params"]) == (f"layers.{k}.fc", [f"layers.{k}.fc.weight"])
        assert (lin["out_bytes"], lin["fwd_flops"], lin["bwd_flops"]) == (8, 32, 64 if k else 32)
        assert (lin["fwd_bytes"], act["fwd_bytes"], act["module"]) == (48, 16, f"layers.{k}")
    assert sorted(b for _, _, b in g.edges(data="bytes")) == [8] * 12
    f = g.graph
    assert (f["traced_batch_size"], f["dtype"], f["outputs"]) == (1, "bf16", ["relu_5"])
    assert f["param_dtype_bytes"] == {f"layers.{k}.fc.weight": 2 for k in range(6)}
    assert f["tp_modules"] == [f"layers.{k}.fc" for k in range(6)]
    assert f["containers"] == ["layers"] and f["params"] == 6 * 16
    # the loss check ran the model on 1 and 2 samples (float inputs made in the traced dtype);
    # only the default loss then refused its random outputs
    assert f["loss_samples"]["reason"].startswith("loss_fn failed on random outputs")
    from planner.trace.repeats import FULL_TRACE_ENV

    monkeypatch.setenv(FULL_TRACE_ENV, "1")  # forced whole: no repeats, the same graph
    whole = trace_model(load_model_file(path))
    assert whole.repeats == [] and list(whole.graph.nodes) == names


# node -> (op, module, out_bytes, fwd_flops, bwd_flops, fwd_bytes, requires_grad, saved).
# Bytes: a 3 x 8 fp32 activation is 96, the ids 24, emb.weight 512, fc.weight 256, fc.bias
# 32, head.weight 512, the scale 32. fwd_bytes = out + every tensor read (0 for a view);
# bwd_bytes twice that where a gradient flows. The frozen embedding's output needs none, so
# fc pays its weight's gradient only (384 of 2 x 384). Attention: 4 b h s s d = 4 x 2 x 3 x 3
# x 4 = 288 FLOPs; it keeps q (the product's storage: k and v are views of it too, counted
# once), its log-sum-exp (2 heads x 3 x 4 bytes) and its output. Dropout keeps its 1-byte mask.
NODES = {
    "ids": ("input", "", 24, 0, 0, 0, False, []),
    "embedding": ("aten.embedding.default", "emb", 96, 0, 0, 632, False, []),
    "linear": (LIN, "fc", 96, 384, 384, 480, True, [["embedding", 96]]),
    "relu": ("aten.relu.default", "", 96, 0, 0, 192, True, [["relu", 96]]),
    "dropout": ("aten.dropout.default", "drop", 96, 0, 0, 192, True, [["dropout", 24]]),
    "mul": ("aten.mul.Tensor", "", 96, 0, 0, 224, True, []),
    "view": ("aten.view.default", "", 0, 0, 0, 0, True, []),
    "transpose": ("aten.transpose.int", "", 0, 0, 0, 0, True, []),
    "slice_1": ("aten.slice.Tensor", "", 0, 0, 0, 0, True, []),
    "reshape": ("aten.reshape.default", "", 0, 0, 0, 0, True, []),
    "scaled_dot_product_attention": (
        "aten.scaled_dot_product_attention.default", "", 96, 288, 576, 288, True,
        [["mul", 96], ["scaled_dot_product_attention", 24], ["scaled_dot_product_attention", 96]],
    ),
    "transpose_1": ("aten.transpose.int", "", 0, 0, 0, 0, True, []),
    "reshape_2": ("aten.reshape.default", "", 0, 0, 0, 0, True, []),
    "linear_1": (LIN, "head", 192, 768, 1536, 800, True, []),
}  # fmt: skip


def _check_ops_figures(traced) -> None:
    g = traced.graph
    assert (traced.method, traced.note, traced.repeats) == ("export", "", [])
    assert list(g.nodes) == list(NODES)
    for order, (name, want) in enumerate(NODES.items()):
        d = g.nodes[name]
        op, module, out, fwd, bwd, fwd_bytes, grad, saved = want
        got = (d["op"], d["module"], d["out_bytes"], d["fwd_flops"], d["bwd_flops"])
        assert got == (op, module, out, fwd, bwd), name
        assert (d["fwd_bytes"], d["bwd_bytes"]) == (fwd_bytes, 2 * fwd_bytes if grad else 0), name
        assert (d["requires_grad"], d["saved"], d["order"]) == (grad, saved, order), name


def _check_ops_shapes_arguments_and_parameters(traced) -> None:
    g = traced.graph
    assert g.nodes["ids"]["shapes"] == [[1, 3]] and g.nodes["ids"]["dtypes"] == ["int64"]
    assert g.nodes["ids"]["args"] == [] and g.nodes["ids"]["params"] == []
    assert g.nodes["linear"]["shapes"] == [[1, 3, 8]]
    assert g.nodes["linear_1"]["shapes"] == [[1, 3, 16]]
    assert g.nodes["linear_1"]["dtypes"] == ["float32"]
    assert g.nodes["embedding"]["params"] == ["emb.weight"]
    assert g.nodes["linear"]["params"] == ["fc.weight", "fc.bias"]
    assert g.nodes["linear"]["args"] == [
        {"node": "embedding"}, {"param": "fc.weight"}, {"param": "fc.bias"}, {},
    ]  # fmt: skip
    assert g.nodes["mul"]["args"] == [{"node": "dropout"}, {"buffer": "scale"}, {}]
    assert g.nodes["dropout"]["args"] == [{"node": "relu"}, 0.5, True, {}]
    assert g.nodes["view"]["args"] == [{"node": "mul"}, [-1, 3, 2, 4], {}]
    # GEMM inner dimensions: [K, N, the weight gradient's rows (3 tokens), a weight]
    assert g.nodes["linear"]["mm_inner"] == [8, 8, 3, True]
    assert g.nodes["linear_1"]["mm_inner"] == [8, 16, 3, True]
    assert g.nodes["relu"]["mm_inner"] is None


def _check_the_causal_mask_gone_and_grouped_heads_compact(traced) -> None:
    """The mask's ops are gone, the call is causal, and k and v are the one-head tensor
    behind the repeat (its 48 bytes read once each), with enable_gqa."""
    g = traced.graph
    sdpa = g.nodes["scaled_dot_product_attention"]
    assert sdpa["args"] == [
        {"node": "transpose"}, {"node": "reshape"}, {"node": "reshape"},
        {"enable_gqa": True, "attn_mask": None, "is_causal": True},
    ]  # fmt: skip
    assert not any(
        d["op"] in ("aten.ones.default", "aten.tril.default") for _, d in g.nodes(data=True)
    )
    assert sdpa["shapes"] == [[1, 2, 3, 4]]


def _check_edges(traced) -> None:
    assert sorted(traced.graph.edges(data="bytes")) == sorted([
        ("ids", "embedding", 24), ("embedding", "linear", 96), ("linear", "relu", 96),
        ("relu", "dropout", 96), ("dropout", "mul", 96), ("mul", "view", 96),
        ("mul", "slice_1", 96), ("view", "transpose", 96),
        ("transpose", "scaled_dot_product_attention", 96), ("slice_1", "reshape", 48),
        ("reshape", "scaled_dot_product_attention", 48),
        ("scaled_dot_product_attention", "transpose_1", 96), ("transpose_1", "reshape_2", 96),
        ("reshape_2", "linear_1", 96),
    ])  # fmt: skip


def _check_facts(traced, model_file) -> None:
    f = traced.graph.graph
    assert f["outputs"] == ["linear_1"] and f["unread_params"] == ["spare"]
    assert (f["file"], f["sha256"], f["args"]) == (str(model_file.path), model_file.sha256, {})
    assert (f["traced_batch_size"], f["dtype"], f["method"]) == (1, "fp32", "export")
    assert f["params"] == 2 + 128 + 64 + 8 + 128
    assert f["param_shapes"] == {
        "spare": [2], "emb.weight": [16, 8], "fc.weight": [8, 8], "fc.bias": [8],
        "head.weight": [16, 8],
    }  # fmt: skip
    assert f["param_dtype_bytes"] == dict.fromkeys(f["param_shapes"], 4)
    assert f["param_owner"] == {k: k for k in f["param_shapes"]}
    assert f["modules"] == {
        "": "Net", "emb": "Embedding", "fc": "Linear", "drop": "Dropout", "head": "Linear",
    }  # fmt: skip
    assert f["containers"] == [] and f["experts"] == {} and f["torch_version"] == torch.__version__
    assert f["tp_modules"] == ["emb", "fc", "head"]
    assert f["custom_backward"] == [] and f["numpy_draws"] == []
    assert f["direct_forward"] == [] and f["shared_modules"] == []
    assert f["forward_state"] == ["steps"]  # the counter the forward adds to, not the scale
    assert f["loss_samples"]["checked"] is True


def test_a_tiny_model_traced_by_hand(model_file):
    """The model of the module's docstring, traced with no cache: every op's figures, its
    arguments, the attention's rewrite, the edges and the model's facts (the helpers above)."""
    traced = trace_model(model_file, traced_batch_size=1, dtype="fp32")
    _check_ops_figures(traced)
    _check_ops_shapes_arguments_and_parameters(traced)
    _check_the_causal_mask_gone_and_grouped_heads_compact(traced)
    _check_edges(traced)
    _check_facts(traced, model_file)


# --------------------------------------------------------------------------- the hooks path


def test_the_hook_trace_has_one_node_per_leaf_module_call(model_file):
    """fc: 2 x 24 outputs x 8 inputs FLOPs, its weight's gradient only (the embedding is
    frozen); head: 2 x 48 x 8, both gradients. Bytes as on the export path (the weights read
    too); the one edge is the embedding's output into fc (relu and attention are no modules)."""
    model = build_meta_model(model_file, "fp32")
    with torch.device("meta"):
        g = _trace_with_hooks(model_file, model, meta_inputs(model_file, 1, "fp32"), None)
    assert list(g.nodes) == ["emb#0", "fc#1", "drop#2", "head#3"]
    want = {
        "emb#0": ("module.Embedding", "emb", 96, 0, 0, 632, ["emb.weight"], []),
        "fc#1": ("module.Linear", "fc", 96, 384, 384, 480, ["fc.weight", "fc.bias"],
                 [["emb#0", 96]]),
        "drop#2": ("module.Dropout", "drop", 96, 0, 0, 192, [], [[None, 96]]),
        "head#3": ("module.Linear", "head", 192, 768, 1536, 800, ["head.weight"], [[None, 96]]),
    }  # fmt: skip
    for order, (name, (op, module, out, fwd, bwd, io, params, saved)) in enumerate(want.items()):
        d = g.nodes[name]
        assert (d["op"], d["module"], d["order"], d["out_bytes"]) == (op, module, order, out)
        assert (d["fwd_flops"], d["bwd_flops"], d["fwd_bytes"]) == (fwd, bwd, io), name
        assert (d["bwd_bytes"], d["requires_grad"]) == (2 * io, True), name
        assert (d["params"], d["saved"], d["args"], d["mm_inner"]) == (params, saved, [], None)
        assert d["dtypes"] == ["float32"]
    assert g.nodes["head#3"]["shapes"] == [[1, 3, 16]]
    assert list(g.edges(data="bytes")) == [("emb#0", "fc#1", 96)]
    assert g.graph["outputs"] == ["head#3"]


class _Square(nn.Module):
    def forward(self, x):
        return x * x  # saves x twice: one storage, counted once


class _Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(2, 4, 3)
        self.sq = _Square()
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.sq(self.conv(x)))


def test_a_convolution_pays_its_outputs_times_its_kernel(tmp_path):
    """Conv1d 2 -> 4, kernel 3, on a length-5 input: 4 x 3 outputs, 2 x 12 x (2 x 3) FLOPs;
    its input needs no gradient (1 gradient); the square saves the convolution's output twice
    (one storage: recorded once); the ReLU has no parameters and an input that needs one."""
    mf = SimpleNamespace(path=tmp_path / "conv.py")
    x = torch.zeros(1, 2, 5)
    g = _trace_with_hooks(mf, _Conv(), (x,), RuntimeError("x"))
    conv, act = g.nodes["conv#0"], g.nodes["act#2"]
    assert (conv["fwd_flops"], conv["bwd_flops"]) == (144, 144)
    assert conv["fwd_bytes"] == 4 * (10 + 12 + 24 + 4)
    assert (act["fwd_flops"], act["bwd_flops"], act["requires_grad"]) == (0, 0, True)
    assert act["params"] == [] and conv["params"] == ["conv.weight", "conv.bias"]
    assert g.nodes["sq#1"]["saved"] == [["conv#0", 48]]
    assert list(g.edges(data="bytes")) == [("conv#0", "sq#1", 48), ("sq#1", "act#2", 48)]
    assert g.graph["outputs"] == ["act#2"]  # the last to run, though "sq#1" sorts after it


class _Pair(nn.Module):  # no children: the root is the one leaf, its output a tuple
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return x * self.w, x[:, :2]


class _FixedLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        del self.fc.weight, self.fc.bias  # a constant product: no parameters of its own
        self.fc.weight, self.fc.bias = torch.ones(2, 3), None

    def forward(self, x):
        return self.fc(x)


def test_a_root_leaf_is_named_root_and_keeps_every_output_of_a_tuple(tmp_path):
    """A model without children: its node is ``root#0`` and its parameter ``w`` (no prefix);
    both outputs of its tuple are its (4 x 3 and 4 x 2 fp32: 48 + 32 bytes)."""
    mf = SimpleNamespace(path=tmp_path / "pair.py")
    g = _trace_with_hooks(mf, _Pair(), (torch.zeros(4, 3),), KeyError("k"))
    assert list(g.nodes) == ["root#0"] and g.graph["outputs"] == ["root#0"]
    d = g.nodes["root#0"]
    assert (d["module"], d["params"], d["shapes"], d["out_bytes"]) == (
        "",
        ["w"],
        [[4, 3], [4, 2]],
        80,
    )
    assert d["fwd_bytes"] == 48 + 48 + 32 + 12


def test_a_product_with_a_constant_weight_pays_its_inputs_gradient_only(tmp_path):
    """A Linear 3 -> 2 whose weight is a plain tensor (no parameter): 2 x (4 x 2) x 3 = 48
    FLOPs forward, once more backward for the input's gradient, none for a weight's."""
    mf = SimpleNamespace(path=tmp_path / "fixed.py")
    x = torch.zeros(4, 3, requires_grad=True)
    d = _trace_with_hooks(mf, _FixedLinear(), (x,), KeyError("k")).nodes["fc#0"]
    assert (d["params"], d["fwd_flops"], d["bwd_flops"]) == ([], 48, 48)
    d = _trace_with_hooks(mf, _FixedLinear(), (x.detach(),), KeyError("k")).nodes["fc#0"]
    assert (d["requires_grad"], d["bwd_flops"], d["bwd_bytes"]) == (False, 0, 0)  # no gradient


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(self.a(x))


def test_a_tied_weight_read_by_its_second_module_is_named_by_its_first(tmp_path):
    mf = SimpleNamespace(path=tmp_path / "tied.py")
    g = _trace_with_hooks(mf, _Tied(), (torch.zeros(1, 2),), KeyError("k"))
    assert [g.nodes[n]["params"] for n in ("a#0", "b#1")] == [["a.weight"], ["a.weight"]]


class _Broken(nn.Module):
    def __init__(self, error: Exception):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.error = error

    def forward(self, x):
        self.fc(x)
        raise self.error


class _Empty(nn.Module):  # its one leaf module is never called
    def __init__(self):
        super().__init__()
        self.unused = nn.Linear(2, 2)

    def forward(self, x):
        return x * 2


def test_a_forward_the_hooks_cannot_run_names_the_module_and_both_failures(tmp_path):
    mf = SimpleNamespace(path=tmp_path / "bad.py")
    x = torch.zeros(1, 2)
    with pytest.raises(UserInputError) as e:
        _trace_with_hooks(mf, _Broken(ValueError("wrong rank")), (x,), KeyError("k"))
    assert str(e.value) == (
        "bad.py: cannot trace the model: torch.export failed (KeyError: 'k') and its forward "
        "raised in module '(top level)': ValueError: wrong rank"
    )
    dd = RuntimeError("item() cannot be called on meta tensors")
    with pytest.raises(UserInputError) as e:
        _trace_with_hooks(mf, _Broken(dd), (x,), dd)
    assert str(e.value).startswith(
        "bad.py: cannot trace the model: torch.export failed (RuntimeError) and its forward "
        "raised in module '(top level)': RuntimeError: item() cannot be called on meta tensors"
        "; the forward decides what to do from tensor values"
    )
    # export failed for another reason; the hooks stopped at an .item() export's fakes passed
    with pytest.raises(UserInputError) as e:
        _trace_with_hooks(mf, _Broken(dd), (x,), TypeError("bad shape"))
    assert str(e.value) == (
        "bad.py: cannot trace the model: its forward fails under torch.export: TypeError: bad "
        "shape (does it run outside meshplan?)"
    )
    long = "x" * 296 + " abcd"  # 301 characters: cut at 300, at the word boundary
    with pytest.raises(UserInputError) as e:
        _trace_with_hooks(mf, _Broken(ValueError(long)), (x,), KeyError("k"))
    assert str(e.value).endswith("': ValueError: " + "x" * 296 + " ...")
    with pytest.raises(UserInputError, match=r"^bad.py: the model's forward ran no module"):
        _trace_with_hooks(mf, _Empty(), (x,), KeyError("k"))


class _BrokenInside(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 3)
        self.out = nn.Linear(2, 2)

    def forward(self, x):
        return self.out(self.fc(x))


def test_the_failing_module_is_the_innermost_running(tmp_path):
    mf = SimpleNamespace(path=tmp_path / "bad.py")
    with pytest.raises(UserInputError, match=r"raised in module 'out': RuntimeError"):
        _trace_with_hooks(mf, _BrokenInside(), (torch.zeros(1, 2),), KeyError("k"))


# --------------------------------------------------------------------------- helpers


def test_tensor_bytes_and_names():
    assert tensor_bytes(torch.zeros(3, 5, dtype=torch.bfloat16)) == 30
    assert tensor_bytes(torch.zeros(2, 2, dtype=torch.int64)) == 32
    assert tensor_bytes(3.0) == 0 and tensor_bytes(None) == 0
    assert element_bytes(torch.zeros(1, dtype=torch.bool)) == 1
    assert element_bytes(torch.zeros(1, dtype=torch.float16)) == 2
    assert op_name(operator.getitem) == "_operator.getitem"
    assert op_name(torch.ops.aten.mm.default) == "aten.mm.default"


def test_a_batchnorm_needs_two_samples():
    assert batch_statistics_samples(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))) == 2
    assert batch_statistics_samples(nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))) == 1


def test_the_meta_model_moves_every_weight_and_keeps_ties_and_flags(tmp_path):
    path = tmp_path / "legacy.py"
    path.write_text(
        "import torch\nfrom torch import nn\n"
        "class M(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.a = nn.Linear(2, 2)\n"
        "        self.w = nn.Parameter(torch.ones(3, device='cpu'), requires_grad=False)\n"
        "        self.b = nn.Linear(2, 2)\n"
        "        self.b.weight = self.a.weight\n"
        "        self.register_buffer('idx', torch.arange(3, device='cpu'))\n"
        "    def forward(self, x):\n"
        "        return self.b(self.a(x))\n"
        "def build_model():\n    return M().eval()\n"
        "def make_batch(n, step=0):\n"
        "    return (torch.zeros(n, 2), torch.arange(n)), torch.zeros(n)\n"
    )
    mf = load_model_file(path)
    m = build_meta_model(mf, "bf16")
    assert m.training
    assert all(p.device.type == "meta" for p in m.parameters())
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    assert m.b.weight is m.a.weight and not m.w.requires_grad and m.a.bias.requires_grad
    assert m.idx.dtype == torch.int64  # integer buffers keep their dtype
    x, ids = meta_inputs(mf, 3, "bf16")
    assert (x.device.type, x.dtype, tuple(x.shape)) == ("meta", torch.bfloat16, (3, 2))
    assert (ids.device.type, ids.dtype) == ("meta", torch.int64)


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.norm = nn.Identity()

    def forward(self, x):
        return self.fc(x)


def test_shared_modules_are_one_weighted_block_listed_twice_in_one_container():
    block = _Block()
    m = nn.Module()
    m.layers = nn.ModuleList([block, block, _Block()])
    m.acts = nn.ModuleList([nn.ReLU()] * 2)  # no weights: not listed
    # the block's Linear is listed under two parents (layers.0, layers.1): not the container's
    assert shared_modules(m) == [["layers.0", "layers.1"]]
    other = nn.Module()
    other.enc = nn.ModuleList([block])
    other.dec = nn.ModuleList([block])  # two containers: not what this finds
    assert shared_modules(other) == []


class _Enc(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(2, 2)

    def forward(self, x):
        return self.inner(x)


class _Direct(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = _Enc()
        self.blocks = nn.ModuleList([_Enc()])
        self.other = nn.Linear(2, 2)


def test_direct_forwards_are_modules_never_entered_though_a_child_was():
    m = _Direct()
    called = {"", "enc.inner", "blocks.0", "blocks.0.inner"}
    assert direct_forwards(m, called) == ["enc"]
    assert direct_forwards(m, {"", "enc", "enc.inner", "blocks.0.inner"}) == ["blocks.0"]
    assert direct_forwards(m, {"", "enc", "enc.inner", "blocks.0", "blocks.0.inner"}) == []


class _Conv1D(nn.Module):  # transformers' Conv1D: a 2-D weight and a 1-D bias, one argument
    def __init__(self, bias_dims: int = 1):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(2, 3))
        self.bias = nn.Parameter(torch.zeros(*[3] * bias_dims))

    def forward(self, x):
        return x @ self.weight + self.bias


class _TwoArgs(_Conv1D):
    def forward(self, x, mask):
        return x


class _Extra(_Conv1D):
    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.zeros(3))


class _NoBias(nn.Module):
    def __init__(self, dims: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(*[2] * dims))

    def forward(self, x):
        return x


class _OwnLinear(nn.Linear):
    def forward(self, x):
        return x @ self.weight.T + self.bias


class _WeightAndChild(_NoBias):  # a 2-D weight of its own, and a child's weights besides
    def __init__(self):
        super().__init__(2)
        self.inner = nn.Linear(2, 2)


def _op_graph(nodes):
    import networkx as nx

    g = nx.DiGraph()
    for i, (op, module) in enumerate(nodes):
        g.add_node(f"n{i}", op=op, module=module)
    return g


def test_tensor_parallel_shards_plain_products_and_modules_like_them():
    m = nn.Module()
    m.lin, m.emb, m.conv1d, m.nobias = nn.Linear(2, 2), nn.Embedding(4, 2), _Conv1D(), _NoBias(2)
    m.two, m.extra, m.bias2d, m.w3 = _TwoArgs(), _Extra(), _Conv1D(2), _NoBias(3)
    m.own, m.router, m.silent = _OwnLinear(2, 2), _OwnLinear(2, 2), _OwnLinear(2, 2)
    m.norm, m.parent = nn.LayerNorm(2), _WeightAndChild()
    graph = _op_graph([
        ("aten.t.default", "own"), ("aten.view.default", "own"), ("aten.matmul.default", "own"),
        ("aten.add.Tensor", "own"), ("aten.linear.default", "router"),
        ("aten.topk.default", "router"),
    ])  # fmt: skip
    # ``silent`` runs no op in the trace: not shown to be a product, not sharded
    want = ["conv1d", "emb", "lin", "nobias", "own", "parent", "parent.inner"]
    assert tp_shardable_modules(m, graph) == want
    assert tp_shardable_modules(m) == [n for n in want if n != "own"]


def test_every_name_of_a_tied_weight_points_at_its_first():
    m = nn.Module()
    m.emb, m.head = nn.Embedding(4, 2), nn.Linear(2, 4, bias=False)
    m.head.weight = m.emb.weight
    assert _param_aliases(m) == {"emb.weight": "emb.weight", "head.weight": "emb.weight"}


def test_forward_state_is_what_changed_but_batchnorm_statistics():
    m = nn.Module()
    m.bn, m.lin = nn.BatchNorm1d(2), nn.Linear(2, 2)
    m.register_buffer("ema", torch.zeros(2))
    m.register_buffer("kept", torch.zeros(2))
    before = state_versions(m)
    assert before["ema"] == (id(m.ema), 0) and set(before) >= {"lin.weight", "bn.running_mean"}
    assert forward_state(m, before) == []
    m.bn(torch.ones(3, 2))  # running statistics move: not reported
    m.ema.add_(1)
    m.lin.bias = nn.Parameter(torch.zeros(2))  # reassigned
    assert forward_state(m, before) == ["ema", "lin.bias"]
    m.bn.running_mean.add_(1)  # the statistics moved in place, each one: still not reported
    m.bn.running_var.mul_(2)
    assert forward_state(m, before) == ["ema", "lin.bias"]
    bn = nn.BatchNorm1d(2)  # the model itself: its statistics have no prefix
    before = state_versions(bn)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        getattr(bn, name).add_(1)
    assert forward_state(bn, before) == []
    with torch.no_grad():
        bn.bias.add_(1)
    assert forward_state(bn, before) == ["bias"]


def test_matmul_inner_dimensions_by_hand():
    # [K, N, rows the second operand's gradient sums over, that operand a weight]
    assert matmul_inner_dims(LIN, [[2, 3, 8], [16, 8]], [2, 3, 16]) == [8, 16, 6, True]
    assert matmul_inner_dims(LIN, [[8], [16, 8]], [4, 16]) == [8, 16, 4, True]
    assert matmul_inner_dims("aten.mm.default", [[5, 7], [7, 9]], [5, 9]) == [7, 9, 5, True]
    assert matmul_inner_dims("aten.addmm.default", [[9], [5, 7], [7, 9]], [5, 9]) == [7, 9, 5, True]
    assert matmul_inner_dims("aten.bmm.default", [[2, 3, 4], [2, 4, 5]], [2, 3, 5]) == [
        4,
        5,
        3,
        False,
    ]
    assert matmul_inner_dims(
        "aten.baddbmm.default", [[2, 3, 5], [2, 3, 4], [2, 4, 5]], [2, 3, 5]
    ) == [4, 5, 3, False]  # noqa: E501
    assert matmul_inner_dims("aten.matmul.default", [[2, 3, 4], [4, 5]], [2, 3, 5]) == [
        4,
        5,
        6,
        True,
    ]
    # each of 4 experts' weight gradient sums over 12 / 4 rows
    grouped = "aten._grouped_mm.default"
    assert matmul_inner_dims(grouped, [[12, 8], [4, 8, 16]], [12, 16]) == [8, 16, 3, True]
    assert matmul_inner_dims(grouped, [[2, 8], [4, 8, 16]], [2, 16]) == [8, 16, 1, True]
    got = matmul_inner_dims(grouped, [[13, 8], [4, 8, 16]], [13, 16])  # 13 / 4 rows: 3 whole
    assert got == [8, 16, 3, True] and type(got[2]) is int
    # batched experts (4 x 3 x 8 by 4 x 8 x 16): the output's last dimension is N
    assert matmul_inner_dims(grouped, [[4, 3, 8], [4, 8, 16]], [4, 3, 16]) == [8, 16, 1, True]
    assert matmul_inner_dims(grouped, [[12, 8], [8, 16]], [12, 16]) is None  # not 3-D experts
    assert matmul_inner_dims("aten.relu.default", [[2, 3]], [2, 3]) is None
    assert matmul_inner_dims(LIN, [[8], [16, 8]], [16]) is None  # a 1-D output
    assert matmul_inner_dims(LIN, [[8], [16, 8]], None) is None
    assert matmul_inner_dims("aten.mm.default", [[7], [7, 9]], [1, 9]) is None
    assert matmul_inner_dims("aten.mm.default", [[5, 7]], [5, 9]) is None
    assert matmul_inner_dims("aten.mm.default", [None, [5, 7], [7, 9]], [5, 9]) == [7, 9, 5, True]


def test_data_dependent_failures_are_told_apart():
    class GuardOnDataDependentSymNode(Exception):  # torch's class name
        pass

    for exc in (
        GuardOnDataDependentSymNode("x"),
        RuntimeError("Could not guard on data-dependent expression"),
        RuntimeError("Tensor.item() cannot be called on meta tensors"),
        RuntimeError("Cannot copy out of meta tensor; no data!"),
    ):
        assert _data_dependent(exc), exc
        assert _export_failure(exc) == type(exc).__name__
    assert not _data_dependent(RuntimeError("shape mismatch"))
    assert _export_failure(ValueError("shape\nmismatch")) == "ValueError: shape mismatch"


def test_the_hint_for_data_dependent_sizes_speaks_of_experts_where_there_are():
    moe = nn.Module()
    moe.Experts = nn.Linear(2, 2)
    assert data_dependent_hint(moe) == (
        "; the forward sizes its work from tensor values (.item() or .tolist(), such as tokens "
        "counted per expert), which a trace without data cannot follow: use an implementation "
        "that keeps sizes static (transformers' grouped_mm or batched_mm experts, a "
        "capacity-padded dispatch)"
    )
    plain = nn.Module()
    plain.fc = nn.Linear(2, 2)
    assert data_dependent_hint(plain) == (
        "; the forward decides what to do from tensor values (a branch such as `if mask.any():`"
        ", a check such as `assert lengths.max() <= n`, .item(), nonzero()), which a trace "
        "without data cannot follow: make that code depend on shapes only (or move the check "
        "out of forward)"
    )


def _grouped(dims=2, out=(1, 6, 3, 4), src=(1, 2, 3, 4), target=None, expand=None):
    """reshape(expand(unsqueeze(x, dims), ...), out) with x of shape ``src``."""
    aten = torch.ops.aten
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(src, device="meta")
    u = g.call_function(aten.unsqueeze.default, (x, dims))
    e = g.call_function(expand or aten.expand.default, (u, [1, 2, 3, 3, 4]))
    r = g.call_function(target or aten.reshape.default, (e, list(out)))
    r.meta["val"] = torch.empty(out, device="meta")
    return x, r


def test_the_compact_heads_behind_a_grouped_query_repeat():
    aten = torch.ops.aten
    x, r = _grouped()
    assert _compact_grouped(r) is x
    for target in (aten.view.default, aten._unsafe_view.default):
        x, r = _grouped(target=target)
        assert _compact_grouped(r) is x
    assert _compact_grouped(_grouped(target=aten.clone.default)[1]) is None
    assert _compact_grouped(_grouped(expand=aten.repeat.default)[1]) is None
    assert _compact_grouped(_grouped(dims=1)[1]) is None
    assert _compact_grouped(_grouped(out=(1, 2, 3, 4))[1]) is None  # no repeat
    assert _compact_grouped(_grouped(out=(1, 5, 3, 4))[1]) is None  # 5 heads from 2
    assert _compact_grouped(_grouped(out=(1, 6, 3, 5))[1]) is None
    assert _compact_grouped(_grouped(out=(2, 6, 3, 4))[1]) is None
    assert _compact_grouped(_grouped(out=(1, 6, 2, 4))[1]) is None
    assert _compact_grouped(_grouped(src=(2, 3, 4))[1]) is None
    assert _compact_grouped(_grouped(out=(6, 3, 4))[1]) is None
    assert _compact_grouped("k") is None


def test_a_node_depends_on_the_inputs_it_is_computed_from():
    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    c = g.call_function(torch.relu, (a,))
    d = g.call_function(torch.add, (c, c))
    e = g.call_function(torch.mul, (d, b))
    assert _depends_on(d, {"a"}) and not _depends_on(d, {"b"})
    assert _depends_on(e, {"b"}) and _depends_on(e, {"mul"}) and not _depends_on(c, set())


# --------------------------------------------------------------------------- the traced path's
# pieces on graphs built by hand (helper 56d): the saved-tensor interpreter on CPU tensors (its
# outputs checked against torch's own attention), the causal-mask rewrite on a stand-in for an
# exported program (a GraphModule and its input specs: all the rewrite reads), the arguments'
# serialisation and the module paths. No export runs: each test takes milliseconds.

ATEN = torch.ops.aten
SDPA = ATEN.scaled_dot_product_attention.default


def _interpret(build, *inputs, static=()):
    """Run the graph ``build(graph, placeholders)`` makes through the saved-tensor interpreter
    with grad on: its output, and (producer, saver, bytes) of each tensor kept for backward."""
    from planner.trace.export import _identity, _SavedTensorInterpreter, _storage_key

    g = torch.fx.Graph()
    names = [f"in{i}" for i in range(len(inputs))]
    out = build(g, [g.placeholder(n) for n in names])
    g.output(out)
    interp = _SavedTensorInterpreter(torch.fx.GraphModule(nn.Module(), g), set(static))
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(interp.pack, _identity):
        result = interp.run(*inputs)
    kept = sorted(
        (interp.producer.get(key, "?"), saver, nbytes)
        for key, (saver, nbytes) in interp.saved.items()
    )
    assert all(_storage_key(t) is not None for t in interp.keep)
    return result, kept


def _qkv(width=4, value_width=4, dtype=torch.float32):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 3, width, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(1, 2, 3, width, generator=g, dtype=dtype)
    v = torch.randn(1, 2, 3, value_width, generator=g, dtype=dtype)
    return q, k, v


def _sdpa(*args, **kwargs):
    """A graph of one attention call; a string argument names an input (in0, in1...)."""

    def build(g, ph):
        env = {p.name: p for p in ph}
        pick = lambda a: env.get(a, a) if isinstance(a, str) else a  # noqa: E731
        return g.call_function(
            SDPA, tuple(pick(a) for a in args), {k: pick(a) for k, a in kwargs.items()}
        )

    return build


# what the fused kernel keeps for 1 x 2 heads x 3 tokens x 4 fp32: q, k, v and the output (96
# bytes each, made by the inputs and the call) and the log-sum-exp (2 x 3 x 4 bytes)
FUSED = sorted(
    [("in0", "a", 96), ("in1", "a", 96), ("in2", "a", 96), ("a", "a", 24), ("a", "a", 96)]
)


def _named(kept, name="scaled_dot_product_attention_default"):
    return sorted((p.replace(name, "a"), s.replace(name, "a"), b) for p, s, b in kept)


def test_fused_attention_reads_each_argument_where_torch_puts_it():
    """Positional and keyword masks, causality and scales each give torch's own attention;
    a boolean mask is kept as the additive one of the query's dtype (3 x 3 x 4 bytes)."""
    F = torch.nn.functional
    q, k, v = _qkv()
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    mask[2, 0] = False
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    for build in (_sdpa("in0", "in1", "in2", "in3"), _sdpa("in0", "in1", "in2", attn_mask="in3")):
        out, kept = _interpret(build, q, k, v, mask)
        torch.testing.assert_close(out, ref)
        assert _named(kept) == sorted(FUSED + [("?", "a", 36)])  # made inside: no producer
    additive = torch.zeros(3, 3).masked_fill(~mask, -1e4)
    out, kept = _interpret(_sdpa("in0", "in1", "in2", "in3", 0.0, False, 0.3), q, k, v, additive)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, additive, scale=0.3))
    assert _named(kept) == sorted(FUSED + [("in3", "a", 36)])
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    for build in (
        _sdpa("in0", "in1", "in2", None, 0.0, True, 0.3),
        _sdpa("in0", "in1", "in2", is_causal=True, scale=0.3),
        _sdpa("in0", "in1", "in2", None, 0.0, is_causal=True, scale=0.3),
    ):
        out, kept = _interpret(build, q, k, v)
        torch.testing.assert_close(out, causal)
        assert _named(kept) == FUSED
    out, kept = _interpret(_sdpa("in0", "in1", "in2"), q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    assert _named(kept) == FUSED


def test_fused_attention_pads_narrow_values_and_falls_back_where_the_kernel_refuses():
    """Value heads of 2 beside query heads of 4: v padded to 4 for the kernel (kept as 96
    bytes, as the padded output is), the output cut back to 2. Dropout the CPU kernel refuses:
    the math path's attention runs instead, keeping its probabilities (2 x 3 x 3 x 4 bytes,
    twice: before and after dropout) beside q, k, v and the output."""
    F = torch.nn.functional
    q, k, v = _qkv(value_width=2)
    out, kept = _interpret(_sdpa("in0", "in1", "in2"), q, k, v)
    assert out.shape == (1, 2, 3, 2)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    assert _named(kept) == sorted([*FUSED[:-1], ("?", "a", 96)])  # v padded
    q, k, v = _qkv()
    out, kept = _interpret(_sdpa("in0", "in1", "in2", is_causal=True), q, k, v)
    assert _named(kept) == FUSED  # the same width: nothing padded
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    for build in (_sdpa("in0", "in1", "in2", None, 0.5), _sdpa("in0", "in1", "in2", dropout_p=0.5)):
        out, kept = _interpret(build, q, k, v)
        assert [b for _, _, b in kept] == [72, 72, 96, 96, 96, 96], kept
        assert out.shape == (1, 2, 3, 4)


def test_dropout_keeps_its_one_byte_mask_and_the_first_maker_of_a_storage_is_its_producer():
    """x (2 x 3 fp32) squared keeps x (its input's storage: made by the input); a view of the
    square and its sine keep the square's storage, made by ``mul`` (the view shares it);
    dropout at p = 1 zeroes everything and keeps its 6-byte mask (the product after it keeps
    its output); out of training, or at p = 0, it is the identity and keeps nothing (the
    product keeps the sine's output). A static weight (a parameter) is not kept."""
    x = torch.arange(1.0, 7.0).reshape(2, 3).requires_grad_()
    w = torch.full((3,), 2.0, requires_grad=True)

    def build(p, train):
        def graph(g, ph):
            sq = g.call_function(ATEN.mul.Tensor, (ph[0], ph[0]))
            flat = g.call_function(ATEN.view.default, (sq, [6]))
            s = g.call_function(ATEN.sin.default, (flat,))
            d = g.call_function(ATEN.dropout.default, (s, p, train))
            r = g.call_function(ATEN.view.default, (d, [2, 3]))
            return g.call_function(ATEN.mul.Tensor, (r, ph[1]))

        return graph

    from planner.trace.export import _storage_key

    out, kept = _interpret(build(1.0, True), x, w, static=[_storage_key(w)])
    assert torch.equal(out, torch.zeros(2, 3))
    d, m, m1 = "dropout_default", "mul_tensor", "mul_tensor_1"
    assert kept == [(d, d, 6), (d, m1, 24), ("in0", m, 24), (m, "sin_default", 24)]
    want = torch.sin(x.detach() * x.detach()) * 2
    for p, train in ((0.5, False), (0.0, True)):
        out, kept = _interpret(build(p, train), x, w, static=[_storage_key(w)])
        torch.testing.assert_close(out, want)
        assert kept == [("in0", m, 24), (m, "sin_default", 24), ("sin_default", m1, 24)]
    out, kept = _interpret(build(0.0, True), x, w)  # the weight not static: kept, as an input
    assert ("in1", m1, 12) in kept


def test_arguments_are_written_by_kind():
    """A placeholder is a parameter, buffer or constant by its input spec's kind, a node
    otherwise (a user input, or one the specs do not list); lists recurse, plain values stay,
    a symbolic size is its int, anything else its text; device and layout are dropped."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from planner.trace.export import _serialise, _serialise_args, _serialise_kwargs

    g = torch.fx.Graph()
    w, b, c, x, y = (g.placeholder(n) for n in ("p_w", "b_s", "c_k", "x", "y"))
    r = g.call_function(torch.relu, (x,))
    kinds = {
        "p_w": ("parameter", "fc.weight"),
        "b_s": ("buffer", "scale"),
        "c_k": ("constant_tensor", "lifted"),
        "x": ("user_input", "x"),
    }
    assert _serialise_args((w, b, c, x, y, r), kinds) == [
        {"param": "fc.weight"}, {"buffer": "scale"}, {"const": "lifted"}, {"node": "x"},
        {"node": "y"}, {"node": "relu"},
    ]  # fmt: skip
    assert _serialise([1, (2.5, "s", [w]), None, True], kinds) == [
        1, [2.5, "s", [{"param": "fc.weight"}]], None, True,
    ]  # fmt: skip
    assert _serialise(torch.float16, {}) == "torch.float16"
    env = ShapeEnv()
    n = env.create_symintnode(env.create_symbol(5, ConstantSource("n")), hint=5)
    assert isinstance(n, torch.SymInt)
    got = _serialise(n, {})
    assert type(got) is int and got == 5
    kwargs = {"device": torch.device("cpu"), "layout": torch.strided, "dtype": torch.int8, "d": 1}
    assert _serialise_kwargs(kwargs, kinds) == {"dtype": "torch.int8", "d": 1}
    assert _serialise_kwargs({"src": b}, kinds) == {"src": {"buffer": "scale"}}


def test_an_ops_module_is_the_innermost_of_its_stack_without_exports_prefix():
    from planner.trace.export import _clean_path, _dtype, _module_path, _shape, _tensor_args

    g = torch.fx.Graph()
    x = g.placeholder("x")
    n = g.call_function(torch.relu, (x,))
    assert _module_path(n) == ""
    n.meta["nn_module_stack"] = {}
    assert _module_path(n) == ""
    n.meta["nn_module_stack"] = {
        "a": ("L['self'].enc", nn.Module),
        "b": ("L['self'].enc.layer", nn.Module),
        "c": ("L['self'].enc.layer.fc", nn.Linear),
    }
    assert _module_path(n) == "enc.layer.fc"
    for path in ("L['self'].h.0", "L__self__.h.0", "self.h.0", "h.0"):
        assert _clean_path(path) == "h.0", path
    assert _clean_path("h.self.") == "h.self."
    assert _shape(torch.zeros(2, 3)) == [2, 3] and _shape(None) is None
    assert _dtype(torch.zeros(1, dtype=torch.bfloat16)) == "bfloat16" and _dtype(3) is None
    # only the arguments holding a tensor value, nested ones too, in order
    a, b, c = (g.placeholder(s) for s in "abc")
    a.meta["val"], b.meta["val"], c.meta["val"] = torch.zeros(1), torch.zeros(2), 4
    cat = g.call_function(torch.cat, ([a, c, b], x, 0))
    assert _tensor_args(cat) == [a, b]


def _program(g: torch.fx.Graph, user: tuple[str, ...]):
    """What ``_drop_traced_causal_masks`` reads of an ExportedProgram: its GraphModule and its
    input specs (each placeholder's kind: a user input, or here a parameter)."""
    gm = torch.fx.GraphModule(nn.Module(), g)
    specs = [
        SimpleNamespace(
            kind=SimpleNamespace(name="USER_INPUT" if n.name in user else "PARAMETER"),
            arg=SimpleNamespace(name=n.name),
        )
        for n in g.nodes
        if n.op == "placeholder"
    ]
    return SimpleNamespace(graph_module=gm, graph_signature=SimpleNamespace(input_specs=specs))


def _val(node, *shape, dtype=torch.float32):
    node.meta["val"] = torch.empty(shape, dtype=dtype, device="meta")
    return node


def _attention_graph(mask_of, *, q_len=3, k_len=3, positional=True, grouped=False):
    """q (1 x 2 x q_len x 4), k and v (1 x 2 x k_len x 4, or the two-head repeat of one head),
    and ``mask_of(g, q, ids)``'s mask handed to attention with a scale of 0.5; a dead product
    the rewrite must leave alone unless it rewrites."""
    g = torch.fx.Graph()
    ids = _val(g.placeholder("ids"), 1, k_len, dtype=torch.int64)
    q = _val(g.placeholder("q"), 1, 2, q_len, 4)
    if grouped:  # transformers' repeat of one key/value head for two query heads
        x = _val(g.placeholder("x"), 1, 1, k_len, 4)
        u = g.call_function(ATEN.unsqueeze.default, (x, 2))
        e = g.call_function(ATEN.expand.default, (u, [1, 1, 2, k_len, 4]))
        k = v = _val(g.call_function(ATEN.reshape.default, (e, [1, 2, k_len, 4])), 1, 2, k_len, 4)
    else:
        k = _val(g.placeholder("k"), 1, 2, k_len, 4)
        v = _val(g.placeholder("v"), 1, 2, k_len, 4)
    mask = mask_of(g, q, ids)
    args, kwargs = ((q, k, v, mask), {"scale": 0.5}) if positional else ((q, k, v), {})
    if not positional:
        kwargs = {"attn_mask": mask, "is_causal": False, "scale": 0.5}
    a = g.call_function(SDPA, args, kwargs)
    _val(a, 1, 2, q_len, 4)
    g.call_function(ATEN.relu.default, (q,))  # dead
    g.output(a)
    return g, a


def _causal(g, q, ids, shape=(3, 3)):
    ones = _val(g.call_function(ATEN.ones.default, (list(shape),), {"dtype": torch.bool}), *shape,
                dtype=torch.bool)  # fmt: skip
    g.call_function(ATEN._assert_tensor_metadata.default, (ones,), {"dtype": torch.bool})
    return _val(g.call_function(ATEN.tril.default, (ones,)), *shape, dtype=torch.bool)


def test_a_causal_mask_built_from_shapes_becomes_is_causal_and_its_ops_go():
    from planner.trace.export import _drop_traced_causal_masks

    for positional in (True, False):
        g, a = _attention_graph(_causal, positional=positional)
        prog = _program(g, ("ids", "q", "k", "v"))
        _drop_traced_causal_masks(prog)
        assert [n.name for n in a.args] == ["q", "k", "v"]
        assert a.kwargs == {"scale": 0.5, "attn_mask": None, "is_causal": True}
        targets = [n.target for n in g.nodes if n.op == "call_function"]
        assert targets == [SDPA], targets  # the mask, its check and the dead product gone
        assert "tril" not in prog.graph_module.code and "relu" not in prog.graph_module.code
    g, a = _attention_graph(_causal, grouped=True)
    _drop_traced_causal_masks(_program(g, ("ids", "q", "x")))
    assert [n.name for n in a.args] == ["q", "x", "x"]  # the one head behind the repeat
    assert a.kwargs == {"scale": 0.5, "enable_gqa": True, "attn_mask": None, "is_causal": True}


def test_a_mask_that_is_not_a_causal_one_of_shapes_stays():
    """A float mask; a boolean one of another shape (a padding row), or one the inputs make;
    cross-attention (3 queries, 5 keys); no mask: each call and graph as it was."""
    from planner.trace.export import _drop_traced_causal_masks

    def float_mask(g, q, ids):
        return _val(g.call_function(ATEN.zeros.default, ([3, 3],)), 3, 3)

    def padding(g, q, ids):
        return _causal(g, q, ids, shape=(1, 3))

    def from_ids(g, q, ids):
        m = _val(g.call_function(ATEN.ne.Scalar, (ids, 0)), 1, 3, dtype=torch.bool)
        return _val(g.call_function(ATEN.expand.default, (m, [3, 3])), 3, 3, dtype=torch.bool)

    cases = [(float_mask, 3), (padding, 3), (from_ids, 3), (lambda g, q, i: None, 3)]
    cases.append((lambda g, q, i: _causal(g, q, i, shape=(3, 5)), 5))
    for mask_of, k_len in cases:
        for positional in (True, False):
            g, a = _attention_graph(mask_of, k_len=k_len, positional=positional)
            before = [(n.name, n.args, dict(n.kwargs)) for n in g.nodes]
            _drop_traced_causal_masks(_program(g, ("ids", "q", "k", "v")))
            assert [(n.name, n.args, dict(n.kwargs)) for n in g.nodes] == before


def test_each_causal_call_is_rewritten_past_one_that_is_not():
    from planner.trace.export import _drop_traced_causal_masks

    g = torch.fx.Graph()
    q, k, v = (_val(g.placeholder(n), 1, 2, 3, 4) for n in "qkv")
    additive = _val(g.call_function(ATEN.zeros.default, ([3, 3],)), 3, 3)
    first = _val(g.call_function(SDPA, (q, k, v, additive)), 1, 2, 3, 4)
    second = _val(g.call_function(SDPA, (q, k, v, _causal(g, q, None))), 1, 2, 3, 4)
    g.output((first, second))
    _drop_traced_causal_masks(_program(g, ("q", "k", "v")))
    assert first.args == (q, k, v, additive) and first.kwargs == {}
    assert second.args == (q, k, v) and second.kwargs == {"attn_mask": None, "is_causal": True}


def test_a_shape_check_on_what_others_use_too_stays():
    from planner.trace.export import _drop_traced_causal_masks

    def checked_q(g, q, ids):
        g.call_function(ATEN._assert_tensor_metadata.default, (q,), {"dtype": torch.float32})
        return _causal(g, q, ids)

    g, a = _attention_graph(checked_q)
    _drop_traced_causal_masks(_program(g, ("ids", "q", "k", "v")))
    checks = [n for n in g.nodes if n.target is ATEN._assert_tensor_metadata.default]
    assert [c.args[0].name for c in checks] == ["q"]


def test_element_bytes_falls_back_to_torchs_size_for_a_dtype_outside_the_table():
    assert element_bytes(torch.zeros(1, dtype=torch.complex64)) == 8
    assert tensor_bytes(torch.zeros(3, dtype=torch.float8_e4m3fn)) == 3


def test_parameters_off_the_meta_device_move_once_and_meta_ones_stay_as_they_are():
    """A CPU model: every parameter moved, a tied one still one tensor, a frozen one still
    frozen, an empty slot before a weight passed over. A parameter already on meta is the same
    object after."""
    from planner.trace.export import _parameters_to_meta

    m = nn.Module()
    m.register_parameter("empty", None)
    m.w = nn.Parameter(torch.ones(2), requires_grad=False)
    m.a, m.b = nn.Linear(2, 2), nn.Linear(2, 2)
    m.b.weight = m.a.weight
    with torch.device("meta"):
        m.c = nn.Linear(2, 2)
    kept = m.c.weight
    _parameters_to_meta(m)
    assert all(p.device.type == "meta" for p in m.parameters())
    assert m.b.weight is m.a.weight and not m.w.requires_grad and m.a.bias.requires_grad
    assert m.empty is None and m.c.weight is kept
    assert len(list(m.parameters())) == 6  # w, a's two, b's bias, c's two


def test_the_traced_inputs_are_the_first_steps_batch(tmp_path):
    text = (
        "import torch\nfrom torch import nn\n"
        "def build_model():\n    return nn.Linear(2, 2)\n"
        "def make_batch(n, step=0):\n"
        "    return (torch.zeros(n, 2 + step),), None\n"
    )
    path = tmp_path / "steps.py"
    path.write_text(text)
    (x,) = meta_inputs(load_model_file(path), 3, "fp16")
    assert (tuple(x.shape), x.dtype, x.device.type) == ((3, 2), torch.float16, "meta")


class _Halve(torch.autograd.Function):  # the model's own Function: its backward is its own
    @staticmethod
    def forward(ctx, x):
        return x / 2

    @staticmethod
    def backward(ctx, g):
        return g / 2


class _NoExport(nn.Module):
    """Runs eagerly, refuses torch.export (as data-dependent code does, in one line)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 3)

    def forward(self, x):
        if torch.compiler.is_exporting():
            raise RuntimeError("refused  while\n exporting: " + "x " * 100)
        return self.fc(_Halve.apply(x))


def test_a_model_export_refuses_is_traced_by_its_hooks_and_the_user_told_why(tmp_path):
    """The note's reason: the failure's words on one line, cut at 160 characters."""
    from planner.trace.export import _export_or_hooks

    functions, called, drawn = set(), set(), []
    mf = SimpleNamespace(path=tmp_path / "refuses.py")
    x = torch.zeros(1, 2)
    graph, method, note = _export_or_hooks(mf, _NoExport(), (x,), functions, called, drawn)
    assert (method, list(graph.nodes)) == ("hooks", ["fc#0"])
    assert graph.nodes["fc#0"]["fwd_flops"] == 2 * 3 * 2
    reason = ("refused while exporting: " + "x " * 100)[:160]
    assert note == (
        f"torch.export could not trace refuses.py (RuntimeError: {reason}); fell back to "
        "module-level tracing (coarser op graph)"
    )
    assert called == {"", "fc"} and functions == {"_Halve"} and drawn == []


class _Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(2, 2, bias=False))
        self.bank = nn.ModuleDict({"up": _OwnLinear(2, 4)})
        self.stack = nn.ModuleList([nn.Linear(4, 2, bias=False)])
        self.head = nn.Linear(2, 2, bias=False)
        self.head.weight = self.seq[0].weight  # tied


def test_the_models_facts_list_its_containers_and_each_weight_once(tmp_path):
    from planner.trace.export import _annotate_model

    model = _Nested().to(torch.bfloat16)
    model.stack[0].weight = nn.Parameter(torch.zeros(2, 4))  # fp32 kept: 4 bytes
    graph = _op_graph([("aten.matmul.default", "bank.up"), ("aten.add.Tensor", "bank.up")])
    mf = SimpleNamespace(path=tmp_path / "nested.py", sha256="abc", args={"n": 1})
    _annotate_model(graph, mf, model, 4, "bf16", "hooks")
    f = graph.graph
    assert (f["file"], f["sha256"], f["args"]) == (str(tmp_path / "nested.py"), "abc", {"n": 1})
    assert (f["traced_batch_size"], f["dtype"], f["method"]) == (4, "bf16", "hooks")
    shapes = {"seq.0.weight": [2, 2], "bank.up.weight": [4, 2], "bank.up.bias": [4],
              "stack.0.weight": [2, 4]}  # fmt: skip
    assert f["param_shapes"] == shapes and f["params"] == 4 + 8 + 4 + 8
    assert f["param_dtype_bytes"] == {**dict.fromkeys(shapes, 2), "stack.0.weight": 4}
    assert f["param_owner"]["head.weight"] == "seq.0.weight"
    assert f["containers"] == ["seq", "bank", "stack"]
    assert f["modules"]["bank.up"] == "_OwnLinear" and f["modules"][""] == "_Nested"
    assert f["tp_modules"] == ["bank.up", "head", "seq.0", "stack.0"]
    assert f["torch_version"] == torch.__version__ and f["experts"] == {}


# six identical layers and a batch norm, refusing torch.export: the cut trace falls back to
# hooks, which cannot be written out again, so the whole model is traced by its hooks
REFUSING_STACK = (
    STACK.replace(
        "        for layer in self.layers:",
        "        if torch.compiler.is_exporting():\n"
        "            raise RuntimeError('no export')\n"
        "        for layer in self.layers:",
    )
    .replace(
        "        return x\n\n\ndef build_model",
        "        return self.norm(x)\n\n\ndef build_model",
    )
    .replace(
        "self.layers = nn.ModuleList([Layer() for _ in range(6)])",
        "self.layers = nn.ModuleList([Layer() for _ in range(6)])\n"
        "        self.norm = nn.BatchNorm1d(4)",
    )
)


def test_a_stack_whose_cut_trace_fails_is_traced_whole_with_two_samples(tmp_path):
    """The batch norm needs two samples: each layer's product is 2 x (2 x 4) x 4 FLOPs."""
    path = tmp_path / "refusing.py"
    path.write_text(REFUSING_STACK)
    traced = trace_model(load_model_file(path), traced_batch_size=1, dtype="fp32")
    g = traced.graph
    assert (traced.method, traced.repeats) == ("hooks", [])
    assert traced.note.startswith("torch.export could not trace refusing.py (RuntimeError: no")
    layers = [f"layers.{k}.fc#{k}" for k in range(6)]
    assert list(g.nodes) == [*layers, "norm#6"]
    assert [g.nodes[n]["fwd_flops"] for n in layers] == [64] * 6
    assert g.graph["traced_batch_size"] == 2 and g.graph["dtype"] == "fp32"
    assert g.graph["method"] == "hooks" and g.graph["outputs"] == ["norm#6"]


def test_a_causal_mask_on_three_dimensional_attention_goes_too():
    """(batch x heads) x 3 tokens x 4: the tokens are dimension -2 (and 1), not 2."""
    from planner.trace.export import _drop_traced_causal_masks

    g = torch.fx.Graph()
    q, k, v = (_val(g.placeholder(n), 2, 3, 4) for n in "qkv")
    a = _val(g.call_function(SDPA, (q, k, v, _causal(g, q, None))), 2, 3, 4)
    g.output(a)
    _drop_traced_causal_masks(_program(g, ("q", "k", "v")))
    assert a.args == (q, k, v) and a.kwargs == {"attn_mask": None, "is_causal": True}


def test_a_repeat_found_only_through_an_unsqueeze_with_shapes_known():
    """An expand of another op (a squeeze at dimension 2), or a source or repeat without a
    traced value: no compact heads, and no error."""
    x, r = _grouped()
    u = r.args[0].args[0]
    u.target = torch.ops.aten.squeeze.dim
    assert _compact_grouped(r) is None
    x, r = _grouped()
    del x.meta["val"]
    assert _compact_grouped(r) is None
    x, r = _grouped()
    del r.meta["val"]
    assert _compact_grouped(r) is None


def test_transformers_four_dimensional_causal_mask_goes_too():
    """transformers' mask is batch x 1 x queries x keys."""
    from planner.trace.export import _drop_traced_causal_masks

    g, a = _attention_graph(lambda g, q, ids: _causal(g, q, ids, shape=(1, 1, 3, 3)))
    _drop_traced_causal_masks(_program(g, ("ids", "q", "k", "v")))
    assert a.kwargs == {"scale": 0.5, "attn_mask": None, "is_causal": True}


def test_fused_attention_reads_causality_and_the_scale_by_position_and_pads_by_one():
    """Six positional arguments (causal, no scale), seven with causality off and a scale,
    value heads one narrower than the query's (3 of 4: padded by 1, cut back to 3), fp64 (the
    additive mask in the query's dtype: 3 x 3 x 8 bytes), and the meta device."""
    F = torch.nn.functional
    q, k, v = _qkv()
    out, _ = _interpret(_sdpa("in0", "in1", "in2", None, 0.0, True), q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    out, _ = _interpret(_sdpa("in0", "in1", "in2", None, 0.0, False, 0.3), q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.3))
    q, k, v = _qkv(value_width=3)
    out, kept = _interpret(_sdpa("in0", "in1", "in2"), q, k, v)
    assert out.shape == (1, 2, 3, 3)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    assert _named(kept) == sorted([*FUSED[:-1], ("?", "a", 96)])  # v padded to 4
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    q, k, v = _qkv(dtype=torch.float64)
    out, kept = _interpret(_sdpa("in0", "in1", "in2", "in3"), q, k, v, mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert ("?", "a", 72) in _named(kept)
    meta = [t.to("meta") for t in _qkv()]
    meta[0].requires_grad_()
    out, kept = _interpret(_sdpa("in0", "in1", "in2", "in3"), *meta, mask.to("meta"))
    assert out.device.type == "meta" and _named(kept) == sorted(FUSED + [("?", "a", 36)])


def test_an_op_of_several_outputs_makes_each_and_a_scalar_output_is_one():
    """max over a dimension makes its values (a storage of its own, kept by the sine after
    it: made by ``max``, not by the getitem that picks it); a sum to a 0-d tensor is one
    output."""

    def build(g, ph):
        m = g.call_function(ATEN.max.dim, (ph[0], 1))
        values = g.call_function(operator.getitem, (m, 0))
        s = g.call_function(ATEN.sin.default, (values,))
        return g.call_function(ATEN.sum.default, (s,))

    x = torch.arange(6.0).reshape(2, 3).requires_grad_()
    out, kept = _interpret(build, x)
    torch.testing.assert_close(out, torch.sin(torch.tensor([2.0, 5.0])).sum())
    assert ("max_dim", "sin_default", 8) in kept


PADDED = """
import numpy as np
import torch
from torch import nn
import torch.nn.functional as F


class Halve(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x / 2

    @staticmethod
    def backward(ctx, g):
        return g / 2


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 4)
        self.pair = nn.ModuleList([nn.Linear(4, 4)] * 2)

    def forward(self, ids, pad):
        np.random.random(), np.random.random(), np.random.rand()
        e = self.emb(ids)
        h = Halve.apply(e - e.max(-1, keepdim=True).values).unsqueeze(1)  # 1 x 1 x 3 x 4
        keep = (pad != 0)[:, None, None, :].expand(-1, 1, 3, 3)
        return F.scaled_dot_product_attention(h, h, h, attn_mask=keep)


def build_model():
    return Net()


def make_batch(batch_size, step=0):
    ids = torch.ones(batch_size, 3, dtype=torch.long)
    return (ids, torch.ones(batch_size, 3, dtype=torch.long)), ids
"""


def test_a_padding_mask_stays_and_its_additive_copy_is_kept_made_by_no_node(tmp_path):
    """The mask reads the ids, so it stays; the fused kernel keeps the fp32 copy it makes of
    it (1 x 1 x 3 x 3 x 4 bytes), which no node of the graph made: its producer is None. The
    model's own Function, its numpy draws (each function once) and its one Linear listed
    twice are the trace's facts."""
    path = tmp_path / "padded.py"
    path.write_text(PADDED)
    traced = trace_model(load_model_file(path), traced_batch_size=1, dtype="fp32")
    g, a = traced.graph, "scaled_dot_product_attention"
    assert (traced.method, traced.note) == ("export", "")
    assert g.nodes[a]["args"][3] == {"node": "expand"}  # the mask handed on
    # q, k and v are one storage (the halved 3 x 4 fp32 embedding), then the log-sum-exp
    # (3 x 4 bytes) and the output
    assert g.nodes[a]["saved"] == [[None, 36], ["div", 48], [a, 12], [a, 48]]
    # two inputs, then every op, numbered in turn; an input has no GEMM
    assert [d["order"] for _, d in g.nodes(data=True)] == list(range(len(g)))
    assert list(g.nodes)[:2] == ["ids", "pad"] and g.nodes["pad"]["mm_inner"] is None
    # max over the last dimension: its values (3 fp32) and indices (3 int64) are its outputs
    m = g.nodes["max_1"]
    assert (m["shapes"], m["dtypes"], m["out_bytes"]) == ([[1, 3, 1]] * 2, ["float32", "int64"], 36)
    assert g.graph["custom_backward"] == ["Halve"]
    assert g.graph["numpy_draws"] == ["numpy.random.rand", "numpy.random.random"]
    assert g.graph["shared_modules"] == [["pair.0", "pair.1"]]


class _NeverRuns(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x):
        raise ValueError("bad config")


def test_a_model_neither_export_nor_its_hooks_can_run_names_its_file_and_both_failures(tmp_path):
    from planner.trace.export import _export_or_hooks

    mf = SimpleNamespace(path=tmp_path / "never.py")
    with pytest.raises(UserInputError) as e:
        _export_or_hooks(mf, _NeverRuns(), (torch.zeros(1, 2),), set(), set(), [])
    assert str(e.value) == (
        "never.py: cannot trace the model: torch.export failed (ValueError: bad config) and its "
        "forward raised in module '(top level)': ValueError: bad config"
    )
