"""The documentation holds what it promises: a README that fits on a screen with no session
words, a CLI reference that says what the parsers accept today, and a CI script that runs the
README's own test command."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_cli_reference_is_the_parsers_own():
    from planner.docs_cli import render

    committed = (ROOT / "docs" / "cli.md").read_text()
    assert render() == committed, "docs/cli.md is stale: python -m planner.docs_cli > docs/cli.md"


def test_the_cli_reference_names_every_flag():
    """Independent of the renderer: every option string the parsers define is on the page."""
    from planner.calibrate.command import build_parser as calibrate
    from planner.cli import build_parser, build_run_parser
    from planner.report.show import build_parser as show

    page = (ROOT / "docs" / "cli.md").read_text()
    for parser in (build_parser(), build_run_parser(), show(), calibrate()):
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in page or f", {flag}" in page, flag


def test_the_readme_fits_on_a_screen_and_says_no_session_words():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for page in _pages():
        text = page.read_text()
        hits = re.findall(r"(?i)stop [0-9]+", text)
        assert not hits, f"{page.name}: {hits[:3]}"


def test_ci_runs_the_readme_test_command_exactly():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    install_and_plan, install_and_test = block[0], block[1]
    assert install_and_plan.startswith("pip install torch==2.13.0 && pip install -e . && plan ")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert install_and_test in ci
    assert "mkdocs build --strict" in (ROOT / ".ci" / "run").read_text()


def test_every_page_is_in_the_site_navigation():
    """mkdocs warns (and --strict fails) on a page left out of the nav; this says which first."""
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in sorted((ROOT / "docs").rglob("*.md")):
        rel = page.relative_to(ROOT / "docs").as_posix()
        assert f": {rel}" in nav, f"docs/{rel} is not in mkdocs.yml's nav"
