"""planner/trace/repeats.py on cases small enough to state by hand, for its generated mutants
(benchmarks/generated_mutants.py).

``expand`` runs on op graphs written by ``_layers_graph``, which names ops as torch.fx does (one
counter per base name) and lays out a model of any depth: expanding its cut graph must give the
graph written directly at full depth, node for node, edge for edge. ``find_repeats`` runs eagerly
on the meta device over tests/models/layer_pattern.py (no tracer), and its periods are read off
the model's code. One tiny model is traced both ways with no cache (the deduplicated trace
against the full one, ``MESHPLAN_FULL_TRACE=1``). The recorder's pure-op memo runs aten ops
through a stand-in that counts their real calls; ``_relative`` and ``_contiguous`` read records
written by hand; ``_period`` is checked against a brute force over every cut. No fixture is
shared between tests and repeats.py keeps no module-level cache.
"""

from __future__ import annotations

import types

import networkx as nx
import pytest
import torch

from planner.modelfile import load_model_file
from planner.trace import repeats
from planner.trace.export import build_meta_model, meta_inputs
from planner.trace.graph import OpGraph
from planner.trace.loss_samples import meta_forward
from planner.trace.repeats import (
    FULL_TRACE_ENV,
    NotPeriodic,
    Repeat,
    copied_modules,
    copied_state,
    cut,
    expand,
    find_repeats,
    full_trace_forced,
)

PATTERN = "tests/models/layer_pattern.py"


def _layers_graph(layers: int, gated_every: int = 0) -> OpGraph:
    """ids -> embedding -> ``layers`` layers (linear, relu, [mul by a gate linear when
    k % gated_every == gated_every - 1], add of the layer's input) -> head linear. Names as
    torch.fx gives them: linear, linear_1, ...; each tensor's edge carries 16 + its position
    in its layer bytes (so an edge moved to the wrong producer shows)."""
    g = OpGraph()
    counters: dict[str, int] = {}
    order = 0

    def add(base: str, op: str, module: str, params: list, inputs: list, extra: int = 0) -> str:
        nonlocal order
        count = counters.get(base, 0)
        counters[base] = count + 1
        name = f"{base}_{count}" if count else base
        g.add_node(
            name,
            op=op,
            module=module,
            order=order,
            params=params,
            args=[{"node": i} for i in inputs] + [{"param": p} for p in params] + [{"k": 1}],
            saved=[[i, 8] for i in inputs] + [[None, 4]],
            shapes=[[2, 4]],
        )
        for j, i in enumerate(inputs):
            g.add_edge(i, name, bytes=16 + j + extra)
        order += 1
        return name

    prev = add("ids", "input", "", [], [])
    prev = add("embedding", "aten.embedding.default", "embed", ["embed.weight"], [prev])
    for k in range(layers):
        m = f"layers.{k}"
        h = add("linear", "aten.linear.default", f"{m}.up", [f"{m}.up.weight"], [prev])
        h = add("relu", "aten.relu.default", m, [], [h], extra=1)
        if gated_every and k % gated_every == gated_every - 1:
            gate = add("linear", "aten.linear.default", f"{m}.gate", [f"{m}.gate.weight"], [h])
            h = add("mul", "aten.mul.Tensor", m, [], [h, gate], extra=2)
        prev = add("add", "aten.add.Tensor", m, [], [prev, h], extra=3)
    out = add("linear", "aten.linear.default", "head", ["head.weight"], [prev])
    g.graph.update(
        outputs=[out],
        unread_params=sorted([f"layers.{k}.spare" for k in range(layers)] + ["embed.spare"]),
        other="kept",
    )
    return g


def _same_graph(a: nx.DiGraph, b: nx.DiGraph) -> None:
    assert list(a.nodes) == list(b.nodes)
    for n in a.nodes:
        assert a.nodes[n] == b.nodes[n], n
    assert list(a.edges(data=True)) == list(b.edges(data=True))
    assert a.graph == b.graph


@pytest.mark.parametrize(
    "count, start, period, gated_every",
    [
        (8, 1, 1, 0),  # kept 4: four copies of the last
        (9, 0, 1, 0),  # kept 3: six copies
        (10, 0, 2, 2),  # every second layer gated: kept 6, two copies of two layers
        (13, 1, 3, 3),  # gated 2, 5, 8, 11: kept 10, one copy of three layers
    ],
)
def test_the_cut_graph_expands_to_the_full_one(count, start, period, gated_every):
    r = Repeat("layers", count, start, period)
    full = _layers_graph(count, gated_every)
    _same_graph(expand(_layers_graph(r.kept, gated_every), r), full)
    assert isinstance(expand(_layers_graph(r.kept, gated_every), r), OpGraph)


@pytest.mark.parametrize(
    "r, gated_every", [(Repeat("layers", 8, 1, 1), 0), (Repeat("layers", 10, 0, 2), 2)]
)  # fmt: skip
def test_an_op_after_the_layers_reading_the_last_ones_weight_reads_it_at_full_depth(r, gated_every):
    """The head also reads the last layer's up weight (and a buffer of it): traced cut, that
    is the last kept layer's; expanded, the last layer's, as the full trace has it (periods of
    one and of two layers). A ``mean`` after the head (a name no layer uses) keeps its name."""

    def reading_last(layers: int) -> OpGraph:
        g = _layers_graph(layers, gated_every)
        name = next(n for n, d in g.nodes(data=True) if d["module"] == "head")
        head, last = g.nodes[name], f"layers.{layers - 1}"
        head["args"] += [{"param": f"{last}.up.weight"}, {"buffer": f"{last}.cache"}]
        g.add_node("mean", **{**head, "op": "aten.mean.default", "order": head["order"] + 1})
        g.add_edge(name, "mean", bytes=5)
        return g

    _same_graph(expand(reading_last(r.kept), r), reading_last(r.count))


def test_a_repeat_keeps_its_irregular_members_and_three_periods():
    assert Repeat("layers", 20, 2, 3).kept == 11
    assert Repeat("layers", 20, 0, 1).kept == 3


def _cut_graph() -> OpGraph:
    return _layers_graph(4)


R = Repeat("layers", 8, 1, 1)


def _move(g: OpGraph, node: str, order: float) -> OpGraph:
    g.nodes[node]["order"] = order
    return g


@pytest.mark.parametrize(
    "change, message",
    [
        (  # a top-level op between layers.1 and layers.2
            lambda g: g.add_node("between", **{**g.nodes["add_1"], "module": "", "order": 7.5}),
            "layers: ops between its members",
        ),
        (  # layer 2's linear runs before layer 1's add
            lambda g: _move(g, "linear_2", 6.5),
            "layers: members out of order",
        ),
        (  # layer 1's linear runs first of all: only the first two ops are out of order
            lambda g: _move(g, "linear_1", 1.5),
            "layers: members out of order",
        ),
        (  # layer 2's add runs last of all: only the last two ops are out of order
            lambda g: _move(g, "add_2", 13.5),
            "layers: members out of order",
        ),
        (  # layer 3 has one op more
            lambda g: g.add_node("extra", **{**g.nodes["add_3"], "order": 13.5}),
            "layers: periods of different lengths",
        ),
        (  # layer 3 has no ops at all: the third period is empty
            lambda g: g.remove_nodes_from(["linear_3", "relu_3", "add_3"]),
            "layers: periods of different lengths",
        ),
        (
            lambda g: nx.relabel_nodes(g, {"relu_3": "relu_4"}, copy=False),
            "layers: op names do not advance evenly (relu_1, relu_2, relu_4)",
        ),
        (
            lambda g: nx.relabel_nodes(g, {"relu_3": "gelu_3"}, copy=False),
            "layers: op names do not advance evenly (relu_1, relu_2, gelu_3)",
        ),
        (
            lambda g: g.nodes["relu_3"].update(shapes=[[2, 5]]),
            "layers: relu_3 is not relu_2 one period on",
        ),
        (
            lambda g: g.nodes["linear_3"].update(params=["layers.3.down.weight"]),
            "layers: linear_3 is not linear_2 one period on",
        ),
        (
            lambda g: g.nodes["add_3"].update(saved=[[None, 8], [None, 4]]),
            "layers: add_3 is not add_2 one period on",
        ),
        (
            lambda g: g.edges["linear_3", "relu_3"].update(bytes=99),
            "layers: relu_3's inputs are not relu_2's one period on",
        ),
        (  # the head reads layer 1's output besides layer 3's
            lambda g: g.add_edge("add_1", "linear_4", bytes=16),
            "layers: linear_4 reads a member before the last two periods",
        ),
    ],
)
def test_a_graph_that_does_not_repeat_is_refused_by_name(change, message):
    g = _cut_graph()
    change(g)
    with pytest.raises(NotPeriodic) as exc:
        expand(g, R)
    assert str(exc.value) == message


def test_the_names_of_an_irregular_start_are_not_renamed():
    """A first layer with another op name (gelu) before the period (start 1): expanded, it and
    the rest equal the full graph written with the same first layer."""
    full = _layers_graph(8)
    full = nx.relabel_nodes(full, {"relu": "gelu"})
    cut_graph = nx.relabel_nodes(_layers_graph(4), {"relu": "gelu"})
    out = expand(OpGraph(cut_graph), R)
    _same_graph(out, full)


def test_the_head_reads_the_last_layer_written():
    out = expand(_cut_graph(), R)
    assert list(out.pred["linear_8"]) == ["add_7"]
    assert out.graph["outputs"] == ["linear_8"]
    assert out.nodes["linear_8"]["args"][0] == {"node": "add_7"}
    assert out.nodes["linear_8"]["saved"] == [["add_7", 8], [None, 4]]
    assert out.nodes["linear_8"]["order"] == 1 + 1 + 8 * 3
    assert out.nodes["add_7"]["module"] == "layers.7"
    assert out.nodes["linear_7"]["params"] == ["layers.7.up.weight"]


def test_buffers_and_nested_arguments_move_with_the_member():
    """A layer's op reading its buffer (and a node inside a nested dict): copied with the
    member's index; a buffer outside the container stays."""

    def with_buffers(layers: int) -> OpGraph:
        g = _layers_graph(layers)
        for k in range(layers):
            name = "relu" if k == 0 else f"relu_{k}"
            node = "linear" if k == 0 else f"linear_{k}"
            g.nodes[name]["args"] += [
                {"buffer": f"layers.{k}.mask", "shape": [2]},
                {"buffer": "rope.cos"},
                {"nested": [{"node": node}, {"param": f"layers.{k}.up.weight", "t": True}]},
            ]
        return g

    _same_graph(expand(with_buffers(4), R), with_buffers(8))


def test_a_layer_read_from_two_periods_back_keeps_its_name():
    """Every layer also reads the first layer's output (T5's position bias): the copies' reads
    of it are not renamed."""

    def with_bias(layers: int) -> OpGraph:
        g = _layers_graph(layers)
        for k in range(1, layers):
            g.add_edge("add", f"add_{k}", bytes=5)
            g.nodes[f"add_{k}"]["args"].append({"node": "add"})
        return g

    _same_graph(expand(with_bias(4), R), with_bias(8))


def test_unread_parameters_of_the_template_are_written_for_each_copy():
    g = _cut_graph()
    g.graph["unread_params"] = ["embed.spare", "layers.0.spare", "layers.3.spare"]
    out = expand(g, R)
    assert out.graph["unread_params"] == [
        "embed.spare",
        "layers.0.spare",
        "layers.3.spare",
        "layers.4.spare",
        "layers.5.spare",
        "layers.6.spare",
        "layers.7.spare",
    ]
    del g.graph["unread_params"]
    assert expand(g, R).graph["unread_params"] == []


def test_modules_and_state_of_the_template_period_are_copied():
    """layers.4 and layers.5 form the last period of a period-2 cut (kept 6 of 10): each is
    written twice more; layers.1 (before it) and other names are left."""
    r = Repeat("layers", 10, 0, 2)
    names = {"layers.1", "layers.4", "layers.5.up", "embed", "layers"}
    assert copied_modules(names, [r]) == names | {
        "layers.6",
        "layers.8",
        "layers.7.up",
        "layers.9.up",
    }
    assert copied_state(["layers.5.up.weight", "head.weight", "layers.3.w"], [r]) == [
        "head.weight",
        "layers.3.w",
        "layers.5.up.weight",
        "layers.7.up.weight",
        "layers.9.up.weight",
    ]
    assert copied_modules({"layers.3"}, []) == {"layers.3"}
    # a container at the root: members are "0", "1", ...
    root = Repeat("", 6, 1, 1)
    assert copied_modules({"3.fc", "0", "x"}, [root]) == {"3.fc", "4.fc", "5.fc", "0", "x"}


def test_the_full_trace_is_forced_by_any_value_but_empty_and_0(monkeypatch):
    monkeypatch.delenv(FULL_TRACE_ENV, raising=False)
    assert not full_trace_forced()
    for value, forced in (("", False), ("0", False), ("1", True), ("yes", True)):
        monkeypatch.setenv(FULL_TRACE_ENV, value)
        assert full_trace_forced() is forced
    assert FULL_TRACE_ENV == "MESHPLAN_FULL_TRACE"


def test_a_cut_container_holds_its_first_kept_members_and_gets_them_back():
    model = torch.nn.Sequential(
        torch.nn.Linear(2, 2), torch.nn.ModuleList([torch.nn.ReLU() for _ in range(7)])
    )
    before = list(model[1]._modules.values())
    with cut(model, [Repeat("1", 7, 1, 1)]):
        assert list(model[1]._modules.values()) == before[:4]
    assert list(model[1]._modules.values()) == before
    with pytest.raises(RuntimeError), cut(model, [Repeat("1", 7, 0, 2)]):
        assert len(model[1]) == 6
        raise RuntimeError
    assert list(model[1]._modules.values()) == before


# --------------------------------------------------------------------------- eager fingerprints


def _found(args: dict) -> list[tuple]:
    mf = load_model_file(PATTERN, args)
    with torch.device("meta"):
        model = build_meta_model(mf, "bf16")
        inputs = meta_inputs(mf, 1, "bf16")
        with meta_forward():
            found = find_repeats(model, lambda: model(*inputs))
    return [(r.path, r.count, r.start, r.period) for r in found]


@pytest.mark.parametrize(
    "pattern, layers, expected",
    [
        ("plain", 6, [("layers", 6, 1, 1)]),  # layer 0 reads the embedding: kept 4, saves 2
        ("plain", 5, []),  # kept 4 saves one layer: not worth it
        ("plain", 7, [("layers", 7, 1, 1)]),
        ("every3", 15, [("layers", 15, 3, 3)]),  # gates on 2, 5, 8: periods of three from 3
        ("every3", 11, []),  # 3 + 9 = 12 kept of 11
        ("one_off", 12, [("layers", 12, 7, 1)]),  # layer 5 differs, 6 reads it: from 7
        ("skip", 8, []),  # code between the layers
    ],
)
def test_repeats_are_found_from_the_models_code(pattern, layers, expected):
    assert _found({"layers": layers, "pattern": pattern}) == expected


def test_a_model_without_a_container_of_two_has_no_repeats():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))  # one member
    with meta_forward():
        x = torch.empty(1, 2)
        assert find_repeats(model.to("meta"), lambda: model(x)) == []


def test_outermost_containers_only():
    """A Sequential of layers each holding a ModuleList: only the outer one is a container."""
    inner = [torch.nn.ModuleList([torch.nn.ReLU(), torch.nn.ReLU()]) for _ in range(3)]
    model = torch.nn.Module()
    model.outer = torch.nn.Sequential(*[torch.nn.Module() for _ in range(3)])
    for m, i in zip(model.outer, inner):
        m.inner = i
    model.single = torch.nn.ModuleList([torch.nn.ReLU()])
    model.pair = torch.nn.ModuleList([torch.nn.ReLU(), torch.nn.ReLU()])
    found = repeats._containers(model)
    assert sorted(found) == ["outer", "pair"]
    assert found["outer"] == list(model.outer)
    root = torch.nn.Sequential(
        torch.nn.ReLU(), torch.nn.Sequential(torch.nn.ReLU(), torch.nn.ReLU())
    )
    assert sorted(repeats._containers(root)) == [""]


@pytest.mark.parametrize(
    "ids, expected",
    [
        ([0, 0, 0, 0, 0], (0, 1)),  # all alike: kept 3, saves 2
        ([0, 0, 0, 0], None),  # kept 3 saves one: not worth it
        ([5, 0, 0, 0, 0, 0], (1, 1)),  # the first differs: kept 4, saves 2
        ([5, 0, 0, 0, 0], None),
        ([1, 2, 1, 2, 1, 2, 1, 2, 1, 2], (0, 2)),  # period 2: kept 6, saves 4
        ([1, 2, 1, 2, 1, 2, 1, 2, 1], (1, 2)),  # odd count: the copies are whole periods
        ([0, 1, 2, 3, 4, 5, 6, 7], None),  # nothing repeats
        ([7, 8, 0, 0, 0, 0, 0, 0, 0], (2, 1)),
        # a period of one from late (kept 23 or 28) found first; six or seven keep fewer
        ([2] + [0, 2, 2, 2, 2, 2] * 4, (1, 6)),
        ([4, 1] + [1, 1, 2, 2, 2, 2, 2] * 4, (2, 7)),
    ],
)
def test_the_period_is_the_cut_that_keeps_the_fewest(ids, expected, monkeypatch):
    """Members given fingerprint ids directly (``_encoded`` replaced): (start, period)."""
    monkeypatch.setattr(repeats, "_encoded", lambda prints, p: list(ids))
    assert repeats._period([[]] * len(ids)) == expected


def test_a_member_read_within_a_period_is_relative_and_further_back_absolute():
    """Member k reads member k - 1 (relative at any period) and member 0 (absolute unless k is
    within the period)."""
    prints = [
        [("op", (), ((2,),))],
        [("op", ((("mem", 0, 0), (2,), "f"),), ((2,),))],
        [("op", ((("mem", 1, 0), (2,), "f"), (("mem", 0, 0), (2,), "f")), ((2,),))],
        [("op", ((("mem", 2, 0), (2,), "f"), (("mem", 0, 0), (2,), "f")), ((2,),))],
    ]
    assert repeats._encoded(prints, 1) == [0, 1, 2, 2]  # member 0 absolute for 2 and 3
    assert repeats._encoded(prints, 3) == [0, 1, 2, 3]  # relative: 2 back vs 3 back


def test_a_read_of_the_member_before_keeps_the_shape_read():
    """Member 1 reads member 0's 3-wide output, members 2 and 3 their predecessor's 1-wide one
    (same op, same output): member 1 is not member 2."""
    prints = [[("op", (), ((3,),))]] + [
        [("op", ((("mem", k - 1, 0), (w,), "f"),), ((1,),))] for k, w in ((1, 3), (2, 1), (3, 1))
    ]
    assert repeats._encoded(prints, 1) == [0, 1, 2, 2]


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2))

    def forward(self, x, extra=None):
        return x * self.w if extra is None else x * self.w + extra


def test_the_recorder_names_a_members_own_state_and_the_models():
    """Inside member 1 its weight is its own (".w", relative) and the model's scale, handed to
    it, is state by its name, as after the container; the input is a tensor of a shape."""
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([_Scaled(), _Scaled()])
    model.scale = torch.nn.Parameter(torch.ones(2))
    x = torch.ones(2)

    def run():
        return (model.layers[1](model.layers[0](x), model.scale) * model.scale).to(torch.float64)

    rec = repeats._record(model, repeats._containers(model), run)
    labels = [label for label, _ in rec.records]
    assert labels == [("layers", 0), ("layers", 1), ("layers", 1), None, None]
    refs = [[p[0] if isinstance(p, tuple) else p for p in r[1]] for _, r in rec.records]
    assert refs == [
        [("x", (2,), "torch.float32"), ("own", ".w")],
        [("op", ("layers", 0), 0), ("own", ".w")],
        [("op", ("layers", 1), 0), ("state", "scale")],
        [("op", ("layers", 1), 1), ("state", "scale")],
        [("op", None, 0), "torch.float64"],  # the copy's dtype, a keyword
    ]
    op, parts, shapes = rec.records[-1][1]
    assert (op, parts[0][1:], shapes) == ("aten._to_copy.default", ((2,), "torch.float32"), ((2,),))


def test_one_tiny_model_traced_deduplicated_equals_its_full_trace(monkeypatch):
    """Traced with no cache both ways: the plain pattern's 6 layers from 4 traced."""
    from planner.trace import export

    graphs = []
    for forced in ("1", "0"):
        monkeypatch.setenv(FULL_TRACE_ENV, forced)
        result = export.trace_model(load_model_file(PATTERN, {"layers": 6}), 1, "bf16")
        graphs.append(result)
    full, dedup = graphs
    assert full.repeats == [] and dedup.repeats == [Repeat("layers", 6, 1, 1)]
    _same_graph(full.graph, dedup.graph)


# --------------------------------------------------------------------------- the pure-op memo


class _Counted:
    """An aten op standing in for itself (its schema), counting the times it really runs."""

    def __init__(self, op):
        self.op, self._schema, self.calls = op, op._schema, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.op(*args, **kwargs)


def _call(rec, op, *args, ref="a", **kwargs):
    """``rec._run`` as ``__torch_dispatch__`` calls it: each tensor's part (its producer
    ``ref``, shape, dtype), other arguments by their repr."""
    flat = repeats._leaves((args, kwargs))
    parts = [
        ((ref,), tuple(a.shape), str(a.dtype)) if isinstance(a, torch.Tensor) else repr(a)
        for a in flat
    ]
    return rec._run(op, args, kwargs, flat, parts)


def _spec(t):
    return tuple(t.shape), t.stride(), t.dtype, t.device.type


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def test_a_pure_op_on_meta_tensors_runs_once_per_shapes_strides_and_arguments():
    """A product asked again with the same shapes and strides (another producer) is made from
    the first answer: the same shape, strides, dtype, on the meta device, and a new tensor;
    another shape of the same strides, or a transposed input, runs again."""
    rec = repeats._Recorder({})
    mm = _Counted(torch.ops.aten.mm.default)
    w = _meta(3, 4)
    first = _call(rec, mm, _meta(2, 3), w, ref="a")
    second = _call(rec, mm, _meta(2, 3), w, ref="b")
    assert mm.calls == 1 and second is not first
    assert _spec(first) == _spec(second) == ((2, 4), (4, 1), torch.bfloat16, "meta")
    tall = _call(rec, mm, _meta(4, 3), w)  # strides (3, 1) as the (2, 3) input's
    assert mm.calls == 2 and _spec(tall) == ((4, 4), (4, 1), torch.bfloat16, "meta")
    _call(rec, mm, _meta(3, 2).t(), w)  # shape (2, 3), strides (1, 2)
    assert mm.calls == 3
    # an output of other strides made again from the memo keeps them
    clone = _Counted(torch.ops.aten.clone.default)
    odd = _meta(3, 2).t()
    made = [_call(rec, clone, odd) for _ in range(2)]
    assert clone.calls == 1
    assert [_spec(m) for m in made] == [((2, 3), (1, 2), torch.bfloat16, "meta")] * 2


def test_a_pure_op_of_two_outputs_or_keyword_arguments_is_made_whole_from_the_memo():
    """``max(x, 1)`` gives values and indices (a tuple both times); ``_to_copy`` to float64
    keeps its keyword's dtype the second time too."""
    rec = repeats._Recorder({})
    mx = _Counted(torch.ops.aten.max.dim)
    outs = [_call(rec, mx, _meta(2, 5), 1) for _ in range(2)]
    assert mx.calls == 1
    for out in outs:
        assert isinstance(out, tuple) and [_spec(o) for o in out] == [
            ((2,), (1,), torch.bfloat16, "meta"),
            ((2,), (1,), torch.int64, "meta"),
        ]
    to = _Counted(torch.ops.aten._to_copy.default)
    copies = [_call(rec, to, _meta(2, 3), dtype=torch.float64) for _ in range(2)]
    assert to.calls == 1
    assert [_spec(c) for c in copies] == [((2, 3), (3, 1), torch.float64, "meta")] * 2


def test_views_in_place_ops_and_real_tensors_run_every_time():
    """A view of the input (``t``), an op writing its input (``add_``, ``_foreach_add_``) and a
    product of CPU tensors are never made from the memo: each call runs, the view is the
    input's, the in-place result the input itself, and the CPU values real."""
    rec = repeats._Recorder({})
    x = _meta(3, 2)
    t = _Counted(torch.ops.aten.t.default)
    views = [_call(rec, t, x) for _ in range(2)]
    assert t.calls == 2 and all(v._base is x for v in views)
    add_ = _Counted(torch.ops.aten.add_.Tensor)
    assert all(_call(rec, add_, x, _meta(3, 2)) is x for _ in range(2)) and add_.calls == 2
    each = _Counted(torch.ops.aten._foreach_add_.Scalar)
    assert [_call(rec, each, [x], 1.0) for _ in range(2)] == [None, None] and each.calls == 2
    a, w = torch.ones(2, 3), torch.full((3, 4), 2.0)
    mm = _Counted(torch.ops.aten.mm.default)
    products = [_call(rec, mm, a, w) for _ in range(2)]
    assert mm.calls == 2
    assert all(p.device.type == "cpu" and p.tolist() == [[6.0] * 4] * 2 for p in products)
    y = torch.ones(2)
    assert _call(rec, add_, y, torch.ones(2), alpha=2) is y and y.tolist() == [3.0, 3.0]


def test_a_freed_outputs_id_is_never_taken_for_a_later_input():
    """The recorder keeps every output alive: tensors made after outputs it was handed and
    dropped (CPython reuses freed ids) are inputs of a shape, never those ops' outputs."""
    rec = repeats._Recorder({})
    x = torch.ones(2)
    with rec:
        for _ in range(30):
            torch.neg(x)  # the result dropped at once
    fresh = [torch.ones(2) for _ in range(30)]
    assert [rec._ref(t) for t in fresh] == [("x", (2,), "torch.float32")] * 30


# --------------------------------------------------------------------------- labels and calls


def test_a_container_at_the_root_names_its_members_state_by_index():
    """The model is the container: member 1's weight is "1.w", its own (".w")."""
    model, x = torch.nn.Sequential(_Scaled(), _Scaled()), torch.ones(2)
    rec = repeats._record(model, repeats._containers(model), lambda: model(x))
    assert [label for label, _ in rec.records] == [("", 0), ("", 1)]
    assert [r[1][1][0] for _, r in rec.records] == [("own", ".w")] * 2


def test_state_read_outside_every_member_is_named_in_full_whatever_its_name():
    """A module beside the layers, its weight read before the first member and after the last:
    state "XXXX.w" in full, for outside the members the prefix that names state relative to a
    member is empty. Any other prefix left there would shorten the name of a module that
    begins with it; "XXXX" is the module's name because it is the placeholder a mutated
    prefix takes (mutmut's string mutation of the empty prefix), the one such prefix known."""
    model = torch.nn.Module()
    model.XXXX = _Scaled()
    model.layers = torch.nn.ModuleList([_Scaled(), _Scaled()])

    x = torch.ones(2)

    def run():
        h = model.XXXX(x)
        return model.XXXX(model.layers[1](model.layers[0](h)))

    rec = repeats._record(model, repeats._containers(model), run)
    refs = [(label, r[1][1][0]) for label, r in rec.records]
    assert refs == [
        (None, ("state", "XXXX.w")),
        (("layers", 0), ("own", ".w")),
        (("layers", 1), ("own", ".w")),
        (None, ("state", "XXXX.w")),
    ]


class _Twice(torch.nn.Module):
    """Two ModuleLists: ``first``'s member 1 runs twice; ``second``'s six layers are alike."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(3)])
        self.second = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(6)])

    def forward(self, x):
        x = self.first[2](self.first[1](self.first[1](self.first[0](x))))
        for layer in self.second:
            x = layer(x)
        return x


def test_each_members_calls_are_counted():
    model, x = _Twice(), torch.ones(1, 2)
    rec = repeats._record(model, repeats._containers(model), lambda: model(x))
    assert rec.calls == {("first", 0): 1, ("first", 1): 2, ("first", 2): 1} | {
        ("second", k): 1 for k in range(6)
    }
    assert not repeats._contiguous(rec, "first", 3)
    assert repeats._contiguous(rec, "second", 6)


def test_a_container_not_run_contiguously_is_skipped_and_the_next_still_found():
    """``first`` (a member called twice) is passed over, not cut; ``second`` after it repeats
    from its member 1 (member 0 reads ``first``'s output): kept 4 of 6."""
    model = _Twice().to("meta")
    with meta_forward():
        x = torch.empty(1, 2)
        found = find_repeats(model, lambda: model(x))
    assert found == [Repeat("second", 6, 1, 1)]


def test_code_after_the_container_that_counts_its_members_refuses_the_cut():
    """The head scales by the number of layers: the cut model's ops after the container differ
    from the full one's, so nothing is cut; read from a member before the last, likewise."""

    class Counting(torch.nn.Module):
        def __init__(self, read):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(7)])
            self.read = read

        def forward(self, x):
            outs = [x]
            for layer in self.layers:
                outs.append(layer(outs[-1]))
            return self.read(self, outs)

    def found(read):
        model = Counting(read).to("meta")
        with meta_forward():
            x = torch.empty(1, 2)
            return find_repeats(model, lambda: model(x))

    assert found(lambda m, outs: outs[-1] * 2) == [Repeat("layers", 7, 1, 1)]
    assert found(lambda m, outs: outs[-1] * len(m.layers)) == []
    assert found(lambda m, outs: outs[-1] + outs[2]) == []  # member 1's output


# --------------------------------------------------------------------------- records by hand


def _records(*labels):
    """A recorder's records and calls written by hand: one op per label, calls counted."""
    calls: dict = {}
    for label in labels:
        if label is not None:
            calls[label] = 1
    return types.SimpleNamespace(records=[(label, ()) for label in labels], calls=calls)


@pytest.mark.parametrize(
    "labels, calls, expected",
    [
        # ops before and after, a member of two ops
        ([None, ("L", 0), ("L", 0), ("L", 1), ("L", 2), None], {}, {"L": True}),
        ([None, ("L", 0), ("L", 1), ("L", 2)], {("L", 1): 2}, {"L": False}),  # called twice
        ([("L", 0), ("L", 1)], {("L", 2): None}, {"L": False}),  # member 2 never ran
        ([("L", 0), None, ("L", 1), ("L", 2)], {}, {"L": False}),  # an op between
        ([("L", 0), ("L", 2), ("L", 1)], {}, {"L": False}),  # out of order
        ([("L", 1), ("L", 2), ("L", 0)], {}, {"L": False}),  # the first last
        # two containers one after the other, either way round; the last op a member's
        ([("M", 0), ("M", 1), ("L", 0), ("L", 1), ("L", 2)], {}, {"L": True, "M": True}),
        ([("L", 0), ("L", 1), ("L", 2), ("M", 0), ("M", 1)], {}, {"L": True, "M": True}),
        ([None, ("L", 0), ("L", 2)], {("L", 1): 1}, {"L": False}),  # member 1 ran no op
    ],
)
def test_members_run_once_each_in_order_with_nothing_between(labels, calls, expected):
    rec = _records(*labels)
    rec.calls.update({k: v for k, v in calls.items() if v is not None})
    for path, contiguous in expected.items():
        count = 3 if path == "L" else 2
        assert repeats._contiguous(rec, path, count) is contiguous


def test_reads_of_members_are_relative_inside_their_container_and_from_the_end_outside():
    """Container L of 3 members, M of 2. A read of L's member j from L keeps ("mem", j, op);
    from M or outside it is ("end", "L", 2 - j, op); reads of top-level ops, parameters and
    inputs, and non-tensor arguments, are left as they were."""
    x = ("x", (2,), "f")

    def part(ref, width=2):
        return (ref, (width,), "torch.float32")

    records = [
        (None, ("in", (part(x), "1"), ((2,),))),
        (("L", 0), ("a", (part(("op", None, 0)), part(("own", ".w"))), ((2,),))),
        (("L", 1), ("b", (part(("op", ("L", 0), 0), 3), part(("state", "s"))), ((3,),))),
        (("M", 0), ("c", (part(("op", ("L", 1), 0)),), ((2,),))),
        (None, ("d", (part(("op", ("L", 1), 0), 5), part(("op", ("M", 0), 0))), ((2,),))),
    ]
    rec = types.SimpleNamespace(records=records)
    outside, members = repeats._relative(rec, {"L": 3, "M": 2})
    assert outside == [
        ("in", (part(x), "1"), ((2,),)),
        ("d", (part(("end", "L", 1, 0), 5), part(("end", "M", 1, 0))), ((2,),)),
    ]
    assert members == {
        "L": [
            [("a", (part(("op", None, 0)), part(("own", ".w"))), ((2,),))],
            [("b", (part(("mem", 0, 0), 3), part(("state", "s"))), ((3,),))],
            [],
        ],
        "M": [[("c", (part(("end", "L", 1, 0)),), ((2,),))], []],
    }
    # a read of L's first member from outside counts two from L's end
    rec.records = [(None, ("e", (part(("op", ("L", 0), 4)),), ()))]
    assert repeats._relative(rec, {"L": 3})[0] == [("e", (part(("end", "L", 2, 4)),), ())]


@pytest.mark.parametrize(
    "ids, expected",
    [
        # period 3 from the end (kept 41), then 11 from the start (kept 33): the longer wins
        (list("yxxyxxyxxyx") * 4, (0, 11)),
        (["Z"] + list("yxxyxxyxxyx") * 4, (1, 11)),
    ],
)
def test_a_longer_period_from_earlier_replaces_a_short_one_from_late(ids, expected, monkeypatch):
    """Found by brute force over every cut (start, period): the one that keeps the fewest
    members, of those saving two or more, is the answer."""
    monkeypatch.setattr(repeats, "_encoded", lambda prints, p: list(ids))
    n = len(ids)
    cuts = [
        (s, p)
        for p in range(1, n + 1)
        for s in range(n)
        if (n - s) % p == 0
        and n - (s + 3 * p) >= 2
        and all(ids[k] == ids[k - p] for k in range(s + p, n))
    ]
    brute = min(cuts, key=lambda c: (c[0] + 3 * c[1], c[1]))
    assert brute == expected
    assert repeats._period([[]] * n) == expected
