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


def test_a_repeating_stack_is_traced_cut_and_written_out_whole(tmp_path):
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
    m.norm = nn.LayerNorm(2)
    graph = _op_graph([
        ("aten.t.default", "own"), ("aten.view.default", "own"), ("aten.matmul.default", "own"),
        ("aten.add.Tensor", "own"), ("aten.linear.default", "router"),
        ("aten.topk.default", "router"),
    ])  # fmt: skip
    # ``silent`` runs no op in the trace: not shown to be a product, not sharded
    assert tp_shardable_modules(m, graph) == ["conv1d", "emb", "lin", "nobias", "own"]
    assert tp_shardable_modules(m) == ["conv1d", "emb", "lin", "nobias"]


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
