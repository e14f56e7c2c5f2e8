"""Tied weights (one tensor under several module paths, e.g. an output projection that is the
token embedding) in a parallel run, so that it trains as one tensor, as in one process.

* One stage: FSDP2 refuses a tensor managed by two units, so the modules that hold a tied
  weight stay out of the per-block units and join the root unit (``splits_tie``); the
  weight is then gathered from its first use in forward to its last in backward, which the
  cost model prices (``tied_memory``).
* A pipeline: each stage that reads the weight holds its own copy (Megatron's embedding
  group), and so does each stage that calls one module (a caller of ``torch.nn.Transformer``
  embedding source and target tokens with one table): torch's pipeline split gives each stage
  a copy under the same name. Before the optimizer step the copies' gradients are summed, over
  the ranks that hold a copy and share every coordinate but the pipeline's, so every copy takes
  the same update from the same value (``TiedGrads``). Two stages of one rank (interleaved
  schedules) get separate copies too, summed locally first: FSDP cannot wrap one tensor in two
  stages.

Tensor parallelism splits a tied weight alike in every module that holds it (along its
vocabulary: cost.sharding.vocab_parallel_tied; ``runtime.parallelize.retie`` makes it one
tensor again), or keeps it replicated (with a pipeline), so every copy has the same layout
and its local gradient is the whole, or the same shard of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from planner.errors import UserInputError
from planner.modelfile import parameter_names
from planner.schema.mesh import Mesh


def tied_groups(model: nn.Module) -> dict[str, list[str]]:
    """Canonical name -> every name, of the parameters reachable under several paths."""
    return {k: names for k, names in parameter_names(model).items() if len(names) > 1}


def splits_tie(fqn: str, groups: dict[str, list[str]]) -> bool:
    """Whether module ``fqn`` holds some, but not all, of the paths of one tied parameter
    (``tied_groups``), so that an FSDP unit of its own would manage a tensor another unit
    also reaches."""
    for names in groups.values():
        inside = [n.startswith(fqn + ".") or not fqn for n in names]
        if any(inside) and not all(inside):
            return True
    return False


def untie_between(parts: list[nn.Module]) -> None:
    """Give each module of ``parts`` its own copy of a parameter an earlier one also holds."""
    seen: set[int] = set()
    for part in parts:
        own: dict[int, nn.Parameter] = {}
        for name, p in list(part.named_parameters(remove_duplicate=False)):
            if id(p) in seen:
                copy = own.get(id(p))
                if copy is None:
                    copy = own[id(p)] = nn.Parameter(p.detach().clone(), p.requires_grad)
                parent_path, _, attr = name.rpartition(".")
                parent = part.get_submodule(parent_path) if parent_path else part
                setattr(parent, attr, copy)
        seen.update(id(p) for p in part.parameters())


@dataclass
class TiedGrads:
    """The tied parameters this rank holds, and how their gradients are summed."""

    names: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # key -> (part, name)
    groups: dict[str, object] = field(default_factory=dict)  # key -> process group

    def sum_gradients(self, parts: list[nn.Module]) -> None:
        """Sum every copy's gradient (locally, then over the copies' ranks) into each copy."""
        if not self.names:
            return
        by_part = [_parameters(p) for p in parts]
        for key in sorted(self.names):
            params = [by_part[i][name] for i, name in self.names[key]]
            for p in params:
                # a copy read only under no_grad (an EMA update from it) has no gradient: it
                # takes the sum too, or the optimizer would skip it and the copies part
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            grads = [_local(p.grad) for p in params]
            total = torch.stack(grads).sum(0) if len(grads) > 1 else grads[0].clone()
            group = self.groups.get(key)
            if group is not None:
                dist.all_reduce(total, group=group)
            for g in grads:
                g.copy_(total)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, torch.distributed.tensor.DTensor) else t


def _parameters(part: nn.Module) -> dict[str, torch.Tensor]:
    """A part's parameters by their model paths (DDP prefixes them with ``module.``)."""
    found = {}
    for name, p in part.named_parameters(remove_duplicate=False):
        found[name.removeprefix("module.")] = p
    return found


def tied_grads(
    model_names: dict[str, list[str]], parts: list[nn.Module], mesh: Mesh, groups_cache: dict
) -> TiedGrads:
    """Which trainable parameters this rank's ``parts`` (pipeline stages, not yet wrapped)
    hold copies of, and a process group per parameter over the ranks holding a copy that agree
    on every mesh coordinate but the pipeline's. ``model_names``: every parameter's names
    (``parameter_names``); a parameter is a copy where two parts, here or on other pipeline
    ranks, hold it. Collective: every rank calls it.

    Copies on stages of different TP or DP degrees (``Mesh.stage_tp``, ``stage_dp``) hold
    different shards or replicas, which no sum over matching coordinates adds up: refused in
    one line (``_refuse_split_ties``)."""
    canonical = {name: key for key, names in model_names.items() for name in names}
    held: dict[str, list[tuple[int, str]]] = {}
    for i, part in enumerate(parts):
        for name, p in part.named_parameters(remove_duplicate=False):
            key = canonical.get(name)
            if key is not None and p.requires_grad and all(j != i for j, _ in held.get(key, [])):
                held.setdefault(key, []).append((i, name))  # one name per part and tensor
    _, *coords = mesh.coords(dist.get_rank())
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (dist.get_rank(), tuple(coords), sorted(held)))
    _refuse_split_ties(everyone, mesh)
    result = TiedGrads(names={k: v for k, v in held.items() if len(v) > 1})
    for key in sorted({k for _, _, keys in everyone for k in keys}):
        for rest in sorted({c for _, c, _ in everyone}):
            members = sorted({r for r, c, keys in everyone if c == rest and key in keys})
            if len(members) < 2:
                continue
            group_key = ("tied", tuple(members))
            if group_key not in groups_cache:
                groups_cache[group_key] = dist.new_group(members)
            if dist.get_rank() in members:
                result.groups[key] = groups_cache[group_key]
                result.names[key] = held[key]
    return result


def _refuse_split_ties(everyone: list, mesh: Mesh) -> None:
    """One line where a tied weight sits on stages of different TP or DP degrees.
    ``everyone``: (rank, coordinates, names held) of every rank."""
    for axis, degree in (("TP", mesh.tp_of), ("DP", mesh.dp_of)):
        degrees: dict[str, set[int]] = {}
        for r, _, keys in everyone:
            for key in keys:
                degrees.setdefault(key, set()).add(degree(mesh.coords(r)[0]))
        split = sorted(k for k, found in degrees.items() if len(found) > 1)
        if split:
            raise UserInputError(
                f"tied weight {split[0]} sits on pipeline stages of {axis} degrees "
                f"{sorted(degrees[split[0]])}: their copies differ, so their gradients cannot "
                f"be summed; plan again with one {axis} degree on the stages that share it"
            )
