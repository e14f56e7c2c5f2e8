"""An exported plan priced as the engine runs it (planner/export/pricing.py).

References: the plan's own prediction (a plan the engine runs exactly, under semantics equal to
meshplan's runtime, is priced at plan.json's step and memory); hand sums of the cost model's
per-block terms (a change of recompute on k blocks of a one-stage, one-replica plan moves the
step by m x k x the block's option time difference, nothing else in the step depending on it);
and, for the command, the pricing function's own numbers in what it prints and writes.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest
import transformers

from meshplan.cli import main
from planner.api import plan as make_plan
from planner.cost.block_options import block_options
from planner.cost.engines import engine_training
from planner.engine_prices import plan_model, result_model
from planner.export import ENGINES, export_plan
from planner.export.facts import as_planned, plan_facts
from planner.export.pricing import engine_price, planned_price, price_as_run
from planner.modelfile import load_model_file
from planner.schema import load_plan, write_plan
from planner.search import Pins
from planner.vocab import Offload, Recompute

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
)  # fmt: skip
LAYER = "LlamaDecoderLayer"


@pytest.fixture(scope="module")
def one_gpu(tmp_path_factory):
    """A tiny Llama planned on one H100: one stage, one replica, no recompute."""
    directory = tmp_path_factory.mktemp("tiny-llama")
    config = transformers.LlamaConfig(**TINY)
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(directory)
    result = make_plan(
        load_model_file(directory), 1, profile="h100-sxm", dtype="bf16", global_batch_size=16,
        pins=Pins(recompute="none", offload="none"),
    )  # fmt: skip
    assert (result.plan.mesh.pp, result.plan.mesh.dp, result.plan.mesh.tp) == (1, 1, 1)
    return result, result_model(result)


def with_recompute(plan, indices: list[int], mode: str):
    blocks = list(plan.blocks)
    for i in indices:
        blocks[i] = dataclasses.replace(blocks[i], recompute=mode)
    return dataclasses.replace(plan, blocks=blocks)


def option_time(model, training, plan, block_index: int, recompute: str) -> float:
    """The block's fwd + bwd per micro-batch of the plan with ``recompute``, straight from the
    cost model's block options (TP 1: the replicated variant)."""
    block = model.blocks[block_index]
    variants = model.variants_of(block, 1)
    opts = block_options(
        model.graph, block, variants, plan.micro_batch_size, model.cluster, [0], training
    )
    (found,) = [o for o in opts if o.recompute == recompute and o.offload == Offload.NONE]
    return found.time_s


def test_a_plan_an_engine_runs_exactly_under_meshplans_semantics_prices_as_planned(one_gpu):
    """TP 1, no recompute, one replica: torchtitan's and Accelerate's semantics are the
    runtime's (FSDP2/DDP), so both engines' predictions are plan.json's, to the last bit."""
    result, model = one_gpu
    plan = result.plan
    planned = planned_price(plan, model)
    assert planned.step_time_s == pytest.approx(plan.predicted.step_time_s, rel=1e-12)
    assert planned.peak_memory_bytes == pytest.approx(plan.predicted.peak_memory_bytes, rel=1e-12)
    for engine in ("torchtitan", "accelerate"):
        price = engine_price(plan, export_plan(plan, engine), model)
        assert price.step_time_s == pytest.approx(planned.step_time_s, rel=1e-12), engine
        assert price.peak_memory_bytes == planned.peak_memory_bytes, engine
        assert price.fits


def test_torchtitans_one_policy_for_every_layer_costs_the_recompute_of_the_others(one_gpu):
    """The plan recomputes 3 of 8 layers; torchtitan recomputes all 8: its step is longer by
    m x 5 x (full - none) of a layer's option, and it holds less activation memory."""
    result, model = one_gpu
    plan = result.plan
    layers = [i for i, b in enumerate(plan.blocks) if b.block_class == LAYER]
    mixed = with_recompute(plan, layers[5:], Recompute.FULL)
    export = export_plan(mixed, "torchtitan")
    assert any("3 of 8 layers became full for every layer" in c for c in export.changes)
    planned = planned_price(mixed, model)
    titan = engine_price(mixed, export, model)
    delta = option_time(model, model.training, plan, layers[0], Recompute.FULL) - option_time(
        model, model.training, plan, layers[0], Recompute.NONE
    )
    assert delta > 0
    expected = plan.num_microbatches * 5 * delta
    assert titan.step_time_s - planned.step_time_s == pytest.approx(expected, rel=1e-9)
    assert titan.peak_memory_bytes < planned.peak_memory_bytes


def test_megatron_drops_the_heads_recompute_and_moves_layers_to_the_stage_start(one_gpu):
    """The plan recomputes its last 3 layers and its head: Megatron's block method recomputes
    the first 3 layers (same cost: the layers are identical) and never the head, so under
    Megatron's own semantics its step is the as-planned one less m x (full - none) of the
    head; priced as planned and as run, the layers' move alone changes nothing."""
    result, model = one_gpu
    plan = result.plan
    layers = [i for i, b in enumerate(plan.blocks) if b.block_class == LAYER]
    head = len(plan.blocks) - 1
    mixed = with_recompute(plan, layers[5:] + [head], Recompute.FULL)
    export = export_plan(mixed, "megatron")
    said = " ".join(export.changes)
    assert "recompute of the embedding/head dropped" in said
    assert "recompute of the first ones" in said
    assert export.runs.layer_recompute == (Recompute.FULL,) * 3 + (Recompute.NONE,) * 5
    training = engine_training(
        model.training, "megatron", tp=1, pp=1, virtual_stages=1, zero=plan.zero_stage,
        microbatches=plan.num_microbatches, sequence_parallel=False, profile="h100-sxm",
        rank_params=0.0,
    )  # fmt: skip
    as_planned_cost = price_as_run(mixed, as_planned(mixed, plan_facts(mixed)), training, model)
    megatron = engine_price(mixed, export, model)
    head_delta = option_time(model, training, plan, head, Recompute.FULL) - option_time(
        model, training, plan, head, Recompute.NONE
    )
    assert head_delta > 0
    expected = plan.num_microbatches * head_delta
    assert as_planned_cost.step_time_s - megatron.step_time_s == pytest.approx(expected, rel=1e-9)
    # the engine's semantics themselves move the price: Megatron's fused kernels and cuDNN
    # attention on Hopper run the same plan faster than meshplan's eager runtime
    assert megatron.step_time_s < planned_price(mixed, model).step_time_s


def test_plan_export_prints_each_engines_prediction_and_writes_it_beside_the_plan(
    one_gpu, tmp_path, capsys
):
    result, _ = one_gpu
    path = write_plan(result.plan, tmp_path)
    assert main(["export", str(path), *ENGINES]) == 0
    out = capsys.readouterr().out
    check_printed_prices(load_plan(path), out, tmp_path)
    assert (tmp_path / "plan.json").read_text() == path.read_text()


def test_plan_with_export_prints_the_engines_prediction_beside_meshplans(one_gpu, tmp_path, capsys):
    """``plan MODEL --export``: the plan just made, priced as the engines run it."""
    result, _ = one_gpu
    model_dir = Path(result.plan.model.file).parent
    argv = [str(model_dir), "--gpus", "1", "--profile", "h100-sxm", "--global-batch-size",
            "16", "--recompute", "none", "--offload", "none", "--out", str(tmp_path),
            "--no-report", "--export", "megatron", "--export", "torchtitan"]  # fmt: skip
    assert main(argv) == 0
    plan = load_plan(tmp_path / "plan.json")
    check_printed_prices(plan, capsys.readouterr().out, tmp_path, ["megatron", "torchtitan"])


def check_printed_prices(plan, out: str, directory: Path, engines=ENGINES) -> None:
    """Each engine's printed line and exports.json entry are the pricing function's."""
    model = plan_model(plan)
    planned = planned_price(plan, model)
    assert f"meshplan: {planned.line()}" in out
    summary = json.loads((directory / "exports.json").read_text())
    assert summary["meshplan"]["step_time_s"] == pytest.approx(planned.step_time_s, rel=1e-12)
    for engine in engines:
        price = engine_price(plan, export_plan(plan, engine), model)
        section = re.search(rf"^{engine}: wrote .*?(?=^\S|\Z)", out, re.M | re.S).group(0)
        assert f"  {price.line(planned)}\n" in section, engine
        written = summary["engines"][engine]["predicted"]
        assert written["step_time_s"] == pytest.approx(price.step_time_s, rel=1e-12)
        assert written["peak_memory_bytes"] == pytest.approx(price.peak_memory_bytes, rel=1e-12)
        assert written["fits"] == price.fits


@pytest.mark.long
@pytest.mark.parametrize("name", ["llama3-8b-64xh100", "llama3-70b-64xh100"])
def test_the_shipped_plans_print_every_engines_prediction(name, tmp_path, capsys):
    """The shipped 8B/64 and 70B/64 plans (a trace of the full model each: minutes cold)."""
    path = tmp_path / "plan.json"
    shutil.copy(ROOT / "examples" / "plans" / f"{name}.json", path)
    assert main(["export", str(path), *ENGINES]) == 0
    check_printed_prices(load_plan(path), capsys.readouterr().out, tmp_path)


def test_a_layout_the_batch_does_not_split_over_is_refused_in_one_line(one_gpu):
    """An engine whose replicas do not divide the batch (Accelerate folding a pipeline into
    data parallelism can make one) is not priced: one line saying why."""
    from planner.errors import UserInputError
    from planner.schema.mesh import Mesh

    result, model = one_gpu
    plan = result.plan
    runs = dataclasses.replace(as_planned(plan, plan_facts(plan)), mesh=Mesh(1, 3, 1))
    with pytest.raises(UserInputError, match="does not split into micro-batches of 16 over 3"):
        price_as_run(plan, runs, model.training, model)
