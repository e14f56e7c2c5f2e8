"""Launch files (planner/export/launch.py) for a 2-node plan, each checked by its own tooling
where it runs offline, and each node's command read back by ``plan run``'s own parser and the
runtime's own layout check (``runtime.launch.processes_per_node``):

- SLURM: ``bash -n`` on the sbatch script (and ``sbatch --test-only`` where sbatch exists);
- Kubernetes: the manifest against the PyTorchJob schema below (the Kubeflow training
  operator's CRD fields, kubeflow.org/v1) and the pod template against the kubernetes
  client's models where it is installed;
- SkyPilot: ``sky.Task.from_yaml`` where SkyPilot is installed.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import transformers
import yaml

from meshplan.cli import main
from planner.api import plan as make_plan
from planner.modelfile import load_model_file
from planner.schema import load_plan, write_plan
from runtime.launch import processes_per_node

TINY = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
)  # fmt: skip

# kubeflow.org/v1 PyTorchJob, the fields the training operator's CRD documents
# (kubeflow/training-operator: PyTorchJobSpec, ReplicaSpec): pytorchReplicaSpecs maps Master /
# Worker to a ReplicaSpec (replicas, restartPolicy, a pod template); the operator requires
# exactly one Master and a container named "pytorch".
REPLICA_SPEC = {
    "type": "object",
    "required": ["replicas", "template"],
    "properties": {
        "replicas": {"type": "integer", "minimum": 1},
        "restartPolicy": {"enum": ["Always", "OnFailure", "Never", "ExitCode"]},
        "template": {
            "type": "object",
            "required": ["spec"],
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["containers"],
                    "properties": {
                        "containers": {
                            "type": "array",
                            "minItems": 1,
                            "contains": {
                                "type": "object",
                                "required": ["name", "image"],
                                "properties": {"name": {"const": "pytorch"}},
                            },
                        }
                    },
                }
            },
        },
    },
}
PYTORCHJOB_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "kubeflow.org/v1"},
        "kind": {"const": "PyTorchJob"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["pytorchReplicaSpecs"],
            "properties": {
                "pytorchReplicaSpecs": {
                    "type": "object",
                    "required": ["Master"],
                    "additionalProperties": False,
                    "properties": {
                        "Master": {**REPLICA_SPEC, "properties": {
                            **REPLICA_SPEC["properties"], "replicas": {"const": 1}}},
                        "Worker": REPLICA_SPEC,
                    },
                }
            },
        },
    },
}  # fmt: skip


@pytest.fixture(scope="module")
def two_node_plan(tmp_path_factory) -> Path:
    """A tiny Llama planned on 16 H100 (two 8-GPU nodes), written as plan.json."""
    directory = tmp_path_factory.mktemp("two-nodes")
    config = transformers.LlamaConfig(**TINY)
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(directory / "model")
    mf = load_model_file(directory / "model")
    result = make_plan(mf, 16, profile="h100-sxm", global_batch_size=32, use_cache=True)
    assert result.plan.cluster.nodes == 2
    path = write_plan(result.plan, directory)
    assert main(["run", str(path), "--emit", "slurm", "--emit", "kubernetes",
                 "--emit", "skypilot", "--steps", "7"]) == 0  # fmt: skip
    return path


def node_command(command: str, env: dict[str, str]) -> list[str]:
    """The argv bash runs for ``command`` with ``env`` set (its expansions done by bash)."""
    script = f"set -- {command.replace('plan run', 'plan-run', 1)}; printf '%s\\0' \"$@\""
    out = subprocess.run(["bash", "-c", script], env={**os.environ, **env},
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return out.rstrip("\0").split("\0")


def check_node(argv: list[str], plan_path: Path, rank: int, endpoint: str) -> None:
    """``plan run``'s own parser reads the node's flags; the runtime's layout check agrees
    with the plan's 8 processes per node."""
    from planner.cli import build_run_parser  # plan run's own (meshplan.cli runs it)

    assert argv[0] == "plan-run" and argv[1] == str(plan_path)
    opts = build_run_parser().parse_args(argv[1:])
    assert (opts.nnodes, opts.node_rank, opts.rdzv_endpoint) == (2, rank, endpoint)
    assert opts.steps == 7 and opts.device == "cuda"
    assert processes_per_node(load_plan(plan_path), opts, "cpu") == 8


def slurm_controller() -> bool:
    """Whether sbatch has a controller to ask: ``sbatch --test-only`` validates a script
    against the controller's nodes and partitions, and without one (no slurm.conf, or a
    controller that does not answer) it fails before reading the script."""
    if not (shutil.which("sbatch") and shutil.which("scontrol")):
        return False
    return subprocess.run(["scontrol", "ping"], capture_output=True, timeout=60).returncode == 0


def test_the_sbatch_script_is_valid_bash_and_starts_one_plan_run_per_node(two_node_plan):
    script = two_node_plan.parent / "meshplan.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    if slurm_controller():  # sbatch --test-only asks the controller whether the job fits
        subprocess.run(["sbatch", "--test-only", str(script)], check=True)
    text = script.read_text()
    directives = dict(
        line[len("#SBATCH --"):].split("=", 1) for line in text.splitlines()
        if line.startswith("#SBATCH --") and "=" in line
    )  # fmt: skip
    assert directives["nodes"] == "2" and directives["gpus-per-node"] == "8"
    assert directives["ntasks-per-node"] == "1"
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    inner = shlex.split(srun)[-1]  # what bash -c runs on each node
    argv = node_command(inner, {"SLURM_NNODES": "2", "SLURM_NODEID": "1", "HEAD": "gpu-a17"})
    check_node(argv, two_node_plan, 1, "gpu-a17:29500")


def test_the_pytorchjob_fits_the_crd_schema_and_gives_each_pod_its_rank(two_node_plan):
    manifest = yaml.safe_load((two_node_plan.parent / "meshplan-pytorchjob.yaml").read_text())
    jsonschema.validate(manifest, PYTORCHJOB_SCHEMA)
    specs = manifest["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] + specs["Worker"]["replicas"] == 2
    container = specs["Worker"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert container["command"][:2] == ["bash", "-c"]
    env = {"RANK": "1", "MASTER_ADDR": "meshplan-master-0", "MASTER_PORT": "23456"}
    argv = node_command(container["command"][2], env)
    check_node(argv, two_node_plan, 1, "meshplan-master-0:23456")
    try:
        from kubernetes.client import V1PodTemplateSpec
    except ImportError:
        return
    for spec in specs.values():  # the client's models reject a field of the wrong type
        pod = V1PodTemplateSpec.from_dict(spec["template"])
        assert pod.spec.containers[0].resources.limits == {"nvidia.com/gpu": "8"}


def test_the_skypilot_task_has_the_plans_nodes_and_accelerators(two_node_plan):
    path = two_node_plan.parent / "meshplan-sky.yaml"
    task = yaml.safe_load(path.read_text())
    assert task["num_nodes"] == 2 and task["resources"]["accelerators"] == "H100:8"
    env = {"SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_RANK": "1", "HEAD": "10.0.0.4"}
    run = task["run"].splitlines()
    assert run[0].startswith('HEAD=$(echo "$SKYPILOT_NODE_IPS"')
    check_node(node_command(run[1], env), two_node_plan, 1, "10.0.0.4:29500")
    try:
        import sky
    except ImportError:
        return
    parsed = sky.Task.from_yaml(str(path))
    assert parsed.num_nodes == 2
    (resources,) = parsed.resources
    assert resources.accelerators == {"H100": 8}


def test_emit_refuses_an_unknown_scheduler_in_one_line(two_node_plan, capsys):
    code = main(["run", str(two_node_plan), "--emit", "pbs"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "pbs" in err


def test_the_launch_files_name_the_plan_they_start(two_node_plan):
    for name in ("meshplan.sbatch", "meshplan-pytorchjob.yaml", "meshplan-sky.yaml"):
        assert str(two_node_plan) in (two_node_plan.parent / name).read_text()
    assert json.loads((two_node_plan.parent / "meshplan-pytorchjob.yaml").read_text())
