"""Which device a run trains on: shared by planning (``--run`` on the CPU plans for the CPU) and
the runtime (which starts its workers there). Kept apart from planner.flags so that reading
the flags never imports torch."""

from __future__ import annotations

from planner.errors import UserInputError


def choose_device(requested: str | None) -> str:
    """The device ``--device`` names, or CUDA when one is visible, else the CPU."""
    import torch

    if requested == "cuda" and not torch.cuda.is_available():
        raise UserInputError("--device cuda: no CUDA device is visible here; use --device cpu")
    return requested or ("cuda" if torch.cuda.is_available() else "cpu")
