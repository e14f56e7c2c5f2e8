"""Profiles load, hold the reference figures, round-trip, and fail loudly on bad input; clusters
are built from the flags by the documented rules."""

from __future__ import annotations

import math
import re
from dataclasses import fields
from pathlib import Path

import pytest

from planner.errors import UserInputError
from planner.hardware.cluster import Cluster, cluster_to_dict, make_cluster
from planner.hardware.profiles import (
    FIELDS,
    DeviceProfile,
    default_profile_name,
    list_profiles,
    load_profile,
    profile_from_dict,
    profile_to_dict,
    profiles_dir,
    write_profile,
)

SHIPPED = ["a100-40g", "a100-80g", "cpu", "h100-sxm", "h200", "v100-16g"]
H100 = profiles_dir() / "h100-sxm.toml"


def edited(tmp_path: Path, pattern: str, replacement: str) -> Path:
    """A copy of the shipped H100 profile with one line changed (or removed)."""
    text, count = re.subn(pattern, replacement, H100.read_text(), flags=re.MULTILINE)
    assert count == 1, pattern
    path = tmp_path / "edited.toml"
    path.write_text(text)
    return path


def test_list_profiles_has_the_shipped_ones():
    assert set(SHIPPED) <= set(list_profiles())


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_loads_with_positive_numbers(name):
    p = load_profile(name)
    assert p.name == name
    assert p.description
    assert Path(p.source) == profiles_dir() / f"{name}.toml"
    assert set(p.peak_flops) - {"fp8"} == {"fp32", "tf32", "bf16", "fp16"}  # fp8: if any
    assert all(v > 0 and math.isfinite(v) for v in p.peak_flops.values())
    may_be_zero = {attr for _, _, attr, kind, _ in FIELDS if kind in ("nonneg", "unit")}
    for f in fields(DeviceProfile):
        value = getattr(p, f.name)
        if isinstance(value, (int, float)):
            assert math.isfinite(value) and value >= 0, f.name
            assert value > 0 or f.name in may_be_zero, f.name
    for eff in (p.matmul_efficiency, p.elementwise_efficiency, p.collective_efficiency):
        assert 0 < eff <= 1
    assert isinstance(p.gpus_per_node, int)
    assert p.inter_node_bandwidth < p.intra_node_bandwidth


def test_every_shipped_value_line_cites_a_source():
    for name in SHIPPED:
        for line in (profiles_dir() / f"{name}.toml").read_text().splitlines():
            if "=" in line and not line.startswith(("#", "name", "description")):
                assert "#" in line, f"{name}: {line}"


def test_reference_figures():
    """hardware.md gpu_specs: dense bf16 989 TFLOP/s (not the 1,979 sparse figure)."""
    h100 = load_profile("h100-sxm")
    assert h100.peak_flops["bf16"] == pytest.approx(989e12, rel=0.01)
    # capacity is what torch can allocate, as measured by plan calibrate on the chip itself
    assert h100.memory_bytes == load_profile("measured/h100-x1").memory_bytes
    assert h100.intra_node_bandwidth == pytest.approx(450e9)
    assert h100.inter_node_bandwidth == pytest.approx(50e9)
    assert load_profile("a100-80g").peak_flops["bf16"] == pytest.approx(312e12, rel=0.01)
    assert load_profile("h200").memory_bytes == load_profile("measured/h200-x1").memory_bytes
    # the datasheets' "40GB" / "80GB" / "16GB" are binary sizes of which the driver keeps part
    for name, gib in (("a100-40g", 40), ("a100-80g", 80), ("v100-16g", 16), ("h100-sxm", 80)):
        assert 0.98 * gib * 2**30 < load_profile(name).memory_bytes < gib * 2**30, name
    v100 = load_profile("v100-16g")
    assert v100.peak_flops["bf16"] == v100.peak_flops["fp32"]  # no bf16 tensor cores


def test_load_by_path(tmp_path):
    assert load_profile(str(H100)) == load_profile("h100-sxm")


def test_round_trip(tmp_path):
    for name in SHIPPED:
        p = load_profile(name)
        out = tmp_path / "measured" / f"{name}.toml"
        write_profile(p, out, comments={"capacity_bytes": "measured"}, header="test\nheader")
        back = load_profile(str(out))
        assert back == p
        assert back.source == str(out)
        assert profile_from_dict(profile_to_dict(p), p.source) == p
    assert not list(tmp_path.glob("**/*.tmp"))


def test_round_trip_escapes_strings(tmp_path):
    p = load_profile("cpu")
    odd = DeviceProfile(**{**p.__dict__, "description": 'a "quoted"\\ name\twith tab'})
    write_profile(odd, tmp_path / "odd.toml")
    assert load_profile(str(tmp_path / "odd.toml")).description == odd.description


def test_a_profile_without_the_gathered_tp_overhead_takes_the_tp_module_one(tmp_path):
    """Profiles measured before tp_gather_overhead_s existed keep pricing gathered modules as
    they did: at tp_module_overhead_s, not at the optional 0."""
    p = load_profile(
        str(edited(tmp_path, r"^tp_module_overhead_s = .*$", "tp_module_overhead_s = 7e-4"))
    )
    assert p.tp_module_overhead == p.tp_gather_overhead == 7e-4
    both = edited(
        tmp_path,
        r"^tp_module_overhead_s = .*$",
        "tp_module_overhead_s = 7e-4\ntp_gather_overhead_s = 2e-3",
    )
    q = load_profile(str(both))
    assert (q.tp_module_overhead, q.tp_gather_overhead) == (7e-4, 2e-3)


def test_reserved_bytes_is_optional(tmp_path):
    p = load_profile(str(edited(tmp_path, r"^reserved_bytes = .*\n", "")))
    assert p.reserved_bytes == 0.0


def test_write_profile_refuses_an_invalid_profile(tmp_path):
    p = load_profile("cpu")
    bad = DeviceProfile(**{**p.__dict__, "memory_bandwidth": -1.0})
    with pytest.raises(UserInputError, match="bandwidth_bytes_per_s"):
        write_profile(bad, tmp_path / "bad.toml")
    assert not (tmp_path / "bad.toml").exists()


@pytest.mark.parametrize(
    "pattern, replacement, words",
    [
        (r"^inter_node_latency_s = .*\n", "", ["inter_node_latency_s", "lacks"]),
        (
            r"^intra_node_bandwidth_bytes_per_s = .*$",
            "intra_node_bandwidth_bytes_per_s = -450e9",
            ["intra_node_bandwidth_bytes_per_s", "positive"],
        ),
        (r"^capacity_bytes = .*$", "capacity_bytes = nan", ["capacity_bytes"]),
        (r"^peak_flops_bf16 = .*$", "peak_flops_bf16 = 0", ["peak_flops_bf16"]),
        (r"^peak_flops_fp16 = .*$", 'peak_flops_fp16 = "fast"', ["peak_flops_fp16"]),
        (
            r"^collective_efficiency = .*$",
            "collective_efficiency = 1.5",
            ["collective_efficiency", "(0, 1]"],
        ),
        (r"^matmul_efficiency = .*$", "matmul_efficiency = 0", ["matmul_efficiency"]),
        (r"^gpus_per_node = .*$", "gpus_per_node = 0", ["gpus_per_node"]),
        (r"^gpus_per_node = .*$", "gpus_per_node = 7.5", ["gpus_per_node", "integer"]),
        (r"^reserved_bytes = .*$", "reserve_bytes = 1", ["reserve_bytes", "unknown"]),
        (r"^name = .*\n", "", ["name"]),
        (r"^\[memory\]$", "[memory", ["not valid TOML"]),
    ],
)
def test_bad_profile_names_the_field_and_file(tmp_path, pattern, replacement, words):
    path = edited(tmp_path, pattern, replacement)
    with pytest.raises(UserInputError) as info:
        load_profile(str(path))
    message = str(info.value)
    assert str(path) in message
    for word in words:
        assert word in message
    assert "\n" not in message or "TOML" in message


def test_unknown_name_lists_the_available_ones():
    with pytest.raises(UserInputError) as info:
        load_profile("h100-pcie")
    assert "h100-pcie" in str(info.value)
    for name in SHIPPED:
        assert name in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(UserInputError, match="does not exist"):
        load_profile(str(tmp_path / "nope.toml"))


def test_default_profile_without_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    name, reason = default_profile_name()
    assert name == "h100-sxm" and "no GPU" in reason


@pytest.mark.parametrize(
    "gpu, total, expected",
    [
        ("NVIDIA H100 80GB HBM3", 85e9, "h100-sxm"),
        ("NVIDIA H200", 150e9, "h200"),
        ("NVIDIA A100-SXM4-80GB", 85e9, "a100-80g"),
        ("NVIDIA A100-SXM4-40GB", 42e9, "a100-40g"),
        ("Tesla V100-SXM2-16GB", 17e9, "v100-16g"),
    ],
)
def test_default_profile_maps_the_local_gpu(monkeypatch, gpu, total, expected):
    import torch

    class Props:
        total_memory = int(total)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: gpu)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: Props())
    name, reason = default_profile_name()
    assert name == expected and gpu in reason


# ----------------------------------------------------------------------------- clusters


@pytest.mark.parametrize(
    "gpus, nodes, per_node",
    [(8, 1, 8), (1024, 128, 8), (4, 1, 4), (1, 1, 1), (16, 2, 8)],
)
def test_make_cluster_from_gpus(gpus, nodes, per_node):
    cluster, notes = make_cluster(gpus, "h100-sxm")
    assert (cluster.nodes, cluster.gpus_per_node, cluster.gpus) == (nodes, per_node, gpus)
    assert cluster_to_dict(cluster) == {
        "profile": "h100-sxm",
        "nodes": nodes,
        "gpus_per_node": per_node,
        "gpus": gpus,
    }


def test_make_cluster_not_filling_nodes():
    with pytest.raises(UserInputError, match=r"--gpus 12 does not fill nodes of 8 GPUs.*multiple"):
        make_cluster(12, "h100-sxm")
    cluster, _ = make_cluster(12, "h100-sxm", gpus_per_node=4)
    assert (cluster.nodes, cluster.gpus_per_node) == (3, 4)


@pytest.mark.parametrize("bad", [0, -1])
def test_make_cluster_rejects_non_positive(bad):
    with pytest.raises(UserInputError, match=f"--gpus must be a positive integer, got {bad}"):
        make_cluster(bad, "h100-sxm")
    with pytest.raises(UserInputError, match="--nodes must be a positive integer"):
        make_cluster(None, "h100-sxm", nodes=bad)
    with pytest.raises(UserInputError, match="--gpus-per-node must be a positive integer"):
        make_cluster(8, "h100-sxm", gpus_per_node=bad)


def test_make_cluster_with_nodes():
    cluster, _ = make_cluster(16, "h100-sxm", nodes=2)
    assert (cluster.nodes, cluster.gpus_per_node) == (2, 8)
    cluster, _ = make_cluster(None, "h100-sxm", nodes=3)
    assert cluster.gpus == 24
    with pytest.raises(UserInputError, match="--nodes 2.*16 GPUs, not --gpus 8"):
        make_cluster(8, "h100-sxm", nodes=2)
    with pytest.raises(UserInputError, match="--gpus N"):
        make_cluster(None, "h100-sxm")


def test_make_cluster_default_profile_note(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cluster, notes = make_cluster(8, None)
    assert cluster.profile.name == "h100-sxm"
    assert any("h100-sxm" in n and "no GPU" in n for n in notes)


def test_make_cluster_bad_profile():
    with pytest.raises(UserInputError, match="unknown profile"):
        make_cluster(8, "tpu-v5")


def test_node_of_and_links():
    cluster = Cluster(load_profile("h100-sxm"), nodes=2, gpus_per_node=8)
    p = cluster.profile
    assert [cluster.node_of(r) for r in (0, 7, 8, 15)] == [0, 0, 1, 1]
    with pytest.raises(ValueError):
        cluster.node_of(16)
    inside, across = list(range(8)), [0, 8]
    assert not cluster.spans_nodes(inside) and cluster.spans_nodes(across)
    bw_in, lat_in = cluster.link(inside)
    bw_out, lat_out = cluster.link(across)
    assert bw_in == pytest.approx(p.intra_node_bandwidth * p.collective_efficiency)
    assert lat_in == p.intra_node_latency
    assert bw_out == pytest.approx(p.inter_node_bandwidth * p.collective_efficiency)
    assert lat_out == p.inter_node_latency
    nbytes = 1e9
    assert nbytes / bw_out + lat_out > nbytes / bw_in + lat_in
    assert cluster.link([3]) == cluster.link(inside)
