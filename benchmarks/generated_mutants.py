"""Generated mutants: mutmut 3 over one module at a time, against the tests that cover it.

    python benchmarks/generated_mutants.py planner/hardware/collectives.py
    python benchmarks/generated_mutants.py --list      # the modules configured below

benchmarks/mutants.py plants bugs written by hand; this one lets mutmut write them (every
operator, constant, comparison and argument it knows how to change, inside every function), so
that what the tests miss is not limited to what their authors thought of. Each run copies the
tree to a scratch directory, writes pyproject's ``[tool.mutmut]`` there with ``only_mutate`` the
module and the test selection its files below, and runs ``mutmut run`` (one collected pytest
session, a forked child per mutant running the tests that reach the mutated function). A mutant
that exceeds mutmut's limit (15 times its tests' measured time plus a second, of wall time;
twice that of CPU time) counts as killed: it hangs or slows its tests 15-fold, or the machine
is loaded enough to stretch its wall time that far, so timeouts are judged one by one.
``--rerun-timeouts`` runs those once more at four times the limit (a test whose
module fixture another test paid for in mutmut's timing run can exceed it unchanged).

A survivor is then checked for equivalence on the shipped examples: the six example models are
planned with the mutant active (``MUTANT_UNDER_TEST``) and without, and a survivor whose plans
are all identical (planning time aside) is *equivalent on the examples*: it changes nothing a
user of them would see. A survivor that changes a plan is a test gap. The result goes to
reports/mutation/<module>.json; docs/mutation.md holds the table.

``--only PATTERN ...`` runs a group of the module's functions (a module of thousands of
mutants, one group at a time): a pattern is a function name (``evaluate``), a method
(``_MilpTerms.coll``), either a glob (``_op*``, ``_MilpTerms.*``), or a glob over mutmut's
own names in the module (``x__op_terms__mutmut_1*``); mutmut matches names with fnmatch.
Its mutants not run stay "not checked", never killed; the report keeps, beside the totals,
each function's counts, and a later ``--only`` run replaces the functions it runs and keeps
the rest from the report before it (the same tests), so that the groups add up to the module.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import ROOT, scratch_copy  # noqa: E402

# module -> the test files that cover it (the default suite's, never the long or zoo ones)
COST = ["tests/test_costmodel.py", "tests/test_cost_terms.py", "tests/test_live_terms.py"]
MODULES: dict[str, list[str]] = {
    # a brute-force layout of each mesh's ranks; test_stage_tp's mesh tests import the
    # command line (meshplan/, not in the scratch tree), and the cost model's and the plans'
    # tests take half a minute to minutes a mutant on 2 shared cores
    "planner/schema/mesh.py": ["tests/test_mutant_kills_mesh.py"],
    # a plan of every record written by hand, and the shipped example plans; test_plan_file's
    # and test_mixed_stage_dp's plan models in module fixtures (3 minutes a mutant)
    "planner/schema/plan.py": ["tests/test_mutant_kills_plan.py"],
    # plans written by hand, one defect each: test_plan_file's and test_stage_tp's checks plan
    # gpt in a module fixture, half a minute a mutant
    "planner/schema/checks.py": ["tests/test_mutant_kills_pool_schema.py"],
    # the pool's tests but the command line's (it plans the MLP on each option, 80 s)
    "planner/resources/choose.py": [
        *(
            f"tests/test_resources.py::test_{name}"
            for name in (
                "node_counts_are_powers_of_two_and_the_availability",
                "choice_is_the_brute_force_optimum",
                "the_objectives_pick_different_options",
                "missed_deadline_names_the_nearest_option_and_what_it_needs",
                "missed_budget_says_how_much_more_money",
                "steps_budget_and_unfit_options",
                "pareto_front_is_the_non_dominated_set",
                "why_chosen_names_the_runner_up_and_every_other_kind",
            )
        ),
        "tests/test_console.py::test_a_mixed_option_of_one_kind_is_labelled_by_its_gpus_and_degrees",
        "tests/test_mutant_kills_pool_schema.py",
    ],
    # the pool files' tests but the command line's (the MLP planned per option)
    "planner/resources/pool.py": [
        *(
            f"tests/test_resources.py::test_{name}"
            for name in (
                "pool_defaults_idle_to_busy_and_gpus_per_node_to_the_profile",
                "bad_pool_is_one_user_error",
                "shipped_pools_load",
                "every_figure_of_the_shipped_pools_names_the_line_it_is_typed_on",
                "figure_lines_keep_nodes_top_level_keys_and_fabric_apart",
            )
        ),
        *(
            f"tests/test_mixed_pool.py::test_{name}"
            for name in ("fabric_reads_and_links_both_ways", "bad_fabric_is_a_one_line_error")
        ),
        "tests/test_mutant_kills_pool_schema.py",
    ],
    # the cost terms by hand; the MILP's brute-force seeds price no model, and the dense
    # dispatch test traces the DLRM (20 s a mutant)
    "planner/recsys/cost.py": [
        *(
            f"tests/test_recsys_solver.py::test_{name}"
            for name in (
                "table_wise_terms_by_hand",
                "cpu_offers_only_what_torchrec_runs_there",
                "host_option_pays_misses_at_the_host_link",
                "zipf_hit_rate_matches_the_generator",
                "all_to_all_across_nodes_runs_at_the_nic",
                "adam_state_is_priced_two_per_element",
                "zero3_dense_terms_by_hand",
                "the_dense_strategy_is_chosen_by_the_step_and_by_memory",
                "collective_latency_counts_torchrec_groups_by_hand",
            )
        ),
        "tests/test_mutant_kills_pool_schema.py",
    ],
    "planner/hardware/collectives.py": [
        "tests/test_collectives.py",
        "tests/test_mutant_kills.py",
        *COST,
    ],
    "planner/hardware/cluster.py": [
        "tests/test_collectives.py",
        "tests/test_profiles.py",
        "tests/test_mutant_kills.py",
        *COST,
    ],
    "planner/cost/eager_probe.py": ["tests/test_mutant_kills_eager_probe.py"],
    **{
        # test_moe's and test_long_context's solver tests (150 s each) are left out: every
        # mutant of a priced function would rerun them
        f"planner/cost/{name}.py": [*COST, "tests/test_mutant_kills.py"]
        for name in (
            "records",
            "pipeline",
            "optimizer",
            "step",
        )
    },
    # the roofline, rate, overhead and loss terms stated by hand (and the CP ring's closed form,
    # on a traced tiny llama); the cost model's traced-gpt tests reach every op's pricing and
    # take 33 s a mutant (480 mutants: hours on 2 shared cores), and the TP shares' test
    # (a sharding ILP over a traced llama layer) minutes a mutant in a forked child
    "planner/cost/compute.py": [
        *(
            f"tests/test_cost_terms.py::test_{name}"
            for name in (
                "roofline_takes_the_larger_of_compute_and_memory_time",
                "weight_bytes_do_not_grow_with_the_micro_batch",
                "a_fused_element_wise_chain_reads_its_input_once_and_writes_its_output_once",
                "a_vocab_parallel_loss_keeps_a_tp_share_of_the_logits",
                "the_loss_and_the_largest_op_share_one_slot",
            )
        ),
        "tests/test_costmodel.py::test_short_inner_dimensions_slow_a_gemm_down",
        "tests/test_costmodel.py::test_a_gathered_tp_module_pays_the_gather_overhead",
        *(
            f"tests/test_published.py::test_{name}"
            for name in (
                "causal_flash_attention_runs_half_the_work_at_its_own_rate",
                "the_chips_own_attention_kernel_runs_at_its_own_rate",
                "a_flash_attention_build_older_than_the_chip_runs_at_its_fitted_rate",
                "fp8_linears_run_at_the_fp8_rate_only_with_a_weight",
                "overlapped_tp_collectives_leave_only_the_excess",
                "a_16_bit_product_off_the_tensor_core_alignment_runs_at_its_own_rate",
            )
        ),
        "tests/test_long_context.py::test_context_parallel_option_is_the_closed_form",
        "tests/test_live_terms.py",
        "tests/test_mutant_kills_compute.py",
    ],
    # state_memory's reduce-width tests live beside the bf16 reduce (their gloo run is left out)
    "planner/cost/memory.py": [
        *COST,
        "tests/test_mutant_kills.py",
        "tests/test_mutant_kills_memory.py",
        "tests/test_half_reduce.py",
    ],
    "planner/cost/data_parallel.py": [
        *COST,
        "tests/test_mutant_kills.py",
        "tests/test_mutant_kills_data_parallel.py",
    ],
    # each option of a traced llama layer and moe block against the sum of its terms, and the
    # helpers' numbers by hand (1 s a mutant); the cost model's tests reach block_options
    # through traced gpt plans, 59 s a mutant in mutmut's timing run
    "planner/cost/block_options.py": ["tests/test_mutant_kills_block_options.py"],
    # the pins' filter and the stream's cuts on cases written by hand, price_options against
    # block_options block by block on the tiny MoE model (its variants solved once a session)
    "planner/search/options.py": ["tests/test_mutant_kills_search_options.py"],
    # the search space against a brute force, each no-layout message whole
    "planner/search/candidates.py": ["tests/test_mutant_kills_candidates.py"],
    # hand-drawn blocks: every strategy combination of a tiny MLP priced and solved pinned,
    # the optimum against brute force, each op kind's strategies by hand (test_sharding's and
    # test_tied_tp's ILPs over traced models take minutes a mutant); run by groups (--only);
    # the sequence-parallel form, templates and binding priced by hand on named layouts; the
    # strategies and the problem by hand, the free optimum against brute force
    "planner/cost/sharding.py": [
        "tests/test_mutant_kills_sharding.py",
        "tests/test_mutant_kills_sharding_problem.py",
        "tests/test_mutant_kills_sharding_rules.py",
    ],
    # a hand-drawn graph per case; test_sequence_stream's traced llama and gpt took 2 minutes
    # (CPU-limited) a mutant in mutmut's children
    "planner/trace/stream.py": ["tests/test_mutant_kills_stream.py"],
    # model files written by the test; the DLRM example's dispatch test takes 20 s a mutant
    "planner/recsys/tables.py": ["tests/test_mutant_kills_recsys_tables.py"],
    # one process (a stand-in stage), then two gloo ranks under torch's 1F1B (both launches of
    # m = 4: without the module and with it; m = 8 repeats them at twice the micro-batches)
    "runtime/pipeline_buffers.py": [
        "tests/test_mutant_kills_pipeline_buffers.py",
        "tests/test_pipeline_buffers.py::test_stage_holds_what_the_cost_model_prices[4]",
    ],
    # brute-force dominance over small integer coefficients, the tolerance by hand, and a
    # column layout summed by hand (test_solver_exact's cases solve MILPs: seconds a mutant)
    "planner/search/milp/dominance.py": ["tests/test_mutant_kills_milp_small.py"],
    "planner/search/milp/columns.py": ["tests/test_mutant_kills_milp_small.py"],
    # the sharding ILP's solutions kept on disk, in a cache folder of the test's own
    "planner/cost/variant_cache.py": ["tests/test_mutant_kills_variant_cache.py"],
    # the eager probe's recorder over a few meta-device ops (test_sharding's probes trace models)
    "planner/cost/reshapes.py": ["tests/test_mutant_kills_reshapes.py"],
    # the spread, range and lookup by hand (test_error_bars' last two plan a model)
    "planner/cost/error_bars.py": [
        *(
            f"tests/test_error_bars.py::test_{name}"
            for name in (
                "spread_is_the_10th_and_90th_percentile_between_order_statistics",
                "a_prediction_becomes_the_measured_steps_its_errors_allow",
                "layouts_group_by_their_parallel_form",
                "the_plans_cell_then_its_chip_then_every_run",
            )
        ),
        "tests/test_mutant_kills_error_bars.py",
    ],
    # (replaces the cost model's tests above) the facts a configuration implies, by hand at
    # each condition's edge; every priced test reaches them too, at seconds to a minute a mutant
    "planner/cost/records.py": ["tests/test_mutant_kills_records.py"],
    # each engine's fields by hand (test_export_pricing's price exported plans of traced models)
    "planner/cost/engines.py": ["tests/test_mutant_kills_engines.py"],
    # the profiles' own tests (loading, writing, every defect's field named); the cost model's
    # read the shipped profiles through it
    "planner/hardware/profiles.py": [
        "tests/test_profiles.py",
        "tests/test_mutant_kills_profiles.py",
    ],
    # the relaxation's matrix written out densely from its docstring, the default loss memory
    # by hand (test_solver_exact's and test_bounds' cases solve LPs and MILPs: seconds a mutant)
    "planner/search/milp/data.py": ["tests/test_mutant_kills_milp_lp.py"],
    "planner/search/milp/relaxation.py": ["tests/test_mutant_kills_milp_lp.py"],
    # HiGHS runs saved to and read from a folder of the test's own
    "planner/search/milp/runs.py": ["tests/test_mutant_kills_milp_runs.py"],
    # a dataclass of fields and no function: mutmut finds nothing to mutate
    "planner/search/memo.py": ["tests/test_mutant_kills_milp_lp.py"],
    # a hand-drawn fx graph of value checks, op records drawn by hand (the vision-language and
    # dropout tests trace models: tens of seconds a mutant)
    "planner/trace/value_checks.py": ["tests/test_mutant_kills_trace_small.py"],
    "planner/trace/randomness.py": ["tests/test_mutant_kills_trace_small.py"],
    # each product form's FLOPs by hand (test_cost_terms and test_long_context price traced
    # models: tens of seconds a mutant)
    "planner/trace/opcost.py": ["tests/test_mutant_kills_opcost.py"],
    # the tracer's modules (issue 53d): tiny model files traced or checked with no cache (the
    # session's trace cache is shared by mutmut's children, and a mutant reading a clean trace
    # would survive unseen)
    "planner/trace/loss_samples.py": ["tests/test_mutant_kills_loss_samples.py"],
    "planner/trace/graph.py": ["tests/test_mutant_kills_graph.py"],
    "planner/trace/blocks.py": ["tests/test_mutant_kills_blocks.py"],
    "planner/trace/repeats.py": ["tests/test_mutant_kills_repeats.py"],
    # one tiny model traced with no cache (trace_model, once a module), the hooks path and
    # the helpers on inputs stated by hand (test_trace's models read the session's cache)
    "planner/trace/export.py": ["tests/test_mutant_kills_export.py"],
    "planner/trace/cache.py": ["tests/test_mutant_kills_trace_cache.py"],
    # a run's cost worked by hand (test_resources' plan the MLP per option)
    "planner/resources/energy.py": ["tests/test_mutant_kills_energy.py"],
    # one process on a one-rank gloo group held in the test (save, latest, load), then the
    # worker's resume after step 2 (one gloo rank, two runs in one forked process)
    "runtime/checkpoint.py": [
        "tests/test_mutant_kills_checkpoint.py",
        "tests/test_resume_step.py",
    ],
    # one process each (gather: three gloo ranks forked from the test; stop: one short
    # interpreter for exit_worker)
    "runtime/batching.py": ["tests/test_mutant_kills_batching.py"],
    "runtime/stop.py": ["tests/test_mutant_kills_stop.py"],
    "runtime/optim.py": ["tests/test_mutant_kills_optim.py"],
    "runtime/gather.py": ["tests/test_mutant_kills_gather.py"],
    "runtime/metrics.py": ["tests/test_mutant_kills_metrics.py"],
    "runtime/local_attributes.py": [
        "tests/test_local_attributes.py",
        "tests/test_mutant_kills_local_attributes.py",
    ],
    "runtime/capability.py": ["tests/test_mutant_kills_capability.py"],
    # train_plan itself on a one-rank gloo group held in the test, against the oracle
    "runtime/train.py": ["tests/test_mutant_kills_train.py"],
    # each range's stage cost against scipy's LP, the bounds against every split enumerated
    # (test_split_bound's brute force over placements takes half a minute a mutant); its
    # stage-by-stage reference for the interleaved ascent
    "planner/search/milp/split_bound.py": [
        "tests/test_mutant_kills_split_bound.py",
        "tests/test_split_bound.py::test_rank_max_weighs_the_stages_as_stage_by_stage",
    ],
    # placements pinned in the model against the formulation priced by hand (test_solver_exact
    # compares whole plans with brute force: tens of seconds a mutant)
    "planner/search/milp/rows.py": ["tests/test_mutant_kills_milp_rows.py"],
    # every placement of a few small instances pinned in the model against evaluate's step
    # time and fit (test_solver_exact's brute force over 36 instances: minutes a mutant)
    "planner/search/milp/candidate.py": ["tests/test_mutant_kills_milp_candidate.py"],
    # small problems solved against every placement priced by hand, every status branch fed
    # HiGHS runs written by the test through the run store
    "planner/search/milp/solve.py": ["tests/test_mutant_kills_milp_solve.py"],
    # which process computed each answer, a failed or refused copy, cancel
    "planner/search/overlap.py": ["tests/test_mutant_kills_overlap.py"],
    # each key against every input it names, each kept value against computing it, the file
    "planner/search/bound_memo.py": ["tests/test_mutant_kills_bound_memo.py"],
    # the outer search over a four-block model priced by a stand-in, every candidate against
    # brute force over splits and options; the order, band, tie-break, passes and messages by
    # hand (test_search_certificates, test_sequence_stream and test_forked_search reach it by
    # tracing and planning whole models in module fixtures: not per-mutant material)
    "planner/search/driver.py": ["tests/test_mutant_kills_driver.py"],
    # the mixed pool's search: a two-stage placement's step worked by hand (test_mixed_milp's
    # brute force over every placement takes two minutes)
    "planner/search/mixed/cost.py": ["tests/test_mutant_kills_mixed_cost.py"],
    # the bounds against a brute force over splits and variants per stage, ranges priced in
    # closed form; the moves and floors by hand
    "planner/search/mixed/bound.py": ["tests/test_mutant_kills_mixed_bound.py"],
    # the MILP against a brute force over every placement of tiny problems whose every term
    # is live (test_mixed_milp's larger matrix takes two minutes)
    "planner/search/mixed/milp.py": ["tests/test_mutant_kills_mixed_milp.py"],
    # the helpers by hand or brute force, the search on the small MLP over two CPU kinds against
    # every cell solved and every box of units (test_mixed_stage_tp/_dp plan GPT: tens of s)
    "planner/search/mixed/search.py": ["tests/test_mutant_kills_mixed_search.py"],
    # one process: small modules whose ties are drawn in the test; tied_grads' all-gather,
    # new_group and all_reduce answered by a stand-in for a mesh of four ranks written out
    "runtime/tied.py": ["tests/test_mutant_kills_tied.py"],
    # one process: GroupBatchNorm against nn.BatchNorm over k stacked copies (a stand-in
    # all-reduce for k replicas of one micro-batch), and torch's all-reduce over one rank
    "runtime/batchnorm.py": ["tests/test_mutant_kills_batchnorm.py"],
    # one process: layouts rebuilt by hand, traced_pipeline on a model of two small layers
    # (test_model_outputs' and test_block_calls' split models: tens of seconds a mutant)
    "runtime/model_outputs.py": ["tests/test_mutant_kills_model_outputs.py"],
    # one process: a block checkpointed holding its shard against the block without a
    # checkpoint, on TP rank 1 of 2 with a stand-in all-gather (test_selective_runtime: gloo)
    "runtime/selective.py": ["tests/test_mutant_kills_selective.py"],
    # one process: each rank's messages on a heterogeneous mesh against peers worked out by
    # hand, torch's ops stood in (test_stage_tp trains such plans on gloo ranks)
    "runtime/uneven_tp.py": ["tests/test_mutant_kills_uneven_tp.py"],
    # one process: the calls of a small model counted by hand, a two-stage split whose
    # rebuilt call runs the eager block (test_block_calls splits a traced Llama: tens of s)
    "runtime/block_calls.py": ["tests/test_mutant_kills_block_calls.py"],
    # recommendation plans written by hand, each defect's whole message (test_recsys_cli's
    # plan the DLRM through the command line: tens of seconds a mutant)
    "planner/recsys/plan.py": ["tests/test_mutant_kills_recsys_plan.py"],
    # a two-table model file planned for real (a second each) and a summary worked by hand
    "planner/recsys/command.py": ["tests/test_mutant_kills_recsys_command.py"],
    # prices written by hand, and small model files planned against test_recsys_solver's brute
    # force (a second each)
    "planner/recsys/planning.py": ["tests/test_mutant_kills_recsys_planning.py"],
    # the placement helpers on shards by hand, the MILPs on tiny instances against
    # test_recsys_solver's brute force (its 36 seeds take a minute a mutant)
    "planner/recsys/milp.py": ["tests/test_mutant_kills_recsys_milp.py"],
    # one process on a one-rank gloo group (the refusals, ep 1 against the module's own
    # forward), then two forked gloo ranks at ep 2 against one process's module
    "runtime/expert_parallel.py": ["tests/test_mutant_kills_expert_parallel.py"],
    # one process: a ring of one rank against torch's own attention, every call form
    "runtime/context_parallel.py": ["tests/test_mutant_kills_context_parallel.py"],
    # one process: the refusals whole, the torchrun command, run_plan with subprocess.run
    # recording it (test_runtime_launch starts real workers: a minute a mutant)
    "runtime/launch.py": ["tests/test_mutant_kills_launch.py"],
    # one process: main on a one-rank gloo group made in the test, the plan, train_plan, the
    # stop watch and exit_worker recorded (test_worker_alone and the torchrun tests: minutes)
    "runtime/worker.py": ["tests/test_mutant_kills_worker.py"],
    # one process: build on a one-rank gloo group made in the test (the tiny MLP, ZeRO 0 and 3)
    # against the seeded model built in one process, the helpers with stand-in meshes; the
    # pipeline path (_build_pipeline) called directly, every step recorded, and for real as
    # each pipeline rank of the MLP's pp 2 plan in turn (build.py's rank stood in)
    "runtime/build.py": [
        "tests/test_mutant_kills_build.py",
        "tests/test_mutant_kills_build_pipeline.py",
    ],
    # one process on a one-rank CPU mesh against plain tensors, then four gloo ranks forked
    # from the test (TP 2, FSDP 2 x TP 2) against slices cut by hand (test_dtensor_blocks:
    # a child on the fake process group)
    "runtime/dtensor_blocks.py": ["tests/test_mutant_kills_dtensor_blocks.py"],
    # one process: the helpers directly, torch's styles on a one-rank CPU mesh against plain
    # tensors, the wrappers (fully_shard, replicate, DDP, checkpoints, parallelize_module)
    # recorded; two forked gloo ranks for TP 2, a sequence gather and a gradient sum against one
    # process (test_runtime_build and the torchrun tests: minutes a mutant)
    "runtime/parallelize.py": ["tests/test_mutant_kills_parallelize.py"],
    # plan.json's text, write and load, each defect's message, the counts filled per stage
    # (test_plan_file's checks plan models in module fixtures)
    "planner/schema/__init__.py": ["tests/test_mutant_kills_schema_io.py"],
    # the formats at each threshold, rows of options priced by hand, the figure read back from
    # matplotlib's objects (test_resources' figure test plans the MLP per option)
    "planner/resources/figure.py": ["tests/test_mutant_kills_figure.py"],
    # the pool's mixed side by hand, mixed_option around a stand-in for the mixed planner
    # (test_mixed_pool's command-line test plans GPT 1.3B over two kinds)
    "planner/resources/mixed_pool.py": [
        *(
            f"tests/test_mixed_pool.py::test_{name}"
            for name in (
                "fabric_reads_and_links_both_ways",
                "bad_fabric_is_a_one_line_error",
                "mixed_run_cost_is_the_per_kind_sum",
                "placement_rate_prices_a_step_second_of_each_objective_by_hand",
                "best_single_takes_each_kinds_least_step",
            )
        ),
        "tests/test_mutant_kills_mixed_pool.py",
    ],
    # the --resources path with the planner stood in (test_resources' and test_mixed_pool's
    # command-line tests plan the MLP or GPT per option: tens of seconds to minutes)
    "planner/resources/command.py": ["tests/test_mutant_kills_resources_command.py"],
    # the small MLP's mixed plan over two CPU kinds, each kind's step alone given (a fraction
    # of a second); test_mixed_plan plans GPT over them, each kind alone too (half a minute)
    "planner/resources/mixed_plan.py": ["tests/test_mutant_kills_mixed_plan.py"],
    # one process: train on a one-rank gloo group against one process's plain training, the
    # helpers by hand (test_recsys_oracle runs the same plans on two gloo ranks: minutes each);
    # two gloo ranks forked from the test process (10 CPU-s), which the survivors' rerun runs
    "runtime/recsys.py": [
        "tests/test_mutant_kills_recsys.py",
        "tests/test_mutant_kills_recsys_ranks.py",
    ],
    # one process: a four-layer model cut into three stages as a plan says (one trace a
    # module), each stage's modules, tensors and relayed values by hand, its forward and
    # backward against the model's; the graph helpers on fx graphs drawn by hand
    # (test_block_calls and test_model_outputs split traced Llama/CLIP-like models: tens of s)
    "runtime/stages.py": ["tests/test_mutant_kills_stages.py"],
}
# the shipped example models, planned for the equivalence check (file, size, GPUs, profile)
EXAMPLES = [
    ("examples/gpt.py", "tiny", 8, "h100-sxm"),
    ("examples/llama.py", "tiny", 4, "a100-80g"),
    ("examples/mixtral.py", "tiny", 8, "h100-sxm"),
    ("examples/moe.py", "tiny", 4, "h200"),
    ("examples/mlp.py", "tiny", 4, "cpu"),
    ("examples/resnet.py", "tiny", 2, "cpu"),
]
# one forked child at a time: the machine's 2 cores are shared with other work
MAX_CHILDREN = int(os.environ.get("MUTMUT_CHILDREN", "1"))
VOLATILE = re.compile(r'\s*"solve_time_s": [0-9.e+-]+,?\n')
PLAN_SCRIPT = """
import json, sys
from planner.api import plan
examples = json.loads(sys.argv[1])
plans = {f: plan(f, g, model_args={"size": s}, profile=p).plan.to_dict() for f, s, g, p in examples}
print(json.dumps(plans, indent=1, sort_keys=True, default=str))
"""


def markers(module: str) -> str:
    """The default suite's tests; a planner module's without the multi-process ones (a
    torchrun launch per mutant would take minutes each; they test the runtime)."""
    runtime = module.startswith("runtime/")
    return "not zoo and not long" + ("" if runtime else " and not distributed")


def mutmut_config(module: str, tests: list[str], timeout_multiplier: float) -> str:
    """The [tool.mutmut] table of one module's run (replacing the committed one)."""
    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["planner", "runtime"]\n'
        f"only_mutate = {json.dumps([module])}\n"
        # meshplan/ too: a test importing meshplan.cli (the command's tests) must collect
        'also_copy = ["tests", "examples", "profiles", "benchmarks", "meshplan",'
        ' "pyproject.toml"]\n'
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-p", "no:xdist", "-W", "ignore",'
        f' "-m", "{markers(module)}"]\n'
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
        f"timeout_multiplier = {timeout_multiplier}\n"
    )


def write_config(root: Path, module: str, tests: list[str], timeout_multiplier: float) -> None:
    text = (root / "pyproject.toml").read_text()
    text = re.sub(r"\n\[tool\.mutmut\]\n(?:[^\[].*\n|\n)*", "\n", text)
    (root / "pyproject.toml").write_text(text + mutmut_config(module, tests, timeout_multiplier))


def statuses(root: Path, module: str) -> dict[str, str]:
    """mutant name -> mutmut's status, from the .meta file mutmut writes beside the module."""
    from mutmut.stats import status_by_exit_code

    meta = json.loads((root / "mutants" / f"{module}.meta").read_text())
    return {k: status_by_exit_code[v] for k, v in meta["exit_code_by_key"].items()}


def only_globs(module: str, patterns: list[str]) -> list[str]:
    """mutmut's mutant-name globs for ``--only``: a function ``f`` is ``x_f__mutmut_*``, a
    method ``C.f`` is ``xǁCǁf__mutmut_*`` (either may be a glob: ``_op*``, ``_MilpTerms.*``),
    a pattern already in mutmut's form (``x_...``, ``xǁ...``) a glob within the module."""
    dotted = module[:-3].replace("/", ".")
    found = []
    for p in patterns:
        if p.startswith(("x_", "xǁ")):
            found.append(f"{dotted}.{p}")
        elif "." in p:
            cls, _, name = p.partition(".")
            found.append(f"{dotted}.xǁ{cls}ǁ{name}__mutmut_*")
        else:
            found.append(f"{dotted}.x_{p}__mutmut_*")
    return found


def function_of(mutant: str) -> str:
    """The function a mutant name mutates, as the source spells it (``evaluate``,
    ``_MilpTerms.coll``)."""
    name = mutant.rpartition("__mutmut_")[0].rpartition(".")[2]
    if name.startswith("xǁ"):
        cls, _, meth = name[2:].partition("ǁ")
        return f"{cls}.{meth}"
    return name[2:]


def by_function(found: dict[str, str]) -> dict[str, dict[str, int]]:
    """Each function's counts of mutmut's statuses."""
    table: dict[str, Counter] = {}
    for name, status in found.items():
        table.setdefault(function_of(name), Counter())[status] += 1
    return {f: dict(row) for f, row in sorted(table.items())}


def merge_groups(result: dict, previous: dict | None) -> dict:
    """``result`` of an ``--only`` run with the functions it did not run taken from the
    module's report before it (run against a subset of these tests): their counts,
    survivors and timeouts. Counts of the whole module are then summed over the functions."""
    ran = {f for f, row in result["by_function"].items() if set(row) != {"not checked"}}
    keep = {}
    # more tests can only kill more: earlier results stand when their tests are all still run
    earlier_tests = set(previous.get("tests", [])) if previous else set()
    if previous and earlier_tests <= set(result["tests"]) and "by_function" in previous:
        keep = {f: row for f, row in previous["by_function"].items() if f not in ran}
    table = {**result["by_function"], **keep}
    result["by_function"] = dict(sorted(table.items()))
    result["functions_from_earlier_runs"] = sorted(keep)
    earlier = previous if keep else {}
    result["survivors"] = {
        **{k: v for k, v in earlier.get("survivors", {}).items() if function_of(k) in keep},
        **{k: v for k, v in result["survivors"].items() if function_of(k) in ran},
    }
    result["timed_out"] = sorted(
        [k for k in earlier.get("timed_out", []) if function_of(k) in keep]
        + [k for k in result["timed_out"] if function_of(k) in ran]
    )
    counts = dict(sum((Counter(row) for row in table.values()), Counter()))
    result["counts"] = counts
    result["mutants"] = sum(counts.values())
    result["killed_share"] = killed_share(counts)
    return result


def killed_share(counts: dict[str, int]) -> float | None:
    """Killed and timed out over the decided (killed, timed out, survived): a mutant not run
    or reached by no test is in neither."""
    killed = counts.get("killed", 0) + counts.get("timeout", 0)
    decided = killed + counts.get("survived", 0)
    return round(killed / decided, 4) if decided else None


def mutmut(root: Path, env: dict, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "mutmut", *args], cwd=root, env=env, capture_output=True, text=True
    )
    return done.stdout + done.stderr


def example_plans(root: Path, env: dict, mutant: str) -> str:
    """The examples' plans as JSON text (planning time dropped), with ``mutant`` active."""
    mutants = root / "mutants"
    run_env = {**env, "PYTHONPATH": str(mutants), "MUTANT_UNDER_TEST": mutant}
    done = subprocess.run(
        [sys.executable, "-c", PLAN_SCRIPT, json.dumps(EXAMPLES)],
        cwd=mutants,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if done.returncode != 0:
        return f"planning failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
    return VOLATILE.sub("\n", done.stdout)


def in_subprocesses(root: Path, env: dict, module: str, tests: list[str], names: list[str]) -> dict:
    """Each of ``names`` run against ``tests`` in a pytest of its own, stopping at the first
    failure: mutant name -> status. The runtime's tests reach its modules inside torchrun's
    workers, where mutmut's in-process record of the functions each test reaches sees nothing,
    so mutmut counts such a mutant reached by no test (or runs it against the one-process tests
    only). Here MUTANT_UNDER_TEST names the mutant, and the workers inherit it and import the
    mutated tree (runtime.launch.worker_env puts its root first). A clean run must pass, and
    mutmut's forced failure (``fail``) must fail each test file on its own first (the gloo
    test's only through its workers); the limit is wall time (the workers' CPU is not the
    child's): 4 times the clean run's, plus 2 minutes."""
    mutants = root / "mutants"
    run_env = {**env, "PYTHONPATH": str(mutants)}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    cmd += ["-W", "ignore", "-m", markers(module)]

    def run(name: str, limit: float | None, selection: list[str] = tests) -> str:
        proc = subprocess.Popen(
            [*cmd, *selection], cwd=mutants, env={**run_env, "MUTANT_UNDER_TEST": name},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the pytest and the torchrun workers it started
            proc.wait()
            return "timeout"
        return {0: "survived", 1: "killed"}.get(rc, f"exit {rc}")

    start = time.perf_counter()
    if run("", None) != "survived":
        raise SystemExit(f"{module}: the clean run of {tests} fails")
    limit = 4 * (time.perf_counter() - start) + 120
    for test in tests:  # each file on its own, so a one-process test cannot hide the workers
        if run("fail", limit, [test]) != "killed":
            raise SystemExit(f"{module}: mutmut's forced failure passes {test}")
    return {name: run(name, limit) for name in names}


def run_module(
    module: str,
    tests: list[str],
    rerun_timeouts: bool = False,
    example_check: bool = True,
    only: list[str] | None = None,
) -> dict:
    root = scratch_copy()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MUTANT_UNDER_TEST")}
    env["OMP_NUM_THREADS"] = "1"  # forked children: no OpenMP pool inherited mid-flight
    env["MESHPLAN_TEST_CACHE"] = str(root / ".mutant-cache")
    start = time.perf_counter()
    write_config(root, module, tests, 15.0)
    names = only_globs(module, only) if only else []
    log = mutmut(root, env, "run", "--max-children", str(MAX_CHILDREN), *names)
    if "nothing matches" in log:
        raise SystemExit(f"{module}: no mutant matches --only {' '.join(only or [])}")
    found = statuses(root, module)
    rerun = [
        k
        for k, s in found.items()
        if s in ("survived", "no tests", "not checked")
        and (not names or any(fnmatch.fnmatchcase(k, g) for g in names))
    ]  # with --only, the other functions' mutants stay not run (their earlier counts kept)
    if module.startswith("runtime/") and rerun:
        found.update(in_subprocesses(root, env, module, tests, rerun))
    timeouts = [k for k, s in found.items() if s == "timeout"]
    if timeouts and rerun_timeouts:  # once more, four times the limit
        write_config(root, module, tests, 60.0)
        log += mutmut(root, env, "run", "--max-children", str(MAX_CHILDREN), *timeouts)
        found = statuses(root, module)
    survivors = {}
    check = example_check and "survived" in found.values()
    clean = example_plans(root, env, "") if check else ""
    for name in sorted(k for k, s in found.items() if s == "survived"):
        diff = mutmut(root, env, "show", name)
        changed = [
            ln for ln in diff.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")
        ]
        survivors[name] = {"change": changed, "equivalent_on_examples": None}
        if check:  # None: not checked (each survivor plans the six examples twice over)
            plans = example_plans(root, env, name)
            equivalent = plans == clean and not clean.startswith("planning failed")
            survivors[name]["equivalent_on_examples"] = equivalent
    counts = dict(Counter(found.values()))
    return {
        "module": module,
        "tests": tests,
        "only": only or [],
        "mutants": len(found),
        "counts": counts,
        "killed_share": killed_share(counts),
        "by_function": by_function(found),
        "survivors": survivors,
        # by name, so each can be judged (a real hang, or a limit another test's fixture tripped)
        "timed_out": sorted(k for k, s in found.items() if s == "timeout"),
        "seconds": round(time.perf_counter() - start),
        "log_tail": log[-1500:],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modules", nargs="*", help="modules to mutate (default: every one below)")
    ap.add_argument("--tests", nargs="+", help="test files to run (default: the module's own)")
    ap.add_argument(
        "--no-example-check",
        action="store_true",
        help="list survivors without planning the examples with each (judge them by hand)",
    )
    ap.add_argument(
        "--only",
        nargs="+",
        metavar="PATTERN",
        help="run only these functions' mutants (a name, Class.method, or a glob over mutmut's"
        " names); the rest stay 'not checked', their counts kept from the last report",
    )
    ap.add_argument("--list", action="store_true", help="print the configured modules and tests")
    ap.add_argument(
        "--rerun-timeouts", action="store_true", help="run timed-out mutants again at 4x the limit"
    )
    args = ap.parse_args()
    if args.list:
        for module, tests in MODULES.items():
            print(f"{module}: {' '.join(tests)}")
        return 0
    for module in args.modules or list(MODULES):
        tests = args.tests or MODULES.get(module)
        if not tests:
            ap.error(f"{module}: no tests configured; give --tests")
        result = run_module(
            module, tests, args.rerun_timeouts, not args.no_example_check, args.only
        )
        out = ROOT / "reports" / "mutation" / (module.replace("/", ".")[:-3] + ".json")
        out.parent.mkdir(parents=True, exist_ok=True)
        if args.only:
            previous = json.loads(out.read_text()) if out.exists() else None
            result = merge_groups(result, previous)
        out.write_text(json.dumps(result, indent=1) + "\n")
        c = result["counts"]
        print(
            f"{module}: {result['mutants']} mutants, {c.get('killed', 0)} killed, "
            f"{c.get('timeout', 0)} timed out, {c.get('survived', 0)} survived, "
            f"{c.get('not checked', 0)} not run "
            f"({len([s for s in result['survivors'].values() if s['equivalent_on_examples']])} "
            f"equivalent on the examples), {c.get('no tests', 0)} reached by no test; "
            f"{result['seconds']} s; written {out}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
