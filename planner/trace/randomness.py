"""Where the traced training forward draws random numbers: dropout that is on, noise added to a
router's logits (PhiMoE's jitter), random masking. A plan's ranks and micro-batches draw their
own numbers, so such a model trains like one process in distribution, not number for number:
its losses and weights cannot be compared with one process's, and ``plan`` says so."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import networkx as nx

# aten ops that draw from a generator (the in-place forms end in "_", the functional ones not)
_DRAWS = frozenset(
    {
        "bernoulli", "rand", "rand_like", "randn", "randn_like", "randint", "randint_like",
        "randperm", "normal", "uniform", "exponential", "multinomial", "poisson", "rrelu",
        "rrelu_with_noise", "cauchy", "geometric", "log_normal",
    }
)  # fmt: skip
# dropout ops: (input, p, train) - random only when on
_DROPOUTS = frozenset(
    {"dropout", "native_dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout"}
)


def _base(op: str) -> str:
    """``aten.uniform_.default`` -> ``uniform``."""
    parts = op.split(".")
    return parts[1].rstrip("_") if len(parts) > 1 and parts[0] == "aten" else ""


def _dropout_on(args: list) -> bool:
    p = args[1] if len(args) > 1 else 0.5
    train = args[2] if len(args) > 2 else True
    return isinstance(p, (int, float)) and p > 0 and train is not False


def random_draws(graph: nx.DiGraph) -> list[tuple[str, str]]:
    """(op, module) of every forward op that draws random numbers, in graph order, one per
    (op, module) pair."""
    found: dict[tuple[str, str], int] = {}
    for _, data in graph.nodes(data=True):
        base = _base(str(data.get("op", "")))
        if base in _DROPOUTS:
            if not _dropout_on(data.get("args") or []):
                continue
            base = "dropout"
        elif base not in _DRAWS:
            continue
        found.setdefault((base, data.get("module") or "(root)"), data.get("order", 0))
    return sorted(found, key=found.__getitem__)


# numpy's module-level draws a forward may call (transformers' SpecAugment: rand, choice)
_NUMPY_DRAWS = (
    "rand", "randn", "random", "random_sample", "randint", "choice", "uniform", "normal",
    "permutation", "shuffle", "binomial", "poisson",
)  # fmt: skip


@contextlib.contextmanager
def numpy_draws(found: list[str]) -> Iterator[None]:
    """Record in ``found`` each ``numpy.random`` function the forward calls. torch.export sees
    no op for them: their numbers become constants of the graph, so a pipeline's stages,
    traced once, replay that one draw every step, and torch's seed never reaches them. Wav2Vec2
    and its kin draw their SpecAugment masks this way (``mask_time_prob`` > 0): a Wav2Vec2
    under PP 2 trained another model than one process, with nothing failing."""
    import numpy as np

    originals = {name: getattr(np.random, name) for name in _NUMPY_DRAWS}

    def recording(name: str, fn: Callable) -> Callable:
        def draw(*args: Any, **kwargs: Any) -> Any:
            found.append(f"numpy.random.{name}")
            return fn(*args, **kwargs)

        return draw

    for name, fn in originals.items():
        setattr(np.random, name, recording(name, fn))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(np.random, name, fn)
