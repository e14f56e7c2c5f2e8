"""Run under torchrun with PLAN=<a sequence-parallel plan>: one forward and backward, printing how
many DTensor redistributions backward made with the runtime's re-gather on and with it off
(each gathering module, an sp_gather one or a Linear on flattened tokens, gathers its input
again in backward instead of keeping it)."""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

import runtime.parallelize as parallelize
from planner.modelfile import load_model_file
from planner.schema import Plan, load_plan
from runtime.build import build


def backward_redistributions(plan: Plan, regather: bool) -> int:
    original = parallelize.gather_sequence
    if not regather:
        parallelize.gather_sequence = lambda m, regather_in_backward=False: original(m, False)
    try:
        mf = load_model_file(plan.model.file, plan.model.args)
        model = build(plan, mf, torch.device("cpu"), 0).parts[0]
    finally:
        parallelize.gather_sequence = original
    x, y = mf.batch(plan.micro_batch_size, step=1)
    loss = mf.loss(model(*x), y)
    calls = [0]
    redistribute = DTensor.redistribute

    def counting(self, *args, **kwargs):
        calls[0] += 1
        return redistribute(self, *args, **kwargs)

    DTensor.redistribute = counting
    try:
        loss.backward()
    finally:
        DTensor.redistribute = redistribute
    return calls[0]


def main() -> None:
    dist.init_process_group("gloo")
    plan = load_plan(os.environ["PLAN"])
    on, off = backward_redistributions(plan, True), backward_redistributions(plan, False)
    # the modules that gather their input: "sp_gather"'s, and a Linear on flattened tokens
    modules = sum(
        sum(s in ("sp_gather", "colwise_sp_tokens") for s in b.tp_plan.values())
        for b in plan.blocks
    )
    if dist.get_rank() == 0:
        print(json.dumps({"regather": on, "keep": off, "gathering_modules": modules}), flush=True)
    dist.barrier()
    # Leave without C++ teardown: gloo's threads can abort a process on its way out after DTensor
    # work (seen once here: "terminate called without an active exception"), which would fail
    # the test for nothing it checks.
    os._exit(0)


if __name__ == "__main__":
    main()
