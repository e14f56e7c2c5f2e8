"""planner/trace/blocks.py's blocks on op graphs drawn by hand, for its generated mutants
(benchmarks/generated_mutants.py), and on one tiny model traced with no cache (the tracer and
make_blocks run in the test, never a cached trace's blocks).

Every figure a node carries is a distinct power of two (FLOPs, bytes, saved tensors), so each
block total below is the sum of the nodes the drawing puts in it, and a node counted in the wrong
block, twice, or not at all changes it.
"""

from __future__ import annotations

import networkx as nx
import pytest
from conftest import make_block

from planner.trace.blocks import (
    Block,
    _name_classes,
    cached_core_nodes,
    in_modules,
    make_blocks,
    product_params,
    product_share,
    reads_one_tensor,
    runs_eagerly_in_stage,
)

MM = "aten.mm.default"

# The model: emb -> layers.0 (fc, act) -> layers.1 (fc, act) -> a top-level residual add ->
# norm -> head (its weight the embedding's, tied). Module types as nn.Module names.
MODULES = {
    "": "Net",
    "emb": "Embedding",
    "layers": "ModuleList",
    "layers.0": "Layer",
    "layers.0.fc": "Linear",
    "layers.0.act": "ReLU",
    "layers.1": "Layer",
    "layers.1.fc": "Linear",
    "layers.1.act": "ReLU",
    "norm": "LayerNorm",
    "head": "Linear",
}
SHAPES = {
    "emb.weight": [10, 4],
    "layers.0.fc.weight": [4, 4],
    "layers.1.fc.weight": [4, 4],
    "layers.1.spare": [3],  # read by no op: stays with layers.1, whose module holds it
    "norm.weight": [4],
    "free": [5],  # read by no op, in no block's module: the first block's
}
# (name, op, module, params, inputs); edges carry the producer's bytes
NODES = [
    ("x", "input", "", [], []),
    ("e", "aten.embedding.default", "emb", ["emb.weight"], ["x"]),
    ("f0", MM, "layers.0.fc", ["layers.0.fc.weight"], ["e"]),
    ("r0", "aten.relu.default", "layers.0.act", [], ["f0"]),
    ("f1", MM, "layers.1.fc", ["layers.1.fc.weight"], ["r0"]),
    ("r1", "aten.relu.default", "layers.1.act", [], ["f1"]),
    ("res", "aten.add.Tensor", "", [], ["r1", "e"]),  # top-level code: joins layers.1
    ("n", "aten.layer_norm.default", "norm", ["norm.weight"], ["res"]),
    ("h", MM, "head", ["head.weight"], ["n"]),
]
BIT = {name: 1 << (2 * i) for i, (name, *_) in enumerate(NODES)}  # 1, 4, 16, ... per node


def _graph(nodes=NODES, modules=MODULES, containers=("layers",), **facts) -> nx.DiGraph:
    g = nx.DiGraph(
        modules=dict(modules),
        containers=list(containers),
        param_shapes=dict(facts.pop("shapes", SHAPES)),
        param_owner=dict(facts.pop("owner", {"head.weight": "emb.weight"})),
        outputs=list(facts.pop("outputs", ["h"])),
        **facts,
    )
    for order, (name, op, module, params, inputs) in enumerate(nodes):
        b = BIT.get(name, 1 << 30)
        g.add_node(
            name,
            op=op,
            module=module,
            order=order,
            params=list(params),
            shapes=[[2, 4]],
            dtypes=["float32"],
            args=[{"node": i} for i in inputs] + [{"param": p} for p in params],
            out_bytes=b,
            fwd_flops=3 * b,
            bwd_flops=5 * b,
            fwd_bytes=7 * b,
            bwd_bytes=9 * b,
            saved=[[name, b], [None, 2 * b]] if op != "input" else [],
            requires_grad=op != "input",
        )
        for i in inputs:
            g.add_edge(i, name, bytes=BIT[i])
    return g


def _sum(names, factor=1):
    return sum(factor * BIT[n] for n in names)


def test_blocks_follow_the_repeated_container_and_merge_the_rest():
    """emb (with the input before it), each layer (layers.1 with the top-level add after it),
    norm+head merged (neither is a member)."""
    blocks = make_blocks(_graph())
    assert [b.name for b in blocks] == ["emb", "layers.0", "layers.1", "norm+head"]
    assert [b.modules for b in blocks] == [["emb"], ["layers.0"], ["layers.1"], ["norm", "head"]]
    assert [b.nodes for b in blocks] == [["x", "e"], ["f0", "r0"], ["f1", "r1", "res"], ["n", "h"]]
    assert [b.index for b in blocks] == [0, 1, 2, 3]
    assert [b.member for b in blocks] == [False, True, True, False]


def test_each_block_sums_its_own_nodes_figures():
    blocks = make_blocks(_graph())
    for b in blocks:
        ops = [n for n in b.nodes if n != "x"]
        assert b.fwd_flops == _sum(b.nodes, 3), b.name
        assert b.bwd_flops == _sum(b.nodes, 5), b.name
        assert b.fwd_bytes == _sum(b.nodes, 7), b.name
        assert b.bwd_bytes == _sum(b.nodes, 9), b.name
        assert b.saved_bytes == _sum(ops, 3), b.name  # its own output and twice it
        assert b.saved_selective_bytes == _sum(ops, 3), b.name  # no core here
        assert b.transient_bytes == max(7 * BIT[n] for n in b.nodes), b.name


def test_parameters_go_to_their_first_user_and_a_tied_read_is_listed():
    """The head reads the embedding's weight (tied): the embedding block owns its 40 elements,
    the head's block lists it as tied; layers.1 also owns its unread spare (3); ``free`` lies
    in no block's module and goes to the first block."""
    blocks = make_blocks(_graph())
    assert [b.param_names for b in blocks] == [
        ["emb.weight", "free"],
        ["layers.0.fc.weight"],
        ["layers.1.fc.weight", "layers.1.spare"],
        ["norm.weight"],
    ]
    assert [b.params for b in blocks] == [45, 16, 19, 4]
    assert [b.tied for b in blocks] == [{}, {}, {}, {"emb.weight": 40}]


def test_a_tied_weight_goes_to_its_first_user_in_execution_order_whatever_its_name():
    """The tie named the other way (the head's name canonical, the embedding reading it by
    alias): the embedding still uses it first, so its block owns it, not the block holding
    the head module; and with the embedding's node renamed to sort after the head's, still."""
    shapes = {**SHAPES, "head.weight": SHAPES["emb.weight"]}
    del shapes["emb.weight"]
    g = _graph(shapes=shapes, owner={"emb.weight": "head.weight"})
    for graph in (g, nx.relabel_nodes(g, {"e": "z_e"})):
        blocks = make_blocks(graph)
        assert [b.param_names for b in blocks][0] == ["free", "head.weight"]
        assert [b.tied for b in blocks] == [{}, {}, {}, {"head.weight": 40}]


def test_boundaries_hold_every_tensor_crossing_each_cut():
    """Cut 0 (after emb): e (read by f0 and by the add in layers.1). Cut 1: r0 and e. Cut 2:
    res. The last block's cut holds nothing after it."""
    blocks = make_blocks(_graph())
    assert [b.boundary_bytes for b in blocks] == [
        BIT["e"],
        BIT["r0"] + BIT["e"],
        BIT["res"],
        0,
    ]


def test_inputs_and_outputs_count_each_tensor_once_at_its_largest_read():
    """layers.1 takes r0 and e in; emb hands e out (once, though two blocks read it); the head
    is the model's output, counted at its own bytes."""
    blocks = make_blocks(_graph())
    assert [b.input_bytes for b in blocks] == [
        0,
        BIT["e"],
        BIT["r0"] + BIT["e"],
        BIT["res"],
    ]
    assert [b.output_bytes for b in blocks] == [BIT["e"], BIT["r0"], BIT["res"], BIT["h"]]


def test_a_tensor_read_twice_inside_a_block_is_one_input_and_a_later_output_adds():
    """res reads r0 too (r0 then enters layers.1 through two of its ops: counted once); aux,
    a second model output after res in layers.1, adds its bytes to res's."""
    nodes = [*NODES[:6], ("res", "aten.add.Tensor", "", [], ["r1", "e", "r0"]),
             ("aux", "aten.relu.default", "layers.1.act", [], ["r1"]), *NODES[7:]]  # fmt: skip
    blocks = make_blocks(_graph(nodes, outputs=["h", "aux"]))
    assert blocks[2].nodes == ["f1", "r1", "res", "aux"]
    assert blocks[2].input_bytes == BIT["r0"] + BIT["e"]
    assert blocks[2].output_bytes == BIT["res"] + (1 << 30)  # aux: the default bytes


def test_a_constant_several_blocks_read_is_no_blocks_input():
    """A mask without gradient made in emb, read by both layers: it is in emb's output and
    boundaries, but in neither layer's input (it lives once for the step)."""
    nodes = list(NODES)
    nodes.insert(2, ("mask", "aten.ones.default", "emb", [], []))
    nodes[3] = ("f0", MM, "layers.0.fc", ["layers.0.fc.weight"], ["e", "mask"])
    nodes[5] = ("f1", MM, "layers.1.fc", ["layers.1.fc.weight"], ["r0", "mask"])
    BIT["mask"] = 1 << 40
    try:
        g = _graph(nodes)
        g.nodes["mask"]["requires_grad"] = False
        blocks = make_blocks(g)
        assert [b.input_bytes for b in blocks] == [
            0,
            BIT["e"],
            BIT["r0"] + BIT["e"],
            BIT["res"],
        ]
        assert blocks[0].output_bytes == BIT["e"] + BIT["mask"]
        assert blocks[0].boundary_bytes == BIT["e"] + BIT["mask"]
        assert blocks[1].boundary_bytes == BIT["r0"] + BIT["e"] + BIT["mask"]
        del g.nodes["mask"]["requires_grad"]  # an op that says nothing: no gradient
        assert [b.input_bytes for b in make_blocks(g)][1:3] == [BIT["e"], BIT["r0"] + BIT["e"]]
        g.nodes["mask"]["requires_grad"] = True  # with a gradient: each reader takes it in
        blocks = make_blocks(g)
        assert blocks[1].input_bytes == BIT["e"] + BIT["mask"]
        assert blocks[2].input_bytes == BIT["r0"] + BIT["e"] + BIT["mask"]
        g.nodes["mask"]["requires_grad"] = False  # read by one block only: its input
        g.remove_edge("mask", "f1")
        assert make_blocks(g)[1].input_bytes == BIT["e"] + BIT["mask"]
        nodes[3] = ("f0", MM, "layers.0.fc", ["layers.0.fc.weight"], ["mask", "e"])
        g = _graph(nodes)  # the constant read first: the stream after it still counts
        g.nodes["mask"]["requires_grad"] = False
        assert make_blocks(g)[1].input_bytes == BIT["e"]
    finally:
        del BIT["mask"]


def test_identical_members_share_a_class_and_the_others_get_their_own():
    blocks = make_blocks(_graph())
    assert blocks[1].cls != blocks[2].cls  # layers.1 also holds the top-level add
    assert [b.label for b in blocks] == ["emb", "Layer", "Layer#" + blocks[2].cls[:4], "norm+head"]
    nodes = [n for n in NODES if n[0] != "res"]
    nodes[-2] = ("n", "aten.layer_norm.default", "norm", ["norm.weight"], ["r1"])
    same = make_blocks(_graph(nodes))
    assert same[1].cls == same[2].cls and len(same[1].cls) == 12
    assert [b.label for b in same] == ["emb", "Layer", "Layer", "norm+head"]
    assert len({same[0].cls, same[1].cls, same[3].cls}) == 3


def test_an_op_of_a_module_outside_the_block_keeps_its_whole_path_in_the_class():
    """Top-level code after layers.1 (module ""), the model module's own code after layers.2
    and layers.3 (module "m"), otherwise alike: layers.1's class is not layers.2's, which is
    layers.3's."""
    modules = {"": "Net", "m": "M", "m.layers": "ModuleList"}
    nodes: list[tuple] = [("x", "input", "", [], [])]
    prev, shapes = "x", {}
    for k, code in enumerate(["", "", "m", "m"]):
        modules[f"m.layers.{k}"] = "L"
        shapes[f"m.layers.{k}.w"] = [4, 4]
        nodes += [(f"f{k}", MM, f"m.layers.{k}", [f"m.layers.{k}.w"], [prev]),
                  (f"a{k}", "aten.relu.default", code, [], [f"f{k}"])]  # fmt: skip
        prev = f"a{k}"
        BIT.setdefault(f"f{k}", 1 << (36 + k))
        BIT.setdefault(prev, 1 << (44 + k))
    blocks = make_blocks(_graph(nodes, modules, ("m.layers",), shapes=shapes, owner={},
                                outputs=[prev]))  # fmt: skip
    assert [b.nodes for b in blocks][1:] == [["f1", "a1"], ["f2", "a2"], ["f3", "a3"]]
    assert blocks[1].cls != blocks[2].cls == blocks[3].cls


def test_a_members_class_reads_relative_paths_shapes_and_argument_kinds():
    """Two layers equal but for one thing each time: a parameter's shape, an argument's
    constant, a node reference's position, the module path under the layer: different classes."""
    nodes = [n for n in NODES if n[0] != "res"]
    nodes[-2] = ("n", "aten.layer_norm.default", "norm", ["norm.weight"], ["r1"])

    def classes(change) -> tuple[str, str]:
        g = _graph(nodes)
        change(g)
        b = make_blocks(g)
        return b[1].cls, b[2].cls

    a, b = classes(lambda g: None)
    assert a == b
    shapes = {**SHAPES, "layers.1.fc.weight": [4, 5]}
    a, b = classes(lambda g: g.graph.update(param_shapes=shapes))
    assert a != b
    a, b = classes(
        lambda g: (
            g.nodes["f0"]["args"].append({"const": 2}),
            g.nodes["f1"]["args"].append({"buffer": "b"}),
        )
    )
    assert a == b  # a constant's or buffer's value is not read, only that it is one
    a, b = classes(lambda g: g.nodes["f1"]["args"].append({"alpha": 2}))
    assert a != b
    a, b = classes(lambda g: g.nodes["r1"].update(args=[{"node": "f1"}, {"node": "f1"}]))
    assert a != b
    a, b = classes(lambda g: g.nodes["r1"].update(module="layers.1.other"))
    assert a != b
    a, b = classes(lambda g: g.nodes["r1"].update(dtypes=["bfloat16"]))
    assert a != b
    a, b = classes(lambda g: g.nodes["r0"].update(args=[{"node": "e"}]))
    assert a != b  # an input from outside the block is not the block's own node
    a, b = classes(lambda g: g.nodes["f1"]["args"].__setitem__(0, {"node": "r1"}))
    assert a != b  # nor is one from outside (f0 reads e) the block's second node
    a, b = classes(
        lambda g: (
            g.nodes["f0"]["args"].append({"alpha": 2}),
            g.nodes["f1"]["args"].append({"alpha": 3}),
        )
    )
    assert a != b  # a keyword's value is read

    def tie(g) -> None:  # layers.1 reads its weight by another name of it
        g.graph["param_owner"]["tied"] = "layers.1.fc.weight"
        g.nodes["f1"]["args"][1] = {"param": "tied"}

    a, b = classes(tie)
    assert a == b  # the shape of the parameter it names


def test_a_parameter_free_member_joins_the_member_before_it():
    """A Sequential of Linear, ReLU, Linear: the ReLU (no parameters) joins the first Linear."""
    modules = {"": "Net", "seq": "Sequential", "seq.0": "Linear", "seq.1": "ReLU",
               "seq.2": "Linear"}  # fmt: skip
    shapes = {"seq.0.weight": [2, 2], "seq.2.weight": [2, 3]}
    nodes = [
        ("x", "input", "", [], []),
        ("e", MM, "seq.0", ["seq.0.weight"], ["x"]),
        ("f0", "aten.relu.default", "seq.1", [], ["e"]),
        ("r0", MM, "seq.2", ["seq.2.weight"], ["f0"]),
    ]
    blocks = make_blocks(_graph(nodes, modules, ("seq",), shapes=shapes, owner={}, outputs=["r0"]))
    assert [b.modules for b in blocks] == [["seq.0", "seq.1"], ["seq.2"]]
    assert [b.label for b in blocks] == ["Linear", "Linear#" + blocks[1].cls[:4]]
    assert [b.params for b in blocks] == [4, 6]
    assert [b.member for b in blocks] == [True, True]


def _two_lists(at: str = "") -> nx.DiGraph:
    """Two containers ``{at}a`` and ``{at}b`` of two members each; ``{at}b.0`` holds no
    parameter and follows ``{at}a.1``, a member of the other list."""
    modules = {"": "Net", **({at[:-1]: "Enc"} if at else {})}
    for name, kids in (("a", ("L", "L")), ("b", ("R", "L"))):
        modules[at + name] = "ModuleList"
        modules.update({f"{at}{name}.{i}": cls for i, cls in enumerate(kids)})
    shapes = {f"{at}a.0.w": [1], f"{at}a.1.w": [2], f"{at}b.1.w": [3]}
    nodes = [
        ("x", "input", "", [], []),
        ("e", MM, f"{at}a.0", [f"{at}a.0.w"], ["x"]),
        ("f0", MM, f"{at}a.1", [f"{at}a.1.w"], ["e"]),
        ("r0", "aten.relu.default", f"{at}b.0", [], ["f0"]),
        ("f1", MM, f"{at}b.1", [f"{at}b.1.w"], ["r0"]),
    ]
    lists = (f"{at}a", f"{at}b")
    return _graph(nodes, modules, lists, shapes=shapes, owner={}, outputs=["f1"])


def test_members_of_different_containers_do_not_merge():
    """b.0 (no parameters) follows a.1 of another container: it stays a block of its own."""
    assert [b.modules for b in make_blocks(_two_lists())] == [["a.0"], ["a.1"], ["b.0"], ["b.1"]]


def test_members_of_sibling_containers_one_level_down_do_not_merge():
    """The same two containers held by one module (enc.a, enc.b): enc.b.0 (no parameters)
    follows enc.a.1, a member of the other list under the same grandparent: its own block."""
    assert [b.modules for b in make_blocks(_two_lists("enc."))] == [
        ["enc.a.0"],
        ["enc.a.1"],
        ["enc.b.0"],
        ["enc.b.1"],
    ]


def test_a_container_of_one_child_is_not_repeated():
    """A ModuleList holding one layer: no repeated container, so the top-level children are the
    members (emb, layers, norm, head: four blocks, none merged)."""
    modules = {k: v for k, v in MODULES.items() if not k.startswith("layers.1")}
    nodes = [n for n in NODES if n[0] not in ("f1", "r1", "res")]
    nodes[-2] = ("n", "aten.layer_norm.default", "norm", ["norm.weight"], ["r0"])
    shapes = {k: v for k, v in SHAPES.items() if not k.startswith("layers.1")}
    blocks = make_blocks(_graph(nodes, modules, shapes=shapes))
    assert [b.modules for b in blocks] == [["emb"], ["layers"], ["norm"], ["head"]]
    assert all(b.member for b in blocks)
    assert [b.label for b in blocks][1] == "ModuleList"


def test_a_graph_without_a_container_list_has_none():
    g = _graph()
    del g.graph["containers"]
    blocks = make_blocks(g)
    assert [b.modules for b in blocks] == [["emb"], ["layers"], ["norm"], ["head"]]


def test_an_output_without_bytes_of_its_own_counts_its_first_reads():
    """The head's output h is also read by an op of its own block (post): with out_bytes 0 it
    counts the bytes of that read; an output read by nothing and without bytes counts 0."""
    nodes = [*NODES, ("post", "aten.relu.default", "head", [], ["h"])]
    g = _graph(nodes)
    g.nodes["h"]["out_bytes"] = 0
    assert make_blocks(g)[-1].output_bytes == BIT["h"]
    g.nodes["h"]["out_bytes"] = 3
    assert make_blocks(g)[-1].output_bytes == 3
    g = _graph()
    g.nodes["h"]["out_bytes"] = 0
    assert make_blocks(g)[-1].output_bytes == 0


def test_a_model_without_children_is_one_block_of_the_root():
    modules = {"": "Net"}
    nodes = [("x", "input", "", [], []), ("e", MM, "", ["w"], ["x"])]
    blocks = make_blocks(_graph(nodes, modules, (), shapes={"w": [3, 2]}, owner={}, outputs=["e"]))
    assert [(b.name, b.modules, b.nodes, b.params, b.label, b.member) for b in blocks] == [
        ("model", [""], ["x", "e"], 6, "model", False)
    ]
    assert blocks[0].output_bytes == BIT["e"]


def test_a_nested_container_is_opened_through_the_module_holding_it():
    """model.body holds the repeated container body.layers: body is opened, its other child
    body.final becomes a block of its own beside the layers."""
    modules = {"": "Net", "body": "Body", "body.layers": "ModuleList", "body.layers.0": "L",
               "body.layers.1": "L", "body.final": "Norm", "head": "Linear"}  # fmt: skip
    shapes = {"body.layers.0.w": [2], "body.layers.1.w": [2], "body.final.w": [1], "head.w": [4]}
    nodes = [
        ("x", "input", "", [], []),
        ("e", MM, "body.layers.0", ["body.layers.0.w"], ["x"]),
        ("f0", MM, "body.layers.1", ["body.layers.1.w"], ["e"]),
        ("r0", MM, "body.final", ["body.final.w"], ["f0"]),
        ("f1", MM, "head", ["head.w"], ["r0"]),
    ]
    g = _graph(nodes, modules, ("body.layers",), shapes=shapes, owner={}, outputs=["f1"])
    blocks = make_blocks(g)
    assert [b.modules for b in blocks] == [
        ["body.layers.0"],
        ["body.layers.1"],
        ["body.final", "head"],
    ]
    assert [b.member for b in blocks] == [True, True, False]


def test_a_repeated_container_inside_a_member_stays_inside_it():
    """Two layers each holding a ModuleList of two heads: each layer holds a repeated container,
    so it is opened, and the innermost container's children (the heads) are the blocks."""
    modules = {"": "Net", "layers": "ModuleList", "layers.0": "L", "layers.0.h": "ModuleList",
               "layers.0.h.0": "H", "layers.0.h.1": "H", "layers.1": "L",
               "layers.1.h": "ModuleList", "layers.1.h.0": "H", "layers.1.h.1": "H"}  # fmt: skip
    shapes = {"layers.0.h.0.w": [1], "layers.0.h.1.w": [1], "layers.1.h.0.w": [1],
              "layers.1.h.1.w": [1]}  # fmt: skip
    nodes = [
        ("x", "input", "", [], []),
        ("e", MM, "layers.0.h.0", ["layers.0.h.0.w"], ["x"]),
        ("f0", MM, "layers.0.h.1", ["layers.0.h.1.w"], ["e"]),
        ("r0", MM, "layers.1.h.0", ["layers.1.h.0.w"], ["f0"]),
        ("f1", MM, "layers.1.h.1", ["layers.1.h.1.w"], ["r0"]),
    ]
    containers = ("layers", "layers.0.h", "layers.1.h")
    g = _graph(nodes, modules, containers, shapes=shapes, owner={}, outputs=["f1"])
    blocks = make_blocks(g)
    assert [b.modules for b in blocks] == [["layers.0.h.0"], ["layers.0.h.1"], ["layers.1.h.0"],
                                           ["layers.1.h.1"]]  # fmt: skip
    assert [b.member for b in blocks] == [True] * 4


def test_a_long_merged_name_is_cut_to_its_first_and_last_module():
    modules = {"": "Net", "layers": "ModuleList", "layers.0": "L", "layers.1": "L",
               "a_rather_long_module_name": "X", "another_long_module_name": "Y",
               "z": "Z"}  # fmt: skip
    shapes = {"layers.0.w": [1], "layers.1.w": [1]}
    nodes = [
        ("x", "input", "", [], []),
        ("e", MM, "layers.0", ["layers.0.w"], ["x"]),
        ("f0", MM, "layers.1", ["layers.1.w"], ["e"]),
        ("r0", "aten.relu.default", "a_rather_long_module_name", [], ["f0"]),
        ("f1", "aten.relu.default", "another_long_module_name", [], ["r0"]),
        ("r1", "aten.relu.default", "z", [], ["f1"]),
    ]
    g = _graph(nodes, modules, shapes=shapes, owner={}, outputs=["r1"])
    last = make_blocks(g)[-1]
    assert last.name == "a_rather_long_module_name..z"
    assert last.label == "a_rather_long_module_name..z"
    nodes = nodes[:-1]  # 25 + 1 + 24 = 50 characters joined: cut
    g = _graph(nodes, modules, shapes=shapes, owner={}, outputs=["f1"])
    assert make_blocks(g)[-1].name == "a_rather_long_module_name..another_long_module_name"
    modules["another_long_module_na"] = "Y"  # 25 + 1 + 22 = 48 characters joined: kept
    nodes[-1] = ("f1", "aten.relu.default", "another_long_module_na", [], ["r0"])
    g = _graph(nodes, modules, shapes=shapes, owner={}, outputs=["f1"])
    assert make_blocks(g)[-1].name == "a_rather_long_module_name+another_long_module_na"
    modules["another_long_module_nam"] = "Y"  # 49: cut
    nodes[-1] = ("f1", "aten.relu.default", "another_long_module_nam", [], ["r0"])
    g = _graph(nodes, modules, shapes=shapes, owner={}, outputs=["f1"])
    assert make_blocks(g)[-1].name == "a_rather_long_module_name..another_long_module_nam"


def test_selective_recompute_keeps_what_is_saved_outside_the_core():
    """An attention inside layers.0: s = q k^T, softmax, o = p v; the core (s, p) is recomputed,
    so its saved tensors are left out of saved_selective_bytes."""
    modules = {"": "Net", "layers": "ModuleList", "layers.0": "A", "layers.1": "A"}
    shapes = {"layers.0.w": [2], "layers.1.w": [2]}
    nodes = [
        ("x", "input", "", [], []),
        ("e", MM, "layers.0", ["layers.0.w"], ["x"]),
        ("f0", "aten.bmm.default", "layers.0", [], ["e", "e"]),
        ("r0", "aten._softmax.default", "layers.0", [], ["f0"]),
        ("f1", "aten.bmm.default", "layers.0", [], ["r0", "e"]),
        ("r1", MM, "layers.1", ["layers.1.w"], ["f1"]),
    ]
    g = _graph(nodes, modules, shapes=shapes, owner={}, outputs=["r1"])
    assert cached_core_nodes(g) == {"f0", "r0"}
    b = make_blocks(g)[0]
    assert b.saved_bytes == _sum(["e", "f0", "r0", "f1"], 3)
    assert b.saved_selective_bytes == _sum(["e", "f1"], 3) + _sum(["f0", "r0"], 2)


def test_ops_before_any_block_join_the_first_and_after_join_the_last_that_ran():
    """A top-level op before the embedding joins emb's block; one with a module in no unit
    (an input's cast, module "") after layers.1 joins layers.1."""
    nodes = list(NODES)
    nodes.insert(1, ("pre", "aten.mul.Tensor", "", [], ["x"]))
    nodes[2] = ("e", "aten.embedding.default", "emb", ["emb.weight"], ["pre"])
    BIT["pre"] = 1 << 41
    try:
        blocks = make_blocks(_graph(nodes))
        assert blocks[0].nodes == ["x", "pre", "e"]
        assert blocks[2].nodes == ["f1", "r1", "res"]
        assert blocks[0].fwd_flops == _sum(["x", "pre", "e"], 3)
    finally:
        del BIT["pre"]


def test_ops_of_the_root_module_unit_are_assigned_by_their_own_path():
    """No containers and no children but under root: every op joins the root's block, the
    input placeholder too."""
    modules = {"": "Net"}
    nodes = [("x", "input", "", [], []), ("e", MM, "", ["w"], ["x"]),
             ("f0", "aten.relu.default", "", [], ["e"])]  # fmt: skip
    g = _graph(nodes, modules, (), shapes={"w": [1]}, owner={}, outputs=["f0"])
    assert [b.nodes for b in make_blocks(g)] == [["x", "e", "f0"]]


def test_a_root_that_runs_its_childrens_weights_itself_is_one_block_of_the_root():
    """The root's forward calls F.linear on self.a.weight and self.b.weight: its children
    run no op of their own, so no unit ever runs and every op (the input too) is the root's
    one block, holding both children's weights (it had no block at all, and the search
    then found no layout for a model of zero FLOPs)."""
    modules = {"": "Net", "a": "Linear", "b": "Linear"}
    nodes = [("x", "input", "", [], []), ("e", MM, "", ["a.weight"], ["x"]),
             ("f0", MM, "", ["b.weight"], ["e"])]  # fmt: skip
    shapes = {"a.weight": [4, 4], "b.weight": [2, 4]}
    g = _graph(nodes, modules, (), shapes=shapes, owner={}, outputs=["f0"])
    blocks = make_blocks(g)
    assert [(b.name, b.nodes, b.params, b.param_names) for b in blocks] == [
        ("model", ["x", "e", "f0"], 24, ["a.weight", "b.weight"])
    ]
    assert blocks[0].fwd_flops == _sum(["x", "e", "f0"], 3)


# --------------------------------------------------------------------------- mixture of experts


def _moe_graph(grouped: bool = True, topk: bool = True, experts=None) -> nx.DiGraph:
    """layers.0 and layers.1, each with a router (top-2 of 4 experts over 6 tokens: topk's
    output [6, 2]) and experts (a grouped product of 12 rows, inner width 8)."""
    modules = {"": "Net", "layers": "ModuleList"}
    shapes: dict[str, list[int]] = {}
    nodes: list[tuple] = [("x", "input", "", [], [])]
    prev = "x"
    for i in (0, 1):
        p = f"layers.{i}"
        modules.update({p: "MoE", f"{p}.router": "Linear", f"{p}.experts": "Experts"})
        shapes.update({f"{p}.router.w": [8, 4], f"{p}.experts.w": [4, 8, 8]})
        nodes += [
            (f"r{i}", MM, f"{p}.router", [f"{p}.router.w"], [prev]),
            (f"t{i}", "aten.topk.default" if topk else "aten.max.dim", f"{p}", [], [f"r{i}"]),
            (
                f"g{i}",
                "aten._grouped_mm.default" if grouped else MM,
                f"{p}.experts",
                [f"{p}.experts.w"],
                [prev, f"t{i}"],
            ),  # fmt: skip
        ]
        prev = f"g{i}"
    for i, name in enumerate(n for n, *_ in nodes):
        BIT.setdefault(name, 1 << (50 + i))
    g = _graph(nodes, modules, shapes=shapes, owner={}, outputs=[prev])
    for i in (0, 1):
        g.nodes[f"t{i}"]["shapes"] = [[6, 2], [6, 2]]
        g.nodes[f"g{i}"]["shapes"] = [[12, 8]]
        g.nodes[f"g{i}"]["mm_inner"] = [8, 8]
    if experts is None:
        experts = {f"layers.{i}.experts": {"num_experts": 4, "params": 256} for i in (0, 1)}
    g.graph["experts"] = experts
    return g


def test_a_moe_block_records_its_experts_rows_and_width():
    for grouped in (True, False):  # without a grouped product: tokens x top-k from the router
        blocks = make_blocks(_moe_graph(grouped=grouped))
        assert (
            [b.extra for b in blocks]
            == [
                {
                    "moe": {
                        "modules": [f"layers.{i}.experts"],
                        "num_experts": 4,
                        "expert_params": 256,
                        "top_k": 2,
                        "routed_rows": 12,
                        "width": 8,
                    }
                }
                for i in (0, 1)
            ]
            if grouped
            else [{}, {}]
        )  # no width without the grouped product


def test_a_moe_without_a_router_top_k_counts_one_per_row():
    blocks = make_blocks(_moe_graph(topk=False))
    assert blocks[0].extra["moe"]["top_k"] == 1
    assert blocks[0].extra["moe"]["routed_rows"] == 12


def test_a_moe_block_sums_expert_parameters_and_takes_the_fewest_experts():
    """Two expert modules in one block (a shared and a routed one): their parameters summed,
    the smaller expert count kept; an expert module of another block is not this one's."""
    experts = {
        "layers.0.experts": {"num_experts": 4, "params": 256},
        "layers.0.router": {"num_experts": 3, "params": 32},
        "layers.1.experts": {"num_experts": 8, "params": 512},
    }
    moe = make_blocks(_moe_graph(experts=experts))[0].extra["moe"]
    assert moe["modules"] == ["layers.0.experts", "layers.0.router"]
    assert moe["num_experts"] == 3
    assert moe["expert_params"] == 288


def test_a_block_without_expert_parameters_has_no_moe_entry():
    experts = {"elsewhere": {"num_experts": 4, "params": 256}}
    assert [b.extra for b in make_blocks(_moe_graph(experts=experts))] == [{}, {}]
    g = _moe_graph()
    del g.graph["experts"]
    assert [b.extra for b in make_blocks(g)] == [{}, {}]


def test_the_router_top_k_gives_the_rows_when_the_grouped_product_has_none():
    """The grouped product's first shape empty of rows (0): tokens (12 / 2) x top-k 2."""
    g = _moe_graph()
    g.nodes["g0"]["shapes"] = [[0, 8]]
    g.nodes["t0"]["shapes"] = [[3, 4], [3, 4]]  # 3 tokens, top-4
    moe = make_blocks(g)[0].extra["moe"]
    assert (moe["top_k"], moe["routed_rows"], moe["width"]) == (4, 12, 8)


def test_a_moe_blocks_rows_come_from_its_grouped_product_and_width_from_its_inner_dim():
    """layers.0: a capacity-padded grouped product of 10 rows (not the router's 6 x 2), inner
    width 8 of mm_inner [8, 16] (16 its output width), a 3-D top-k [1, 6, 2], a router product
    of its own rows (6) and width (4) before it and an op inside the experts after it, neither
    the grouped product. layers.1: no rows in the grouped product, a top-1 router over 6
    tokens: 6 x 1 rows, an integer."""
    g = _moe_graph()
    g.nodes["r0"].update(shapes=[[6, 4]], mm_inner=[8, 4, 6, True])
    g.nodes["t0"]["shapes"] = [[1, 6, 2], [1, 6, 2]]
    g.nodes["g0"].update(shapes=[[10, 16]], mm_inner=[8, 16, 3, True])
    after = {**g.nodes["g0"], "op": "aten.relu.default", "shapes": [[3, 3]], "mm_inner": None}
    g.add_node("a0", **{**after, "params": [], "order": g.nodes["g0"]["order"] + 0.5})
    g.add_edge("g0", "a0", bytes=1)
    g.nodes["t1"]["shapes"] = [[6, 1], [6, 1]]
    g.nodes["g1"]["shapes"] = [[0, 8]]
    first, second = (b.extra["moe"] for b in make_blocks(g))
    assert (first["top_k"], first["routed_rows"], first["width"]) == (2, 10, 8)
    assert (second["top_k"], second["routed_rows"], second["width"]) == (1, 6, 8)
    assert type(second["routed_rows"]) is int


def test_the_width_is_the_first_grouped_products_inner_dim():
    """Two grouped products in layers.0's experts (gate-up: inner width 8; down: inner 16, the
    experts' hidden width), both of 12 rows: the all-to-all moves the first's input, 8 wide."""
    g = _moe_graph()
    down = {**g.nodes["g0"], "mm_inner": [16, 8], "order": g.nodes["g0"]["order"] + 0.5}
    g.add_node("d0", **down)
    g.add_edge("g0", "d0", bytes=1)
    moe = make_blocks(g)[0].extra["moe"]
    assert (moe["routed_rows"], moe["width"]) == (12, 8)


def test_a_grouped_product_without_inner_dims_gives_no_moe_entry():
    g = _moe_graph()
    g.nodes["g0"]["mm_inner"] = None
    assert make_blocks(g)[0].extra == {}


# --------------------------------------------------------------------------- helpers


def test_in_modules_is_the_path_or_below_it():
    assert in_modules("a.b", ["a"]) and in_modules("a", ["a"]) and in_modules("a.b.c", ["x", "a.b"])
    assert not in_modules("ab", ["a"]) and not in_modules("a", ["a.b"]) and not in_modules("a", [])


def _products_graph() -> nx.DiGraph:
    """w1 read by a linear; w2 through two views into a matmul; n (a norm's weight) read
    element-wise; e (aliased as e2) read by an embedding lookup; w3 by a grouped product."""
    shapes = {"w1": [2, 3], "w2": [4], "n": [5], "e": [7], "w3": [2, 2]}
    g = nx.DiGraph(param_owner={"e2": "e", "w3b": "w3"}, param_shapes=shapes)
    rows = [
        ("a", "aten.linear.default", ["w1"], []),
        ("v1", "aten.t.default", ["w2"], []),
        ("v2", "aten.view.default", [], ["v1"]),
        ("m", "aten.matmul.default", [], ["a", "v2"]),
        ("nm", "aten.mul.Tensor", ["n"], ["m"]),
        ("lk", "aten.embedding.default", ["e2"], []),
        ("vn", "aten.view.default", ["n"], []),
        ("ad", "aten.add.Tensor", [], ["vn", "lk"]),
        ("gm", "aten._grouped_mm.default", ["w3b"], ["ad"]),  # w3 by its alias
    ]
    for order, (n, op, params, inputs) in enumerate(rows):
        g.add_node(n, op=op, params=params, order=order)
        g.add_edges_from((i, n) for i in inputs)
    return g


def test_product_parameters_are_the_weights_products_multiply():
    g = _products_graph()
    assert product_params(g, list(g.nodes)) == {"w1", "w2", "w3"}
    assert product_params(g, ["v1", "v2", "m"]) == {"w2"}  # the views and the product
    assert product_params(g, ["v1", "m"]) == set()  # the view between them left out
    assert product_params(g, ["lk", "nm"]) == set()


def test_a_blocks_product_share_is_its_multiplied_parameters_over_its_own():
    """Owned: w1 (6), w2 (4), n (5), e (7) = 22; multiplied: w1 and w2, 10 of 22. w3 is
    multiplied but owned by no one here."""
    g = _products_graph()
    block = Block(**{**make_block(0, "L").__dict__, "nodes": list(g.nodes),
                     "param_names": ["w1", "w2", "n", "e"], "params": 22})  # fmt: skip
    assert product_share(g, block) == pytest.approx(10 / 22)
    empty = Block(**{**block.__dict__, "params": 0})
    assert product_share(g, empty) == 0.0


def _one_block(nodes: list[str], modules: list[str], edges: list[tuple[str, str]]):
    g = nx.DiGraph()
    g.add_edges_from(edges)
    block = Block(**{**make_block(0, "L").__dict__, "nodes": nodes, "modules": modules})
    return g, block


def test_a_block_reading_one_outside_tensor_runs_eagerly():
    g, b = _one_block(["a", "b"], ["l0", "l1"], [("x", "a"), ("x", "b"), ("b", "y"), ("a", "z")])
    assert reads_one_tensor(g, b) and runs_eagerly_in_stage(g, b)
    g, b = _one_block(["a", "b"], ["l0"], [("a", "b")])  # none from outside
    assert reads_one_tensor(g, b)


def test_a_one_module_block_reading_several_runs_eagerly_if_one_tensor_leaves():
    """Reads x and mask: eager when it is one module and one of its nodes is read outside."""
    edges = [("x", "a"), ("mask", "b"), ("a", "b"), ("b", "out")]
    g, b = _one_block(["a", "b"], ["layer"], edges)
    assert not reads_one_tensor(g, b)
    assert runs_eagerly_in_stage(g, b)
    g, b = _one_block(["a", "b"], ["layer", "other"], edges)  # two modules
    assert not runs_eagerly_in_stage(g, b)
    g, b = _one_block(["a", "b"], ["layer"], [*edges, ("a", "out2")])  # two leave
    assert not runs_eagerly_in_stage(g, b)
    g, b = _one_block(["a", "b"], ["layer"], edges[:3])  # none leaves
    assert runs_eagerly_in_stage(g, b)


def test_labels_of_different_classes_are_kept_apart():
    """Three blocks labelled L: two of class c1 keep L, the class c2 one becomes L#c2xx; a
    later class c3 also labelled L gets its own suffix; labels of one class agree."""
    blocks = [
        Block(**{**make_block(i, c).__dict__, "label": "L"})
        for i, c in enumerate(["c1aaaa", "c2bbbb", "c1aaaa", "c3cccc"])
    ]
    _name_classes(blocks)
    assert [b.label for b in blocks] == ["L", "L#c2bb", "L", "L#c3cc"]


def test_block_records_read_back_from_their_dict():
    b = make_block(3, "L")
    assert Block(**b.to_dict()) == b
    assert b.to_dict()["tied"] == {} and b.to_dict()["extra"] == {}


# --------------------------------------------------------------------------- one traced model

TRACED = """
import torch
from torch import nn

TRAINING = {"global_batch_size": 2, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8, bias=False)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.layers = nn.ModuleList([Layer(), Layer()])
        self.head = nn.Linear(8, 16, bias=False)

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def build_model():
    return Net()


def make_batch(batch_size, step=0):
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, 16, (batch_size, 3), generator=g)
    return ids, ids
"""


def test_a_traced_models_blocks_by_hand(tmp_path):
    """Traced with no cache (1 sample of 3 tokens, fp32): emb (128 parameters), two identical
    layers (64 each; 2 x 3 x 8 x 8 = 384 forward FLOPs), the head (128; 768 FLOPs); each cut
    carries the 3 x 8 fp32 stream (96 bytes)."""
    from planner.api import trace

    path = tmp_path / "net.py"
    path.write_text(TRACED)
    blocks = trace(path, traced_batch_size=1, dtype="fp32", use_cache=False).blocks
    assert [b.name for b in blocks] == ["emb", "layers.0", "layers.1", "head"]
    assert [b.params for b in blocks] == [128, 64, 64, 128]
    assert [b.fwd_flops for b in blocks] == [0, 384, 384, 768]
    assert [b.boundary_bytes for b in blocks] == [96, 96, 96, 0]
    assert [b.input_bytes for b in blocks][1:] == [96, 96, 96]
    assert blocks[1].cls == blocks[2].cls and blocks[1].label == blocks[2].label == "Layer"
    assert [b.member for b in blocks] == [False, True, True, False]
