"""The check that the model file's loss is a mean over samples (planner.trace.loss_samples), and
the note a plan that splits the batch gets when it is not: a summed, contrastive or unequally
padded token-mean loss trains another model under micro-batches and data parallelism than one
process does, with nothing failing."""

from __future__ import annotations

import textwrap

import pytest

from planner.api import plan, trace
from planner.modelfile import load_model_file
from planner.search import Pins
from planner.trace.loss_samples import MAX_ELEMENTS, couples_samples

MODEL = """
import torch, torch.nn.functional as F
from torch import nn

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}
KIND = {"k": "mean"}


class Net(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, vocab)

    def forward(self, x):
        if not torch.compiler.is_compiling() and bool((x != 0).all()):
            x = x + 0  # a shortcut on the values, as transformers' masks take outside tracing
        logits = self.b(torch.tanh(self.a(x)))
        if KIND["k"] == "aux":  # a dict with a scalar auxiliary loss beside the logits
            return {"logits": logits, "aux": logits.float().pow(2).mean()}
        if KIND["k"] == "similarity":  # CLIP's logits_per_image: [batch, batch]
            z = logits.mean(1)
            return z @ z.T
        return logits


def build_model(kind="mean", vocab=16):
    KIND["k"] = kind
    return Net(vocab)


def make_batch(batch_size, step=0):
    g = torch.Generator().manual_seed(step)
    y = torch.randint(0, 16, (batch_size, 4), generator=g)
    if KIND["k"] == "padded":
        y[0, 2:] = -100  # the first sample has half the targets of the others
    return torch.randn(batch_size, 4, 16, generator=g), y
"""

LOSSES = {
    "mean": "return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))",
    "sum": 'return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), reduction="sum")',
    "clip": (
        "z = F.normalize(out.mean(1), dim=-1)\n"
        "return F.cross_entropy(z @ z.roll(1, 0).T * 10, torch.arange(len(z)))"
    ),
    "aux": (
        "return F.cross_entropy(out['logits'].reshape(-1, 16), y.reshape(-1)) + 0.1 * out['aux']"
    ),
    "similarity": "return F.cross_entropy(out, torch.arange(len(out)))",
}


def _model_file(tmp_path, loss: str | None) -> str:
    body = MODEL
    if loss is not None:
        body += "\n\ndef loss_fn(out, y):\n" + textwrap.indent(LOSSES[loss], "    ") + "\n"
    path = tmp_path / f"model_{loss}.py"
    path.write_text(body)
    return str(path)


def _check(tmp_path, monkeypatch, kind: str, loss: str | None, **args) -> dict:
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "cache"))
    mf = load_model_file(_model_file(tmp_path, loss), {"kind": kind, **args})
    return trace(mf, traced_batch_size=1, dtype="fp32", use_cache=False).graph.graph["loss_samples"]


@pytest.mark.parametrize(
    "kind, loss",
    [("mean", "mean"), ("mean", None), ("aux", "aux")],
    ids=["mean", "default-loss", "dict-with-scalar-aux"],
)
def test_a_mean_over_samples_passes(kind, loss, tmp_path, monkeypatch):
    check = _check(tmp_path, monkeypatch, kind, loss)
    assert check["checked"], check
    assert check["together"] == pytest.approx(check["apart"], rel=1e-6)
    assert not couples_samples(check)


def test_a_summed_loss_is_twice_the_mean_of_its_halves(tmp_path, monkeypatch):
    check = _check(tmp_path, monkeypatch, "mean", "sum")
    assert check["together"] == pytest.approx(2 * check["apart"], rel=1e-6)
    assert couples_samples(check)


def test_in_batch_negatives_couple_the_samples(tmp_path, monkeypatch):
    check = _check(tmp_path, monkeypatch, "mean", "clip")
    assert check["apart"] == pytest.approx(0.0, abs=1e-6)  # one sample is its only candidate
    assert check["together"] > 0.1
    assert couples_samples(check)


def test_a_similarity_of_the_batch_with_itself_couples_the_samples(tmp_path, monkeypatch):
    """CLIP's [batch, batch] logits: a micro-batch sees only its diagonal block, and one sample
    alone is its only candidate (loss 0), where two together are not."""
    check = _check(tmp_path, monkeypatch, "similarity", "similarity")
    assert check["checked"], check
    assert check["apart"] == pytest.approx(0.0, abs=1e-6)
    assert couples_samples(check)


def test_a_token_mean_over_unequal_targets_couples_the_samples(tmp_path, monkeypatch):
    check = _check(tmp_path, monkeypatch, "padded", None)
    assert couples_samples(check)


def test_outputs_too_large_are_not_checked(tmp_path, monkeypatch):
    check = _check(tmp_path, monkeypatch, "mean", "sum", vocab=MAX_ELEMENTS // 8 + 1)
    assert not check["checked"]
    assert "exceed" in check["reason"]
    assert not couples_samples(check)


@pytest.mark.parametrize("kind, coupled", [("padded", True), ("mean", False)])
def test_the_default_loss_over_large_outputs_is_checked_by_its_targets(
    kind, coupled, tmp_path, monkeypatch
):
    """Logits too large to draw (a full vocabulary at full length): the default loss's weighting
    is in its targets, the padded first sample weighing its tokens more alone than together."""
    check = _check(tmp_path, monkeypatch, kind, None, vocab=MAX_ELEMENTS // 8 + 1)
    assert check["checked"], check
    assert couples_samples(check) is coupled


def test_a_plan_splitting_the_batch_says_so_with_the_pin(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "cache"))
    path = _model_file(tmp_path, "sum")
    split = plan(path, 2, model_args={"kind": "mean"}, profile="cpu", pins=Pins(dp=2))
    notes = [n for n in split.notes if n.startswith("loss:")]
    assert len(notes) == 1
    assert "2 parts of 4 samples" in notes[0]
    assert "--micro-batch-size 8 --dp 1" in notes[0]
    whole = plan(
        path, 2, model_args={"kind": "mean"}, profile="cpu", pins=Pins(dp=1, micro_batch_size=8)
    )
    assert not [n for n in whole.notes if n.startswith("loss:")]
    mean = plan(_model_file(tmp_path, "mean"), 2, model_args={"kind": "mean"}, profile="cpu",
                pins=Pins(dp=2))  # fmt: skip
    assert not [n for n in mean.notes if n.startswith("loss:")]
