"""Input checks that read tensor values, dropped from the exported graph the planner prices.

transformers' vision-language models check that the prompt holds one image token per image
feature before merging them (LLaVA's ``get_placeholder_mask``: ``torch_compilable_check(
n_image_tokens * hidden == image_features.numel())``). Under ``torch.export`` the check becomes
``_is_all_true -> item -> _assert_scalar`` on an unbacked value; the trace runs on the meta
device, where ``item`` has no value, so the planner's interpretation of the graph (saved
activations) failed and the model was refused. The check only validates the inputs: it
computes nothing the step uses, and costs nothing worth pricing. So its assertions are dropped
from the graph the planner prices (with the ops only they read), and the plan says so; the
training run keeps them: eager forwards run the check on every real batch, and a pipeline's
stages are exported from the real model on a real micro-batch, where ``item`` has its value.
"""

from __future__ import annotations

import torch

ASSERT = torch.ops.aten._assert_scalar.default
ITEM = torch.ops.aten.item.default


def _reads_item(node: torch.fx.Node) -> bool:
    """Whether ``node`` depends on a tensor value read by ``item`` (an unbacked value)."""
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        if n.op == "call_function" and n.target is ITEM:
            return True
        for a in n.all_input_nodes:
            if a not in seen:
                seen.add(a)
                todo.append(a)
    return False


def drop_value_checks(exported: torch.export.ExportedProgram) -> list[str]:
    """Erase the graph's assertions on values read by ``item`` and the ops only they read;
    the assertions' own messages, for the plan's note. Nothing is erased where a value read
    by ``item`` feeds anything but such checks (a size the step computes with): the graph
    then still needs it, and tracing fails as before, saying why."""
    graph = exported.graph_module.graph
    checks = [
        n for n in graph.nodes if n.op == "call_function" and n.target is ASSERT and _reads_item(n)
    ]
    if not checks:
        return []
    messages = [str(n.args[1]) if len(n.args) > 1 else n.name for n in checks]
    for n in checks:
        graph.erase_node(n)
    graph.eliminate_dead_code()
    exported.graph_module.recompile()
    return messages
