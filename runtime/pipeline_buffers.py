"""Pipeline receive buffers held only while they are in use.

torch.distributed.pipelining's stage allocates, for each of a step's m micro-batches, a buffer
for the activation it receives (``args_recv_info[mb]``) and one for the gradient of its output
(``grad_recv_info[mb]``), and keeps all 2m across steps; each received activation also keeps
its input gradient (``.grad``) until the next step clears it. At Llama 3 405B's layout
(m = 32, a 256 MiB activation per micro-batch) that is 16 GiB a middle rank holds beyond its
in-flight activations. Megatron-Core allocates each buffer when it receives and frees it once
consumed. ``release_consumed_buffers`` does the same to a built stage: a buffer is allocated
when its receive is posted and dropped after that micro-batch's backward, so a stage holds the
received activations of its in-flight micro-batches (which its first block saves anyway), one
output gradient being received, and the input gradient being sent."""

from __future__ import annotations

from typing import Any

import torch


def _allocate(infos: tuple, device: torch.device) -> None:
    """Real buffers, in the shape and dtype of their placeholders, for receives to write."""
    for info in infos:
        buf = getattr(info, "buffer", None)
        if not getattr(info, "is_root_arg", False) and buf is not None and buf.is_meta:
            info.buffer = torch.empty(buf.shape, dtype=buf.dtype, device=device)


def _drop(infos: tuple) -> None:
    """Each buffer swapped for a meta placeholder of its shape: its storage (and its
    gradient) freed once nothing else holds them."""
    for info in infos:
        buf = getattr(info, "buffer", None)
        if not getattr(info, "is_root_arg", False) and buf is not None and not buf.is_meta:
            info.buffer = torch.empty(buf.shape, dtype=buf.dtype, device="meta")


def release_consumed_buffers(stage: Any) -> Any:
    """``stage`` (a torch PipelineStage) with its per-micro-batch receive buffers allocated when
    their receive is posted and freed after the micro-batch's backward (see the module's
    docstring). Returns the stage."""
    device = stage.device

    # the class's own methods, looked up at each call: a stage whose class changes later
    # (runtime.uneven_tp.uneven_stage) keeps its routing under these wrappers
    def fwd_recv(chunk: int) -> list:
        return type(stage).get_fwd_recv_ops(stage, chunk)

    def bwd_recv(chunk: int) -> list:
        return type(stage).get_bwd_recv_ops(stage, chunk)

    def backward(chunk: int, *args: Any, **kwargs: Any) -> Any:
        return type(stage).backward_one_chunk(stage, chunk, *args, **kwargs)

    def get_fwd_recv_ops(fwd_chunk_id: int) -> list:
        if fwd_chunk_id == 0:  # a step begins: none is in use (the first step's, made at once)
            for infos in (*stage.args_recv_info.values(), *stage.grad_recv_info.values()):
                _drop(infos)
        _allocate(stage.args_recv_info[fwd_chunk_id], device)
        return fwd_recv(fwd_chunk_id)

    def get_bwd_recv_ops(bwd_chunk_id: int) -> list:
        if stage.has_backward and not stage.is_last:
            _allocate(stage.grad_recv_info[bwd_chunk_id], device)
        return bwd_recv(bwd_chunk_id)

    def backward_one_chunk(bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        out = backward(bwd_chunk_id, *args, **kwargs)
        if not stage.is_first:
            _drop(stage.args_recv_info[bwd_chunk_id])
        if stage.grad_recv_info:
            _drop(stage.grad_recv_info.get(bwd_chunk_id, ()))
        return out

    stage.get_fwd_recv_ops = get_fwd_recv_ops
    stage.get_bwd_recv_ops = get_bwd_recv_ops
    stage.backward_one_chunk = backward_one_chunk
    return stage
