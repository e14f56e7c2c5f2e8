"""The layout's rules hold: imports flow one way (the import-linter contracts in pyproject.toml,
docs/architecture.md), a torchrun worker reads a plan without loading the solver, and the code
is formatted and linted as ruff says."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_hold():
    from importlinter.cli import lint_imports

    assert lint_imports(config_filename=str(ROOT / "pyproject.toml")) == 0


@pytest.mark.parametrize("module", ["runtime.worker", "runtime.launch", "planner.schema"])
def test_the_runtime_reads_a_plan_without_the_solver(module):
    code = f"import {module}, sys; sys.exit(bool({{'cvxpy', 'highspy'}} & set(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_plan_schema_loads_without_torch():
    code = "import planner.schema, sys; sys.exit('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_ruff_is_clean():
    ruff = shutil.which("ruff")
    assert ruff, "ruff is a test dependency: pip install -e '.[test]'"
    for args in (["check", "."], ["format", "--check", "."]):
        proc = subprocess.run([ruff, *args], cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
