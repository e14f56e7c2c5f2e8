"""The cost model against published GPU training measurements.

    python benchmarks/published.py [--measurements FILE] [--only ID,ID]

For every row of a measurements file (format: ../shared/reference/measurements.md), rebuild the
model at the stated shape on the meta device, pin the stated configuration, price it with
meshplan's cost model on the matching hardware profile and compare the predicted step time (and
peak memory, where the row gives it) with the measurement. Writes
``reports/published/published.{json,md,png}``.

Nothing here is fitted per row or per source: a row is read into a ``Setup`` (shape, layout,
precision, recompute, hardware), priced by ``planner.cost.step.evaluate`` on a ``Config`` built
from it, and compared. A row whose shape or parallel layout is not stated is skipped with the
reason. Where a row leaves a setting unstated that its framework fixes by default, the default
is used and named in the row's ``assumed`` list (it is printed with the table):

- vpp not stated: 1 (no interleaving; DeepSpeed's pipeline has none, Megatron's needs a flag);
- sequence parallelism not stated with TP > 1: on (Megatron-Core and NeMo recipes set it;
  torchtitan's TP plan always shards norms over the sequence), but off in BLOOM's 2022
  Megatron-DeepSpeed runs (it predates sequence parallelism);
- ZeRO not stated / "no FSDP" in a Megatron-family table: the distributed optimizer (ZeRO-1),
  NeMo's and Megatron-Bridge's default;
- recompute not stated: none (Megatron-LM's and NeMo's default without --recompute-*);
- ffn not stated for a GPT-architecture model: 4h (the architecture's definition); kv heads not
  stated: the head count (multi-head attention);
- the model family from the row's name (``NAMED_FAMILIES``), or for a name of no known family
  the one candidate architecture whose parameter count at the stated shape matches the row's
  ``params_b`` (``parse_family``); vocabulary not stated: the named family's tokenizer
  (``FAMILY_VOCABS``);
- gpus per node not stated: 8 (every system in the set is an 8-GPU HGX/DGX node);
- torchtitan's "local batch N per DP rank": N sequences per replica per step, no gradient
  accumulation, and under a pipeline as many micro-batches as stages (``parse_mbs``);
- llm-foundry's MPT tables on Hopper: 2023 flash-attention builds without Hopper kernels, a
  fitted attention class of their own (``parse_legacy_attention``);
- recompute not stated in BLOOM's Megatron-DeepSpeed runs: full (``parse_recompute``);
- what a framework keeps or runs differently from meshplan's eager runtime, read from the row's
  source and notes (``parse_framework_memory``, ``parse_native_attention``, ``parse_fusion``,
  ``is_megatron_core``): torchtitan's per-op selective checkpointing, vocab-parallel losses,
  DeepSpeed's BF16_Optimizer, Transformer Engine's attention and fused element-wise kernels,
  Megatron-Core's sequence-shard pipeline sends and their overlap in its interleaved schedule,
  and its weight-gradient GEMMs accumulating into the gradient buffer
  (``parse_grad_accumulation``); rows that follow NeMo's performance scripts overlap TP as
  NeMo's recipes do;
- recompute applies to the repeated transformer layers only, never to the embedding or the head
  (``recompute_per_block``: every framework in the set checkpoints its layers only);
- DeepSpeed (BLOOM's Megatron-DeepSpeed) reduces gradients after the last backward, and its fp16
  step casts the rank's gradient shard to fp32 (``is_deepspeed``, ``fp32_grad_partition``).

Errors are predicted/measured - 1 of the step time (equivalently measured/predicted - 1 of
tokens/s/GPU inverted); memory errors compare the predicted peak with the published one, both
in GiB.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

ROOT = _HERE.parent

from planner.cost.engines import (  # noqa: E402 - after the path set-up above
    NO_COPIES,
    TORCH_COPIES,
    deepspeed_buffers,
    megatron_fuses_grad_accumulation,
    megatron_sends_shards,
    native_attention_on,
)
from planner.vocab import SelectivePolicy  # noqa: E402

DEFAULT_MEASUREMENTS = ROOT.parent / "shared" / "reference" / "measurements.json"
OUT = ROOT / "reports" / "published"
DEFAULT = str(DEFAULT_MEASUREMENTS)
ERROR_BARS = ROOT / "profiles" / "error_bars.json"
GIB = 2**30
LLAMA_FILE = ROOT / "examples" / "llama.py"
GPT_FILE = _HERE / "published_gpt.py"
# Per-link rates a row's interconnect text names (bits per second): Intel Omni-Path 100 Gb/s
# per port (Intel OPA 100 series product brief); InfiniBand/RoCE rates as stated in the row.
OPA_LINK_BPS = 100e9


class Skip(Exception):
    """A row that cannot be rebuilt without guessing; the message says what is missing."""


class BadFile(Exception):
    """A measurements file that holds no rows to read; the message says why, in one line."""


@dataclass(frozen=True)
class Setup:
    """Everything a row states that the cost model needs, read from the row."""

    id: str
    source: str
    family: str  # "llama" (examples/llama.py) or "gpt" (benchmarks/published_gpt.py)
    attention: str  # "flash" (fused causal kernel) or "fused" (materialised scores)
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int
    gpus: int
    gpus_per_node: int
    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    vpp: int
    zero: int
    sp: bool
    mbs: int
    gbs: int
    dtype: str  # bf16 | fp16 (weights and activations)
    fp8: bool  # linears in fp8 (attention stays in 16 bits)
    tp_overlap: bool  # TP collectives overlapped with the GEMMs (async TP, --tp-comm-overlap)
    recompute: str  # none | selective | full
    selective_policy: str  # what selective recompute keeps (training.Training)
    vocab_parallel_loss: bool  # logits stay sharded over TP ranks for the loss
    fp32_grad_accumulation: bool  # DeepSpeed BF16_Optimizer's whole fp32 gradient buffer
    fp32_grad_partition: bool  # DeepSpeed's fp16 step: its gradient shard cast to fp32
    reduce_bucket_bytes: float  # DeepSpeed's gradient-reduction buffer (training.Training)
    native_attention: bool  # the chip's own fused attention kernel (Transformer Engine)
    legacy_attention: bool  # a flash-attention build older than the chip (llm-foundry, 2023)
    fused_elementwise: bool  # element-wise chains fused (Megatron-Core/TE, torch.compile)
    pipeline_sends_shards: bool  # Megatron sends each TP rank's sequence shard between stages
    p2p_overlap: bool  # Megatron's interleaved schedule overlaps its sends with compute
    dp_overlap: bool  # the DP gradient reduction overlaps the backward (not DeepSpeed's)
    dp_copies: str  # the DP wrapper's weight and gradient copies (training.Training)
    profile: str
    inter_node_bytes_per_s: float | None  # per GPU, from the row's interconnect text
    measured_step_s: float
    measured_mem_gib: float | None
    hardware: str  # the hardware kind the summary groups by
    assumed: tuple[str, ...] = field(default=())
    tp_overlap_async: bool = False  # the overlap is torch's async TP (training.Training)
    fused_grad_accumulation: bool = False  # Megatron's weight-gradient GEMMs accumulate
    tied_head: bool = True  # the output projection is the token embedding (gpt family)
    allocated_memory: bool = False  # the published peak is torch's allocated one, not reserved


# --------------------------------------------------------------------------- reading a row


# A whole number as text: "2048", or with thousands separators, "2,048"
_DIGITS = r"\d{1,3}(?:,\d{3})+|\d+"


def _stated(value: Any) -> bool:
    return not (isinstance(value, str) and value.strip().lower().startswith("not stated"))


def _int(row: dict, key: str, what: str | None = None) -> int:
    value = row.get(key)
    if isinstance(value, bool):
        raise Skip(f"{what or key} not stated")
    if isinstance(value, (int, float)) and float(value).is_integer() and value > 0:
        return int(value)
    # a count written as text: "2048", "2,048", or one with a remark, "8 (derived)"
    m = re.fullmatch(rf"\s*({_DIGITS})\s*(?:\(.*\))?\s*", value) if isinstance(value, str) else None
    if m and int(m.group(1).replace(",", "")) > 0:
        return int(m.group(1).replace(",", ""))
    raise Skip(f"{what or key} not stated" if not _stated(value) else f"{key} = {value!r}")


def _number(value: Any) -> float | None:
    """A positive measured figure: a number, or text that is one ("1,621", "82.5 GiB",
    "134.02 (iteration 2)"); None when not stated or not a figure."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if value > 0 and math.isfinite(value) else None
    if isinstance(value, str):
        m = re.fullmatch(rf"\s*((?:{_DIGITS})(?:\.\d+)?)\s*(?:[A-Za-z/]+)?\s*(?:\(.*\))?\s*", value)
        if m and float(m.group(1).replace(",", "")) > 0:
            return float(m.group(1).replace(",", ""))
    return None


# NVIDIA's dense Nemotron-3/4 decoders as their tables name them ("Nemotron-8B",
# "Nemotron4-15B", "Nemotron-4 340B"), not the hybrid Mamba ones (Nemotron-H, Nemotron Nano)
NEMOTRON = r"nemotron[-_ ]?(?:[34][-_ ]?)?\d+(?:\.\d+)?b\b"
# The tokenizer a named public model family ships with, for rows that name the model but not
# its vocabulary: every size of the family shares it.
FAMILY_VOCABS = (
    # meta-llama/Llama-2-7b-hf config.json: vocab_size 32000 (the 13B and 70B the same)
    (r"llama[-_ ]?2(?!\d)", 32000, "Llama 2's tokenizer"),
    # meta-llama/Meta-Llama-3-8B config.json: vocab_size 128256 (tiktoken; Llama 3.1-3.3 too)
    (r"llama[-_ ]?3(?!\d)", 128256, "Llama 3's tokenizer"),
    # Brown et al. 2020 (GPT-3), Sec. 2.1: GPT-2's byte-level BPE, 50257 tokens
    (r"gpt[-_ ]?3(?!\d)", 50257, "GPT-2's BPE, which GPT-3 uses"),
    # Parmar et al. 2024 (Nemotron-4 15B), Sec. 2: a 256,000-token SentencePiece vocabulary,
    # the tokenizer of NVIDIA's dense Nemotron-3/4 decoders (``NEMOTRON``)
    (NEMOTRON, 256000, "Nemotron's 256k tokenizer"),
)


def parse_vocab(value: Any, model: str, assumed: list[str] | None = None) -> int:
    """The vocabulary: a number, BLOOM's "~250k" (BLOOM's tokenizer padded to 250,880 rows,
    bigscience/bloom config.json vocab_size), or, unstated, the tokenizer of the public model
    family the row names (``FAMILY_VOCABS``)."""
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, str) and "250k" in value and "bloom" in model.lower():
        return 250880
    if not _stated(value):
        for pattern, vocab, what in FAMILY_VOCABS:
            if re.search(pattern, model.lower()):
                if assumed is not None:
                    assumed.append(f"vocab {vocab} ({what}; not stated in the row)")
                return vocab
    raise Skip("vocabulary not stated")


class Family(NamedTuple):
    """A model family known by name: its builder, whether its output head is the token
    embedding, and whether the architecture defines the MLP's width as 4h (GPT's), so that an
    unstated ffn is that, not a guess."""

    pattern: str
    builder: str
    tied: bool
    ffn_is_4h: bool


# Model families by name.
# "llama": examples/llama.py (gated SwiGLU MLP, RMSNorm, rotary positions, grouped-query
# attention, untied head; Mistral is the same decoder, MistralForCausalLM). "gpt":
# benchmarks/published_gpt.py (LayerNorm, non-gated MLP, Megatron's fused Q/K/V): GPT-3, MPT,
# BLOOM and OPT tie the head to the embedding, GPT-NeoX and GPT-J do not (their transformers
# configs: tie_word_embeddings false); Nemotron-4 is a non-gated GQA decoder with untied
# embeddings (Parmar et al. 2024, "Nemotron-4 15B Technical Report", Sec. 2).
NAMED_FAMILIES = (
    Family(r"llama|mistral", "llama", tied=False, ffn_is_4h=False),
    Family(r"gpt[-_ ]?(?:neox|j)\b", "gpt", tied=False, ffn_is_4h=True),
    Family(r"gpt|mpt|bloom|\bopt\b", "gpt", tied=True, ffn_is_4h=True),
    Family(NEMOTRON, "gpt", tied=False, ffn_is_4h=False),
)
# How close the parameter count a candidate architecture gives the stated shape must be to
# the row's params_b for an unnamed family to be read off it (and every other candidate not).
PARAMS_MATCH = 0.05


def decoder_params(
    family: str, tied: bool, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int,
    vocab: int, seq: int,
) -> float:  # fmt: skip
    """Parameters of a decoder of that shape as the builders make it (weights; biases and
    norms, a fraction of a percent, left out): Q/K/V and output projections, the MLP (three
    matrices gated, two not), the embedding, the head unless tied, learned positions (gpt)."""
    head_dim = hidden // heads
    attention = hidden * (heads + 2 * kv_heads) * head_dim + hidden * hidden
    mlp = (3 if family == "llama" else 2) * hidden * ffn
    embeddings = vocab * hidden * (1 if tied else 2) + (seq * hidden if family == "gpt" else 0)
    return layers * (attention + mlp) + embeddings


def parse_family(
    row: dict, model: str, layers: int, hidden: int, heads: int, vocab: int, seq: int,
    assumed: list[str],
) -> tuple[str, str, int, int, bool]:  # fmt: skip
    """(builder family, attention kernel, kv heads, ffn width, tied head) for the row's model:
    by its name (``NAMED_FAMILIES``), or, for a name of no known family, by which candidate
    architecture's parameter count matches the stated ``params_b`` (within ``PARAMS_MATCH``;
    candidates of one builder that differ only in the head's tie: the nearer count); skipped
    when none matches or candidates of two builders do."""
    name = model.lower()
    # BLOOM's 2022 Megatron-DeepSpeed runs had no FlashAttention (fused softmax kernel), nor
    # had any row whose notes say so (Megatron-LM before FlashAttention, 2022)
    notes = str(row.get("notes", "")).lower()
    plain = "bloom" in name or re.search(r"no flash-?attention", notes) is not None
    attention = "fused" if plain else "flash"
    kv_heads = _int(row, "kv_heads", "kv heads") if _stated(row.get("kv_heads")) else None
    ffn = _int(row, "ffn", "ffn width") if _stated(row.get("ffn")) else None
    named = next((f for f in NAMED_FAMILIES if re.search(f.pattern, name)), None)
    if named and named.builder == "llama":
        if kv_heads is None or ffn is None:
            raise Skip("kv heads not stated" if kv_heads is None else "ffn width not stated")
        return "llama", attention, kv_heads, ffn, False
    if named:
        if kv_heads is None:
            kv_heads = heads
        if kv_heads != heads and attention != "flash":
            raise Skip("grouped-query attention with a materialised-scores kernel")
        if ffn is None:
            if not named.ffn_is_4h:
                raise Skip("ffn width not stated")
            ffn = 4 * hidden
            assumed.append("ffn = 4h (GPT architecture)")
        return "gpt", attention, kv_heads, ffn, named.tied
    stated = _number(row.get("params_b"))
    if kv_heads is None or ffn is None or stated is None:
        raise Skip(f"no model family for {model!r}, and its size, kv heads or ffn not stated")
    shape = (layers, hidden, heads, kv_heads, ffn, vocab, seq)
    fits = [
        (family, tied, n)
        for family, tied in (("llama", False), ("gpt", True), ("gpt", False))
        for n in [decoder_params(family, tied, *shape)]
        if abs(n / (stated * 1e9) - 1) <= PARAMS_MATCH
    ]
    if len({family for family, _, _ in fits}) != 1:
        raise Skip(
            f"no model family for {model!r}: {len(fits)} candidate architectures match its "
            f"stated {stated:g}B parameters"
        )
    # A head tied or not moves a large model's count by less than the match allows: the
    # nearer count decides, and the note says so
    family, tied, n = min(fits, key=lambda c: abs(c[2] / (stated * 1e9) - 1))
    what = (
        "gated MLP, untied head"
        if family == "llama"
        else "non-gated MLP, " + ("tied head" if tied else "untied head")
    )
    which = "the one architecture" if len(fits) == 1 else "the nearer of a tied and an untied head"
    assumed.append(f"{what}: {which} at {n / 1e9:.1f}B parameters for the shape")
    return family, attention, kv_heads, ffn, tied


def source_year(row: dict) -> int | None:
    """The latest year the row's source names ("NeMo 24.07" is not one: four digits, 2015
    to 2039), or None."""
    years = [int(y) for y in re.findall(r"\b(20[1-3]\d)\b", str(row.get("source", "")))]
    return max(years) if years else None


def parse_memory_metric(row: dict, assumed: list[str]) -> bool:
    """Whether the row's peak memory is torch's allocated peak (max_memory_allocated,
    Megatron's "max allocated"), said so in its notes or memory field; otherwise it is taken as
    the caching allocator's reserved figure (torchtitan's max_reserved, nvidia-smi), what the
    sources in the set publish."""
    text = " ".join(str(row.get(k, "")) for k in ("notes", "peak_mem_gb")).lower()
    allocated = re.search(r"max(?:imum)?[_ ]memory[_ ]allocated|max allocated|allocated peak", text)
    if allocated and "reserved" not in text and _number(row.get("peak_mem_gb")):
        assumed.append("peak memory: torch's allocated peak (as the row says)")
        return True
    return False


def parse_zero(text: str, source: str, assumed: list[str]) -> int:
    """The ZeRO stage: named (ZeRO-n, FSDP's sharding strategies, FSDP2), Megatron's
    distributed optimizer (ZeRO-1) or plain DDP (0); unstated in a Megatron-family table the
    distributed optimizer, its default. Hybrid sharding (HSDP: ZeRO-3 within a group, replicas
    across groups) is a layout the cost model does not price, so it is skipped."""
    t = text.lower()
    if "hybrid" in t or "hsdp" in t:
        raise Skip(f"hybrid sharded data parallelism ({text!r}) is not priced")
    if "zero++" in t:
        raise Skip(f"ZeRO++'s quantized collectives ({text!r}) are not priced")
    if re.search(r"shard[- _]grad[- _]op", t):
        return 2
    if re.search(r"\bno[- _]shard", t):
        return 0  # FSDP's NO_SHARD: DDP's layout
    if re.search(r"full[- _]?shard|fully[- ]sharded|fsdp2|zero-3", t):
        return 3
    m = re.search(r"zero[- ]?(?:stage\s*)?(\d)", t)
    if m:
        return int(m.group(1))
    if re.search(r"\b(?:no|without)\s+distributed[- ]optimi[sz]er", t):
        return 0
    if re.search(r"distributed[- ]optimi[sz]er|\bdist[- _]opt\b", t):
        return 1
    if re.search(r"\bddp\b", t) and "fsdp" not in t:
        return 0
    # sharding named as absent: plain data parallelism
    if re.fullmatch(r"\s*(?:none|no|off|no zero|no sharding|plain (?:data parallel\w*|dp))\s*", t):
        return 0
    if re.fullmatch(r"\s*(?:pytorch\s+)?fsdp\s*(?:\(.*\))?\s*", t):
        assumed.append("FSDP's default sharding strategy (FULL_SHARD, ZeRO-3)")
        return 3
    if not _stated(text) or "no fsdp" in t:
        if any(k in source.lower() for k in ("megatron", "nemo")):
            assumed.append("distributed optimizer (ZeRO-1): Megatron-family default")
            return 1
    raise Skip(f"ZeRO/FSDP level not stated ({text!r})")


def parse_mbs(row: dict, pp: int, dp: int, gbs: int, assumed: list[str]) -> int:
    """The micro-batch size: stated, or read off a torchtitan row's "local batch N per DP rank"
    (its training.batch_size) with torchtitan's defaults: no gradient accumulation, so N
    sequences per step per replica (checked against the global batch), and under a pipeline
    as many micro-batches as stages (pipeline_parallel_microbatches unset: the PP degree)."""
    text = row.get("mbs")
    local = re.match(r"\s*local batch (\d+) per DP rank", text) if isinstance(text, str) else None
    if not local or "torchtitan" not in str(row.get("source", "")).lower():
        return _int(row, "mbs", "micro-batch size")
    n = int(local.group(1))
    if n * dp != gbs:
        raise Skip(f"local batch {n} x dp {dp} != global batch {gbs}")
    if pp == 1:
        assumed.append(f"micro-batch = the local batch {n} (torchtitan: no gradient accumulation)")
        return n
    if n % pp:
        raise Skip(f"local batch {n} does not split into {pp} pipeline micro-batches")
    assumed.append(f"{pp} micro-batches of {n // pp} (torchtitan's default: the PP degree)")
    return n // pp


def parse_dtype(text: str) -> tuple[str, bool]:
    """(16-bit dtype, fp8 linears): bf16 or fp16 where named (bfloat16/float16 too), FP8
    linears over bf16 (Transformer Engine's and torchao's recipes keep the rest in bf16)."""
    t = str(text).lower()
    if not _stated(text) and "fp8" not in t:
        raise Skip("precision not stated")
    fp8 = "fp8" in t or "float8" in t
    if t.startswith("fp16"):
        return "fp16", fp8
    if "bf16" in t or "bfloat16" in t or fp8:
        return "bf16", fp8
    if re.search(r"\b(?:fp16|float16|half)\b", t):
        return "fp16", fp8
    raise Skip(f"precision {text!r} not understood")


def parse_recompute(text: str, assumed: list[str], source: str = "") -> str:
    """The recompute mode. Unstated: none (Megatron-LM's and NeMo's default), but full for
    BigScience's BLOOM runs: Megatron-DeepSpeed's throughput log, which these rows quote,
    says "for 200B model, activation check-pointing will always be on" (megatron/training.py,
    training_log) and the tr11 launch script passes --checkpoint-activations
    (bigscience train/tr11-176B-ml/tr11-176B-ml.slurm)."""
    t = str(text).lower().strip()
    if t.startswith("none") or re.fullmatch(r"(?:no|off|false|disabled)\b.*", t):
        return "none"
    if re.fullmatch(r"(?:ac|activation checkpointing|recompute)\s*(?:off|disabled|none)", t):
        return "none"
    if t.startswith("full") or "full activation checkpointing" in t:
        return "full"
    if t.startswith("selective") or "--recompute-activations" in t:
        return "selective"  # Megatron's --recompute-activations: selective granularity
    # Megatron's full-granularity methods, its old flag, and layer-wise wording
    if re.fullmatch(r"(?:uniform|block)\b.*|(?:every|all|each) (?:transformer )?layers?\b.*", t):
        return "full"
    if "--checkpoint-activations" in t or "--recompute-granularity full" in t:
        return "full"
    # a yes/no column: checkpointing on means each layer's whole forward again (Megatron's
    # --checkpoint-activations, llm-foundry's and HF's gradient checkpointing)
    if re.fullmatch(r"(?:yes|true|on|enabled|activation checkpointing|checkpoint-activations)", t):
        assumed.append(f"full recompute: {text!r} read as every layer checkpointed")
        return "full"
    if not _stated(text):
        if "bloom" in source.lower():
            assumed.append("full recompute: BLOOM's Megatron-DeepSpeed runs")
            return "full"
        assumed.append("no recompute: framework default")
        return "none"
    raise Skip(f"recompute {text!r} not understood")


def parse_framework_memory(row: dict, tp: int, dtype: str, assumed: list[str]):
    """(selective policy, vocab-parallel loss, fp32 gradient accumulation): what the row's
    framework keeps in memory where meshplan's runtime keeps something else.

    - torchtitan's "selective" is its per-op policy (``selective_ac_option = "op"``, the
      default of its train configs): ``cost.block_options.selective_kept``'s "torchtitan-op".
    - Megatron's vocab-parallel cross-entropy (Megatron-LM, NeMo, Megatron-DeepSpeed) and
      torchtitan's loss_parallel (on unless disabled) keep the logits sharded over TP.
    - BLOOM's bf16 runs use DeepSpeed's BF16_Optimizer ("bf16 must use z0! it implements its
      own zero stage 1 equivalent", tr11-176B-ml.slurm; the rows' "fp32 grad accumulation"),
      which accumulates every gradient into a whole fp32 buffer."""
    source = str(row.get("source", "")).lower()
    titan = "torchtitan" in source
    policy = SelectivePolicy.TORCHTITAN_OP if titan else SelectivePolicy.CORE
    megatron = any(k in source for k in ("megatron", "nemo", "bloom"))
    vocab_parallel = tp > 1 and (titan or megatron)
    if vocab_parallel:
        assumed.append("vocab-parallel loss (framework default)")
    bf16_opt = "bloom" in source and dtype == "bf16"
    if bf16_opt:
        assumed.append("DeepSpeed BF16_Optimizer: fp32 gradient accumulation")
    return policy, vocab_parallel, bf16_opt


def parse_tp_overlap(row: dict, assumed: list[str]) -> tuple[bool, bool]:
    """(whether TP collectives overlap the GEMMs, whether that is torch's async TP): stated
    ("async TP" in torch-native frameworks, "--tp-comm-overlap"), or the default of NVIDIA's
    H100 performance recipes (NeMo, Megatron-Bridge: tp_comm_overlap on, Transformer Engine's
    decomposed overlap), or off ("vanilla TP", DeepSpeed, torchtitan without async TP)."""
    text = " ".join(str(row.get(k, "")) for k in ("notes", "source", "model")).lower()
    if "vanilla tp" in text:
        return False, False
    asynchronous = re.search(r"async[- ]?tp", text) is not None
    if asynchronous or "tp-comm-overlap" in text:
        return True, asynchronous and not is_megatron_core(row)
    if any(k in str(row.get("source", "")).lower() for k in ("nemo", "megatron-bridge")):
        assumed.append("TP communication overlap: NVIDIA recipe default")
        return True, False
    if is_megatron_core(row) and re.search(
        r"follows?\b[^.]*\bnemo\b[^.]*performance (?:scripts|recipes)", text
    ):
        # Megatron-LM's examples/llama README: "This configuration follows those defined in
        # NeMo Framework's performance scripts" (its table quotes NeMo's recipe runs)
        assumed.append("TP communication overlap: the NeMo performance scripts it follows")
        return True, False
    return False, False


def parse_dp_copies(row: dict, assumed: list[str]) -> str:
    """The data-parallel wrapper's copies (``Training.dp_copies``): torchtitan's FSDP2 is the
    runtime's (fp32 shards cast and gathered into copies per unit, gradients copied into an
    fp32 reduce buffer); Megatron's and DeepSpeed's 16-bit weights are the compute copies and
    their gradients land in the reduce buffers; llm-foundry's FSDP1 gathers into its flat
    parameter, whose views are the weights (no copy out), and casts only its 1/dp shard."""
    if "torchtitan" in str(row.get("source", "")).lower():
        assumed.append("FSDP2's per-unit cast and copies (torchtitan)")
        return TORCH_COPIES
    return NO_COPIES


def is_megatron_core(row: dict) -> bool:
    """NVIDIA's Megatron-Core stacks (NeMo, Megatron-Bridge, Megatron-LM): their pipeline
    sends sequence shards under sequence parallelism (get_tensor_shapes) and their interleaved
    schedule overlaps its sends with compute (overlap_p2p_comm, on unless
    --no-overlap-p2p-communication); BLOOM's 2022 Megatron-DeepSpeed predates both."""
    source = str(row.get("source", "")).lower()
    return any(k in source for k in ("nemo", "megatron-bridge", "megatron-lm", "megatron-core"))


def parse_pipeline_shards(
    row: dict, megatron_core: bool, pp: int, sp: bool, assumed: list[str]
) -> bool:
    """Whether each TP rank sends only its 1/t share of a stage's output to the next stage:
    Megatron-Core under sequence parallelism (its sequence shard, get_tensor_shapes), and
    Megatron-LM of 2021-2022 with or without it (Narayanan et al. 2021, Sec. 4.1, the
    scatter/gather optimization: split the output into t chunks, send one per rank over
    InfiniBand, all-gather over NVLink; on by default until --no-scatter-gather-tensors-in-
    pipeline)."""
    if not megatron_core or pp == 1:
        return False
    if megatron_sends_shards(pp, sp):
        return True
    year = source_year(row)
    if year is not None and year <= 2022:
        assumed.append("pipeline sends scattered over TP ranks (Megatron-LM's scatter/gather)")
        return True
    return False


def is_deepspeed(row: dict, assumed: list[str]) -> bool:
    """Whether the row ran DeepSpeed's engine (BigScience's Megatron-DeepSpeed, or DeepSpeed
    named in the row), whose gradient reduction does not overlap the backward: ZeRO's
    ``overlap_comm`` defaults to false and the PipelineEngine's TrainSchedule issues
    ReduceGrads after the last backward of the step (deepspeed/runtime/pipe/schedule.py)."""
    text = " ".join(str(row.get(k, "")) for k in ("source", "zero_or_fsdp")).lower()
    if "bloom" in text or "deepspeed" in text:
        assumed.append("DeepSpeed: gradient reduction after the backward")
        return True
    return False


def parse_deepspeed_memory(
    deepspeed: bool, zero: int, dtype: str, bf16_opt: bool, rank_params: float
) -> tuple[bool, float]:
    """(fp32 gradient partition, reduction buffer bytes) of a DeepSpeed row: DeepSpeed's
    accounting (``planner.cost.engines.deepspeed_buffers``); none for other frameworks."""
    if not deepspeed:
        return False, 0.0
    return deepspeed_buffers(zero, dtype, bf16_opt, rank_params)


def parse_grad_accumulation(megatron_core: bool, microbatches: int, assumed: list[str]) -> bool:
    """Whether the weight-gradient GEMMs accumulate into the gradient buffer: Megatron-Core's
    stacks fuse it (gradient_accumulation_fusion, on in Megatron-LM unless
    --no-gradient-accumulation-fusion, megatron/training/arguments.py; NeMo's and
    Megatron-Bridge's recipes keep it on), which matters only with several micro-batches."""
    if megatron_core and megatron_fuses_grad_accumulation(microbatches):
        assumed.append("weight-gradient accumulation fused into the GEMMs (Megatron default)")
        return True
    return False


def parse_fusion(row: dict, megatron_core: bool, assumed: list[str]) -> bool:
    """Whether element-wise chains run fused: stated (torch.compile in the row), or the
    default of NVIDIA's Megatron-Core recipes (Transformer Engine's fused normalization and
    linear, fused SwiGLU and rotary embedding: Megatron-Core's --bias-swiglu-fusion and
    --apply-rope-fusion families)."""
    text = " ".join(str(row.get(k, "")) for k in ("notes", "dtype", "source")).lower()
    if "torch.compile" in text:
        return True
    if megatron_core:
        assumed.append("fused element-wise kernels (Megatron-Core / Transformer Engine)")
        return True
    return False


def parse_native_attention(row: dict, profile: str, assumed: list[str]) -> bool:
    """Whether attention runs the chip's own fused kernel: NVIDIA's recipes (NeMo,
    Megatron-Bridge, Megatron-LM) build their layers from Transformer Engine, whose attention
    on Hopper is cuDNN's fused kernel (Megatron-Core's --attention-backend auto); torchtitan and
    llm-foundry call FlashAttention-2-class kernels (torch SDPA, flash-attn)."""
    if is_megatron_core(row) and native_attention_on(profile):
        assumed.append("Transformer Engine attention (NVIDIA recipe default)")
        return True
    return False


def parse_legacy_attention(row: dict, profile: str, assumed: list[str]) -> bool:
    """Whether attention runs a flash-attention build older than the chip: llm-foundry's MPT
    benchmark tables were measured in 2023 with flash-attn (its README: "our models use Flash
    Attention"; torch 1.13, before the tables' pending torch 2.0 update), whose kernels then
    had no Hopper path, so on H100 they reach about half of FlashAttention-2's later rate."""
    if "llm-foundry" in str(row.get("source", "")).lower() and CHIPS.get(profile) == "H100":
        assumed.append("2023 flash-attention build (llm-foundry's MPT tables; pre-Hopper kernels)")
        return True
    return False


def parse_profile(gpu: str) -> tuple[str, str]:
    """(profile name, hardware kind) for a row's GPU text."""
    g = gpu.upper()
    if "GH200" in g or re.search(r"(?:H100|A100)[\s-]*(?:\d+\s*GB[\s-]*)?(?:PCIE|NVL)", g):
        # Grace Hopper's and the PCIe/NVL cards' clocks, power, memory and links are none of
        # the profiles' (the SXM boards' NVSwitch fabric, power and clocks)
        raise Skip(f"no profile for GPU {gpu!r}")
    if "H200" in g:
        return "h200", "H200"
    if "H100" in g and "HBM2E" in g:
        return "h100-hbm2e", "H100 HBM2e (power-capped)"
    if "H100" in g:
        return "h100-sxm", "H100 SXM"
    if "A100" in g:
        size = re.search(r"(40|80)\s*G(?:B|IB)?\b", g)
        if size:
            return f"a100-{size.group(1)}g", f"A100 {size.group(1)}GB"
        # the 40 GB and 80 GB boards differ in memory and its bandwidth
        raise Skip(f"A100 memory (40 or 80 GB) not stated ({gpu!r})")
    raise Skip(f"no profile for GPU {gpu!r}")


def parse_fabric(text: str, gpus_per_node: int) -> float | None:
    """Per-GPU inter-node bytes/s the row's interconnect text states, or None (the profile's
    own fabric): "4 OPA links/node" (Omni-Path), "1600 Gbps node-node", "400 Gb/s per GPU"."""
    t = str(text)
    m = re.search(r"(\d+)\s*OPA links/node", t)
    if m:
        return int(m.group(1)) * OPA_LINK_BPS / 8 / gpus_per_node
    m = re.search(r"(\d+)\s*Gb(?:ps|/s) per GPU", t)
    if m:
        return int(m.group(1)) * 1e9 / 8
    m = re.search(r"(\d+)\s*Gbps node-node", t)
    if m:
        return int(m.group(1)) * 1e9 / 8 / gpus_per_node
    return None


def parse_row(row: dict) -> Setup:
    """The row's Setup, or ``Skip`` with the reason."""
    assumed: list[str] = []
    model = str(row.get("model", ""))
    for key, what in (("layers", "layer count"), ("hidden", "hidden size"), ("heads", "heads")):
        _int(row, key, what)
    layers, hidden, heads = _int(row, "layers"), _int(row, "hidden"), _int(row, "heads")
    seq = _int(row, "seq", "sequence length")
    vocab = parse_vocab(row.get("vocab"), model, assumed)
    family, attention, kv_heads, ffn, tied_head = parse_family(
        row, model, layers, hidden, heads, vocab, seq, assumed
    )
    tp, pp, dp = _int(row, "tp"), _int(row, "pp"), _int(row, "dp")
    cp = _int(row, "cp") if _stated(row.get("cp")) else 1
    ep = _int(row, "ep") if _stated(row.get("ep")) else 1
    if ep > 1:
        raise Skip("expert parallelism (mixture-of-experts shape not stated)")
    gpus = _int(row, "gpus")
    if tp * pp * dp * cp != gpus:
        raise Skip(f"tp*pp*dp*cp = {tp * pp * dp * cp} != {gpus} GPUs")
    if pp > 1:
        vpp_raw = row.get("vpp")
        if _stated(vpp_raw) and str(vpp_raw).strip().lower() != "n/a":
            vpp = _int(row, "vpp")
        else:
            vpp = 1
            assumed.append("no interleaving (vpp not stated)")
    else:
        vpp = 1
    gbs = _int(row, "gbs", "global batch size")
    mbs = parse_mbs(row, pp, dp, gbs, assumed)
    if gbs % (mbs * dp):
        raise Skip(f"global batch {gbs} is not a multiple of mbs x dp = {mbs * dp}")
    zero = parse_zero(str(row.get("zero_or_fsdp", "not stated")), row.get("source", ""), assumed)
    sp_text = str(row.get("sp", "not stated")).lower()
    if tp == 1:
        sp = False
    elif sp_text in ("off", "no", "false"):
        sp = False
    elif sp_text in ("on", "yes", "true"):
        sp = True
    elif "bloom" in str(row.get("source", "")).lower():
        # BigScience's Megatron-DeepSpeed of early 2022 has no sequence parallelism (it came
        # with Korthikanti et al., arXiv:2205.05198, May 2022, to Megatron-LM): TP only
        sp = False
        assumed.append("no sequence parallelism (BLOOM's 2022 Megatron-DeepSpeed)")
    elif (year := source_year(row)) is not None and year < 2022:
        sp = False
        assumed.append(f"no sequence parallelism (a {year} source: it came in May 2022)")
    else:
        sp = True
        assumed.append("sequence parallel with TP (framework default)")
    dtype, fp8 = parse_dtype(row.get("dtype", "not stated"))
    recompute = parse_recompute(row.get("recompute", "not stated"), assumed, row.get("source", ""))
    policy, vocab_parallel, bf16_opt = parse_framework_memory(row, tp, dtype, assumed)
    tp_overlap, tp_overlap_async = parse_tp_overlap(row, assumed) if tp > 1 else (False, False)
    profile, hardware = parse_profile(str(row.get("gpu", "")))
    megatron_core = is_megatron_core(row)
    if _stated(row.get("gpus_per_node")):
        gpn = _int(row, "gpus_per_node")
    else:
        gpn = 8
        assumed.append("8 GPUs per node")
    gpn = min(gpn, gpus)
    iter_s = _number(row.get("iter_s"))
    tps = _number(row.get("tokens_per_s_per_gpu"))
    if iter_s is not None:
        measured = iter_s
    elif tps is not None:
        measured = gbs * seq / (tps * gpus)
    else:
        raise Skip("no step time or throughput published")
    deepspeed = is_deepspeed(row, assumed)
    params = decoder_params(
        family, tied_head, layers, hidden, heads, kv_heads, ffn, vocab, seq
    )  # fmt: skip
    fp32_partition, reduce_bucket = parse_deepspeed_memory(
        deepspeed, zero, dtype, bf16_opt, params / (tp * pp)
    )
    if reduce_bucket:
        assumed.append(f"DeepSpeed's default reduction bucket ({reduce_bucket / 1e9:.2g} GB)")
    return Setup(
        id=str(row.get("id", "")),
        source=str(row.get("source", "")),
        family=family,
        tied_head=tied_head,
        attention=attention,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        ffn=ffn,
        vocab=vocab,
        seq=seq,
        gpus=gpus,
        gpus_per_node=gpn,
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        ep=ep,
        vpp=vpp,
        zero=zero,
        sp=sp,
        mbs=mbs,
        gbs=gbs,
        dtype=dtype,
        fp8=fp8,
        recompute=recompute,
        selective_policy=policy,
        vocab_parallel_loss=vocab_parallel,
        fp32_grad_accumulation=bf16_opt,
        fp32_grad_partition=fp32_partition,
        reduce_bucket_bytes=reduce_bucket,
        native_attention=parse_native_attention(row, profile, assumed),
        legacy_attention=parse_legacy_attention(row, profile, assumed),
        fused_elementwise=parse_fusion(row, megatron_core, assumed),
        pipeline_sends_shards=parse_pipeline_shards(row, megatron_core, pp, sp, assumed),
        p2p_overlap=megatron_core and vpp > 1,
        fused_grad_accumulation=parse_grad_accumulation(megatron_core, gbs // (mbs * dp), assumed),
        dp_overlap=not deepspeed,
        dp_copies=parse_dp_copies(row, assumed),
        tp_overlap=tp_overlap,
        tp_overlap_async=tp_overlap_async,
        profile=profile,
        inter_node_bytes_per_s=parse_fabric(row.get("interconnect", ""), gpn),
        measured_step_s=measured,
        measured_mem_gib=_number(row.get("peak_mem_gb")),
        allocated_memory=parse_memory_metric(row, assumed),
        hardware=hardware,
        assumed=tuple(assumed),
    )


# --------------------------------------------------------------------------- pricing


_VARIANTS: dict = {}  # the sharding ILP's solutions, per (block class, TP degree, rates)
TRACED_LAYERS = 2  # repeated layers share one priced class: two traced, the rest copied


def model_args(s: Setup) -> tuple[Path, dict[str, Any]]:
    layers = min(s.layers, TRACED_LAYERS)
    if s.family == "llama":
        args = dict(
            size="tiny", layers=layers, hidden=s.hidden, heads=s.heads, kv_heads=s.kv_heads,
            ffn=s.ffn, seq_len=s.seq, vocab=s.vocab,
        )  # fmt: skip
        return LLAMA_FILE, args
    args = dict(
        layers=layers, hidden=s.hidden, heads=s.heads, ffn=s.ffn, seq_len=s.seq,
        vocab=s.vocab, attention=s.attention, tied=s.tied_head and s.pp == 1,
        kv_heads=s.kv_heads,
    )  # fmt: skip
    return GPT_FILE, args


@lru_cache(maxsize=128)
def _traced(path: str, args_json: str, dtype: str):
    from planner.api import trace

    return trace(path, json.loads(args_json), traced_batch_size=1, dtype=dtype)


def full_blocks(traced_blocks: list, layers: int) -> list:
    """The model's blocks at its full depth from a trace of fewer layers: the first block
    (embedding), ``layers`` copies of the repeated layer (one class, so priced once, exactly as
    a full trace prices it) and the last block (norm and head)."""
    first, *middle, last = traced_blocks
    if not middle or len({b.cls for b in middle}) != 1:
        raise RuntimeError("the traced model's layers are not one repeated class")
    out = [replace(first, index=0)]
    out += [replace(middle[0], index=i + 1, name=f"layers.{i}") for i in range(layers)]
    out.append(replace(last, index=layers + 1))
    return out


def stage_split(layers: int, stages: int) -> list[int]:
    """Virtual stage of every block (embedding, layers, head), as the frameworks cut them.

    When the layers plus two fill the stages evenly, the embedding and the head (with the
    loss) each stand in for one layer: Megatron's account_for_embedding_in_pipeline_split /
    account_for_loss_in_pipeline_split (Llama 3.1 405B's 126 layers on 64 virtual stages:
    1 + 2 x 62 + 1) and Megatron-DeepSpeed's partition method 'type:transformer|embedding'
    (BLOOM's 70 layers on 12 stages). Otherwise the layers split as evenly as they go (the
    first ``layers % stages`` stages one more), the embedding on the first stage, the head on
    the last."""
    if stages > layers:
        raise Skip(f"{stages} pipeline stages for {layers} layers")
    if stages > 1 and (layers + 2) % stages == 0:
        per = (layers + 2) // stages
        units = [0] + [u // per for u in range(1, layers + 1)] + [stages - 1]
        return units
    base, extra = divmod(layers, stages)
    out = [0]
    for s in range(stages):
        out += [s] * (base + (1 if s < extra else 0))
    return out + [stages - 1]


def recompute_per_block(mode: str, blocks: int) -> list[str]:
    """Each block's recompute mode: the row's on the repeated transformer layers, none on the
    embedding and the head. Every framework in the set checkpoints transformer layers only:
    Megatron's full recompute wraps the layers of its TransformerBlock (its embedding and
    output layer sit outside it; Megatron-DeepSpeed's pipeline checkpoints only
    ParallelTransformerLayerPipe layers, GPTModelPipe._is_checkpointable), llm-foundry's FSDP
    ``activation_checkpointing`` wraps what MPT's ``activation_checkpointing_fn`` selects (its
    MPTBlocks), torchtitan's ``apply_ac`` wraps each of ``model.layers``."""
    return ["none"] + [mode] * (blocks - 2) + ["none"]


def cluster_for(s: Setup, **overrides: float):
    """The row's cluster: its profile, the fabric the row states, and (when fitting) other
    values of profile fields."""
    from planner.hardware.cluster import Cluster
    from planner.hardware.profiles import load_profile

    prof = load_profile(s.profile)
    if s.inter_node_bytes_per_s is not None:
        prof = replace(prof, inter_node_bandwidth=s.inter_node_bytes_per_s)
    if overrides:
        prof = replace(prof, **tied_overrides(prof, overrides))
    return Cluster(prof, max(1, s.gpus // s.gpus_per_node), s.gpus_per_node)


def price(s: Setup, **overrides: float):
    """The cost model's StepCost of the row's configuration."""
    from planner.api import variants_for
    from planner.cost.records import Config, CostInputs
    from planner.cost.step import evaluate
    from planner.schema.mesh import Mesh
    from planner.search.candidates import Pins
    from planner.search.options import price_options
    from planner.training import Training

    path, args = model_args(s)
    traced = _traced(str(path), json.dumps(args, sort_keys=True), s.dtype)
    blocks = full_blocks(traced.blocks, s.layers)
    cluster = cluster_for(s, **overrides)
    training = Training(
        s.gbs,
        s.dtype,
        "adamw",
        fp8_linears=s.fp8,
        tp_overlap=s.tp_overlap,
        tp_overlap_async=s.tp_overlap_async,
        vocab_parallel_loss=s.vocab_parallel_loss,
        fp32_grad_accumulation=s.fp32_grad_accumulation,
        fp32_grad_partition=s.fp32_grad_partition,
        reduce_bucket_bytes=s.reduce_bucket_bytes,
        selective_policy=s.selective_policy,
        native_attention=s.native_attention,
        legacy_attention=s.legacy_attention,
        fused_elementwise=s.fused_elementwise,
        pipeline_sends_shards=s.pipeline_sends_shards,
        p2p_overlap=s.p2p_overlap,
        dp_overlap=s.dp_overlap,
        dp_copies=s.dp_copies,
        fused_grad_accumulation=s.fused_grad_accumulation,
        # Megatron's and DeepSpeed's gradient buffers, and the 16-bit gradient width every row
        # was fitted with (torchtitan's FSDP2 allocates fp32 gradients lazily, as meshplan's
        # runtime does; not yet told apart here)
        persistent_grad_buffers=True,
        # Megatron-Core and DeepSpeed keep one send and one receive buffer; torchtitan's
        # torch.distributed.pipelining one per micro-batch each way, as meshplan's runtime
        microbatch_recv_buffers=s.dp_copies == TORCH_COPIES,
    )
    variant = "sequence" if s.sp else "no-sequence"
    variants_of = variants_for(traced.graph, cluster, variant, _VARIANTS)
    opts, memo = [], {}
    for mode, block in zip(recompute_per_block(s.recompute, len(blocks)), blocks):
        pins = Pins(tp=s.tp, recompute=mode, offload="none", tp_variant=variant)
        opts += price_options(
            traced.graph, [block], s.tp, s.mbs, cluster, training, pins, variants_of, s.ep, s.cp,
            memo,
        )  # fmt: skip
    choice = [min(range(len(o)), key=lambda k, o=o: o[k].time_s) for o in opts]
    schedule = "interleaved_1f1b" if s.vpp > 1 else "1f1b"
    config = Config(
        Mesh(s.pp, s.dp, s.tp, s.ep, s.cp),
        s.mbs,
        schedule,
        s.vpp,
        s.zero,
        stage_split(s.layers, s.pp * s.vpp),
        choice,
    )
    inputs = CostInputs(blocks, opts, traced.traced_batch_size, cluster, training)
    return evaluate(inputs, config)


# --------------------------------------------------------------------------- comparing


def rel_error(predicted: float, measured: float) -> float:
    """predicted / measured - 1 (positive: the model is slower / uses more)."""
    return predicted / measured - 1.0


def evaluate_row(row: dict) -> dict[str, Any]:
    """One row's record: evaluated (prediction, measurement, errors), skipped (what it does
    not state, or states that the model cannot price), or failed: a row the rebuild or the cost
    model broke on is reported with the error, never allowed to end the run over every row."""
    base = {"id": row.get("id"), "source": row.get("source"), "model": row.get("model")}
    try:
        s = parse_row(row)
        cost = price(s)
    except Skip as why:
        return {**base, "status": "skipped", "reason": str(why)}
    except Exception as exc:  # noqa: BLE001 - one row's failure is that row's result
        reason = f"failed to rebuild or price: {type(exc).__name__}: {exc}"
        return {**base, "status": "failed", "reason": reason[:300]}
    return {**base, **record(s, cost)}


def load_rows(path: str) -> list[dict]:
    """The measurement rows of ``path``: a JSON list of row objects, or an object whose
    "rows" is one (format: ../shared/reference/measurements.md). A file that is not raises
    ``BadFile`` with one line saying what is wrong."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise BadFile(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadFile(f"{path} is not JSON: {exc.msg} at line {exc.lineno}") from None
    rows = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise BadFile(
            f"{path} holds no list of measurement rows: give a JSON list of row objects, or "
            '{"rows": [...]}, as measurements.md describes'
        )
    return [{**r, "id": r.get("id", f"row-{i}")} for i, r in enumerate(rows)]


def record(s: Setup, cost) -> dict[str, Any]:
    step = cost.step_time_s
    tokens = s.gbs * s.seq
    # The published peaks are the allocator's (torchtitan's max_reserved, BLOOM's nvidia-smi
    # style figures): the allocated peak the cost model predicts, plus what the caching
    # allocator holds beyond it; a row that says it quotes the allocated peak (torch's
    # max_memory_allocated, Megatron's "max allocated") is compared with that peak itself
    from planner.cost.memory import reserved_peak

    peak = cost.peak_memory_bytes
    mem = (peak if s.allocated_memory else reserved_peak(peak, cluster_for(s).profile)) / GIB
    return {
        "status": "evaluated",
        "hardware": s.hardware,
        "profile": s.profile,
        "config": config_label(s),
        "assumed": list(s.assumed),
        "predicted_step_s": step,
        "measured_step_s": s.measured_step_s,
        "predicted_tokens_per_s_per_gpu": tokens / (step * s.gpus),
        "measured_tokens_per_s_per_gpu": tokens / (s.measured_step_s * s.gpus),
        "step_error": rel_error(step, s.measured_step_s),
        "predicted_peak_gib": mem,
        "measured_peak_gib": s.measured_mem_gib,
        "memory_error": rel_error(mem, s.measured_mem_gib) if s.measured_mem_gib else None,
        "breakdown": {
            "pipeline_s": cost.pipeline_s,
            "bubble_s": cost.bubble_s,
            "dp_exposed_s": cost.dp_exposed_s,
            "optimizer_s": cost.optimizer_s,
            "tp_comm_s_per_microbatch": sum(st.tp_comm_s for st in cost.stages),
            "compute_s_per_microbatch": sum(st.compute_s for st in cost.stages),
        },
    }


# --------------------------------------------------------------------------- fitted factors

# What is fitted: per chip, the share of the dense peak a training step reaches in each of
# three op classes, GEMMs (``matmul_efficiency``), fused attention kernels
# (``attention_efficiency``) and 16-bit products off Tensor Cores' 8-element alignment
# (``misaligned_matmul_efficiency``, cost.compute.misaligned); the best-shape microbenchmarks
# (MAMF, FlashAttention's own benchmarks) are ceilings that real steps do not reach, but on
# Hopper the attention rows priced at tritonbench's SDPA rate fit it (FITTED_BY_CHIP). Profiles
# of one chip share them. A chip whose profile has no unaligned class (0) keeps none. Beside
# them, the share of the memory bandwidth memory-bound work reaches (``elementwise_efficiency``:
# element-wise ops, the loss, the wrapper's copies): held at the 0.80 estimate while the GEMM
# share was fitted, the GEMM share carried the element-wise ops' cost too, which priced layers
# that are mostly large GEMMs (GPT-175B..1T at TP 8, llm-foundry's 13B-30B at TP 1) 10-24% slow.
FITTED = (
    "matmul_efficiency",
    "attention_efficiency",
    "misaligned_matmul_efficiency",
    "elementwise_efficiency",
)
# Where a kernel benchmark gives a class's rate, the class is not fitted: on Hopper the
# FlashAttention-2-class kernel torch's SDPA runs is priced at tritonbench's rate (the profiles'
# attention_efficiency, sourced there), and the attention factor fitted is the one of the 2023
# flash-attention builds llm-foundry's rows ran (``parse_legacy_attention``).
FITTED_BY_CHIP = {
    "A100": FITTED,
    "H100": (
        "matmul_efficiency",
        "legacy_attention_efficiency",
        "misaligned_matmul_efficiency",
        "elementwise_efficiency",
    ),
}
# Other kernels of the same op class reach the same share of their own best-shape ceiling, so
# they follow the fitted factor in a fixed ratio (the shipped profile's: FP8 GEMMs at
# MAMF-fp8 / MAMF-bf16 of the bf16 GEMMs' share; the chip's own attention kernel at the
# FlashAttention-3 / FlashAttention-2 ceiling ratio); they are not fitted themselves.
TIED = {
    "matmul_efficiency": "fp8_matmul_efficiency",
    "attention_efficiency": "native_attention_efficiency",
}


def tied_overrides(prof, overrides: dict[str, float]) -> dict[str, float]:
    """``overrides`` with each tied field moved in proportion to the fitted one it follows."""
    out = dict(overrides)
    for fitted, tied in TIED.items():
        base = getattr(prof, fitted)
        if fitted in out and tied not in out and base > 0 and getattr(prof, tied) > 0:
            out[tied] = min(1.0, getattr(prof, tied) * out[fitted] / base)
    return out


CHIPS = {
    "a100-40g": "A100",
    "a100-80g": "A100",
    "h100-sxm": "H100",
    "h200": "H100",
    "h100-hbm2e": "H100",  # the same GH100 die; its 500 W cap is left to the shared fit
}
# The fit's search grid (shares of peak) and the profile a chip's starting values come from.
GRID = [round(0.10 + 0.01 * i, 2) for i in range(86)]  # 0.10 .. 0.95
# the unaligned path's share: down to 1% (a product that falls off the Tensor Cores)
SLOW_GRID = [round(0.01 * i, 2) for i in range(1, 96)]  # 0.01 .. 0.95
# memory-bound work's share of the bandwidth: 0.20 .. 0.95
BANDWIDTH_GRID = [round(0.20 + 0.05 * i, 2) for i in range(16)]


@dataclass(frozen=True)
class Decomposition:
    """A row's predicted step time as a function of the fitted efficiencies:
    T(g, a, u, e) = gemm / g + attention / a + unaligned / u + memory / e + rest, read off five
    pricings (each efficiency halved in turn). Exact where the classes' times add; the max()
    terms of overlap, of the slowest pipeline stage and of each op's roofline make it an
    approximation, which the held-out errors and the final table (both priced in full) check."""

    chip: str
    measured: float
    gemm: float  # seconds x efficiency
    attention: float
    unaligned: float
    rest: float
    memory: float = 0.0  # memory-bound work, seconds x its share of the bandwidth

    def time(self, g: float, a: float, u: float, e: float = 1.0) -> float:
        unaligned = self.unaligned / u if u > 0 else 0.0
        return self.gemm / g + self.attention / a + unaligned + self.memory / e + self.rest


def shipped_efficiencies() -> dict[str, dict[str, float]]:
    """Each chip's fitted fields as its first shipped profile gives them."""
    from planner.hardware.profiles import load_profile

    out: dict[str, dict[str, float]] = {}
    for name, chip in CHIPS.items():
        p = load_profile(name)
        out.setdefault(chip, {f: getattr(p, f) for f in FITTED_BY_CHIP[chip]})
    return out


def decompose(s: Setup, start: dict[str, dict[str, float]]) -> Decomposition:
    chip = CHIPS[s.profile]
    eff = start[chip]
    fields = FITTED_BY_CHIP[chip]
    g, a, u, e = (eff[f] for f in fields)

    def at(**change: float) -> float:
        return price(s, **{**eff, **change}).step_time_s

    t1 = at()
    gemm, attention = (
        (at(matmul_efficiency=g / 2) - t1) * g,
        (at(**{fields[1]: a / 2}) - t1) * a,
    )
    unaligned = (at(misaligned_matmul_efficiency=u / 2) - t1) * u if u > 0 else 0.0
    memory = (at(elementwise_efficiency=e / 2) - t1) * e
    rest = t1 - gemm / g - attention / a - (unaligned / u if u > 0 else 0.0) - memory / e
    return Decomposition(
        CHIPS[s.profile], s.measured_step_s, gemm, attention, unaligned, rest, memory
    )


def fit_loss(rows: list[Decomposition], g: float, a: float, u: float, e: float = 1.0) -> float:
    """Sum of |log(predicted / measured)| over ``rows`` at efficiencies (g, a, u, e)."""
    return sum(abs(math.log(d.time(g, a, u, e) / d.measured)) for d in rows)


def fit_efficiencies(parts: list[Decomposition], start: dict[str, dict[str, float]]):
    """Per chip, the efficiencies with the least mean |log(predicted / measured)| over
    ``parts``: for each bandwidth share on ``BANDWIDTH_GRID``, (GEMM, attention) on ``GRID``
    and the unaligned class on ``SLOW_GRID`` by coordinate descent (the pair with the third
    held, then the third, twice), and the bandwidth share whose fit is best; a class no row
    of the chip uses keeps its start, and chips without rows keep ``start``."""
    out = {chip: dict(v) for chip, v in start.items()}
    for chip in out:
        rows = [d for d in parts if d.chip == chip]
        if not rows:
            continue
        e = out[chip]
        fields = FITTED_BY_CHIP[chip]
        shares = BANDWIDTH_GRID if any(d.memory > 0 for d in rows) else [e[fields[3]]]
        best = min(
            (_fit_at_bandwidth(rows, *(e[f] for f in fields[:3]), b) for b in shares),
            key=lambda fit: fit[0],
        )
        out[chip] = dict(zip(fields, best[1:]))
    return out


def _fit_at_bandwidth(rows: list[Decomposition], g: float, a: float, u: float, e: float):
    """(loss, g, a, u, e): ``fit_efficiencies``' coordinate descent at bandwidth share ``e``,
    the (g, a) grid searched at once (every pair's loss, rows on the last axis)."""
    import numpy as np

    uses_attention = any(d.attention > 0 for d in rows)
    uses_unaligned = any(d.unaligned > 0 for d in rows)
    gemm, attention, measured = (
        np.array([getattr(d, f) for d in rows]) for f in ("gemm", "attention", "measured")
    )
    for _ in range(2):
        gs, as_ = np.array(GRID), np.array(GRID if uses_attention else [a])
        fixed = np.array([d.time(math.inf, math.inf, u, e) for d in rows])  # all but g and a
        t = gemm / gs[:, None, None] + attention / as_[None, :, None] + fixed
        loss = np.abs(np.log(t / measured)).sum(axis=2)
        gi, ai = np.unravel_index(int(np.argmin(loss)), loss.shape)
        g, a = float(gs[gi]), float(as_[ai])
        if uses_unaligned:
            u = min(SLOW_GRID, key=lambda uu: fit_loss(rows, g, a, uu, e))
    return fit_loss(rows, g, a, u, e), g, a, u, e


def priced_errors(setups: list[Setup], eff: dict[str, dict[str, float]]) -> list[float]:
    return [
        rel_error(price(s, **eff[CHIPS[s.profile]]).step_time_s, s.measured_step_s) for s in setups
    ]


def cross_validate(setups: list[Setup]) -> dict[str, Any]:
    """Half-split cross-validation of the fitted factors: fit on one half of the evaluated rows
    (alternate rows in id order), price the other half in full with them, both ways. Every
    row's held-out error, with its chip and parallel form, is kept (``held_out``): the planner's
    error bars (``planner.cost.error_bars``) are their spread."""
    from planner.cost.error_bars import parallel_form

    start = shipped_efficiencies()
    parts = {s.id: decompose(s, start) for s in setups}
    a, b = half_split(setups)
    eff_a = fit_efficiencies([parts[s.id] for s in a], start)
    eff_b = fit_efficiencies([parts[s.id] for s in b], start)
    err_b, err_a = priced_errors(b, eff_a), priced_errors(a, eff_b)
    held_out = [
        {"id": s.id, "chip": CHIPS[s.profile], "form": parallel_form(s.pp, s.tp), "error": e}
        for s, e in zip(b + a, err_b + err_a)
    ]
    return {
        "held_out": held_out,
        "fit_on_first_half": eff_a,
        "median_abs_error_second_half": median_abs(err_b),
        "fit_on_second_half": eff_b,
        "median_abs_error_first_half": median_abs(err_a),
        "median_abs_error_held_out": median_abs(err_a + err_b),
        "worst_abs_error_held_out": worst_abs(err_a + err_b),
        "fit_all_rows": fit_efficiencies(list(parts.values()), start),
    }


def async_tp_pairs(setups: list[Setup]) -> list[tuple[Setup, Setup]]:
    """(without, with) pairs of rows measured alike but for torch's async TP (torchtitan's
    vanilla/async tables): what isolates the share of TP collectives async TP hides."""

    def key(s: Setup) -> Setup:
        return replace(
            s, id="", tp_overlap=False, tp_overlap_async=False, measured_step_s=0.0,
            measured_mem_gib=None, assumed=(),
        )  # fmt: skip

    plain = {key(s): s for s in setups if not s.tp_overlap}
    return [(plain[key(s)], s) for s in setups if s.tp_overlap_async and key(s) in plain]


def fit_async_tp(setups: list[Setup]) -> dict[str, Any]:
    """``async_tp_overlap`` per chip from the async-TP pairs: the share h at which the model's
    async/vanilla step-time ratio equals the measured one, on the chord of T(h) between T(0),
    the vanilla time, and T(1): h = T(0) (1 - r) / (T(0) - T(1)), r = measured async / vanilla.
    T is linear in h where the share bounds every block's exposure, and convex (below the
    chord) where a block's products bound it first, so the chord's h is at least the exact one.
    One factor per chip: the median of its pairs; the leave-one-pair-out errors price each
    async row in full with the others' median."""
    pairs = async_tp_pairs(setups)
    per_pair = []
    for plain, fast in pairs:
        t0 = price(plain).step_time_s
        t1 = price(fast, async_tp_overlap=1.0).step_time_s
        r = fast.measured_step_s / plain.measured_step_s
        per_pair.append(
            {"chip": CHIPS[fast.profile], "without": plain.id, "with": fast.id,
             "measured_ratio": r, "share": t0 * (1 - r) / (t0 - t1) if t0 > t1 else None}
        )  # fmt: skip
    fitted, held_out = {}, []
    for chip in sorted({p["chip"] for p in per_pair}):
        mine = [p for p in per_pair if p["chip"] == chip and p["share"] is not None]
        if not mine:
            continue
        fitted[chip] = round(statistics.median(p["share"] for p in mine), 2)
        for i, p in enumerate(mine):
            rest = [q["share"] for j, q in enumerate(mine) if j != i]
            if not rest:
                continue
            fast = next(f for _, f in pairs if f.id == p["with"])
            h = statistics.median(rest)
            t = price(fast, async_tp_overlap=h).step_time_s
            held_out.append(
                {"id": fast.id, "share": h, "error": rel_error(t, fast.measured_step_s)}
            )
    return {"pairs": per_pair, "fitted": fitted, "leave_one_pair_out": held_out}


def config_label(s: Setup) -> str:
    parts = [f"tp{s.tp} pp{s.pp} dp{s.dp}"]
    if s.cp > 1:
        parts.append(f"cp{s.cp}")
    if s.vpp > 1:
        parts.append(f"vpp{s.vpp}")
    parts.append(f"ZeRO-{s.zero}")
    if s.sp:
        parts.append("sp")
    parts.append(f"mbs{s.mbs} gbs{s.gbs}")
    parts.append(("fp8 " if s.fp8 else "") + s.dtype)
    parts.append(f"rc {s.recompute}")
    return " ".join(parts)


def median_abs(values: list[float]) -> float:
    return statistics.median(abs(v) for v in values) if values else math.nan


def worst_abs(values: list[float]) -> float:
    return max((abs(v) for v in values), default=math.nan)


def half_split(items: list) -> tuple[list, list]:
    """A deterministic split of evaluated rows (records or Setups) into two halves: alternate
    rows in id order, so each half holds every source in proportion."""

    def key(x):
        return str(x["id"] if isinstance(x, dict) else x.id)

    ordered = sorted(items, key=key)
    return ordered[0::2], ordered[1::2]


def unstated_skip(reason: str) -> bool:
    """Whether a row was skipped for something it does not state (its shape, layout, batch,
    precision or timing), not for something stated that the cost model cannot price (a GPU with
    no profile, hybrid sharding) or that contradicts itself (tp*pp*dp*cp against the GPUs)."""
    return "not stated" in reason or "no step time" in reason


def summarize(records: list[dict]) -> dict[str, Any]:
    done = [r for r in records if r["status"] == "evaluated"]
    errs = [r["step_error"] for r in done]
    by_kind: dict[str, list[float]] = {}
    for r in done:
        by_kind.setdefault(r["hardware"], []).append(r["step_error"])
    mem = [r["memory_error"] for r in done if r["memory_error"] is not None]
    unstated = sum(1 for r in records if r["status"] == "skipped" and unstated_skip(r["reason"]))
    stated = len(records) - unstated
    return {
        "rows": len(records),
        "evaluated": len(done),
        "skipped": len(records) - len(done),
        # rows whose shape and layout are stated (the rest lack something a rebuild needs), and
        # the share of them evaluated: what the cost model cannot price counts against it
        "stated_rows": stated,
        "evaluated_share_of_stated": len(done) / stated if stated else math.nan,
        "median_abs_step_error": median_abs(errs),
        "worst_abs_step_error": worst_abs(errs),
        "median_step_error_signed": statistics.median(errs) if errs else math.nan,
        "per_hardware": {
            k: {"rows": len(v), "median_abs": median_abs(v), "worst_abs": worst_abs(v)}
            for k, v in sorted(by_kind.items())
        },
        "memory_rows": len(mem),
        "median_abs_memory_error": median_abs(mem),
        "worst_abs_memory_error": worst_abs(mem),
    }


# --------------------------------------------------------------------------- output


def write_markdown(records: list[dict], summary: dict, path: Path, measurements: str) -> None:
    pct = lambda x: "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.1%}"  # noqa: E731
    lines = [
        "# meshplan against published GPU measurements",
        "",
        f"`python benchmarks/published.py --measurements {measurements}`",
        "",
        f"{summary['evaluated']} of {summary['rows']} rows evaluated, "
        f"{summary['skipped']} skipped or failed (reasons below); of the "
        f"{summary['stated_rows']} rows "
        f"whose shape and layout are stated, {summary['evaluated_share_of_stated']:.0%} "
        "evaluated.",
        "",
        f"- step time: median |error| {summary['median_abs_step_error']:.1%}, worst "
        f"{summary['worst_abs_step_error']:.1%} (signed median "
        f"{summary['median_step_error_signed']:+.1%}; positive = predicted slower)",
    ]
    cv = summary.get("cv")
    if cv:
        lines.append(
            "- half-split cross-validation (GEMM, attention and unaligned-product efficiency per "
            "chip fitted on one "
            "half, the other half priced with them): median |error| "
            f"{cv['median_abs_error_held_out']:.1%}, worst {cv['worst_abs_error_held_out']:.1%}; "
            f"fits {cv['fit_on_first_half']} / {cv['fit_on_second_half']}; on all rows "
            f"{cv['fit_all_rows']} (the shipped profiles' values)"
        )
    lines += [
        f"- peak memory ({summary['memory_rows']} rows): median |error| "
        f"{summary['median_abs_memory_error']:.1%}, worst {summary['worst_abs_memory_error']:.1%}",
        "",
        "| hardware | rows | median abs error | worst abs error |",
        "|---|---|---|---|",
    ]
    for k, v in summary["per_hardware"].items():
        lines.append(f"| {k} | {v['rows']} | {v['median_abs']:.1%} | {v['worst_abs']:.1%} |")
    lines += ["", *source_table(records), *error_bar_table(summary.get("error_bars"))]
    lines += [
        "",
        "| id | model | config | hardware | measured s | predicted s | error | mem GiB "
        "meas/pred | mem error | assumed (framework defaults) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if r["status"] != "evaluated":
            continue
        mem = (
            f"{r['measured_peak_gib']:.1f} / {r['predicted_peak_gib']:.1f}"
            if r["measured_peak_gib"]
            else f"- / {r['predicted_peak_gib']:.1f}"
        )
        lines.append(
            f"| {r['id']} | {r['model'][:28]} | {r['config']} | {r['hardware']} | "
            f"{r['measured_step_s']:.3g} | {r['predicted_step_s']:.3g} | "
            f"{pct(r['step_error'])} | {mem} | {pct(r['memory_error'])} | "
            f"{'; '.join(r['assumed'])} |"
        )
    lines += ["", "## Skipped", "", "| id | model | reason |", "|---|---|---|"]
    for r in records:
        if r["status"] in ("skipped", "failed"):
            lines.append(f"| {r['id']} | {str(r['model'])[:40]} | {r['reason']} |")
    path.write_text("\n".join(lines) + "\n")


def error_bar_table(bars: dict | None) -> list[str]:
    """The held-out errors' spread per chip and parallel form: what ``plan`` prints as the
    range of its prediction (``planner.cost.error_bars``)."""
    if not bars:
        return []
    out = [
        "",
        "Held-out step-time errors (predicted / measured - 1; half-split cross-validation), the "
        "error bars `plan` prints:",
        "",
        "| chip | parallel form | runs | 10th percentile | 90th percentile |",
        "|---|---|---|---|---|",
    ]
    for chip, forms in bars["spread"].items():
        for form, cell in forms.items():
            out.append(
                f"| {chip} | {form} | {cell['runs']} | {cell['low']:+.1%} | {cell['high']:+.1%} |"
            )
    return out


def source_table(records: list[dict]) -> list[str]:
    """Signed median and range of the step-time error per source: where the residual sits
    (one source off in one direction points at a term that source's stack does differently)."""
    by: dict[str, list[float]] = {}
    for r in records:
        if r["status"] == "evaluated":
            by.setdefault(str(r["source"]), []).append(r["step_error"])
    out = ["| source | rows | signed median | min | max |", "|---|---|---|---|---|"]
    for src, errs in sorted(by.items()):
        out.append(
            f"| {src} | {len(errs)} | {statistics.median(errs):+.1%} | {min(errs):+.1%} | "
            f"{max(errs):+.1%} |"
        )
    return out


def write_figure(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in records if r["status"] == "evaluated"]
    fig, ax = plt.subplots(figsize=(7, 6))
    sources = sorted({r["source"] for r in done})
    cmap = plt.get_cmap("tab20")
    for i, src in enumerate(sources):
        pts = [r for r in done if r["source"] == src]
        ax.scatter(
            [r["measured_step_s"] for r in pts],
            [r["predicted_step_s"] for r in pts],
            s=14,
            color=cmap(i % 20),
            label=src[:60],
        )
    lo = min(min(r["measured_step_s"], r["predicted_step_s"]) for r in done) / 1.5
    hi = max(max(r["measured_step_s"], r["predicted_step_s"]) for r in done) * 1.5
    xs = [lo, hi]
    ax.plot(xs, xs, color="black", lw=1, label="y = x")
    for band, style in ((0.10, "--"), (0.25, ":")):
        ax.plot(xs, [x * (1 + band) for x in xs], "grey", ls=style, lw=0.8)
        ax.plot(xs, [x * (1 - band) for x in xs], "grey", ls=style, lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title("meshplan vs published measurements (bands: +-10%, +-25%)")
    ax.legend(fontsize=5, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measurements", default=DEFAULT)
    ap.add_argument("--only", default="", help="comma-separated row ids")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--no-cv", action="store_true", help="skip the cross-validation refits")
    ap.add_argument(
        "--error-bars",
        default=None,
        help="where to write the held-out errors' spread per chip and parallel form (default: "
        "profiles/error_bars.json, written only when pricing the default dev set)",
    )
    args = ap.parse_args(argv)
    try:
        rows = load_rows(args.measurements)
    except BadFile as exc:
        print(f"published.py: error: {exc}", file=sys.stderr)
        return 2
    if args.only:
        wanted = set(args.only.split(","))
        rows = [r for r in rows if r.get("id") in wanted]
    records = [evaluate_row(r) for r in rows]
    summary = summarize(records)
    setups = [parse_row(r) for r, rec in zip(rows, records) if rec["status"] == "evaluated"]
    if not args.no_cv and len(setups) >= 2:
        summary["cv"] = cross_validate(setups)
        summary["async_tp"] = fit_async_tp(setups)
        from planner.cost import error_bars

        bars = error_bars.summarize(summary["cv"]["held_out"], CHIPS)
        summary["error_bars"] = bars
        # the planner's error bars come from the dev set only: a held-out file is priced
        # against them, never written into them
        target = args.error_bars or (ERROR_BARS if args.measurements == DEFAULT else None)
        if target:
            Path(target).write_text(json.dumps(bars, indent=1, sort_keys=True) + "\n")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shown = Path(args.measurements).name
    (out / "published.json").write_text(
        json.dumps({"measurements": shown, "summary": summary, "rows": records}, indent=1) + "\n"
    )
    write_markdown(records, summary, out / "published.md", shown)
    if summary["evaluated"]:
        write_figure(records, out / "published.png")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
