"""Group an OpGraph's ops into the ordered blocks the solver places.

The rule follows the module tree, not model-specific names:

* a container (``ModuleList``/``Sequential``/``ModuleDict``) with two or more children makes each
  child a block ("members": transformer layers, MLP layers, ResNet stages);
* a module holding such a container is opened up, so its other children become blocks too
  (embeddings, final norm, head);
* consecutive non-member blocks merge (``wte+wpe+drop``), and a parameter-free member merges into
  the member before it (``Linear`` + ``ReLU`` in a plain ``Sequential``);
* ops outside every block (top-level functional code) join the block that ran just before them;
* a model without any container is split at its top-level children.

Identical blocks share a structural hash (ops, relative module paths, shapes, dtypes, parameter
shapes), so the solver works on a handful of classes however deep the model is.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

import networkx as nx

from planner.trace.graph import core_nodes, core_of
from planner.trace.opcost import MATMUL_OPS, is_grouped_mm, is_view


@dataclass
class Block:
    index: int
    name: str
    modules: list[str]
    cls: str  # structural hash prefix: equal for identical blocks
    label: str  # a readable class name (module type of the block, or the block's name)
    nodes: list[str]
    params: int  # parameters this block owns (tied parameters counted once, at first use)
    param_names: list[str]
    fwd_flops: int
    bwd_flops: int
    fwd_bytes: int
    bwd_bytes: int
    saved_bytes: int  # kept for backward with no recompute
    saved_selective_bytes: int  # kept when the attention-like core is recomputed
    input_bytes: int  # activations entering the block
    output_bytes: int  # activations leaving the block
    boundary_bytes: int  # activations live across a pipeline cut right after this block
    transient_bytes: int  # working memory of the block's largest op
    member: bool = False  # a child of a repeated container
    extra: dict = field(default_factory=dict)
    # parameters this block reads that an earlier block owns (tied weights, e.g. an output
    # projection that is the token embedding): canonical name -> elements
    tied: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def make_blocks(graph: nx.DiGraph) -> list[Block]:
    """Blocks in execution order, with per-block totals for one traced micro-batch."""
    modules: dict[str, str] = graph.graph["modules"]
    containers = set(graph.graph.get("containers", []))
    units, members = _units(modules, containers)
    ops = sorted(graph.nodes, key=lambda n: graph.nodes[n]["order"])
    unit_of_op = _assign_ops(graph, ops, units)
    groups = _merge(units, members, unit_of_op, ops, graph)
    block_of = {n: i for i, g in enumerate(groups) for n in g["nodes"]}
    owners = _param_blocks(graph, groups, block_of)
    core = core_nodes(graph)
    boundary = _boundary_bytes(graph, block_of, len(groups))
    blocks: list[Block] = []
    for i, g in enumerate(groups):
        nodes = g["nodes"]
        data = [graph.nodes[n] for n in nodes]
        names = sorted(p for p, b in owners.items() if b == i)
        shapes = graph.graph["param_shapes"]
        saved = [(prod, b) for d in data for prod, b in d["saved"]]
        in_bytes, out_bytes = _io_bytes(graph, nodes, block_of, i)
        blocks.append(
            Block(
                index=i,
                name=g["name"],
                modules=g["modules"],
                cls=_structural_hash(graph, nodes, g["modules"]),
                label=g["label"],
                nodes=nodes,
                params=sum(_numel(shapes[p]) for p in names),
                param_names=names,
                fwd_flops=sum(d["fwd_flops"] for d in data),
                bwd_flops=sum(d["bwd_flops"] for d in data),
                fwd_bytes=sum(d["fwd_bytes"] for d in data),
                bwd_bytes=sum(d["bwd_bytes"] for d in data),
                saved_bytes=sum(b for _, b in saved),
                saved_selective_bytes=sum(b for p, b in saved if p not in core),
                input_bytes=in_bytes,
                output_bytes=out_bytes,
                boundary_bytes=boundary[i],
                transient_bytes=max((d["fwd_bytes"] for d in data), default=0),
                member=g["member"],
                extra=_moe(graph, nodes, names),
                tied={
                    p: _numel(shapes[p])
                    for p in sorted(_read_params(graph, nodes))
                    if owners.get(p, i) != i
                },
            )
        )
    _name_classes(blocks)
    return blocks


def cached_core_nodes(graph: nx.DiGraph) -> set[str]:
    """``core_nodes`` once per OpGraph (the cost model, the sharding ILP and the search ask)."""
    return core_of(graph)


def in_modules(path: str, fqns) -> bool:
    """Whether module ``path`` is one of ``fqns`` or inside one."""
    return any(path == f or path.startswith(f + ".") for f in fqns)


def _moe(graph: nx.DiGraph, nodes: list[str], param_names: list[str]) -> dict:
    """A mixture-of-experts layer inside the block: its expert modules (trace's
    ``expert_modules``), expert count, parameters, and the rows the experts receive per traced
    micro-batch (tokens x top-k: the grouped product's rows, else the router's top-k indices)
    with their width, which is what an expert-parallel all-to-all moves."""
    experts = {
        fqn: info
        for fqn, info in graph.graph.get("experts", {}).items()
        if any(p.startswith(fqn + ".") for p in param_names)
    }
    if not experts:
        return {}
    rows = width = top_k = 0
    for n in nodes:
        d = graph.nodes[n]
        inside = in_modules(d["module"], experts)
        if d["op"] == "aten.topk.default" and not top_k and d["shapes"][0]:
            top_k = int(d["shapes"][0][-1])
            tokens = _numel(d["shapes"][0]) // max(top_k, 1)
        if inside and is_grouped_mm(d["op"]) and not rows:
            rows = int(d["shapes"][0][0])
            width = int((d.get("mm_inner") or [0])[0])
    if not rows and top_k:
        rows = tokens * top_k
    if not rows or not width:
        return {}
    return {
        "moe": {
            "modules": sorted(experts),
            "num_experts": min(i["num_experts"] for i in experts.values()),
            "expert_params": sum(i["params"] for i in experts.values()),
            "top_k": top_k or 1,
            "routed_rows": rows,
            "width": width,
        }
    }


# --------------------------------------------------------------------------- module tree


def _children(modules: dict[str, str]) -> dict[str, list[str]]:
    kids: dict[str, list[str]] = {name: [] for name in modules}
    for name in modules:
        if name:
            parent = name.rpartition(".")[0]
            kids.setdefault(parent, []).append(name)
    return kids


def _units(modules: dict[str, str], containers: set[str]) -> tuple[list[str], set[str]]:
    kids = _children(modules)
    is_list = {m for m in containers if len(kids.get(m, [])) >= 2}
    holds_list: dict[str, bool] = {}

    def holds(path: str) -> bool:  # a repeated container strictly below path
        if path not in holds_list:
            holds_list[path] = any(k in is_list or holds(k) for k in kids.get(path, []))
        return holds_list[path]

    members: set[str] = set()

    def walk(path: str) -> list[str]:
        out: list[str] = []
        for k in kids.get(path, []):
            if path in is_list:
                members.add(k)
            out.extend(walk(k) if (holds(k) or (k in is_list and path not in is_list)) else [k])
        return out

    if "" in is_list or holds(""):
        units = walk("")
    else:
        # No repeated container (an LSTM language model: embedding, LSTM, head): the top-level
        # children are the members, so a pipeline can cut between them and ZeRO-3 gathers one
        # at a time (merged as non-members they were one block).
        units = kids.get("", []) or [""]
        members.update(u for u in units if u)
    return units, members


def _assign_ops(graph: nx.DiGraph, ops: list[str], units: list[str]) -> dict[str, str | None]:
    by_len = sorted(units, key=len, reverse=True)

    def unit_for(path: str) -> str | None:
        for u in by_len:
            if u == "" or path == u or path.startswith(u + "."):
                return u
        return None

    result: dict[str, str | None] = {}
    last: str | None = None
    pending: list[str] = []
    for n in ops:
        u = unit_for(graph.nodes[n]["module"]) if graph.nodes[n]["op"] != "input" else None
        if u is None:
            if last is None:
                pending.append(n)  # before any block ran: joins the first block
            result[n] = last
            continue
        if last is None:
            for p in pending:
                result[p] = u
        result[n] = last = u
    if last is None:  # no op ran in a unit: the root's own code uses its children's weights
        result.update(dict.fromkeys(pending, ""))  # (F.linear on self.fc.weight): one block
    return result


def _merge(
    units: list[str],
    members: set[str],
    unit_of_op: dict[str, str | None],
    ops: list[str],
    graph: nx.DiGraph,
) -> list[dict]:
    by_unit: dict[str, list[str]] = {}
    for n in ops:
        u = unit_of_op.get(n)
        if u is not None:
            by_unit.setdefault(u, []).append(n)
    ordered = sorted(by_unit, key=lambda u: graph.nodes[by_unit[u][0]]["order"])
    has_params = {u: any(graph.nodes[n]["params"] for n in by_unit[u]) for u in ordered}
    modules = graph.graph["modules"]
    groups: list[dict] = []
    for u in ordered:
        member = u in members
        prev = groups[-1] if groups else None
        if prev is not None and (
            (not member and not prev["member"])
            or (member and prev["member"] and not has_params[u] and _parent(u) == prev["parent"])
        ):
            prev["modules"].append(u)
            prev["nodes"].extend(by_unit[u])
            continue
        groups.append(
            {
                "modules": [u],
                "nodes": list(by_unit[u]),
                "member": member,
                "parent": _parent(u),
                "label": modules.get(u, "Model") if member else "",
            }
        )
    # a parameter-free first member (nothing before it to join) joins the member after it
    for g in groups:
        g["nodes"].sort(key=lambda n: graph.nodes[n]["order"])
        g["name"] = "+".join(m or "model" for m in g["modules"])
        if len(g["name"]) > 48:
            g["name"] = f"{g['modules'][0]}..{g['modules'][-1]}"
        if not g["label"]:
            g["label"] = g["name"]
    return groups


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


# --------------------------------------------------------------------------- per-block facts


def _read_params(graph: nx.DiGraph, nodes: list[str]) -> set[str]:
    """Canonical names of the parameters ``nodes`` read."""
    alias: dict[str, str] = graph.graph["param_owner"]
    return {alias.get(p, p) for n in nodes for p in graph.nodes[n]["params"]}


def product_params(graph: nx.DiGraph, nodes: list[str]) -> set[str]:
    """Canonical names of the parameters ``nodes`` multiply as a product's weight (a linear's
    weight, or a view of a parameter fed to a matmul), as opposed to those read by lookups,
    norms and element-wise ops: the weights whose gradient a weight-gradient GEMM writes."""
    alias: dict[str, str] = graph.graph["param_owner"]
    viewed: dict[str, set[str]] = {}  # view node -> the parameters it shows
    found: set[str] = set()
    for n in sorted(nodes, key=lambda n: graph.nodes[n]["order"]):
        d = graph.nodes[n]
        read = {alias.get(p, p) for p in d["params"]}
        for u in graph.predecessors(n):
            read |= viewed.get(u, set())
        if is_view(d["op"]) and read:
            viewed[n] = read
        elif d["op"] in MATMUL_OPS or is_grouped_mm(d["op"]):
            found |= read
    return found


def product_share(graph: nx.DiGraph, block: Block) -> float:
    """The share of the parameters ``block`` owns that its products multiply as weights
    (``product_params``); 0 for a block without parameters."""
    if not block.params:
        return 0.0
    shapes = graph.graph["param_shapes"]
    owned = set(block.param_names)
    found = product_params(graph, block.nodes) & owned
    return sum(_numel(shapes[p]) for p in found) / block.params


def _param_blocks(graph: nx.DiGraph, groups: list[dict], block_of: dict[str, int]) -> dict:
    """Canonical parameter -> the block that first uses it (tied weights: the first user)."""
    alias: dict[str, str] = graph.graph["param_owner"]
    owner: dict[str, int] = {}
    for n in sorted(graph.nodes, key=lambda n: graph.nodes[n]["order"]):
        for p in graph.nodes[n]["params"]:
            owner.setdefault(alias.get(p, p), block_of.get(n, 0))
    # parameters no op touched stay with the block whose modules hold them
    for p in graph.graph["param_shapes"]:
        if p not in owner:
            owner[p] = next(
                (
                    i
                    for i, g in enumerate(groups)
                    for m in g["modules"]
                    if m == "" or p.startswith(m + ".")
                ),
                0,
            )
    return owner


def _boundary_bytes(graph: nx.DiGraph, block_of: dict[str, int], count: int) -> list[int]:
    """Bytes of tensors produced at or before block i and consumed after it, per cut."""
    cut = [0] * count
    for u in graph.nodes:
        consumers = [block_of[v] for v in graph.successors(u) if v in block_of]
        src = block_of.get(u, 0)
        last = max(consumers, default=src)
        if last <= src:
            continue
        nbytes = max(graph.edges[u, v]["bytes"] for v in graph.successors(u))
        for i in range(src, last):
            cut[i] += nbytes
    return cut


def _io_bytes(graph: nx.DiGraph, nodes: list[str], block_of: dict, i: int) -> tuple[int, int]:
    inside = set(nodes)
    in_bytes = 0
    seen: set[str] = set()
    for n in nodes:
        for u in graph.predecessors(n):
            if u not in inside and u not in seen:
                seen.add(u)
                if _shared_constant(graph, u, block_of):
                    continue
                in_bytes += graph.edges[u, n]["bytes"]
    out_bytes = 0
    outputs = set(graph.graph.get("outputs", []))
    for n in nodes:
        external = [v for v in graph.successors(n) if v not in inside]
        if external:
            out_bytes += max(graph.edges[n, v]["bytes"] for v in external)
        elif n in outputs:
            out_bytes += graph.nodes[n]["out_bytes"] or _logical_bytes(graph, n)
    return in_bytes, out_bytes


def _shared_constant(graph: nx.DiGraph, u: str, block_of: dict) -> bool:
    """A tensor without gradient that several blocks read (an attention mask, rotary tables):
    it lives once for the whole step, not once per block that takes it in."""
    if graph.nodes[u].get("requires_grad", False):
        return False
    return len({block_of.get(v) for v in graph.successors(u)}) > 1


def _logical_bytes(graph: nx.DiGraph, n: str) -> int:
    succ = list(graph.successors(n))
    return graph.edges[n, succ[0]]["bytes"] if succ else 0


def _structural_hash(graph: nx.DiGraph, nodes: list[str], modules: list[str]) -> str:
    local = {n: i for i, n in enumerate(nodes)}
    prefix = modules[0]
    shapes = graph.graph["param_shapes"]
    alias = graph.graph["param_owner"]

    def rel(path: str) -> str:
        return path[len(prefix) :] if prefix and path.startswith(prefix) else path

    def norm(a: object) -> object:
        if isinstance(a, dict):
            if "node" in a and len(a) == 1:
                return ["n", local.get(a["node"], -1)]
            if "param" in a:
                return ["p", shapes.get(alias.get(a["param"], a["param"]))]
            if "buffer" in a or "const" in a:
                return ["b"]
            return {k: norm(v) for k, v in sorted(a.items())}
        if isinstance(a, list):
            return [norm(v) for v in a]
        return a

    items = []
    for n in nodes:
        d = graph.nodes[n]
        items.append([d["op"], rel(d["module"]), d["shapes"], d["dtypes"], norm(d["args"])])
    digest = hashlib.sha1(json.dumps(items, sort_keys=True, default=str).encode()).hexdigest()
    return digest[:12]


def _name_classes(blocks: list[Block]) -> None:
    """A class with several members keeps its module type as label; keep labels unique."""
    by_cls: dict[str, list[Block]] = {}
    for b in blocks:
        by_cls.setdefault(b.cls, []).append(b)
    used: dict[str, str] = {}
    for cls, members in by_cls.items():
        label = members[0].label
        if label in used and used[label] != cls:
            label = f"{label}#{cls[:4]}"
        used[label] = cls
        for b in members:
            b.label = label


def _numel(shape: list[int]) -> int:
    out = 1
    for d in shape:
        out *= int(d)
    return out


def reads_one_tensor(graph: nx.DiGraph, block: Block) -> bool:
    """Whether the block's ops read at most one tensor made outside it (its input: a GPT
    block's stream; an HF Llama decoder layer also reads the rotary tables and the mask)."""
    inside = set(block.nodes)
    made_outside = {u for n in block.nodes for u in graph.predecessors(n) if u not in inside}
    return len(made_outside) <= 1


def runs_eagerly_in_stage(graph: nx.DiGraph, block: Block) -> bool:
    """Whether a pipeline stage of meshplan's runtime runs the block as the model's eager code
    (``runtime.stages``), where sequence parallelism can slice it: a block handed one tensor
    is swapped back by that tensor, and one module handed several whose call leaves one
    tensor (an HF Llama decoder layer: the stream, the rotary tables, the mask) by the call
    signature the stage's export keeps (``runtime.block_calls``). Any other block runs as the
    traced code of its stage, whose shapes are fixed."""
    if reads_one_tensor(graph, block):
        return True
    inside = set(block.nodes)
    leaving = {n for n in block.nodes if any(s not in inside for s in graph.successors(n))}
    return len(block.modules) == 1 and len(leaving) <= 1
