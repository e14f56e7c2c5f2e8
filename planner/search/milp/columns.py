"""The MILPs' column layouts, each stated once as its variables in order.

A HiGHS model built from numpy rows addresses each variable by the column its block starts at.
The stage MILP (``rows.Layout``), its LP relaxation (``relaxation.Shape``) and the mixed-pool
MILP (``search.mixed.milp.MixedLayout``) each list their blocks and widths here once, instead
of chaining each offset from the one before by hand (three copies of one pattern, which a
block inserted in one place silently shifts)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import cached_property


class Columns(ABC):
    """Variables as blocks of columns in a fixed order. ``blocks()`` gives (name, width) in
    order; the attribute of a block's name is the column it starts at; ``columns`` is the
    total."""

    @abstractmethod
    def blocks(self) -> tuple[tuple[str, int], ...]:
        """(name, width) of each block of columns, in column order."""

    @cached_property
    def starts(self) -> dict[str, int]:
        out, at = {}, 0
        for name, width in self.blocks():
            out[name] = at
            at += width
        out["columns"] = at
        return out

    def __getattr__(self, name: str) -> int:
        if name.startswith("_") or name == "starts":
            raise AttributeError(name)
        try:
            return self.starts[name]
        except KeyError:
            raise AttributeError(name) from None
