"""One trace per distinct block: a model whose layers repeat is exported with a few of them,
and the op graph of the rest is written from those, as the full trace would have made it.

torch.export walks the model's Python op by op: a 126-layer model costs 126 layers of tracing,
though its layers are one block written 126 times. Here:

1. ``find_repeats`` runs the model once eagerly on the meta device (cheap: no tracer) and
   fingerprints every op of each member of a repeated container (``ModuleList`` or
   ``Sequential``): the op, its arguments' shapes, dtypes and values, and where each tensor
   came from (an op of the same member, of a member so many before, outside the container, or
   a parameter named relative to the member). A container whose members' fingerprints repeat
   with some period after a few irregular ones (a first layer reading the embedding; MoE every
   other layer; five sliding-window layers to one global) is a ``Repeat``; a member whose
   forward depends on its index in another way shows up as a fingerprint off the period, and
   the container is traced in full.
2. The model is exported with each such container cut to its first ``kept`` members: the
   irregular ones and three periods. The cut model's eager fingerprints must equal the full
   model's (the code after the container ran the same ops on the same shapes), else the
   trace is the full one.
3. ``expand`` writes the missing members from the last traced period: op names advance as
   torch.fx numbers them (each name's counter by what one period adds, checked to be the same
   between the traced periods), module paths and parameter names move to the member's index,
   edges to the previous period move with them, and the ops after the container are renumbered
   past the inserted ones. The third traced period must equal the second so shifted (every
   attribute and edge), which is what makes the written copies the full trace's.

Anything unexpected (a member called twice or not through ``__call__``, code between members,
an op after the container reading a member other than the last period) raises ``NotPeriodic``
and the caller traces the model in full: the result is the full trace or an error, never a
different graph. ``MESHPLAN_FULL_TRACE=1`` forces the full trace (the equivalence tests
compare both).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from planner.trace.graph import OpGraph

FULL_TRACE_ENV = "MESHPLAN_FULL_TRACE"
MIN_SAVED = 2  # members a cut must save to be worth a second eager run
_SUFFIX = re.compile(r"(.*)_(\d+)$")  # torch.fx's name suffix (Graph's _Namespace)


class NotPeriodic(Exception):
    """The graph does not repeat as the fingerprints said: trace the model in full."""


@dataclass(frozen=True)
class Repeat:
    """A container whose members repeat: ``start`` irregular members, then a period of
    ``period`` members over and over up to ``count``; traced with its first ``kept``."""

    path: str
    count: int
    start: int
    period: int

    @property
    def kept(self) -> int:
        return self.start + 3 * self.period


def full_trace_forced() -> bool:
    return os.environ.get(FULL_TRACE_ENV, "") not in ("", "0")


# --------------------------------------------------------------------------- fingerprints


def _containers(model: torch.nn.Module) -> dict[str, list[torch.nn.Module]]:
    """The outermost ModuleLists and Sequentials with two or more members, by path."""
    found: dict[str, list[torch.nn.Module]] = {}
    for name, m in model.named_modules():
        if not isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential)) or len(m) < 2:
            continue
        if any(name == p or name.startswith(p + ".") for p in found if p) or "" in found:
            continue
        found[name] = list(m._modules.values())
    return found


class _Recorder(TorchDispatchMode):
    """Each op's fingerprint, labelled with the container member running it."""

    def __init__(self, names: dict[int, str]) -> None:
        super().__init__()
        self.names = names  # id(parameter or buffer) -> its name
        self.member: tuple[str, int] | None = None
        self.member_prefix = ""
        self.records: list[tuple[tuple[str, int] | None, tuple]] = []
        self.producer: dict[int, tuple[tuple[str, int] | None, int]] = {}
        self.count: dict[tuple[str, int] | None, int] = {}
        self.keep: list[Any] = []
        self.pure: dict[Any, bool] = {}
        self.made: dict[tuple, tuple[bool, list]] = {}

    def _ref(self, t: torch.Tensor) -> tuple:
        where = self.producer.get(id(t))
        if where is not None:
            label, local = where
            return ("op", label, local)
        name = self.names.get(id(t))
        if name is not None:
            prefix = self.member_prefix
            if prefix and name.startswith(prefix + "."):
                return ("own", name[len(prefix) :])
            return ("state", name)
        return ("x", tuple(t.shape), str(t.dtype))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        flat = _leaves((args, kwargs))
        parts = []
        for a in flat:
            if isinstance(a, torch.Tensor):
                parts.append((self._ref(a), tuple(a.shape), str(a.dtype)))
            else:
                parts.append(repr(a))
        out = self._run(func, args, kwargs, flat, parts)
        outs = _leaves(out)
        shapes = tuple(tuple(o.shape) for o in outs if isinstance(o, torch.Tensor))
        label = self.member
        local = self.count.get(label, 0)
        self.count[label] = local + 1
        for o in outs:
            if isinstance(o, torch.Tensor):
                self.producer[id(o)] = (label, local)
                self.keep.append(o)
        self.records.append((label, (str(func), tuple(parts), shapes)))
        return out

    def _run(self, func: Any, args: tuple, kwargs: dict, flat: list, parts: list) -> Any:
        """``func``'s result; for a pure op (no mutation, no alias) on meta tensors, made from
        the result it gave the same shapes before: the meta kernels run in Python (torch's
        refs), and a model of 80 identical layers asks each the same question 80 times."""
        if func not in self.pure:
            schema = func._schema
            self.pure[func] = not schema.is_mutable and not any(
                r.alias_info is not None or str(r.type) != "Tensor" for r in schema.returns
            )
        if not self.pure[func] or not all(
            a.device.type == "meta" for a in flat if isinstance(a, torch.Tensor)
        ):
            return func(*args, **kwargs)
        key = (
            func,
            tuple(
                (p[1], a.stride(), p[2]) if isinstance(a, torch.Tensor) else p
                for a, p in zip(flat, parts)
            ),
        )
        made = self.made.get(key)
        if made is None:
            out = func(*args, **kwargs)
            outs = out if isinstance(out, tuple) else (out,)
            self.made[key] = (
                isinstance(out, tuple),
                [(o.shape, o.stride(), o.dtype) for o in outs],
            )
            return out
        many, specs = made
        outs = tuple(
            torch.empty_strided(shape, stride, dtype=dtype, device="meta")
            for shape, stride, dtype in specs
        )
        return outs if many else outs[0]


def _leaves(tree: Any) -> list:
    """The leaves of an op's arguments or results (tuples, lists and dicts of them)."""
    if isinstance(tree, (tuple, list)):
        return [leaf for x in tree for leaf in _leaves(x)]
    if isinstance(tree, dict):
        return [leaf for x in tree.values() for leaf in _leaves(x)]
    return [tree]


def _record(
    model: torch.nn.Module, containers: dict[str, list[torch.nn.Module]], run: Callable
) -> _Recorder:
    """Run ``run()`` (the model's forward) under the recorder, members labelled."""
    names: dict[int, str] = {}
    for n, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers()]:
        names.setdefault(id(t), n)
    rec = _Recorder(names)
    handles = []
    calls: dict[tuple[str, int], int] = {}

    def hooks(path: str, k: int) -> None:
        prefix = f"{path}.{k}" if path else str(k)

        def enter(_m: torch.nn.Module, _args: tuple) -> None:
            if rec.member is None:
                rec.member, rec.member_prefix = (path, k), prefix
                calls[(path, k)] = calls.get((path, k), 0) + 1

        def leave(_m: torch.nn.Module, _args: tuple, _out: Any) -> None:
            if rec.member == (path, k):
                rec.member, rec.member_prefix = None, ""

        handles.append(members[k].register_forward_pre_hook(enter))
        handles.append(members[k].register_forward_hook(leave))

    for path, members in containers.items():
        for k in range(len(members)):
            hooks(path, k)
    try:
        with rec:
            run()
    finally:
        for h in handles:
            h.remove()
    rec.calls = calls  # type: ignore[attr-defined]
    return rec


def _relative(rec: _Recorder, sizes: dict[str, int]) -> tuple[list, dict[str, list[list]]]:
    """The records with producers made comparable: (ops outside the containers, in order;
    each container's members' ops). An op of member k reading member j of its container
    keeps ``("mem", j, op)`` (``_encoded`` makes it relative for a period); any other op
    reading a member refers to "so many from the container's end", which is what a cut
    container keeps."""
    outside: list = []
    members: dict[str, list[list]] = {p: [[] for _ in range(n)] for p, n in sizes.items()}

    def fix(part: Any, label: tuple[str, int] | None) -> Any:
        if not (isinstance(part, tuple) and part and isinstance(part[0], tuple)):
            return part
        ref = part[0]
        if ref[0] != "op" or ref[1] is None:
            return part
        (path, j), local = ref[1], ref[2]
        if label is not None and label[0] == path:
            return (("mem", j, local), *part[1:])
        return (("end", path, sizes[path] - 1 - j, local), *part[1:])

    for label, (op, parts, shapes) in rec.records:
        record = (op, tuple(fix(p, label) for p in parts), shapes)
        if label is None:
            outside.append(record)
        else:
            members[label[0]][label[1]].append(record)
    return outside, members


def _encoded(prints: list[list], p: int) -> list[int]:
    """Each member's fingerprint for period ``p``, as an id (equal members, equal ids): a
    read of a member at most a period back is relative ("the member k - j before"), one
    further back absolute (T5's position bias, made by the first layer for all of them),
    as the expansion writes them."""
    ids: dict[Any, int] = {}
    out = []
    for k, records in enumerate(prints):
        key = []
        for op, parts, shapes in records:
            fixed = tuple(
                (("back", k - r[1], r[2]) if k - r[1] <= p else r, *part[1:])
                if isinstance(part, tuple)
                and part
                and isinstance((r := part[0]), tuple)
                and r[0] == "mem"
                else part
                for part in parts
            )
            key.append((op, fixed, shapes))
        out.append(ids.setdefault(tuple(key), len(ids)))
    return out


def _contiguous(rec: _Recorder, path: str, count: int) -> bool:
    """Whether the members ran once each, in order, with nothing between them."""
    labels = [label for label, _ in rec.records]
    mine = [i for i, label in enumerate(labels) if label is not None and label[0] == path]
    if not mine or any(rec.calls.get((path, k)) != 1 for k in range(count)):  # type: ignore[attr-defined]
        return False
    seen = [labels[i][1] for i in range(mine[0], mine[-1] + 1) if labels[i] is not None]
    if len(seen) != mine[-1] - mine[0] + 1 or any(b < a for a, b in zip(seen, seen[1:])):
        return False
    return sorted(set(seen)) == list(range(count))


def _period(prints: list[list]) -> tuple[int, int] | None:
    """(start, period) of the shortest cut after which every member repeats the one a period
    before it, whole periods to the end; None where no cut saves ``MIN_SAVED`` members."""
    n = len(prints)
    best: tuple[int, int] | None = None
    for p in range(1, n // 3 + 1):
        if best is not None and 3 * p >= best[0] + 3 * best[1]:
            break
        same = _encoded(prints, p)
        s = next((s for s in range(n) if all(same[k] == same[k - p] for k in range(s + p, n))), n)
        s += (n - s) % p  # the copies are whole periods
        kept = s + 3 * p
        if n - kept >= MIN_SAVED and (best is None or kept < best[0] + 3 * best[1]):
            best = (s, p)
    return best


@contextlib.contextmanager
def cut(model: torch.nn.Module, repeats: list[Repeat]) -> Iterator[None]:
    """The model with each repeated container holding only its first ``kept`` members."""
    saved = []
    for r in repeats:
        container = model.get_submodule(r.path)
        saved.append((container, container._modules))
        container._modules = dict(list(container._modules.items())[: r.kept])
    try:
        yield
    finally:
        for container, modules in saved:
            container._modules = modules


def find_repeats(model: torch.nn.Module, run: Callable[[], Any]) -> list[Repeat]:
    """The containers worth cutting, checked: ``run()`` runs ``model``'s forward eagerly, once
    on the model and once cut; both must agree on everything the cut keeps."""
    containers = _containers(model)
    if not containers:
        return []
    full = _record(model, containers, run)
    sizes = {p: len(m) for p, m in containers.items()}
    outside, members = _relative(full, sizes)
    repeats = []
    for path, prints in members.items():
        if not _contiguous(full, path, sizes[path]):
            continue
        found = _period(prints)
        if found is not None:
            repeats.append(Repeat(path, sizes[path], *found))
    if not repeats:
        return []
    with cut(model, repeats):
        kept = {
            p: (m[: r.kept] if (r := _repeat(repeats, p)) else m) for p, m in containers.items()
        }
        small = _record(model, kept, run)
    small_sizes = {p: len(m) for p, m in kept.items()}
    # "from the end" counts in the cut container: the last period stands for the last one
    small_outside, small_members = _relative(small, small_sizes)
    if small_outside != outside:
        return []
    for path, prints in small_members.items():
        if prints != members[path][: len(prints)]:
            return []
    return repeats


def _repeat(repeats: list[Repeat], path: str) -> Repeat | None:
    return next((r for r in repeats if r.path == path), None)


# --------------------------------------------------------------------------- expansion


def _split(name: str) -> tuple[str, int]:
    m = _SUFFIX.match(name)
    return (m.group(1), int(m.group(2))) if m else (name, 0)


def _join(base: str, num: int) -> str:
    return f"{base}_{num}" if num else base


def _member_index(module: str, path: str) -> int | None:
    head = f"{path}." if path else ""
    if not module.startswith(head):
        return None
    rest = module[len(head) :].split(".", 1)[0]
    return int(rest) if rest.isdigit() else None


def _move_path(name: str, path: str, shift: int) -> str:
    """``path.k...`` -> ``path.(k + shift)...``; other names unchanged."""
    k = _member_index(name, path)
    if k is None:
        return name
    head = f"{path}." if path else ""
    tail = name[len(head) + len(str(k)) :]
    return f"{head}{k + shift}{tail}"


class _Renamer:
    """Names and paths of one written copy (``t`` periods after the template)."""

    def __init__(
        self, nodes: dict[str, str], delta: dict[str, int], path: str, members: int, t: int
    ) -> None:
        self.nodes = nodes  # node name -> its new name
        self.delta, self.path, self.members, self.t = delta, path, members, t

    def node(self, name: str | None) -> str | None:
        return None if name is None else self.nodes.get(name, name)

    def fqn(self, name: str) -> str:
        return _move_path(name, self.path, self.members)

    def args(self, a: Any) -> Any:
        if isinstance(a, dict):
            if "node" in a and len(a) == 1:
                return {"node": self.node(a["node"])}
            if "param" in a:
                return {**a, "param": self.fqn(a["param"])}
            if "buffer" in a:
                return {**a, "buffer": self.fqn(a["buffer"])}
            return {k: self.args(v) for k, v in a.items()}
        if isinstance(a, list):
            return [self.args(v) for v in a]
        return a

    def attrs(self, d: dict, order: int) -> dict:
        out = dict(d)
        out["order"] = order
        out["module"] = self.fqn(d["module"])
        out["params"] = [self.fqn(p) for p in d["params"]]
        out["args"] = self.args(d["args"])
        out["saved"] = [[self.node(p), b] for p, b in d["saved"]]
        return out


def expand(graph: OpGraph, r: Repeat) -> OpGraph:
    """``graph`` (traced with ``r`` cut to ``r.kept`` members) as traced with all of them.

    Long because it is one pass that checks the periods and writes the copies and the ops
    after them together (the checks and the writing share the period's correspondence)."""
    ops = sorted(graph.nodes, key=lambda n: graph.nodes[n]["order"])
    member = [_member_index(graph.nodes[n]["module"], r.path) for n in ops]
    inside = [i for i, k in enumerate(member) if k is not None and k < r.kept]
    if not inside or inside != list(range(inside[0], inside[-1] + 1)):
        raise NotPeriodic(f"{r.path}: ops between its members")
    run = member[inside[0] : inside[-1] + 1]
    if any(b < a for a, b in zip(run, run[1:])):
        raise NotPeriodic(f"{r.path}: members out of order")
    periods = [
        [
            ops[i]
            for i in inside
            if r.start + j * r.period <= member[i] < r.start + (j + 1) * r.period
        ]
        for j in range(3)
    ]
    if not periods[0] or len({len(p) for p in periods}) != 1:
        raise NotPeriodic(f"{r.path}: periods of different lengths")
    delta: dict[str, int] = {}
    for a, b, c in zip(*periods):
        (ba, na), (bb, nb), (bc, nc) = _split(a), _split(b), _split(c)
        if not (ba == bb == bc) or nb - na != nc - nb or delta.setdefault(ba, nb - na) != nb - na:
            raise NotPeriodic(f"{r.path}: op names do not advance evenly ({a}, {b}, {c})")
    template, previous = periods[2], periods[1]
    in_template, in_previous = set(template), set(previous)
    earlier = {ops[i] for i in inside} - in_template - in_previous

    def shifted(name: str, t: int) -> str:
        base, num = _split(name)
        return _join(base, num + t * delta[base])

    # the check: the third period is the second moved by one period
    back = _Renamer({n: shifted(n, -1) for n in template + previous}, delta, r.path, -r.period, -1)
    for c, b in zip(template, previous):
        if back.attrs(graph.nodes[c], graph.nodes[b]["order"]) != graph.nodes[b]:
            raise NotPeriodic(f"{r.path}: {c} is not {b} one period on")
        preds = [(back.node(u), graph.edges[u, c]["bytes"]) for u in graph.pred[c]]
        if preds != [(u, graph.edges[u, b]["bytes"]) for u in graph.pred[b]]:
            raise NotPeriodic(f"{r.path}: {c}'s inputs are not {b}'s one period on")
    copies = (r.count - r.kept) // r.period
    after = ops[inside[-1] + 1 :]
    added = copies * len(template)
    last = _Renamer(
        {n: shifted(n, copies) for n in template + previous}
        | {n: shifted(n, copies) if _split(n)[0] in delta else n for n in after},
        delta,
        r.path,
        copies * r.period,
        copies,
    )
    for n in after:
        if any(u in earlier for u in graph.pred[n]):
            raise NotPeriodic(f"{r.path}: {n} reads a member before the last two periods")
    out = OpGraph()
    out.graph.update(graph.graph)

    def add(name: str, attrs: dict, preds: list[tuple[str, int]]) -> None:
        out.add_node(name, **attrs)
        for u, nbytes in preds:
            out.add_edge(u, name, bytes=nbytes)

    for n in ops[: inside[-1] + 1]:
        add(n, graph.nodes[n], [(u, graph.edges[u, n]["bytes"]) for u in graph.pred[n]])
    for t in range(1, copies + 1):
        names = {n: shifted(n, t) for n in template + previous}
        ren = _Renamer(names, delta, r.path, t * r.period, t)
        for n in template:
            d = graph.nodes[n]
            preds = [(ren.node(u), graph.edges[u, n]["bytes"]) for u in graph.pred[n]]
            add(ren.node(n), ren.attrs(d, d["order"] + t * len(template)), preds)
    for n in after:
        d = graph.nodes[n]
        attrs = dict(d)
        attrs.update(
            order=d["order"] + added,
            args=last.args(d["args"]),
            saved=[[last.node(p), b] for p, b in d["saved"]],
        )
        preds = [(last.node(u), graph.edges[u, n]["bytes"]) for u in graph.pred[n]]
        add(last.node(n), attrs, preds)
    out.graph["outputs"] = [last.node(n) for n in graph.graph.get("outputs", [])]
    out.graph["unread_params"] = _copied_names(graph.graph.get("unread_params", []), r, copies)
    return out


def _copied_names(names: list[str], r: Repeat, copies: int) -> list[str]:
    """``names`` with those of the template period's members written for every copy."""
    found = set(names)
    for name in names:
        k = _member_index(name, r.path)
        if k is not None and k >= r.kept - r.period:
            found.update(_move_path(name, r.path, t * r.period) for t in range(1, copies + 1))
    return sorted(found)


def copied_modules(names: set[str], repeats: list[Repeat]) -> set[str]:
    """Module paths seen in the cut model, with the template period's written for every copy
    (the modules whose forward ran, for ``direct_forwards``)."""
    found = set(names)
    for r in repeats:
        copies = (r.count - r.kept) // r.period
        for name in list(found):
            k = _member_index(name, r.path)
            if k is not None and r.kept - r.period <= k < r.kept:
                found.update(_move_path(name, r.path, t * r.period) for t in range(1, copies + 1))
    return found


def copied_state(names: list[str], repeats: list[Repeat]) -> list[str]:
    """Parameter or buffer names of the cut model, template period's written for every copy."""
    return sorted(copied_modules(set(names), repeats))
