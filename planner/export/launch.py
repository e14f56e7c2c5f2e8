"""Launch files for a plan on more than one machine, for the schedulers people rent GPUs
through: a SLURM ``sbatch`` script, a Kubeflow ``PyTorchJob`` manifest and a SkyPilot task.

Each starts meshplan's own runtime the same way: one ``plan run PLAN.json`` per node (which
runs torchrun with that node's processes), every node given the node count, its rank and the
c10d rendezvous on the first node. Nodes and GPUs per node come from the plan's cluster.

    plan run PLAN.json --emit slurm --emit kubernetes --emit skypilot
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from planner.errors import UserInputError
from planner.export.engines import DEFAULT_IMAGE, SCHEDULERS
from planner.export.types import Export
from planner.schema.plan import Plan

# The c10d rendezvous port on the first node (torchrun's usual default, 29500).
RDZV_PORT = 29500
# SkyPilot's accelerator name of each shipped device profile (``sky show-gpus`` names).
SKY_ACCELERATORS = {
    "h100-sxm": "H100",
    "h100-hbm2e": "H100",
    "h200": "H200",
    "a100-80g": "A100-80GB",
    "a100-40g": "A100",
    "v100-16g": "V100",
}
# Kubernetes' resource name for an NVIDIA GPU (NVIDIA's device plugin).
K8S_GPU = "nvidia.com/gpu"


@dataclass(frozen=True)
class LaunchSettings:
    """What every launch file needs besides the plan: where the plan is (as the job sees it),
    the ``plan run`` flags to pass on, and the container image (Kubernetes)."""

    plan_path: str
    run_flags: tuple[str, ...] = ()
    image: str = DEFAULT_IMAGE


def node_layout(plan: Plan) -> tuple[int, int]:
    """(nodes, processes per node) of the plan's mesh on its cluster."""
    nodes = plan.cluster.nodes
    world = plan.mesh.size
    if world % nodes:
        raise UserInputError(
            f"the plan's {world} ranks do not split over its {nodes} nodes: plan again with "
            "--nodes dividing the GPU count"
        )
    return nodes, world // nodes


def plan_run(settings: LaunchSettings, nodes: str, rank: str, endpoint: str) -> str:
    """The per-node command line, with the node values as shell expressions."""
    fixed = shlex.join(["plan", "run", settings.plan_path, *settings.run_flags])
    return f'{fixed} --nnodes {nodes} --node-rank {rank} --rdzv-endpoint "{endpoint}"'


def slurm(plan: Plan, settings: LaunchSettings) -> Export:
    """``sbatch meshplan.sbatch``: one task per node (``srun``), the first node's host the
    rendezvous."""
    nodes, per_node = node_layout(plan)
    command = plan_run(settings, "$SLURM_NNODES", "$SLURM_NODEID", f"$HEAD:{RDZV_PORT}")
    text = "\n".join([
        "#!/bin/bash",
        f"# meshplan: {settings.plan_path} on {nodes} x {per_node} {plan.cluster.profile}",
        "#SBATCH --job-name=meshplan",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={per_node}",
        "#SBATCH --exclusive",
        "set -euo pipefail",
        'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export HEAD",
        f"srun --nodes={nodes} --ntasks-per-node=1 bash -c {shlex.quote(command)}",
        "",
    ])  # fmt: skip
    return Export(engine="slurm", files={"meshplan.sbatch": text}, command="sbatch meshplan.sbatch")


def kubernetes(plan: Plan, settings: LaunchSettings) -> Export:
    """A Kubeflow training-operator ``PyTorchJob``: a Master and nodes - 1 Workers, one pod a
    node; the operator gives every pod ``MASTER_ADDR``, ``MASTER_PORT`` and ``RANK``."""
    nodes, per_node = node_layout(plan)
    command = plan_run(settings, str(nodes), "$RANK", "$MASTER_ADDR:$MASTER_PORT")

    def replica(count: int) -> dict:
        container = {
            "name": "pytorch",  # the name the training operator looks for
            "image": settings.image,
            "command": ["bash", "-c", command],
            "ports": [{"containerPort": RDZV_PORT, "name": "pytorchjob-port"}],
            "resources": {"limits": {K8S_GPU: str(per_node)}},  # a Quantity: a string
        }
        return {
            "replicas": count,
            "restartPolicy": "OnFailure",
            "template": {"spec": {"containers": [container]}},
        }

    specs = {"Master": replica(1)}
    if nodes > 1:
        specs["Worker"] = replica(nodes - 1)
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "meshplan"},
        "spec": {"pytorchReplicaSpecs": specs},
    }
    # JSON is YAML: kubectl apply -f reads it as is
    return Export(
        engine="kubernetes",
        files={"meshplan-pytorchjob.yaml": json.dumps(manifest, indent=2) + "\n"},
        changes=[f"the image {settings.image} must hold meshplan and {settings.plan_path}"],
        command="kubectl apply -f meshplan-pytorchjob.yaml",
    )


def skypilot(plan: Plan, settings: LaunchSettings) -> Export:
    """A SkyPilot task: ``num_nodes`` and ``resources.accelerators`` from the plan, this
    directory synced as the workdir, the first of ``SKYPILOT_NODE_IPS`` the rendezvous."""
    nodes, per_node = node_layout(plan)
    profile = Path(plan.cluster.profile).stem
    accelerator = SKY_ACCELERATORS.get(profile)
    changes = []
    if accelerator is None:
        accelerator = profile.upper()
        changes.append(f"profile {profile} has no known SkyPilot name: check {accelerator}")
    command = plan_run(settings, "$SKYPILOT_NUM_NODES", "$SKYPILOT_NODE_RANK", f"$HEAD:{RDZV_PORT}")
    run = f'HEAD=$(echo "$SKYPILOT_NODE_IPS" | head -n1)\n{command}\n'
    lines = [
        "name: meshplan",
        f"num_nodes: {nodes}",
        "resources:",
        f"  accelerators: {accelerator}:{per_node}",
        "workdir: .",
        "setup: |",
        "  pip install -e .",
        "run: |",
        *(f"  {line}" for line in run.splitlines()),
        "",
    ]
    return Export(
        engine="skypilot",
        files={"meshplan-sky.yaml": "\n".join(lines)},
        changes=changes,
        command="sky launch -c meshplan meshplan-sky.yaml",
    )


EMITTERS = {"slurm": slurm, "kubernetes": kubernetes, "skypilot": skypilot}


def launch_files(plan: Plan, scheduler: str, settings: LaunchSettings) -> Export:
    if scheduler not in EMITTERS:
        raise UserInputError(
            f"unknown scheduler {scheduler!r}: choose one of {', '.join(SCHEDULERS)}"
        )
    return EMITTERS[scheduler](plan, settings)
