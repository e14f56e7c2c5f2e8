"""Mutation testing: plant small realistic bugs, one at a time, and see whether the tests notice.

    python benchmarks/mutants.py                 # every mutant; writes reports/mutants.json
    python benchmarks/mutants.py --only cost-    # the mutants whose id starts with cost-
    python benchmarks/mutants.py --check         # which mutants still apply, running nothing
    python benchmarks/mutants.py --targeted-only # only each mutant's own tests (a quick survey)

Each mutant is one exact text replacement in one file, the kind of slip a maintainer makes (a
factor of 2 dropped, the wrong branch of a ZeRO stage, a max where a sum belongs). The tree is
copied once to a scratch directory (tracked and untracked, not ignored, files); for each mutant
its file is edited there, the tests most likely to notice run first (``pytest -x``), and when
they pass the whole suite runs (``-x``, single-process tests first). A mutant is *killed* when a
test fails, errors or hangs past the time limit, *survived* when the whole suite passes, and *no
longer applicable* when its text is not found exactly once (the code moved on: update it).
Traces are cached across mutants in one scratch cache; the cache key includes a hash of the
tracer's code, so a mutated tracer never reads a clean trace.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 1500  # one mutant's whole run: a mutant that hangs a collective is killed by it

COST = "tests/test_cost_terms.py tests/test_costmodel.py"
FLOPS = "tests/test_trace_reference.py tests/test_trace.py"
MILP = "tests/test_solver_exact.py"
SHARD = "tests/test_sharding.py"
ORACLE = "tests/test_runtime_oracle.py tests/test_runtime_build.py"


def oracle(cases: str) -> str:
    """The oracle cases a runtime mutant is most likely to break first (``pytest -k``): a few
    launches instead of the whole matrix; a mutant they miss still meets the whole suite."""
    # the long cases too (a structure's oracle case may be in the long matrix only)
    tests = "tests/test_runtime_build.py tests/test_runtime_oracle.py"
    return f"-m 'not zoo' {tests} -k '{cases} or build'"


@dataclass(frozen=True)
class Mutant:
    id: str
    path: str
    old: str
    new: str
    tests: str  # space-separated test files (or node ids) most likely to notice
    why: str = ""  # what the bug would do


M = Mutant
MUTANTS: list[Mutant] = [
    # ------------------------------------------------------------------ cost model
    M(
        "cost-roofline-sum",
        "planner/cost/compute.py",
        "return max(flops * slowdown / achievable_peak(cluster, dtype, rate), nbytes / bw)",
        "return flops * slowdown / achievable_peak(cluster, dtype, rate) + nbytes / bw",
        COST,
        "roofline adds compute and memory time instead of taking the larger",
    ),
    M(
        "cost-step-always-fused",
        "planner/cost/optimizer.py",
        "    per_param = 2 * wb + gb + 2 * ob if inp.training.fused_step else unfused",
        "    per_param = 2 * wb + gb + 2 * ob",
        "tests/test_cost_terms.py",
        "torch's per-op AdamW (CPU ranks) priced as one fused pass: 2.5x too cheap",
    ),
    M(
        "cost-offload-compute-width",
        "planner/cost/optimizer.py",
        "            t += shard * m * (2 * FP32_BYTES + gb) / bw",
        "            t += shard * m * (2 * wb + gb) / bw",
        "tests/test_cost_terms.py",
        "FSDP2 offload priced as moving the 16-bit weights up, half what it copies",
    ),
    M(
        "cost-batchnorm-sync-free",
        "planner/cost/data_parallel.py",
        "    if mesh.replicas == 1 or not o.norm_channels:\n        return 0.0",
        "    if True:\n        return 0.0",
        "tests/test_cost_terms.py",
        "synchronized BatchNorm statistics priced as free: a CNN's DP collectives unseen",
    ),
    M(
        "cost-weights-scale-with-batch",
        "planner/cost/compute.py",
        'd["fwd_flops"] * work_f * scale, act_f * scale + weights,',
        'd["fwd_flops"] * work_f * scale, (act_f + weights) * scale,',
        COST,
        "weight reads grow with the micro-batch",
    ),
    M(
        "cost-backward-weight-bytes",
        "planner/cost/compute.py",
        'bw_w = min(2 * weights, d["bwd_bytes"])',
        'bw_w = min(weights, d["bwd_bytes"])',
        COST,
        "backward reads the weights but forgets writing their gradient",
    ),
    M(
        "cost-selective-recompute-free",
        "planner/cost/block_options.py",
        "Recompute.SELECTIVE: sel_fwd + ovh_sel + sel_comm,",
        "Recompute.SELECTIVE: ovh_sel + sel_comm,",
        COST,
        "selective recompute re-runs the attention core for free",
    ),
    M(
        "cost-full-recompute-no-comm",
        "planner/cost/block_options.py",
        "Recompute.FULL: fwd + comm_f,\n            }[rc]",
        "Recompute.FULL: fwd,\n            }[rc]",
        COST,
        "full recompute forgets the forward TP collectives it repeats",
    ),
    M(
        "cost-full-recompute-peak",
        "planner/cost/block_options.py",
        "Recompute.FULL: v.saved_bytes,\n            }[rc]",
        "Recompute.FULL: v.saved_selective_bytes,\n            }[rc]",
        COST,
        "full recompute's backward peak holds only the selective set",
    ),
    M(
        "cost-moe-capacity-ignored",
        "planner/cost/block_options.py",
        "factor = training.moe_capacity_factor * (training.moe_imbalance if ep > 1 else 1.0)",
        "factor = training.moe_imbalance if ep > 1 else 1.0",
        COST,
        "expert compute ignores the capacity factor's padded rows",
    ),
    M(
        "cost-a2a-combine-forgotten",
        "planner/cost/block_options.py",
        "a2a_f = a2a_b = 2 * one",
        "a2a_f = a2a_b = one",
        COST + " tests/test_moe.py",
        "all-to-all volume counts the dispatch but not the combine",
    ),
    M(
        "cost-zero2-grads-whole",
        "planner/cost/memory.py",
        "g = z * gb / dp if zero >= 2 else params * gb",
        "g = z * gb / dp if zero >= 3 else params * gb",
        COST,
        "ZeRO-2 does not shard gradients",
    ),
    M(
        "cost-1f1b-inflight",
        "planner/cost/pipeline.py",
        "    if schedule == Schedule.ONE_F_ONE_B:\n        return min(m, pp - pp_rank)",
        "    if schedule == Schedule.ONE_F_ONE_B:\n        return min(m, pp)",
        COST,
        "every 1F1B stage holds pp micro-batches",
    ),
    M(
        "cost-interleaved-inflight",
        "planner/cost/pipeline.py",
        "return min(m * v, (v - 1) * pp + 2 * (pp - pp_rank - 1) + 1)",
        "return min(m * v, (v - 1) * pp + 2 * (pp - pp_rank - 1))",
        COST,
        "interleaved warm-up forgets the chunk in flight",
    ),
    M(
        "cost-logits-half",
        "planner/cost/records.py",
        "return 3 * 4 * last.output_bytes / dtype_bytes",
        "return 4 * last.output_bytes / dtype_bytes",
        COST,
        "fp32 logits counted without their gradient",
    ),
    M(
        "cost-p2p-one-way",
        "planner/cost/pipeline.py",
        "        return 2 * p2p_time(per, bw, lat)\n",
        "        return p2p_time(per, bw, lat)\n",
        COST,
        "pipeline sends activations forward but not gradients back",
    ),
    M(
        "cost-loss-one-pass",
        "planner/cost/compute.py",
        "return 2 * nbytes / (p.memory_bandwidth * p.elementwise_efficiency) + ops",
        "return nbytes / (p.memory_bandwidth * p.elementwise_efficiency) + ops",
        COST,
        "the loss reads the logits forward only",
    ),
    M(
        "cost-zero0-hides-behind-forward",
        "planner/cost/data_parallel.py",
        "        return ar[0] * p - bwd, 0.0, ar[0] * p",
        "        return ar[0] * p - bwd - fwd, 0.0, ar[0] * p",
        COST,
        "the gradient all-reduce hides behind the forward too",
    ),
    M(
        "cost-zero1-broadcast-hidden",
        "planner/cost/data_parallel.py",
        "        return ar[0] * p - bwd, ag[0] * o.dense_params,",
        "        return ar[0] * p + ag[0] * o.dense_params - bwd, 0.0,",
        COST,
        "ZeRO-1's parameter broadcast after the step hides behind backward",
    ),
    M(
        "cost-zero3-one-gather",
        "planner/cost/data_parallel.py",
        "    return m * (2 * ag_t + rs_t + unit - fwd - bwd), 0.0, m * (2 * ag_t + rs_t + unit)",
        "    return m * (ag_t + rs_t + unit - fwd - bwd), 0.0, m * (ag_t + rs_t + unit)",
        COST,
        "ZeRO-3 gathers weights for forward but not again for backward",
    ),
    M(
        "cost-optimizer-bytes",
        "planner/cost/optimizer.py",
        "per_param = 2 * wb + gb + 2 * ob",
        "per_param = wb + gb + ob",
        COST,
        "optimizer step reads the states but forgets writing them back",
    ),
    M(
        "cost-zero1-optimizer-whole",
        "planner/cost/optimizer.py",
        "dp = mesh.replicas if config.zero_stage >= 1 else 1\n    local",
        "dp = mesh.replicas if config.zero_stage >= 2 else 1\n    local",
        COST,
        "ZeRO-1's optimizer steps every parameter instead of its shard",
    ),
    M(
        "cost-offload-once-per-step",
        "planner/cost/optimizer.py",
        "t += shard * m * (2 * FP32_BYTES + gb) / bw",
        "t += shard * (2 * FP32_BYTES + gb) / bw",
        COST,
        "offloaded weights travel once per step, not per micro-batch",
    ),
    M(
        "cost-p2p-buffers-one",
        "planner/cost/memory.py",
        "        return 2 * b\n",
        "        return b\n",
        COST,
        "one pipeline buffer instead of a send and a receive buffer",
    ),
    M(
        "cost-recv-buffers-in-flight-only",
        "planner/cost/memory.py",
        "    return (m - held + 1 if receives else 0) + (m + held if sends else 0)",
        "    return (m - held + 1 if receives else 0) + (2 * held if sends else 0)",
        COST,
        "torch's output-gradient buffers counted for the micro-batches in flight, not all m",
    ),
    M(
        "cost-gather-buffer-one",
        "planner/cost/memory.py",
        "        return 2 * o.params * training.state_bytes[0]",
        "        return o.params * training.state_bytes[0]",
        COST,
        "ZeRO-3 gather buffer without the prefetched block",
    ),
    M(
        "cost-no-logits-memory",
        "planner/cost/memory.py",
        "    if not last:\n        return 0.0",
        "    if not last or True:\n        return 0.0",
        COST,
        "the last stage's logits are not in memory",
    ),
    M(
        "cost-pipeline-mean-stage",
        "planner/cost/pipeline.py",
        "    return sum(times) + max((m - 1) * t for m, t in zip(microbatches, times, strict=True)"
        ")",
        "    return sum(times) + max(m - 1 for m in microbatches) * sum(times) / len(times)",
        COST,
        "steady state paced by the mean stage, not the slowest",
    ),
    M(
        "cost-interleaved-bubble-fastest",
        "planner/cost/pipeline.py",
        "    return m * max(R) + (p - 1) * max(T), (p - 1) * max(T)",
        "    return m * max(R) + (p - 1) * min(T), (p - 1) * min(T)",
        COST,
        "interleaved bubble paced by the fastest chunk",
    ),
    M(
        "cost-host-capacity-per-node",
        "planner/cost/step.py",
        "host_capacity = profile.host_memory_bytes / max(profile.gpus_per_node, 1)",
        "host_capacity = profile.host_memory_bytes",
        COST + " " + MILP,
        "each GPU may use the whole node's host memory",
    ),
    M(
        "cost-ep-ring-ratio",
        "planner/cost/records.py",
        "ratio = ((n - 1) / n) / ((dp - 1) / dp)",
        "ratio = 1.0",
        COST + " " + MILP,
        "expert gradients reduce over all dp ranks",
    ),
    M(
        "cost-cp-ring-backward",
        "planner/cost/compute.py",
        "ring_b = (cp - 1) * p2p_time(2 * kv, bw, lat)",
        "ring_b = (cp - 1) * p2p_time(kv, bw, lat)",
        COST + " tests/test_long_context.py",
        "context-parallel backward ring moves keys and values but not their gradients",
    ),
    M(
        "cost-zero1-experts-sharded",
        "planner/cost/memory.py",
        "experts = state_memory(o.expert_params, 0, 1, o.offload, training)",
        "experts = state_memory(o.expert_params, 1, dp, o.offload, training)",
        COST + " " + MILP,
        "ZeRO-1 priced as sharding the experts' optimizer states the runtime keeps whole",
    ),
    M(
        "cost-grad-accumulation-m",
        "planner/cost/optimizer.py",
        "per_acc = (m - 1) * 3 * acc_bytes",
        "per_acc = m * 3 * acc_bytes",
        COST,
        "gradient accumulation counted for every micro-batch",
    ),
    M(
        "cost-tp-overhead-forward",
        "planner/cost/compute.py",
        "        fwd += per_step / 3\n",
        "        fwd += per_step\n",
        COST,
        "the TP module overhead counted whole in forward",
    ),
    # ------------------------------------------------------------------ op costs and tracer
    M(
        "ops-attention-no-pv",
        "planner/trace/opcost.py",
        "return 2 * batch_heads * s_q * s_kv * d + 2 * batch_heads * s_q * s_kv * d_v",
        "return 2 * batch_heads * s_q * s_kv * d",
        FLOPS,
        "fused attention counts QK^T but not PV",
    ),
    M(
        "ops-attention-backward-once",
        "planner/trace/opcost.py",
        "return 2 * fwd if any(needs_grad[:3]) else 0",
        "return fwd if any(needs_grad[:3]) else 0",
        FLOPS,
        "attention backward as one forward's FLOPs",
    ),
    M(
        "ops-backward-both-operands",
        "planner/trace/opcost.py",
        "count = sum(1 for i in (a, b) if i < len(needs_grad) and needs_grad[i])",
        "count = 2",
        FLOPS,
        "backward computes gradients of operands that need none",
    ),
    M(
        "ops-conv-kernel",
        "planner/trace/opcost.py",
        "per_out = numel(w[1:])",
        "per_out = numel(w[2:])",
        FLOPS,
        "convolution forgets the input channels",
    ),
    M(
        "ops-addmm-operands",
        "planner/trace/opcost.py",
        '    if op in ("aten.addmm.default", "aten.baddbmm.default", "aten.addbmm.default"):\n'
        "        return (1, 2)",
        '    if op in ("aten.addmm.default", "aten.baddbmm.default", "aten.addbmm.default"):\n'
        "        return (0, 1)",
        FLOPS,
        "addmm's bias taken as a multiplied operand",
    ),
    M(
        "ops-grouped-mm-width",
        "planner/trace/opcost.py",
        "return 2 * numel(out_shape) * in_shapes[0][-1]",
        "return 2 * numel(out_shape) * in_shapes[1][-1]",
        FLOPS + " tests/test_moe.py",
        "grouped product's inner dimension read from the weight's output side",
    ),
    M(
        "trace-saved-credited-to-producer",
        "planner/trace/export.py",
        "        if saver in graph:\n"
        '            graph.nodes[saver]["saved"].append([producer, nbytes])',
        "        target = producer or saver\n        if target in graph:\n"
        '            graph.nodes[target]["saved"].append([producer, nbytes])',
        FLOPS,
        "a saved tensor credited to the op that made it, not the one that keeps it",
    ),
    M(
        "trace-dropout-mask-dtype",
        "planner/trace/export.py",
        'if n.op == "call_function" and n.target is torch.ops.aten.dropout.default:',
        "if False and n.target is torch.ops.aten.dropout.default:",
        FLOPS + " tests/test_costmodel.py",
        "dropout keeps the CPU fallback's full-width mask",
    ),
    M(
        "trace-attention-math-path",
        "planner/trace/export.py",
        "            and n.target is torch.ops.aten.scaled_dot_product_attention.default\n",
        "            and n.target is None\n",
        FLOPS,
        "SDPA saves the math path's s x s probabilities",
    ),
    M(
        "trace-bf16-four-bytes",
        "planner/vocab.py",
        '    "bfloat16": 2,',
        '    "bfloat16": 4,',
        FLOPS + " " + COST,
        "bf16 tensors counted as 4 bytes",
    ),
    M(
        "trace-backward-bytes-once",
        "planner/trace/export.py",
        "bwd_bytes=2 * fwd_bytes if requires_grad else 0,",
        "bwd_bytes=fwd_bytes if requires_grad else 0,",
        FLOPS + " " + COST,
        "memory-bound backward moves the forward's bytes once",
    ),
    M(
        "trace-frozen-weights-need-grad",
        "planner/trace/export.py",
        '            (a.op == "placeholder" and a.name in trainable)',
        '            (a.op == "placeholder" and kinds.get(a.name, ("",))[0] == "parameter")',
        FLOPS,
        "a frozen weight's product still computes its gradient",
    ),
    M(
        "blocks-selective-keeps-core",
        "planner/trace/blocks.py",
        "saved_selective_bytes=sum(b for p, b in saved if p not in core),",
        "saved_selective_bytes=sum(b for p, b in saved),",
        FLOPS + " " + COST,
        "selective recompute drops nothing",
    ),
    M(
        "blocks-boundary-from-next",
        "planner/trace/blocks.py",
        "        for i in range(src, last):\n            cut[i] += nbytes",
        "        for i in range(src + 1, last):\n            cut[i] += nbytes",
        FLOPS + " " + COST,
        "a tensor crossing the cut right after its producer is not counted",
    ),
    M(
        "trace-grouped-kv-expanded",
        "planner/trace/export.py",
        "        if all(x is not None for x in kv):",
        "        if False:",
        FLOPS,
        "grouped-query keys and values kept repeated to every head",
    ),
    M(
        "trace-boolean-mask-bytes",
        "planner/trace/export.py",
        "        if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:",
        "        if False:",
        FLOPS,
        "a boolean attention mask kept as 1 byte where SDPA keeps the additive one",
    ),
    # ------------------------------------------------------------------ collectives
    M(
        "coll-all-reduce-factor",
        "planner/hardware/collectives.py",
        "        return 2 * (n - 1) / n, 2 * (n - 1)",
        "        return (n - 1) / n, 2 * (n - 1)",
        "tests/test_costmodel.py tests/test_collectives.py",
        "all-reduce priced as one ring pass",
    ),
    M(
        "coll-no-sync",
        "planner/hardware/collectives.py",
        "return t + cluster.profile.collective_sync if t > 0 else 0.0",
        "return t",
        "tests/test_costmodel.py tests/test_collectives.py",
        "collectives never pay the in-situ sync",
    ),
    M(
        "coll-p2p-no-latency",
        "planner/hardware/collectives.py",
        '    if kind == "p2p":\n        return 1.0, 1.0',
        '    if kind == "p2p":\n        return 1.0, 0.0',
        COST + " tests/test_collectives.py",
        "point-to-point without latency",
    ),
    M(
        "cluster-link-by-group-size",
        "planner/hardware/cluster.py",
        "        if k > 1:",
        "        if len(ranks) > self.gpus_per_node:",
        COST + " tests/test_profiles.py",
        "a small group across nodes priced at NVLink speed",
    ),
    # ------------------------------------------------------------------ stage MILP, search
    M(
        "milp-inflight-ignored",
        "planner/search/milp/rows.py",
        "np.asarray(sp.inflight, float)[:, None] * cat(sp.act)) / GIB",
        "np.ones(len(sp.inflight))[:, None] * cat(sp.act)) / GIB",
        MILP,
        "the MILP's memory holds one micro-batch's activations per stage",
    ),
    M(
        "milp-gather-ignored",
        "planner/search/milp/rows.py",
        "(rs, lay.X + rs, 1.0),\n        (rs, lay.Z + rs, 1.0),\n    )",
        "(rs, lay.X + rs, 1.0),\n        (rs, lay.Z + rs, 0.0),\n    )",
        MILP,
        "the MILP forgets ZeRO-3's gathered weights",
    ),
    M(
        "milp-host-unbounded",
        "planner/search/milp/rows.py",
        "sp.host_capacity / GIB, (rank_rows, ncol, host[kk])",
        "1e6 * sp.host_capacity / GIB, (rank_rows, ncol, host[kk])",
        MILP,
        "the MILP ignores host memory",
    ),
    M(
        "milp-interleaved-as-1f1b",
        "planner/search/milp/rows.py",
        "c_t = sp.m - 1.0 if sp.v == 1 else sp.pp - 1.0",
        "c_t = sp.m - 1.0",
        MILP,
        "interleaved candidates priced with the 1F1B objective",
    ),
    M(
        "milp-dp-exposure-dropped",
        "planner/search/milp/rows.py",
        "(lay.dp_first, sp.dp_first, sp.dp_once[0]),",
        "(lay.dp_first, [0 * np.asarray(x, float) for x in sp.dp_first], sp.dp_once[0]),",
        MILP,
        "the MILP forgets the exposed data-parallel communication's per-block terms",
    ),
    M(
        "milp-dp-once-second-dropped",
        "planner/search/milp/rows.py",
        "(lay.dp_second, sp.dp_second, sp.dp_once[1]),",
        "(lay.dp_second, sp.dp_second, 0.0),",
        MILP,
        "the MILP forgets the latency of ZeRO-1's broadcast (paid once per stage)",
    ),
    M(
        "milp-dominance-ignores-gather",
        "planner/search/milp/dominance.py",
        '"time", "state", "host", "act", "ws", "gather", "optim", "offl", "dp_first", "dp_second",',
        '"time", "state", "host", "act", "ws", "optim", "offl", "dp_first", "dp_second",',
        MILP,
        "dominance drops options that need a smaller gather buffer",
    ),
    M(
        "runtime-tp-grad-sums-dropped",
        "runtime/parallelize.py",
        "            torch.distributed.all_reduce(local, group=group)",
        "            local.mul_(1.0)",
        "tests/test_runtime_oracle.py -k qwen3-qk-norm-tp2",
        "per-head norm weights keep each rank's share of their gradient: Qwen3 under TP trains "
        "a different model",
    ),
    M(
        "cost-interleaved-chunks-hold-every-chunk-micro-batch",
        "planner/cost/pipeline.py",
        "    return count / v if schedule == Schedule.INTERLEAVED and pp > 1 else float(count)",
        "    return float(count)",
        COST,
        "an interleaved rank's chunk-micro-batches counted on each of its v chunks: v times the "
        "activations priced, interleaved plans refused or recomputed for nothing",
    ),
    M(
        "cost-loss-beside-the-working-set",
        "planner/cost/memory.py",
        "gathered + max(working, loss)",
        "gathered + working + loss",
        COST,
        "the loss's logit copies priced beside the largest op's working memory, which never "
        "coexist: an H200's Llama-1B peak over-predicted by 8.4 GB, plans refused that fit",
    ),
    M(
        "cost-grads-always-held",
        "planner/cost/records.py",
        "    return training.persistent_grad_buffers or m > 1",
        "    return True",
        COST,
        "torch's lazily allocated gradients priced as held while one micro-batch's activations "
        "peak: every one-micro-batch plan over-predicted by 4 bytes per parameter",
    ),
    M(
        "cost-optimizer-step-peak-ignored",
        "planner/cost/memory.py",
        '        memory.append(step if step["total"] > mem["total"] else mem)',
        "        memory.append(mem)",
        COST,
        "the optimizer step's own peak (fp32 states, gradients, foreach temporaries) ignored: a "
        "plan with small activations is predicted to fit where its step runs out of memory",
    ),
    M(
        "milp-optimizer-step-rows-dropped",
        "planner/search/milp/rows.py",
        "    if sp.step is not None:",
        "    if False:",
        MILP,
        "the stage MILP places blocks whose optimizer step does not fit: its optimum is a plan "
        "the cost model calls infeasible",
    ),
    M(
        "runtime-ddp-autocast-dropped",
        "runtime/parallelize.py",
        "    return HALF[plan.dtype] if isinstance(model, DistributedDataParallel) else None",
        "    return None",
        "tests/test_runtime_build.py",
        "a ZeRO-1 plan on a GPU trains in fp32 (DDP casts nothing) while the cost model priced "
        "16-bit products",
    ),
    M(
        "runtime-release-without-collection",
        "runtime/build.py",
        "    gc.collect()\n    if torch.cuda.is_available():",
        "    if torch.cuda.is_available():",
        "tests/test_runtime_release.py",
        "a launch's plans keep the last plan's weights (FSDP2's reference cycles): every later "
        "plan's peak carries them",
    ),
    M(
        "runtime-blocks-split-out-of-order",
        "runtime/dtensor_blocks.py",
        "parts = local.split(local.shape[d] // k, dim=d)",
        "parts = local.split(local.shape[d] // k, dim=d)[::-1]",
        "tests/test_dtensor_blocks.py " + oracle("gpt2-heads"),
        "the local split of GPT-2's q | k | v blocks hands them on in the wrong order",
    ),
    M(
        "search-bound-too-high",
        "planner/search/bounds.py",
        "time_bound = total * one_chunk_floor(m, p)",
        "time_bound = total * one_chunk_floor(m + 1, p)",
        "tests/test_solver_plans.py tests/test_search_bounds.py",
        "a lower bound that is not one: prunes candidates that would win",
    ),
    # ------------------------------------------------------------------ sharding ILP
    M(
        "shard-ring-all-reduce",
        "planner/cost/sharding.py",
        "    return ring_factors(kind, t)[0]",
        "    return (t - 1) / t",
        SHARD,
        "the sharding ILP prices an all-reduce as one ring pass",
    ),
    M(
        "shard-saved-never-sharded",
        "planner/cost/sharding.py",
        "b = nbytes / t if _entry_sharded(state, op, s, how, key) else nbytes",
        "b = nbytes",
        SHARD,
        "a sharded saved activation counted whole on every device",
    ),
    M(
        "shard-slice-grad-free",
        "planner/cost/sharding.py",
        '    if src == R:\n        return (None, "all_gather")',
        "    if src == R:\n        return (None, None)",
        SHARD,
        "slicing a replicated tensor forgets gathering its gradient",
    ),
    M(
        "shard-partial-share",
        "planner/cost/sharding.py",
        '    if out.startswith("S") or (out == P and product):',
        '    if out.startswith("S"):',
        SHARD,
        "a row-parallel product runs its whole FLOPs on every device",
    ),
    # ------------------------------------------------------------------ runtime
    M(
        "run-no-microbatch-scaling",
        "runtime/train.py",
        "(loss / len(chunks)).backward()",
        "loss.backward()",
        oracle("gpt-tp2 or mlp-dp4"),
        "gradient accumulation sums micro-batch gradients instead of averaging",
    ),
    M(
        "run-no-dp-sync",
        "runtime/train.py",
        "gradient_sync(built.parts, j == len(chunks) - 1)",
        "gradient_sync(built.parts, False)",
        oracle("gpt-dp4 or mlp-dp4"),
        "data-parallel replicas never reduce gradients",
    ),
    M(
        "run-expert-grads-zeroed",
        "runtime/expert_parallel.py",
        "        g.div_(dp)",
        "        g.zero_()",
        oracle("moe-ep2"),
        "expert weights never learn",
    ),
    M(
        "run-expert-grads-not-averaged",
        "runtime/expert_parallel.py",
        "        g.div_(dp)",
        "        g.div_(max(1, dp // 2))",
        oracle("moe-ep2"),
        "expert gradients divided by the wrong replica count",
    ),
    M(
        "run-same-data-every-rank",
        "runtime/batching.py",
        "return slice_tree(batch, dp_rank * local_batch_size, (dp_rank + 1) * local_batch_size)",
        "return slice_tree(batch, 0, local_batch_size)",
        oracle("mlp-dp4"),
        "every data-parallel rank trains on the first slice",
    ),
    M(
        "run-expert-routing",
        "runtime/expert_parallel.py",
        'dest = torch.div(ids, local, rounding_mode="floor")',
        "dest = ids % ep",
        oracle("moe-ep2"),
        "tokens sent to the wrong expert rank",
    ),
    M(
        "run-seed-per-rank",
        "runtime/build.py",
        "    torch.manual_seed(seed)\n    model = mf.build()",
        "    torch.manual_seed(seed + dist.get_rank())\n    model = mf.build()",
        oracle("gpt-pp2-1f1b or mlp-zero3-dp4"),
        "each rank initialises its own weights",
    ),
    M(
        "run-sgd-no-momentum",
        "runtime/optim.py",
        'return {"lr": lr, **({"momentum": SGD_MOMENTUM} if name == "sgd" else {})}',
        'return {"lr": lr}',
        oracle("mlp-dp4"),
        "SGD without the momentum the cost model prices (the oracle shares the optimizer, so "
        "only the momentum-state memory notices)",
    ),
    M(
        "run-zero1-experts-sharded",
        "runtime/parallelize.py",
        "        own = {id(q) for q in experts or []}",
        "        own = set()",
        oracle("moe-ep2xdp2-zero1"),
        "ZeRO-1 shards expert-parallel experts over dp and overwrites them with their owner's",
    ),
    M(
        "run-experts-not-zero-sharded",
        "runtime/parallelize.py",
        "    if plan.zero_stage < 2 or edp_mesh.size() == 1 or not experts:",
        "    if True:",
        oracle("moe-ep2xdp2"),
        "ZeRO 2/3 leave expert-parallel experts unsharded over their replicas",
    ),
    M(
        "run-pipeline-skip-relay",
        "runtime/stages.py",
        "            if src not in index or index[src] >= j - 1:",
        "            if src not in index or index[src] >= j - 2:",
        oracle("llama-pp4"),
        "a value that skips one stage is not relayed",
    ),
    M(
        "run-dtensor-grads-summed-twice",
        "runtime/build.py",
        '        sum_partial_gradients(self.tp_grad_sums, self.mesh["tp"])\n'
        "        whole_gradients(self.parts)",
        "        whole_gradients(self.parts)\n"
        '        sum_partial_gradients(self.tp_grad_sums, self.mesh["tp"])',
        oracle("qwen3_moe-dtensor-grads-tp2"),
        "a replicated weight read in a DTensor block gets its gradient summed twice over TP",
    ),
    M(
        "run-modulelist-block-unwrapped",
        "runtime/parallelize.py",
        "    if isinstance(module, (nn.ModuleList, nn.ModuleDict)):\n        return [\n",
        "    if False:\n        return [\n",
        oracle("convnext-modulelist"),
        "a block that is a ModuleList is sharded as one FSDP unit, whose hooks never fire",
    ),
    M(
        "run-eager-extra-outputs",
        "runtime/stages.py",
        "    if len(tensors) > 1 and want is not None:",
        "    if False:",
        "-m zoo tests/zoo/test_zoo.py -k gpt_oss-pp2",
        "a module whose caller reads one of its outputs (gpt-oss's MLP) stops a pipeline stage",
    ),
    M(
        "run-bn-recompute-moves-statistics",
        "runtime/batchnorm.py",
        "        return forward, _both(recompute, _statistics_kept(module))",
        "        return forward, recompute",
        oracle("bn-recompute"),
        "a recomputed BatchNorm moves its running statistics twice per batch",
    ),
    M(
        "trace-own-forward-linear-sharded",
        "planner/trace/export.py",
        "            keep = _weight_module(m) and bool(ops.get(name)) and ops[name] <= PRODUCT_OPS",
        "            keep = _weight_module(m)",
        "tests/test_foreign_models.py",
        "an nn.Linear with its own forward (Llama 4's router) is TP-sharded and crashes the run",
    ),
    M(
        "trace-own-forward-product-whole",
        "planner/trace/export.py",
        "            keep = _weight_module(m) and bool(ops.get(name)) and ops[name] <= PRODUCT_OPS",
        "            keep = False",
        "tests/test_foreign_models.py",
        "Falcon's Linear subclass (a plain product in its own forward) loses tensor parallelism",
    ),
    M(
        "sharding-complex-view-whole",
        "planner/cost/sharding.py",
        '    elif base in COMPLEX_VIEWS and nodes and operands[0].kind == "node":',
        "    elif False:",
        "tests/test_foreign_models.py",
        "complex rotary embeddings (Llama 4) keep their attention from sharding by heads",
    ),
    M(
        "sharding-gathered-read-summed",
        "planner/cost/sharding.py",
        "        if module not in plan and _read_sharded(graph, block, module, states, whole):",
        "        if module not in plan:",
        "tests/test_foreign_models.py",
        "a weight read after the runtime gathered the shards has its whole gradient summed",
    ),
    M(
        "run-frozen-module-in-unit",
        "runtime/parallelize.py",
        "    return any(p.requires_grad for p in module.parameters())",
        "    return any(True for _ in module.parameters())",
        oracle("pegasus-frozen-last"),
        "a frozen module closes a ZeRO-3 unit of several and its pre-backward gather never fires",
    ),
    M(
        "run-eager-swap-tuple-output",
        "runtime/stages.py",
        "    if isinstance(out, torch.Tensor):\n        return out",
        "    if True:\n        return out",
        oracle("swin-tuple-output"),
        "an eager module swapped into a stage hands on a tuple where its traced copy gave a tensor",
    ),
    M(
        "run-dtensor-backward-outside-replication",
        "runtime/dtensor_blocks.py",
        "    return implicit_replication() if on_dtensors else contextlib.nullcontext()",
        "    return contextlib.nullcontext()",
        oracle("stablelm-headcount-view"),
        "a DTensor block's backward meets its saved plain tensors outside implicit replication",
    ),
    M(
        "shard-derived-param-grads-unsummed",
        "planner/cost/sharding.py",
        "    ev.partial_params = sorted(pgrad_params | _derived_params(prob, plain_pgrad))",
        "    ev.partial_params = sorted(pgrad_params)",
        oracle("gemma3-norm-offset-tp2"),
        "a weight used as 1 + weight under sharded heads keeps each rank's partial gradient",
    ),
    M(
        "probe-meta-only",
        "planner/cost/eager_probe.py",
        "            for mode in (None, FakeTensorMode(allow_non_fake_inputs=True)):",
        "            for mode in (None,):",
        "tests/test_foreign_models.py",
        "the eager probe never reaches blocks behind a data-dependent check and passes them",
    ),
    M(
        "cost-dp-copies-zero3-gathers-once",
        "planner/cost/data_parallel.py",
        "        gathers = 2 if zero == 3 else (",
        "        gathers = 1 if zero == 3 else (",
        "tests/test_cost_terms.py",
        "ZeRO-3's second all-gather in backward (its cast and copies) goes unpriced",
    ),
    M(
        "sharding-tied-weight-replicated-in-one-use",
        "planner/cost/sharding.py",
        """    return all(st.req[i] == ("S0" if name in vocab else R) for i, name in slots)""",
        '    return all(st.req[i] in (("S0", R) if name in vocab else (R,)) for i, name in slots)',
        "tests/test_foreign_models.py",
        "one block may keep a tied weight whole while another splits it: two tensors train",
    ),
    M(
        "run-tied-weight-not-retied",
        "runtime/parallelize.py",
        "        retie(root, ties)\n",
        "",
        oracle("tied-tp2"),
        "a vocab-parallel embedding and its tied head train as two tensors under TP",
    ),
    M(
        "sharding-vocab-lookup-whole-table",
        "planner/cost/sharding.py",
        "        return (moved + rows / t) / (moved + rows)",
        "        return 1.0",
        "tests/test_sharding.py",
        "a vocabulary-parallel lookup is priced writing the whole table's gradient on every rank",
    ),
    M(
        "sharding-broadcast-expand-on-local-shards",
        "planner/cost/sharding.py",
        "    if tpl.on_dtensors:\n        plan = on_dtensors(plan)\n",
        "",
        f"{SHARD} {oracle('mla-tp2')}",
        "MLA's shared rotary key is split on plain local shards: its gradient is never summed",
    ),
    M(
        "run-block-input-gradient-left-dtensor",
        "runtime/dtensor_blocks.py",
        "    return grad.full_tensor() if isinstance(grad, DTensor) else grad",
        "    return grad",
        oracle("mla-tp2"),
        "a DTensor gradient leaves a DTensor block into code that takes plain tensors",
    ),
    M(
        "sharding-region-through-gathering-consumer",
        "planner/cost/sharding.py",
        "            if reads and states[u] not in reads:\n",
        "            if False:\n",
        "tests/test_foreign_models.py::test_minicpm3_latent_attention_is_planned_split_by_heads",
        "a column-parallel region runs on through a consumer that gathers it: runnable layouts "
        "(MiniCPM3's) are rejected",
    ),
    M(
        "run-colwise-input-reduced-per-module",
        "runtime/parallelize.py",
        "        style._prepare_input_fn = _shared_input  # _apply reads it from the instance\n",
        "        pass\n",
        "tests/test_dtensor_blocks.py",
        "q, k and v each all-reduce the layer's input gradient: 2.5x the priced backward TP "
        "traffic",
    ),
    M(
        "run-new-empty-made-whole",
        "runtime/dtensor_blocks.py",
        "        made = new_like_locally(func, args, kwargs)\n",
        "        made = None\n",
        "tests/test_dtensor_blocks.py",
        "DeepSeek's keys made whole by DTensor's new_empty: an all-gather per layer",
    ),
    M(
        "probe-blames-shards-for-a-whole-block-failure",
        "planner/cost/eager_probe.py",
        "        if exc is not None:\n",
        "        if False:\n",
        "tests/test_foreign_models.py",
        "a block whose code fails on the meta device whole (fp32 grouped experts) loses every "
        "sharded variant",
    ),
    M(
        "cost-async-tp-hides-everything",
        "planner/cost/compute.py",
        "    keep = 1.0 - share\n",
        "    keep = 0.0\n",
        "tests/test_published.py",
        "torch's async TP credited with hiding every TP collective (torchtitan rows 20-25% fast)",
    ),
    M(
        "trace-batchnorm-on-one-sample",
        "planner/trace/export.py",
        "    return 2 if any(isinstance(m, _BatchNorm) for m in model.modules()) else 1\n",
        "    return 1\n",
        "tests/test_trace.py",
        "a model whose BatchNorm normalises pooled features cannot be traced at all",
    ),
    M(
        "search-batchnorm-given-a-lone-sample",
        "planner/search/driver.py",
        "        cands = [c for c in cands if c.micro_batch_size * c.dp >= floor]\n",
        "        cands = list(cands)\n",
        "tests/test_trace.py",
        "a pipeline gives a [batch, features] BatchNorm one sample: every worker crashes",
    ),
    M(
        "run-ddp-waits-for-unread-params",
        "runtime/parallelize.py",
        "        unread = set(plan.model.unread_params)\n",
        "        unread = set()\n",
        "tests/test_runtime_oracle.py::test_plan_trains_like_one_process[dinov2-unread-param-dp2]",
        "DDP waits for a gradient the forward never makes: the second step fails",
    ),
    M(
        "run-pipeline-drops-unread-params",
        "runtime/build.py",
        "    if 0 in indices:\n",
        "    if False:\n",
        "tests/test_runtime_oracle.py::test_plan_trains_like_one_process[dinov2-unread-param-pp2]",
        "a parameter no stage reads is missing from every pipeline checkpoint",
    ),
    M(
        "trace-unread-params-unlisted",
        "planner/trace/export.py",
        '[0] == "parameter" and not n.users\n',
        '[0] == "parameter" and False\n',
        "tests/test_trace.py",
        "the plan lists no unread parameter: DDP fails on DINOv2's mask token",
    ),
    M(
        "probe-skips-blocks-of-several-modules",
        "planner/api.py",
        "        if probe is not None:\n",
        "        if probe is not None and len(block.modules) == 1:\n",
        "tests/test_runtime_oracle.py::test_plan_trains_like_one_process[canine-range-block-tp2]",
        "CANINE's character attention split on local shards: every worker crashes",
    ),
    M(
        "sharding-weight-read-outside-its-module-untied",
        "planner/cost/sharding.py",
        '                if module != p.rpartition(".")[0]:\n',
        "                if False:\n",
        "tests/test_runtime_oracle.py::test_plan_trains_like_one_process[perceiver-shared-embedding-tp2]",
        "Perceiver's decoder meets its embedding's weight as a DTensor: every worker crashes",
    ),
    M(
        "sharding-partial-derived-through-colwise-input",
        "planner/cost/sharding.py",
        "_derived_params(prob, plain_pgrad))",
        "_derived_params(prob, pgrad_nodes))",
        "tests/test_runtime_oracle.py::test_plan_trains_like_one_process[perceiver-shared-embedding-tp2]",
        "Perceiver's latents' gradient summed over TP twice (the style's and the plan's)",
    ),
    M(
        "trace-legacy-parameter-left-on-cpu",
        "planner/trace/export.py",
        "    _parameters_to_meta(model)\n",
        "    pass\n",
        "tests/test_trace.py",
        "XLNet's attention weights stay on the CPU and the meta trace refuses the model",
    ),
    M(
        "trace-custom-backward-unrecorded",
        "planner/trace/export.py",
        '        if not cls.__module__.startswith("torch."):\n            applied.append(',
        "        if False:\n            applied.append(",
        "tests/test_trace.py",
        "a pipeline differentiates a straight-through estimator's forward (YOSO: another model)",
    ),
    M(
        "trace-custom-backward-in-eager-module-refused",
        "planner/trace/export.py",
        "fn for fn, around in applied if not any(plain.get(n) for n in around if n)",
        "fn for fn, around in applied",
        "tests/test_trace.py",
        "BLOOM's GeLU function (run eagerly by its stage) costs BLOOM every pipeline",
    ),
    M(
        "run-stage-never-adopts-eager-modules",
        "runtime/stages.py",
        "        original = eager.get(one_call_site(fqn))\n",
        "        original = None\n",
        "tests/test_runtime_oracle.py::test_plan_trains_like_one_process[ste-custom-backward-pp2]",
        "every stage runs its traced copy: a function's own backward is lost under PP",
    ),
    M(
        "run-received-tensor-changed-in-place",
        "runtime/stages.py",
        "                    copy = mutated_in_place(node, stage)\n",
        "                    copy = False\n",
        "tests/test_runtime_oracle.py::test_plan_trains_like_one_process[inplace_residual-inplace-received-pp2]",
        "a stage adding into what it received in place crashes (RegNet's cut residual)",
    ),
    M(
        "run-model-input-not-relayed",
        "runtime/stages.py",
        "            if value in roots and j > 0:  # a model input read after the first stage\n",
        "            if False:\n",
        "tests/test_runtime_oracle.py::test_plan_trains_like_one_process[inplace_residual-inplace-received-pp2]",
        "a model input a later stage reads is left to torch, which refuses it",
    ),
    M(
        "trace-loss-coupling-never-found",
        "planner/trace/loss_samples.py",
        "    return abs(together - apart) > REL_TOL * max(abs(together), abs(apart), 1e-6)\n",
        "    return False\n",
        "tests/test_loss_samples.py",
        "a summed or contrastive loss trains another model under DP, unsaid",
    ),
    M(
        "trace-loss-halves-given-whole-outputs",
        "planner/trace/loss_samples.py",
        "                part = part.narrow(d, i * a.shape[d], a.shape[d])\n",
        "                part = value\n",
        "tests/test_loss_samples.py",
        "each sample alone is given both samples' outputs: no loss is ever checked",
    ),
    M(
        "api-loss-note-never-given",
        "planner/api.py",
        "    if not couples_samples(check):\n",
        "    if True:\n",
        "tests/test_loss_samples.py::test_a_plan_splitting_the_batch_says_so_with_the_pin",
        "the plan that averages a coupled loss over its parts does not say so",
    ),
    M(
        "recsys-one-all-to-all-per-sharding-type",
        "planner/recsys/cost.py",
        "        return A2A_PER_SHARDING * self.a2a_latency_s\n",
        "        return self.a2a_latency_s\n",
        "tests/test_recsys_solver.py::test_collective_latency_counts_torchrec_groups_by_hand",
        "TorchRec's five all-to-alls per sharding group priced as one",
    ),
    M(
        "recsys-milp-blind-to-sharding-latency",
        "planner/recsys/milp.py",
        "    fixed = fixed + MS * (np.array([d.sharding_latency_s(s) for s in types]) @ u)\n",
        "",
        "tests/test_recsys_solver.py::test_milp_equals_brute_force",
        "the MILP mixes sharding types without paying their collectives",
    ),
    M(
        "recsys-dense-dispatch-unpriced",
        "planner/recsys/cost.py",
        " + model.dense_forward_ops * p.op_overhead",
        "",
        "tests/test_recsys_solver.py::test_dense_dispatch_is_priced_where_the_profile_prices_it",
        "the dense part's host dispatch on CPU ranks left out",
    ),
    M(
        "run-first-stage-misses-unread-input",
        "runtime/stages.py",
        "    for root in roots:  # torch hands the first stage every model input, read or not\n"
        "        _stage_input(split_gm, stages[0], root)\n",
        "",
        "tests/test_runtime_oracle.py::test_plan_trains_like_one_process[multi_input-inputs-pp2]",
        "a model input no stage reads: the first stage is called with one argument too many",
    ),
    M(
        "run-first-stage-inputs-in-reading-order",
        "runtime/stages.py",
        "    if order != args:\n",
        "    if False:\n",
        "tests/test_runtime_oracle.py::test_plan_trains_like_one_process[multi_input-inputs-pp2]",
        "the first stage takes the model's inputs in the order it reads them: two swapped",
    ),
    M(
        "run-eager-swap-ignores-call-arguments",
        "runtime/stages.py",
        "            and (one_tensor is None or one_call_site(fqn) in one_tensor)\n",
        "",
        "tests/test_runtime_oracle.py::test_plan_trains_like_one_process[multi_input-inputs-pp2]",
        "a module called with a list runs eagerly on the one tensor the trace kept",
    ),
    M(
        "trace-loss-meta-forward-not-as-export",
        "planner/trace/loss_samples.py",
        '        mock.patch.object(torch.compiler, "is_compiling", lambda: True),\n',
        "",
        "tests/test_loss_samples.py",
        "the loss is never checked on models with value-dependent shortcuts (transformers)",
    ),
    M(
        "trace-loss-similarity-split-along-one-dim",
        "planner/trace/loss_samples.py",
        "            for d in dims:  # [batch, batch]: each alone sees its diagonal block\n",
        "            for d in dims[:1]:\n",
        "tests/test_loss_samples.py",
        "a [batch, batch] output split along rows only: CLIP's halves see the other's columns",
    ),
    M(
        "trace-loss-default-targets-all-valid",
        "planner/trace/loss_samples.py",
        "    valid = (targets.reshape(2, -1) != IGNORE_INDEX).float()\n",
        "    valid = torch.ones(targets.reshape(2, -1).shape)\n",
        "tests/test_loss_samples.py",
        "a full-size LM's padded targets unseen: its token mean passes as a per-sample mean",
    ),
    M(
        "trace-forward-state-unseen",
        "planner/trace/export.py",
        '    graph.graph["forward_state"] = copied_state(forward_state(model, before), repeats)\n',
        '    graph.graph["forward_state"] = []\n',
        "tests/test_trace.py::test_buffers_the_forward_updates_are_found_and_named_under_data_parallelism",
        "a spectral norm's buffers drift under data parallelism, unsaid",
    ),
    M(
        "trace-forward-state-counts-batchnorm",
        "planner/trace/export.py",
        "    return sorted(n for n in now if n not in stats and before.get(n) != now[n])\n",
        "    return sorted(n for n in now if before.get(n) != now[n])\n",
        "tests/test_trace.py::test_buffers_the_forward_updates_are_found_and_named_under_data_parallelism",
        "every BatchNorm model told its running statistics drift",
    ),
    M(
        "search-tp-pin-with-nothing-to-split-misexplained",
        "planner/search/candidates.py",
        "    if pins.tp and pins.tp > 1 and tps == [1]:\n",
        "    if False:\n",
        "tests/test_trace.py::test_a_pinned_tp_with_nothing_to_split_says_why",
        "a --tp refused for dividing nothing, when nothing can be split",
    ),
    M(
        "cost-fsdp-accumulation-unpriced",
        "planner/cost/data_parallel.py",
        "            per_param = gathers * gather + (reduce + acc) / m",
        "            per_param = gathers * gather + reduce / m",
        "tests/test_cost_terms.py::test_the_data_parallel_wrappers_copies",
        "FSDP2's fp32 gradient accumulation across micro-batches left out of the copies",
    ),
    M(
        "cost-fsdp-reduce-once-per-step",
        "planner/cost/data_parallel.py",
        "        elif m > 1 and zero >= 2:",
        "        elif False:",
        "tests/test_cost_terms.py::test_the_data_parallel_wrappers_copies",
        "ZeRO-2/3 outside a pipeline priced one reduce's copies a step, as if sync were off",
    ),
    M(
        "cost-zero2-gathers-once-under-fsdp2",
        "planner/cost/data_parallel.py",
        "        g = m if r.regather else 1",
        "        g = 1",
        "tests/test_cost_terms.py::test_zero2_reduce_scatters_every_micro_batch",
        "FSDP2's ZeRO-2 priced one all-gather a step though it reshards after each backward",
    ),
    M(
        "cost-legacy-attention-ignored",
        "planner/cost/compute.py",
        "        elif legacy and p.legacy_attention_efficiency > 0:",
        "        elif False:",
        "tests/test_published.py::test_a_flash_attention_build_older_than_the_chip_runs_at_its_fitted_rate",
        "a 2023 flash-attention build priced as today's SDPA kernel",
    ),
    M(
        "published-local-batch-pipeline-unsplit",
        "benchmarks/published.py",
        "    return n // pp\n",
        "    return n\n",
        "tests/test_published.py::test_a_torchtitan_local_batch_is_read_with_its_defaults",
        "a torchtitan pipeline's local batch taken as one micro-batch",
    ),
    M(
        "cost-deferred-zero2-gathers-each-micro-batch",
        "planner/cost/data_parallel.py",
        "        gathers = 2 if zero == 3 else (1 / m if deferred else 1)\n",
        "        gathers = 2 if zero == 3 else 1\n",
        "tests/test_cost_terms.py::test_a_deferring_zero2_pipeline_gathers_once_per_step",
        "a deferring pipeline's ZeRO-2 stage priced a gather's copies each micro-batch",
    ),
    M(
        "cost-fused-accumulation-unpriced",
        "planner/cost/optimizer.py",
        "                n -= o.product_params  # the weight-gradient GEMMs accumulated them",
        "                n -= 0.0",
        "tests/test_costmodel.py::test_fused_weight_gradient_accumulation_adds_only_the_other_gradients",
        "Megatron's weight-gradient GEMMs' accumulation still charged a separate pass",
    ),
    M(
        "trace-product-params-miss-views",
        "planner/trace/blocks.py",
        "            read |= viewed.get(u, set())",
        "            pass",
        "tests/test_costmodel.py::test_the_products_weights_are_what_a_weight_gradient_gemm_writes",
        "a parameter reaching a product through a view not counted as a product's weight",
    ),
    M(
        "cost-reduction-bucket-unpriced",
        "planner/cost/memory.py",
        "    total += inp.training.reduce_bucket_bytes\n",
        "",
        "tests/test_cost_terms.py::test_reduction_bucket_sits_on_every_rank_beside_the_activation_peak",
        "DeepSpeed's reduction bucket left out of every rank's memory",
    ),
    M(
        "published-bucket-not-capped-by-rank",
        "planner/cost/engines.py",
        "    return fp32_partition, min(DEEPSPEED_BUCKET_ELEMENTS, rank_params) * 2",
        "    return fp32_partition, DEEPSPEED_BUCKET_ELEMENTS * 2",
        "tests/test_published.py::test_deepspeed_reduction_buffer_by_zero_stage_and_gradient_width",
        "stage 0's all-reduce bucket priced larger than the gradients it flattens",
    ),
    M(
        "mixed-counts-left-free",
        "planner/search/mixed/search.py",
        "            mp = replace(mp, units=list(mc.units), units_low=list(mc.units_low))\n",
        "            pass\n",
        "tests/test_mixed_plan.py::test_by_cost_the_cheapest_run_can_be_a_slower_mixed_pipeline",
        "a placement priced at one count of GPUs per kind while its MILP may use others",
    ),
    M(
        "mixed-rate-deadline-ignored",
        "planner/resources/mixed_pool.py",
        "            longest = deadline_h / run.wall_h\n",
        "            longest = math.inf\n",
        "tests/test_mixed_pool.py::test_placement_rate_prices_a_step_second_of_each_objective_by_hand",
        "a mixed pipeline that misses the deadline kept as the cheapest",
    ),
    M(
        "mixed-search-ignores-the-rate",
        "planner/search/mixed/search.py",
        "        return self.rate.per_step_s(gpus) if any(gpus) else 0.0\n",
        "        return 1.0 if any(gpus) else 0.0\n",
        "tests/test_mixed_plan.py::test_by_cost_the_cheapest_run_can_be_a_slower_mixed_pipeline",
        "the cost search ranks placements by step time, whatever their GPUs cost",
    ),
    M(
        "run-gathered-output-a-view",
        "runtime/parallelize.py",
        "    return out.clone() if own else out\n",
        "    return out\n",
        oracle("inplace-logits"),
        "a gathered column-parallel output left a view the model may not write into (Chameleon)",
    ),
    M(
        "run-worker-bug-traceback",
        "runtime/worker.py",
        "        return report_bug(rank, exc, Path(args.run_dirs[0]))\n",
        "        raise\n",
        "tests/test_runtime_launch.py::test_an_error_in_the_workers_ends_in_one_line",
        "an error in the workers ends in every rank's traceback and torchrun's report",
    ),
    M(
        "run-stop-reported-by-torchrun",
        "runtime/worker.py",
        "        # with the stop file's line and exit status.\n        return 0\n",
        "        # with the stop file's line and exit status.\n        return exc.exit_code\n",
        "tests/test_runtime_launch.py::test_a_pipeline_torch_cannot_cut_ends_in_one_line",
        "a refusal the workers raise also reported by torchrun, with its traceback",
    ),
    M(
        "run-pipeline-cut-error-uncaught",
        "runtime/stages.py",
        "            except Exception as exc:  # noqa: BLE001 - torch's splitter refuses the cut\n",
        "            except OSError as exc:  # noqa: BLE001 - torch's splitter refuses the cut\n",
        "tests/test_runtime_launch.py::test_a_pipeline_torch_cannot_cut_ends_in_one_line",
        "torch's splitter refusing a cut crashes every rank instead of one line",
    ),
    M(
        "published-family-size-any-match",
        "benchmarks/published.py",
        "    if len({family for family, _, _ in fits}) != 1:",
        "    if not fits:",
        "tests/test_published.py::test_an_unnamed_model_is_read_off_its_stated_size",
        "an unnamed model read as the nearest of several families its size matches",
    ),
    M(
        "published-nemotron-tied",
        "benchmarks/published.py",
        '    Family(NEMOTRON, "gpt", tied=False, ffn_is_4h=False),',
        '    Family(NEMOTRON, "gpt", tied=True, ffn_is_4h=False),',
        "tests/test_published.py::test_nemotron_is_an_untied_non_gated_decoder_with_grouped_queries",
        "Nemotron built with its head tied to the embedding",
    ),
    M(
        "gqa-layout-split-across-groups",
        "benchmarks/published_gpt.py",
        "            qkv = self.qkv(x).view(b, s, self.kv_heads, self.group + 2, self.head_dim)",
        "            qkv = self.qkv(x).view(b, s, self.group + 2, self.kv_heads, self.head_dim)"
        ".transpose(2, 3)",
        "tests/test_cost_terms.py::test_grouped_query_attention_in_megatrons_layout_is_attention_over_shared_heads",
        "grouped-query projection laid out [q | k | v] instead of Megatron's per-group layout",
    ),
    M(
        "published-allocated-peak-with-slack",
        "benchmarks/published.py",
        "    mem = (peak if s.allocated_memory else",
        "    mem = (peak if False else",
        "tests/test_published.py::test_a_row_quoting_the_allocated_peak_is_compared_without_the_allocator_slack",
        "a row quoting torch's allocated peak compared with the reserved prediction",
    ),
    M(
        "stage-tp-receive-without-modulo",
        "planner/schema/mesh.py",
        "        return self.rank(other, replica, tp_i % theirs), sends\n",
        "        return self.rank(other, replica, min(tp_i, theirs - 1)), sends\n",
        "tests/test_stage_tp.py::test_every_boundary_message_has_one_sender_and_one_receiver",
        "a wider stage's rank takes its copy from the narrower stage's last TP rank, not u mod a",
    ),
    M(
        "stage-dp-contiguous-local-order",
        "planner/schema/mesh.py",
        "        if self.round_robin:\n            return k * self.dp_of(pp_i) + dp_i\n",
        "        if False:\n            return k * self.dp_of(pp_i) + dp_i\n",
        "tests/test_stage_tp.py::test_every_boundary_message_has_one_sender_and_one_receiver",
        "a replica runs its contiguous share while its neighbours route micro-batches in turns",
    ),
    M(
        "run-uneven-mesh-cache-ignores-dp",
        "runtime/build.py",
        "    by_stage = (plan_mesh.stage_tp, plan_mesh.stage_dp) if plan_mesh.uneven else None\n",
        "    by_stage = plan_mesh.stage_tp if plan_mesh.uneven else None\n",
        "tests/test_stage_tp.py::test_runtime_runs_stages_of_different_degrees_like_one_process",
        "a second plan of other DP degrees in one launch reuses the first plan's stage meshes",
    ),
    M(
        "run-uneven-loss-first-stage-replicas",
        "runtime/train.py",
        "    replicas = plan.mesh.replicas_of(plan.mesh.pp - 1)\n",
        "    replicas = plan.mesh.replicas_of(0)\n",
        "tests/test_stage_tp.py::test_runtime_runs_stages_of_different_degrees_like_one_process",
        "the step loss averaged over the first stage's replicas, not the last stage's",
    ),
    M(
        "run-uneven-dp-1f1b-allowed",
        "runtime/capability.py",
        "    if mesh.round_robin and plan.schedule != Schedule.GPIPE:\n",
        "    if mesh.round_robin and plan.schedule == Schedule.INTERLEAVED:\n",
        "tests/test_stage_tp.py::test_uneven_dp_under_1f1b_is_refused",
        "stages of different DP degrees allowed under 1F1B, which can deadlock",
    ),
    M(
        "run-tie-across-degrees-summed",
        "runtime/tied.py",
        "    _refuse_split_ties(everyone, mesh)\n",
        "",
        "-m 'not zoo' "
        "tests/test_stage_tp.py::test_a_tied_weight_across_two_degrees_is_refused_in_one_line",
        "a weight tied across stages of two TP degrees summed between unlike shards",
    ),
    M(
        "mixed-hop-one-copy-between-degrees",
        "planner/cost/pipeline.py",
        "    forward = p2p_time(nbytes * math.ceil(t_next / t), bw, lat)\n",
        "    forward = p2p_time(nbytes, bw, lat)\n",
        "tests/test_mixed_stage_tp.py::test_hop_prices_the_copies_the_runtime_sends",
        "a sender feeding more TP ranks than it has priced as sending one copy",
    ),
    M(
        "mixed-stage-degrees-never-searched",
        "planner/search/mixed/search.py",
        "        if not stage_degrees:\n",
        "        if True:\n",
        "tests/test_mixed_stage_tp.py::test_stage_degrees_differ_and_beat_one_degree_for_all",
        "by default the stages of a mixed pipeline never get degrees of their own",
    ),
    M(
        "mixed-stage-degrees-skipped-silently",
        "planner/search/mixed/search.py",
        "    if skipped:\n",
        "    if False:\n",
        "tests/test_mixed_stage_tp.py::test_stage_degrees_are_searched_by_default_on_small_pools",
        "the cells of several degrees left out with no word to the user",
    ),
    M(
        "mixed-tied-stages-any-degree",
        "planner/search/mixed/milp.py",
        "    if groups and spread > 0:\n",
        "    if False:\n",
        "tests/test_mixed_milp.py::test_tied_segments_share_one_degree",
        "a tied embedding and head on stages of different TP degrees, which the runtime refuses",
    ),
    M(
        "mixed-plan-mesh-one-degree",
        "planner/resources/mixed_plan.py",
        "    stage_tp = tuple(tps) if len(set(tps)) > 1 else None\n",
        "    stage_tp = None\n",
        "tests/test_mixed_stage_tp.py::test_plan_file_records_each_stages_degree",
        "plan.json gives every stage the largest degree the search chose for any",
    ),
    M(
        "mixed-fluid-floor-doubled",
        "planner/search/mixed/search.py",
        "        busy = (self.m - self.top) * self.rank_s\n",
        "        busy = 2 * (self.m - self.top) * self.rank_s\n",
        "tests/test_mixed_stage_tp.py::test_pruned_search_equals_every_cell_solved",
        "a cell's floor from the kinds' rank-seconds twice what any placement of it can reach",
    ),
    M(
        "mixed-stage-degrees-by-rate-default",
        "planner/search/mixed/search.py",
        "STAGE_DEGREE_GPUS and rate is None\n",
        "STAGE_DEGREE_GPUS\n",
        "tests/test_mixed_plan.py::test_by_cost_the_cheapest_run_can_be_a_slower_mixed_pipeline",
        "a search by money or under a deadline searching every degree's boxes by default (minutes)",
    ),
    M(
        "mixed-dp-milp-one-micro-batch-count",
        "planner/search/mixed/milp.py",
        "    q = np.array([mp.m_of(v) - 1.0 for v in range(V)])  # m_v - 1\n",
        "    q = np.array([mp.m_of(0) - 1.0 for v in range(V)])  # m_v - 1\n",
        "tests/test_mixed_milp.py",
        "every stage's busy time priced at the first variant's micro-batches per replica, "
        "whatever its DP degree",
    ),
    M(
        "mixed-dp-step-one-micro-batch-count",
        "planner/search/mixed/cost.py",
        "    return one_chunk_pipeline(times, [mp.m_of(v) for v in variants])",
        "    return one_chunk_pipeline(times, [mp.m_of(0) for v in variants])",
        "tests/test_mixed_milp.py",
        "the direct step time ignores that a stage of more replicas runs fewer micro-batches each",
    ),
    M(
        "mixed-dp-units-tp-only",
        "planner/search/mixed/milp.py",
        "        return self.variants[v][1] * self.variants[v][2]\n",
        "        return self.variants[v][1]\n",
        "tests/test_mixed_milp.py",
        "a stage's replicas beyond the first take none of its kind's GPUs in the pool's count",
    ),
    M(
        "mixed-dp-tied-tp-only",
        "planner/search/mixed/milp.py",
        "    codes = np.array([t + base * r for _, t, r in variants], dtype=float)\n",
        "    codes = np.array([t for _, t, r in variants], dtype=float)\n",
        "tests/test_mixed_milp.py",
        "a tied embedding and head on stages of different DP degrees, which the runtime refuses",
    ),
    M(
        "mixed-dp-needs-ignored",
        "planner/search/mixed/milp.py",
        "    for of, needed in ((1, mp.needs), (2, mp.dp_needs)):\n",
        "    for of, needed in ((1, mp.needs),):\n",
        "tests/test_mixed_milp.py::test_cells_part_the_placements",
        "a cell of DP multiples up to r solved without a stage at 1 and at r: cells overlap",
    ),
    M(
        "mixed-dp-fastest-floor-unscaled",
        "planner/search/mixed/search.py",
        "            scale = [fl.m // r - 1.0 for _, _, r in vs]\n",
        "            scale = [fl.m - 1.0 for _, _, r in vs]\n",
        "tests/test_mixed_stage_dp.py::test_pruned_search_equals_every_cell_solved",
        "a cell's fastest-option floor prices every replica at the whole step's micro-batches",
    ),
    M(
        "mixed-dp-pipeline-floor-top-ignored",
        "planner/search/mixed/search.py",
        "        pipeline = self.fastest * one_chunk_floor(self.m // self.top, self.pp)\n",
        "        pipeline = self.fastest * one_chunk_floor(self.m, self.pp)\n",
        "tests/test_mixed_milp.py::test_cell_floors_never_exceed_the_cells_optimum",
        "a cell's pipeline floor ignores that its wider stages run fewer micro-batches",
    ),
    M(
        "mixed-dp-inflight-first-variant",
        "planner/search/mixed/milp.py",
        "np.array([sp.inflight for sp in sps], dtype=float)",
        "np.array([sps[0].inflight for sp in sps], dtype=float)",
        "tests/test_mixed_milp.py",
        "every stage's activations held at the first variant's micro-batches in flight",
    ),
    M(
        "mixed-dp-plan-mesh-one-dp",
        "planner/resources/mixed_plan.py",
        "    stage_dp = tuple(dps) if len(set(dps)) > 1 else None\n",
        "    stage_dp = None\n",
        "tests/test_mixed_stage_dp.py::test_plan_file_records_each_stages_dp_degree",
        "plan.json gives every stage the widest stage's DP degree",
    ),
    M(
        "mixed-dp-cells-under-1f1b",
        "planner/search/mixed/search.py",
        "                        one = Schedule.ONE_F_ONE_B if m >= pp and top == 1 "
        "else Schedule.GPIPE\n",
        "                        one = Schedule.ONE_F_ONE_B if m >= pp else Schedule.GPIPE\n",
        "tests/test_mixed_stage_dp.py::test_stage_dp_degrees_differ_and_beat_one_replica_a_stage",
        "stages of different DP degrees planned under 1F1B, which the runtime refuses",
    ),
    M(
        "mixed-stage-dp-default-any-pool",
        "planner/search/mixed/search.py",
        "    own_dp = small and gpus <= STAGE_DP_GPUS if",
        "    own_dp = small if",
        "tests/test_mixed_stage_dp.py::test_stage_dp_is_searched_by_default_on_small_pools_only",
        "stages of their own DP degree searched by default on pools where it takes minutes",
    ),
    M(
        "mixed-stage-dp-left-silently",
        "planner/search/mixed/search.py",
        "    dp_left = not own_dp and not pins.dp and max(k.gpus for k in kinds) >= 2\n",
        "    dp_left = False\n",
        "tests/test_mixed_stage_dp.py::test_stage_dp_is_searched_by_default_on_small_pools_only",
        "stages of their own DP degree left out with no word to the user",
    ),
    M(
        "worker-freeze-before-collect",
        "runtime/build.py",
        "    gc.collect()\n    gc.freeze()\n",
        "    gc.freeze()\n    gc.collect()\n",
        "tests/test_runtime_release.py",
        "a batch's worker freezes what was garbage between plans, which then lives to the end",
    ),
    M(
        "search-pinned-tp-not-priced",
        "planner/search/driver.py",
        "if not pins.tp or t == pins.tp])",
        "if not pins.tp or t == 1])",
        "tests/test_solver_plans.py",
        "a pinned TP degree is left unpriced, so the pin is refused as unshardable",
    ),
    M(
        "plan-baselines-never-compared",
        "planner/api.py",
        "    if compare_baselines:\n",
        "    if False:\n",
        "tests/test_solver_plans.py::test_leaving_the_baselines_out_changes_only_the_alternatives",
        "the plan's alternatives lose the hand-written baselines even when asked for",
    ),
    M(
        "plan-solved-shared-across-models",
        "planner/api.py",
        "solved.setdefault(traced.cache_key, {})",
        'solved.setdefault("", {})',
        "tests/test_solver_plans.py::test_solved_carries_sharding_solutions_to_later_plans_of_the_same_model",
        "one model's sharding solutions reused for another model's blocks of the same class name",
    ),
    M(
        "search-pipelines-solved-in-cheap-bound-order",
        "planner/search/driver.py",
        "                    heapq.heappush(line, (c.bound, r, c))\n                    continue\n",
        "                    self._solve_first(c, pins)\n",
        "tests/test_search_certificates.py",
        "a pipeline's MILP is built as soon as its split bound is, before candidates whose "
        "bounds are lower: the order of the cheap bound, not of the strongest",
    ),
    M(
        "trace-direct-forward-unrecorded",
        "planner/trace/export.py",
        'graph.graph["direct_forward"] = direct_forwards(model, copied_modules(called, repeats))',
        'graph.graph["direct_forward"] = []',
        "tests/test_trace.py " + oracle("direct_forward"),
        "layers whose forward the model calls directly go unnamed, so their hooks never fire",
    ),
    M(
        "run-direct-forward-not-routed",
        "runtime/build.py",
        "route_direct_forwards(model, plan.model.direct_forward or [])",
        "route_direct_forwards(model, [])",
        oracle("direct_forward"),
        "a layer called by its forward keeps FSDP2's shards: its forward meets DTensors",
    ),
    M(
        "run-sparse-embedding-gradient-kept-sparse",
        "runtime/build.py",
        "    sparse = dense_embedding_gradients(model)\n",
        "    sparse = []\n",
        oracle("sparse_embedding"),
        "a sparse=True embedding keeps its sparse gradient, which FSDP2 cannot reduce",
    ),
    M(
        "trace-forward-weight-updates-unseen",
        "planner/trace/export.py",
        "tensors = [*model.named_buffers(), *model.named_parameters()]",
        "tensors = [*model.named_buffers()]",
        "tests/test_trace.py",
        "a weight the forward renormalises in place (max_norm) goes unnamed, and data-parallel "
        "replicas silently train another model",
    ),
    M(
        "sharding-updated-weight-split",
        "planner/cost/sharding.py",
        "    updated = updated_parameters(graph)\n",
        "    updated = frozenset()\n",
        "tests/test_trace.py " + oracle("max_norm"),
        "a weight the forward renormalises in place is split by TP: every worker crashes",
    ),
    M(
        "run-scalar-parameters-wrapped",
        "runtime/build.py",
        "        scalars = scalar_parameters(model, set(experts))\n",
        "        scalars = []\n",
        oracle("scalar_params"),
        "0-dim parameters handed to fully_shard, which refuses them: every worker crashes",
    ),
    M(
        "run-scalar-gradients-not-averaged",
        "runtime/build.py",
        "            sync_expert_grads(params, group, dist.get_world_size(group))\n",
        "            pass\n",
        oracle("scalar_params"),
        "0-dim parameters left out of the wrappers keep each replica's own gradient: the "
        "replicas train apart",
    ),
    M(
        "trace-listed-twice-unseen",
        "planner/trace/export.py",
        'graph.graph["shared_modules"] = shared_modules(model)',
        'graph.graph["shared_modules"] = []',
        "tests/test_trace.py",
        "a block listed twice in one container is planned into a pipeline torch cannot cut",
    ),
    M(
        "run-weight-read-outside-own-unit",
        "runtime/parallelize.py",
        "    read_outside = frozenset(plan.model.read_outside or [])\n",
        "    read_outside = frozenset()\n",
        oracle("manual_tie"),
        "a weight the model's own code reads keeps its module's FSDP unit, resharded by then",
    ),
    M(
        "run-tied-copy-without-gradient",
        "runtime/tied.py",
        "                if p.grad is None:\n                    p.grad = torch.zeros_like(p)\n",
        "                pass\n",
        oracle("ema_teacher"),
        "a weight copy a later stage reads under no_grad has no gradient: the tied sum crashes",
    ),
    M(
        "run-later-call-holder-kept",
        "runtime/stages.py",
        "else stage, name, eager[base])",
        "else stage, name, find_module(stage, base))",
        oracle("reused_layer"),
        "a stage running a later call of a module keeps torch's holder of its weights, which "
        "TP cannot shard",
    ),
    M(
        "run-tp-style-under-unreached-path",
        "runtime/parallelize.py",
        "            styles[reached.get(id(module), fqn)] = _sharing_inputs(",
        "            styles[fqn] = _sharing_inputs(",
        oracle("reused_layer"),
        "a module held at two paths gets its style under the one parallelize_module never "
        "reaches: that stage's copy stays whole and the tied sum mismatches",
    ),
    M(
        "run-alone-rank-waits-for-rank-0",
        "runtime/worker.py",
        "        alone.start()\n",
        "",
        "tests/test_worker_alone.py",
        "a rank whose own stage erred waits at a barrier rank 0 never reaches: plan run hangs",
    ),
    M(
        "run-peers-not-watching-stop-file",
        "runtime/stop.py",
        '    threading.Thread(target=watch, name="meshplan-stop-watch", daemon=True).start()\n',
        "",
        "tests/test_worker_alone.py",
        "the ranks waiting for a stage that stopped alone are never ended: plan run hangs",
    ),
    M(
        "trace-dropout-off-counted-as-draw",
        "planner/trace/randomness.py",
        '            if not _dropout_on(data.get("args") or []):\n',
        "            if False:\n",
        "tests/test_random_draws.py",
        "dropout at p=0 (or in eval) is said to draw random numbers: a false alarm on every model",
    ),
    M(
        "note-random-draws-unsaid",
        "planner/api.py",
        "    notes += random_draw_notes(traced.graph, doc)\n",
        "",
        "tests/test_random_draws.py",
        "a plan of a model with dropout on says nothing, and its losses' difference from one "
        "device looks like a bug",
    ),
    M(
        "pool-figure-lines-off-by-one",
        "planner/resources/pool.py",
        "    for number, line in enumerate(text.splitlines(), start=1):\n",
        "    for number, line in enumerate(text.splitlines()):\n",
        "tests/test_resources.py",
        "the choice cites each price and power figure one line above where it is typed",
    ),
    # ------------------------------------------- issue 53: bugs the default suite once missed
    M(
        "cost-backward-dispatch-for-frozen-ops",
        "planner/cost/compute.py",
        '        bwd += 1 if d.get("requires_grad") else 0\n',
        "        bwd += 1\n",
        "tests/test_live_terms.py",
        "the CPU backward pays the per-op dispatch cost of forward ops without a gradient",
    ),
    M(
        "cost-working-memory-at-traced-batch",
        "planner/cost/block_options.py",
        "transient_bytes=block.transient_bytes * scale * cf,",
        "transient_bytes=block.transient_bytes * cf,",
        "tests/test_live_terms.py",
        "the largest op's working memory taken at the traced micro-batch of 1: peak memory "
        "under-predicted at every micro-batch above 1",
    ),
    M(
        "run-checkpoint-records-previous-step",
        "runtime/checkpoint.py",
        '    return {"step": torch.tensor(step), "model": model, "optim": optim}',
        '    return {"step": torch.tensor(step - 1), "model": model, "optim": optim}',
        "tests/test_resume_step.py",
        "a checkpoint records the step before the one it holds: --resume trains it twice",
    ),
    M(
        "run-resume-one-step-early",
        "runtime/train.py",
        "        start = load_checkpoint(built, found[1])\n",
        "        start = load_checkpoint(built, found[1]) - 1\n",
        "tests/test_resume_step.py",
        "a resumed run starts at the checkpoint's step instead of the one after: trained twice",
    ),
    M(
        "mixed-tie-code-base-16",
        "planner/search/mixed/milp.py",
        "    base = max(16, 1 + max(t for _, t, _ in variants))\n",
        "    base = 16\n",
        "tests/test_mutant_kills_mixed_milp.py::test_a_tie_tells_tp_32_from_tp_16_at_twice_the_dp",
        "TP 32 at DP 1 and TP 16 at DP 2 share a tie code: tied stages of two layouts",
    ),
    M(
        "trace-root-code-no-block",
        "planner/trace/blocks.py",
        '        result.update(dict.fromkeys(pending, ""))',
        "        pass",
        "tests/test_mutant_kills_blocks.py",
        "a root that runs its children's weights itself gets no block: no layout found",
    ),
    M(
        "stages-inplace-user-seen-once",
        "runtime/stages.py",
        "            if (n, user) in seen:\n                continue\n"
        "            seen.add((n, user))\n",
        "            if user in seen:\n                continue\n            seen.add(user)\n",
        "tests/test_mutant_kills_stages.py::"
        "test_an_input_modified_in_place_directly_through_a_view_or_by_a_submodule",
        "a write through a view of the received tensor, met again, is skipped: no copy",
    ),
    M(
        "command-exit-kills-threads",
        "planner/process_end.py",
        "    threading._shutdown()",
        "    pass",
        "tests/test_command_imports.py::"
        "test_the_process_entry_ends_as_the_interpreter_would_without_its_teardown",
        "plan's exit ends threads that are no daemons before they finish",
    ),
]


@dataclass
class Outcome:
    id: str
    status: str  # killed | survived | not-applicable
    seconds: float
    stage: str = ""  # targeted | suite
    detail: str = ""
    extra: dict = field(default_factory=dict)


def scratch_copy() -> Path:
    """Tracked and untracked (not ignored) files of the tree, copied once."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    dest = Path(tempfile.mkdtemp(prefix="meshplan-mutants-"))
    for f in files:
        src = ROOT / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    return dest


def applies(m: Mutant, root: Path) -> bool:
    text = (root / m.path).read_text()
    return text.count(m.old) == 1


def pytest(root: Path, args: list[str], env: dict, limit: float) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *args]
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return -1, "timeout"
    return proc.returncode, (proc.stdout + proc.stderr)[-3000:]


def failing_test(log: str) -> str:
    for line in log.splitlines():
        if line.startswith(("FAILED", "ERROR")):
            return line[:200]
    return log.strip().splitlines()[-1][:200] if log.strip() else ""


def run_one(m: Mutant, root: Path, env: dict, targeted_only: bool) -> Outcome:
    path = root / m.path
    original = path.read_text()
    if original.count(m.old) != 1:
        return Outcome(m.id, "not-applicable", 0.0, detail=f"text found {original.count(m.old)}x")
    path.write_text(original.replace(m.old, m.new))
    start = time.perf_counter()
    try:
        targets = [
            t
            for t in shlex.split(m.tests)
            if not t.endswith(".py") or (root / t.split("::")[0]).exists()
        ]
        rc, log = pytest(root, targets, env, TIMEOUT_S) if targets else (0, "")
        if rc != 0:
            stage = "targeted"
        elif targeted_only:
            return Outcome(m.id, "survived", time.perf_counter() - start, "targeted")
        else:
            left = TIMEOUT_S * 2
            rc, log = pytest(root, ["-m", "not distributed"], env, left)
            if rc == 0:
                rc, log = pytest(root, ["-m", "distributed"], env, left)
            stage = "suite"
        status = "survived" if rc == 0 else "killed"
        detail = "" if rc == 0 else ("timeout" if rc == -1 else failing_test(log))
        return Outcome(m.id, status, time.perf_counter() - start, stage, detail)
    finally:
        path.write_text(original)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run the mutants whose id starts with this")
    ap.add_argument("--ids", help="run these mutants (comma-separated ids)")
    ap.add_argument("--check", action="store_true", help="only report which mutants apply")
    ap.add_argument("--targeted-only", action="store_true", help="skip the whole-suite stage")
    ap.add_argument("--out", default=str(ROOT / "reports" / "mutants.json"))
    args = ap.parse_args()
    chosen = [m for m in MUTANTS if not args.only or m.id.startswith(args.only)]
    if args.ids:
        wanted = set(args.ids.split(","))
        unknown = wanted - {m.id for m in MUTANTS}
        if unknown:
            ap.error(f"unknown mutant ids: {', '.join(sorted(unknown))}")
        chosen = [m for m in chosen if m.id in wanted]
    if args.check:
        bad = [m.id for m in chosen if not applies(m, ROOT)]
        print(f"{len(chosen) - len(bad)} of {len(chosen)} mutants apply")
        for b in bad:
            print(f"  not applicable: {b}")
        return 1 if bad else 0
    root = scratch_copy()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root)
    env["MESHPLAN_TEST_CACHE"] = str(root / ".mutant-cache")
    env.pop("MESHPLAN_RUNTIME_QUICK", None)
    outcomes: list[Outcome] = []
    try:
        for i, m in enumerate(chosen, 1):
            o = run_one(m, root, env, args.targeted_only)
            outcomes.append(o)
            print(
                f"[{i}/{len(chosen)}] {m.id}: {o.status} ({o.stage}, {o.seconds:.0f} s) {o.detail}",
                flush=True,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    applicable = [o for o in outcomes if o.status != "not-applicable"]
    killed = [o for o in applicable if o.status == "killed"]
    rate = len(killed) / len(applicable) if applicable else 0.0
    report = {
        "command": "python benchmarks/mutants.py" + (" --targeted-only" * args.targeted_only),
        "mutants": len(outcomes),
        "applicable": len(applicable),
        "killed": len(killed),
        "kill_rate": round(rate, 4),
        "survivors": [o.id for o in applicable if o.status == "survived"],
        "not_applicable": [o.id for o in outcomes if o.status == "not-applicable"],
        "results": [{**o.__dict__, "path": m.path, "why": m.why} for o, m in zip(outcomes, chosen)],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"killed {len(killed)} of {len(applicable)} applicable mutants ({rate:.1%}); "
        f"survivors: {', '.join(report['survivors']) or 'none'}; written {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
