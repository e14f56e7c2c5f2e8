"""Tests written for mutmut's generated mutants of runtime/metrics.py (each step's peak memory
and metrics.jsonl; benchmarks/generated_mutants.py). One process: the CPU peak against the
kernel's own high-water mark (/proc/self/status), CUDA's counters through stand-ins (no GPU
here), the metrics file's lines written out by hand. docs/mutation.md names the mutants each
test kills."""

from __future__ import annotations

import json
import resource
import sys

import pytest
import torch

from runtime.metrics import (
    append_metrics,
    format_step,
    peak_memory_bytes,
    peak_reserved_bytes,
    start_metrics,
)


def _high_water_bytes() -> int:
    """The kernel's peak resident set of this process (VmHWM, in kB)."""
    with open("/proc/self/status") as f:
        line = next(ln for ln in f if ln.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/status")
def test_the_cpu_peak_is_the_processs_high_water_mark_in_bytes():
    """getrusage's ru_maxrss is in kB on Linux (bytes on macOS); the kernel's VmHWM agrees
    within a few hundred kB (what the two count differs slightly)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    got = peak_memory_bytes(torch.device("cpu"))
    assert before <= got <= resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert abs(got - _high_water_bytes()) <= 0.02 * got and type(got) is int


def test_on_macos_the_peak_is_already_in_bytes(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert before <= peak_memory_bytes(torch.device("cpu")) <= 1.5 * before
    assert peak_reserved_bytes(torch.device("cpu")) == 0


def test_a_gpus_peaks_are_cudas_counters_of_that_device(monkeypatch):
    asked = []
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: asked.append(d) or 7.0)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d: asked.append(d) or 9.0)
    gpu = torch.device("cuda", 1)
    allocated, reserved = peak_memory_bytes(gpu), peak_reserved_bytes(gpu)
    assert (allocated, reserved) == (7, 9) and type(allocated) is int and type(reserved) is int
    assert asked == [gpu, gpu]


def test_a_fresh_run_starts_an_empty_file_where_its_directory_is_missing(tmp_path):
    path = tmp_path / "runs" / "run" / "metrics.jsonl"
    start_metrics(path, 0)
    assert path.read_text() == ""
    path.write_text('{"step": 1}\n{"note": "no step"}\n')
    start_metrics(path, 0)  # not a resume: the old lines go, one without a step too
    assert path.read_text() == ""


def test_a_resume_keeps_the_lines_up_to_the_checkpoints_step(tmp_path):
    """Steps 1-4 were written before the restart, checkpoint at 2: lines of steps 1 and 2
    stay (and a line without a step), 3 and 4 go, as does a half-written line (the lines
    after it still read); the steps trained again append after them. A checkpoint at step 1
    keeps step 1's."""
    path = tmp_path / "metrics.jsonl"
    lines = ['{"step": 1, "loss": 2.0}', '{"note": "x"}', '{"step": 2', '{"step": 2, "loss": 1.5}',
             '{"step": 3, "loss": 1.0}', '{"step": 4, "loss": 0.5}']  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    start_metrics(path, 2)
    assert path.read_text() == "\n".join(lines[:2] + lines[3:4]) + "\n"
    append_metrics(path, {"step": 3, "loss": 0.25})
    append_metrics(path, {"step": 4, "loss": 0.125})
    assert [json.loads(ln) for ln in path.read_text().splitlines()][2:] == [
        {"step": 2, "loss": 1.5},
        {"step": 3, "loss": 0.25},
        {"step": 4, "loss": 0.125},
    ]
    start_metrics(path, 1)  # a checkpoint at step 1
    assert path.read_text() == "\n".join(lines[:2]) + "\n"
    start_metrics(tmp_path / "none.jsonl", 2)  # a resume without the file: an empty one
    assert (tmp_path / "none.jsonl").read_text() == ""


def test_a_step_line_says_the_rate_and_the_highest_ranks_peak():
    record = {"step": 7, "loss": 0.1234567, "step_time_s": 1.23456, "tokens_per_s": 12345.6,
              "peak_memory_bytes": [3 * 2**20, 5 * 2**20 + 2**19]}  # fmt: skip
    assert format_step(record, 120) == (
        "step   7/120  loss 0.123457  1.235 s  12,346 tokens/s  peak 6 MiB (max over ranks)"
    )
    record = {"step": 12, "loss": 2.0, "step_time_s": 0.5, "samples_per_s": 1234.56,
              "peak_memory_bytes": [2**30]}  # fmt: skip
    assert format_step(record, 12) == (
        "step 12/12  loss 2.000000  0.500 s  1,234.6 samples/s  peak 1,024 MiB (max over ranks)"
    )
