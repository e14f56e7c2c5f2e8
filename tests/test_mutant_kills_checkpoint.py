"""Tests written for mutmut's generated mutants of runtime/checkpoint.py (distributed
checkpoints a restarted job resumes from; benchmarks/generated_mutants.py). One process, a gloo
group of one rank held in this process (a HashStore: no port, no launch), so a mutant dies in
seconds; tests/test_resume_step.py runs the same through the worker (a resume after step 2
trains step 3 once). The ``Built`` here is what the module reads of one: ``parts``,
``optimizers``, ``aliases``, ``coords`` and ``cp_mesh``. docs/mutation.md names the mutants
each test kills."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from oracle import checkpoint_model_state
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import _StridedShard

from runtime.checkpoint import (
    _zero1_key,
    checkpoint_root,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)

pytestmark = pytest.mark.usefixtures("gloo_one_rank")  # conftest: a one-rank gloo group


def _built(parts, optimizers, aliases=None, coords=(0, 0, 0)):
    return SimpleNamespace(
        parts=parts, optimizers=optimizers, aliases=aliases or {}, coords=coords, cp_mesh=None
    )


def _part(name: str, linear: torch.nn.Module) -> torch.nn.Module:
    """A stage module holding ``linear`` under ``name`` (stage parts' paths differ)."""
    part = torch.nn.Module()
    setattr(part, name, linear)
    return part


def _trained(seed: int, steps: int, zero1: bool = False):
    """Two parts (a 4->3 and a 3->2 linear) with an AdamW each (the first's a ZeRO-1 one with
    ``zero1``), trained ``steps`` steps; the optimizers are listed in the opposite order of
    the parts."""
    torch.manual_seed(seed)
    parts = [_part("a", torch.nn.Linear(4, 3)), _part("b", torch.nn.Linear(3, 2))]
    if zero1:  # the first part's ZeRO-1 beside a plain AdamW (as experts keep under ZeRO-1)
        opts = [
            torch.optim.AdamW(parts[1].parameters(), lr=0.1),
            ZeroRedundancyOptimizer(
                parts[0].parameters(), optimizer_class=torch.optim.AdamW, lr=0.1
            ),
        ]
    else:
        opts = [torch.optim.AdamW(p.parameters(), lr=0.1) for p in reversed(parts)]
    for k in range(steps):
        x = torch.arange(8.0).reshape(2, 4) / (k + 1)
        parts[1].b(parts[0].a(x)).square().sum().backward()
        for opt in opts:
            opt.step()
            opt.zero_grad()
    return parts, opts


def _inner(opt):
    return opt.optim if isinstance(opt, ZeroRedundancyOptimizer) else opt


def _assert_same(parts, opts, want_parts, want_opts):
    for got, want in zip(parts, want_parts, strict=True):
        for (name, p), q in zip(got.named_parameters(), want.parameters(), strict=True):
            assert torch.equal(p, q), name
            assert p.grad is None, name
    for got, want in zip(opts, want_opts, strict=True):
        g, w = _inner(got), _inner(want)
        assert [grp["lr"] for grp in g.param_groups] == [grp["lr"] for grp in w.param_groups]
        for p, q in zip(
            (p for grp in g.param_groups for p in grp["params"]),
            (q for grp in w.param_groups for q in grp["params"]),
            strict=True,
        ):
            sp, sq = g.state[p], w.state[q]
            assert set(sp) == {"step", "exp_avg", "exp_avg_sq"}
            for key in sp:
                assert torch.equal(torch.as_tensor(sp[key]), torch.as_tensor(sq[key])), key


@pytest.mark.parametrize("zero1", [False, True], ids=["adamw", "zero1"])
def test_a_checkpoint_of_step_3_holds_step_3_and_loads_back_exactly(tmp_path, zero1):
    """Saved after 3 steps: the directory is step_000003 (no .tmp left), ``latest_checkpoint``
    finds it at 3, and loading into two parts as a restarted process builds them (another
    seed, no step: ZeRO-1's optimizer holds no state yet) gives back step 3 and the trained
    parameters and AdamW states bit for bit, the learning rates untouched and no gradient
    left. A checkpoint that recorded step 2 (or the step it was loaded at) would train step 3
    twice on resume. The run directory does not exist yet."""
    run = tmp_path / "new" / "run"
    parts, opts = _trained(0, 3, zero1)
    path = save_checkpoint(_built(parts, opts), run, 3)
    assert path == run / "checkpoints" / "step_000003" and path.is_dir()
    assert [p.name for p in checkpoint_root(run).iterdir()] == ["step_000003"]
    assert latest_checkpoint(run) == (3, path)

    fresh, fresh_opts = _trained(1, 0, zero1)
    assert load_checkpoint(_built(fresh, fresh_opts), path) == 3
    _assert_same(fresh, fresh_opts, parts, opts)


def test_a_stale_tmp_and_an_older_copy_of_the_step_are_replaced(tmp_path):
    """A ``.tmp`` left by a run killed mid-save, and a complete directory of the same step
    (a run restarted from an earlier checkpoint writes it again), give way to the new one."""
    root = checkpoint_root(tmp_path)
    (root / "step_000002.tmp").mkdir(parents=True)
    (root / "step_000002.tmp" / "stale").write_text("x")
    (root / "step_000002").mkdir()
    (root / "step_000002" / "old").write_text("x")
    parts, opts = _trained(0, 2)
    path = save_checkpoint(_built(parts, opts), tmp_path, 2)
    assert sorted(p.name for p in root.iterdir()) == ["step_000002"]
    assert not (path / "stale").exists() and not (path / "old").exists()
    got = checkpoint_model_state(path)
    assert set(got) == {"a.weight", "a.bias", "b.weight", "b.bias"}
    assert torch.equal(got["b.weight"], parts[1].b.weight)


def test_every_name_of_a_tied_parameter_is_written(tmp_path):
    """``aliases`` maps a parameter's first name to its others; the checkpoint holds each name,
    whichever one the part registers (the first, or only a later one)."""
    model = torch.nn.Module()
    model.enc = torch.nn.Linear(2, 2)
    parts = [model]
    opts = [torch.optim.AdamW(model.parameters(), lr=0.1)]
    aliases = {"enc.weight": ["dec.weight", "head.weight"], "gone.bias": ["enc.bias", "out.b"]}
    path = save_checkpoint(_built(parts, opts, aliases), tmp_path, 1)
    got = checkpoint_model_state(path)
    assert set(got) == {"enc.weight", "dec.weight", "head.weight", "enc.bias", "gone.bias", "out.b"}
    for name in ("enc.weight", "dec.weight", "head.weight"):
        assert torch.equal(got[name], model.enc.weight)
    for name in ("enc.bias", "gone.bias", "out.b"):
        assert torch.equal(got[name], model.enc.bias)


def test_an_alias_whose_names_the_parts_lack_is_not_written(tmp_path):
    """Another stage's tied parameter: none of its names is in this rank's parts."""
    parts, opts = _trained(0, 1)
    path = save_checkpoint(_built(parts[:1], opts[1:], {"x.w": ["y.w"]}), tmp_path, 1)
    assert set(checkpoint_model_state(path)) == {"a.weight", "a.bias"}


def test_latest_checkpoint_takes_the_highest_complete_step(tmp_path):
    """Complete ``step_NNNNNN`` directories only: not a ``.tmp``, a file, fewer than six digits
    or another name; none at all (no checkpoints directory, or an empty one) is None."""
    assert latest_checkpoint(tmp_path) is None
    root = checkpoint_root(tmp_path)
    assert root == tmp_path / "checkpoints"
    root.mkdir()
    assert latest_checkpoint(tmp_path) is None
    for name in ("step_000009", "step_000010", "step_0000100"):
        (root / name).mkdir()
    for name in ("step_000200.tmp", "step_00300", "xstep_000400", "step_000500x"):
        (root / name).mkdir()
    (root / "step_000600").write_text("a file")
    assert latest_checkpoint(tmp_path) == (100, root / "step_0000100")


def test_a_zero1_shard_is_keyed_by_its_mesh_coordinates():
    """ZeRO-1 keeps each rank's shard under its pp, dp (cp) and tp coordinates and the index
    of the optimizer, so ranks and parts never collide."""

    class Cp:
        def get_local_rank(self):
            return 5

    built = _built([], [], coords=(1, 2, 3))
    assert _zero1_key(built, 4) == "pp1_dp2_tp3_part4"
    built.cp_mesh = Cp()
    assert _zero1_key(built, 0) == "pp1_dp2_cp5_tp3_part0"


def test_a_weight_sharded_by_blocks_is_saved_contiguous_and_loaded_back_by_blocks(tmp_path):
    """A fused projection's weight under TP is a DTensor sharded by blocks (``_StridedShard``);
    the checkpoint takes it contiguous (``contiguous_copies``) and loading gives it back in
    its blocks' placement, with its AdamW state (here on a mesh of one rank)."""
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))

    def part(seed: int, steps: int):
        torch.manual_seed(seed)
        model = _part("qkv", torch.nn.Linear(3, 4, bias=False))
        local = model.qkv.weight.detach()
        blocks = DTensor.from_local(local, mesh, [_StridedShard(0, split_factor=2)])
        model.qkv.weight = torch.nn.Parameter(blocks)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        for _ in range(steps):
            model.qkv.weight.grad = DTensor.from_local(
                torch.arange(12.0).reshape(4, 3), mesh, [_StridedShard(0, split_factor=2)]
            )
            opt.step()
        return model, opt

    model, opt = part(0, 2)
    path = save_checkpoint(_built([model], [opt]), tmp_path, 2)
    fresh, fresh_opt = part(1, 0)
    assert load_checkpoint(_built([fresh], [fresh_opt]), path) == 2
    assert fresh.qkv.weight.placements == (_StridedShard(0, split_factor=2),)
    assert torch.equal(fresh.qkv.weight.to_local(), model.qkv.weight.to_local())
    got = fresh_opt.state[fresh.qkv.weight]["exp_avg"]
    assert torch.equal(got.to_local(), opt.state[model.qkv.weight]["exp_avg"].to_local())
