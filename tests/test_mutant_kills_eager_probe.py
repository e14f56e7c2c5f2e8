"""The eager probe (``planner.cost.eager_probe``) driven directly on small hand-written blocks on
the meta device, so that each generated mutant of it dies in milliseconds: a linear pair that
shards cleanly, attention that views by ``self.num_heads`` and infers the sequence (OPT's
misread, fixed by the local head count), the same with the sequence written out (fails on its
shards), an output projection left whole (fails, no fix) and a forward that asks a meta tensor
for data (the probe cannot tell). Every verdict, recorded reshape and cut shape is stated by
hand from the blocks' sizes: batch 2, sequence 4, hidden 8 as 4 heads of 2, TP 2."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from planner.cost import eager_probe
from planner.cost.eager_probe import (
    EagerShardProbe,
    _colwise,
    _cut,
    _first_misplaced,
    _join,
    _local_fix,
    _read_json,
    _relative,
    _verdicts_path,
)

B, S, H = 2, 4, 8


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(H, 16), nn.Linear(16, H)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Attn(nn.Module):
    """``view(b, -1, self.num_heads, self.head_dim)`` (OPT) or, with ``seq``,
    ``view(b, s, self.num_heads, self.head_dim)`` (StableLM)."""

    def __init__(self, seq: bool = False) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.seq = 4, 2, seq
        self.q, self.o = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x):
        b, s, _ = x.shape
        h = self.q(x).view(b, s if self.seq else -1, self.num_heads, self.head_dim)
        return self.o(h.reshape(b, s, -1))


class Llama(Attn):
    """``view(b, s, -1, self.head_dim)``: the local view holds the local heads."""

    def forward(self, x):
        b, s, _ = x.shape
        return self.o(self.q(x).view(b, s, -1, self.head_dim).reshape(b, s, -1))


class DataCheck(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(H, 16), nn.Linear(16, H)

    def forward(self, x):
        if bool((x > 0).all()):  # data: the meta device has none
            x = x + 1
        return self.fc2(self.fc1(x))


class Root(nn.Module):
    def __init__(self, blk: nn.Module) -> None:
        super().__init__()
        self.blk = blk


def probe_of(make, mode=None) -> EagerShardProbe:
    """A probe whose meta model is ``Root(make())`` with the block's input captured (what
    ``_load`` would build from a model file)."""
    with torch.device("meta"):
        model = Root(make())
        x = torch.empty(B, S, H)
    probe = EagerShardProbe(None, "fp32")
    probe._model, probe._mode = model, mode
    probe._inputs = {"blk": ((x,), {})}
    return probe


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    yield


ATTN_PLAN = {"blk.q": "colwise", "blk.o": "rowwise"}


def test_a_linear_pair_shards_cleanly():
    probe = probe_of(Mlp)
    plan = {"blk.fc1": "colwise", "blk.fc2": "rowwise"}
    assert probe.reject("mlp", "blk", plan, 2) is None
    assert probe.unsafe_outputs("mlp", "blk", plan, 2) == set()
    assert probe.local_attributes("mlp", "blk", plan, 2) == []
    key = json.dumps(["mlp", 2, [["fc1", "colwise"], ["fc2", "rowwise"]]])
    assert probe.verdicts == {key: ["", [], []]}
    assert probe._probed == 1
    # the whole run: each Linear flattens its input to (8, k) and back (the meta kernels'
    # views); only what follows fc1's output derives from it
    fc1, no = frozenset({"fc1"}), frozenset()
    seen = [
        ("aten.view.default", (B, S, H), (8, H), no),
        ("aten.view.default", (8, 16), (B, S, 16), no),
        ("aten.view.default", (B, S, 16), (8, 16), fc1),
        ("aten.view.default", (8, H), (B, S, H), fc1),
    ]
    assert probe._whole == {("blk", fc1): (seen, frozenset(), None)}


def test_a_fixed_head_count_view_is_rejected_and_fixed_by_the_local_count():
    probe = probe_of(Attn)
    reason = probe.reject("attn", "blk", ATTN_PLAN, 2)
    # q's local output (2, 4, 4) viewed as (2, -1, 4, 2): the -1 takes half the sequence
    assert reason == (
        "blk: its code reshapes a local shard [2, 4, 4] to [2, 2, 4, 2], not [2, 4, 2, 2] "
        "(a view that fixes the head count and infers another dim, such as "
        "view(batch, -1, heads, head_dim)); its column-parallel outputs stay DTensors"
    )
    assert probe.unsafe_outputs("attn", "blk", ATTN_PLAN, 2) == {"q"}
    assert probe.local_attributes("attn", "blk", ATTN_PLAN, 2) == ["blk.num_heads"]
    ((seen, failed, exc),) = probe._whole.values()
    view = "aten.view.default"
    q = frozenset({"q"})
    assert [s[1:] for s in seen[2:4]] == [
        ((B, S, H), (B, S, 4, 2), q),
        ((B, S, 4, 2), (B, S, H), q),
    ]
    assert {s[0] for s in seen} == {view} and len(seen) == 6
    assert (failed, exc) == (frozenset(), None)
    # the local run as it reads: the view misplaces, the reshape back reads 4 features
    local = probe._run(_local(probe, ATTN_PLAN, 2), "blk", {"q": "colwise", "o": "rowwise"})
    assert [s[1:3] for s in local[0][2:4]] == [((B, S, 4), (B, 2, 4, 2)), ((B, 2, 4, 2), (B, S, 4))]
    assert local[2] is None
    notes = probe.notes()
    assert notes == [
        "tensor parallelism: blk: its code views by a fixed head count; each rank runs it with "
        "num_heads set to the local count (split by heads)"
    ]


def _local(probe: EagerShardProbe, plan: dict[str, str], t: int) -> nn.Module:
    import copy

    local = copy.deepcopy(probe._model.blk)
    for rel, style in _relative(plan, "blk").items():
        _cut(local.get_submodule(rel), style, t)
    return local


def test_a_view_that_writes_the_sequence_fails_on_its_shards():
    probe = probe_of(lambda: Attn(seq=True))
    reason = probe.reject("attn", "blk", ATTN_PLAN, 2)
    assert reason.startswith("blk: its code fails on local shards (RuntimeError: ")
    assert reason.endswith(")")
    assert len(reason) <= len("blk: its code fails on local shards (RuntimeError: ") + 121
    assert "\n" not in reason and "  " not in reason
    assert probe.unsafe_outputs("attn", "blk", ATTN_PLAN, 2) == {"q"}
    assert probe.local_attributes("attn", "blk", ATTN_PLAN, 2) == ["blk.num_heads"]
    # at TP 4 the same whole run serves (one per column-parallel set), and 4 heads / 4 = 1
    assert probe.local_attributes("attn", "blk", ATTN_PLAN, 4) == ["blk.num_heads"]
    assert len(probe._whole) == 1 and probe._probed == 2
    # the note names the module before the reason's first colon, not its last
    assert probe.notes() == [
        "tensor parallelism: blk: its code views by a fixed head count; each rank runs it with "
        "num_heads set to the local count (split by heads)"
    ]


def test_llama_views_pass_and_a_whole_output_projection_fails_without_fix():
    probe = probe_of(Llama)
    assert probe.reject("llama", "blk", ATTN_PLAN, 2) is None
    q_only = {"blk.q": "colwise"}
    reason = probe.reject("llama", "blk", q_only, 2)
    assert reason.startswith("blk: its code fails on local shards (RuntimeError")
    assert probe.unsafe_outputs("llama", "blk", q_only, 2) == {"q"}
    assert probe.local_attributes("llama", "blk", q_only, 2) == []
    # the two plans mark the same column-parallel set: one whole run
    assert list(probe._whole) == [("blk", frozenset({"q"}))]
    assert probe.notes() == [f"tensor parallelism: {reason}"]


def test_a_data_dependent_block_is_no_reason_to_refuse():
    probe = probe_of(DataCheck)
    plan = {"blk.fc1": "colwise", "blk.fc2": "rowwise"}
    assert probe.reject("dc", "blk", plan, 2) is None
    assert probe.local_attributes("dc", "blk", plan, 2) == []
    ((seen, _, exc),) = probe._whole.values()
    assert seen == [] and exc is not None


def test_styles_it_cannot_judge_run_no_probe():
    probe = probe_of(Attn)
    for plan in ({}, {"blk.q": "colwise_dtensor", "blk.o": "rowwise"}, {"blk": "sequence"}):
        assert probe.reject("attn", "blk", plan, 2) is None
    assert probe.verdicts == {} and probe._probed == 0 and probe._whole == {}
    # a gathered column-parallel q leaves the whole output: no reshape is misread
    gathered = {"blk.q": "colwise_gather", "blk.o": "rowwise"}
    assert probe.reject("attn", "blk", gathered, 2) is not None  # o's input is whole
    assert probe.reject("attn", "blk", {"blk.q": "colwise_gather"}, 2) is None
    assert probe._probed == 2


def test_an_uncaptured_module_is_not_judged():
    probe = probe_of(Attn)
    probe._inputs = {}
    assert probe.reject("attn", "blk", ATTN_PLAN, 2) is None
    assert probe._whole == {}


def test_in_out_styles_cut_the_output_and_whole_the_input():
    probe = probe_of(Mlp)
    plan = {"blk.fc1": "colwise_in_out", "blk.fc2": "rowwise_in_out"}
    assert probe.reject("mlp", "blk", plan, 2) is None
    local = _local(probe, plan, 2)
    assert local.fc1.weight.shape == (16, H)  # weights stay whole: hooks cut
    with torch.device("meta"):
        out = local.fc1(torch.empty(B, S, H))
        assert out.shape == (B, S, 8)
        assert local.fc2(torch.empty(B, S, 8)).shape == (B, S, H)


def test_cut_gives_the_local_weight_shapes():
    with torch.device("meta"):
        lin, emb, norm = (
            nn.Linear(8, 12, dtype=torch.bfloat16),
            nn.Embedding(10, 6),
            nn.LayerNorm(8),
        )
        row, gath = nn.Linear(12, 8), nn.Linear(8, 12)
    _cut(lin, "colwise", 2)
    assert lin.weight.shape == (6, 8) and lin.bias.shape == (6,)
    assert lin.weight.dtype == lin.bias.dtype == torch.bfloat16
    assert lin.weight.device.type == "meta" and isinstance(lin.weight, nn.Parameter)
    _cut(row, "rowwise", 4)
    assert row.weight.shape == (8, 3) and row.bias.shape == (8,)
    _cut(gath, "colwise_gather", 2)
    assert gath.weight.shape == (12, 8)
    _cut(emb, "colwise", 3)
    assert emb.weight.shape == (10, 2)
    with torch.device("meta"):
        emb2 = nn.Embedding(10, 6)
    _cut(emb2, "rowwise", 2)
    assert emb2.weight.shape == (5, 6)
    _cut(norm, "colwise", 2)
    assert norm.weight.shape == (8,)
    with torch.device("meta"):
        nob = nn.Linear(8, 12, bias=False)
    _cut(nob, "colwise:3", 2)
    assert nob.weight.shape == (6, 8) and nob.bias is None


def test_plan_paths_relative_to_the_block():
    tp = {"blk.q": "colwise", "blk": "sp_block", "blkx.q": "rowwise", "blk.a.b": "rowwise"}
    assert _relative(tp, "blk") == {
        "q": "colwise",
        "": "sp_block",
        "blkx.q": "rowwise",
        "a.b": "rowwise",
    }
    assert _join("blk", "q") == "blk.q" and _join("blk", "") == "blk"
    plan = {"": "colwise", "q": "colwise_in_out", "k": "colwise:3", "g": "colwise_gather"}
    assert _colwise({**plan, "o": "rowwise"}) == frozenset({"q", "k"})


def test_first_misplaced_by_hand():
    q = frozenset({"q"})
    whole = [("v", (2, 4, 8), (2, 4, 4, 2), q)]
    ok = [("v", (2, 4, 4), (2, 4, 2, 2), q)]
    assert _first_misplaced("m", whole, ok, 2) == ("", set())
    assert _first_misplaced("m", whole, [], 2) == (
        "m: its code takes another path on local shards",
        set(),
    )
    two = [("v", (1, 2, 8), (1, 2, 4, 2), q)]
    assert _first_misplaced("m", whole, two, 2) == (
        "m: a reshape sees [1, 2, 8] on local shards, not one dim of [2, 4, 8] split",
        {"q"},
    )
    rank = [("v", (2, 4), (2, 4, 2, 2), q)]
    assert _first_misplaced("m", whole, rank, 2)[1] == {"q"}
    # the split inner dim of a merge has no image
    merge = [("v", (2, 4, 4, 2), (2, 4, 8), q)]
    local = [("v", (2, 4, 4, 1), (2, 4, 4), q)]
    assert _first_misplaced("m", merge, local, 2) == (
        "m: a reshape of [2, 4, 4, 2] cannot keep dim 3 split",
        {"q"},
    )
    # unsplit input, same output: fine; unsplit input, another output: misread
    same = [("v", (2, 4, 8), (2, 4, 4, 2), q)]
    assert _first_misplaced("m", same, same, 2) == ("", set())
    other = [("v", (2, 4, 8), (2, 8, 2, 2), q)]
    assert _first_misplaced("m", same, other, 2)[0].startswith(
        "m: its code reshapes a local shard [2, 4, 8] to [2, 8, 2, 2], not [2, 4, 4, 2]"
    )
    # the second reshape is checked too
    assert _first_misplaced("m", whole * 2, ok + [("v", (2, 4, 4), (2, 2, 4, 2), q)], 2)[1] == {"q"}


def test_local_fix_tries_each_attribute_then_pairs(monkeypatch):
    probe = probe_of(Attn)
    plan = {"q": "colwise", "o": "rowwise"}
    seen, _, _ = probe._whole_run(probe._model.blk, "blk", plan)
    local = _local(probe, ATTN_PLAN, 2)
    assert _local_fix(probe, "blk", plan, 2, seen, local) == ["num_heads"]
    # the attribute is set on a copy: the local block keeps its count
    assert local.num_heads == 4
    # at TP 3 no attribute is divisible: none is tried
    assert _local_fix(probe, "blk", plan, 3, seen, local) == []
    # sizes no column-parallel reshape fixes are no candidates
    unmarked = [(op, i, o, frozenset()) for op, i, o, _ in seen]
    assert _local_fix(probe, "blk", plan, 2, unmarked, local) == []
    monkeypatch.setattr(eager_probe, "MAX_FIXES", 0)
    assert _local_fix(probe, "blk", plan, 2, seen, local) == []


def test_verdicts_are_saved_adopted_and_read_back(tmp_path):
    path = _verdicts_path("abc")
    assert path.parent == tmp_path / "probes"
    assert path.name.startswith("abc-") and path.suffix == ".json"
    assert len(path.stem) == len("abc-") + 16
    probe = probe_of(Attn)
    probe._path = path
    probe.save()  # nothing probed: nothing written
    assert not path.exists()
    probe.adopt({"k": ["", [], []]})
    assert probe._probed == 1
    probe.adopt({"k": ["other", [], []], "j": ["r: x", ["q"], []]})
    assert probe.verdicts == {"k": ["", [], []], "j": ["r: x", ["q"], []]}
    assert probe._probed == 2
    probe.save()
    assert path.read_text() == '{"j": ["r: x", ["q"], []], "k": ["", [], []]}'  # keys sorted
    probe.adopt({"i": ["", [], []]})
    probe.save()  # the folder exists now
    assert json.loads(path.read_text()) == probe.verdicts
    again = EagerShardProbe(None, "fp32", trace_key="abc")
    assert again.verdicts == probe.verdicts and again._probed == 0
    assert EagerShardProbe(None, "fp32").verdicts == {}
    # an unwritable cache only costs time
    probe._path = tmp_path / "file" / "v.json"
    (tmp_path / "file").write_text("")
    probe.save()


def test_read_json_takes_only_a_dict(tmp_path):
    p = tmp_path / "v.json"
    assert _read_json(p) == {}
    p.write_text("[1]")
    assert _read_json(p) == {}
    p.write_text("{")
    assert _read_json(p) == {}
    p.write_text('{"a": 1}')
    assert _read_json(p) == {"a": 1}


def test_notes_keep_each_modules_first_reason():
    probe = EagerShardProbe(None, "fp32")
    probe.verdicts = {
        json.dumps(["b", 2, []]): ["m.b: second", ["q"], []],
        json.dumps(["a", 2, []]): ["m.a: first", ["q"], []],
        json.dumps(["a", 4, []]): ["m.a: later", ["q"], []],
        json.dumps(["c", 2, []]): ["", [], []],
        json.dumps(["d", 2, []]): ["m.d: why", ["q"], ["x.num_heads", "x.kv"]],
    }
    assert probe.notes() == [
        "tensor parallelism: m.a: first",
        "tensor parallelism: m.b: second",
        "tensor parallelism: m.d: its code views by a fixed head count; each rank runs it "
        "with x.num_heads, x.kv set to the local count (split by heads)",
    ]


MODEL_FILE = """
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

TRAINING = {"global_batch_size": 2, "optimizer": "adamw", "dtype": "fp32", "lr": 1e-3}


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class Model(nn.Module):
    def __init__(self, check):
        super().__init__()
        self.check = check
        self.layers = nn.ModuleList(Layer() for _ in range(5))

    def forward(self, x):
        h = x * 1
        # transformers' mask check: data unless it sees a FakeTensor
        if self.check and not isinstance(h, FakeTensor) and bool(h.all()):
            h = h + 1
        for layer in self.layers:
            h = layer(h)
        return h


def build_model(check=False):
    return Model(check)


def make_batch(batch_size, step=0):
    return torch.ones(batch_size, 3, 8), torch.zeros(batch_size, 3, 8)
"""


@pytest.mark.parametrize("check", [False, True])
def test_load_captures_each_modules_inputs_under_the_mode_that_reaches_them(tmp_path, check):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from planner.modelfile import load_model_file

    path = tmp_path / "five.py"
    path.write_text(MODEL_FILE)
    mf = load_model_file(path, {"check": check})
    repeats = [{"path": "layers", "count": 5, "start": 0, "period": 1}]  # three kept
    probe = EagerShardProbe(mf, "bf16", repeats=repeats)
    probe.load()
    model = probe._model
    assert isinstance(probe._mode, FakeTensorMode) if check else probe._mode is None
    assert len(model.layers) == 5  # the cut is undone
    assert next(model.parameters()).dtype == torch.bfloat16
    reached = {f"layers.{i}" for i in range(5) if f"layers.{i}" in probe._inputs}
    assert reached == {"layers.0", "layers.1", "layers.2"}
    (x,), kwargs = probe._inputs["layers.0"]
    assert x.shape == (1, 3, 8) and x.dtype == torch.bfloat16 and kwargs == {}
    assert x.device.type == "meta"
    probe._whole[("stale", frozenset())] = ()
    plan = {"layers.4.fc1": "colwise", "layers.4.fc2": "rowwise"}
    # layers.4 was not reached: the full forward runs for it, once
    assert probe.reject("layer", "layers.4", plan, 2) is None
    assert probe._repeats == [] and probe._model is not model
    assert "layers.4" in probe._inputs and ("stale", frozenset()) not in probe._whole
    assert list(probe._whole) == [("layers.4", frozenset({"fc1"}))]
    assert probe._whole[("layers.4", frozenset({"fc1"}))][2] is None
    again = probe._model
    probe.load()
    assert probe._model is again


def test_a_forward_that_fails_under_both_modes_leaves_its_modules_unprobed(tmp_path):
    from planner.modelfile import load_model_file

    path = tmp_path / "fails.py"
    path.write_text(MODEL_FILE.replace("h = x * 1", "h = x * 1\n        h.view(5)"))
    probe = EagerShardProbe(load_model_file(path), "fp32")
    plan = {"layers.0.fc1": "colwise", "layers.0.fc2": "rowwise"}
    assert probe.reject("layer", "layers.0", plan, 2) is None
    assert "layers.0" not in probe._inputs and probe._whole == {}
    # the hooks are gone: a forward captures nothing more
    probe._inputs.clear()
    with torch.device("meta"):
        probe._model.layers[0](torch.empty(1, 3, 8))
    assert probe._inputs == {}


def test_save_makes_the_cache_folders(monkeypatch, tmp_path):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "a" / "b"))
    unkept = EagerShardProbe(None, "fp32")  # no trace key: verdicts for this run only
    unkept.adopt({"x": ["", [], []]})
    unkept.save()
    assert not (tmp_path / "a").exists()
    probe = EagerShardProbe(None, "fp32", trace_key="k")
    probe.adopt({"x": ["", [], []]})
    probe.save()
    assert EagerShardProbe(None, "fp32", trace_key="k").verdicts == {"x": ["", [], []]}


class Heads(nn.Module):
    """StableLM's views: q by ``num_heads``, k by ``num_kv``; both counts must be local."""

    def __init__(self) -> None:
        super().__init__()
        self.num_heads, self.num_kv, self.head_dim = 4, 2, 2
        self.q, self.k, self.o = nn.Linear(H, H), nn.Linear(H, 4), nn.Linear(12, H)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, -1, self.num_heads, self.head_dim)
        k = self.k(x).view(b, -1, self.num_kv, self.head_dim)
        return self.o(torch.cat([q.reshape(b, s, -1), k.reshape(b, s, -1)], -1))


class Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = Heads()

    def forward(self, x):
        return self.attn(x)


def test_two_head_counts_on_a_submodule_are_fixed_as_a_pair():
    probe = probe_of(Nested)
    plan = {"blk.attn.q": "colwise", "blk.attn.k": "colwise", "blk.attn.o": "rowwise"}
    assert probe.reject("n", "blk", plan, 2).startswith("blk: its code reshapes a local shard")
    assert probe.unsafe_outputs("n", "blk", plan, 2) == {"attn.q"}
    # neither alone (each try on a fresh copy), both together
    assert probe.local_attributes("n", "blk", plan, 2) == [
        "blk.attn.num_heads",
        "blk.attn.num_kv",
    ]


class Two(Attn):
    """Two heads of 4: the local count is 1."""

    def __init__(self) -> None:
        super().__init__()
        self.num_heads, self.head_dim = 2, 4


class Gain(Attn):
    """Holds a weight of its own: its attributes are not tried (a Linear's sizes are not read by
    its code)."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(H))

    def forward(self, x):
        return super().forward(x) * self.gain


class Checked(nn.Module):
    """Checks q's width against its head count before the view: the head size's try fails
    with nothing to blame, the head count's passes."""

    def __init__(self) -> None:
        super().__init__()
        self.head_dim, self.num_heads = 2, 4
        self.q, self.o = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x):
        b, s, _ = x.shape
        h = self.q(x)
        if h.shape[-1] != self.num_heads * 2:
            raise ValueError("width  of\n q " + "x" * 200)
        return self.o(h.view(b, -1, self.num_heads, self.head_dim).reshape(b, s, -1))


class Masked(Attn):
    """OPT's scores: the misread view, then an add that fails to broadcast on local shards."""

    def forward(self, x):
        b, s, _ = x.shape
        h = self.q(x).view(b, -1, self.num_heads, self.head_dim) + torch.zeros(b, s, 1, 1)
        return self.o(h.reshape(b, s, -1))


def test_which_attributes_are_tried():
    assert probe_of(Two).local_attributes("a", "blk", ATTN_PLAN, 2) == ["blk.num_heads"]
    gain = probe_of(Gain)
    assert gain.reject("a", "blk", ATTN_PLAN, 2) is not None
    assert gain.local_attributes("a", "blk", ATTN_PLAN, 2) == []
    checked = probe_of(Checked)
    assert checked.reject("a", "blk", ATTN_PLAN, 2).startswith(
        "blk: its code fails on local shards (ValueError: width of q "
    )
    # the message on one line, its whitespace collapsed, cut to 120 characters
    assert checked.reject("a", "blk", ATTN_PLAN, 2).endswith(" q " + "x" * 109 + ")")
    assert checked.unsafe_outputs("a", "blk", ATTN_PLAN, 2) == set()
    assert checked.local_attributes("a", "blk", ATTN_PLAN, 2) == ["blk.num_heads"]


def test_a_misread_view_before_a_failure_is_to_blame():
    probe = probe_of(Masked)
    assert probe.reject("m", "blk", ATTN_PLAN, 2).startswith(
        "blk: its code reshapes a local shard [2, 4, 4] to [2, 2, 4, 2], not [2, 4, 2, 2]"
    )
    assert probe.unsafe_outputs("m", "blk", ATTN_PLAN, 2) == {"q"}


class Flat(Mlp):
    """Flattens the row-parallel output: its reshape derives from fc1 (through fc2), and fc2's
    output, not split, is not marked."""

    def forward(self, x, *, gain):
        return (super().forward(x) * gain).reshape(-1, H)


class Pair(nn.Module):
    """A module whose forward takes two positional tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(H, 16))

    def forward(self, x, y):
        return x @ self.weight.T + y


def test_only_column_parallel_outputs_are_marked_and_keywords_reach_the_block():
    probe = probe_of(Flat)
    (x,), _ = probe._inputs["blk"]
    probe._inputs["blk"] = ((x,), {"gain": 2.0})
    plan = {"blk.fc1": "colwise", "blk.fc2": "rowwise"}
    assert probe.reject("f", "blk", plan, 2) is None
    ((seen, failed, exc),) = probe._whole.values()
    assert exc is None
    assert seen[-1] == ("aten.view.default", (B, S, H), (B * S, H), frozenset({"fc1"}))
    assert {c for *_, c in seen} == {frozenset(), frozenset({"fc1"})}


def test_row_parallel_in_out_keeps_the_other_arguments():
    with torch.device("meta"):
        pair, relu = Pair(), nn.ReLU()
        _cut(pair, "rowwise_in_out", 2)
        assert pair(torch.empty(3, 8), torch.empty(3, H)).shape == (3, H)
    _cut(relu, "colwise", 2)  # no weight: nothing to cut
    assert not hasattr(relu, "weight")
