"""Property: over random small models and clusters, every plan the solver returns fits the cost
model's memory on every pipeline rank, uses every rank exactly once, and puts every block in
exactly one stage; a request it refuses is refused with the infeasible exit (InfeasibleError), or,
when no mesh shape divides the batch and the model, with a message saying so."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from planner.api import plan
from planner.errors import InfeasibleError, UserInputError

MLP = Path(__file__).resolve().parent.parent / "examples" / "mlp.py"


@settings(max_examples=12, deadline=None)
@given(
    layers=st.integers(1, 6),
    width=st.sampled_from([16, 32, 64, 128]),
    gpus=st.sampled_from([1, 2, 3, 4, 6, 8]),
    batch=st.sampled_from([8, 24, 48]),
    profile=st.sampled_from(["cpu", "v100-16g", "a100-40g"]),
    fraction=st.sampled_from([1.0, 0.5, 1e-4, 3e-6]),
)
@example(layers=1, width=16, gpus=3, batch=8, profile="cpu", fraction=1.0)  # no mesh exists
@example(layers=4, width=128, gpus=8, batch=48, profile="v100-16g", fraction=3e-6)  # nothing fits
def test_feasible_plans_fit_and_use_every_rank_once(layers, width, gpus, batch, profile, fraction):
    from planner.search import Pins

    args = {"size": "tiny", "layers": layers, "width": width}
    try:
        p = plan(
            MLP,
            gpus,
            model_args=args,
            profile=profile,
            global_batch_size=batch,
            pins=Pins(memory_fraction=fraction),
        ).plan
    except InfeasibleError as exc:
        # says how much memory, in a unit that shows it (KiB on a tiny fraction of a device)
        assert re.search(r"[\d.]+ (?:B|KiB|MiB|GiB|TiB)\b", str(exc)), str(exc)
        return
    except UserInputError as exc:  # e.g. 3 GPUs, batch 8, too few blocks: no mesh exists
        assert "no parallel layout" in str(exc) and f"{gpus} GPUs" in str(exc)
        return
    pred = p.predicted
    mesh = p.mesh
    assert mesh.pp * mesh.dp * mesh.tp == gpus
    totals = [m.total for m in pred.memory_per_stage]
    assert len(totals) == mesh.pp
    assert max(totals) == pred.peak_memory_bytes <= pred.capacity_bytes * (1 + 1e-12)
    for m in pred.memory_per_stage:
        parts = m.params + m.grads + m.optimizer + m.activations + m.other
        assert abs(parts - m.total) <= 1e-9 * m.total
    firsts = [st_ for st_ in p.stages if st_.index < mesh.pp]
    ranks = sorted(r for st_ in firsts for r in st_.ranks)
    assert ranks == list(range(gpus))
    placed = [name for st_ in p.stages for name in st_.blocks]
    assert sorted(placed) == sorted(b.name for b in p.blocks)
    assert p.global_batch_size == mesh.dp * p.micro_batch_size * p.num_microbatches
