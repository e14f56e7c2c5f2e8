"""planner/trace/repeats.py on cases small enough to state by hand, for its generated mutants
(benchmarks/generated_mutants.py).

``expand`` runs on op graphs written by ``_layers_graph``, which names ops as torch.fx does (one
counter per base name) and lays out a model of any depth: expanding its cut graph must give the
graph written directly at full depth, node for node, edge for edge. ``find_repeats`` runs eagerly
on the meta device over tests/models/layer_pattern.py (no tracer), and its periods are read off
the model's code. One tiny model is traced both ways with no cache (the deduplicated trace
against the full one, ``MESHPLAN_FULL_TRACE=1``).
"""

from __future__ import annotations

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
