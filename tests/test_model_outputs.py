"""A pipeline's last stage hands the loss the model's output object, as one process does.

torch's pipelining flattens the forward's output into tensors and leaves each where it is
computed; a model file's ``loss_fn`` reading ``outputs["logits"]`` or CLIP's
``outputs.logits_per_image`` got a tuple (a crash, or another field read by position).
``runtime.stages.gather_model_outputs`` makes the last stage return every output leaf, those
computed on earlier stages and model inputs included, and ``OutputLayout.rebuild`` gives back
the structure. Checked here in one process by running the split graph (every stage in turn)
against the model's own forward; ``tests/test_runtime_oracle.py`` (``clip-output-object-pp2``)
trains CLIP under PP 2 against one process.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.pipelining import SplitPoint
from torch.distributed.pipelining._IR import annotate_split_points
from torch.utils._pytree import tree_flatten

from runtime.model_outputs import traced_pipeline
from runtime.stages import (
    contiguous_boundaries,
    gather_model_outputs,
    inline_grad_mode_regions,
    relay_skip_connections,
)


class TwoTowers(nn.Module):
    """An image tower and a text tower; the output nests a dict and a tuple and holds a
    tensor of the first stage (the image features) and a model input (the ids)."""

    def __init__(self) -> None:
        super().__init__()
        self.image = nn.Sequential(nn.Linear(6, 8), nn.Tanh())
        self.embed = nn.Embedding(10, 8)
        self.text_layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, pixels: torch.Tensor, ids: torch.Tensor) -> dict:
        image = self.image(pixels)
        text = self.embed(ids).mean(1)
        for layer in self.text_layers:
            text = torch.tanh(layer(text))
        return {"logits": self.scale * image @ text.T, "towers": (image, text), "ids": ids}


class OneTensor(TwoTowers):
    def forward(self, pixels: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(pixels, ids)["logits"]


def _split(model: nn.Module, inputs: tuple):
    annotate_split_points(model, {"text_layers.0": SplitPoint.BEGINNING})
    pipe, spec, _ = traced_pipeline(model, inputs, inline_grad_mode_regions)
    layout = gather_model_outputs(pipe.split_gm, spec)
    relay_skip_connections(pipe.split_gm)
    contiguous_boundaries(pipe.split_gm)
    return pipe, layout


def _last_stage_output(pipe, inputs: tuple):
    got = []
    last = pipe.get_stage_module(pipe.num_stages - 1)
    handle = last.register_forward_hook(lambda _m, _a, out: got.append(out))
    with torch.no_grad():
        pipe(*inputs)
    handle.remove()
    return got[0]


def test_last_stage_rebuilds_the_models_nested_output():
    torch.manual_seed(0)
    inputs = (torch.randn(4, 6), torch.randint(0, 10, (4, 3)))
    model = TwoTowers()
    want = model(*inputs)
    pipe, layout = _split(model, inputs)
    assert pipe.num_stages == 2
    assert layout is not None
    got = layout.rebuild(_last_stage_output(pipe, inputs))
    assert isinstance(got, dict) and list(got) == ["logits", "towers", "ids"]
    assert isinstance(got["towers"], tuple) and len(got["towers"]) == 2
    got_leaves, got_spec = tree_flatten(got)
    want_leaves, want_spec = tree_flatten(want)
    assert got_spec == want_spec
    for g, w in zip(got_leaves, want_leaves):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_one_tensor_output_stays_the_stages_own():
    torch.manual_seed(0)
    inputs = (torch.randn(4, 6), torch.randint(0, 10, (4, 3)))
    model = OneTensor()
    want = model(*inputs)
    pipe, layout = _split(model, inputs)
    assert layout is None
    torch.testing.assert_close(_last_stage_output(pipe, inputs), want, rtol=0, atol=0)
