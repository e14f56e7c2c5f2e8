"""Time, money, energy and carbon of a whole training run, each formula written once.

From one plan's prediction (step time, busy share) and one node type's figures:

    steps          = ceil(tokens / (global batch x sequence length))      (or --steps)
    train_s        = steps x step_time_s
    wall_s         = train_s / effective_time_fraction                    (checkpoints, restarts)
    gpu_hours      = gpus x wall_s / 3600
    cost_usd       = gpu_hours x price_per_gpu_hour
    gpu_watts      = idle + (busy - idle) x u,   u = the plan's busy share (``busy_share``)
    it_watts       = gpus x gpu_watts + nodes x node_watts
    energy_kwh     = it_watts x wall_s / 3.6e6 x PUE
    carbon_kg      = energy_kwh x carbon_g_per_kwh / 1000

Power is drawn at the training utilization over the whole wall time, restarts included: the
allowance is wall time the run pays for, and a GPU waiting for a restart still holds its node.

A GPU draws near its cap whenever kernels run, whatever share of its peak FLOP/s they reach:
on one H200 (nvidia-smi every 250 ms, 2026-11-27, ``reports/power/``) a Llama-3.2-1B training
step at MFU 0.41 drew 682 W (median of the busy samples), a bf16 GEMM loop at 0.68 of the peak
692 W, and the same GPU 120 W holding a CUDA context with no kernel running (77.8 W with no
process at all), so interpolating between idle and busy in MFU would have put that step at
330 W, half its draw. The utilization is the share of the step the GPU has kernels to run:
the step less its pipeline bubble, its exposed data-parallel communication and its wait for an
offloaded optimizer step. ``gpu_idle_watts`` left out (idle = busy) gives the upper bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.resources.pool import NodeType


@dataclass(frozen=True)
class RunCost:
    """What one (kind, count) option costs for the whole run."""

    steps: int
    wall_s: float
    gpu_hours: float
    cost_usd: float
    gpu_watts: float
    energy_kwh: float
    carbon_kg: float

    @property
    def wall_h(self) -> float:
        return self.wall_s / 3600.0


def steps_for(tokens: int, tokens_per_step: int) -> int:
    """Whole steps that train at least ``tokens`` tokens."""
    return math.ceil(tokens / tokens_per_step)


def busy_share(step_time_s: float, bubble_s: float, dp_exposed_s: float, offload_s: float):
    """The share of a step during which the GPU runs kernels (see the module docstring): all of
    it but the pipeline bubble, the exposed data-parallel communication and the offload wait."""
    if step_time_s <= 0:
        return 0.0
    idle = bubble_s + dp_exposed_s + offload_s
    return min(max(1.0 - idle / step_time_s, 0.0), 1.0)


def prediction_busy_share(pred) -> float:
    """``busy_share`` of a plan's prediction (its step, bubble, exposed DP communication and
    offload wait)."""
    return busy_share(pred.step_time_s, pred.bubble_s, pred.dp_exposed_s, pred.offload_s)


def gpu_watts(node: NodeType, utilization: float) -> float:
    """Linear between idle and busy power in the utilization, clamped to [0, 1]."""
    u = min(max(utilization, 0.0), 1.0)
    return node.gpu_idle_watts + (node.gpu_busy_watts - node.gpu_idle_watts) * u


def run_cost(
    node: NodeType,
    nodes: int,
    gpus: int,
    steps: int,
    step_time_s: float,
    utilization: float,
    effective_time_fraction: float,
) -> RunCost:
    """The module docstring's formulas, for ``nodes`` nodes holding ``gpus`` GPUs."""
    wall_s = steps * step_time_s / effective_time_fraction
    gpu_hours = gpus * wall_s / 3600.0
    watts = gpu_watts(node, utilization)
    it_watts = gpus * watts + nodes * node.node_watts
    energy_kwh = it_watts * wall_s / 3.6e6 * node.pue
    return RunCost(
        steps=steps,
        wall_s=wall_s,
        gpu_hours=gpu_hours,
        cost_usd=gpu_hours * node.price_per_gpu_hour,
        gpu_watts=watts,
        energy_kwh=energy_kwh,
        carbon_kg=energy_kwh * node.carbon_g_per_kwh / 1000.0,
    )
