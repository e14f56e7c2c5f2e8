"""Where the traced training forward draws random numbers: dropout that is on, noise added to a
router's logits (PhiMoE's jitter), random masking. A plan's ranks and micro-batches draw their
own numbers, so such a model trains like one process in distribution, not number for number:
its losses and weights cannot be compared with one process's, and ``plan`` says so."""

from __future__ import annotations

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
