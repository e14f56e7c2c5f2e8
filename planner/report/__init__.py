"""The plan report: five figures (PNG and SVG) and a self-contained report.html beside plan.json.

``write_report`` is what ``plan`` and ``plan show`` call; ``write_doc_figures`` regenerates the
example PNGs under docs/figures/ that the README shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from planner.atomic import write_bytes_atomic, write_text_atomic
from planner.errors import UserInputError

REPORT_NAMES = ("placement", "blocks", "memory", "timeline", "candidates")


def report_files(out_dir: Path) -> list[Path]:
    """The only files the report ever writes: fixed names, so a user's own file is never hit."""
    files = [out_dir / f"{name}.{ext}" for name in REPORT_NAMES for ext in ("png", "svg")]
    return files + [out_dir / "report.html"]


def write_report(plan: dict[str, Any], out_dir: Path, command: str) -> list[Path]:
    """Write the five figures as PNG and SVG and report.html into ``out_dir``; each file
    atomically (a crash leaves the previous report intact). Returns the paths written."""
    from planner.report.figures import render_all
    from planner.report.html import render_html

    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserInputError(f"cannot create output directory {out_dir}: {exc.strerror}") from exc
    rendered = render_all(plan)
    written: list[Path] = []
    try:
        for name, formats in rendered.items():
            for ext, data in formats.items():
                path = out_dir / f"{name}.{ext}"
                write_bytes_atomic(path, data)
                written.append(path)
        page = render_html(plan, {n: f["png"] for n, f in rendered.items()}, command)
        path = out_dir / "report.html"
        write_text_atomic(path, page)
        written.append(path)
    except OSError as exc:
        raise UserInputError(f"cannot write the report into {out_dir}: {exc.strerror}") from exc
    return written


# The examples the README shows: (file stem, model file, gpus, model args, global batch, pins).
DOC_EXAMPLES = (
    ("gpt-1.3b-8xh100", "examples/gpt.py", 8, {"size": "1.3b"}, 64, {}),
    (
        "gpt3-175b-1024xh100",
        "examples/gpt.py",
        1024,
        {"size": "gpt3-175b"},
        1536,
        {
            "tp": 8,
            "pp": 8,
            "micro_batch_size": 1,
            "schedule": "interleaved_1f1b",
            "virtual_stages": 2,
        },
    ),
)


def write_doc_figures(root: Path, names: tuple[str, ...] = REPORT_NAMES) -> list[Path]:
    """Plan the README's examples and write their figures as docs/figures/<example>-<figure>.png.

    Run from the repository root: ``python -c "from pathlib import Path; from planner.report
    import write_doc_figures; write_doc_figures(Path('.'))"``."""
    import matplotlib.pyplot as plt

    from planner.api import plan as make_plan
    from planner.report.figures import FIGURES, render
    from planner.search import Pins

    out = Path(root) / "docs" / "figures"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, model, gpus, args, gbs, pins in DOC_EXAMPLES:
        doc = make_plan(
            Path(root) / model,
            gpus,
            model_args=args,
            profile="h100-sxm",
            global_batch_size=gbs,
            pins=Pins(**pins),
        ).plan
        for name in names:
            fig = FIGURES[name](doc)
            path = out / f"{stem}-{name}.png"
            write_bytes_atomic(path, render(fig, "png"))
            plt.close(fig)
            written.append(path)
    return written
