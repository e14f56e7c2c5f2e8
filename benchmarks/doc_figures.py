"""Regenerate the README's example figures under docs/figures/ (plans the examples on H100s).

python benchmarks/doc_figures.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.atomic import write_bytes_atomic  # noqa: E402
from planner.report import REPORT_NAMES  # noqa: E402

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
    """Plan the README's examples and write their figures as docs/figures/<example>-<figure>.png."""
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


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.strip().splitlines()[0]).parse_args()
    for path in write_doc_figures(ROOT):
        print(path)
