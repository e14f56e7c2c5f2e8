"""The eager probe runs a block's whole (unsharded) code once per set of column-parallel modules a
plan marks, and shares that run between the plans and TP degrees that mark the same set
(``EagerShardProbe._whole_run``). Its verdicts must be those of a probe that runs the whole
block for each question anew: here each question is asked of one probe in turn and of a probe
whose verdicts and whole runs are dropped before each (the code before the cache), on models
whose code the probe passes (Llama), rejects with a head-count fix (OPT's fixed-count view) and
sees fail on local shards (Llama's q, k and v split with its output projection whole)."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.cost.eager_probe import EagerShardProbe
from planner.modelfile import load_model_file

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "models"


def _plans(layer: str, out: str, mlp: tuple[str, str]) -> list[dict[str, str]]:
    """Megatron's attention split, the same with q alone column-parallel, and the MLP split:
    the first two mark different column-parallel sets, the first and a copy with the output
    projection left out mark the same one."""
    attn = {f"{layer}.self_attn.{p}": "colwise" for p in ("q_proj", "k_proj", "v_proj")}
    q_only = {f"{layer}.self_attn.q_proj": "colwise", f"{layer}.self_attn.{out}": "rowwise"}
    up, down = mlp
    return [
        {**attn, f"{layer}.self_attn.{out}": "rowwise"},
        attn,
        q_only,
        {f"{layer}.{up}": "colwise", f"{layer}.{down}": "rowwise"},
    ]


CASES = {
    "llama": (ROOT / "examples" / "llama.py", "o_proj", ("mlp.up_proj", "mlp.down_proj")),
    "opt": (MODELS / "opt.py", "out_proj", ("fc1", "fc2")),
}


def _answers(probe: EagerShardProbe, layer: str, plan: dict[str, str], t: int) -> tuple:
    return (
        probe.reject("layer", layer, plan, t),
        probe.unsafe_outputs("layer", layer, plan, t),
        probe.local_attributes("layer", layer, plan, t),
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_shared_whole_runs_give_the_verdicts_of_fresh_ones(name):
    path, out, mlp = CASES[name]
    mf = load_model_file(path, {"size": "tiny"})
    layer = "model.decoder.layers.0" if name == "opt" else "model.layers.0"
    plans = _plans(layer, out, mlp)
    shared, anew = EagerShardProbe(mf, "fp32"), EagerShardProbe(mf, "fp32")
    verdicts = []
    # every plan at TP 2, then the first again at TP 4 (its whole run shared across degrees)
    for plan, t in [(p, 2) for p in plans] + [(plans[0], 4)]:
        verdicts.append(_answers(shared, layer, plan, t))
        anew.verdicts.clear()
        anew._whole.clear()
        assert verdicts[-1] == _answers(anew, layer, plan, t)
        assert len(anew._whole) == 1  # the question ran the whole block anew
    # one whole run per column-parallel set: three sets over five questions
    assert len(shared._whole) == 3
    if name == "opt":  # the case that needs the head-count fix is among them, at both degrees
        assert verdicts[0][2] == [f"{layer}.self_attn.num_heads"]
        assert verdicts[4][2] == [f"{layer}.self_attn.num_heads"]
    else:  # Megatron's split passes; q, k and v split with o_proj whole fails on its shards
        assert verdicts[0] == (None, set(), [])
        assert "fails on local shards" in verdicts[1][0]
