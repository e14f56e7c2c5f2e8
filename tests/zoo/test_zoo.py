"""The model zoo: every family of ``tests/zoo/zoo.py`` (transformers GPT-2 .. Mixtral, and
torch.nn.Transformer) and the plain-PyTorch ResNet (``examples/resnet.py``), models no one here
wrote, each

- traced with torch's exact parameter count,
- planned at its published full size on 8 H100s (nothing pinned), and
- trained 5 steps on CPU/gloo in four forms, DP 2 with ZeRO-3, TP 2 (the sharded variant
  pinned), PP 2 (1F1B) and a 2x2 mesh (PP 2 x TP 2), matching one-process training parameter
  for parameter (``tests/oracle.py``).

Six more families are model files of ``tests/models`` (``MODEL_FILES``: contrastive CLIP,
Wav2Vec2 CTC, Whisper, PatchTST, LLaVA, Qwen2-VL), tiny only, in the same four forms; a family
in ``REFUSED`` must be refused at planning in one line that says why.

All plans of one world size train in one torchrun launch; a plan that crashes it costs one
relaunch of the plans after it, not the others' results.

    python -m pytest -q -m zoo          # the whole zoo (about 13 minutes on 2 cores)
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))

from oracle import (  # noqa: E402
    Reference,
    checkpoint_model_state,
    parameter_mismatches,
    reference_key,
    references_for,
    unmoved_parameters,
)
from runs import ROOT, forced_plan, launch, losses_of, selected  # noqa: E402

from planner.api import plan, trace  # noqa: E402
from planner.errors import UserInputError  # noqa: E402
from planner.modelfile import load_model_file  # noqa: E402

pytestmark = [pytest.mark.zoo, pytest.mark.distributed]

ZOO = Path(__file__).resolve().parent / "zoo.py"
SWEEP = ZOO.with_name("sweep.py")
RESNET = ROOT / "examples" / "resnet.py"
STEPS = 5
RTOL = 1e-4
SGD_LR = 0.1
FAMILIES = (
    "gpt2", "opt", "bert", "roberta", "t5", "bart", "vit", "llama", "mistral", "qwen2",
    "qwen3", "gemma", "phi", "gpt_neox", "falcon", "mixtral", "nn_transformer",
)  # fmt: skip
MODELS = (*FAMILIES, "resnet")
# sweep.py's families (tiny size only: trained in the four forms, not planned at full size)
SWEPT = (
    "phi3", "bigcode_mqa", "bloom", "gptj", "gpt_neo", "gemma2", "qwen2_moe", "qwen3_moe",
    "olmoe", "deepseek_v3", "olmo2", "stablelm", "cohere", "granite", "starcoder2", "mpt",
    "mamba", "albert", "electra", "distilbert", "mbart", "pegasus", "swin", "convnext", "deit",
    "lstm", "groupconv_mha", "lora", "weightnorm", "gru_unrolled", "shared_blocks",
    "llama_own_checkpointing", "gemma3", "jamba", "falcon_new", "funnel", "umt5", "xlm_roberta",
    "nemotron", "glm4", "helium", "smollm3", "falcon_mamba", "bigbird", "granitemoe", "gpt_oss",
    "diffllama", "codegen", "persimmon", "xglm", "biogpt", "cohere2", "exaone4", "deepseek_v2",
    "minicpm3", "olmo", "seed_oss", "apertus", "arcee", "ernie45_moe", "llama4", "rwkv", "mamba2",
    "vaultgemma", "lfm2", "doge", "bitnet", "olmo3", "hunyuan_dense", "nanochat", "glm",
    "ministral", "ernie45", "ctrl", "glm4_moe", "exaone_moe", "blenderbot", "plbart",
    "modernbert", "deberta_v2", "mpnet", "roformer", "megatron_bert",
)  # fmt: skip
# model files of tests/models (tiny only, each with its own inputs and loss): contrastive
# image-text (CLIP), raw-audio CTC (Wav2Vec2), speech encoder-decoder (Whisper), time series
# (PatchTST), vision-language (LLaVA, Qwen2-VL)
MODEL_FILES = ("clip", "wav2vec2", "whisper", "patchtst", "llava", "qwen2_vl")
# families refused at planning time, with what their one-line refusal must say
REFUSED = {
    # its vision attention splits the patches per image by lengths read from the image grid
    # (``lengths.tolist()``): a trace without data cannot size that split
    "qwen2_vl": "decides what to do from tensor values",
}
FORMS: dict[str, tuple[int, dict]] = {
    "zero3-dp2": (2, dict(tp=1, dp=2, pp=1, zero=3, micro_batch_size=4)),
    "tp2": (2, dict(tp=2, dp=1, pp=1, zero=0, micro_batch_size=4)),
    "pp2": (2, dict(tp=1, dp=1, pp=2, zero=0, schedule="1f1b", micro_batch_size=2)),
    "pp2xtp2": (4, dict(tp=2, dp=1, pp=2, zero=0, schedule="1f1b", micro_batch_size=2)),
}


@dataclass(frozen=True)
class Cell:
    model: str
    form: str

    @property
    def id(self) -> str:
        return f"{self.model}-{self.form}"

    @property
    def world(self) -> int:
        return FORMS[self.form][0]

    def path_and_args(self) -> tuple[Path, dict]:
        if self.model == "resnet":
            return RESNET, {}
        if self.model in MODEL_FILES:
            return TESTS / "models" / f"{self.model}.py", {}
        return (SWEEP if self.model in SWEPT else ZOO), {"family": self.model}


CELLS = [Cell(m, f) for m in (*MODELS, *SWEPT, *MODEL_FILES) for f in FORMS]


@dataclass
class ZooRuns:
    base: Path
    logs: dict[str, tuple[int, str]]
    refs: dict[str, Reference]
    plan_errors: dict[str, str]


@pytest.fixture(scope="session")
def zoo_runs(request, tmp_path_factory) -> ZooRuns:
    chosen = selected(request, "cell", Cell)
    base = tmp_path_factory.mktemp("zoo")
    by_world: dict[int, list[tuple[str, Path, Path]]] = {}
    plan_errors: dict[str, str] = {}
    for cell in CELLS:
        if cell.id not in chosen:
            continue
        path, args = cell.path_and_args()
        run_dir = base / cell.id
        pins = {**FORMS[cell.form][1], "recompute": "none"}
        try:
            out = forced_plan(path, cell.world, run_dir, optimizer="sgd", lr=SGD_LR,
                              model_args=args, **pins)  # fmt: skip
        except UserInputError as exc:  # this cell fails its test; the others still run
            plan_errors[cell.id] = str(exc)
            continue
        by_world.setdefault(cell.world, []).append((cell.id, out, run_dir))
    logs: dict[str, tuple[int, str]] = {}
    walls: dict[int, float] = {}
    for world, items in sorted(by_world.items()):
        t0 = time.perf_counter()
        _launch_resuming(items, world, base, logs)
        walls[world] = round(time.perf_counter() - t0, 1)
    print(f"\nzoo launches (world: seconds): {walls}", file=sys.stderr)
    refs = references_for([path for items in by_world.values() for _, path, _ in items], STEPS)
    return ZooRuns(base, logs, refs, plan_errors)


@pytest.mark.parametrize("cell", CELLS, ids=[c.id for c in CELLS])
def test_zoo_cell_trains_like_one_process(zoo_runs, cell):
    if cell.model in REFUSED:  # refused in one line, saying why
        error = zoo_runs.plan_errors.get(cell.id, "")
        assert REFUSED[cell.model] in error and "\n" not in error, error or "planned"
        return
    assert cell.id not in zoo_runs.plan_errors, zoo_runs.plan_errors.get(cell.id)
    run_dir = zoo_runs.base / cell.id
    plan_json = json.loads((run_dir / "plan.json").read_text())
    pins = FORMS[cell.form][1]
    assert plan_json["mesh"] == {k: pins.get(k, 1) for k in ("pp", "dp", "tp", "ep", "cp")}
    ref = zoo_runs.refs[reference_key(plan_json)]
    assert not unmoved_parameters(ref), "the reference does not move these far enough"
    got = losses_of(run_dir)
    rc, log = zoo_runs.logs[cell.id]
    assert len(got) == STEPS, f"{cell.id}: no metrics (torchrun exit {rc})\n{log[-6000:]}"
    for step, (g, w) in enumerate(zip(got, ref.losses), start=1):
        assert abs(g - w) <= RTOL * abs(w), f"{cell.id} step {step}: {g} vs one-process {w}"
    state = checkpoint_model_state(run_dir / "checkpoints" / f"step_{STEPS:06d}")
    wrong = parameter_mismatches(state, ref)
    assert not wrong, f"{cell.id}: {len(wrong)} tensors differ from one process:\n" + "\n".join(
        wrong[:20]
    )


def _launch_resuming(
    items: list[tuple[str, Path, Path]], world: int, base: Path, logs: dict
) -> None:
    """Train the plans in one torchrun launch; a plan that crashes it keeps the launch's log
    and the plans after it are launched again, so one broken cell costs one launch, not all."""
    rest, attempt = list(items), 0
    while rest:
        rc, log = launch(
            [p for _, p, _ in rest],
            [d for _, _, d in rest],
            world,
            "--checkpoint-every",
            str(STEPS),
            steps=STEPS,
            timeout=1500,
        )
        (base / f"launch-world{world}-{attempt}.log").write_text(log)
        attempt += 1
        done = 0
        while done < len(rest) and len(losses_of(rest[done][2])) == STEPS:
            logs[rest[done][0]] = (rc, "")
            done += 1
        if done < len(rest):
            logs[rest[done][0]] = (rc, log)  # the plan that stopped the launch
            done += 1
        rest = rest[done:] if rc != 0 else []


@pytest.mark.parametrize("model", MODELS)
def test_zoo_traces_exact_parameters_and_plans_full_size(model):
    """The tracer counts what torch counts; the published full size plans on 8 H100s."""
    path, args = Cell(model, "tp2").path_and_args()
    mf = load_model_file(path, {**args, "size": "tiny"})
    traced = trace(mf, dtype="fp32")
    assert traced.params == sum(p.numel() for p in mf.build().parameters())
    full = load_model_file(path, {**args, "size": "full"})
    result = plan(full, 8, profile="h100-sxm", dtype="bf16")
    with torch.device("meta"):
        n_full = sum(p.numel() for p in full.build().parameters())
    assert result.plan.model.params == n_full
    assert result.plan.predicted.step_time_s > 0
    assert result.plan.predicted.peak_memory_bytes <= result.plan.predicted.capacity_bytes


def test_gpt2_at_megatron_22b_shape_fits_at_tp8_on_a100s():
    """GPT-2's Conv1D projections shard: the 22B shape Megatron trains at TP 8 on 8
    A100-80GB (Narayanan et al. 2021, Table 1) fits there (priced as 8 replicas it needed
    331 GiB per device)."""
    from planner.search import Pins

    result = plan(
        ROOT / "benchmarks" / "models" / "hf_shapes.py",
        8,
        model_args={"kind": "gpt2"},
        profile="a100-80g",
        pins=Pins(tp=8, pp=1, dp=1, recompute="full", micro_batch_size=1),
    )
    predicted = result.plan.predicted
    assert predicted.peak_memory_bytes <= predicted.capacity_bytes
    layer = next(b for b in result.plan.blocks if b.name == "transformer.h.0")
    assert layer.tp_plan["transformer.h.0.mlp.c_fc"] == "colwise_in_out"
    assert layer.tp_plan["transformer.h.0.mlp.c_proj"] == "rowwise_in_out"
