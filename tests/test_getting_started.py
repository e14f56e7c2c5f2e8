"""Every command docs/getting-started.md shows runs as shown, in a fresh directory holding only
the examples and profiles (and the model file the page writes out), and exits 0.

The page is read, not copied: a command edited on the page is the command tested. ``pip``
lines are the install, which the suite itself runs under. Planning ~2 minutes, the two runs
launch torchrun: the whole page is in the long runs (``-m long``, as CI runs it)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "getting-started.md"


def page_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block, in page order."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if lines[i].startswith("```") and len(lines[i]) > 3:
            lang, body = lines[i][3:].strip(), []
            i += 1
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            blocks.append((lang, "\n".join(body)))
        i += 1
    return blocks


def page_commands(text: str) -> list[str]:
    """The shell commands of the page's bash blocks, comments dropped, installs left out."""
    commands = []
    for lang, body in page_blocks(text):
        if lang != "bash":
            continue
        for line in body.splitlines():
            command = line.split("  #", 1)[0].strip()
            if command and not command.startswith("pip "):
                commands.append(command)
    return commands


def page_files(text: str) -> dict[str, str]:
    """Python blocks whose first line is ``# NAME.py``: the files the page asks you to write."""
    files = {}
    for lang, body in page_blocks(text):
        first = body.splitlines()[0] if body else ""
        if lang == "python" and first.startswith("# ") and first.endswith(".py"):
            files[first[2:]] = body + "\n"
    return files


def run_command(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``plan ...`` as ``python -m meshplan ...`` (this checkout's code), with ``> FILE``."""
    args = shlex.split(command)
    stdout_to = None
    if ">" in args:
        at = args.index(">")
        args, stdout_to = args[:at], args[at + 1]
    assert args[0] == "plan", f"the page shows a command the test cannot run: {command}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    proc = subprocess.run(
        [sys.executable, "-m", "meshplan", *args[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if stdout_to:
        (cwd / stdout_to).write_text(proc.stdout)
    return proc


def test_the_page_shows_what_this_test_runs():
    commands = page_commands(PAGE.read_text())
    assert any("--graph" in c for c in commands)
    assert any("--run" in c for c in commands) and any(c.startswith("plan run") for c in commands)
    assert any("--resources" in c for c in commands)
    assert "mymodel.py" in page_files(PAGE.read_text())


@pytest.mark.long
@pytest.mark.distributed
def test_every_getting_started_command_runs(tmp_path):
    text = PAGE.read_text()
    for name in ("examples", "profiles"):
        (tmp_path / name).symlink_to(ROOT / name)
    for name, body in page_files(text).items():
        (tmp_path / name).write_text(body)
    for command in page_commands(text):
        proc = run_command(command, tmp_path)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    assert (tmp_path / "blocks.json").read_text().lstrip().startswith("{")
    for out in ("tiny-h100", "tiny-pp2", "tiny-cpu", "mymodel"):
        assert (tmp_path / "reports" / out / "plan.json").is_file(), out
    assert (tmp_path / "reports" / "tiny-cpu" / "metrics.jsonl").is_file()
