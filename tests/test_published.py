"""benchmarks/published.py: reading a published row into a configuration (and refusing to
guess), the error arithmetic, and the cost terms the published rows brought in (multi-node
collective bandwidth, fused attention and FP8 rates, overlapped TP collectives). No tracing,
no GPU: every number here is worked out by hand."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from planner.cost.compute import FLASH_BACKWARD, misaligned, op_rate, tp_exposed
from planner.hardware.cluster import Cluster
from planner.hardware.profiles import load_profile

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("published", ROOT / "benchmarks/published.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["published"] = mod
    spec.loader.exec_module(mod)
    return mod


P = _load()

BLOOM = {
    "id": "x-1",
    "source": "BLOOM prequel benchmarks (Jean Zay A100, Feb 2022)",
    "model": "BLOOM-arch 181B (h=14336, L=72)",
    "layers": 72,
    "hidden": 14336,
    "heads": 64,
    "kv_heads": 64,
    "ffn": "not stated",
    "vocab": "~250k",
    "seq": 2048,
    "gpu": "A100 80GB (Jean Zay)",
    "gpus": 384,
    "gpus_per_node": 8,
    "interconnect": "NVLink intra-node (8 GPUs/node); Omni-Path (4 OPA links/node) inter-node",
    "tp": 8,
    "pp": 12,
    "dp": 4,
    "cp": 1,
    "ep": 1,
    "vpp": "not stated",
    "zero_or_fsdp": "ZeRO-1 (DeepSpeed; stated in prequel notes)",
    "sp": "off",
    "mbs": 2,
    "gbs": 2048,
    "dtype": "fp16 (implied)",
    "recompute": "not stated (production config: full activation checkpointing)",
    "tokens_per_s_per_gpu": 81.5,
    "iter_s": 134.02,
    "peak_mem_gb": 37.0,
    "notes": "",
}

MPT = {
    "id": "x-2",
    "source": "llm-foundry MPT benchmarks: A100 40GB with 1600 Gbps node-node interconnect (RoCE)",
    "model": "MPT-7b",
    "layers": 32,
    "hidden": 4096,
    "heads": 32,
    "kv_heads": 32,
    "ffn": 16384,
    "vocab": 50368,
    "seq": 2048,
    "gpu": "A100 40GB",
    "gpus": 16,
    "gpus_per_node": "not stated",
    "interconnect": "1600 Gbps node-node RoCE",
    "tp": 1,
    "pp": 1,
    "dp": 16,
    "cp": 1,
    "ep": 1,
    "vpp": "not stated",
    "zero_or_fsdp": "PyTorch FSDP FULL_SHARD (~ZeRO-3)",
    "sp": "n/a",
    "mbs": 16,
    "gbs": 256,
    "dtype": "bf16 (pure)",
    "recompute": "full (FSDP activation_checkpointing=True)",
    "tokens_per_s_per_gpu": 3645,
    "iter_s": "not stated",
    "peak_mem_gb": "not stated",
    "notes": "",
}


# --------------------------------------------------------------------------- reading rows


def test_a_bloom_row_reads_as_megatron_deepspeed_ran_it():
    s = P.parse_row(BLOOM)
    assert (s.family, s.attention) == ("gpt", "fused")  # no FlashAttention in 2022
    assert (s.tp, s.pp, s.dp, s.vpp, s.zero, s.sp) == (8, 12, 4, 1, 1, False)
    assert (s.ffn, s.kv_heads, s.vocab) == (4 * 14336, 64, 250880)
    assert (s.dtype, s.fp8, s.recompute) == ("fp16", False, "full")
    assert s.profile == "a100-80g" and s.measured_step_s == 134.02
    assert s.measured_mem_gib == 37.0
    # 4 Omni-Path links of 100 Gb/s per 8-GPU node: 6.25 GB/s per GPU
    assert s.inter_node_bytes_per_s == pytest.approx(4 * 100e9 / 8 / 8)
    assert any("ffn = 4h" in a for a in s.assumed)
    assert any("interleaving" in a for a in s.assumed)


def test_throughput_becomes_the_step_time_and_fabric_per_gpu():
    s = P.parse_row(MPT)
    # 256 sequences x 2048 tokens at 3645 tokens/s on each of 16 GPUs
    assert s.measured_step_s == pytest.approx(256 * 2048 / (3645 * 16))
    assert (s.zero, s.recompute, s.gpus_per_node, s.profile) == (3, "full", 8, "a100-40g")
    assert s.inter_node_bytes_per_s == pytest.approx(1600e9 / 8 / 8)  # 25 GB/s per GPU
    assert s.measured_mem_gib is None


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"layers": "not stated"}, "layer count not stated"),
        ({"mbs": "local batch 8 per DP rank"}, "mbs = 'local batch 8 per DP rank'"),
        ({"dtype": "not stated (no precision column)"}, "precision not stated"),
        ({"vocab": "not stated"}, "vocabulary not stated"),
        ({"tokens_per_s_per_gpu": "not stated", "iter_s": "not stated"}, "no step time"),
        ({"dp": 3}, "tp*pp*dp*cp = 288 != 384 GPUs"),
        ({"gbs": 2049}, "not a multiple of mbs x dp"),
        ({"model": "Qwen3_30B_a3B", "vocab": 151936}, "no model family"),
    ],
)
def test_rows_that_need_a_guess_are_skipped_with_the_reason(change, reason):
    with pytest.raises(P.Skip, match=reason.replace("*", r"\*")):
        P.parse_row({**BLOOM, **change})


def test_framework_defaults_are_named_not_silent():
    row = {**BLOOM, "source": "NVIDIA Megatron-Bridge performance summary", "sp": "not stated"}
    row |= {"zero_or_fsdp": "no FSDP (FSDP=0)", "recompute": "not stated", "dtype": "FP8"}
    row |= {"gpu": "H100 (DGX-H100)", "vpp": 4, "vocab": 128256, "model": "LLAMA3-X"}
    row |= {"kv_heads": 8, "ffn": 28672}
    s = P.parse_row(row)
    assert (s.zero, s.sp, s.recompute, s.fp8, s.tp_overlap, s.vpp) == (
        1,
        True,
        "none",
        True,
        True,
        4,
    )
    assert s.family == "llama" and s.profile == "h100-sxm"
    # ZeRO-1, no recompute, sequence parallel, TP overlap, vocab-parallel loss, TE attention,
    # fused element-wise kernels, weight-gradient accumulation in the GEMMs
    assert len(s.assumed) == 8
    assert s.fused_elementwise and not P.parse_row(BLOOM).fused_elementwise
    assert s.fused_grad_accumulation and not P.parse_row(BLOOM).fused_grad_accumulation
    # one micro-batch per step: nothing to accumulate, nothing assumed
    one = P.parse_row({**row, "gbs": 8})
    assert not one.fused_grad_accumulation and len(one.assumed) == 7
    assert P.parse_row({**BLOOM, "notes": "FSDP + torch.compile"}).fused_elementwise
    assert (s.vocab_parallel_loss, s.fp32_grad_accumulation, s.selective_policy) == (
        True,
        False,
        "core",
    )
    # Megatron-Core: sequence shards between stages, sends overlapped in the interleaved
    # schedule, Transformer Engine's attention on Hopper
    assert (s.pipeline_sends_shards, s.p2p_overlap, s.native_attention) == (True, True, True)
    bloom = P.parse_row(BLOOM)
    assert (bloom.pipeline_sends_shards, bloom.p2p_overlap, bloom.native_attention) == (
        False,
        False,
        False,
    )


def test_bloom_runs_recompute_fully_and_bf16_runs_keep_fp32_gradients():
    """BLOOM's prequel rows without a recompute column ran Megatron-DeepSpeed with
    --checkpoint-activations; its bf16 rows ran DeepSpeed's BF16_Optimizer."""
    s = P.parse_row({**BLOOM, "recompute": "not stated", "dtype": "bf16"})
    assert (s.recompute, s.fp32_grad_accumulation, s.vocab_parallel_loss) == ("full", True, True)
    assert any("BLOOM's Megatron-DeepSpeed" in a for a in s.assumed)
    assert not P.parse_row(BLOOM).fp32_grad_accumulation  # fp16: DeepSpeed's ZeRO-1


def test_deepspeed_rows_reduce_after_the_backward_and_fp16_steps_cast_to_fp32():
    """BLOOM's Megatron-DeepSpeed runs: no overlap of the gradient reduction with backward,
    and (fp16) the step's fp32 copy of the gradient shard; bf16 runs keep BF16_Optimizer's
    buffer instead. Other stacks overlap and keep neither."""
    bloom = P.parse_row(BLOOM)
    assert (bloom.dp_overlap, bloom.fp32_grad_partition) == (False, True)
    assert not P.parse_row({**BLOOM, "dtype": "bf16"}).fp32_grad_partition
    mpt = P.parse_row(MPT)
    assert (mpt.dp_overlap, mpt.fp32_grad_partition) == (True, False)


def test_deepspeed_reduction_buffer_by_zero_stage_and_gradient_width():
    """DeepSpeed's reduction buffer (its February 2022 source): ZeRO-1/2's contiguous bucket
    is 5e8 16-bit elements whatever the rank holds; fp16 stage 0's buffered all-reduce
    flattens at most 5e8 of the rank's gradients; BF16_Optimizer reduces its flat fp32
    buffers in place; ZeRO-3 and other stacks none. A BLOOM fp16 ZeRO-1 row carries the
    1e9-byte bucket into its Training."""
    assert P.parse_deepspeed_memory(True, 1, "fp16", False, 1e7) == (True, 1e9)
    assert P.parse_deepspeed_memory(True, 2, "bf16", False, 1e9) == (False, 1e9)
    assert P.parse_deepspeed_memory(True, 0, "fp16", False, 3e8) == (True, 6e8)
    assert P.parse_deepspeed_memory(True, 0, "fp16", False, 2e9) == (True, 1e9)
    assert P.parse_deepspeed_memory(True, 0, "bf16", True, 2e9) == (False, 0.0)
    assert P.parse_deepspeed_memory(True, 3, "fp16", False, 2e9) == (False, 0.0)
    assert P.parse_deepspeed_memory(False, 1, "fp16", False, 2e9) == (False, 0.0)
    assert P.parse_row(BLOOM).reduce_bucket_bytes == 1e9
    assert P.parse_row(MPT).reduce_bucket_bytes == 0.0


def test_bloom_rows_without_an_sp_column_run_tp_without_sequence_parallelism():
    """Megatron-DeepSpeed of early 2022 predates sequence parallelism; a Megatron-Core row
    without the column takes its recipes' default (on)."""
    assert not P.parse_row({**BLOOM, "sp": "not stated"}).sp
    nemo = {**BLOOM, "source": "NVIDIA NeMo performance summary", "sp": "not stated"}
    assert P.parse_row(nemo | {"dtype": "bf16"}).sp


def test_only_the_transformer_layers_are_recomputed():
    assert P.recompute_per_block("full", 5) == ["none", "full", "full", "full", "none"]
    assert P.recompute_per_block("selective", 3) == ["none", "selective", "none"]


def test_torchtitan_selective_is_its_op_policy_and_its_loss_parallel():
    row = {**BLOOM, "source": "torchtitan (Dec 2024 Llama 3.1 H100 benchmark)"}
    row |= {"model": "Llama 3.1 70B", "kv_heads": 8, "ffn": 28672, "vocab": 128256}
    row |= {"recompute": "selective (config default 'op')", "dtype": "bf16"}
    s = P.parse_row(row)
    assert (s.recompute, s.selective_policy, s.vocab_parallel_loss) == (
        "selective",
        "torchtitan-op",
        True,
    )
    assert not P.parse_row({**row, "tp": 1, "dp": 384 // 12}).vocab_parallel_loss


def test_async_tp_is_read_from_the_notes():
    row = {**BLOOM, "source": "torchtitan", "notes": "FSDP 32 x TP 8 + AsyncTP"}
    assert P.parse_row(row).tp_overlap and P.parse_row(row).tp_overlap_async
    assert not P.parse_row({**row, "notes": "vanilla TP; torch.compile"}).tp_overlap
    # NVIDIA's stacks overlap by decomposition (Transformer Engine), not torch's async TP
    nvidia = P.parse_row({**row, "source": "NVIDIA Megatron-Bridge performance summary"})
    assert nvidia.tp_overlap and not nvidia.tp_overlap_async


# --------------------------------------------------------------------------- model and split


def test_stage_split_spreads_layers_and_pins_the_ends():
    # 9 layers on 4 stages: 3, 2, 2, 2; embedding on the first stage, head on the last
    assert P.stage_split(9, 4) == [0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 3]
    # 10 layers + embedding + head fill 4 stages of 3: the ends stand in for a layer each
    assert P.stage_split(10, 4) == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    split = P.stage_split(126, 64)  # Llama 3.1 405B on pp 8 x vpp 8
    assert split.count(0) == 2 and split.count(63) == 2 and split.count(30) == 2
    with pytest.raises(P.Skip):
        P.stage_split(3, 4)


def test_full_blocks_repeat_the_traced_layer_class():
    from planner.trace.blocks import Block

    def blk(i, cls):
        return Block(i, f"b{i}", [], cls, cls, [], 1, [], 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)

    out = P.full_blocks([blk(0, "e"), blk(1, "L"), blk(2, "L"), blk(3, "h")], 5)
    assert [b.cls for b in out] == ["e"] + ["L"] * 5 + ["h"]
    assert [b.index for b in out] == list(range(7))
    with pytest.raises(RuntimeError):
        P.full_blocks([blk(0, "e"), blk(1, "L"), blk(2, "M"), blk(3, "h")], 5)


# --------------------------------------------------------------------------- arithmetic


def test_error_arithmetic():
    assert P.rel_error(1.2, 1.0) == pytest.approx(0.2)
    assert P.rel_error(0.75, 1.0) == pytest.approx(-0.25)
    assert P.median_abs([0.3, -0.1, 0.2, -0.5]) == pytest.approx(0.25)
    assert P.worst_abs([0.3, -0.1, 0.2, -0.5]) == pytest.approx(0.5)
    a, b = P.half_split([{"id": f"r{i}"} for i in (3, 1, 2, 0)])
    assert [r["id"] for r in a] == ["r0", "r2"] and [r["id"] for r in b] == ["r1", "r3"]


def test_summary_counts_and_groups():
    recs = [
        {"status": "evaluated", "hardware": "A", "step_error": 0.1, "memory_error": None},
        {"status": "evaluated", "hardware": "A", "step_error": -0.3, "memory_error": 0.02},
        {"status": "evaluated", "hardware": "B", "step_error": 0.05, "memory_error": -0.04},
        {"status": "skipped", "reason": "no profile for GPU 'B200'"},
        {"status": "skipped", "reason": "layer count not stated"},
    ]
    s = P.summarize(recs)
    assert (s["rows"], s["evaluated"], s["skipped"], s["memory_rows"]) == (5, 3, 2, 2)
    # the unstated row is not held against the evaluated share; the GPU without a profile is
    assert (s["stated_rows"], s["evaluated_share_of_stated"]) == (4, pytest.approx(0.75))
    assert s["median_abs_step_error"] == pytest.approx(0.1)
    assert s["worst_abs_step_error"] == pytest.approx(0.3)
    assert s["per_hardware"]["A"]["median_abs"] == pytest.approx(0.2)
    assert s["median_abs_memory_error"] == pytest.approx(0.03)


# --------------------------------------------------------------------------- cost terms


def test_collectives_across_nodes_use_every_nic_of_the_group():
    h100 = load_profile("h100-sxm")
    c = Cluster(h100, nodes=4, gpus_per_node=8)
    eff, nic, nvl = h100.collective_efficiency, h100.inter_node_bandwidth, h100.intra_node_bandwidth
    # one rank per node: the NIC rate
    assert c.link([0, 8, 16, 24])[0] == pytest.approx(nic * eff)
    # 2 ranks on each of 2 nodes: busbw = B (n-1)/(k-1) = 3 B
    assert c.link([0, 1, 8, 9])[0] == pytest.approx(3 * nic * eff)
    # 32 ranks on 4 nodes: 50 GB/s x 31/3 = 517 GB/s, capped by NVLink's 450
    assert c.link(list(range(32)))[0] == pytest.approx(nvl * eff)
    # uneven: the node holding fewest of the group's ranks (1 of 3) sets g
    n, k, g = 3, 2, 1
    assert c.link([0, 1, 8])[0] == pytest.approx(nic * g * k * (n - 1) / (n * (k - 1)) * eff)


def _cluster(profile):
    return Cluster(load_profile(profile), nodes=1, gpus_per_node=8)


def test_causal_flash_attention_runs_half_the_work_at_its_own_rate():
    c = _cluster("h100-sxm")
    p = c.profile
    node = {"op": "aten.scaled_dot_product_attention.default", "args": [{"is_causal": True}]}
    rate, work_f, work_b = op_rate(node, c, "bf16")
    assert 0 < p.attention_efficiency < p.matmul_efficiency
    assert rate == pytest.approx(989e12 * p.attention_efficiency)
    assert (work_f, work_b) == (0.5, 0.5 * 2.5 / 2)
    assert FLASH_BACKWARD == 1.25
    full = op_rate({**node, "args": [{"is_causal": False}]}, c, "bf16")
    assert full[1:] == (1.0, 1.25)
    # a profile without an attention figure prices it as any product of the dtype
    plain = Cluster(replace(p, attention_efficiency=0.0), 1, 8)
    assert op_rate(node, plain, "bf16") == (989e12 * p.matmul_efficiency, 1.0, 1.0)


def test_the_chips_own_attention_kernel_runs_at_its_own_rate():
    """Attention on Hopper at the kernel benchmark's rates (pytorch/pytorch issue 142132,
    tritonbench, one H100 shape): torch SDPA's FlashAttention-2 at 329.5 TFLOP/s, Transformer
    Engine's cuDNN kernel at 631.3, of the 989 bf16 peak."""
    c = _cluster("h100-sxm")
    p = c.profile
    node = {"op": "aten.scaled_dot_product_attention.default", "args": [{"is_causal": True}]}
    assert p.attention_efficiency == pytest.approx(329.5 / 989, abs=5e-4)
    assert p.native_attention_efficiency == pytest.approx(631.3 / 989, abs=5e-4)
    rate, work_f, _ = op_rate(node, c, "bf16", native=True)
    assert (rate, work_f) == (pytest.approx(989e12 * p.native_attention_efficiency), 0.5)
    # a chip without its own kernel figure (A100) keeps the FlashAttention-2 rate
    a100 = _cluster("a100-80g")
    assert op_rate(node, a100, "bf16", native=True) == op_rate(node, a100, "bf16")


def test_a_flash_attention_build_older_than_the_chip_runs_at_its_fitted_rate():
    """llm-foundry's 2023 MPT tables on H100 ran flash-attention without Hopper kernels: their
    attention is priced at the chip's fitted legacy share, about half the SDPA kernel's; other
    sources and chips without the figure keep the kernel benchmark's rate."""
    c = _cluster("h100-sxm")
    p = c.profile
    node = {"op": "aten.scaled_dot_product_attention.default", "args": [{"is_causal": True}]}
    assert 0 < p.legacy_attention_efficiency < p.attention_efficiency
    assert op_rate(node, c, "bf16", legacy=True)[0] == pytest.approx(
        989e12 * p.legacy_attention_efficiency
    )
    a100 = _cluster("a100-80g")
    assert op_rate(node, a100, "bf16", legacy=True) == op_rate(node, a100, "bf16")
    mpt = {**BLOOM, "source": "llm-foundry MPT benchmarks: H100 80GB BF16", "gpu": "H100 80GB"}
    assert P.parse_legacy_attention(mpt, "h100-sxm", []) is True
    assert P.parse_legacy_attention({**mpt, "source": "torchtitan"}, "h100-sxm", []) is False
    assert P.parse_legacy_attention(mpt, "a100-80g", []) is False


@pytest.mark.parametrize(
    "local, pp, dp, gbs, mbs",
    [
        (8, 1, 4, 32, 8),
        (8, 8, 8, 64, 1),
        (32, 8, 8, 256, 4),
        (8, 8, 2, 99, None),
        (6, 4, 1, 6, None),
    ],
)
def test_a_torchtitan_local_batch_is_read_with_its_defaults(local, pp, dp, gbs, mbs):
    """torchtitan's training.batch_size is per replica: no accumulation, so local x dp is the
    global batch, and under a pipeline as many micro-batches as stages; anything else is a
    skip, never a guess, as is a "local batch" in another framework's row."""
    row = {"source": "torchtitan (Dec 2024)", "mbs": f"local batch {local} per DP rank"}
    if mbs is None:
        with pytest.raises(P.Skip):
            P.parse_mbs(row, pp, dp, gbs, [])
        return
    assumed: list[str] = []
    assert P.parse_mbs(row, pp, dp, gbs, assumed) == mbs and assumed
    with pytest.raises(P.Skip):
        P.parse_mbs({**row, "source": "NeMo"}, pp, dp, gbs, [])


def test_tied_kernels_follow_the_fitted_factor_in_a_fixed_ratio():
    """Fitting the GEMM share to half the shipped one halves the FP8 GEMM share; the
    attention share to 1.2 times the shipped one moves the native kernel's alike (a share
    never passes 1)."""
    p = load_profile("h100-sxm")
    fit = {"matmul_efficiency": p.matmul_efficiency / 2}
    fit["attention_efficiency"] = p.attention_efficiency * 1.2
    out = P.tied_overrides(p, fit)
    assert out["fp8_matmul_efficiency"] == pytest.approx(p.fp8_matmul_efficiency / 2)
    assert out["native_attention_efficiency"] == pytest.approx(p.native_attention_efficiency * 1.2)
    fit["attention_efficiency"] = p.attention_efficiency * 2
    assert P.tied_overrides(p, fit)["native_attention_efficiency"] == 1.0
    a100 = load_profile("a100-80g")  # no native kernel figure: nothing to tie
    assert "native_attention_efficiency" not in P.tied_overrides(
        a100, {"attention_efficiency": 0.5}
    )


def test_fp8_linears_run_at_the_fp8_rate_only_with_a_weight():
    """FP8 GEMMs at the fitted bf16 GEMM share scaled by MAMF's fp8 / bf16 shares
    (70.9% / 80.3% on the H100 SXM)."""
    c = _cluster("h100-sxm")
    linear = {"op": "aten.linear.default", "params": ["w"]}
    fp8 = c.profile.matmul_efficiency * 0.709 / 0.803
    assert c.profile.fp8_matmul_efficiency == pytest.approx(fp8, abs=5e-4)
    assert op_rate(linear, c, "bf16", fp8=True)[0] == pytest.approx(
        1979e12 * c.profile.fp8_matmul_efficiency
    )
    assert op_rate(linear, c, "bf16", fp8=False)[0] == pytest.approx(
        989e12 * c.profile.matmul_efficiency
    )
    bmm = {"op": "aten.bmm.default"}
    assert op_rate(bmm, c, "bf16", fp8=True)[0] == pytest.approx(
        989e12 * c.profile.matmul_efficiency
    )
    a100 = _cluster("a100-80g")  # no FP8 tensor cores: the 16-bit rate
    assert op_rate(linear, a100, "bf16", fp8=True)[0] == pytest.approx(
        312e12 * a100.profile.matmul_efficiency
    )


def test_overlapped_tp_collectives_leave_only_the_excess():
    c = _cluster("h100-sxm")  # comm_overlap 1.0
    assert tp_exposed(0.3, 0.5, 1.0, 0.4, c) == pytest.approx((0.0, 0.1))
    half = Cluster(replace(c.profile, comm_overlap=0.5), 1, 8)
    assert tp_exposed(0.3, 0.5, 0.4, 2.0, half) == pytest.approx((0.1, 0.0))
    # torch's async TP hides at most its share, however long the products
    assert tp_exposed(0.3, 0.5, 10.0, 10.0, c, share=0.32) == pytest.approx((0.204, 0.34))
    # and no more than the products allow
    assert tp_exposed(0.3, 0.5, 0.05, 10.0, c, share=0.32) == pytest.approx((0.25, 0.34))


def test_async_tp_hides_its_fitted_share_in_the_step():
    """A Hopper row under torch's async TP pays (1 - async_tp_overlap) of the TP collectives
    it pays without overlap; NVIDIA's decomposed overlap of the same row hides them all
    behind its products. Priced in full on a TP 8 Llama-3 8B at torchtitan's shape."""
    row = {
        **BLOOM, "source": "torchtitan (June 2025 async-TP benchmark)", "model": "Llama 3 8B",
        "layers": 4, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336,
        "vocab": 128256, "seq": 8192, "gpu": "H100 SXM", "gpus": 8, "tp": 8, "pp": 1, "dp": 1,
        "mbs": 2, "gbs": 2, "zero_or_fsdp": "FSDP2", "dtype": "bf16", "recompute": "none",
        "notes": "vanilla TP; torch.compile",
    }  # fmt: skip
    plain = P.parse_row(row)
    fast = P.parse_row({**row, "notes": "async TP; torch.compile"})
    assert (fast.tp_overlap, fast.tp_overlap_async) == (True, True)
    assert 0 < load_profile("h100-sxm").async_tp_overlap < 1
    t0 = P.price(plain).step_time_s
    assert P.price(fast, async_tp_overlap=0.0).step_time_s == pytest.approx(t0, rel=1e-12)
    decomposed = P.price(replace(fast, tp_overlap_async=False)).step_time_s
    assert P.price(fast, async_tp_overlap=1.0).step_time_s == pytest.approx(decomposed, rel=1e-12)
    assert decomposed < P.price(fast).step_time_s < t0


def test_the_fit_recovers_each_chips_efficiencies_from_decomposed_rows():
    """T(g, a, u, e) = gemm / g + attention / a + unaligned / u + memory / e + rest: a
    GEMM-only row pins g, an attention row a, a row with unaligned products u, a row with
    0.4 s of memory-bound work at full bandwidth (1.5 s measured, 1.0 s of it GEMMs at
    g = 0.5) e = 0.8; a chip without rows keeps its starting values, a chip none of whose rows
    has unaligned products keeps its start u, one none of whose rows is memory-bound its e."""
    d = P.Decomposition
    rows = [
        d("A100", 2.0, 1.0, 0.0, 0.0, 0.0),
        d("A100", 2.0, 0.0, 0.3, 0.0, 1.0),
        d("A100", 3.0, 1.0, 0.0, 0.05, 0.0),
        d("A100", 1.5, 0.5, 0.0, 0.0, 0.0, memory=0.4),
        d("H100", 2.0, 1.0, 0.0, 0.0, 0.0),
    ]
    start = {
        "A100": dict(zip(P.FITTED_BY_CHIP["A100"], (0.9, 0.9, 0.5, 0.3))),
        "H100": dict(zip(P.FITTED_BY_CHIP["H100"], (0.9, 0.4, 0.0, 0.86))),
        "B200": {"x": 1},
    }
    fit = P.fit_efficiencies(rows, start)
    assert fit["A100"] == {
        "matmul_efficiency": 0.5,
        "attention_efficiency": 0.3,
        "misaligned_matmul_efficiency": 0.05,
        "elementwise_efficiency": 0.8,
    }
    assert fit["H100"] == {  # Hopper fits the 2023 flash-attention class, SDPA's is sourced
        "matmul_efficiency": 0.5,
        "legacy_attention_efficiency": 0.4,
        "misaligned_matmul_efficiency": 0.0,
        "elementwise_efficiency": 0.86,
    }
    assert fit["B200"] == {"x": 1}
    assert rows[1].time(0.5, 0.3, 0.05) == pytest.approx(2.0)
    assert rows[3].time(0.5, 0.3, 0.05, 0.8) == pytest.approx(1.5)


def test_a_16_bit_product_off_the_tensor_core_alignment_runs_at_its_own_rate():
    """NVIDIA's Tensor Core requirement: 16-bit dimensions in multiples of 8 elements. A
    per-head product with head dim 108 (BLOOM's 13824 / 128) is off it; 128 is on it; fp32
    products and profiles without the class (0) keep the GEMM rate."""
    c = _cluster("a100-80g")
    p = c.profile
    off = {"op": "aten.matmul.default", "mm_inner": [108, 2048, 2048, False]}
    on = {"op": "aten.matmul.default", "mm_inner": [128, 2048, 2048, False]}
    assert 0 < p.misaligned_matmul_efficiency < p.matmul_efficiency
    assert op_rate(off, c, "fp16") == (312e12 * p.misaligned_matmul_efficiency, 1.0, 1.0)
    assert op_rate(on, c, "fp16") == (312e12 * p.matmul_efficiency, 1.0, 1.0)
    assert op_rate(off, c, "fp32") == (19.5e12 * p.matmul_efficiency, 1.0, 1.0)
    plain = Cluster(replace(p, misaligned_matmul_efficiency=0.0), 1, 8)
    assert op_rate(off, plain, "fp16") == op_rate(on, c, "fp16")
    assert not misaligned({"op": "aten.linear.default", "mm_inner": None})
    # a linear layer of odd width keeps the GEMM rate (no published row prices one)
    assert not misaligned({"op": "aten.linear.default", "mm_inner": [4096, 50257, 2048, True],
                           "params": ["head.weight"]})  # fmt: skip


# --------------------------------------------------------------------------- model families


def _nemo(**change):
    row = {**BLOOM, "source": "NVIDIA NeMo 24.07 performance summary (DGX-H100, FP8)"}
    row |= {"gpu": "H100 (DGX-H100, 80GB SXM)", "sp": "not stated", "dtype": "fp8"}
    row |= {"zero_or_fsdp": "not stated", "recompute": "not stated", "vpp": 1}
    return {**row, **change}


def test_an_unstated_vocabulary_is_the_named_familys_tokenizer():
    for model, vocab in [
        ("LLAMA2-7B", 32000),
        ("Llama 3.1 405B", 128256),
        ("GPT3-175B", 50257),
        ("Nemotron-340B", 256000),
    ]:
        shape = {"kv_heads": 8 if "lama" in model.lower() else 64, "ffn": 4 * 14336}
        s = P.parse_row(_nemo(model=model, vocab="not stated", **shape))
        assert s.vocab == vocab
        assert any(f"vocab {vocab}" in a for a in s.assumed)
    # a stated vocabulary wins; a family of no known tokenizer is skipped
    assert P.parse_row(_nemo(model="GPT3-175B", vocab=51200)).vocab == 51200
    with pytest.raises(P.Skip, match="vocabulary not stated"):
        P.parse_row(_nemo(model="MPT-7b", vocab="not stated"))
    # Nemotron's hybrid Mamba models are not its dense decoders
    with pytest.raises(P.Skip, match="vocabulary not stated"):
        P.parse_row(_nemo(model="Nemotron-H 8B", vocab="not stated"))


def test_nemotron_is_an_untied_non_gated_decoder_with_grouped_queries():
    s = P.parse_row(_nemo(model="Nemotron-340B", kv_heads=8, ffn=4 * 14336, vocab=256000))
    assert (s.family, s.kv_heads, s.ffn, s.tied_head) == ("gpt", 8, 4 * 14336, False)
    path, args = P.model_args(s)
    assert path == P.GPT_FILE and args["kv_heads"] == 8 and args["tied"] is False
    # GPT-3 ties its head to the embedding (when no pipeline gives the last stage a copy)
    gpt = P.parse_row(_nemo(model="GPT3-175B", pp=1, dp=32, gpus=256, vocab=50257))
    assert gpt.tied_head and P.model_args(gpt)[1]["tied"] is True
    for untied in ("GPT-NeoX-20B", "GPT-J 6B"):
        assert not P.parse_row(_nemo(model=untied, pp=1, dp=32, gpus=256, vocab=50432)).tied_head


def test_an_unnamed_model_is_read_off_its_stated_size():
    # 32 layers of h = 6144, 48 query and 8 key/value heads, ffn 24576, vocab 256k: a
    # non-gated MLP with an untied head gives 15.7B parameters, a gated one 20.5B, a tied
    # head 14.1B
    shape = {"layers": 32, "hidden": 6144, "heads": 48, "kv_heads": 8, "ffn": 24576}
    row = _nemo(model="Mystery-15B", vocab=256000, seq=4096, **shape)
    n = P.decoder_params("gpt", False, 32, 6144, 48, 8, 24576, 256000, 4096)
    attention = 6144 * (48 + 16) * 128 + 6144**2
    assert n == 32 * (attention + 2 * 6144 * 24576) + 2 * 256000 * 6144 + 4096 * 6144
    s = P.parse_row({**row, "params_b": 15.7})
    assert (s.family, s.tied_head) == ("gpt", False)
    assert any("15.7B parameters" in a for a in s.assumed)
    gated = P.decoder_params("llama", False, 32, 6144, 48, 8, 24576, 256000, 4096)
    assert P.parse_row({**row, "params_b": gated / 1e9}).family == "llama"
    for stated in (30, "not stated"):
        with pytest.raises(P.Skip, match="no model family"):
            P.parse_row({**row, "params_b": stated})
    # a 32k vocabulary beside 32 wide layers: tied and untied heads differ by 2%, both match,
    # and the nearer count decides
    tied = P.decoder_params("gpt", True, 32, 6144, 48, 8, 24576, 32000, 4096)
    untied = P.decoder_params("gpt", False, 32, 6144, 48, 8, 24576, 32000, 4096)
    assert abs(untied / tied - 1) < 0.05
    for count, head in ((tied, True), (untied, False)):
        s = P.parse_row({**row, "vocab": 32000, "params_b": count / 1e9})
        assert (s.family, s.tied_head) == ("gpt", head)
        assert any("nearer of a tied and an untied head" in a for a in s.assumed)
    # a 256k vocabulary beside two narrow layers: the embeddings are the count, and a gated and
    # a non-gated MLP both match it: skipped
    narrow = {**row, "layers": 2, "hidden": 512, "heads": 8, "kv_heads": 8, "ffn": 512}
    n = P.decoder_params("llama", False, 2, 512, 8, 8, 512, 256000, 4096)
    assert abs(P.decoder_params("gpt", False, 2, 512, 8, 8, 512, 256000, 4096) / n - 1) < 0.05
    with pytest.raises(P.Skip, match="candidate architectures match"):
        P.parse_row({**narrow, "params_b": n / 1e9})


def test_following_nemos_performance_scripts_overlaps_tp_as_they_do():
    row = _nemo(model="LLAMA3-70B", kv_heads=8, ffn=28672, vocab=128256)
    row["source"] = "Megatron-LM examples/llama README (FP8)"
    assert not P.parse_row(row).tp_overlap
    s = P.parse_row({**row, "notes": "Config 'follows NeMo performance scripts'."})
    assert s.tp_overlap and not s.tp_overlap_async
    assert any("NeMo performance scripts" in a for a in s.assumed)


@pytest.mark.parametrize(
    "text, zero",
    [
        ("distributed optimizer", 1),
        ("Megatron distributed-optimizer", 1),
        ("no distributed optimizer", 0),
        ("DDP", 0),
        ("PyTorch FSDP", 3),
        ("FSDP2 (degree 8)", 3),
        ("PyTorch FSDP SHARD_GRAD_OP (~ZeRO-2)", 2),
        ("ZeRO stage 0", 0),
        ("FSDP full shard", 3),
        ("fully sharded data parallel", 3),
        ("FSDP NO_SHARD", 0),
        ("none", 0),
        ("plain data parallel", 0),
        ("dist-opt", 1),
    ],
)
def test_data_parallel_sharding_is_read_in_the_words_sources_use(text, zero):
    assert P.parse_zero(text, "any source", []) == zero


def test_zero_plus_plus_is_skipped_as_unpriced_not_read_as_zero_3():
    with pytest.raises(P.Skip, match="ZeRO\\+\\+"):
        P.parse_zero("ZeRO++ (hpZ)", "DeepSpeed", [])


@pytest.mark.parametrize(
    "text, mode",
    [
        ("block", "full"),  # Megatron's --recompute-method block: full granularity
        ("uniform (1 layer)", "full"),
        ("every layer", "full"),
        ("--checkpoint-activations", "full"),
        ("--recompute-activations", "selective"),  # Megatron: selective granularity
        ("AC off", "none"),
        ("yes", "full"),
        ("enabled", "full"),
    ],
)
def test_recompute_is_read_in_the_words_sources_use(text, mode):
    assumed: list[str] = []
    assert P.parse_recompute(text, assumed) == mode
    # a bare yes says so among the row's assumptions
    assert bool(assumed) == (text in ("yes", "enabled"))


def test_an_unclear_recompute_is_skipped():
    with pytest.raises(P.Skip, match="not understood"):
        P.parse_recompute("partial", [])


def test_hybrid_sharding_is_skipped_with_the_reason():
    for text in ("HYBRID_SHARD", "FSDP (hybrid, 8 per node)", "HSDP 8x4"):
        with pytest.raises(P.Skip, match="hybrid sharded data parallelism"):
            P.parse_zero(text, "torchtitan", [])


@pytest.mark.parametrize(
    "text, read",
    [
        ("mixed precision (float16)", ("fp16", False)),
        ("bfloat16", ("bf16", False)),
        ("FP8-CS", ("bf16", True)),
        ("half precision", ("fp16", False)),
    ],
)
def test_precision_is_read_in_the_words_sources_use(text, read):
    assert P.parse_dtype(text) == read


@pytest.mark.parametrize(
    "gpu, profile",
    [
        ("A100-SXM4-80GB", "a100-80g"),
        ("A100-80G", "a100-80g"),
        ("NVIDIA A100 SXM 40 GB", "a100-40g"),
        ("A100 (80GB)", "a100-80g"),
        ("H100 80GB HBM3", "h100-sxm"),
        ("H200 141GB", "h200"),
    ],
)
def test_gpus_are_read_in_the_words_sources_use(gpu, profile):
    assert P.parse_profile(gpu)[0] == profile


def test_an_a100_of_unstated_memory_is_an_unstated_skip():
    with pytest.raises(P.Skip, match="not stated") as why:
        P.parse_profile("A100")
    assert P.unstated_skip(str(why.value))


def test_an_unnamed_precision_and_gpus_without_a_profile_are_skipped():
    with pytest.raises(P.Skip, match="not understood"):
        P.parse_dtype("amp")
    for gpu in ("GH200 96GB", "H100 PCIe", "H100 NVL", "A100 PCIe 80GB", "A100-80GB-PCIe"):
        with pytest.raises(P.Skip, match="no profile"):
            P.parse_profile(gpu)
    assert P.parse_recompute("off", []) == P.parse_recompute("no checkpointing", []) == "none"


def test_a_source_dated_before_sequence_parallelism_runs_tp_without_it():
    row = _nemo(model="GPT3-175B", vocab=51200, source="Megatron-LM paper (SC 2021), Table 1")
    s = P.parse_row(row)
    assert not s.sp and any("2021 source" in a for a in s.assumed)
    assert P.parse_row({**row, "source": "NVIDIA NeMo 24.07 performance summary"}).sp
    assert P.source_year({"source": "torchtitan (Dec 2024 Llama 3.1 H100 benchmark)"}) == 2024


def test_a_file_without_rows_is_one_line_exit_2(tmp_path, capsys):
    cases = {
        "missing.json": (None, "cannot read"),
        "broken.json": ("{bad", "is not JSON"),
        "object.json": ('{"a": 1}', "holds no list of measurement rows"),
        "numbers.json": ("[1, 2]", "holds no list of measurement rows"),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        assert P.main(["--measurements", str(path), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err
    # rows under "rows", an id given to a row without one
    path = tmp_path / "wrapped.json"
    path.write_text('{"rows": [{"model": "x"}]}')
    assert P.load_rows(str(path)) == [{"model": "x", "id": "row-0"}]


def test_a_row_the_rebuild_breaks_on_fails_alone(monkeypatch):
    """One row that breaks the rebuild (here a price() that raises) is recorded as failed with
    the error, counted against the evaluated share, and the other rows still evaluate."""

    def broken(s, **overrides):
        raise RuntimeError("boom")

    monkeypatch.setattr(P, "price", broken)
    rec = P.evaluate_row(BLOOM)
    assert rec["status"] == "failed" and "RuntimeError: boom" in rec["reason"]
    s = P.summarize([rec, {"status": "skipped", "reason": "vocabulary not stated"}])
    assert (s["evaluated"], s["stated_rows"], s["evaluated_share_of_stated"]) == (0, 1, 0.0)


@pytest.mark.parametrize("text, value", [("2,048", 2048), ("8 (derived)", 8), (" 16 ", 16)])
def test_counts_written_as_text_are_read(text, value):
    assert P._int({"gbs": text}, "gbs") == value


@pytest.mark.parametrize("text", ["8 x 2", "0", "1,2"])
def test_counts_that_are_not_one_number_are_skipped(text):
    with pytest.raises(P.Skip, match="gbs = "):
        P._int({"gbs": text}, "gbs")


@pytest.mark.parametrize(
    "text, value", [("1,621", 1621.0), ("82.5 GiB", 82.5), ("134.02 (iteration 2)", 134.02)]
)
def test_measured_figures_written_as_text_are_read(text, value):
    assert P._number(text) == value
    assert P._number("not stated") is None and P._number("1.2.3") is None


def test_a_row_quoting_the_allocated_peak_is_compared_without_the_allocator_slack():
    """Published peaks are the caching allocator's (max_reserved, nvidia-smi) unless the row
    says it quotes torch's allocated peak; then the predicted allocated peak is compared as is."""
    row = {**BLOOM, "notes": "Megatron log: max allocated 30000 MB"}
    s = P.parse_row(row)
    assert s.allocated_memory and any("allocated peak" in a for a in s.assumed)
    assert not P.parse_row(BLOOM).allocated_memory
    assert not P.parse_row({**row, "notes": "max allocated / max reserved"}).allocated_memory

    class Cost:  # the record reads these of the cost model's StepCost
        step_time_s, peak_memory_bytes, pipeline_s, bubble_s = 100.0, 30 * 2**30, 90.0, 5.0
        dp_exposed_s = optimizer_s = 1.0
        stages = []

    allocated = P.record(s, Cost())["predicted_peak_gib"]
    reserved = P.record(P.parse_row(BLOOM), Cost())["predicted_peak_gib"]
    assert allocated == pytest.approx(30.0) and reserved > allocated


HELD_OUT = ROOT / "benchmarks/heldout/korthikanti2022.json"


def test_the_held_out_megatron_rows_read_as_2022_megatron_ran_them():
    """Korthikanti et al. 2022's rows: materialised attention scores (no FlashAttention then),
    Table 3's layouts, and every TP rank sending its 1/t share between stages with or without
    sequence parallelism (Narayanan et al. 2021's scatter/gather)."""
    rows = {r["id"]: r for r in P.load_rows(str(HELD_OUT))}
    assert len(rows) == 8
    one = P.parse_row(rows["korthikanti-22b-full"])
    assert (one.attention, one.tp, one.pp, one.mbs, one.gbs) == ("fused", 8, 1, 4, 4)
    assert (one.sp, one.recompute, one.pipeline_sends_shards) == (False, "full", False)
    deep = P.parse_row(rows["korthikanti-1t-full"])
    assert (deep.pp, deep.vpp, deep.gbs // deep.mbs, deep.sp) == (64, 1, 512, False)
    assert deep.pipeline_sends_shards and deep.zero == 0
    assert deep.inter_node_bytes_per_s == pytest.approx(200e9 / 8)
    sel = P.parse_row(rows["korthikanti-175b-selective"])
    assert (sel.vpp, sel.sp, sel.recompute, sel.pipeline_sends_shards) == (
        3,
        True,
        "selective",
        True,
    )
    assert sel.measured_step_s == 13.75


def test_megatron_core_without_sequence_parallelism_sends_whole_activations():
    """The scatter/gather sends are Megatron-LM's of 2021-2022; Megatron-Core's stacks send a
    shard only under sequence parallelism, and a one-stage layout sends nothing."""
    assumed: list[str] = []
    core = {"source": "NVIDIA Megatron-Bridge performance summary (26.02 container, DGX-H100)"}
    old = {"source": "Korthikanti et al. 2022 (Megatron-LM, A100 80GB)"}
    assert not P.parse_pipeline_shards(core, True, 4, False, assumed)
    assert P.parse_pipeline_shards(core, True, 4, True, assumed)
    assert P.parse_pipeline_shards(old, True, 4, False, assumed)
    assert not P.parse_pipeline_shards(old, True, 1, False, assumed)
    assert not P.parse_pipeline_shards(old, False, 4, False, assumed)
    assert assumed == ["pipeline sends scattered over TP ranks (Megatron-LM's scatter/gather)"]


def test_error_bars_come_from_the_dev_set_only(tmp_path, monkeypatch):
    """The cross-validation's held-out errors become the planner's error bars when the dev set
    is priced; pricing another file (the held-out papers) never writes them. The refits and
    pricing are stubbed: three rows with held-out errors -0.1, 0.0 and +0.2."""
    rows = [dict(BLOOM, id=f"x-{i}") for i in range(3)]
    dev = tmp_path / "dev.json"
    dev.write_text(json.dumps(rows))
    errors = iter([-0.1, 0.0, 0.2])
    monkeypatch.setattr(P, "evaluate_row", lambda r: {"status": "evaluated", "id": r["id"]})
    monkeypatch.setattr(P, "summarize", lambda records: {"evaluated": 0})
    monkeypatch.setattr(P, "write_markdown", lambda *a: None)
    monkeypatch.setattr(P, "fit_async_tp", lambda setups: {})
    monkeypatch.setattr(
        P,
        "cross_validate",
        lambda setups: {
            "held_out": [
                {"id": s.id, "chip": "A100", "form": "pipelined", "error": next(errors)}
                for s in setups
            ]
        },
    )
    bars = tmp_path / "bars.json"
    monkeypatch.setattr(P, "ERROR_BARS", bars)
    monkeypatch.setattr(P, "DEFAULT", str(dev))
    other = tmp_path / "held_out.json"
    other.write_text(dev.read_text())
    assert P.main(["--measurements", str(other), "--out", str(tmp_path)]) == 0
    assert not bars.exists()
    errors = iter([-0.1, 0.0, 0.2])
    assert P.main(["--out", str(tmp_path)]) == 0
    cell = json.loads(bars.read_text())["spread"]["A100"]["pipelined"]
    # three errors: the 10th percentile at position 0.2 (-0.1 + 0.2 x 0.1), the 90th at 1.8
    assert (cell["low"], cell["high"], cell["runs"]) == (
        pytest.approx(-0.08),
        pytest.approx(0.16),
        3,
    )
