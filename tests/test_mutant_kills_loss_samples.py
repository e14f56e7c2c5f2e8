"""planner/trace/loss_samples.py's numbers worked out independently, for its generated mutants
(benchmarks/generated_mutants.py).

The check runs a tiny model file's model on the meta device at one and two samples and evaluates
its loss on random outputs drawn from a generator seeded 0. Each test here draws the same outputs
by hand (``torch.randn`` of the two-sample shape; its halves for each sample) and evaluates the
loss on them with ``torch.nn.functional`` directly, so every number the check returns is compared
with one computed without it. The model is built and run the way the tracer does (the meta
device as the default device), without tracing: each call runs the check's own code, never a
cached trace's result.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F

from planner.modelfile import load_model_file
from planner.trace import loss_samples
from planner.trace.export import build_meta_model, meta_inputs
from planner.trace.loss_samples import (
    _batch_dims,
    couples_samples,
    loss_sample_check,
    meta_forward,
)

MODEL = """
import torch, torch.nn.functional as F
from torch import nn

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}
KIND = {"k": "plain"}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 5)

    def forward(self, x):
        k = KIND["k"]
        logits = self.a(x)  # [batch, 2, 5]
        n = x.shape[0]
        if k == "fails" and n == 2:
            raise RuntimeError("no two samples")
        if k == "aux":  # a scalar beside the logits, and a count that is not a tensor
            return {"count": 7, "logits": logits, "aux": logits.mean()}
        if k == "ids":  # an integer output: drawn as zeros of its dtype
            return logits, torch.ones(n, 2, dtype=torch.long)
        if k == "square":  # [batch, batch]: each sample alone sees its diagonal block
            z = logits.mean((1, 2))
            return z[:, None] * z[None, :]
        if k == "structure":  # a tuple at two samples, a tensor at one
            return (logits, logits) if n == 2 else logits
        if k == "triple":  # grows three-fold, not two-fold
            return logits.new_zeros(3 * n - 2, 4)
        if k == "rank":  # one dimension more at two samples
            return logits if n == 1 else logits[None]
        if k == "huge":  # too many elements to draw at two samples (the check's limit lowered)
            return logits
        return logits


def build_model(kind="plain"):
    KIND["k"] = kind
    return Net()


def make_batch(batch_size, step=0):
    g = torch.Generator().manual_seed(step)
    y = torch.randint(0, 5, (batch_size, 2), generator=g)
    if KIND["k"] == "padded":  # one sample has one target, the other two: which by the step
        y[step % 2, 1] = -100
    if KIND["k"] == "no_target":
        y[0, :] = -100
    if KIND["k"] == "float_targets":
        y = y.float()
    return torch.randn(batch_size, 2, 3, generator=g), y
"""

LOSSES = {
    "sum": 'return F.cross_entropy(out.reshape(-1, 5), y.reshape(-1), reduction="sum")',
    "aux": (
        "assert out['count'] == 7\n"
        "return F.cross_entropy(out['logits'].reshape(-1, 5), y.reshape(-1)) + 0.5 * out['aux']"
    ),
    "ids": (
        "logits, ids = out\n"
        "assert ids.dtype == torch.long, ids.dtype\n"
        "return F.cross_entropy(logits.reshape(-1, 5), y.reshape(-1)) + ids.float().sum()"
    ),
    "square": "return F.cross_entropy(out, torch.arange(len(out)))",
    "raises": "raise ValueError('no')",
    "inf": "return out.sum() * float('inf')",
    "inf_alone": "return out.sum() * 0 + torch.tensor(1.0) / (len(out) - 1)",
    "plain_sum": "return out.sum()",
}


def _model_file(tmp_path, loss: str | None):
    body = MODEL
    if loss is not None:
        body += "\n\ndef loss_fn(out, y):\n" + textwrap.indent(LOSSES[loss], "    ") + "\n"
    path = tmp_path / f"model_{loss}.py"
    path.write_text(body)
    return path


def _check(tmp_path, kind: str, loss: str | None) -> dict:
    """The check as the tracer runs it: meta model, meta inputs, meta as the default device."""
    mf = load_model_file(_model_file(tmp_path, loss), {"kind": kind})
    with torch.device("meta"):
        model = build_meta_model(mf, "fp32")
        return loss_sample_check(mf, model, lambda n: meta_inputs(mf, n, "fp32"))


def _targets(tmp_path, kind: str) -> torch.Tensor:
    mf = load_model_file(_model_file(tmp_path, None), {"kind": kind})
    mf.build()  # build_model sets the kind make_batch reads
    return mf.batch(2, step=1)[1]


def _ce(logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> float:
    return float(F.cross_entropy(logits.reshape(-1, 5), y.reshape(-1), reduction=reduction))


def test_a_mean_loss_is_the_same_on_two_samples_and_on_each(tmp_path):
    """The default loss (no loss_fn): logits drawn at [2, 2, 5], each sample its row."""
    y = _targets(tmp_path, "plain")
    logits = torch.randn((2, 2, 5), generator=torch.Generator().manual_seed(0))
    check = _check(tmp_path, "plain", None)
    together = _ce(logits, y)
    apart = (_ce(logits[0:1], y[0:1]) + _ce(logits[1:2], y[1:2])) / 2
    assert check == {"checked": True, "together": together, "apart": apart}
    assert together == pytest.approx(apart, rel=1e-6)
    assert not couples_samples(check)


def test_a_summed_loss_is_twice_the_mean_of_each(tmp_path):
    y = _targets(tmp_path, "plain")
    logits = torch.randn((2, 2, 5), generator=torch.Generator().manual_seed(0))
    check = _check(tmp_path, "plain", "sum")
    assert check["checked"]
    assert check["together"] == pytest.approx(_ce(logits, y, "sum"), rel=1e-6)
    halves = [_ce(logits[i : i + 1], y[i : i + 1], "sum") for i in (0, 1)]
    assert check["apart"] == pytest.approx(sum(halves) / 2, rel=1e-6)
    assert check["together"] == pytest.approx(2 * check["apart"], rel=1e-6)
    assert couples_samples(check)


def test_a_scalar_and_a_count_are_the_same_in_every_call(tmp_path):
    """Leaves in order: the count 7 (passed as it is, before any tensor), logits [2, 2, 5]
    drawn first, then the scalar (one draw, given whole to all three calls)."""
    y = _targets(tmp_path, "aux")
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn((2, 2, 5), generator=gen)
    aux = float(torch.randn((), generator=gen))
    check = _check(tmp_path, "aux", "aux")
    assert check["checked"], check
    assert check["together"] == pytest.approx(_ce(logits, y) + 0.5 * aux, rel=1e-6)
    halves = [_ce(logits[i : i + 1], y[i : i + 1]) + 0.5 * aux for i in (0, 1)]
    assert check["apart"] == pytest.approx(sum(halves) / 2, rel=1e-6)


def test_an_integer_output_is_drawn_as_zeros_of_its_dtype(tmp_path):
    y = _targets(tmp_path, "ids")
    logits = torch.randn((2, 2, 5), generator=torch.Generator().manual_seed(0))
    check = _check(tmp_path, "ids", "ids")
    assert check["checked"], check
    assert check["together"] == pytest.approx(_ce(logits, y), rel=1e-6)
    halves = [_ce(logits[i : i + 1], y[i : i + 1]) for i in (0, 1)]
    assert check["apart"] == pytest.approx(sum(halves) / 2, rel=1e-6)


def test_a_batch_by_batch_output_gives_each_sample_its_diagonal_block(tmp_path):
    """[2, 2] similarities: together the cross-entropy of both rows; each alone its [1, 1]
    diagonal entry, whose only candidate is itself (loss 0)."""
    sim = torch.randn((2, 2), generator=torch.Generator().manual_seed(0))
    check = _check(tmp_path, "square", "square")
    assert check["checked"], check
    assert check["together"] == pytest.approx(float(F.cross_entropy(sim, torch.arange(2))))
    assert check["apart"] == 0.0
    assert couples_samples(check)


@pytest.mark.parametrize(
    "kind, loss, reason",
    [
        ("fails", None, "the model did not run on 1 and 2 samples (RuntimeError)"),
        ("structure", None, "the outputs' structure depends on the batch size"),
        ("triple", "plain_sum", "an output does not double with the batch"),
        ("rank", "plain_sum", "an output does not double with the batch"),
        ("plain", "raises", "loss_fn failed on random outputs (ValueError)"),
        ("plain", "inf", "loss_fn gave a non-finite value on random outputs"),
        ("plain", "inf_alone", "loss_fn gave a non-finite value on random outputs"),
    ],
)
def test_what_cannot_be_checked_says_why(tmp_path, kind, loss, reason):
    check = _check(tmp_path, kind, loss)
    assert check == {"checked": False, "reason": reason}
    assert not couples_samples(check)


def test_outputs_over_the_limit_with_a_loss_fn_are_not_drawn(tmp_path, monkeypatch):
    """Two samples' logits hold 2 x 2 x 5 = 20 elements: at a limit of 20 they are drawn, at 19
    they are not (a loss_fn's weighting cannot be read from the targets)."""
    monkeypatch.setattr(loss_samples, "MAX_ELEMENTS", 20)
    assert _check(tmp_path, "huge", "sum")["checked"]
    monkeypatch.setattr(loss_samples, "MAX_ELEMENTS", 19)
    check = _check(tmp_path, "huge", "sum")
    assert check == {"checked": False, "reason": "the outputs of two samples exceed 19 elements"}


def _by_targets(y: torch.Tensor) -> tuple[float, float]:
    """The default loss's weighting from the targets: random per-position losses (seed 0) on
    the valid positions, their mean over all valid positions, and the mean of each sample's."""
    valid = (y.reshape(2, -1) != -100).float()
    losses = torch.rand(valid.shape, generator=torch.Generator().manual_seed(0)) * valid
    together = float(losses.sum() / valid.sum())
    apart = float((losses[0].sum() / valid[0].sum() + losses[1].sum() / valid[1].sum()) / 2)
    return together, apart


def test_over_the_limit_the_default_loss_is_weighed_by_its_targets(tmp_path, monkeypatch):
    """make_batch(2, step=1): the second sample has 1 valid target of 2, the first 2 (at step 0
    it would be the first): a token mean weighs them 2/3 and 1/3 together, 1/2 each apart."""
    monkeypatch.setattr(loss_samples, "MAX_ELEMENTS", 19)
    y = _targets(tmp_path, "padded")
    assert (y != -100).sum(1).tolist() == [2, 1]
    together, apart = _by_targets(y)
    check = _check(tmp_path, "padded", None)
    assert check == {"checked": True, "together": together, "apart": apart}
    assert together != pytest.approx(apart, rel=1e-3)
    assert couples_samples(check)
    # equal targets: the same number both ways
    plain = _check(tmp_path, "plain", None)
    assert plain["checked"]
    assert plain["together"] == pytest.approx(plain["apart"], rel=1e-6)
    assert (plain["together"], plain["apart"]) == _by_targets(_targets(tmp_path, "plain"))


@pytest.mark.parametrize(
    "kind, reason",
    [
        ("no_target", "a sample of make_batch(2) has no target to learn"),
        ("float_targets", "the outputs of two samples are too large to draw"),
    ],
)
def test_over_the_limit_targets_that_cannot_weigh_say_why(tmp_path, monkeypatch, kind, reason):
    monkeypatch.setattr(loss_samples, "MAX_ELEMENTS", 19)
    assert _check(tmp_path, kind, None) == {"checked": False, "reason": reason}


@pytest.mark.parametrize(
    "together, apart, coupled",
    [
        (1.0, 1.0, False),
        (1.0, 1.0 + 0.9e-4, False),  # within REL_TOL of the larger
        (1.0, 1.0 + 1.1e-4, True),
        (-1.0, -1.0 - 1.1e-4, True),  # the larger magnitude, not the larger value
        (-1.0, -1.0 - 0.9e-4, False),
        (0.0, 0.9e-10, False),  # below the 1e-6 floor's tolerance (1e-10)
        (0.0, 1.1e-10, True),
        (0.0, 1e-4 * 1e-6, False),  # exactly at the tolerance: not coupled
        (1.0, 1.0 + 1.00005e-4, False),  # within the larger's tolerance, not the smaller's
    ],
)
def test_coupled_means_apart_by_more_than_the_relative_tolerance(together, apart, coupled):
    assert couples_samples({"checked": True, "together": together, "apart": apart}) is coupled
    assert couples_samples({"checked": True, "together": apart, "apart": together}) is coupled


def test_an_unchecked_loss_is_never_coupled():
    assert couples_samples({"checked": False, "together": 1.0, "apart": 2.0}) is False
    assert couples_samples({"together": 1.0, "apart": 2.0}) is False


@pytest.mark.parametrize(
    "one, two, dims",
    [
        ((1, 4), (2, 4), [0]),
        ((2, 3), (4, 3), [0]),  # twice 2, not 2 / 2
        ((3,), (3,), []),  # does not grow: the same tensor in every call
        ((1, 1), (2, 2), [0, 1]),
        ((1, 4), (3, 4), None),  # grows, but not two-fold
        ((2, 4), (4, 5), None),  # one dimension doubles, another grows otherwise
        ((1, 4), (2, 1, 4), None),  # the rank changes
    ],
)
def test_batch_dimensions_are_those_that_double(one, two, dims):
    assert _batch_dims(torch.Size(one), torch.Size(two)) == dims


def test_the_meta_forward_runs_as_under_export_and_keeps_prints_in(capsys):
    with meta_forward():
        assert torch.compiler.is_compiling()
        assert not torch.is_grad_enabled()
        assert torch.empty(2).device.type == "meta"
        print("from the model")
    assert capsys.readouterr().out == ""
    assert not torch.compiler.is_compiling()
