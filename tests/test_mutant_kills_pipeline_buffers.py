"""Tests written for mutmut's generated mutants of runtime/pipeline_buffers.py (receive buffers
allocated when their receive is posted, dropped after the micro-batch's backward;
benchmarks/generated_mutants.py). One process, no process group: a stand-in stage with
torch's stage attributes (per-micro-batch receive infos, first/last/backward flags, the three
methods the module wraps), whose methods record what they were called with and which buffers
were real then. tests/test_pipeline_buffers.py counts the same on two gloo ranks under torch's
1F1B schedule; docs/mutation.md names the mutants each test here kills."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from runtime.pipeline_buffers import release_consumed_buffers


def _info(shape=(2, 3), dtype=torch.float32, device="meta", root=False):
    """A receive info as torch writes it (buffer, is_root_arg)."""
    return SimpleNamespace(buffer=torch.zeros(shape, dtype=dtype, device=device), is_root_arg=root)


class Stage:
    """torch's PipelineStage as the module sees it; each method records its call and whether
    each receive buffer was real (not meta) when it ran."""

    def __init__(self, m=2, first=False, last=False, backward=True):
        self.device = torch.device("cpu")
        self.is_first, self.is_last, self.has_backward = first, last, backward
        self.args_recv_info = {k: (_info(),) for k in range(m)}
        self.grad_recv_info = {k: (_info((2, 3), torch.float16),) for k in range(m)}
        self.calls = []

    def real(self):
        return {
            "args": [not i.buffer.is_meta for k in sorted(self.args_recv_info)
                     for i in self.args_recv_info[k] if getattr(i, "buffer", None) is not None],
            "grad": [not i.buffer.is_meta for k in sorted(self.grad_recv_info)
                     for i in self.grad_recv_info[k] if getattr(i, "buffer", None) is not None],
        }  # fmt: skip

    def get_fwd_recv_ops(self, chunk):
        self.calls.append(("fwd", chunk, self.real()))
        return ["fwd-op", chunk]

    def get_bwd_recv_ops(self, chunk):
        self.calls.append(("bwd-recv", chunk, self.real()))
        return ["bwd-op", chunk]

    def backward_one_chunk(self, chunk, *args, **kwargs):
        self.calls.append(("backward", chunk, args, kwargs, self.real()))
        return "grads", chunk


def test_a_step_starts_with_every_buffer_dropped_and_allocates_each_receive_when_posted():
    """Chunk 0's forward receive drops every buffer left from the last step (both micro-batches'
    activations, both gradients) and allocates only chunk 0's activation, in its shape and
    dtype on the stage's device; chunk 1's allocates its own and drops nothing."""
    stage = Stage()
    stage.args_recv_info[1] = (_info(device="cpu"),)
    stage.grad_recv_info[0] = (_info((2, 3), torch.float16, device="cpu"),)
    assert release_consumed_buffers(stage) is stage
    assert stage.get_fwd_recv_ops(0) == ["fwd-op", 0]
    assert stage.calls[-1] == ("fwd", 0, {"args": [True, False], "grad": [False, False]})
    buf = stage.args_recv_info[0][0].buffer
    assert (buf.shape, buf.dtype, buf.device.type) == ((2, 3), torch.float32, "cpu")
    dropped = stage.grad_recv_info[0][0].buffer
    assert (dropped.shape, dropped.dtype, dropped.device.type) == ((2, 3), torch.float16, "meta")
    assert stage.get_fwd_recv_ops(1) == ["fwd-op", 1]
    assert stage.calls[-1] == ("fwd", 1, {"args": [True, True], "grad": [False, False]})


def test_a_gradient_buffer_is_allocated_for_its_receive_only_where_one_comes():
    """A middle stage receives its output's gradient: chunk 1's buffer is allocated (fp16, as
    its placeholder), chunk 0's not. The last stage receives none, nor does a stage without
    backward: nothing allocated, and the class's method still asked."""
    stage = release_consumed_buffers(Stage())
    assert stage.get_bwd_recv_ops(1) == ["bwd-op", 1]
    assert stage.calls[-1] == ("bwd-recv", 1, {"args": [False, False], "grad": [False, True]})
    assert stage.grad_recv_info[1][0].buffer.dtype == torch.float16
    for kwargs in ({"last": True}, {"backward": False}):
        stage = release_consumed_buffers(Stage(**kwargs))
        assert stage.get_bwd_recv_ops(0) == ["bwd-op", 0]
        assert stage.calls[-1] == ("bwd-recv", 0, {"args": [False, False], "grad": [False, False]})


def test_a_micro_batchs_buffers_are_dropped_after_its_backward_and_not_before():
    """After chunk 0's backward (its arguments passed through) a middle stage drops chunk 0's
    activation and gradient and keeps chunk 1's; the first stage receives no activation, so
    its (model input) buffers stay."""
    stage = release_consumed_buffers(Stage())
    for k in (0, 1):
        stage.get_fwd_recv_ops(k)
        stage.get_bwd_recv_ops(k)
    out = stage.backward_one_chunk(0, "loss", full_backward=True)
    assert out == ("grads", 0)
    assert stage.calls[-1] == (
        "backward", 0, ("loss",), {"full_backward": True},
        {"args": [True, True], "grad": [True, True]},
    )  # fmt: skip
    assert stage.real() == {"args": [False, True], "grad": [False, True]}
    first = Stage(first=True)
    for infos in first.args_recv_info.values():
        infos[0].buffer = torch.zeros(2, 3)
    first = release_consumed_buffers(first)
    first.get_bwd_recv_ops(0)
    first.get_bwd_recv_ops(1)
    first.backward_one_chunk(0)
    assert first.real() == {"args": [True, True], "grad": [False, True]}


def test_a_stage_without_gradient_receives_drops_nothing_it_lacks():
    """The last stage has no gradient infos ({}), or none for this chunk: its backward still
    drops its received activation."""
    for grads in ({}, {1: (_info(device="cpu"),)}):
        stage = Stage(last=True)
        stage.grad_recv_info = grads
        release_consumed_buffers(stage)
        stage.get_fwd_recv_ops(0)
        stage.args_recv_info[1][0].buffer = torch.zeros(2, 3)
        stage.backward_one_chunk(0)
        assert stage.real()["args"] == [False, True]


def test_root_arguments_and_infos_without_buffers_are_left_alone():
    """A root argument's buffer (the model's own input) is neither allocated nor dropped; an
    info without a buffer (torch's older root-argument placeholder) or without the
    is_root_arg attribute (its older receive info) is read as none / as a receive."""
    stage = Stage()
    root_meta, root_real = _info(root=True), _info(device="cpu", root=True)
    older = SimpleNamespace(buffer=torch.zeros(4, device="meta"))
    stage.args_recv_info[0] = (root_meta, SimpleNamespace(), older)
    stage.args_recv_info[1] = (root_real, SimpleNamespace(buffer=None))
    release_consumed_buffers(stage)
    stage.get_fwd_recv_ops(0)
    assert root_meta.buffer.is_meta and root_real.buffer.device.type == "cpu"
    assert older.buffer.device.type == "cpu" and older.buffer.shape == (4,)
    stage.get_bwd_recv_ops(0)
    stage.backward_one_chunk(0)
    assert root_meta.buffer.is_meta and older.buffer.is_meta
    stage.get_fwd_recv_ops(1)
    stage.get_bwd_recv_ops(1)
    stage.backward_one_chunk(1)
    assert root_real.buffer.device.type == "cpu"


def test_the_wrappers_route_through_the_stages_class_at_each_call():
    """A stage whose class changes after wrapping (runtime.uneven_tp) has the new class's
    methods called, with the wrapped bookkeeping kept."""
    stage = release_consumed_buffers(Stage())

    class Rerouted(Stage):
        def get_fwd_recv_ops(self, chunk):
            return ["rerouted-fwd", chunk]

        def get_bwd_recv_ops(self, chunk):
            return ["rerouted-bwd", chunk]

        def backward_one_chunk(self, chunk, *args, **kwargs):
            return "rerouted", chunk, args, kwargs

    stage.__class__ = Rerouted
    assert stage.get_fwd_recv_ops(1) == ["rerouted-fwd", 1]
    assert stage.real()["args"] == [False, True]
    assert stage.get_bwd_recv_ops(1) == ["rerouted-bwd", 1]
    assert stage.backward_one_chunk(1, 7, x=8) == ("rerouted", 1, (7,), {"x": 8})
    assert stage.real() == {"args": [False, False], "grad": [False, False]}


def test_buffers_are_allocated_on_the_stages_device_not_the_default_one():
    """A GPU stage's buffers go on its GPU whatever torch's default device (the CPU there).
    Here the other way round: the default device is meta and the stage's the CPU, and both
    receives get real CPU buffers."""
    stage = release_consumed_buffers(Stage())
    with torch.device("meta"):
        stage.get_fwd_recv_ops(0)
        stage.get_bwd_recv_ops(0)
    assert stage.args_recv_info[0][0].buffer.device.type == "cpu"
    assert stage.grad_recv_info[0][0].buffer.device.type == "cpu"
