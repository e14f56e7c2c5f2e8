"""Every bad input ends as one line on stderr naming the problem, exit status 2 (3 when a valid
request has no feasible plan), and leaves the output directory as it was: no half-written file,
and an earlier good output untouched."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from meshplan.cli import main

ROOT = Path(__file__).resolve().parent.parent
GPT = str(ROOT / "examples" / "gpt.py")
TINY = [GPT, "--model-arg", "size=tiny"]

BUILD_RAISES = """
def build_model():
    raise ValueError("bad size")
def make_batch(b, step=0):
    return 1, 2
"""
WRONG_BATCH = """
import torch
def build_model():
    return torch.nn.Linear(2, 2)
def make_batch(b, step=0):
    return "tokens"
"""
BATCH_RAISES = """
import torch
def build_model():
    return torch.nn.Linear(2, 2)
def make_batch(b, step=0):
    raise KeyError("no such dataset")
"""
ONE_BLOCK = """
import torch
def build_model():
    return torch.nn.Linear(8, 8)
def make_batch(b, step=0):
    return torch.randn(b, 8), torch.randn(b, 8)
"""
NO_PARAMETERS = """
import torch
class M(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)
def build_model():
    return M()
def make_batch(b, step=0):
    return torch.randn(b, 8), torch.zeros(b, dtype=torch.long)
"""
SHAPE_MISMATCH = """
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(8, 8)
    def forward(self, x):
        return self.l(x) @ torch.ones(7, 3)
def build_model():
    return M()
def make_batch(b, step=0):
    return torch.randn(b, 8), torch.zeros(b, dtype=torch.long)
"""
FORWARD_RAISES = """
import torch
from torch import nn
class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))
    def forward(self, x):
        raise RuntimeError("boom in forward")
def build_model():
    return M()
def make_batch(b, step=0):
    return torch.ones(b, 4), torch.zeros(b, dtype=torch.long)
"""
UNTRACEABLE = """
import torch
from torch import nn
class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
    def forward(self, x):
        return self.lin(torch.from_numpy(x.numpy()))
def build_model():
    return M()
def make_batch(b, step=0):
    return torch.ones(b, 4), torch.zeros(b, dtype=torch.long)
"""
BAD_TRAINING = """
import torch
TRAINING = {"dtype": "fp8"}
def build_model():
    return torch.nn.Linear(2, 2)
def make_batch(b, step=0):
    return torch.ones(b, 2), torch.ones(b, 2)
"""


def _profile(tmp: Path, name: str, pattern: str, replacement: str) -> str:
    """The shipped cpu profile with exactly one line edited (the edit must apply)."""
    text = (ROOT / "profiles" / "cpu.toml").read_text()
    text, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
    assert count == 1, pattern
    path = tmp / name
    path.write_text(text)
    return str(path)


SIZED_BY_VALUES = """
import torch
from torch import nn
class Counted(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    def forward(self, x):
        n = int((x.sum(-1) > 0).sum().item())
        return self.inner(x[:n]).sum() + self.inner(x).sum()
def build_model():
    return Counted()
def make_batch(batch_size, step=0):
    g = torch.Generator().manual_seed(step)
    return (torch.randn(batch_size, 8, generator=g),), torch.zeros(())
def loss_fn(out, target):
    return out
"""


def _model(tmp: Path, name: str, source: str) -> str:
    path = tmp / name
    path.write_text(source)
    return str(path)


# case -> (argv builder, expected exit status, words the message must contain)
CASES = {
    "file_missing": (lambda t: [str(t / "nope.py"), "--gpus", "2"], 2, "does not exist"),
    "file_is_directory": (lambda t: [str(ROOT / "examples"), "--gpus", "2"], 2, "not a Python"),
    "not_python": (
        lambda t: [_model(t, "m.py", "this is not python {{{"), "--gpus", "2"],
        2,
        "syntax error",
    ),
    "syntax_error": (
        lambda t: [_model(t, "m.py", "def build_model(:\n  pass\n"), "--gpus", "2"],
        2,
        "syntax error at line 1",
    ),
    "no_build_model": (
        lambda t: [_model(t, "m.py", "def make_batch(b, step=0):\n  return 1, 2\n"), "--gpus", "2"],
        2,
        "build_model",
    ),
    "build_model_raises": (
        lambda t: [_model(t, "m.py", BUILD_RAISES), "--gpus", "2"],
        2,
        "bad size",
    ),
    "make_batch_wrong_type": (
        lambda t: [_model(t, "m.py", WRONG_BATCH), "--gpus", "2"],
        2,
        "make_batch must return (inputs, targets)",
    ),
    "make_batch_raises": (
        lambda t: [_model(t, "m.py", BATCH_RAISES), "--gpus", "2"],
        2,
        "no such dataset",
    ),
    "forward_raises": (lambda t: [_model(t, "m.py", FORWARD_RAISES), "--gpus", "2"], 2, "boom"),
    "no_parameters": (
        lambda t: [_model(t, "m.py", NO_PARAMETERS), "--gpus", "2"],
        2,
        "no trainable parameters",
    ),
    "shape_mismatch": (
        lambda t: [_model(t, "m.py", SHAPE_MISMATCH), "--gpus", "2"],
        2,
        "same reduction dim",
    ),
    "untraceable": (
        lambda t: [_model(t, "m.py", UNTRACEABLE), "--gpus", "2"],
        2,
        "cannot trace the model",
    ),
    "bad_training_dtype": (lambda t: [_model(t, "m.py", BAD_TRAINING), "--gpus", "2"], 2, "fp8"),
    "gpus_zero": (lambda t: [*TINY, "--gpus", "0"], 2, "--gpus: expected a positive integer"),
    "gpus_negative": (lambda t: [*TINY, "--gpus", "-1"], 2, "--gpus: expected a positive"),
    "gpus_word": (lambda t: [*TINY, "--gpus", "eight"], 2, "'eight'"),
    "gpus_missing": (lambda t: [*TINY], 2, "--gpus N"),
    "nodes_cannot_hold": (
        lambda t: [*TINY, "--gpus", "9", "--nodes", "1", "--gpus-per-node", "8"],
        2,
        "--gpus 9",
    ),
    "unknown_profile": (lambda t: [*TINY, "--gpus", "2", "--profile", "nosuch"], 2, "'nosuch'"),
    "profile_missing_field": (
        lambda t: [
            *TINY,
            "--gpus",
            "2",
            "--profile",
            _profile(t, "p.toml", r"^matmul_efficiency = .*\n", ""),
        ],
        2,
        "matmul_efficiency",
    ),
    "profile_negative_bandwidth": (
        lambda t: [
            *TINY,
            "--gpus",
            "2",
            "--profile",
            _profile(
                t,
                "p.toml",
                r"^intra_node_bandwidth_bytes_per_s = \S+",
                "intra_node_bandwidth_bytes_per_s = -2e9",
            ),
        ],
        2,
        "intra_node_bandwidth_bytes_per_s",
    ),
    "profile_not_toml": (
        lambda t: [*TINY, "--gpus", "2", "--profile", _model(t, "p.toml", "[[[ nope")],
        2,
        "p.toml",
    ),
    "tp_not_dividing_heads": (lambda t: [*TINY, "--gpus", "6", "--tp", "3"], 2, "--tp 3"),
    "tp_not_dividing_gpus": (lambda t: [*TINY, "--gpus", "4", "--tp", "3"], 2, "--tp 3"),
    "mesh_product_mismatch": (
        lambda t: [*TINY, "--gpus", "4", "--tp", "2", "--pp", "2", "--dp", "2"],
        2,
        "= 8 devices",
    ),
    "batch_not_divisible_by_dp": (
        lambda t: [*TINY, "--gpus", "2", "--dp", "2", "--global-batch-size", "7"],
        2,
        "global batch 7",
    ),
    "micro_batch_not_dividing": (
        lambda t: [*TINY, "--gpus", "2", "--dp", "2", "--micro-batch-size", "3"],
        2,
        "--micro-batch-size 3",
    ),
    # JetMoE's experts split the tokens by counts read with .item(): torch.export leaves
    # sizes it cannot count (a raw GuardOnDataDependentSymNode from the op counter, once) and
    # the meta fallback cannot read values
    "sized_by_values": (
        lambda t: [_model(t, "m.py", SIZED_BY_VALUES), "--gpus", "2", "--profile", "cpu"],
        2,
        "decides what to do from tensor values",
    ),
    "pp_beyond_blocks": (
        lambda t: [_model(t, "one.py", ONE_BLOCK), "--gpus", "2", "--pp", "2"],
        2,
        "pin --pp 1 or less",
    ),
    "memory_fraction_out_of_range": (
        lambda t: [*TINY, "--gpus", "2", "--memory-fraction", "1.5"],
        2,
        "--memory-fraction",
    ),
    "model_arg_not_key_value": (
        lambda t: [GPT, "--model-arg", "tiny", "--gpus", "2"],
        2,
        "KEY=VALUE",
    ),
    "model_arg_unknown": (lambda t: [GPT, "--model-arg", "colour=red", "--gpus", "2"], 2, "colour"),
    "unknown_flag": (lambda t: [*TINY, "--gpus", "2", "--turbo"], 2, "--turbo"),
    "out_not_writable": (
        lambda t: [*TINY, "--gpus", "2", "--out", str(_model(t, "afile", "x")) + "/sub"],
        2,
        "cannot create output directory",
    ),
    "infeasible_pinned_layout_names_the_pins": (
        lambda t: [
            GPT,
            "--model-arg",
            "size=1.3b",
            "--gpus",
            "2",
            "--profile",
            "v100-16g",
            "--tp",
            "1",
            "--pp",
            "1",
            "--dp",
            "2",
            "--zero",
            "0",
            "--offload",
            "none",
            "--recompute",
            "full",
        ],
        3,
        "a larger --pp or --tp",
    ),  # fmt: skip
    "infeasible_exit_3": (
        lambda t: [
            GPT,
            "--model-arg",
            "size=1.3b",
            "--gpus",
            "1",
            "--profile",
            "v100-16g",
            "--offload",
            "none",
            "--recompute",
            "full",
        ],
        3,
        "GiB",
    ),
}


# The cases run without the report's worker (--no-report: each worker is a second interpreter
# importing matplotlib, about 1 CPU-s), but for these, which keep it: an error before the
# search, one in the model's code, and an infeasible request (tests/test_report_worker.py's
# test_an_infeasible_request_ends_the_worker checks the same with the MLP).
WITH_WORKER = {"unknown_profile", "forward_raises", "infeasible_exit_3"}


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_and_changes_nothing(case, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "cache"))
    build, status, needle = CASES[case]
    argv = build(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "plan.json").write_text('{"an": "earlier good plan"}\n')
    before = _snapshot(out)
    if "--out" not in argv:
        argv = [*argv, "--out", str(out)]
    if case not in WITH_WORKER:
        argv = [*argv, "--no-report"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == status, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("plan: error:")
    assert needle in lines[0], lines[0]
    assert "Traceback" not in err
    assert _snapshot(out) == before  # no temporary, partial or replaced file


def test_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "cache"))
    code = main([_model(tmp_path, "m.py", BUILD_RAISES), "--gpus", "2", "--debug"])
    assert code == 2
    assert "Traceback" in capsys.readouterr().err


def test_a_good_run_replaces_the_plan_atomically(tmp_path, capsys, monkeypatch):
    """The earlier output is replaced only by a complete new file, nothing else is left."""
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    assert main([*TINY, "--gpus", "2", "--profile", "cpu", "--out", str(out), "--quiet"]) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["cluster"]["gpus"] == 2
    leftovers = [p.name for p in out.iterdir() if p.name.startswith(".") or p.suffix == ".tmp"]
    assert leftovers == []
    shutil.rmtree(out)


def test_a_model_just_over_a_small_device_says_by_how_much(tmp_path):
    """The no-fit message gives sizes in a unit that shows them: a tiny GPT on a 260 MiB
    device misses by about 2 MiB, not "0.0 GiB over the 0.3 GiB usable"."""
    from runs import cpu_profile

    from planner.api import plan
    from planner.errors import InfeasibleError
    from planner.search import Pins

    root = Path(__file__).resolve().parent.parent
    small = cpu_profile(tmp_path, "cpu-small", capacity_bytes=260 * 2**20)
    args = {"size": "tiny", "layers": 4, "hidden": 256, "seq_len": 128}
    with pytest.raises(InfeasibleError) as err:
        plan(
            root / "examples" / "gpt.py", 1, profile=small,
            model_args=args, global_batch_size=8, dtype="fp32", optimizer="sgd",
            pins=Pins(offload="none"),
        )  # fmt: skip
    over = re.search(r"\(([\d.]+) MiB over the 260\.0 MiB usable\)", str(err.value))
    assert over and float(over.group(1)) > 0, str(err.value)
