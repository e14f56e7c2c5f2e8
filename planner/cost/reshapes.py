"""The eager probe's recorder (``planner.cost.eager_probe``): a dispatch mode that sees every
reshape a module's own code runs on the meta device. Apart, so the probe's verdict cache reads
without importing torch."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

RESHAPE_OPS = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"}


class Reshapes(TorchDispatchMode):
    """Records every reshape (op, input shape, output shape, the column-parallel modules its
    input derives from). Provenance flows through every op: an output derives from whatever
    its inputs derive from; ``mark`` seeds it with a column-parallel module's output."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, tuple, tuple, frozenset[str]]] = []
        self.failed: frozenset[str] = frozenset()  # what the op that raised derives from
        self.origin: dict[int, frozenset[str]] = {}
        self._keep: list[torch.Tensor] = []  # ids stay unique while the forward runs

    def mark(self, t: object, module: str) -> None:
        if isinstance(t, torch.Tensor):
            self.origin[id(t)] = self.origin.get(id(t), frozenset()) | {module}
            self._keep.append(t)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        inputs = [
            a
            for a in torch.utils._pytree.tree_leaves((args, kwargs))
            if isinstance(a, torch.Tensor)
        ]
        came = frozenset().union(*(self.origin.get(id(a), frozenset()) for a in inputs))
        try:
            out = func(*args, **(kwargs or {}))
        except Exception:
            self.failed = came  # StableLM's view(bsz, len, num_heads, head_dim) of a shard
            raise
        for o in torch.utils._pytree.tree_leaves(out):
            if came and isinstance(o, torch.Tensor):
                self.origin[id(o)] = self.origin.get(id(o), frozenset()) | came
                self._keep.append(o)
        if str(func) in RESHAPE_OPS and isinstance(out, torch.Tensor):
            self.seen.append((str(func), tuple(args[0].shape), tuple(out.shape), came))
        return out
