"""Models whose training forward draws random numbers (dropout that is on, noise on a router's
logits as PhiMoE's) cannot match one process number for number under a plan: each rank and
micro-batch draws its own. The trace finds the draws, and a plan over several ranks says so;
dropout at 0, or one rank with one micro-batch, says nothing."""

from __future__ import annotations

from planner.api import plan, trace
from planner.search import Pins
from planner.trace.randomness import random_draws

MODEL = """
import numpy as np
import torch
from torch import nn

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}


class Net(nn.Module):
    def __init__(self, p=0.1, noise=0.0, numpy_mask=False):
        super().__init__()
        self.embed = nn.Embedding(64, 16)
        self.drop = nn.Dropout(p)
        self.gate = nn.Linear(16, 16)
        self.head = nn.Linear(16, 64)
        self.noise = noise
        self.numpy_mask = numpy_mask

    def forward(self, x):
        h = self.drop(self.embed(x))
        g = self.gate(h)
        if self.noise:
            g = g * torch.empty_like(g).uniform_(1 - self.noise, 1 + self.noise)
        if self.numpy_mask:  # as transformers' SpecAugment: positions drawn with numpy
            keep = torch.from_numpy(np.random.rand(*g.shape[1:]) > 0.2)
            g = g * keep.to(device=g.device, dtype=g.dtype)
        return self.head(g)


def build_model(p=0.1, noise=0.0, numpy_mask=False):
    return Net(float(p), float(noise), bool(numpy_mask))


def make_batch(batch_size, step=0):
    g = torch.Generator().manual_seed(step)
    x = torch.randint(0, 64, (batch_size, 4), generator=g)
    return x, torch.randint(0, 64, (batch_size, 4), generator=g)


def loss_fn(out, y):
    return nn.functional.cross_entropy(out.reshape(-1, 64), y.reshape(-1))
"""


def _write(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    f = tmp_path / "noisy.py"
    f.write_text(MODEL)
    return f


def _said(notes: list[str]) -> list[str]:
    return [n for n in notes if n.startswith("the forward draws random numbers")]


def test_dropout_and_noise_are_found_where_they_draw(tmp_path, monkeypatch):
    f = _write(tmp_path, monkeypatch)
    assert random_draws(trace(f, dtype="fp32", model_args={"p": 0.1}).graph) == [
        ("dropout", "drop")
    ]
    assert random_draws(trace(f, dtype="fp32", model_args={"p": 0.0}).graph) == []
    noisy = trace(f, dtype="fp32", model_args={"p": 0.0, "noise": 0.01}).graph
    assert random_draws(noisy) == [("uniform", "(root)")]


def test_a_plan_of_several_ranks_says_its_draws_differ_from_one_process(tmp_path, monkeypatch):
    f = _write(tmp_path, monkeypatch)
    said = _said(plan(f, 2, profile="cpu", dtype="fp32", model_args={"p": 0.1}).notes)
    assert len(said) == 1 and "dropout in drop" in said[0]
    assert _said(plan(f, 2, profile="cpu", dtype="fp32", model_args={"p": 0.0}).notes) == []
    one = plan(
        f, 1, profile="cpu", dtype="fp32", model_args={"p": 0.1}, pins=Pins(micro_batch_size=8)
    )
    assert _said(one.notes) == []


def test_numpy_draws_are_found_and_a_pipeline_says_it_replays_them(tmp_path, monkeypatch):
    """torch.export sees no op for numpy's draws: the mask becomes a constant, which a
    pipeline's stages, traced once, replay every step (Wav2Vec2's SpecAugment under PP 2
    trained another model than one process)."""
    f = _write(tmp_path, monkeypatch)
    args = {"p": 0.0, "numpy_mask": True}
    assert trace(f, dtype="fp32", model_args=args).graph.graph["numpy_draws"] == [
        "numpy.random.rand"
    ]
    pins = Pins(pp=2, dp=1, tp=1, micro_batch_size=4)
    notes = plan(f, 2, profile="cpu", dtype="fp32", model_args=args, pins=pins).notes
    (said,) = [n for n in notes if "numpy's generator" in n]
    assert "numpy.random.rand" in said and "replay" in said
    quiet = plan(f, 2, profile="cpu", dtype="fp32", model_args={"p": 0.0}, pins=pins).notes
    assert not [n for n in quiet if "numpy" in n]
