"""The model's output object on a pipeline's last stage, as one process's forward returns it.

torch's pipelining traces the model with ``torch.export``, which flattens whatever the forward
returns (a transformers ``CLIPOutput`` holding two nested ``ModelOutput``s, a dict, a tuple)
into a flat list of tensors, and the last stage returns only those it computes. The model
file's ``loss_fn`` is written against the object (``outputs.logits_per_image``), so a pipeline
handed it a tuple and crashed, or, for a loss reading positions, could read another field.

So the structure (the exported program's output ``TreeSpec``) is kept when the model is
traced, the last stage is made to return every output leaf in the spec's order (those computed
on earlier stages are relayed to it: ``runtime.stages.gather_model_outputs``), and the loss is
handed ``rebuild(returned)``: the same class with the same fields as in one process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch
from torch.distributed.pipelining import pipeline
from torch.distributed.pipelining._IR import Pipe
from torch.utils._pytree import TreeSpec, tree_unflatten

from runtime.block_calls import BlockCall, block_calls, name_values


@dataclass
class OutputLayout:
    """How to rebuild the model's output from what the last stage returns: ``spec`` is the
    output's structure, ``constants`` the leaves the graph does not compute (an int, a
    string), by flat position; the stage returns the other leaves in order."""

    spec: TreeSpec
    constants: dict[int, Any] = field(default_factory=dict)

    def rebuild(self, returned: Any) -> Any:
        values = iter(returned if isinstance(returned, (tuple, list)) else (returned,))
        leaves = [
            self.constants[i] if i in self.constants else next(values)
            for i in range(self.spec.num_leaves)
        ]
        return tree_unflatten(leaves, self.spec)


def traced_pipeline(
    model: torch.nn.Module,
    example: tuple,
    split_policy: Callable[[torch.fx.GraphModule], torch.fx.GraphModule],
    preserve: tuple[str, ...] = (),
) -> tuple[Pipe, TreeSpec, dict[str, BlockCall]]:
    """``torch.distributed.pipelining.pipeline(model, example)``, the output structure of the
    program it exported, and the call signatures of the modules ``preserve`` names, which the
    export keeps (``runtime.block_calls``). ``pipeline`` keeps no handle on that program, so
    its one export call is wrapped to read both: tracing twice would double the slowest step."""
    specs: list[TreeSpec] = []
    calls: dict[str, BlockCall] = {}
    export = Pipe._trace_with_export

    def export_and_keep_spec(mod: torch.nn.Module, args: tuple, kwargs: Any = None) -> Any:
        if not preserve:
            program = export(mod, args, kwargs)
        else:
            program = torch.export.export(
                mod, args, kwargs, preserve_module_call_signature=preserve
            )
            calls.update(block_calls(program, preserve))
            name_values(program)
        specs.append(program.call_spec.out_spec)
        return program

    with mock.patch.object(Pipe, "_trace_with_export", staticmethod(export_and_keep_spec)):
        pipe = pipeline(model, example, split_policy=split_policy)
    return pipe, specs[-1], calls
