"""Tests written for mutmut's generated mutants of planner/hardware/profiles.py (benchmarks/
generated_mutants.py): every defect a profile can have, its whole one-line message compared
(test_profiles checks the words that name the field); the written file's lines and numbers;
and the default profile's reason for each local GPU. docs/mutation.md names the mutants each
test kills."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from planner.errors import UserInputError
from planner.hardware import profiles
from planner.hardware.profiles import (
    default_profile_name,
    list_profiles,
    load_profile,
    profile_from_dict,
    profile_to_dict,
    profile_to_toml,
    profiles_dir,
    read_toml,
    write_profile,
)

CPU = profile_to_dict(load_profile("cpu"))
NAMES = ", ".join(list_profiles())


def _data(**changes) -> dict:
    """The CPU profile's mapping with (section, key) -> value changes; None deletes."""
    data = copy.deepcopy(CPU)
    del data["source"]
    for where, value in changes.items():
        section, _, key = where.partition("__")
        table = data if not key else data[section]
        key = key or section
        if value is None:
            del table[key]
        else:
            table[key] = value
    return data


def _message(data: dict) -> str:
    with pytest.raises(UserInputError) as err:
        profile_from_dict(data, "p.toml")
    return str(err.value)


P = "profile p.toml: "
NAME = P + 'top-level name must be a non-empty string, e.g. name = "..."; add it'
SHARE = "must be a fraction in [0, 1] (share of compute comm can hide behind)"
DEFECTS = [
    (dict(name=None), NAME),
    (dict(name="  "), NAME),
    (dict(name=3), NAME),
    (dict(description=None),
     P + 'top-level description must be a string, e.g. description = "..."; add it'),
    (dict(device="tpu"),
     P + "top-level device = 'tpu' must be one of 'gpu', 'cpu' (where the ranks compute); "
     "fix it or leave it out"),
    (dict(compute=[1]), P + "[compute] must be a table of numbers"),
    (dict(network=3), P + "[network] must be a table of numbers"),
    (dict(memory__zz_key=1, memory__a_key=2),
     P + "unknown key [memory] a_key: the keys of [memory] are allocator_overhead, "
     "bandwidth_bytes_per_s, capacity_bytes, reserved_bytes"),
    (dict(network__inter_node_latency_s=None),
     "profile p.toml lacks [network] inter_node_latency_s (seconds): add it; "
     f"see {profiles_dir() / 'h100-sxm.toml'} for the format"),
    (dict(compute__peak_flops_fp16="fast"),
     P + "[compute] peak_flops_fp16 = 'fast' must be a positive finite number (FLOP/s)"),
    (dict(node__gpus_per_node=True),
     P + "[node] gpus_per_node = True must be a positive integer (devices)"),
    (dict(network__collective_efficiency=1.5),
     P + "[network] collective_efficiency = 1.5 must be a fraction in (0, 1] (share of link)"),
    (dict(network__collective_efficiency=0),
     P + "[network] collective_efficiency = 0 must be a fraction in (0, 1] (share of link)"),
    (dict(network__comm_overlap=1.01), P + f"[network] comm_overlap = 1.01 {SHARE}"),
    (dict(network__comm_overlap=-0.01), P + f"[network] comm_overlap = -0.01 {SHARE}"),
    (dict(memory__reserved_bytes=-1),
     P + "[memory] reserved_bytes = -1 must be a finite number >= 0 (bytes)"),
    (dict(memory__capacity_bytes=0),
     P + "[memory] capacity_bytes = 0 must be a positive finite number (bytes)"),
    (dict(memory__capacity_bytes=float("inf")),
     P + "[memory] capacity_bytes = inf must be a positive finite number (bytes)"),
    (dict(memory__capacity_bytes=float("nan")),
     P + "[memory] capacity_bytes = nan must be a positive finite number (bytes)"),
    (dict(node__gpus_per_node=0),
     P + "[node] gpus_per_node = 0 must be a positive integer (devices)"),
    (dict(node__gpus_per_node=2.5),
     P + "[node] gpus_per_node = 2.5 must be a positive integer (devices)"),
    (dict(compute__peak_flops_fp8=-1.0),
     P + "[compute] peak_flops_fp8 = -1.0 must be a finite number >= 0 (FLOP/s)"),
]  # fmt: skip


@pytest.mark.parametrize("changes, message", DEFECTS, ids=[m[16:60] for _, m in DEFECTS])
def test_each_defect_is_one_whole_line(changes, message):
    assert _message(_data(**changes)) == message


@pytest.mark.parametrize(
    "section, first",
    [
        ("compute", "peak_flops_fp32 (FLOP/s)"),
        ("network", "intra_node_bandwidth_bytes_per_s (bytes/s)"),
    ],
)
def test_a_missing_section_lacks_its_first_key(section, first):
    assert _message(_data(**{section: None})) == (
        f"profile p.toml lacks [{section}] {first}: add it; "
        f"see {profiles_dir() / 'h100-sxm.toml'} for the format"
    )


def test_any_positive_rate_is_an_entry():
    assert profile_from_dict(_data(compute__peak_flops_fp8=0.5), "p").peak_flops["fp8"] == 0.5


def test_edges_that_are_fine():
    """A fraction of exactly 1 or 0 where allowed, 0 where >= 0, an int gpus_per_node given as
    2.0, optional keys left out (their defaults), a device left out (gpu)."""
    fine = _data(
        network__collective_efficiency=1, network__comm_overlap=0, memory__reserved_bytes=0,
        node__gpus_per_node=2.0, compute__peak_flops_fp8=None, network__async_tp_overlap=None,
        compute__fp8_matmul_efficiency=None, network__collective_sync_s=None, device=None,
        memory__allocator_overhead=None, compute__tp_gather_overhead_s=None,
    )  # fmt: skip
    p = profile_from_dict(fine, "p.toml")
    assert (p.collective_efficiency, p.comm_overlap, p.reserved_bytes) == (1.0, 0.0, 0.0)
    assert p.gpus_per_node == 2 and type(p.gpus_per_node) is int
    assert "fp8" not in p.peak_flops and p.fp8_matmul_efficiency == 1.0
    assert (p.async_tp_overlap, p.collective_sync, p.allocator_overhead) == (1.0, 0.0, 0.0)
    assert p.device == "gpu" and p.source == "p.toml"
    assert p.tp_gather_overhead == CPU["compute"]["tp_module_overhead_s"]  # stands in
    fp8 = profile_from_dict(_data(compute__peak_flops_fp8=2e15), "p")
    assert (
        fp8.peak_flops["fp8"] == 2e15
        and fp8.peak_flops["bf16"] == CPU["compute"]["peak_flops_bf16"]
    )
    assert profile_to_dict(fp8)["compute"]["peak_flops_fp8"] == 2e15
    assert profile_to_dict(p)["compute"]["peak_flops_fp8"] == 0.0


def test_the_written_mapping_has_every_key_in_its_section_and_its_kind():
    out = profile_to_dict(load_profile("cpu"))
    assert list(out)[:4] == ["name", "description", "device", "source"]
    assert out["source"] == str(profiles_dir() / "cpu.toml") and out["device"] == "cpu"
    assert type(out["node"]["gpus_per_node"]) is int
    assert type(out["memory"]["reserved_bytes"]) is float
    assert list(out["compute"])[:2] == ["peak_flops_fp32", "peak_flops_tf32"]
    assert set(out) == {"name", "description", "device", "source", "compute", "memory", "node",
                        "network"}  # fmt: skip


def test_the_written_file_holds_the_header_comments_and_notes(tmp_path):
    p = load_profile("cpu")
    text = profile_to_toml(p, {"capacity_bytes": "measured here"}, header="line one\n\nline three")
    lines = text.splitlines()
    assert lines[:3] == ["# line one", "#", "# line three"]
    assert lines[3:6] == [
        f'name = "{p.name}"',
        f'description = "{p.description}"',
        'device = "cpu"',
    ]
    assert lines[6:8] == ["", "[compute]"]
    assert f"capacity_bytes = {float(p.memory_bytes)!r}  # measured here" in lines
    assert f"gpus_per_node = {p.gpus_per_node}" in lines  # an int, no note
    assert "peak_flops_fp8 = 0.0  # not measured: 0 = FP8 linears run at the 16-bit rate" in lines
    assert text.endswith("\n") and not text.endswith("\n\n")
    assert [ln for ln in lines if ln.startswith("[")] == ["[compute]", "[memory]", "[node]",
                                                          "[network]"]  # fmt: skip
    assert profile_to_toml(p).splitlines()[0] == f'name = "{p.name}"'  # no header, no comments


def test_strings_are_escaped_for_toml():
    p = profile_from_dict(_data(description='q"b\\t\tc\x01\x7fé'), "p")
    line = profile_to_toml(p).splitlines()[1]
    assert line == 'description = "q\\"b\\\\t\\u0009c\\u0001\\u007fé"'


def test_a_written_profile_goes_where_asked_and_reads_back(tmp_path):
    p = load_profile("cpu")
    out = tmp_path / "deep" / "er" / "mine.toml"
    write_profile(p, out, {"capacity_bytes": "x"}, "hdr")
    assert out.read_text().startswith("# hdr\n")
    assert f"capacity_bytes = {float(p.memory_bytes)!r}  # x" in out.read_text().splitlines()
    assert load_profile(str(out)) == p
    plain = tmp_path / "plain.toml"
    write_profile(p, plain)  # no header: the name first
    assert plain.read_text().startswith(f'name = "{p.name}"\n')


def test_an_invalid_profile_is_refused_naming_the_file_it_was_for(tmp_path):
    p = load_profile("cpu")
    bad = profiles.DeviceProfile(**{**p.__dict__, "memory_bandwidth": -1.0})
    out = tmp_path / "bad.toml"
    with pytest.raises(UserInputError) as err:
        write_profile(bad, out)
    assert str(err.value) == (
        f"profile {out}: [memory] bandwidth_bytes_per_s = -1.0 must be a positive finite "
        "number (bytes/s)"
    )


def test_a_name_or_a_path():
    measured = profiles_dir() / "measured"
    assert load_profile("measured/vm-cpu-x2").source == str(measured / "vm-cpu-x2.toml")
    names = list_profiles()
    shipped = sorted(p.stem for p in profiles_dir().glob("*.toml"))
    assert names[: len(shipped)] == shipped
    assert names[len(shipped) :] == sorted(f"measured/{p.stem}" for p in measured.glob("*.toml"))


@pytest.mark.parametrize("text", ["nowhere/x", "x.toml", "a\\b"])
def test_a_path_that_is_not_a_file_is_named(text):
    with pytest.raises(UserInputError) as err:
        load_profile(text)
    assert str(err.value) == (
        f"profile file {text} does not exist: give the path to a .toml profile or one of the "
        f"names {NAMES}"
    )


def test_an_unknown_name_lists_every_name():
    with pytest.raises(UserInputError) as err:
        load_profile("tpu-v5")
    assert str(err.value) == (
        f"unknown profile 'tpu-v5': choose one of {NAMES}, or give the path to a .toml file"
    )


def test_a_file_that_is_not_toml_or_not_text_is_named(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[memory\n")
    with pytest.raises(UserInputError) as err:
        read_toml(bad, "pool", "; fix it")
    message = str(err.value)
    assert message.startswith(f"pool {bad} is not valid TOML: ") and message.endswith("; fix it")
    with pytest.raises(UserInputError) as err:
        load_profile(str(bad))
    assert str(err.value).endswith("; fix the file")
    assert str(err.value).startswith(f"profile {bad} is not valid TOML: ")
    with pytest.raises(UserInputError) as err:
        read_toml(bad, "pool")
    assert str(err.value).endswith(")")  # no hint: the parser's message last
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b'name = "\xff"\n')
    with pytest.raises(UserInputError) as err:
        read_toml(binary, "profile", "; fix the file")
    assert str(err.value).startswith(f"profile {binary} cannot be read: ")
    with pytest.raises(UserInputError) as err:
        read_toml(tmp_path, "profile")  # a folder
    assert str(err.value).startswith(f"profile {tmp_path} cannot be read: ")


def _gpu(monkeypatch, name: str | None, total: float = 80e9):
    import torch

    class Props:
        total_memory = int(total)

    # one device, index 0: another index (or none) raises as torch does
    monkeypatch.setattr(torch.cuda, "is_available", lambda: name is not None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: [name][i])
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: [Props()][i])


@pytest.mark.parametrize(
    "gpu, total, expected",
    [
        ("NVIDIA H200", 150e9, ("h200", "local GPU NVIDIA H200")),
        ("nvidia h100 pcie", 85e9, ("h100-sxm", "local GPU nvidia h100 pcie")),
        ("A100-SXM4-80GB", 85899345920, ("a100-80g", "local GPU A100-SXM4-80GB with 80 GiB")),
        ("A100-SXM4-40GB", 42949672960, ("a100-40g", "local GPU A100-SXM4-40GB with 40 GiB")),
        ("A100 at the edge", 60e9, ("a100-40g", "local GPU A100 at the edge with 56 GiB")),
        ("A100 past it", 60e9 + 1, ("a100-80g", "local GPU A100 past it with 56 GiB")),
        ("Tesla V100", 17e9, ("v100-16g", "local GPU Tesla V100")),
        ("Radeon", 17e9, ("h100-sxm", "local GPU Radeon has no shipped profile; using "
                                      "h100-sxm (set --profile, or run plan calibrate)")),
        (None, 0, ("h100-sxm", "no GPU visible to torch; using h100-sxm (set --profile to "
                               "change)")),
    ],
)  # fmt: skip
def test_the_default_profile_and_why(monkeypatch, gpu, total, expected):
    _gpu(monkeypatch, gpu, total)
    assert default_profile_name() == expected


def test_a_broken_cuda_falls_back_to_the_default(monkeypatch):
    import torch

    def broken():
        raise RuntimeError("driver too old")

    monkeypatch.setattr(torch.cuda, "is_available", broken)
    assert default_profile_name() == (
        "h100-sxm", "no GPU visible to torch; using h100-sxm (set --profile to change)",
    )  # fmt: skip


def test_the_shipped_folder_is_beside_the_package():
    assert profiles_dir() == Path(profiles.__file__).resolve().parents[2] / "profiles"
