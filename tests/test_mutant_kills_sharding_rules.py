"""The sharding ILP's sequence-parallel and binding rules (planner/cost/sharding.py), called
directly on blocks drawn here, written for the module's generated mutants (docs/mutation.md,
helper 56a): a Llama-like layer (a norm with a weight, an attention module's column- and
row-parallel projections, the residual add) and one on flattened tokens (OPT's MLP on
``reshape(-1, hidden)``), each with its sequence-parallel template priced by hand from the
layout picked here (no ILP: the layout is named, so the rule alone is under test), every
reason for having no sequence-parallel form, and the binding of templates to a block's
modules. Rates are 1 FLOP/s and 1 B/s, fp32."""

from __future__ import annotations

import networkx as nx
import pytest
from test_mutant_kills_sharding import LINEAR, _block, _node, node, strategies

from planner.cost import sharding
from planner.cost.sharding import build_problem

X = {"node": "x"}


def ref(u):
    return {"node": u}


def llama_graph(norm_module="layer.norm", attn="layer.attn", x_grad=True, with_k=False):
    """x [2, 4, 8] -> rms_norm (weight [8]) -> q (8 -> 8, in ``attn``) -> gelu -> o (8 -> 8)
    -> + x. Nodes are named apart from their modules (``nq`` in ``layer.attn.q``).
    ``with_k``: a second projection k of the norm's output, multiplied into q's (the gelu a
    mul of the two)."""
    g = nx.DiGraph()
    _node(g, "x", "input", [], [2, 4, 8], grad=x_grad)
    _node(g, "nrm", "aten.rms_norm.default", [X, [8], {"param": "layer.norm.weight"}],
          [2, 4, 8], norm_module, ff=20, bf=40, fb=300, bb=600, saved=[("x", 256)])  # fmt: skip
    _node(g, "nq", LINEAR, [ref("nrm"), {"param": f"{attn}.q.weight"}], [2, 4, 8], f"{attn}.q",
          ff=1000, bf=2000, fb=100, bb=100, saved=[("nrm", 256)])  # fmt: skip
    if with_k:
        _node(g, "nk", LINEAR, [ref("nrm"), {"param": f"{attn}.k.weight"}], [2, 4, 8],
              f"{attn}.k", ff=1000, bf=2000, fb=100, bb=100, saved=[("nrm", 256)])  # fmt: skip
        _node(g, "act", "aten.mul.Tensor", [ref("nq"), ref("nk")], [2, 4, 8], f"{attn}.act",
              ff=10, bf=10, fb=512, bb=768, saved=[("nq", 256)])  # fmt: skip
    else:
        _node(g, "act", "aten.gelu.default", [ref("nq")], [2, 4, 8], f"{attn}.act",
              ff=10, bf=10, fb=512, bb=768, saved=[("nq", 256)])  # fmt: skip
    _node(g, "no", LINEAR, [ref("act"), {"param": f"{attn}.o.weight"}], [2, 4, 8], f"{attn}.o",
          ff=1000, bf=2000, fb=100, bb=100, saved=[("act", 256)])  # fmt: skip
    _node(g, "out", "aten.add.Tensor", [ref("no"), X], [2, 4, 8], "layer",
          ff=0, bf=0, fb=768, bb=512)  # fmt: skip
    params = {"layer.norm.weight": [8], f"{attn}.q.weight": [8, 8], f"{attn}.o.weight": [8, 8]}
    if with_k:
        params[f"{attn}.k.weight"] = [8, 8]
    g.graph.update(
        param_shapes=params, param_owner={p: p for p in params},
        tp_modules=[f"{attn}.q", f"{attn}.k", f"{attn}.o"], outputs=["out"],
    )  # fmt: skip
    nodes = ["nrm", "nq", *(["nk"] if with_k else []), "act", "no", "out"]
    return g, _block(nodes, params, modules=("layer",))


def pick(prob, wanted):
    """The choice giving each op the (output state, style) named, R and no style elsewhere."""
    choice = []
    for op in prob.ops:
        out, plan = wanted.get(op.name, ("R", ""))
        hits = [k for k, s in enumerate(prob.ops[len(choice)].strategies)
                if s.out == out and s.plan == plan and all(r in ("R", None) or r[0] in "SP"
                                                             for r in s.req)]  # fmt: skip
        assert hits, (op.name, out, plan, prob.ops[len(choice)].strategies)
        choice.append(hits[0])
    return tuple(choice)


MEGATRON = {"nq": ("S2", "colwise"), "act": ("S2", ""), "no": ("P", "rowwise")}
MEGATRON_K = {**MEGATRON, "nk": ("S2", "colwise")}


def llama_sp(graph_kw=None, wanted=MEGATRON, spb=1e-3):
    g, b = llama_graph(**(graph_kw or {}))
    prob = build_problem(g, b, 2, flops_per_second=1.0, bytes_per_second=1.0)
    choice = pick(prob, wanted)
    return g, b, prob, choice, sharding._sequence_parallel(prob, choice, "tp2-v1", spb)


def tokens_graph(norm_module="layer.norm"):
    """OPT's MLP on flattened tokens: x [2, 4, 8] -> view [8, 8] -> x * w (the norm's weight,
    a plain mul inside a norm module) -> f1 (8 -> 16, the block's own Linear ``layer.fc1``)
    -> gelu -> f2 (16 -> 8, ``layer.fc2``) -> view [2, 4, 8] -> + x."""
    g = nx.DiGraph()
    _node(g, "x", "input", [], [2, 4, 8])
    _node(g, "flat", "aten.view.default", [X, [8, 8]], [8, 8], "layer", fb=256, bb=256)
    _node(g, "mw", "aten.mul.Tensor", [ref("flat"), {"param": "layer.norm.weight"}], [8, 8],
          norm_module, ff=64, bf=128, fb=512, bb=1024, saved=[("flat", 256)])  # fmt: skip
    _node(g, "f1", LINEAR, [ref("mw"), {"param": "layer.fc1.weight"}], [8, 16], "layer.fc1",
          ff=2048, bf=4096, fb=900, bb=900, saved=[("mw", 256)])  # fmt: skip
    _node(g, "act", "aten.gelu.default", [ref("f1")], [8, 16], "layer.act",
          ff=10, bf=10, fb=1024, bb=1536, saved=[("f1", 512)])  # fmt: skip
    _node(g, "f2", LINEAR, [ref("act"), {"param": "layer.fc2.weight"}], [8, 8], "layer.fc2",
          ff=2048, bf=4096, fb=900, bb=900, saved=[("act", 512)])  # fmt: skip
    _node(g, "back", "aten.view.default", [ref("f2"), [2, 4, 8]], [2, 4, 8], "layer",
          fb=64, bb=64)  # fmt: skip
    _node(g, "out", "aten.add.Tensor", [ref("back"), X], [2, 4, 8], "layer", fb=768, bb=512)
    params = {"layer.norm.weight": [8], "layer.fc1.weight": [16, 8], "layer.fc2.weight": [8, 16]}
    g.graph.update(
        param_shapes=params, param_owner={p: p for p in params},
        tp_modules=["layer.fc1", "layer.fc2"], outputs=["out"],
    )  # fmt: skip
    return g, _block(["flat", "mw", "f1", "act", "f2", "back", "out"], params, modules=("layer",))


TOKENS = {"f1": ("S1", "colwise"), "act": ("S1", ""), "f2": ("P", "rowwise"), "back": ("P", "")}


def tokens_sp(graph_kw=None, wanted=TOKENS, spb=1e-3):
    g, b = tokens_graph(**(graph_kw or {}))
    prob = build_problem(g, b, 2, flops_per_second=1.0, bytes_per_second=1.0)
    choice = pick(prob, wanted)
    return g, b, prob, choice, sharding._sequence_parallel(prob, choice, "tp2-v1", spb)


# --------------------------------------------------------------------------- sequence parallel

GATHER = ("all_gather", 256)
SCATTER = ("reduce_scatter", 256)


def test_a_llama_layers_sequence_parallel_form_by_hand():
    """Region: the norm and the residual add (replicated, fed by x). Seconds per op (max of
    FLOPs and bytes, forward plus backward): norm 900, q 3000, act 1280, o 3000, add 1280;
    all but the region are halved by TP, the region by the sequence split: 4730. Seven
    256-byte collectives at (t-1)/t: o's output reduce-scattered (its gradient gathered), the
    norm's output gathered at ``layer.attn`` (q is not the block's own Linear: its module
    gathers, again in backward for the weights), the exit and the entry: 0.896 s at 1e-3 s/B.
    Saved: x at the norm (the region's) and the norm's output at q (the gathered input, kept
    as its shard) halved, 128 each; act and o save S2 shards, 128 each. States: 16 B per
    parameter, the norm's 8 whole, q's and o's 64 halved."""
    *_, prob, choice, sp = llama_sp()
    assert sp.name == "tp2-v1-sp" and sp.choice == choice == (0, 1, 3, 2, 0)
    assert sp.states == ("S1", "S2", "S2", "P", "S1")
    assert sp.needs == (("R", "R"), ("R", "S0"), ("S2",), ("S2", "S1"), ("R", "R"))
    assert sp.plans == ((0, 1, "sequence"), (1, 1, "colwise"), (3, 1, "rowwise_sp"))
    assert sp.comm_fwd == (SCATTER, GATHER, GATHER)
    assert sp.comm_bwd == (GATHER, SCATTER, GATHER, GATHER)
    assert sp.exit_gather == (GATHER,) and sp.entry_gather == (GATHER,)
    assert sp.time_s == pytest.approx(4730 + 7 * 256 * 1e-3 / 2, rel=1e-12)
    assert sp.compute_fraction == pytest.approx(0.5) and sp.memory_bound_fraction == 0.5
    assert sp.param_fraction == pytest.approx((32 + 128 + 128) / (32 + 256 + 256))
    assert (sp.saved_bytes, sp.saved_selective_bytes, sp.input_bytes) == (512, 512, 128)
    assert sp.memory == 512 + 16 * (8 + 32 + 32)
    assert sp.sequence_parallel and not sp.on_dtensors and sp.grad_sums == ()


def test_flattened_tokens_run_the_token_styles_and_the_linear_regathers():
    """Tokens flattened to dim 0: the norm's weight (a mul inside ``layer.norm``) is
    ``sequence_tokens``, the block's own fc1 fed by the norm's sharded output gathers in a
    hook of its own (``colwise_sp_tokens``: its module ``layer.fc1`` gathers, again in
    backward) and keeps the shard for backward, fc2 reduce-scatters along the tokens.
    Seconds: view 512 and mul 1536 (the region, halved), fc1 6144, gelu 2560, fc2 6144 (TP,
    halved), view back 128 (a partial sum passed on whole), add 1280 (halved): 9216.
    Saved: the view's output at the mul and the mul's at fc1 halved (128 each), act's and
    fc2's S1 inputs 256 each."""
    *_, prob, choice, sp = tokens_sp()
    assert sp.states == ("S1", "S1", "S1", "S1", "P", "P", "S1")
    assert sp.plans == (
        (1, 1, "sequence_tokens"), (2, 1, "colwise_sp_tokens"), (4, 1, "rowwise_sp_tokens"),
    )  # fmt: skip
    assert sp.comm_fwd == (SCATTER, GATHER, GATHER)
    assert sp.comm_bwd == (GATHER, SCATTER, GATHER, GATHER)
    assert sp.time_s == pytest.approx(9216 + 7 * 0.128, rel=1e-12)
    # forward bytes 256, 512, 900, 1024, 900, 64, 768: all halved but the view back's
    assert sp.memory_bound_fraction == pytest.approx((4360 / 2 + 64) / 4424, rel=1e-12)
    assert (sp.saved_bytes, sp.saved_selective_bytes) == (768, 768)
    assert sp.param_fraction == pytest.approx((32 + 256 + 256) / (32 + 512 + 512))
    assert sp.memory == 768 + 16 * (8 + 64 + 64)
    assert sp.compute_fraction == pytest.approx(0.5)


def restyle(prob, choice, name, **change):
    """``prob`` with op ``name``'s chosen strategy (or the op itself: ``shape``) changed."""
    from dataclasses import replace

    i = prob.index[name]
    op = prob.ops[i]
    strategy = {k: v for k, v in change.items() if k in ("out", "req", "plan")}
    opchange = {k: v for k, v in change.items() if k not in strategy}
    offered = list(op.strategies)
    offered[choice[i]] = replace(offered[choice[i]], **strategy)
    ops = list(prob.ops)
    ops[i] = replace(op, strategies=tuple(offered), **opchange)
    return replace(prob, ops=ops)


def test_a_norm_is_known_by_its_module_or_by_its_op():
    """The mul holding a weight runs as a norm (``sequence_tokens``) when its module's last
    name holds "norm" in any case; inside ``layer.mix`` or ``layer.norm.mix`` it is a weight
    outside a norm (no style for it): no sequence-parallel form. An rms_norm runs as a norm in
    any module; the same op read as a plain softmax outside a norm module is not token-local."""
    g, b, prob, choice, _ = tokens_sp()
    for module in ("layer.norm", "layer.RMSNorm", "layer.post_norm"):
        sp = sharding._sequence_parallel(restyle(prob, choice, "mw", module=module), choice,
                                         "v", 1e-3)  # fmt: skip
        assert sp is not None and sp.plans[0] == (1, 1, "sequence_tokens"), module
    for module in ("layer.mix", "layer.norm.mix", "norm.mix"):
        mix = restyle(prob, choice, "mw", module=module)
        assert sharding._sequence_parallel(mix, choice, "v", 1e-3) is None, module
    sp = llama_sp({"norm_module": "layer.ln"})[-1]
    assert sp is not None and sp.plans[0] == (0, 1, "sequence")
    g, b, prob, choice, _ = llama_sp({"norm_module": "layer.ln"})
    soft = restyle(prob, choice, "nrm", op="aten._softmax.default")
    assert sharding._sequence_parallel(soft, choice, "v", 1e-3) is None
    normed = restyle(prob, choice, "nrm", op="aten._softmax.default", module="layer.norm")
    assert sharding._sequence_parallel(normed, choice, "v", 1e-3).plans[0] == (0, 1, "sequence")


def test_no_sequence_parallel_form_without_one_input_a_replicated_exit_or_token_dims():
    # no block input needing a gradient, or two
    assert llama_sp({"x_grad": False})[-1] is None
    g, b, prob, choice, _ = llama_sp()
    two = dict(prob.external, y=(256, True))
    from dataclasses import replace

    assert sharding._sequence_parallel(replace(prob, external=two), choice, "v", 1e-3) is None
    one = dict(prob.external, y=(256, False))
    assert sharding._sequence_parallel(replace(prob, external=one), choice, "v", 1e-3)
    # a second block output outside the replicated region (act, column-sharded)
    assert sharding._sequence_parallel(
        replace(prob, outputs=["out", "act"]), choice, "v", 1e-3
    ) is None  # fmt: skip
    # the first output names the (batch, sequence) dims: a [2, 8] one has no tokens
    flat = restyle(prob, choice, "out", shape=(2, 8, 4))
    assert sharding._sequence_parallel(replace(flat, outputs=["out"]), choice, "v", 1e-3) is None
    # a region op on no token dims: the norm's output [2, 32]
    short = restyle(prob, choice, "nrm", shape=(2, 32))
    assert sharding._sequence_parallel(short, choice, "v", 1e-3) is None


def test_styles_sequence_parallelism_cannot_take():
    g, b, prob, choice, _ = llama_sp()
    # a weight stored [in, out], or a column-parallel weight split by blocks
    for name, plan in (("nq", "colwise_in_out"), ("no", "rowwise_in_out"), ("nq", "colwise:2")):
        assert sharding._sequence_parallel(restyle(prob, choice, name, plan=plan), choice, "v",
                                           1e-3) is None, plan  # fmt: skip
    # a row-parallel output on no token dims
    assert sharding._sequence_parallel(restyle(prob, choice, "no", shape=(16, 4)), choice, "v",
                                       1e-3) is None  # fmt: skip
    # a column-parallel input outside the region (the norm's output sharded along the
    # sequence, so not replicated)
    off = list(choice)
    off[0] = 2
    assert prob.ops[0].strategies[2].out == "S1"
    assert sharding._sequence_parallel(prob, tuple(off), "v", 1e-3) is None


def test_projections_of_one_module_gather_their_input_once_and_the_blocks_own_each():
    """q and k both read the norm's output. Inside ``layer.attn`` the module gathers it once
    (forward, and for each of backward's reduce-scatter and weight gradients): the same
    collectives as with q alone. As the block's own Linears (``layer.q``, ``layer.k``: no
    module between) each gathers its own (the label ``colwise_sp``), once in forward and
    once reduce-scattered back, and keeps the gathered input whole for backward."""
    *_, sp = llama_sp({"with_k": True}, MEGATRON_K)
    assert sp.comm_fwd == (SCATTER, GATHER, GATHER)
    assert sp.comm_bwd == (GATHER, SCATTER, GATHER, GATHER)
    assert sp.plans == (
        (0, 1, "sequence"),
        (1, 1, "colwise"),
        (2, 1, "colwise"),
        (4, 1, "rowwise_sp"),
    )
    # saved: x at the norm, the norm's output at q and at k (each its shard), nq at act,
    # act at o: 128 each
    assert sp.saved_bytes == 5 * 128
    *_, own = llama_sp({"with_k": True, "attn": "layer"}, MEGATRON_K)
    assert own.plans == (
        (0, 1, "sequence"), (1, 1, "colwise_sp"), (2, 1, "colwise_sp"), (4, 1, "rowwise_sp"),
    )  # fmt: skip
    assert own.comm_fwd == (SCATTER, GATHER, GATHER, GATHER)
    assert own.comm_bwd == (GATHER, SCATTER, SCATTER, GATHER)
    # x at the norm 128; the norm's output at q and k kept whole (256 each); nq, act 128
    assert own.saved_bytes == 128 + 2 * 256 + 2 * 128


# --------------------------------------------------------------------------- templates, binding


def llama_template(wanted=MEGATRON, **change):
    from dataclasses import replace

    g, b = llama_graph()
    prob = replace(build_problem(g, b, 2, flops_per_second=1.0, bytes_per_second=1.0), **change)
    choice = pick(prob, wanted)
    ev = sharding.evaluate(prob, choice, 1e-3)
    return g, b, prob, choice, sharding._template(prob, choice, "tp2-v1", ev)


def test_a_template_prices_the_layout_by_hand():
    """Megatron on the Llama-like layer: shares 1 (norm), 1/2 (q, gelu, o), 1 (add) of
    FLOPs 60, 3000, 20, 3000, 0 and of forward bytes 300, 100, 512, 100, 768; seconds 900 +
    1500 + 640 + 1500 + 1280 plus o's output all-reduced forward and the norm's output's
    gradient backward (256 B each at a ring factor of 1); saved x and the norm's output
    whole (256 each), q's and gelu's outputs halved (128 each)."""
    *_, prob, choice, tpl = llama_template()
    assert tpl.name == "tp2-v1" and tpl.choice == choice
    assert tpl.states == ("R", "S2", "S2", "P", "R")
    assert tpl.needs == (("R", "R"), ("R", "S0"), ("S2",), ("S2", "S1"), ("R", "R"))
    assert tpl.plans == ((1, 1, "colwise"), (3, 1, "rowwise"))
    assert tpl.compute_fraction == pytest.approx((60 + 1510 + 1500) / 6080, rel=1e-12)
    assert tpl.memory_bound_fraction == pytest.approx((300 + 50 + 256 + 50 + 768) / 1780)
    assert tpl.param_fraction == pytest.approx(288 / 544)
    assert (tpl.saved_bytes, tpl.saved_selective_bytes, tpl.input_bytes) == (768, 768, 256)
    assert tpl.comm_fwd == (("all_reduce", 256),) and tpl.comm_bwd == (("all_reduce", 256),)
    assert tpl.time_s == pytest.approx(5820 + 2 * 0.256, rel=1e-12)
    assert tpl.memory == 768 + 16 * (8 + 32 + 32)
    assert tpl.on_dtensors is False and tpl.grad_sums == () and not tpl.sequence_parallel
    assert tpl.exit_gather == () and tpl.entry_gather == ()


def test_fractions_of_a_block_with_no_flops_bytes_or_weights():
    """No FLOPs: the compute share is the memory-bound one (the template) or 1 (the
    sequence-parallel form); no bytes either: 1; no owned weights: the parameter share 1."""
    *_, tpl = llama_template(flops=0)
    assert tpl.compute_fraction == tpl.memory_bound_fraction == pytest.approx(1424 / 1780)
    *_, tpl = llama_template(flops=0, fwd_bytes=0, owned=[])
    assert (tpl.compute_fraction, tpl.memory_bound_fraction, tpl.param_fraction) == (1, 1, 1)
    from dataclasses import replace

    g, b, prob, choice, sp = llama_sp()
    sp = sharding._sequence_parallel(replace(prob, flops=0), choice, "v", 1e-3)
    assert sp.compute_fraction == 1.0 and sp.memory_bound_fraction == pytest.approx(0.5)
    bare = replace(prob, flops=0, fwd_bytes=0, owned=[])
    sp = sharding._sequence_parallel(bare, choice, "v", 1e-3)
    assert (sp.compute_fraction, sp.memory_bound_fraction, sp.param_fraction) == (1, 1, 1)


def test_param_uses_are_each_parameters_first_read():
    *_, prob, choice, tpl = llama_template()
    assert sharding._param_uses(prob, ["layer.attn.o.weight", "layer.norm.weight"]) == (
        (3, 1), (0, 1),
    )  # fmt: skip


def distinct(tpl):
    """``tpl`` with every priced field a value of its own, so a field bound from another
    shows."""
    from dataclasses import replace

    return replace(
        tpl, compute_fraction=0.11, memory_bound_fraction=0.22, param_fraction=0.33,
        saved_bytes=44, saved_selective_bytes=55, input_bytes=66, comm_fwd=(("a", 7),),
        comm_bwd=(("b", 8),), exit_gather=(("c", 9),), entry_gather=(("d", 10),),
    )  # fmt: skip


def bound(tpl, states, plan):
    return sharding.TPVariant(
        name=tpl.name, tp=2, states=states, tp_plan=plan, compute_fraction=0.11,
        memory_bound_fraction=0.22, param_fraction=0.33, saved_bytes=44,
        saved_selective_bytes=55, input_bytes=66, comm_fwd=(("a", 7),), comm_bwd=(("b", 8),),
        exit_gather=(("c", 9),), entry_gather=(("d", 10),),
    )  # fmt: skip


def test_binding_names_each_styled_module_and_the_sequence_parallel_block():
    """The template's positions become the block's node names and its weights' modules; a
    sequence-parallel block is ``sp_block`` and the module of a column-parallel weight below
    it gathers the sequence (``sp_gather``); the block's own Linear gathers in its style."""
    g, b, prob, choice, tpl = llama_template()
    states = {"nrm": "R", "nq": "S2", "act": "S2", "no": "P", "out": "R"}
    plan = {"layer.attn.q": "colwise", "layer.attn.o": "rowwise"}
    assert sharding._bind(g, b, distinct(tpl), 2) == bound(tpl, states, plan)
    g, b, prob, choice, sp = llama_sp()
    states = {"nrm": "S1", "nq": "S2", "act": "S2", "no": "P", "out": "S1"}
    plan = {
        "layer.norm": "sequence", "layer.attn.q": "colwise", "layer.attn.o": "rowwise_sp",
        "layer": "sp_block", "layer.attn": "sp_gather",
    }  # fmt: skip
    assert sharding._bind(g, b, distinct(sp), 2) == bound(sp, states, plan)
    g, b, prob, choice, sp = tokens_sp()
    assert sharding._bind(g, b, sp, 2).tp_plan == {
        "layer.norm": "sequence_tokens", "layer.fc1": "colwise_sp_tokens",
        "layer.fc2": "rowwise_sp_tokens", "layer": "sp_block",
    }  # fmt: skip


def test_the_sequence_parallel_forms_saved_bytes_kept_and_its_dtensors():
    """q's output made in the attention-like core: act's saved copy of it (128 B) is not
    kept under selective recompute. A saved tensor of another op than an operand (o keeping
    q's sharded output) is priced in its producer's state; an expand handing a replicated
    tensor on split makes the layout a DTensor one."""
    from dataclasses import replace

    g, b, prob, choice, sp = llama_sp()
    assert sp.on_dtensors is False
    core = sharding._sequence_parallel(replace(prob, core=frozenset({"nq"})), choice, "v", 1e-3)
    assert (core.saved_bytes, core.saved_selective_bytes) == (512, 384)
    keeps = restyle(prob, choice, "no", saved=(("act", 256), ("nq", 256)))
    assert sharding._sequence_parallel(keeps, choice, "v", 1e-3).saved_bytes == 512 + 128
    # the input kept under full recompute: each rank's whole bytes of it
    odd = sharding._sequence_parallel(replace(prob, input_bytes=255), choice, "v", 1e-3)
    assert odd.input_bytes == 127
    split = restyle(prob, choice, "act", op="aten.expand.default", req=("R",))
    assert sharding._sequence_parallel(split, choice, "v", 1e-3).on_dtensors is True


def test_every_region_op_and_every_column_parallel_input_is_checked():
    from dataclasses import replace

    g, b, prob, choice, sp = llama_sp()
    # the add after the projections (the last op of the region) not token-local
    late = restyle(prob, choice, "out", op="aten._softmax.default")
    assert sharding._sequence_parallel(late, choice, "v", 1e-3) is None
    # q reading the norm's output as a [2, 32] tensor: no token dims
    nq = prob.ops[prob.index["nq"]]
    flat = (replace(nq.operands[0], shape=(2, 32)), nq.operands[1])
    assert sharding._sequence_parallel(restyle(prob, choice, "nq", operands=flat), choice, "v",
                                       1e-3) is None  # fmt: skip


REP, MEG = (0, 0, 0, 0, 0), (0, 1, 3, 2, 0)
O_COL, Q_COL, BOTH_COL = (0, 0, 0, 1, 0), (0, 1, 0, 0, 0), (0, 1, 0, 1, 0)


def test_templates_keep_the_pareto_front_of_what_the_ilp_found(monkeypatch):
    """The ILP stood in by a list of layouts, each priced by ``evaluate`` at 20 s/B (by
    brute force): replicated 9460 s, 3200 B; q or o column-parallel alone 15640 s, 2688 B
    each (neither dominates the other); Megatron 16060 s, 1920 B; both column-parallel
    21820 s, 2176 B (dominated by Megatron); an infeasible layout (o row-parallel after a
    replicated gelu) dropped. Ordered by time, then memory, then the layout; named by rank
    among the sharded ones kept."""
    g, b = llama_graph()
    prob = build_problem(g, b, 2, flops_per_second=1.0, bytes_per_second=1.0)
    infeasible = (0, 1, 0, 2, 0)
    assert not sharding.evaluate(prob, infeasible, 20.0).feasible
    asked = []

    def ilp(p, spb, time_scale, memory_scale):
        asked.append((p is prob, spb, time_scale, memory_scale))
        return [(c, 0.0) for c in (BOTH_COL, MEG, infeasible, Q_COL, REP, O_COL, MEG)]

    monkeypatch.setattr(sharding, "sharding_milp", ilp)
    tpls = sharding._templates(prob, 20.0, 3)
    assert asked == [(True, 20.0, 9460.0, 3200.0)]
    assert [(t.name, t.choice) for t in tpls] == [
        ("replicated", REP), ("tp2-v1", O_COL), ("tp2-v2", Q_COL), ("tp2-v3", MEG),
    ]  # fmt: skip
    assert [(t.time_s, t.memory) for t in tpls] == [
        (9460.0, 3200.0), (15640.0, 2688.0), (15640.0, 2688.0), (16060.0, 1920.0),
    ]  # fmt: skip
    two = sharding._templates(prob, 20.0, 2)
    assert [t.name for t in two] == ["replicated", "tp2-v1", "tp2-v2"]
    # the fastest sharded layout has no sequence-parallel form (q replicated in the region)
    # Megatron fastest at 1e-3 s/B: it leads, its sequence-parallel form last
    fast = sharding._templates(prob, 1e-3, 3)
    assert [(t.name, t.choice) for t in fast] == [
        ("tp2-v1", MEG), ("replicated", REP), ("tp2-v1-sp", MEG),
    ]  # fmt: skip
    # a block of no time and no memory: the ILP's scales are 1
    from dataclasses import replace

    bare = replace(prob, ops=[replace(op, seconds=0.0, saved=()) for op in prob.ops], owned=[])
    asked.clear()
    sharding._templates(bare, 20.0, 3)
    assert asked == [(False, 20.0, 1.0, 1.0)]


def test_the_replicated_region_joins_through_replicated_ops_either_way():
    """x -> a (R) -> b (S2) -> c (R, a dropout on b gathered) -> d = c + x (R); b -> e (R) ->
    f (R); a parameter and a buffer read by e. The region: a and d (fed by x), c (read by
    d), not e or f (linked to the region only through b, sharded)."""
    from planner.cost.sharding import Op, Operand, Strategy

    def op(name, *reads):
        operands = tuple(
            Operand("param", r[1:], (4,), True) if r.startswith("@")
            else Operand("buffer", r, None, False) if r.startswith("#")
            else Operand("node", r, (2, 4, 8), True)
            for r in reads
        )  # fmt: skip
        return Op(name, "aten.add.Tensor", "", (2, 4, 8), operands, (), 0, 0, 0, 0, True, ())

    ops = [op("a", "x"), op("b", "a"), op("c", "b"), op("d", "c", "x"), op("e", "b", "@w", "#m"),
           op("f", "e")]  # fmt: skip
    prob = sharding.BlockProblem(2, ops, {o.name: i for i, o in enumerate(ops)}, {}, [], {}, {},
                                 [], {}, frozenset(), 0)  # fmt: skip
    strat = [Strategy(s, ()) for s in ("R", "S2", "R", "R", "R", "R")]
    assert sharding._replicated_region(prob, strat, {"x"}) == {"a", "c", "d"}
    assert sharding._replicated_region(prob, strat, {"b"}) == {"c", "e", "d", "f"}
    assert sharding._replicated_region(prob, strat, set()) == set()
    # a sharded op fed by the seed is no part of it
    strat[0] = Strategy("S0", ())
    assert sharding._replicated_region(prob, strat, {"x"}) == {"c", "d"}


# --------------------------------------------------------------------------- views by hand


def test_identity_views_keep_the_split_and_negative_dims_count_from_the_end():
    """alias, detach, lift_fresh_copy and getitem hand the split dim on where the output
    keeps its size divisible by t; a transpose or permute with negative dims, a split along
    its dim argument (the third) or any other (the second), unbind by its dim."""
    m = sharding._map_view_dim
    for base in ("alias", "detach", "lift_fresh_copy", "getitem"):
        assert m(base, (4, 6, 8), (4, 6, 8), 2, [], 2) == 2, base
    assert m("transpose", (4, 6, 8), (8, 6, 4), 0, [{}, -3, -1], 2) == 2
    assert m("permute", (4, 6, 8), (8, 4, 6), 2, [{}, [-1, 0, 1]], 2) == 0
    assert m("split", (4, 6, 8), (4, 6, 4), 2, [{}, 4, -1], 2) is None
    assert m("split", (4, 6, 8), (4, 6, 4), 0, [{}, 4, -1], 2) == 0
    assert m("split_with_sizes", (4, 6, 8), (4, 6, 4), 2, [{}, [4, 4], -1], 2) is None
    assert sharding._split_dim("split_with_sizes", [{}, [4, 4], -1], 3) == 2
    assert sharding._split_dim("unbind", [{"node": "x"}, {}], 3) == 0
    assert sharding._split_dim("unbind", [{"node": "x"}, 1, {}], 3) == 1


def test_block_sharded_views_by_chunk_sizes_identity_and_position():
    """The k = 3 blocks of dim 2 (12 = 3 x 4): handed on by a chunk into 3 or sizes [4, 4,
    4] (each block's S2); by getitem and an expand as blocks (at t = 3 too, 9 = 3 x 3); by a
    transpose to dim 0. A getitem to another size, an op with no rule, a reshape folding a
    size-2 dim into the blocks have no image; folding a size-1 dim keeps the blocks."""
    b = sharding._blocks_image
    x = {"node": "x"}
    assert b("chunk", (2, 4, 12), (2, 4, 4), 2, 3, [x, 3, -1], 2) == "S2"
    assert b("split_with_sizes", (2, 4, 12), (2, 4, 4), 2, 3, [x, [4, 4, 4], -1], 2) == "S2"
    assert b("getitem", (2, 4, 12), (2, 4, 12), 2, 3, [], 2) == "S2/3"
    assert b("getitem", (2, 4, 9), (2, 4, 9), 2, 3, [], 3) == "S2/3"
    assert b("getitem", (2, 4, 12), (2, 4, 6), 2, 3, [], 2) is None
    assert b("expand", (2, 4, 12), (3, 2, 4, 12), 2, 3, [x, [3, 2, 4, 12]], 2) == "S3/3"
    assert b("transpose", (2, 4, 12), (12, 4, 2), 2, 3, [x, 0, 2], 2) == "S0/3"
    assert b("as_strided", (2, 4, 12), (2, 4, 12), 2, 3, [], 2) is None
    assert b("view", (2, 12), (24,), 1, 3, [], 2) is None
    assert b("view", (1, 12), (12,), 1, 3, [], 2) == "S0/3"


def test_reshape_groups_past_trailing_ones_and_unflattened_dims():
    """(24,) -> (2, 3, 4): one group of all three; (4, 6, 1) -> (4, 6): the size-1 dim in no
    group; a group of size-1 dims has no leading dim to carry a split."""
    assert sharding._reshape_group((24,), (2, 3, 4), 0) == ([0], [0, 1, 2])
    assert sharding.reshape_dim((24, 8), (2, 3, 4, 8), 0, 2) == 0
    assert sharding._reshape_group((4, 6, 1), (4, 6), 2) is None
    assert sharding.reshape_dim((4, 1, 6), (4, 1, 6), 1, 2) is None


def test_binding_gathers_a_region_read_whole_and_keeps_dtensor_styles():
    """o column-parallel alone: its output read whole by the add, so its module gathers at
    once (``colwise_gather``, the block count kept for a by-blocks style); a layout on
    DTensors keeps every column-parallel output a DTensor."""
    from dataclasses import replace

    g, b, prob, choice, tpl = llama_template({"no": ("S2", "colwise")})
    assert sharding._bind(g, b, tpl, 2).tp_plan == {"layer.attn.o": "colwise_gather"}
    blocks = replace(tpl, plans=((3, 1, "colwise_dtensor:2"),))
    assert sharding._bind(g, b, blocks, 2).tp_plan == {"layer.attn.o": "colwise_gather:2"}
    g, b, prob, choice, tpl = llama_template()
    dt = sharding._bind(g, b, replace(tpl, on_dtensors=True), 2)
    assert dt.tp_plan == {"layer.attn.q": "colwise_dtensor", "layer.attn.o": "rowwise"}


def test_a_partial_weight_is_summed_by_its_module_unless_read_only_where_gathered():
    """The runtime sums the gradient of a replicated weight read on a shard, by its module
    (the weight's name without its last part: ``layer.norm``), unless a style already makes
    it a DTensor (q's) or every shard it meets runs gathered (scale.w read by the mul
    between two column-parallel products, each gathered at its own output)."""
    from dataclasses import replace

    from test_mutant_kills_sharding import scaled_graph

    g, b, prob, choice, tpl = llama_template()
    sharded_norm = replace(tpl, states=("S1", *tpl.states[1:]), grad_sums=((0, 1), (1, 1)))
    assert sharding._bind(g, b, sharded_norm, 2).grad_sums == ("layer.norm",)
    g, b = scaled_graph()  # fc1, s = scale.w + 1, act = fc1 * s, fc2, out
    both = sharding._Template(
        name="v", choice=(), states=("S2", "R", "S2", "S2", "R"),
        needs=(("R", "S0", "S0"), ("R",), ("S2", "R"), ("R", "S0", "S0"), ("R", "R")),
        plans=((0, 1, "colwise"), (3, 1, "colwise")), grad_sums=((1, 0),),
        compute_fraction=1.0, memory_bound_fraction=1.0, param_fraction=1.0, saved_bytes=0,
        saved_selective_bytes=0, input_bytes=0, comm_fwd=(), comm_bwd=(), time_s=0.0,
        memory=0.0,
    )  # fmt: skip
    v = sharding._bind(g, b, both, 2)
    assert v.tp_plan == {"fc1": "colwise_gather", "fc2": "colwise_gather"}
    assert v.grad_sums == ()
    # fc2 row-parallel instead: the mul runs on fc1's shard, so scale.w's gradient is summed
    kept = replace(both, states=("S2", "R", "S2", "P", "R"), plans=((0, 1, "colwise"), (3, 1,
                   "rowwise")), needs=(*both.needs[:3], ("S2", "S1", "R"), ("R", "R")))  # fmt: skip
    v = sharding._bind(g, b, kept, 2)
    assert v.tp_plan == {"fc1": "colwise", "fc2": "rowwise"} and v.grad_sums == ("scale",)


def test_the_holder_of_a_weight_is_its_module_or_the_tied_reader_holding_it_too():
    g = nx.DiGraph()
    g.add_node("h", module="model.head")
    g.add_node("e", module="model.wte")
    assert sharding._holder(g, "e", "model.wte.weight") == "model.wte"
    assert sharding._holder(g, "h", "model.wte.weight") == "model.wte"  # no alias recorded
    g.graph["param_owner"] = {"model.head.weight": "model.wte.weight"}
    assert sharding._holder(g, "h", "model.wte.weight") == "model.head"
    assert sharding._holder(g, "e", "model.wte.weight") == "model.wte"
    g.graph["param_owner"] = {"model.head.bias": "model.wte.weight"}
    assert sharding._holder(g, "h", "model.wte.weight") == "model.wte"


def test_a_sequence_of_two_tokens_splits_and_one_edge_gather_is_dropped_alone():
    assert sharding._token_dim((2, 2, 8), (2, 2), 2) == 1
    from dataclasses import replace

    *_, sp = llama_sp()
    g, b = llama_graph()
    v = sharding._bind(g, b, sp, 2)
    exit_only = replace(v, entry_gather=())
    left = sharding.sequence_stream(exit_only, False, True)
    assert left.comm_fwd == v.comm_fwd[:-1] and left.leaves_sequence_shard
    entry_only = replace(v, exit_gather=())
    taken = sharding.sequence_stream(entry_only, True, False)
    assert taken.comm_bwd == v.comm_bwd[:-1] and taken.takes_sequence_shard


def test_templates_drop_a_layout_matched_in_one_measure_and_beaten_in_the_other(monkeypatch):
    """Variants of the layer at 20 s/B: q keeping a 64-byte copy of its own output (halved
    when q is split) makes q-alone 32 B lighter than o-alone at the same time, so o-alone
    goes; o 200 s slower (3200) makes o-alone 100 s faster than q-alone at the same memory,
    so q-alone goes; q 200 s slower and o keeping the copy: q-alone 100 s faster, o-alone
    32 B lighter, both kept, ranked by time (not by layout). At degree one, or with no ops,
    the ILP is not asked."""
    from dataclasses import replace

    g, b = llama_graph()
    prob = build_problem(g, b, 2, flops_per_second=1.0, bytes_per_second=1.0)
    asked = []

    def ilp(p, spb, time_scale, memory_scale):
        asked.append(spb)
        return [(c, 0.0) for c in (BOTH_COL, MEG, Q_COL, O_COL)]

    monkeypatch.setattr(sharding, "sharding_milp", ilp)

    def changed(**ops):
        return replace(prob, ops=[replace(op, **ops.get(op.name, {})) for op in prob.ops])

    def front(p, keep=3):
        return [(t.choice, t.time_s, t.memory) for t in sharding._templates(p, 20.0, keep)]

    copy = (("nrm", 256), (None, 64))
    assert front(changed(nq={"saved": copy})) == [
        (REP, 9460.0, 3264.0), (Q_COL, 15640.0, 2720.0), (MEG, 16060.0, 1952.0),
    ]  # fmt: skip
    assert front(changed(no={"seconds": 3200.0})) == [
        (REP, 9660.0, 3200.0), (O_COL, 15740.0, 2688.0), (MEG, 16160.0, 1920.0),
    ]  # fmt: skip
    both = changed(nq={"seconds": 3200.0}, no={"saved": (("act", 256), (None, 64))})
    assert front(both, 2) == [
        (REP, 9660.0, 3264.0), (Q_COL, 15740.0, 2752.0), (O_COL, 15840.0, 2720.0),
    ]  # fmt: skip
    assert [t.name for t in sharding._templates(both, 20.0, 2)] == ["replicated", "tp2-v1",
                                                                    "tp2-v2"]  # fmt: skip
    asked.clear()
    one = build_problem(g, b, 1, flops_per_second=1.0, bytes_per_second=1.0)
    assert [t.name for t in sharding._templates(one, 20.0, 3)] == ["replicated"]
    assert [t.name for t in sharding._templates(replace(prob, ops=[], outputs=[]), 20.0, 3)] == [
        "replicated"
    ]
    assert asked == []


# --------------------------------------------------------------------------- reductions, cat


def states(op, shape, operands, args):
    """(output state, operand states) of each strategy ``op`` offers at TP 2."""
    return [(out, req) for out, req, _ in strategies(op, shape, operands, args=args)]


def test_a_softmax_over_its_first_dim_or_with_two_arguments_keeps_the_others():
    x = node("x", (4, 6, 8))
    first = states("aten._softmax.default", (4, 6, 8), [x], [X, 0, False])
    assert first == [("R", ("R",)), ("S1", ("S1",)), ("S2", ("S2",))]
    two = states("aten.softmax.int", (4, 6, 8), [x], [X, -1])
    assert two == [("R", ("R",)), ("S0", ("S0",)), ("S1", ("S1",))]


def test_a_reduction_whose_dims_are_keywords_is_taken_as_whole():
    """amax with its dims in the kwargs dict: read as a full reduction (replicated only),
    not as a reduction of dim 0 (which would hand x's dim 1 on as the output's dim 0)."""
    x = node("x", (4, 6, 8))
    assert states("aten.amax.default", (6, 8), [x], [X, {"dim": [0]}]) == [("R", ("R",))]


def test_cat_along_a_negative_dim_and_past_an_empty_legacy_operand():
    a, b = node("a", (4, 2)), node("b", (4, 4))
    args = [[ref("a"), ref("b")], -1, {}]
    assert states("aten.cat.default", (4, 6), [a, b], args) == [
        ("R", ("R", "R")), ("P", ("P", "P")), ("S0", ("S0", "S0")),
    ]  # fmt: skip
    # torch.cat skips a 1-D empty tensor beside 2-D ones: no dim of it to split alike
    e = node("e", (0,))
    args = [[ref("a"), ref("e")], 1, {}]
    assert states("aten.cat.default", (4, 2), [a, e], args) == [
        ("R", ("R", "R")), ("P", ("P", "P")),
    ]  # fmt: skip


def test_sections_of_unit_splits_and_of_calls_with_no_sizes():
    assert sharding._sections("split", 3, [X, 1]) == [(0, 1), (1, 1), (2, 1)]
    assert sharding._sections("split", 3, [X, {}]) is None
    assert sharding._sections("split_with_sizes", 3, [X, {}]) is None
    assert sharding._sections("chunk", 4, [X, 1]) == [(0, 4)]
    assert sharding._sections("chunk", 4, [X, {}]) is None


# --------------------------------------------------------------------------- read sharded


def params_graph():
    """Values of parameters met by the activation x [2, 4, 8], one module per case (``add``
    ops; states chosen per test):

    * m: p1 = m.a + 1, p2 = m.b + 1, e = x * p1, c = p1 + p2 (p1's successors e then c, so
      c, reached first through p2, comes up again before e);
    * n: r1 = n.a + 1 -> r2 = r1 * 2 -> f = x * r2 (a chain of parameter values);
    * k: k1 = k.a + 1 -> k2 = x + k1 -> k3 = k2 * 3 (k2 reads the activation);
    * s: s1 = s.a + 1, alone;
    * u: u1 = u.a + 1 -> out1 = u1 * 2, outside the block -> w = x * out1."""
    g = nx.DiGraph()
    _node(g, "x", "input", [], [2, 4, 8])
    add, mul = "aten.add.Tensor", "aten.mul.Tensor"
    for name, op, args in (
        ("p1", add, [{"param": "m.a"}, 1]), ("p2", add, [{"param": "m.b"}, 1]),
        ("e", mul, [X, ref("p1")]), ("c", add, [ref("p1"), ref("p2")]),
        ("r1", add, [{"param": "n.a"}, 1]), ("r2", mul, [ref("r1"), 2]),
        ("f", mul, [X, ref("r2")]),
        ("k1", add, [{"param": "k.a"}, 1]), ("k2", add, [X, ref("k1")]),
        ("k3", mul, [ref("k2"), 3]),
        ("s1", add, [{"param": "s.a"}, 1]),
        ("u1", add, [{"param": "u.a"}, 1]), ("out1", mul, [ref("u1"), 2]),
        ("w", mul, [X, ref("out1")]),
    ):  # fmt: skip
        _node(g, name, op, args, [2, 4, 8])
    params = {p: [8] for p in ("m.a", "m.b", "n.a", "k.a", "s.a", "u.a")}
    g.graph.update(param_shapes=params, param_owner={p: p for p in params})
    nodes = ["p1", "p2", "e", "c", "r1", "r2", "f", "k1", "k2", "k3", "s1", "u1", "w"]
    return g, _block(nodes, params, modules=("blk",))


def test_a_parameter_value_meeting_a_shard_is_found_through_chains_and_repeats():
    g, b = params_graph()
    states = dict.fromkeys(b.nodes, "R")
    read = sharding._read_sharded
    # e (x * p1) sharded: found after c comes up a second time
    assert read(g, b, "m", {**states, "e": "S2"}, set())
    assert not read(g, b, "m", {**states, "e": "S2"}, {"e"})
    # f at the end of a chain of parameter values
    assert read(g, b, "n", {**states, "f": "S2"}, set())
    # k2 reads the activation, replicated: what follows is no value of parameters
    assert not read(g, b, "k", {**states, "k3": "S2"}, set())
    # a parameter value itself sharded
    assert read(g, b, "s", {**states, "s1": "S2"}, set())
    # a value of no state (tensorless, absent from states) is taken as replicated
    assert not read(g, b, "s", {k: v for k, v in states.items() if k != "s1"}, set())
    assert not read(g, b, "k", {k: v for k, v in states.items() if k != "k2"}, set())
    no_r2 = {k: v for k, v in states.items() if k != "r2"}
    assert read(g, b, "n", {**no_r2, "f": "S2"}, set())  # followed through r2 to f
    # a successor outside the block is not followed
    assert not read(g, b, "u", {**states, "w": "S2"}, set())


# --------------------------------------------------------------------------- sharded regions


def region_graph(outputs=("out",)):
    """x -> col (column-parallel) -> ext (outside the block, made first), a1, a2 -> a3 =
    a1 + a2 -> row -> out = row + x. ``outputs``: the graph's outputs (None: no key)."""
    g = nx.DiGraph()
    _node(g, "x", "input", [], [2, 4, 8])
    w = {"param": "w"}
    for name, op, args in (
        ("col", LINEAR, [X, w]), ("ext", "aten.neg.default", [ref("col")]),
        ("a1", "aten.gelu.default", [ref("col")]), ("a2", "aten.neg.default", [ref("col")]),
        ("a3", "aten.add.Tensor", [ref("a1"), ref("a2")]), ("row", LINEAR, [ref("a3"), w]),
        ("out", "aten.add.Tensor", [ref("row"), X]),
    ):  # fmt: skip
        _node(g, name, op, args, [2, 4, 8])
    g.graph.update(param_shapes={"w": [8, 8]}, param_owner={"w": "w"})
    if outputs is not None:
        g.graph["outputs"] = list(outputs)
    return g, _block(["col", "a1", "a2", "a3", "row", "out"], ["w"], modules=("blk",))


SHARD = {"col": "S2", "ext": "S2", "a1": "S2", "a2": "S2", "a3": "S2", "row": "P", "out": "R"}
READS = {"col": ("R", "S0"), "ext": ("S2",), "a1": ("S2",), "a2": ("S2",), "a3": ("S2", "S2"),
         "row": ("S2", "S1"), "out": ("R", "R")}  # fmt: skip


def test_a_sharded_region_runs_to_its_partial_sums_and_gathers_where_read_whole():
    """(gathered, reaches a row-parallel consumer, its ops) downstream of col: ext, outside
    the block, gathers it; a successor of no state is passed over (the others still
    followed); a consumer reading col whole starts anew; one reading a2 whole beside a1 as
    the shard still gathers; a block output gathers; a replicated output gathers."""
    region = sharding._sharded_region
    g, b = region_graph()
    inside = {k: v for k, v in SHARD.items() if k != "ext"}
    everything = {"col", "a1", "a2", "a3"}
    assert region(g, b, "col", inside, READS) == (True, True, everything)
    g, b = region_graph(outputs=None)
    assert region(g, b, "col", inside, READS) == (True, True, everything)
    b.nodes.append("ext")  # ext inside: nothing gathers
    assert region(g, b, "col", SHARD, READS) == (False, True, everything | {"ext"})
    # row column-parallel too: out reads it whole
    row_col = {**SHARD, "row": "S2"}
    assert region(g, b, "col", row_col, READS) == (True, False, everything | {"ext", "row"})
    # a1 reads col whole: a new output; a2 still the shard
    whole_a1 = {**READS, "a1": ("R",)}
    assert region(g, b, "col", SHARD, whole_a1) == (True, True, {"col", "ext", "a2", "a3"})
    # a3 reads a2 whole and a1 as the shard
    mixed = {**READS, "a3": ("S2", "R")}
    assert region(g, b, "col", SHARD, mixed) == (True, True, everything | {"ext"})
    # a3 replicated (reads its operands as shards: a sum of local parts made whole)
    a3_whole = {**SHARD, "a3": "R"}
    assert region(g, b, "col", a3_whole, READS) == (True, False, {"col", "ext", "a1", "a2"})
    # a block output inside the region
    g, b = region_graph(outputs=("out", "a1"))
    b.nodes.append("ext")
    assert region(g, b, "col", SHARD, READS) == (True, True, everything | {"ext"})


def test_a_template_of_a_layout_splitting_a_replicated_tensor_runs_on_dtensors():
    g, b, prob, choice, tpl = llama_template()
    split = restyle(prob, choice, "act", op="aten.expand.default", req=("R",))
    ev = sharding.evaluate(prob, choice, 1e-3)
    assert sharding._template(split, choice, "v", ev).on_dtensors is True
