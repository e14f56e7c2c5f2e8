"""torch's export and split of a model into pipeline stages (``stages.traced_pipeline``, a
second or more each), kept for the test session by what it is handed: the model's class,
annotated cut and weights, the example, the split policy and the kept signatures. It is
torch's code and model_outputs', not the runtime modules the kill files mutate, so mutmut's
forked children (one a mutant) reuse what the unmutated run traced; a mutant that hands it
anything else misses the cache and is traced for real. Forked ranks inherit it."""

from __future__ import annotations

import copy

from torch import nn

from runtime import stages

_TRACES: dict = {}
_real_traced_pipeline = stages.traced_pipeline


def cut_of(model: nn.Module) -> tuple:
    """The split points annotated on ``model`` (``annotate_split_points``), and its weights."""
    marks = tuple(
        (name, m.forward.__func__.__name__)
        for name, m in model.named_modules()
        if "_orig_forward" in m.__dict__
    )
    weights = tuple((k, float(v.double().sum())) for k, v in model.state_dict().items())
    return type(model).__qualname__, marks, weights


def traced_pipeline_kept(model, example, split_policy, preserve=()):  # noqa: ANN001, ANN201
    """``stages.traced_pipeline``'s answer, a copy of the session's for the same arguments."""
    key = (
        cut_of(model),
        tuple((tuple(t.shape), float(t.double().sum())) for t in example),
        split_policy,
        tuple(preserve),
    )
    if key not in _TRACES:
        _TRACES[key] = _real_traced_pipeline(model, example, split_policy, preserve)
    return copy.deepcopy(_TRACES[key])
