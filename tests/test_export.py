"""Exports (planner/export): each engine's files read back by the ENGINE'S OWN code, and the
degrees, schedule, micro-batch and recompute the engine parses equal the plan's.

- torchtitan: its ConfigManager loads the exported config-registry module (torchtitan 0.3);
- Megatron: Megatron-Core's ModelParallelConfig / TransformerConfig (their __post_init__
  validates) and its micro-batch calculator, from the argument list;
- DeepSpeed: DeepSpeedConfig (its pydantic models) with the plan's data-parallel size;
- Accelerate: ``accelerate launch``'s own config loading and environment, then
  FullyShardedDataParallelPlugin and ParallelismConfig as a training script builds them.

The engines are the ``[engines]`` extra (.ci/run installs it); without one its tests skip.
Plans: the shipped Llama-3 8B and 70B plans on 64 H100 (examples/plans/), and plans of a tiny
Llama config solved here with a pipeline, interleaving and recompute pinned.
"""

from __future__ import annotations

import importlib
import json
import shlex
import sys
from pathlib import Path

import pytest
import transformers

from meshplan.cli import main
from planner.api import plan as make_plan
from planner.export import ENGINES, export_plan
from planner.export.facts import plan_facts
from planner.modelfile import load_model_file
from planner.schema import load_plan
from planner.search import Pins
from planner.vocab import Recompute, Schedule

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = {
    "llama3-8b": ROOT / "examples" / "plans" / "llama3-8b-64xh100.json",
    "llama3-70b": ROOT / "examples" / "plans" / "llama3-70b-64xh100.json",
    # README's 70B run (--global-batch-size 1024): ZeRO-3 and full recompute of 20 of 80 layers
    "llama3-70b-gbs1024": ROOT / "examples" / "plans" / "llama3-70b-64xh100-gbs1024.json",
}
# examples/llama.py's dimensions (layers, hidden, heads, kv heads, ffn): the model-file plans'
# architecture, which their export cannot read (Megatron's TransformerConfig needs it).
LLAMA_DIMS = {"llama3-8b": (32, 4096, 32, 8, 14336), "llama3-70b": (80, 8192, 64, 8, 28672)}
LLAMA_DIMS["llama3-70b-gbs1024"] = LLAMA_DIMS["llama3-70b"]
TINY = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
)  # fmt: skip
PINNED = {
    "pp2-tp2-1f1b-full": Pins(pp=2, tp=2, dp=2, zero=1, schedule="1f1b", recompute="full"),
    "pp2-interleaved-selective": Pins(
        pp=2, tp=1, dp=4, zero=0, schedule="interleaved_1f1b", virtual_stages=2,
        recompute="selective",
    ),
    "dp8-zero3": Pins(pp=1, tp=1, dp=8, zero=3, recompute="none"),
}  # fmt: skip


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-llama")
    config = transformers.LlamaConfig(**TINY)
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def pinned_plans(tiny_config):
    mf = load_model_file(tiny_config)
    return {
        name: make_plan(
            mf, 8, profile="h100-sxm", dtype="bf16", global_batch_size=16, pins=pins,
            use_cache=True,
        ).plan
        for name, pins in PINNED.items()
    }  # fmt: skip


def all_plans(pinned_plans):
    plans = {name: load_plan(path) for name, path in SHIPPED.items()}
    return {**plans, **pinned_plans}


def write(export, directory: Path) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, text in export.files.items():
        (directory / name).write_text(text)
        paths[name] = directory / name
    return paths


# ------------------------------------------------------------------------------- torchtitan

TITAN_SCHEDULES = {"1f1b": "Schedule1F1B", "gpipe": "ScheduleGPipe",
                   "interleaved_1f1b": "ScheduleInterleaved1F1B"}  # fmt: skip


def load_torchtitan(export, directory: Path):
    pytest.importorskip("torchtitan", reason="the [engines] extra is not installed")
    from torchtitan.config import ConfigManager

    write(export, directory)
    sys.path.insert(0, str(directory))
    sys.modules.pop("torchtitan_meshplan", None)
    try:
        return ConfigManager().parse_args(
            ["--module", "torchtitan_meshplan", "--config", "meshplan"]
        )
    finally:
        sys.path.remove(str(directory))


def test_torchtitan_parses_the_plans(pinned_plans, tmp_path):
    from torch.distributed.pipelining.schedules import get_schedule_class
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    for name, plan in all_plans(pinned_plans).items():
        facts = plan_facts(plan)
        config = load_torchtitan(export_plan(plan, "torchtitan"), tmp_path / name)
        par = config.parallelism
        mesh = plan.mesh
        assert par.data_parallel_replicate_degree * par.data_parallel_shard_degree == mesh.dp
        assert (par.data_parallel_shard_degree > 1) == (plan.zero_stage > 0 and mesh.dp > 1)
        if plan.zero_stage > 0 and mesh.dp > 1:
            assert par.fsdp_reshard_after_forward == ("always" if plan.zero_stage == 3 else "never")
        assert (par.tensor_parallel_degree, par.pipeline_parallel_degree) == (mesh.tp, mesh.pp)
        assert (par.context_parallel_degree, par.expert_parallel_degree) == (mesh.cp, mesh.ep)
        assert par.enable_sequence_parallel == (facts.sequence_parallel and mesh.tp > 1)
        ac = {Recompute.FULL: FullAC.Config, Recompute.SELECTIVE: SelectiveAC.Config}
        expected_ac = ac.get(Recompute(facts.recompute))
        assert (config.activation_checkpoint is None) == (expected_ac is None), name
        if expected_ac:
            assert type(config.activation_checkpoint) is expected_ac
        assert config.training.global_batch_size == plan.global_batch_size
        if mesh.pp > 1:
            schedule = get_schedule_class(par.pipeline_parallel_schedule)
            assert schedule.__name__ == TITAN_SCHEDULES[plan.schedule], name
            assert par.pipeline_parallel_microbatch_size == plan.micro_batch_size
            parts = par.module_fqns_per_model_part
            assert len(parts) == mesh.pp * plan.virtual_stages
            layers = [[f for f in part if f.startswith("layers.")] for part in parts]
            assert tuple(len(p) for p in layers) == facts.layers_per_stage
            assert config.training.local_batch_size == plan.global_batch_size // mesh.dp
        else:
            assert config.training.local_batch_size == plan.micro_batch_size
            steps = plan.global_batch_size // (config.training.local_batch_size * mesh.dp)
            assert steps == plan.num_microbatches  # torchtitan's gradient accumulation


def test_torchtitans_base_model_has_the_plans_parameters(tmp_path):
    """The shipped plans' exports start from torchtitan's own Llama 3 flavour: its model,
    built on the meta device from the parsed config, has the plan's parameter count."""
    import torch

    for name, path in SHIPPED.items():
        plan = load_plan(path)
        config = load_torchtitan(export_plan(plan, "torchtitan"), tmp_path / name)
        with torch.device("meta"):
            model = config.model_spec.model.build()
        assert sum(p.numel() for p in model.parameters()) == plan.model.params, name


# -------------------------------------------------------------------------------- Megatron


def megatron_kwargs(text: str) -> dict:
    """Megatron-LM's reading of its flags: ``--a-b V`` is ``a_b = V``, a bare flag is True."""
    tokens, out, i = shlex.split(text), {}, 0
    while i < len(tokens):
        key = tokens[i][2:].replace("-", "_")
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            value = tokens[i + 1]
            out[key] = int(value) if value.isdigit() else value
            i += 2
        else:
            out[key], i = True, i + 1
    return out


def megatron_config(args: dict, dims: tuple[int, ...] | None):
    """Megatron-Core's TransformerConfig from the exported flags, as Megatron-LM's
    core_transformer_config_from_args builds it (its __post_init__ validates)."""
    pytest.importorskip("megatron.core", reason="the [engines] extra is not installed")
    from megatron.core.transformer import TransformerConfig

    layers, hidden, heads, groups, ffn = dims or (
        args["num_layers"], args["hidden_size"], args["num_attention_heads"],
        args.get("num_query_groups", args["num_attention_heads"]),
        args.get("ffn_hidden_size"),  # unstated: TransformerConfig's 4h
    )  # fmt: skip
    pp = args["pipeline_model_parallel_size"]
    vpp = None
    if "num_layers_per_virtual_pipeline_stage" in args:
        vpp = layers // pp // args["num_layers_per_virtual_pipeline_stage"]
    import torch

    return TransformerConfig(
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=groups,
        ffn_hidden_size=ffn,
        tensor_model_parallel_size=args["tensor_model_parallel_size"],
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp,
        context_parallel_size=args["context_parallel_size"],
        expert_model_parallel_size=args["expert_model_parallel_size"],
        sequence_parallel=args.get("sequence_parallel", False),
        recompute_granularity=args.get("recompute_granularity"),
        recompute_method=args.get("recompute_method"),
        recompute_num_layers=args.get("recompute_num_layers"),
        num_layers_in_first_pipeline_stage=args.get("decoder_first_pipeline_num_layers"),
        num_layers_in_last_pipeline_stage=args.get("decoder_last_pipeline_num_layers"),
        bf16=args.get("bf16", False),
        fp16=args.get("fp16", False),
        params_dtype=torch.bfloat16 if args.get("bf16") else torch.float32,
        pipeline_dtype=torch.bfloat16 if args.get("bf16") else torch.float32,
    )


def test_megatron_core_parses_the_plans(pinned_plans):
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator

    for name, plan in all_plans(pinned_plans).items():
        facts = plan_facts(plan)
        export = export_plan(plan, "megatron")
        args = megatron_kwargs(export.files["megatron_args.txt"])
        dims = LLAMA_DIMS.get(name) or (8, 64, 4, 2, 128)
        config = megatron_config(args, dims)
        mesh = plan.mesh
        assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size) == (
            mesh.tp, mesh.pp)  # fmt: skip
        assert (config.context_parallel_size, config.expert_model_parallel_size) == (
            mesh.cp, mesh.ep)  # fmt: skip
        assert config.sequence_parallel == (facts.sequence_parallel and mesh.tp > 1)
        expected = {Recompute.NONE: None, Recompute.FULL: "full",
                    Recompute.SELECTIVE: "selective"}[Recompute(facts.recompute)]  # fmt: skip
        assert config.recompute_granularity == expected, name
        if expected == "full" and facts.recomputed_layers == facts.layers:
            assert config.recompute_method == "uniform" and config.recompute_num_layers == 1
        elif expected == "full":  # Megatron's block method: the first k layers of each stage
            assert config.recompute_method == "block"
            assert config.recompute_num_layers * mesh.pp >= facts.recomputed_layers
        if plan.schedule == Schedule.INTERLEAVED and mesh.pp > 1:
            assert config.virtual_pipeline_model_parallel_size == plan.virtual_stages
        dp = mesh.dp
        calc = ConstantNumMicroBatchesCalculator(
            args["global_batch_size"], args["micro_batch_size"], dp, False, 0
        )
        assert calc.get() == plan.num_microbatches, name
        assert args.get("use_distributed_optimizer", False) == (plan.zero_stage > 0)
        # the gradient reduction overlaps the backward, as the plan is priced: Megatron-Core's
        # DDP config takes the flags (Megatron-LM builds it from them by name)
        from megatron.core.distributed import DistributedDataParallelConfig

        ddp = DistributedDataParallelConfig(
            overlap_grad_reduce=args.get("overlap_grad_reduce", False),
            use_distributed_optimizer=args.get("use_distributed_optimizer", False),
        )
        assert ddp.overlap_grad_reduce == (mesh.replicas > 1), name


# ------------------------------------------------------------------------------- DeepSpeed


class DataParallelGroups:
    """The process-group sizes DeepSpeedConfig asks an mpu for (its Megatron interface)."""

    def __init__(self, dp: int, tp: int, pp: int) -> None:
        self.dp, self.tp, self.pp = dp, tp, pp

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_model_parallel_world_size(self) -> int:
        return self.tp

    def get_tensor_model_parallel_world_size(self) -> int:
        return self.tp

    def get_pipeline_model_parallel_world_size(self) -> int:
        return self.pp

    def get_sequence_parallel_world_size(self) -> int:
        return 1


@pytest.fixture()
def deepspeed_comm():
    """DeepSpeedConfig asks deepspeed.comm for the rank before it reads the mpu's data-parallel
    size (without a process group it assumes one rank): a one-process gloo group."""
    pytest.importorskip("deepspeed", reason="the [engines] extra is not installed")
    import deepspeed
    import torch.distributed as dist

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    yield
    dist.destroy_process_group()


def test_deepspeed_parses_the_plans(pinned_plans, tmp_path, deepspeed_comm):
    from deepspeed.runtime.config import DeepSpeedConfig

    for name, plan in all_plans(pinned_plans).items():
        facts = plan_facts(plan)
        export = export_plan(plan, "deepspeed")
        paths = write(export, tmp_path / name)
        mesh = plan.mesh
        ds = DeepSpeedConfig(
            str(paths["ds_config.json"]), mpu=DataParallelGroups(mesh.dp, mesh.tp, mesh.pp)
        )
        assert ds.train_micro_batch_size_per_gpu == plan.micro_batch_size
        assert ds.gradient_accumulation_steps == plan.num_microbatches
        assert ds.train_batch_size == plan.global_batch_size
        zero = plan.zero_stage if mesh.pp == 1 else min(plan.zero_stage, 1)
        assert ds.zero_optimization_stage == zero
        assert ds.bfloat16_config.enabled == (plan.dtype == "bf16")
        assert ds.activation_checkpointing_config.number_checkpoints == (
            facts.recomputed_layers or None)  # fmt: skip
        if mesh.tp > 1:
            assert ds.tensor_parallel_config.autotp_size == mesh.tp
        if mesh.pp > 1:
            assert ds.pipeline["stages"] == mesh.pp
            parts = json.loads(paths["deepspeed_partition.json"].read_text())["parts"]
            assert parts[0] == 0 and parts[-1] == facts.layers and len(parts) == mesh.pp + 1


# ------------------------------------------------------------------------------ Accelerate


def load_accelerate(path: Path, monkeypatch):
    """What ``accelerate launch --config_file PATH`` hands a training script: its parsed
    launch arguments, and the FSDP plugin and parallelism config built from its environment."""
    pytest.importorskip("accelerate", reason="the [engines] extra is not installed")
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, _, _ = _validate_launch_command(args)
    env = prepare_multi_gpu_env(args)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    plugin = FullyShardedDataParallelPlugin() if args.use_fsdp else None
    parallelism = ParallelismConfig() if env.get("ACCELERATE_USE_PARALLELISM_CONFIG") else None
    return args, plugin, parallelism


def test_accelerate_parses_the_plans(pinned_plans, tmp_path, monkeypatch):
    for name, plan in all_plans(pinned_plans).items():
        facts = plan_facts(plan)
        export = export_plan(plan, "accelerate")
        paths = write(export, tmp_path / name)
        with monkeypatch.context() as m:
            args, plugin, parallelism = load_accelerate(paths["accelerate_config.yaml"], m)
        mesh = plan.mesh
        assert args.num_processes == plan.cluster.gpus and args.num_machines == plan.cluster.nodes
        assert args.mixed_precision == {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[plan.dtype]
        fsdp = plan.zero_stage > 0 and mesh.dp * mesh.pp > 1
        assert bool(args.use_fsdp) == fsdp, name
        if fsdp:
            assert plugin.fsdp_version == 2
            assert plugin.reshard_after_forward == (plan.zero_stage == 3)
            assert plugin.activation_checkpointing == (facts.recompute != Recompute.NONE)
            assert plugin.transformer_cls_names_to_wrap == ["LlamaDecoderLayer"]
        if mesh.tp > 1:
            assert parallelism.tp_size == mesh.tp
            assert parallelism.total_size == mesh.size  # pp folded into dp
        if mesh.pp > 1:
            assert any("pipeline" in c for c in export.changes)


# ------------------------------------------------------------------------------ the command


def test_plan_export_writes_every_engine_beside_the_plan(tmp_path, capsys):
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(SHIPPED["llama3-8b"].read_text())
    assert main(["export", str(plan_path), *ENGINES, "--no-price"]) == 0
    out = capsys.readouterr().out
    names = {"torchtitan_meshplan.py", "megatron_args.txt", "ds_config.json",
             "accelerate_config.yaml"}  # fmt: skip
    assert names <= {p.name for p in tmp_path.iterdir()}
    assert "megatron: wrote megatron_args.txt" in out and "changed: ZeRO-2" in out


def test_export_refuses_an_unknown_engine_in_one_line(capsys):
    code = main(["export", str(SHIPPED["llama3-8b"]), "jax"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "jax" in err


def test_exports_never_replace_a_users_file(tmp_path, capsys):
    (tmp_path / "ds_config.json").write_text('{"mine": true}')
    plan_path = tmp_path / "sub" / "plan.json"
    plan_path.parent.mkdir()
    plan_path.write_text(SHIPPED["llama3-8b"].read_text())
    code = main(["export", str(plan_path), "deepspeed", "--out", str(tmp_path), "--no-price"])
    assert code == 2 and "not written by meshplan" in capsys.readouterr().err
    assert json.loads((tmp_path / "ds_config.json").read_text()) == {"mine": True}


def test_an_engine_module_is_importable_alone():
    for engine in ENGINES:
        importlib.import_module(f"planner.export.{engine}")


def test_per_layer_recompute_is_said_where_an_engine_cannot_express_it():
    """README's 70B plan recomputes 20 of its 80 layers (the last ones): torchtitan and
    Accelerate recompute every layer and say so; Megatron's block method recomputes 20 too,
    the first ones, and says so; DeepSpeed says the model's code must wrap them."""
    plan = load_plan(SHIPPED["llama3-70b-gbs1024"])
    facts = plan_facts(plan)
    assert (facts.recomputed_layers, facts.layers) == (20, 80)
    said = {e: " ".join(export_plan(plan, e).changes) for e in ENGINES}
    assert "recompute of 20 of 80 layers became full for every layer" in said["torchtitan"]
    assert "recompute of 20 of 80 layers became recompute of every layer" in said["accelerate"]
    assert "recompute of the first ones" in said["megatron"]
    args = megatron_kwargs(export_plan(plan, "megatron").files["megatron_args.txt"])
    assert (args["recompute_method"], args["recompute_num_layers"]) == ("block", 20)
    assert "20 of 80" in said["deepspeed"]
    # it also offloads 2 of its 80 layers: every engine offloads all or nothing, and says so
    for engine in ENGINES:
        assert "offload of 2 of 80 layers became offload optimizer+params" in said[engine]


def test_export_with_graph_is_refused_in_one_line(capsys):
    code = main(["examples/mlp.py", "--graph", "--export", "megatron"])
    err = capsys.readouterr().err
    assert code == 2 and "--export needs a plan" in err and len(err.strip().splitlines()) == 1
