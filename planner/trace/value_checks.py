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


def _items_read(node: torch.fx.Node) -> set[torch.fx.Node]:
    """The ``item`` nodes (tensor values read: unbacked values) ``node`` depends on."""
    seen, todo, found = set(), [node], set()
    while todo:
        n = todo.pop()
        if n.op == "call_function" and n.target is ITEM:
            found.add(n)
            continue
        for a in n.all_input_nodes:
            if a not in seen:
                seen.add(a)
                todo.append(a)
    return found


def drop_value_checks(exported: torch.export.ExportedProgram) -> list[str]:
    """Erase the graph's assertions on values read by ``item`` and the ops only they read;
    one line per value checked (torch asserts one value's bounds in several nodes), for the
    plan's note. A value read by ``item`` that feeds anything but such checks (a size the
    step computes with) stays: the graph still needs it, and tracing fails as before, saying
    why."""
    graph = exported.graph_module.graph
    checks, values = [], {}
    for n in graph.nodes:
        if n.op == "call_function" and n.target is ASSERT:
            read = _items_read(n)
            if read:
                checks.append(n)
                for item in read:
                    values.setdefault(item.name, str(n.args[1]) if len(n.args) > 1 else n.name)
    if not checks:
        return []
    for n in checks:
        graph.erase_node(n)
    graph.eliminate_dead_code()
    exported.graph_module.recompile()
    return [f"{name}: {text}" for name, text in values.items()]
