"""Tests written for mutmut's generated mutants of planner/cost/engines.py (benchmarks/
generated_mutants.py): each engine's ``Training`` fields stated by hand, from a base whose
every field differs from what the engine sets, at the edges each condition turns on (TP 1
and 2, one and two pipeline ranks, virtual stages, micro-batches, ZeRO 0 to 3, fp16 and bf16,
Hopper and not). docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import dataclasses

import pytest

from planner.cost.engines import (
    DEEPSPEED_BUCKET_ELEMENTS,
    HOPPER_PROFILES,
    NO_COPIES,
    TORCH_COPIES,
    deepspeed_buffers,
    deepspeed_overlaps_reduction,
    engine_training,
    megatron_fuses_grad_accumulation,
    megatron_sends_shards,
    native_attention_on,
)
from planner.training import Training
from planner.vocab import SelectivePolicy

# every field an engine sets, set here to something else
BASE = Training(
    8, dtype="fp16", vocab_parallel_loss=True, selective_policy=SelectivePolicy.RUNTIME_OP,
    native_attention=True, fused_elementwise=False, pipeline_sends_shards=True, p2p_overlap=True,
    fused_grad_accumulation=True, dp_overlap=False, dp_copies=TORCH_COPIES,
    persistent_grad_buffers=False, microbatch_recv_buffers=True, fp32_grad_partition=False,
    reduce_bucket_bytes=7.0,
)  # fmt: skip


def _run(engine, tp=1, pp=1, v=1, zero=0, m=1, sp=False, profile="a100-80g", params=1e6, base=BASE):
    return engine_training(
        base, engine, tp=tp, pp=pp, virtual_stages=v, zero=zero, microbatches=m,
        sequence_parallel=sp, profile=profile, rank_params=params,
    )  # fmt: skip


def _changed(trained: Training, base: Training = BASE) -> dict:
    return {
        f.name: getattr(trained, f.name)
        for f in dataclasses.fields(Training)
        if getattr(trained, f.name) != getattr(base, f.name)
    }


def test_megatron_on_one_rank_without_hopper():
    assert _changed(_run("megatron")) == {
        "vocab_parallel_loss": False,
        "selective_policy": SelectivePolicy.CORE,
        "native_attention": False,
        "fused_elementwise": True,
        "pipeline_sends_shards": False,
        "p2p_overlap": False,
        "fused_grad_accumulation": False,
        "dp_overlap": True,
        "dp_copies": NO_COPIES,
        "persistent_grad_buffers": True,
        "microbatch_recv_buffers": False,
    }


def test_megatron_tensor_parallel_interleaved_on_hopper_with_sequence_shards():
    trained = _run("megatron", tp=2, pp=2, v=2, m=2, sp=True, profile="h100-sxm")
    assert trained.vocab_parallel_loss and trained.native_attention
    assert trained.pipeline_sends_shards and trained.p2p_overlap
    assert trained.fused_grad_accumulation


def test_megatron_sends_shards_only_across_a_pipeline_under_sequence_parallelism():
    assert megatron_sends_shards(2, True)
    assert not megatron_sends_shards(1, True) and not megatron_sends_shards(2, False)
    assert not _run("megatron", pp=1, sp=True).pipeline_sends_shards
    assert not _run("megatron", pp=2, sp=False).pipeline_sends_shards


def test_megatron_fuses_accumulation_with_several_micro_batches():
    assert megatron_fuses_grad_accumulation(2) and not megatron_fuses_grad_accumulation(1)


@pytest.mark.parametrize("profile", HOPPER_PROFILES)
def test_hopper_runs_its_own_attention(profile):
    assert native_attention_on(profile)


def test_the_hopper_boards_are_the_h100s_and_the_h200():
    assert HOPPER_PROFILES == ("h100-sxm", "h100-hbm2e", "h200")
    assert not native_attention_on("a100-80g") and not native_attention_on("cpu")


def test_deepspeed_at_zero_1_without_a_pipeline():
    assert _changed(_run("deepspeed", zero=1)) == {
        "selective_policy": SelectivePolicy.CORE,
        "fp32_grad_partition": True,  # fp16: the step casts its gradients to fp32
        "reduce_bucket_bytes": DEEPSPEED_BUCKET_ELEMENTS * 2,
        "dp_overlap": True,
        "dp_copies": NO_COPIES,
        "persistent_grad_buffers": True,
        "microbatch_recv_buffers": False,
    }


def test_deepspeed_at_zero_0_buckets_at_most_the_ranks_gradients():
    bf16 = dataclasses.replace(BASE, dtype="bf16", dp_overlap=True)
    small = _run("deepspeed", zero=0, params=1e6, base=bf16)
    assert small.reduce_bucket_bytes == 2e6 and not small.fp32_grad_partition
    assert not small.dp_overlap
    large = _run("deepspeed", zero=0, params=2e9, base=bf16)
    assert large.reduce_bucket_bytes == 1e9
    assert not _run("deepspeed", zero=2, pp=2, base=bf16).dp_overlap


@pytest.mark.parametrize(
    "zero, dtype, bf16_opt, params, expected",
    [
        (3, "fp16", False, 1e6, (False, 0.0)),  # ZeRO-3's buffers are not priced here
        (2, "fp16", False, 1e6, (True, 1e9)),
        (1, "bf16", True, 1e6, (False, 1e9)),  # a bucket whatever the optimizer
        (0, "fp16", True, 1e6, (True, 0.0)),  # BF16_Optimizer: no bucket
        (0, "bf16", False, 1e6, (False, 2e6)),
        (0, "fp16", False, 6e8, (True, 1e9)),
    ],
)
def test_deepspeeds_fp32_partition_and_bucket(zero, dtype, bf16_opt, params, expected):
    assert deepspeed_buffers(zero, dtype, bf16_opt, params) == expected


@pytest.mark.parametrize(
    "zero, pp, overlaps", [(0, 1, False), (1, 1, True), (3, 1, True), (1, 2, False)]
)
def test_deepspeed_overlaps_its_reduction_under_zero_without_a_pipeline(zero, pp, overlaps):
    assert deepspeed_overlaps_reduction(zero, pp) is overlaps


def test_torchtitan_keeps_the_runtimes_fields_but_its_loss_and_recompute():
    assert _changed(_run("torchtitan", tp=2)) == {"selective_policy": SelectivePolicy.TORCHTITAN_OP}
    assert _changed(_run("torchtitan", tp=1)) == {
        "vocab_parallel_loss": False,
        "selective_policy": SelectivePolicy.TORCHTITAN_OP,
    }


def test_accelerate_runs_as_the_runtime_does():
    assert _run("accelerate") is BASE


def test_an_unknown_engine_is_named():
    with pytest.raises(ValueError) as err:
        _run("colossal")
    assert str(err.value) == "no semantics for engine 'colossal'"
