"""Read a recommendation model into table blocks and a dense part, without tracing.

torch.export cannot follow a KeyedJaggedTensor through TorchRec's lookups, and it does not need
to: a table is fully described by its config (rows, width, the features it serves) and by two
statistics of its ids — the mean ids per sample (pooling factor) and how skewed they are (the
exponent of a Zipf law over the rows). The model file gives both through the optional
``embedding_stats()``; without it the pooling factor is measured on one ``make_batch`` sample
and the ids are taken as uniform (Zipf 0, the conservative choice for caching). The dense part
(everything outside the EmbeddingBagCollections) is priced by its ``nn.Linear`` products.

TorchRec is imported only after the model file has shown it uses it (``uses_torchrec``).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field, replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from planner.errors import UserInputError
from planner.modelfile import ModelFile

STATS_SAMPLE = 256  # samples of make_batch read to measure pooling factors


@dataclass(frozen=True)
class TableBlock:
    """One embedding table: what the cost model prices."""

    name: str
    module: str  # FQN of the EmbeddingBagCollection that owns it
    features: tuple[str, ...]
    rows: int
    dim: int
    pooling_factor: float  # mean ids per sample, over its features together
    zipf: float  # exponent s of P(k-th hottest row) ~ k^-s; 0 = uniform

    @property
    def elements(self) -> int:
        return self.rows * self.dim


@dataclass
class RecModel:
    """The tables, and the dense part as parameters, forward FLOPs and activations per sample."""

    tables: list[TableBlock]
    dense_params: int
    dense_tensors: int
    dense_flops_per_sample: float  # forward; backward is twice
    dense_activations_per_sample: float  # elements of the Linear inputs autograd keeps
    notes: list[str] = field(default_factory=list)
    # eager ops of the dense part per step (views excluded), forward and backward: what each
    # costs in host dispatch where the profile prices it (CPUs; GPUs queue them ahead)
    dense_forward_ops: int = 0
    dense_backward_ops: int = 0
    # parameters of the largest child of the model outside the tables: ZeRO-3's unit (the
    # runtime's fully_shard wraps each such child), whole on a rank while it computes; 0 when
    # unknown, and then the whole dense part counts
    dense_unit_params: int = 0

    @property
    def embedding_params(self) -> int:
        return sum(t.elements for t in self.tables)


def uses_torchrec(mf: ModelFile) -> bool:
    """Whether the model file builds a TorchRec model; decided from its text first, so a
    transformer's file is never executed (nor TorchRec imported) to find out."""
    if "torchrec" not in mf.source:
        return False
    return bool(embedding_bag_collections(meta_model(mf)))


def meta_model(mf: ModelFile) -> torch.nn.Module:
    """``build_model()`` on the meta device, built once per loaded model file. Initializers
    are skipped: on meta tensors they compute nothing, yet each ``normal_`` goes through
    torch's reference implementation (about 10 ms a table, 5 s for 500 tables)."""
    cached = mf.__dict__.get("_meta_model")
    if cached is None:
        _ = mf.module  # import the file (and TorchRec) outside the meta device
        with torch.device("meta"), _skip_init():
            cached = mf.__dict__["_meta_model"] = mf.build()
    return cached


@contextlib.contextmanager
def _skip_init():
    """torch.nn.init's in-place initializers as no-ops while a meta model is built."""
    names = [n for n in dir(torch.nn.init) if n.endswith("_") and not n.startswith("_")]
    saved = {n: getattr(torch.nn.init, n) for n in names}
    try:
        for n in names:
            setattr(torch.nn.init, n, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for n, fn in saved.items():
            setattr(torch.nn.init, n, fn)


def embedding_bag_collections(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """FQN -> every EmbeddingBagCollection inside ``model`` (empty if TorchRec is not loaded)."""
    if "torchrec" not in sys.modules:
        return {}
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    return {n: m for n, m in model.named_modules() if isinstance(m, EmbeddingBagCollection)}


def read_model(mf: ModelFile) -> RecModel:
    """Table blocks and the dense part of a TorchRec model file, built on the meta device
    (its eager ops are counted apart, ``with_dense_ops``: that runs one ``make_batch``)."""
    model = meta_model(mf)
    ebcs = embedding_bag_collections(model)
    if not ebcs:
        raise UserInputError(f"{mf.path.name}: the model holds no TorchRec EmbeddingBagCollection")
    stats, notes = _stats(mf, [c for e in ebcs.values() for c in e.embedding_bag_configs()])
    tables = []
    for path, ebc in ebcs.items():
        for cfg in ebc.embedding_bag_configs():
            s = stats[cfg.name]
            tables.append(
                TableBlock(
                    name=cfg.name,
                    module=path,
                    features=tuple(cfg.feature_names),
                    rows=int(cfg.num_embeddings),
                    dim=int(cfg.embedding_dim),
                    pooling_factor=float(s["pooling_factor"]),
                    zipf=float(s["zipf"]),
                )
            )
    in_ebc = {id(p) for e in ebcs.values() for p in e.parameters()}
    dense = [p for p in model.parameters() if id(p) not in in_ebc and p.requires_grad]
    flops = acts = 0.0
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and not any(name.startswith(f"{e}.") for e in ebcs):
            flops += 2.0 * m.in_features * m.out_features
            acts += m.in_features + m.out_features
    units = [
        sum(p.numel() for p in child.parameters() if id(p) not in in_ebc and p.requires_grad)
        for child in model.children()
    ]
    return RecModel(tables, sum(p.numel() for p in dense), len(dense), flops, acts, notes,
                    dense_unit_params=max(units, default=0))  # fmt: skip


def with_dense_ops(mf: ModelFile, rec: RecModel) -> RecModel:
    """``rec`` with its dense part's eager ops counted (``dense_op_counts``)."""
    fwd, bwd = dense_op_counts(mf)
    return replace(rec, dense_forward_ops=fwd, dense_backward_ops=bwd)


def dense_op_counts(mf: ModelFile) -> tuple[int, int]:
    """(forward, backward) eager ops of everything outside the tables (MLPs, the interaction,
    the model's glue), counted on the meta device with each EmbeddingBagCollection answering
    with pooled embeddings of its shapes; views excluded, as the dense cost model counts."""
    from torchrec.sparse.jagged_tensor import KeyedTensor

    from planner.trace.opcost import is_view

    model = meta_model(mf)
    ebcs = embedding_bag_collections(model)
    inputs, _ = _raw_batch(mf)
    # the stand-in's rows are the batch: a tensor input's, else the KJT's (at one row the
    # backward's layout copies are not dispatched, so its ops would be under-counted)
    batch = next((len(x) for x in inputs if isinstance(x, torch.Tensor) and x.dim() > 0), None)
    if batch is None:
        kjt = _kjt(inputs)
        batch = kjt.stride() if kjt is not None else 1

    def pooled(ebc: torch.nn.Module):
        configs = ebc.embedding_bag_configs()
        keys = [f for c in configs for f in c.feature_names]
        dims = [c.embedding_dim for c in configs for _ in c.feature_names]
        values = torch.zeros(batch, sum(dims), device="meta", requires_grad=True)
        return lambda *args, **kwargs: KeyedTensor(keys, dims, values)

    meta_inputs = tuple(
        x.to("meta") if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs
    )
    saved = {path: ebc.forward for path, ebc in ebcs.items()}
    counter = _OpCounter(is_view)
    try:
        for ebc in ebcs.values():
            ebc.forward = pooled(ebc)
        with counter:
            out = model(*meta_inputs)
        counted = counter.ops
        loss = out.float().sum() if isinstance(out, torch.Tensor) else None
        if loss is None or not loss.requires_grad:
            return counted, 0
        with counter:
            loss.backward()
        return counted, counter.ops - counted
    except Exception:  # a model whose glue the stand-in does not satisfy: no dispatch priced
        return 0, 0
    finally:
        for path, fn in saved.items():
            ebcs[path].forward = fn
        for p in model.parameters():
            p.grad = None


class _OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched inside it that are not views."""

    def __init__(self, is_view) -> None:  # noqa: ANN001
        super().__init__()
        self.is_view = is_view
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if not self.is_view(str(func)):
            self.ops += 1
        return func(*args, **(kwargs or {}))


def _stats(mf: ModelFile, configs: list) -> tuple[dict[str, dict[str, float]], list[str]]:
    """Each table's pooling factor and Zipf exponent, checked; see the module docstring."""
    fn = getattr(mf.module, "embedding_stats", None)
    if callable(fn):
        try:
            given = fn()
        except Exception as exc:
            raise UserInputError(
                f"{mf.path.name}: embedding_stats() raised {type(exc).__name__}: {exc}"
            ) from exc
        out = {}
        for cfg in configs:
            entry = given.get(cfg.name) if isinstance(given, dict) else None
            if not isinstance(entry, dict):
                raise UserInputError(
                    f"{mf.path.name}: embedding_stats() has no entry for table {cfg.name!r} "
                    "(expected {'pooling_factor': L, 'zipf': s} per table)"
                )
            pooling, zipf = entry.get("pooling_factor"), entry.get("zipf", 0.0)
            for key, value in (("pooling_factor", pooling), ("zipf", zipf)):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                    raise UserInputError(
                        f"{mf.path.name}: embedding_stats()[{cfg.name!r}][{key!r}] must be a "
                        f"number >= 0, got {value!r}"
                    )
            out[cfg.name] = {"pooling_factor": float(pooling), "zipf": float(zipf)}
        return out, []
    inputs, _ = _raw_batch(mf)
    kjt = _kjt(inputs)
    if kjt is None:
        raise UserInputError(
            f"{mf.path.name}: make_batch's inputs hold no KeyedJaggedTensor and the file has no "
            "embedding_stats(): give one of them"
        )
    per_key = dict(zip(kjt.keys(), kjt.lengths().view(len(kjt.keys()), -1).float().mean(1)))
    out = {
        cfg.name: {
            "pooling_factor": float(sum(per_key.get(f, 0.0) for f in cfg.feature_names)),
            "zipf": 0.0,
        }
        for cfg in configs
    }
    note = (
        f"pooling factors measured on make_batch({STATS_SAMPLE}); ids priced as uniform (define "
        "embedding_stats() in the model file to give their skew)"
    )
    return out, [note]


def _kjt(inputs: tuple) -> object | None:
    """The first KeyedJaggedTensor among make_batch's inputs (None without one)."""
    return next((x for x in inputs if hasattr(x, "lengths") and hasattr(x, "keys")), None)


def _raw_batch(mf: ModelFile) -> tuple[tuple, object]:
    """make_batch's output as the file returns it (KeyedJaggedTensors are not tensors, so
    ModelFile.batch's check does not apply)."""
    try:
        inputs, targets = mf.module.make_batch(STATS_SAMPLE, step=0)
    except Exception as exc:
        raise UserInputError(
            f"{mf.path.name}: make_batch({STATS_SAMPLE}) raised {type(exc).__name__}: {exc}"
        ) from exc
    return (tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)), targets
