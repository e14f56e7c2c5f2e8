"""Tests written for mutmut's generated mutants of runtime/tied.py (tied weights in a parallel
run; benchmarks/generated_mutants.py). One process: the module's functions on small modules
whose ties are drawn in each test. Where a function asks the other ranks (``tied_grads``'
all-gather of what each rank holds, ``new_group``, the gradients' ``all_reduce``), the module's
``dist`` is a stand-in that answers for a mesh of four ranks written out by hand, so each
test states which groups a rank must make and join, and what sum it must end with; the real
collectives run in tests/test_tied_tp.py (gloo ranks). docs/mutation.md names the mutants each
test kills."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

from planner.errors import UserInputError
from planner.modelfile import parameter_names
from planner.schema.mesh import Mesh
from runtime import tied
from runtime.tied import TiedGrads, splits_tie, tied_grads, tied_groups, untie_between

pytestmark = pytest.mark.usefixtures("gloo_one_rank")  # conftest: a one-rank gloo group


def _tied_model() -> nn.Module:
    """emb.weight is also head.weight (an output projection tied to the embedding); lin's
    weight and bias are its own; out.weight is held twice by one module (under ``w`` and
    ``v``)."""
    torch.manual_seed(0)
    model = nn.Module()
    model.emb = nn.Linear(3, 2, bias=False)
    model.lin = nn.Linear(2, 2)
    model.head = nn.Linear(3, 2, bias=False)
    model.head.weight = model.emb.weight
    model.out = nn.Module()
    model.out.w = nn.Parameter(torch.ones(2))
    model.out.v = model.out.w
    return model


def test_tied_groups_keep_only_parameters_reached_by_several_paths():
    assert tied_groups(_tied_model()) == {
        "emb.weight": ["emb.weight", "head.weight"],
        "out.w": ["out.w", "out.v"],
    }


@pytest.mark.parametrize(
    "fqn, splits",
    [
        ("emb", True),  # holds emb.weight, not head.weight
        ("head", True),
        ("", False),  # the root holds every path
        ("lin", False),  # holds no path of a tie
        ("em", False),  # a prefix of "emb" without the dot is another module
        ("out", False),  # holds both paths of out.w
        ("blk", True),  # two of a three-way tie
        ("blk.a", True),
    ],
)
def test_a_module_splits_a_tie_when_it_holds_some_but_not_all_of_its_paths(fqn, splits):
    groups = {
        "emb.weight": ["emb.weight", "head.weight"],
        "out.w": ["out.w", "out.v"],
        "blk.a.w": ["blk.a.w", "blk.b.w", "tail.w"],
    }
    assert splits_tie(fqn, groups) is splits


def _part(**children: nn.Module) -> nn.Module:
    part = nn.Module()
    for name, child in children.items():
        setattr(part, name, child)
    return part


def test_each_later_part_gets_one_copy_of_a_weight_an_earlier_part_holds():
    """Parts 1 and 2 hold the first part's weight (part 1 under two paths, one of them on the
    part itself); each gets one copy of its own, equal in value, with the same
    ``requires_grad`` (a frozen tie stays frozen); the first keeps the original, and a weight
    no earlier part holds stays shared where it is."""
    shared = nn.Parameter(torch.arange(6.0).reshape(2, 3))
    frozen = nn.Parameter(torch.arange(2.0), requires_grad=False)
    first = _part(emb=nn.Linear(3, 2, bias=False), norm=nn.Module())
    first.emb.weight = shared
    first.norm.w = frozen
    second = _part(head=nn.Linear(3, 2, bias=False), norm=nn.Module())
    second.head.weight = shared
    second.w = shared
    second.norm.w = frozen
    third = _part(head=nn.Linear(3, 2, bias=False))
    third.head.weight = shared
    own = nn.Parameter(torch.zeros(2))
    third.a, third.b = nn.Module(), nn.Module()
    third.a.p = own
    third.b.p = own

    untie_between([first, second, third])

    assert first.emb.weight is shared and first.norm.w is frozen
    copy = second.head.weight
    assert copy is not shared and second.w is copy
    assert torch.equal(copy, shared) and copy.requires_grad
    assert second.norm.w is not frozen and not second.norm.w.requires_grad
    assert torch.equal(second.norm.w, frozen)
    assert third.head.weight is not shared and third.head.weight is not copy
    assert torch.equal(third.head.weight, shared)
    assert third.a.p is own and third.b.p is own
    assert [n for n, _ in second.named_parameters()] == ["w", "norm.w"]


class _FakeDist:
    """The calls runtime.tied makes of torch.distributed, for rank ``rank`` of a run whose
    other ranks' answers to the all-gather are ``others`` (rank -> (coords, names held)).
    ``all_reduce`` adds what the other members of the group hold (``remote``: key -> the sum
    of their gradients), as a real sum over the group's ranks would."""

    def __init__(self, rank: int, world: int, others: dict, remote: dict | None = None):
        self.rank, self.world, self.others = rank, world, others
        self.remote = remote or {}
        self.sent = None
        self.made: list[tuple[int, ...]] = []
        self.reduced: list[tuple[str, str]] = []

    def get_rank(self) -> int:
        return self.rank

    def get_world_size(self) -> int:
        return self.world

    def all_gather_object(self, out: list, obj: object) -> None:
        assert len(out) == self.world
        self.sent = obj
        for r in range(self.world):
            out[r] = obj if r == self.rank else (r, *self.others[r])

    def new_group(self, ranks: list[int]) -> str:
        self.made.append(tuple(ranks))
        return "group" + "".join(map(str, ranks))

    def all_reduce(self, tensor: torch.Tensor, group: object = None) -> None:
        key = next(k for k, g in self.groups.items() if g == group)
        self.reduced.append((key, group))
        tensor.add_(self.remote[key])


def _names():
    return parameter_names(_tied_model())


def _last_stage_part() -> nn.Module:
    """The last pipeline stage of ``_tied_model``: the head (a copy of the embedding, untied)
    and a frozen copy of out.w, which is not summed."""
    part = _part(head=nn.Linear(3, 2, bias=False), out=nn.Module())
    part.out.v = nn.Parameter(torch.ones(2), requires_grad=False)
    return part


def test_a_stages_tied_copies_are_summed_over_the_ranks_sharing_its_other_coordinates(
    monkeypatch,
):
    """pp 2 x dp 2: ranks 0, 1 (stage 0) hold emb.weight and lin's; ranks 2, 3 (stage 1) the
    head's copy of emb.weight. Rank 2 (dp 0) says (2, its (dp, cp, tp), the names it holds),
    makes both groups in the same order as every rank ([0, 2], then [1, 3]: a collective),
    joins [0, 2] for emb.weight alone, and a second call with the same cache makes none."""
    mesh = Mesh(pp=2, dp=2, tp=1)
    others = {
        0: ((0, 0, 0), ["emb.weight", "lin.bias", "lin.weight"]),
        1: ((1, 0, 0), ["emb.weight", "lin.bias", "lin.weight"]),
        3: ((1, 0, 0), ["emb.weight"]),
    }
    fake = _FakeDist(2, 4, others)
    monkeypatch.setattr(tied, "dist", fake)
    cache: dict = {}
    got = tied_grads(_names(), [_last_stage_part()], mesh, cache)
    assert fake.sent == (2, (0, 0, 0), ["emb.weight"])
    assert fake.made == [(0, 2), (1, 3)]
    assert cache == {("tied", (0, 2)): "group02", ("tied", (1, 3)): "group13"}
    assert got.groups == {"emb.weight": "group02"}
    assert got.names == {"emb.weight": [(0, "head.weight")]}
    again = tied_grads(_names(), [_last_stage_part()], mesh, cache)
    assert fake.made == [(0, 2), (1, 3)] and again == got


def test_two_stages_of_one_rank_sum_their_copies_locally_and_with_the_other_rank(monkeypatch):
    """pp 2 interleaved, one rank a stage: rank 1 holds stages 1 and 3, so two copies of
    emb.weight (the head's and a second embedding call's); rank 0 holds the first. Rank 1's
    entry lists both parts, and the group [0, 1] sums them with rank 0's."""
    mesh = Mesh(pp=2, dp=1, tp=1)
    second = _part(emb=nn.Linear(3, 2, bias=False))
    fake = _FakeDist(1, 2, {0: ((0, 0, 0), ["emb.weight", "lin.weight"])})
    monkeypatch.setattr(tied, "dist", fake)
    got = tied_grads(_names(), [second, _last_stage_part()], mesh, {})
    assert fake.made == [(0, 1)]
    assert got.names == {"emb.weight": [(0, "emb.weight"), (1, "head.weight")]}
    assert got.groups == {"emb.weight": "group01"}


def test_one_rank_sums_two_parts_copies_but_not_one_parts_two_paths():
    """On one rank (the real one-rank group): the whole model in one part holds emb.weight
    under two paths, one tensor, so nothing is summed; two parts holding a copy each are
    summed with no group."""
    names = _names()
    whole = tied_grads(names, [_tied_model()], Mesh(pp=1, dp=1, tp=1), {})
    assert whole.names == {} and whole.groups == {}
    parts = [_part(emb=nn.Linear(3, 2, bias=False)), _last_stage_part()]
    got = tied_grads(names, parts, Mesh(pp=1, dp=1, tp=1), {})
    assert got.names == {"emb.weight": [(0, "emb.weight"), (1, "head.weight")]}
    assert got.groups == {}


def _with_grad(value: list[float]) -> nn.Linear:
    lin = nn.Linear(1, 2, bias=False)
    lin.weight.grad = torch.tensor(value).reshape(2, 1)
    return lin


def test_every_copy_ends_with_the_sum_of_the_local_and_remote_copies(monkeypatch):
    """Two local copies (gradients g0, g1), a third without a gradient (read under no_grad:
    it takes the sum too), and the group's other ranks' copies summing to r: each of the
    three ends with g0 + g1 + r. A key held once and without a group keeps its gradient;
    a DDP-wrapped part names its parameters under ``module.``."""
    a = _part(emb=_with_grad([1.0, 2.0]), solo=_with_grad([7.0, 7.0]))
    b = _part(module=_part(head=_with_grad([10.0, 20.0])))
    c = _part(ema=nn.Linear(1, 2, bias=False))
    remote = {"emb.weight": torch.tensor([[100.0], [200.0]])}
    fake = _FakeDist(0, 2, {}, remote)
    monkeypatch.setattr(tied, "dist", fake)
    grads = TiedGrads(
        names={
            "emb.weight": [(0, "emb.weight"), (1, "head.weight"), (2, "ema.weight")],
            "solo.weight": [(0, "solo.weight")],
        },
        groups={"emb.weight": "group01"},
    )
    fake.groups = grads.groups
    grads.sum_gradients([a, b, c])
    want = torch.tensor([[111.0], [222.0]])
    for p in (a.emb.weight, b.module.head.weight, c.ema.weight):
        assert torch.equal(p.grad, want)
    assert fake.reduced == [("emb.weight", "group01")]
    assert torch.equal(a.solo.weight.grad, torch.tensor([[7.0], [7.0]]))


def test_a_copy_may_be_named_by_any_of_its_paths():
    """A part holding one copy under two paths, named by the second: found all the same."""
    a = _part(emb=_with_grad([1.0, 2.0]))
    a.head = nn.Linear(1, 2, bias=False)
    a.head.weight = a.emb.weight
    b = _part(head=_with_grad([3.0, 5.0]))
    TiedGrads(names={"k": [(0, "head.weight"), (1, "head.weight")]}).sum_gradients([a, b])
    assert torch.equal(a.emb.weight.grad, torch.tensor([[4.0], [7.0]]))
    assert torch.equal(b.head.weight.grad, torch.tensor([[4.0], [7.0]]))


def test_no_tied_copies_touch_no_gradient():
    a = _part(emb=_with_grad([1.0, 2.0]))
    TiedGrads(names={}, groups={"emb.weight": object()}).sum_gradients([a])
    assert torch.equal(a.emb.weight.grad, torch.tensor([[1.0], [2.0]]))


def test_dtensor_copies_sum_their_local_gradients(monkeypatch):
    """Copies that are DTensors (a TP-replicated tied weight): their local gradients are
    summed (the stand-in all-reduce adds a plain tensor, as the process group does)."""
    mesh = init_device_mesh("cpu", (1,))
    parts = []
    for value in ([1.0, 2.0], [3.0, 4.0]):
        lin = nn.Linear(1, 2, bias=False)
        lin.weight = nn.Parameter(distribute_tensor(lin.weight.detach(), mesh, [Replicate()]))
        lin.weight.grad = distribute_tensor(torch.tensor(value).reshape(2, 1), mesh, [Replicate()])
        parts.append(_part(w=lin))
    fake = _FakeDist(0, 2, {}, {"k": torch.tensor([[10.0], [10.0]])})
    monkeypatch.setattr(tied, "dist", fake)
    grads = TiedGrads(names={"k": [(0, "w.weight"), (1, "w.weight")]}, groups={"k": "g"})
    fake.groups = grads.groups
    grads.sum_gradients(parts)
    for part in parts:
        assert isinstance(part.w.weight.grad, DTensor)
        assert torch.equal(part.w.weight.grad.to_local(), torch.tensor([[14.0], [16.0]]))


@pytest.mark.parametrize(
    "mesh, held, message",
    [
        (
            Mesh(pp=2, dp=1, tp=2, stage_tp=(1, 2)),
            {0: ["a.w", "b.w"], 1: ["b.w", "a.w"], 2: ["a.w", "b.w"]},
            "tied weight a.w sits on pipeline stages of TP degrees [1, 2]: their copies "
            "differ, so their gradients cannot be summed; plan again with one TP degree on "
            "the stages that share it",
        ),
        (
            Mesh(pp=2, dp=2, tp=1, stage_dp=(2, 1)),
            {0: ["a.w"], 1: ["a.w"], 2: ["a.w"]},
            "tied weight a.w sits on pipeline stages of DP degrees [1, 2]: their copies "
            "differ, so their gradients cannot be summed; plan again with one DP degree on "
            "the stages that share it",
        ),
        # stages 0 and 1 share TP 2; stage 2's degree differs, but it holds no copy
        (Mesh(pp=3, dp=1, tp=2, stage_tp=(2, 2, 1)), {0: ["a.w"], 2: ["a.w"], 4: []}, None),
    ],
)
def test_a_tie_across_stages_of_different_degrees_is_refused_by_name(
    monkeypatch, mesh, held, message
):
    """Each rank's held names as its all-gather entry; the rank asking holds a.w too."""
    rank = next(r for r, names in held.items() if "a.w" in names)
    everyone = {r: (tuple(mesh.coords(r)[1:]), sorted(names)) for r, names in held.items()}
    for r in range(mesh.size):
        everyone.setdefault(r, (tuple(mesh.coords(r)[1:]), []))
    monkeypatch.setattr(tied, "dist", _FakeDist(rank, mesh.size, everyone))
    part = _part(a=nn.Module(), b=nn.Module())
    for name in held[rank]:  # "a.w": part.a.w
        part.get_submodule(name[0]).w = nn.Parameter(torch.ones(1))
    names = {"a.w": ["a.w"], "b.w": ["b.w"]}
    if message is None:  # ranks 0 and 2: TP rank 0 of stages 0 and 1
        assert tied_grads(names, [part], mesh, {}).groups == {"a.w": "group02"}
        return
    with pytest.raises(UserInputError) as err:
        tied_grads(names, [part], mesh, {})
    assert str(err.value) == message


def test_every_replicas_group_is_made_past_coordinates_no_copy_holds(monkeypatch):
    """pp 3 of TP 1 x DP 2, TP 2 x DP 1, TP 1 x DP 2: the embedding tied between stages 0 and
    2 (the same degrees; stage 1 holds no copy). The other coordinates in order are (0, 0, 0),
    (0, 0, 1) (stage 1's second TP rank: no copy there) and (1, 0, 0): replica 1's group
    [1, 5] comes after a coordinate with no copy, and rank 1 joins it."""
    mesh = Mesh(pp=3, dp=2, tp=2, stage_tp=(1, 2, 1), stage_dp=(2, 1, 2))
    holds = {0: True, 1: True, 2: False, 3: False, 4: True, 5: True}
    everyone = {
        r: (tuple(mesh.coords(r)[1:]), ["emb.weight"] if held else []) for r, held in holds.items()
    }
    fake = _FakeDist(1, 6, everyone)
    monkeypatch.setattr(tied, "dist", fake)
    got = tied_grads(_names(), [_part(emb=nn.Linear(3, 2, bias=False))], mesh, {})
    assert fake.sent == (1, (1, 0, 0), ["emb.weight"])
    assert fake.made == [(0, 4), (1, 5)]
    assert got.groups == {"emb.weight": "group15"}
