"""The numbers one candidate's stage MILP reads (StageProblem), apart from the MILP so that the
bounds computed from them (bounds, split_bound) and the MILP can share them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GIB = float(2**30)  # memory rows in GiB: keeps the MILP's coefficients well scaled


@dataclass
class StageProblem:
    """Numbers of one outer candidate, in the shape the MILP reads them."""

    pp: int
    v: int
    m: int
    seg_len: list[int]  # L_s
    time: list[np.ndarray]  # per segment: per-option time per micro-batch (fwd+bwd+tp comm)
    state: list[np.ndarray]  # device bytes of the states per block while activations peak
    host: list[np.ndarray]
    act: list[np.ndarray]  # saved activations per in-flight micro-batch
    ws: list[np.ndarray]  # working set: transient + recompute peak
    gather: list[np.ndarray]  # ZeRO-3 / offload gathered-weight buffer (2 blocks), else 0
    optim: list[np.ndarray]  # optimizer step time per block
    offl: list[np.ndarray]  # offload transfer time per block
    has_params: list[bool]
    const_time: list[float]  # per stage, per micro-batch: p2p hops, and the loss on the last
    inflight: list[float]  # per stage: micro-batches' worth of its activations held (chunk_held)
    const_mem: list[float]  # per rank: reserved + p2p buffers + tied copies (fixed_memory)
    capacity: float
    host_capacity: float
    # Exposed data-parallel communication of a stage, max(0, A) + max(0, B): per segment, each
    # option's share of A and of B (costmodel.dp_block_terms), and what a stage holding
    # parameters pays once (costmodel.dp_stage_terms).
    dp_first: list[np.ndarray]
    dp_second: list[np.ndarray]
    dp_once: tuple[float, float] = (0.0, 0.0)
    const_step: float = 0.0  # per step, whatever the placement: tied weights' gradient sum
    allowed: list[np.ndarray] | None = None  # per segment: options this candidate may use
    # device bytes per block during the optimizer step (cost.memory.step_state_bytes); with
    # const_mem they must fit too. None: the step never peaks above the activations.
    step: list[np.ndarray] | None = None
    # per rank: the loss's peak, which shares the working set's slot (X_r >= it); None: 0
    loss_mem: list[float] | None = None

    def __post_init__(self) -> None:
        if self.loss_mem is None:
            self.loss_mem = [0.0] * self.pp
