"""A loss over the whole batch under data parallelism: a ``loss_fn`` taking ``gather`` joins
the replicas' outputs (``runtime/gather.py``), so the planner's note about a loss that is not
a mean over samples changes: with one micro-batch per replica there is nothing to say; with
several, each round of micro-batches is a batch of its own, and the note gives the pin.
``tests/test_runtime_oracle.py`` (``clip_global-gather-zero3-dp2``) trains it under ZeRO-3 at
DP 2 against one process taking the whole batch."""

from __future__ import annotations

from pathlib import Path

from planner.api import plan
from planner.modelfile import load_model_file
from planner.search import Pins

MODELS = Path(__file__).resolve().parent / "models"


def _loss_notes(model: str, micro_batch_size: int) -> list[str]:
    pins = Pins(tp=1, dp=2, pp=1, zero=0, micro_batch_size=micro_batch_size, recompute="none",
                offload="none")  # fmt: skip
    result = plan(MODELS / f"{model}.py", 2, profile="cpu", global_batch_size=8,
                  dtype="fp32", pins=pins, compare_baselines=False)  # fmt: skip
    return [n for n in result.notes if n.startswith("loss:")]


def test_the_contract_sees_gather_in_the_signature():
    assert load_model_file(MODELS / "clip_global.py").loss_gathers
    assert not load_model_file(MODELS / "clip.py").loss_gathers


def test_gathering_loss_notes_only_rounds():
    assert _loss_notes("clip_global", 4) == []
    (note,) = _loss_notes("clip_global", 2)
    assert "2 micro-batch rounds" in note and "--micro-batch-size 4" in note
    (plain,) = _loss_notes("clip", 4)  # the replicas' own negatives: today's note and pin
    assert "--micro-batch-size 8 --dp 1" in plain
