"""Stand-ins that record how a function is called, for the kill files that check what a
caller hands its callees (runtime.build's pipeline steps, resources.mixed_plan's planning)."""

from __future__ import annotations

import inspect


def bound_arguments(signature: inspect.Signature, args: tuple, kwargs: dict) -> dict:
    """A call's arguments by parameter name as the callee binds them, its defaults filled in:
    an argument left to its default reads as that default (so a caller that passes the
    default and one that leaves it out record the same), and a missing or unknown argument is
    a TypeError, as it would be for the real callee."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)
