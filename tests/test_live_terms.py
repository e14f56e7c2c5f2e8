"""Cost-model terms that the rest of the default suite left dead: each is checked here at
inputs where it changes the number (issue 53's bugs that no test caught).

- The CPU backward's per-op dispatch cost is paid by the ops that have a backward: a frozen
  layer's ops (no gradient) run in forward only.
- The largest op's working memory grows with the micro-batch the plan runs, not the traced one.

References are hand counts of the model's ops and closed-form byte counts of its tensors."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import cluster_of

from planner.api import trace
from planner.cost.block_options import block_options
from planner.cost.sharding import tp_variants
from planner.trace.blocks import Block
from planner.training import Training

FP32 = Training(8, "fp32", "adamw")
FWD_OP, BWD_OP = 2e-3, 5e-3  # per-op host overheads, large enough to dwarf nothing else


def _none_option(graph, block: Block, mbs: int, cl, training: Training = FP32):
    opts = block_options(graph, block, tp_variants(graph, block, 1), mbs, cl, [0], training,
                         offload_allowed=False)  # fmt: skip
    return next(o for o in opts if o.recompute == "none")


@pytest.fixture(scope="module")
def frozen_mlp():
    """tests/models/frozen_mlp.py: blocks 0 (input projection) and 1 (linear, tanh) frozen,
    2 (linear, tanh) and 3 (addmm of a frozen weight with a trained bias, tanh) trained above
    them, 4 the trained head."""
    return trace("tests/models/frozen_mlp.py", {"size": "tiny"}, traced_batch_size=1, dtype="fp32")


def _overheads(graph, block: Block, mbs: int = 1) -> tuple[float, float]:
    """(forward, backward) time of the block's plain option that the per-op overheads add: the
    option on a CPU profile with FWD_OP and BWD_OP, less the same profile with both 0."""
    cpu = cluster_of(1, "cpu")
    paid = replace(cpu.profile, op_overhead=FWD_OP, backward_op_overhead=BWD_OP)
    free = replace(cpu.profile, op_overhead=0.0, backward_op_overhead=0.0)
    with_ = _none_option(graph, block, mbs, replace(cpu, profile=paid))
    without = _none_option(graph, block, mbs, replace(cpu, profile=free))
    return with_.fwd_s - without.fwd_s, with_.bwd_s - without.bwd_s


def test_the_cpu_backward_pays_dispatch_only_for_ops_with_a_gradient(frozen_mlp):
    """Forward: every op (linear; linear, tanh; linear, tanh; addmm, tanh; linear). Backward:
    only the ops downstream of a trained parameter, none in the frozen blocks 0 and 1."""
    fwd_ops, bwd_ops = [1, 2, 2, 2, 1], [0, 0, 2, 2, 1]
    for block, f, b in zip(frozen_mlp.blocks, fwd_ops, bwd_ops, strict=True):
        fwd, bwd = _overheads(frozen_mlp.graph, block)
        assert fwd == pytest.approx(f * FWD_OP), block.name
        assert bwd == pytest.approx(b * BWD_OP), block.name


def test_a_block_mixing_frozen_and_trained_ops_pays_backward_dispatch_for_the_trained(frozen_mlp):
    """Blocks 1 and 2 as one block: four forward ops, two of them (block 2's linear and tanh)
    with a backward; the overheads do not grow with the micro-batch (one dispatch per op)."""
    one, two = frozen_mlp.blocks[1], frozen_mlp.blocks[2]
    merged = replace(
        two,
        nodes=one.nodes + two.nodes,
        param_names=one.param_names + two.param_names,
        params=one.params + two.params,
    )
    for mbs in (1, 4):
        fwd, bwd = _overheads(frozen_mlp.graph, merged, mbs)
        assert fwd == pytest.approx(4 * FWD_OP)
        assert bwd == pytest.approx(2 * BWD_OP)


# examples/gpt.py's attention at 4 heads and 256 positions: its largest op is the causal mask's
# masked_fill, reading the 4 x 256 x 256 fp32 scores and the 256 x 256 bool mask and writing
# the scores
HEADS, SEQ = 4, 256
MASKED_FILL_BYTES = 2 * HEADS * SEQ * SEQ * 4 + SEQ * SEQ


@pytest.mark.parametrize("mbs", [1, 2, 4])
def test_the_largest_ops_working_memory_is_taken_at_the_chosen_micro_batch(mbs):
    """Traced at micro-batch 1, planned at ``mbs``: the working memory of the largest op is
    ``mbs`` times its traced bytes (its scores are per sample)."""
    args = {"size": "tiny", "layers": 2, "hidden": 64, "heads": HEADS, "seq_len": SEQ,
            "vocab": 128}  # fmt: skip
    traced = trace("examples/gpt.py", args, traced_batch_size=1, dtype="fp32")
    layer = traced.blocks[1]
    assert layer.transient_bytes == MASKED_FILL_BYTES  # the trace's count, by hand
    for o in block_options(traced.graph, layer, tp_variants(traced.graph, layer, 1), mbs,
                           cluster_of(1, "cpu"), [0], FP32):  # fmt: skip
        want = mbs * MASKED_FILL_BYTES
        assert o.transient_bytes == pytest.approx(want), (o.recompute, o.offload)
