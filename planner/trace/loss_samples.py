"""Whether the model file's loss is a mean over samples, which is what makes a plan train as
one process does.

Every plan splits the global batch into micro-batches on data-parallel replicas and averages
the loss of each (``runtime.batching``). That equals one process's loss on the whole batch only
when the loss is a mean of per-sample terms. A loss summed over the batch scales the gradient
by the number of micro-batches, a contrastive loss (CLIP's in-batch negatives) sees only its
micro-batch's negatives, and a token mean over targets of unequal length (padding marked
``-100``) weighs the tokens differently: each trains another model, with nothing failing.

So the loss is evaluated, on the CPU, on two samples of ``make_batch`` at once and on each
alone, with outputs that are random but consistent: the model runs on the meta device at one
and at two samples, each output whose size doubles with the batch is drawn at two samples and
its halves given to the single-sample calls, and one that does not (a scalar auxiliary loss)
is the same tensor in all three. A per-sample mean gives the same number both ways.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from planner.modelfile import ModelFile, slice_tree

if TYPE_CHECKING:  # torch is imported by the check, not by a plan that reads its result
    import torch

# The outputs of two samples are drawn in full: a language model's logits over a large vocabulary
# at full length would take gigabytes, so the check gives up above this many elements.
MAX_ELEMENTS = 1 << 25
REL_TOL = 1e-4
IGNORE_INDEX = -100  # F.cross_entropy's, which the default loss keeps


def loss_sample_check(
    mf: ModelFile, model: torch.nn.Module, inputs_of: Callable[[int], tuple]
) -> dict[str, Any]:
    """``{"checked": True, "together": L(2 samples), "apart": mean of L(each)}`` or
    ``{"checked": False, "reason": ...}``. ``model``: the traced model on the meta device;
    ``inputs_of(n)``: its inputs for ``n`` samples, on that device."""
    import torch

    try:
        shapes = [_output_leaves(model, inputs_of(n)) for n in (1, 2)]
    except Exception as exc:  # the trace ran this model: any failure here is the check's
        return _unchecked(f"the model did not run on 1 and 2 samples ({type(exc).__name__})")
    (one, one_spec), (two, two_spec) = shapes
    if one_spec != two_spec:
        return _unchecked("the outputs' structure depends on the batch size")
    if sum(t.numel() for t in two if isinstance(t, torch.Tensor)) > MAX_ELEMENTS:
        if not mf.has_loss_fn:  # the default loss: its weighting is in the targets alone
            with torch.device("cpu"):
                return _default_loss_by_targets(mf)
        return _unchecked(f"the outputs of two samples exceed {MAX_ELEMENTS} elements")
    with torch.device("cpu"):  # the trace runs with meta as the default device
        result = _compare(mf, one, two, two_spec)
    if isinstance(result, dict):
        return result
    together, apart = result
    if not (math.isfinite(together) and math.isfinite(apart)):
        return _unchecked("loss_fn gave a non-finite value on random outputs")
    return {"checked": True, "together": together, "apart": apart}


def _compare(mf: ModelFile, one: list, two: list, spec: Any) -> tuple[float, float] | dict:
    """(loss of two samples together, mean of each alone), or why that was not computed."""
    import torch
    from torch.utils._pytree import tree_unflatten

    gen = torch.Generator().manual_seed(0)
    full, halves = [], ([], [])
    for a, b in zip(one, two):
        if not isinstance(b, torch.Tensor):  # None, a count: the same in every call
            full.append(b)
            halves[0].append(b)
            halves[1].append(b)
            continue
        value, dims = _draw(b, gen), _batch_dims(a.shape, b.shape)
        if dims is None:
            return _unchecked("an output does not double with the batch")
        full.append(value)
        for i, half in enumerate(halves):
            part = value
            for d in dims:  # [batch, batch]: each alone sees its diagonal block
                part = part.narrow(d, i * a.shape[d], a.shape[d])
            half.append(part)
    _, targets = mf.batch(2, step=1)
    parts = [slice_tree(targets, 0, 1), slice_tree(targets, 1, 2)]
    try:
        with torch.no_grad():
            together = float(mf.loss(tree_unflatten(full, spec), targets))
            apart = (
                sum(float(mf.loss(tree_unflatten(h, spec), t)) for h, t in zip(halves, parts)) / 2
            )
    except Exception as exc:
        return _unchecked(f"loss_fn failed on random outputs ({type(exc).__name__})")
    return together, apart


def _default_loss_by_targets(mf: ModelFile) -> dict[str, Any]:
    """The default loss (cross-entropy averaged over the targets not marked ``-100``) without
    its logits: it is the mean of per-position losses over the valid positions, so positions
    given random losses show how two samples weigh together and apart; they differ exactly
    when the samples hold different numbers of valid targets."""
    import torch

    _, targets = mf.batch(2, step=1)
    if not isinstance(targets, torch.Tensor) or targets.is_floating_point():
        return _unchecked("the outputs of two samples are too large to draw")
    valid = (targets.reshape(2, -1) != IGNORE_INDEX).float()
    losses = torch.rand(valid.shape, generator=torch.Generator().manual_seed(0)) * valid
    counts = valid.sum(1)
    if (counts == 0).any():
        return _unchecked("a sample of make_batch(2) has no target to learn")
    together = float(losses.sum() / counts.sum())
    apart = float((losses.sum(1) / counts).mean())
    return {"checked": True, "together": together, "apart": apart}


def couples_samples(check: dict[str, Any]) -> bool:
    """Whether a check found the loss of two samples together unlike their mean apart."""
    if not check.get("checked"):
        return False
    together, apart = check["together"], check["apart"]
    return abs(together - apart) > REL_TOL * max(abs(together), abs(apart), 1e-6)


def _unchecked(reason: str) -> dict[str, Any]:
    return {"checked": False, "reason": reason}


def _output_leaves(model: torch.nn.Module, inputs: tuple) -> tuple[list, Any]:
    """The model's outputs on the meta device, flattened, from one forward run as under
    torch.export (``meta_forward``)."""
    from torch.utils._pytree import tree_flatten

    with meta_forward():
        return tree_flatten(model(*inputs))


@contextlib.contextmanager
def meta_forward() -> Iterator[None]:
    """An eager forward on the meta device run as under torch.export, which traced the model:
    ``torch.compiler.is_compiling()`` is true, so library code skips its value-dependent
    shortcuts (transformers' ``padding_mask.all()``), which meta tensors cannot answer; no
    gradient, and the model's prints kept from the user."""
    from unittest import mock

    import torch

    with (
        torch.no_grad(),
        torch.device("meta"),
        mock.patch.object(torch.compiler, "is_compiling", lambda: True),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        yield


def _draw(like: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    import torch

    if like.is_floating_point():
        return torch.randn(like.shape, generator=gen)
    return torch.zeros(like.shape, dtype=like.dtype)


def _batch_dims(one: torch.Size, two: torch.Size) -> list[int] | None:
    """The dimensions that double from one sample to two (none: the output does not grow);
    None where a dimension grows otherwise or the rank changes."""
    if len(one) != len(two):
        return None
    grown = [d for d, (a, b) in enumerate(zip(one, two)) if a != b]
    if any(two[d] != 2 * one[d] for d in grown):
        return None
    return grown
