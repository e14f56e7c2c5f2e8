"""The words plans are made of, defined once: schedules, recompute and offload modes,
tensor-parallel styles, training dtypes, optimizers, and how many bytes an element of each
tensor dtype takes. Every other module (and the plan's JSON, and the command line) spells them
through here; each enum's value is the string the plan and the flags use."""

from __future__ import annotations

from enum import Enum


class Word(str, Enum):
    """A plan word: compares equal to, formats as and serialises to its string value."""

    def __str__(self) -> str:
        return self.value


class Schedule(Word):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved_1f1b"

    def label(self, virtual_stages: int = 1) -> str:
        """How figures, pages and the terminal name it: GPipe, 1F1B, interleaved 1F1B × v."""
        if self is Schedule.INTERLEAVED:
            return f"interleaved 1F1B × {virtual_stages}"
        return "GPipe" if self is Schedule.GPIPE else "1F1B"

    def tag(self, virtual_stages: int = 1) -> str:
        """Its compact form in a candidate's label (plan.json's alternatives): the value, the
        interleaved schedule with its chunks per rank."""
        if self is Schedule.INTERLEAVED:
            return f"interleaved 1F1B x{virtual_stages}"
        return self.value


def schedule_label(schedule: str, virtual_stages: int, pp: int) -> str:
    """``Schedule.label`` of a plan's schedule, or "no pipeline" for one stage."""
    return Schedule(schedule).label(virtual_stages) if pp > 1 else "no pipeline"


class Recompute(Word):
    NONE = "none"
    SELECTIVE = "selective"  # the cheap ops are recomputed, the products kept (SelectivePolicy)
    FULL = "full"  # only the block's input is kept


class SelectivePolicy(Word):
    """What selective recompute keeps for backward (``Training.selective_policy``), per engine."""

    CORE = "core"  # Megatron: all but the attention core between two activation products
    TORCHTITAN_OP = "torchtitan-op"  # torchtitan's per-op SAC: every other product, attention
    # meshplan's runtime (planner.checkpoint_policy): every matrix product's and attention
    # kernel's output, plus the block's input; everything else is recomputed
    RUNTIME_OP = "runtime-op"


class Offload(Word):
    NONE = "none"
    OPTIMIZER = "optimizer"  # ZeRO-Offload: optimizer states on the host
    PARAMS = "optimizer+params"  # FSDP2's CPUOffloadPolicy: weights, gradients and states


class TPStyle(Word):
    """How tensor parallelism runs one module (torch's ParallelStyle it maps to)."""

    COLWISE = "colwise"  # ColwiseParallel
    COLWISE_GATHER = "colwise_gather"  # ColwiseParallel with its output gathered at once
    ROWWISE = "rowwise"  # RowwiseParallel
    COLWISE_SP = "colwise_sp"  # takes a sequence-sharded input (sequence parallel)
    ROWWISE_SP = "rowwise_sp"  # gives a sequence-sharded output
    SEQUENCE = "sequence"  # a norm under SequenceParallel
    SP_GATHER = "sp_gather"  # all-gathers the sequence for the column-parallel weights inside
    SP_BLOCK = "sp_block"  # the block entered and left replicated
    # the same three on a token-flattened region ((batch x sequence, ...): OPT's MLP after its
    # ``reshape(-1, hidden)``), sharded along dim 0 in each rank's own token order
    COLWISE_SP_TOKENS = "colwise_sp_tokens"
    ROWWISE_SP_TOKENS = "rowwise_sp_tokens"
    SEQUENCE_TOKENS = "sequence_tokens"
    # the same for a weight stored [in, out] and applied as x @ W + b (transformers' Conv1D),
    # through meshplan's own styles (runtime.parallelize): its dim 1 split, or its dim 0
    COLWISE_IN_OUT = "colwise_in_out"
    # ColwiseParallel whose output stays a DTensor: the code after it reads global shapes
    # (runtime.dtensor_blocks); every column-parallel module of its block is one
    COLWISE_DTENSOR = "colwise_dtensor"
    COLWISE_DTENSOR_IN_OUT = "colwise_dtensor_in_out"
    COLWISE_GATHER_IN_OUT = "colwise_gather_in_out"
    ROWWISE_IN_OUT = "rowwise_in_out"


IN_OUT = "_in_out"
# A column-parallel weight whose output is k equal blocks split apart by the code after it
# (GPT-2's fused c_attn: q | k | v, read by ``split(hidden)``; Phi-3's gate | up, by
# ``chunk(2)``) is sharded by blocks, not by contiguous columns: each rank holds its slice of
# every block (DTensor's ``_StridedShard``), so the split hands each rank its own heads. The
# style then carries k: "colwise_dtensor_in_out:3".
BLOCKS = ":"


def by_blocks(style: str, k: int) -> str:
    """``style`` for a weight whose output is ``k`` blocks sharded alike (see BLOCKS)."""
    return f"{style}{BLOCKS}{k}"


def split_factor(style: str) -> int:
    """The number of blocks the output of a column-parallel style is sharded by (1: none)."""
    _, _, k = style.partition(BLOCKS)
    return int(k) if k else 1


def is_tp_style(style: object) -> bool:
    """A TPStyle, or a column-parallel style by k >= 2 blocks ("..._in_out:3"): kept a DTensor
    for the split after it, or gathered at once."""
    if not isinstance(style, str):
        return False
    name, sep, k = style.partition(BLOCKS)
    if name not in {s.value for s in TPStyle}:
        return False
    blocks_ok = base_style(name) in ("colwise_dtensor", "colwise_gather")
    return not sep or (blocks_ok and k.isdigit() and int(k) >= 2)


def weight_in_out(style: str) -> bool:
    """Whether the style is for a weight stored [in, out] (transformers' Conv1D)."""
    return style.partition(BLOCKS)[0].endswith(IN_OUT)


def base_style(style: str) -> str:
    """The style with the weight's layout and block count left out: colwise, colwise_gather,
    colwise_dtensor or rowwise."""
    return style.partition(BLOCKS)[0].removesuffix(IN_OUT)


def keeps_dtensors(tp_plan: dict[str, str]) -> bool:
    """Whether a block runs on DTensors (some column-parallel output kept a DTensor)."""
    return any(base_style(s).startswith(TPStyle.COLWISE_DTENSOR) for s in tp_plan.values())


def on_dtensors(tp_plan: dict[str, str]) -> dict[str, str]:
    """``tp_plan`` with every column-parallel output kept a DTensor (see COLWISE_DTENSOR)."""
    return {
        fqn: style.replace("colwise", "colwise_dtensor", 1)
        if base_style(style) == "colwise"
        else style
        for fqn, style in tp_plan.items()
    }


class DType(Word):
    """Training dtypes (mixed precision keeps fp32 master weights for bf16 and fp16)."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


class Optimizer(Word):
    ADAMW = "adamw"  # torch's AdamW
    SGD = "sgd"  # SGD with momentum 0.9


class DenseStrategy(Word):
    """How a recommendation model's dense part is data-parallel (planner.recsys)."""

    DDP = "ddp"  # replicated, gradients all-reduced
    FSDP = "fsdp"  # ZeRO-3 under FSDP2

    def label(self) -> str:
        return "DDP" if self is DenseStrategy.DDP else "ZeRO-3 (FSDP2)"


class BatchNormStats(Word):
    SYNCHRONIZED = "synchronized"  # over the data-parallel replicas together, as one process
    PER_REPLICA = "per_replica"  # each replica's own micro-batch (plain DDP)


SCHEDULES = tuple(s.value for s in Schedule)
BATCHNORM_STATS = tuple(b.value for b in BatchNormStats)
DENSE_STRATEGIES = tuple(d.value for d in DenseStrategy)
RECOMPUTE = tuple(r.value for r in Recompute)
OFFLOAD = tuple(o.value for o in Offload)
TP_STYLES = tuple(s.value for s in TPStyle)
SEQUENCE_STYLES = tuple(
    s.value
    for s in (
        TPStyle.COLWISE_SP,
        TPStyle.ROWWISE_SP,
        TPStyle.SEQUENCE,
        TPStyle.SP_GATHER,
        TPStyle.SP_BLOCK,
        TPStyle.COLWISE_SP_TOKENS,
        TPStyle.ROWWISE_SP_TOKENS,
        TPStyle.SEQUENCE_TOKENS,
    )
)
# The weight split of each sequence-parallel style that splits a weight (the others split
# none): the plan an eager probe of the block's code on local shards checks
# (``without_sequence``).
SEQUENCE_WEIGHT_STYLE = {
    TPStyle.COLWISE_SP.value: TPStyle.COLWISE.value,
    TPStyle.COLWISE_SP_TOKENS.value: TPStyle.COLWISE.value,
    TPStyle.ROWWISE_SP.value: TPStyle.ROWWISE.value,
    TPStyle.ROWWISE_SP_TOKENS.value: TPStyle.ROWWISE.value,
}


def without_sequence(tp_plan: dict[str, str]) -> dict[str, str]:
    """``tp_plan`` as its weights are split, sequence parallelism left out: what the block's
    code reads on each rank inside the gathered region (the heads of its attention) is the
    same with or without it, so an eager probe of this plan judges both."""
    out = {}
    for fqn, style in tp_plan.items():
        if style not in SEQUENCE_STYLES:
            out[fqn] = style
        elif style in SEQUENCE_WEIGHT_STYLE:
            out[fqn] = SEQUENCE_WEIGHT_STYLE[style]
    return out


DTYPES = tuple(d.value for d in DType)
HALF_DTYPES = (DType.BF16.value, DType.FP16.value)
OPTIMIZERS = tuple(o.value for o in Optimizer)
# Peak-rate keys of a device profile: the training dtypes and TF32.
PEAK_DTYPES = ("fp32", "tf32", "bf16", "fp16")
# A training dtype's tensor dtype name (torch.<name>).
TENSOR_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# Bytes per element, by tensor dtype name (torch's, without "torch.").
ELEMENT_BYTES = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a training dtype's activations and weights."""
    return ELEMENT_BYTES[TENSOR_DTYPE[dtype]]
