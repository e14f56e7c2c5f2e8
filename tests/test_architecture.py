"""The layout's rules hold: imports flow one way (the import-linter contracts in pyproject.toml,
docs/architecture.md), a torchrun worker reads a plan without loading the solver, and the code
is formatted and linted as ruff says."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_hold():
    from importlinter.cli import lint_imports

    assert lint_imports(config_filename=str(ROOT / "pyproject.toml")) == 0


# Each contract, and an import planted where it must break it: the contracts mean what their
# names say only if such an import fails them (a contract that lists too few modules passes).
PLANTED = [
    ("planner-layers", "planner/vocab.py", "import planner.cli"),
    ("planner-layers", "planner/search/driver.py", "import planner.api"),
    ("runtime-reads-plans", "runtime/build.py", "import planner.search"),
    ("runtime-reads-plans", "runtime/train.py", "import cvxpy"),
    ("report-reads-plans", "planner/report/figures.py", "import planner.search"),
    ("calibration-alone", "planner/calibrate/fit.py", "import planner.search"),
    ("schema-light", "planner/schema/mesh.py", "import torch"),
    ("planner-without-runtime", "planner/api.py", "import runtime.build"),
    ("planner-without-runtime", "planner/resources/energy.py", "import runtime.build"),
    ("planner-without-runtime", "planner/cli.py", "import runtime.launch"),
    ("planner-without-runtime", "planner/vocab.py", "import meshplan.cli"),
    ("runtime-without-entry", "runtime/train.py", "import meshplan.cli"),
    ("no-sibling-cycles", "runtime/checkpoint.py", "import runtime.train"),
]


def _lint(root: Path, contract: str) -> subprocess.CompletedProcess:
    """``lint-imports`` of one contract over the tree at ``root`` (its copy of the packages)."""
    code = (
        "import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename='pyproject.toml', "
        f"limit_to_contracts=({contract!r},), no_cache=True))"
    )
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """A copy of the packages and pyproject.toml to plant imports in."""
    root = tmp_path_factory.mktemp("tree")
    for package in ("planner", "runtime", "meshplan"):
        shutil.copytree(
            ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


@pytest.mark.parametrize("contract, path, line", PLANTED)
def test_a_planted_import_breaks_its_contract(scratch, contract, path, line):
    target = scratch / path
    original = target.read_text()
    try:
        target.write_text(original + f"\n{line}  # planted by the test\n")
        proc = _lint(scratch, contract)
    finally:
        target.write_text(original)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 broken" in proc.stdout, proc.stdout


def test_the_scratch_copy_keeps_every_contract(scratch):
    """The planted runs fail for their import, not for the copy."""
    for contract in sorted({c for c, _, _ in PLANTED}):
        proc = _lint(scratch, contract)
        assert proc.returncode == 0, contract + proc.stdout + proc.stderr


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


def _long_functions() -> list[tuple[int, str, bool]]:
    """(lines, where, says why) of every library function over 80 lines."""
    import ast

    found = []
    for package in ("planner", "runtime", "meshplan"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > 80:
                        why = "long because" in (ast.get_docstring(node) or "").lower()
                        found.append((lines, f"{path.relative_to(ROOT)}:{node.lineno}", why))
    return found


def test_no_function_is_over_150_lines_and_each_over_80_says_why():
    """The style rule: a function over 80 lines says in its docstring why ("Long because
    ..."), and none is over 150."""
    found = _long_functions()
    assert found, "the walk found no function over 80 lines: it walks nothing"
    assert [w for n, w, _ in found if n > 150] == []
    assert [w for _, w, why in found if not why] == []
