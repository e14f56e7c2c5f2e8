"""A DLRM-style recommendation model (Naumov et al. 2019) on TorchRec's EmbeddingBagCollection.

Dense features go through a bottom MLP; every sparse feature is looked up in its own embedding
table (sum pooling over a variable number of ids per sample); the bottom MLP's output and every
pooled embedding of the same width interact through pairwise dot products (DLRM's interaction),
and the top MLP reads those dot products beside the concatenation of all the features (tables
of other widths enter through the concatenation only). Tables differ in rows, width and pooling
factor, and ids follow a Zipf law (a few rows take most lookups, as in click logs), hashed so
the hot rows spread over the id range.

Model-file contract: ``build_model(**kwargs)``, ``make_batch(batch_size, step=0)`` returning
``((dense, KeyedJaggedTensor), labels)``, ``loss_fn`` and ``TRAINING``, plus the one extension a
recommendation model needs: ``embedding_stats()`` gives each table's mean pooling factor and
Zipf exponent (what the planner prices lookups and caching with), for the last built size.

    plan examples/dlrm.py --gpus 8 --model-arg size=small
    plan examples/dlrm.py --gpus 64 --model-arg size=production --profile h100-sxm
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

# One table: (rows, width, mean ids per sample, Zipf exponent of its ids).
Table = tuple[int, int, float, float]

TRAINING = {"global_batch_size": 256, "optimizer": "sgd", "dtype": "fp32", "lr": 0.5}


def _tiny() -> list[Table]:
    return [(100, 8, 2.0, 1.1), (50, 8, 3.0, 0.8), (20_000, 16, 1.0, 1.2), (30, 4, 4.0, 0.0)]


def _small() -> list[Table]:
    return [
        (10_000 * (1 + i % 5), (16, 32, 64)[i % 3], 1.0 + i % 4, 0.6 + 0.1 * (i % 6))
        for i in range(16)
    ]


def _production(count: int = 120) -> list[Table]:
    """``count`` tables in a production mix: a few 1e8-row id tables (users, items), tens of
    1e6-1e7-row tables and a long tail of small categorical ones; about 1.6e9 rows at 120."""
    tables: list[Table] = []
    for i in range(count):
        if i < 8:
            rows, width = 100_000_000 + 25_000_000 * i, 128
        elif i < 40:
            rows, width = 1_000_000 * (1 + (i * 7) % 10), 64 if i % 2 else 128
        else:
            rows, width = 1_000 * (1 + (i * 13) % 500), (16, 32, 64)[i % 3]
        pooling = (1.0, 2.0, 5.0, 10.0, 20.0, 40.0)[(i * 5) % 6]
        zipf = (0.0, 0.8, 1.0, 1.05, 1.2)[(i * 3) % 5]
        tables.append((rows, width, pooling, zipf))
    return tables


SIZES = {"tiny": _tiny, "small": _small, "production": _production}
# name: (dense features, bottom MLP widths, top MLP hidden widths)
DENSE = {"tiny": (4, (16, 8), (16,)), "small": (13, (64, 32), (64, 32))}
DENSE_LARGE = (13, (512, 256, 128), (1024, 1024, 512, 256))

_current: dict[str, object] = {"tables": _tiny(), "dense": DENSE["tiny"][0]}


def _mlp(widths: list[int], last_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(a, b))
        if last_relu or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """Bottom MLP, one EmbeddingBagCollection, dot interaction, top MLP (one logit)."""

    def __init__(self, tables: list[Table], dense_in: int, bottom: tuple, top: tuple) -> None:
        super().__init__()
        self.names = [f"t{i}" for i in range(len(tables))]
        self.ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(
                    name=name,
                    embedding_dim=width,
                    num_embeddings=rows,
                    feature_names=[f"f{i}"],
                    pooling=PoolingType.SUM,
                )
                for i, (name, (rows, width, _, _)) in enumerate(zip(self.names, tables))
            ],
        )
        self.features = [f"f{i}" for i in range(len(tables))]
        self.width = bottom[-1]
        self.interacting = [f for f, t in zip(self.features, tables) if t[1] == self.width]
        self.bottom = _mlp([dense_in, *bottom], last_relu=True)
        n = len(self.interacting) + 1
        pairs = n * (n - 1) // 2
        concat = self.width + sum(t[1] for t in tables)
        self.top = _mlp([concat + pairs, *top, 1], last_relu=False)

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        x = self.bottom(dense)
        pooled = self.ebc(sparse).to_dict()
        same = torch.stack([x] + [pooled[f] for f in self.interacting], dim=1)
        dots = torch.bmm(same, same.transpose(1, 2))
        i, j = torch.triu_indices(same.shape[1], same.shape[1], offset=1)
        features = [x, *(pooled[f] for f in self.features), dots[:, i, j]]
        return self.top(torch.cat(features, dim=1)).squeeze(1)


def build_model(size: str = "tiny", tables: int | None = None) -> nn.Module:
    """``size`` tiny (4 tables), small (16 tables), production (120 tables, 1.6e9 rows);
    ``tables`` sets the count of a production-mix model (e.g. 500)."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
    spec = _production(tables) if tables else SIZES[size]()
    dense_in, bottom, top = DENSE.get(size, DENSE_LARGE) if not tables else DENSE_LARGE
    _current.update(tables=spec, dense=dense_in)
    return DLRM(spec, dense_in, bottom, top)


def embedding_stats() -> dict[str, dict[str, float]]:
    """Per table of the last built model: mean ids per sample and the ids' Zipf exponent."""
    return {
        f"t{i}": {"pooling_factor": pooling, "zipf": zipf}
        for i, (_, _, pooling, zipf) in enumerate(_current["tables"])  # type: ignore[arg-type]
    }


def _zipf_ids(g: torch.Generator, count: int, rows: int, s: float) -> torch.Tensor:
    """``count`` ids in [0, rows) with P(rank k) ~ k^-s (continuous inverse CDF), then hashed
    (multiplied by a large odd constant mod rows) so the hot ids are not the first rows."""
    u = torch.rand(count, generator=g, dtype=torch.float64)
    if s == 0:
        k = u * rows
    elif abs(s - 1.0) < 1e-9:
        k = torch.exp(u * math.log(rows + 1)) - 1
    else:
        top = (rows + 1) ** (1 - s) - 1
        k = (1 + u * top) ** (1 / (1 - s)) - 1
    k = k.long().clamp_(0, rows - 1)
    return (k * 2654435761) % rows


def make_batch(batch_size: int, step: int = 0) -> tuple[tuple, torch.Tensor]:
    """((dense [B, d], sparse KJT with one key per table), click labels [B]) from a generator
    seeded by ``step``: each sample has 0..2L ids of a table whose pooling factor is L."""
    g = torch.Generator().manual_seed(1000 + step)
    tables: list[Table] = _current["tables"]  # type: ignore[assignment]
    dense = torch.randn(batch_size, int(_current["dense"]), generator=g)  # type: ignore[arg-type]
    lengths, values = [], []
    for rows, _, pooling, zipf in tables:
        n = torch.randint(0, int(2 * pooling) + 1, (batch_size,), generator=g)
        lengths.append(n)
        values.append(_zipf_ids(g, int(n.sum()), rows, zipf))
    sparse = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{i}" for i in range(len(tables))],
        values=torch.cat(values),
        lengths=torch.cat(lengths),
    )
    labels = torch.randint(0, 2, (batch_size,), generator=g).float()
    return (dense, sparse), labels


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logits, labels)
