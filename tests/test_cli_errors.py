"""Bad input gets one line on stderr naming the problem, and exit status 2."""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_bad_input import FORWARD_RAISES, SHAPE_MISMATCH

from meshplan.cli import main

CASES = {
    "missing_file": (None, "does not exist"),
    "not_python": ("this is not python at all {{{", "syntax error"),
    "syntax_error": ("def build_model(:\n    pass\n", "syntax error at line 1"),
    "no_build_model": ("def make_batch(b, step=0):\n    return 1, 2\n", "build_model"),
    "build_raises": (
        "def build_model():\n    raise ValueError('bad size')\n"
        "def make_batch(b, step=0):\n    return 1, 2\n",
        "bad size",
    ),
    "make_batch_wrong_type": (
        "import torch\ndef build_model():\n    return torch.nn.Linear(2, 2)\n"
        "def make_batch(b, step=0):\n    return 'tokens'\n",
        "make_batch must return (inputs, targets)",
    ),
    "forward_raises": (FORWARD_RAISES, "boom in forward"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_model_file_is_one_line_exit_2(case, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "cache"))
    source, needle = CASES[case]
    path = tmp_path / f"{case}.py"
    if source is not None:
        path.write_text(source)
    code = main([str(path), "--graph"])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err
    assert "Traceback" not in err


def test_unknown_model_arg_names_the_argument(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    code = main(["examples/gpt.py", "--graph", "--model-arg", "colour=red"])
    err = capsys.readouterr().err
    assert code == 2 and "colour" in err and len(err.strip().splitlines()) == 1


@pytest.mark.distributed
def test_real_process_exit_status_and_stderr(tmp_path):
    env_cache = {"MESHPLAN_CACHE": str(tmp_path)}
    import os

    proc = subprocess.run(
        [sys.executable, "-m", "meshplan", str(tmp_path / "nope.py"), "--graph"],
        capture_output=True,
        text=True,
        env={**os.environ, **env_cache},
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "does not exist" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.distributed
def test_a_failing_forward_prints_no_torch_log_lines(tmp_path):
    """torch's fake-tensor layer logs the whole internal traceback of a failed shape check at
    ERROR level; the user sees only meshplan's one line."""
    import os

    model = tmp_path / "m.py"
    model.write_text(SHAPE_MISMATCH)
    proc = subprocess.run(
        [sys.executable, "-m", "meshplan", str(model), "--gpus", "2", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "MESHPLAN_CACHE": str(tmp_path / "cache")},
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("note:")]
    assert len(lines) == 1 and lines[0].startswith("plan: error:"), proc.stderr


@pytest.mark.distributed
def test_planning_a_moe_model_prints_no_torch_log_lines(tmp_path):
    """The eager probe runs a block's code under fake tensors, where transformers' grouped
    experts call torch's grouped product, whose meta kernel takes bf16 only: in fp32 each
    failure was logged by torch at ERROR with its internal traceback (44 lines for Qwen2-MoE),
    though the plan succeeds. The probe now runs with torch's loggers silenced."""
    import os

    proc = subprocess.run(
        [sys.executable, "-m", "meshplan", "tests/models/qwen2_moe.py", "--gpus", "2",
         "--tp", "2", "--tp-variant", "sharded", "--profile", "cpu", "--dtype", "fp32",
         "--out", str(tmp_path), "--quiet"],
        capture_output=True,
        text=True,
        env={**os.environ, "MESHPLAN_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "", proc.stderr


def test_running_on_the_cpu_plans_for_the_cpu():
    """--run on the CPU without --profile plans with the cpu profile (planning for the GPU
    default would predict microseconds and a memory the run does not have)."""
    import argparse

    from planner.cli import _run_profile_default

    args = argparse.Namespace(run=True, profile=None, device="cpu")
    notes = _run_profile_default(args)
    assert args.profile == "cpu" and notes and "cpu" in notes[0]
    kept = argparse.Namespace(run=True, profile="h100-sxm", device="cpu")
    assert _run_profile_default(kept) == [] and kept.profile == "h100-sxm"
    planning = argparse.Namespace(run=False, profile=None, device=None)
    assert _run_profile_default(planning) == [] and planning.profile is None


@pytest.mark.parametrize(
    "text, value",
    [("1000000", 10**6), ("1e9", 10**9), ("15T", 15 * 10**12), ("1.5B", 15 * 10**8),
     ("2_048", 2048), ("2,048", 2048)],
)  # fmt: skip
def test_a_token_budget_is_read_as_people_write_large_counts(text, value):
    from planner.flags import token_count

    assert token_count(text) == value


@pytest.mark.parametrize(
    "flag, text, expected",
    [("--deadline", "72", 72.0), ("--deadline", "30d", 720.0), ("--deadline", "2w", 336.0),
     ("--budget", "$1.5M", 1.5e6), ("--budget", "2,000,000", 2e6)],
)  # fmt: skip
def test_deadlines_and_budgets_take_units(flag, text, expected):
    from planner.flags import dollars, hours

    assert {"--deadline": hours, "--budget": dollars}[flag](text) == expected


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tokens", "1.5"], "argument --tokens: expected a positive whole number"),
        (["--tokens", "-5"], "argument --tokens: expected a positive whole number"),
        (["--tokens", "1e9", "--deadline", "3parsecs"], "argument --deadline: expected a duration"),
        (["--tokens", "1e9", "--deadline", "-3"], "argument --deadline: expected a duration"),
        (["--tokens", "1e9", "--budget", "free"], "argument --budget: expected a positive sum"),
        ([], "give the training budget: --tokens N or --steps N"),
        (["--tokens", "1e9", "--steps", "10"], "give the training budget once"),
    ],
)
def test_a_bad_budget_or_deadline_is_one_line_exit_2(args, message, capsys):
    code = main(["examples/llama.py", "--resources", "profiles/pools/cloud.toml", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and message in err
