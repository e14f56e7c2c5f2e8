"""plan calibrate: the alpha-beta fit is exact on exact data, a measured profile maps each
measurement onto the cost model so the model reproduces it, a real --quick run writes a profile
that loads, round-trips and plans, and an existing --out is never overwritten without --force."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import tomllib

import planner.calibrate.command as calibrate_mod
import planner.calibrate.workers as workers_mod
from planner.calibrate import main
from planner.calibrate.fit import fit_alpha_beta, fit_each, ring_factors
from planner.cost.compute import compute_time
from planner.errors import UserInputError
from planner.hardware.cluster import Cluster
from planner.hardware.collectives import collective_time
from planner.hardware.profiles import FIELDS, load_profile, profile_to_dict

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "examples" / "mlp.py"

# --------------------------------------------------------------------------- the fit


def exact_times(alpha: float, bandwidth: float, n: int, kinds, sizes):
    return [
        (k, n, s, ring_factors(k, n)[0] * s / bandwidth + ring_factors(k, n)[1] * alpha)
        for k in kinds
        for s in sizes
    ]


@pytest.mark.parametrize(
    "alpha, bandwidth, n",
    [(3.7e-5, 1.9e9, 2), (5e-6, 3.6e11, 8), (0.0, 2.5e10, 4), (1.2e-3, 7.5e7, 3)],
)
def test_alpha_beta_fit_recovers_exact_parameters(alpha, bandwidth, n):
    sizes = [2**k for k in range(10, 28, 3)]
    samples = exact_times(
        alpha, bandwidth, n, ("all_reduce", "all_gather", "reduce_scatter"), sizes
    )
    fit = fit_alpha_beta(samples)
    assert fit.bandwidth == pytest.approx(bandwidth, rel=1e-9)
    assert fit.alpha == pytest.approx(alpha, rel=1e-9, abs=1e-15)
    assert fit.max_rel_error < 1e-9
    for kind, each in fit_each(samples).items():
        assert each.bandwidth == pytest.approx(bandwidth, rel=1e-9), kind
        assert each.alpha == pytest.approx(alpha, rel=1e-9, abs=1e-15), kind


def test_alpha_beta_fit_uses_the_cost_model_factors():
    """A point-to-point fit of the same times as an all-reduce over 2 ranks must read a bus
    bandwidth 1x (not 2(n-1)/n = 1x) and latency 2 alpha: the factors are the model's."""
    sizes = [2**k for k in range(12, 24, 2)]
    ar = exact_times(1e-4, 1e9, 4, ("all_reduce",), sizes)
    as_p2p = [("p2p", 2, s, t) for _, _, s, t in ar]
    fit = fit_alpha_beta(as_p2p)
    assert fit.bandwidth == pytest.approx(1e9 / 1.5, rel=1e-9)  # 2(n-1)/n = 1.5 for n = 4
    assert fit.alpha == pytest.approx(6e-4, rel=1e-9)  # 2(n-1) = 6 steps


def test_alpha_beta_fit_rejects_undetermined_data():
    with pytest.raises(ValueError):
        fit_alpha_beta([("all_reduce", 2, 4096, 1e-4), ("all_reduce", 2, 4096, 2e-4)])
    with pytest.raises(ValueError):  # time falls with size: no positive bandwidth
        fit_alpha_beta([("all_reduce", 2, 4096, 1e-3), ("all_reduce", 2, 2**20, 1e-4)])


# --------------------------------------------------------------------------- synthetic machine


SYNC = 1.2e-3  # what each collective costs between compute phases beyond its ring


def synthetic_results(nproc: int, alpha: float, bandwidth: float):
    """What run_workers would return on a machine with known rates (ranks differ: the slower
    one must count)."""
    from planner.calibrate.bench import settings

    s = settings("cpu", quick=True)
    coll = [
        (k, nproc, size, trial, t * (1 + 0.3 * trial))  # later trials slower: fastest counts
        for trial in range(2)
        for k, n, size, t in exact_times(
            alpha, bandwidth, nproc, workers_mod.COLLECTIVES, s.collective_sizes
        )
    ]
    p2p = [
        ("p2p", 2, size, trial, t)
        for trial in range(2)
        for _, _, size, t in exact_times(alpha, 2 * bandwidth, 2, ("p2p",), s.collective_sizes)
    ]
    # between compute phases each call costs SYNC more; in-situ trials scatter both ways
    # around it (differences of two walls), so the median trial counts
    in_situ = [
        (k, nproc, size, trial, t + SYNC * (0.5, 1.0, 1.7)[trial])
        for trial in range(3)
        for k, n, size, t in exact_times(
            alpha, bandwidth, nproc, workers_mod.COLLECTIVES, workers_mod.in_situ_sizes(s)
        )
    ]
    shapes = len(s.matmul_shapes)
    out = []
    for rank in range(nproc):
        slow = 1.0 if rank == 0 else 0.8  # rank 1 is 20% slower at everything it computes
        out.append(
            {
                "rank": rank,
                "threads": 1,
                "rss_bytes": 3e8 + rank,
                "matmul": {
                    "fp32": [40e9 * slow] * shapes,
                    "bf16": [100e9 * slow] * shapes,
                    "fp16": [1e9 * slow] * shapes,
                },
                "stream": {"copy": 12e9 * slow, "add": 13e9 * slow, "scale": 12.5e9 * slow},
                "elementwise": {
                    "add": 10e9 * slow,
                    "gelu": 5e9 * slow,
                    "layer_norm": 5e9 * slow,
                    "softmax": 5e9 * slow,
                },
                "op_overhead": {
                    "forward": 8e-6 / slow,
                    "backward": 1e-5 / slow,
                    "ops": 14.0,
                    "selective": 2e-4,
                    "optimizer": 3e-6,
                    "dtensor": 7e-5,
                    "tp_module": 4e-4 / slow,
                    "tp_gather_module": 9e-4 / slow,
                    "fsdp_unit": 6e-4 / slow,
                },
                "collectives": coll,
                "collectives_in_situ": in_situ,
                "p2p": p2p,
            }
        )
    return out


@pytest.fixture
def synthetic_machine(monkeypatch):
    alpha, bandwidth = 2e-4, 1.5e9

    def fake_workers(device, nproc, threads, quick, progress=None):
        return synthetic_results(nproc, alpha, bandwidth)

    def fake_single(device, s):
        return {"threads": 2, "matmul": {"fp32": [70e9] * len(s.matmul_shapes)}, "stream": {}}

    monkeypatch.setattr(workers_mod, "run_workers", fake_workers)
    monkeypatch.setattr(calibrate_mod, "measure_single", fake_single)
    return alpha, bandwidth


def test_profile_makes_the_cost_model_reproduce_the_measurements(tmp_path, synthetic_machine):
    alpha, bandwidth = synthetic_machine
    out = tmp_path / "synthetic.toml"
    out.write_text("old")
    assert main(["--quick", "--nproc", "2", "--out", str(out), "--force", "--quiet"]) == 0
    p = load_profile(str(out))
    assert p.name == "synthetic" and p.gpus_per_node == 2
    cluster = Cluster(p, 1, 2)
    rel = 2e-3  # the file keeps four significant digits
    # matmuls: the slower rank's rate, for every dtype, through one shared efficiency
    for dtype, rate in (("fp32", 32e9), ("bf16", 80e9), ("fp16", 0.8e9)):
        assert compute_time(1e12, 0, cluster, dtype) == pytest.approx(1e12 / rate, rel=rel)
    assert 0 < p.matmul_efficiency <= 1
    # element-wise: one each of add (3 streams) and three 2-stream ops, slower rank
    mixed = (3 + 2 + 2 + 2) / (3 / 8e9 + 3 * 2 / 4e9)
    assert compute_time(0, 1e9, cluster, "fp32") == pytest.approx(1e9 / mixed, rel=rel)
    assert p.memory_bandwidth == pytest.approx(13e9 * 0.8, rel=rel)
    # collectives priced by the model equal the synthetic measurements in situ: the ring fitted
    # back to back, plus the median in-situ excess once per call
    assert p.collective_sync == pytest.approx(SYNC, rel=rel)
    for kind in workers_mod.COLLECTIVES:
        for size in (2**12, 2**20, 2**26):
            c, d = ring_factors(kind, 2)
            want = c * size / bandwidth + d * alpha + SYNC
            assert collective_time(kind, size, cluster, [0, 1]) == pytest.approx(want, rel=rel)
    assert p.reserved_bytes == pytest.approx(3e8, rel=rel)
    # per-op host overheads: the slower rank's (CPU ranks run dispatch in line with the math)
    assert p.op_overhead == pytest.approx(1e-5, rel=rel)
    assert p.backward_op_overhead == pytest.approx(1.25e-5, rel=rel)
    assert p.dtensor_op_overhead == pytest.approx(7e-5, rel=rel)
    assert p.optimizer_op_overhead == pytest.approx(3e-6, rel=rel)
    assert p.selective_op_overhead == pytest.approx(2e-4, rel=rel)
    assert p.tp_module_overhead == pytest.approx(5e-4, rel=rel)
    assert p.tp_gather_overhead == pytest.approx(9e-4 / 0.8, rel=rel)
    assert p.fsdp_unit_overhead == pytest.approx(7.5e-4, rel=rel)
    text = out.read_text()
    assert "one process alone with 2 threads: 70 GFLOP/s" in text


# --------------------------------------------------------------------------- a real --quick run


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A real quick calibration of this machine. How long it takes is benchmarks/calibrate.py's
    to measure: a wall-clock bound here failed under a loaded runner with nothing wrong."""
    out = tmp_path_factory.mktemp("calibrate") / "this-machine.toml"
    assert main(["--quick", "--out", str(out), "--quiet"]) == 0
    return out


@pytest.mark.distributed
def test_measured_profile_round_trips(measured):
    path = measured
    p = load_profile(str(path))
    with open(path, "rb") as f:
        raw = tomllib.load(f)
    as_dict = profile_to_dict(p)
    for section, key, *_ in FIELDS:
        assert raw[section][key] == as_dict[section][key], key
    assert load_profile(str(path)) == p
    lines = {ln.split("=")[0].strip(): ln for ln in path.read_text().splitlines() if "=" in ln}
    for _, key, *_ in FIELDS:  # every number says where it came from
        assert "#" in lines[key], key
    assert path.read_text().startswith("# Measured by `plan calibrate")


@pytest.mark.distributed
def test_measured_numbers_are_positive_finite_and_physical(measured):
    p = load_profile(str(measured))
    values = [*p.peak_flops.values(), p.memory_bytes, p.memory_bandwidth, p.host_bandwidth]
    values += [p.host_memory_bandwidth, p.intra_node_bandwidth, p.inter_node_bandwidth]
    assert all(v > 0 and math.isfinite(v) for v in values)
    for eff in (p.matmul_efficiency, p.elementwise_efficiency, p.collective_efficiency):
        assert 0 < eff <= 1
    assert 0 <= p.intra_node_latency < 0.1
    assert 0 <= p.collective_sync < 0.1 and "in situ" in measured.read_text()
    # loose physical ranges: a unit slip (GFLOP/s for FLOP/s, MB for bytes) fails these
    fp32 = p.peak_flops["fp32"] * p.matmul_efficiency
    assert 1e8 < fp32 < 1e13
    assert 1e8 < p.memory_bandwidth < 1e13
    assert 1e6 < p.intra_node_bandwidth * p.collective_efficiency < 1e12
    assert 1e7 < p.reserved_bytes < 4e9
    assert p.gpus_per_node >= 2
    # an eager CPU op costs microseconds of dispatch, a DTensor op more (sharding propagation)
    assert 1e-7 < p.op_overhead < 1e-3 and 1e-7 < p.backward_op_overhead < 1e-3
    assert 1e-7 < p.optimizer_op_overhead < p.dtensor_op_overhead < 1e-2
    assert p.op_overhead < p.selective_op_overhead < 1e-2  # a dispatch mode sees every op twice
    assert p.dtensor_op_overhead < p.tp_module_overhead < 0.1  # several DTensor ops per module
    assert p.dtensor_op_overhead < p.tp_gather_overhead < 0.1


@pytest.mark.distributed
def test_plan_with_the_measured_profile(measured):
    from planner.api import plan

    path = measured
    result = plan(str(MLP), 2, model_args={"size": "tiny"}, profile=str(path))
    doc = result.plan
    assert doc.cluster.profile == "this-machine"
    assert doc.cluster.gpus == 2
    assert doc.predicted.step_time_s > 0
    assert math.isfinite(doc.predicted.step_time_s)


# --------------------------------------------------------------------------- refusing


def test_existing_out_is_refused_without_force(tmp_path, monkeypatch):
    def must_not_measure(*args, **kwargs):
        raise AssertionError("measured before refusing")

    monkeypatch.setattr(workers_mod, "run_workers", must_not_measure)
    monkeypatch.setattr(calibrate_mod, "measure_single", must_not_measure)
    out = tmp_path / "mine.toml"
    out.write_text("keep me")
    with pytest.raises(UserInputError, match="exists.*--force"):
        main(["--quick", "--out", str(out)])
    assert out.read_text() == "keep me"


def test_cli_refusal_is_one_line(tmp_path, capsys):
    from meshplan.cli import main as cli_main

    out = tmp_path / "mine.toml"
    out.write_text("keep me")
    assert cli_main(["calibrate", "--quick", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--force" in err
    assert out.read_text() == "keep me"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--nproc", "1"], "at least 2"),
        (["--nproc", "0"], "positive"),
        (["--device", "tpu"], "invalid choice"),
        (["--out", "{tmp}/profile.txt"], ".toml file"),
        (["--out", "{tmp}"], ".toml file"),
    ],
)
def test_bad_requests_are_refused(argv, message, tmp_path, monkeypatch):
    monkeypatch.setattr(workers_mod, "run_workers", None)  # refused before measuring
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "x.toml")]
    with pytest.raises(UserInputError, match=message):
        main(argv)


def test_cuda_without_gpu_is_refused(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(UserInputError, match="no GPU"):
        main(["--device", "cuda", "--out", str(tmp_path / "x.toml")])


# --------------------------------------------------------------------------- the CUDA mapping


def cuda_results(nproc: int) -> list[dict]:
    """What NCCL ranks on H100s would report (this machine has no GPU to run them)."""
    from planner.calibrate.bench import settings

    s = settings("cuda", quick=True)
    shapes = len(s.matmul_shapes)
    coll = [
        (k, nproc, size, 0, t)
        for k, n, size, t in exact_times(
            5e-6, 3.6e11, nproc, workers_mod.COLLECTIVES, (2**20, 2**28)
        )
    ]
    p2p = [
        ("p2p", 2, size, 0, t)
        for _, _, size, t in exact_times(4e-6, 4e11, 2, ("p2p",), (2**20, 2**28))
    ]
    return [
        {
            "rank": r,
            "threads": 2,
            "device_name": "NVIDIA H100 80GB HBM3",
            "device_total_bytes": 85e9,
            "context_bytes": 6e8,
            "matmul": {
                "fp32": [50e12] * shapes,
                "tf32": [380e12] * shapes,
                "bf16": [700e12] * shapes,
                "fp16": [710e12] * shapes,
            },
            "attention": [330e12] * len(s.attention_shapes),
            "stream": {"copy": 2.9e12, "add": 3.0e12, "scale": 2.9e12},
            "elementwise": {"add": 2.8e12, "gelu": 2.5e12, "layer_norm": 2.2e12, "softmax": 2.0e12},
            "host_link": {"h2d": 50e9, "d2h": 40e9},
            "op_overhead": {
                "forward": 6e-6,
                "backward": 9e-6,
                "ops": 14.0,
                "selective": 5e-5,
                "optimizer": 2e-6,
            },
            "collectives": coll if nproc > 1 else [],
            "p2p": p2p if nproc > 1 else [],
        }
        for r in range(nproc)
    ]


@pytest.mark.parametrize("nproc", [1, 2])
def test_cuda_profile_keeps_datasheet_peaks_and_fits_efficiencies(nproc, monkeypatch):
    import planner.calibrate.profile as cp
    from planner.calibrate.bench import settings

    h100 = load_profile("h100-sxm")
    monkeypatch.setattr(cp, "reference_profile", lambda device: (h100, "h100-sxm"))
    monkeypatch.setattr(cp, "_cuda_device_count", lambda: 8)
    machine = cp.Machine(
        "cuda",
        nproc,
        2,
        16,
        "gpu-host",
        "Xeon",
        2000.0,
        frozenset(),
        "",
        2e12,
        0.1,
        "2.13",
        "2026-01-01T00:00:00Z",
        "plan calibrate --device cuda",
        True,
    )
    single = {"threads": 16, "stream": {"copy": 200e9}}
    res = cp.build_profile(machine, settings("cuda", True), cuda_results(nproc), single, "h100x")
    p = res.profile
    assert p.peak_flops["bf16"] == h100.peak_flops["bf16"]  # the datasheet stays the peak
    assert p.matmul_efficiency == pytest.approx(700e12 / 989e12)
    for dtype, rate in (("fp32", 50e12), ("tf32", 380e12), ("fp16", 710e12)):
        assert p.peak_flops[dtype] * p.matmul_efficiency == pytest.approx(rate)
    # fused attention keeps its own measured rate: priced as a GEMM it would be 2x too fast
    assert p.attention_efficiency == pytest.approx(330e12 / 989e12)
    assert "330 TFLOP/s" in res.comments["attention_efficiency"]
    assert p.host_bandwidth == pytest.approx(2 / (1 / 50e9 + 1 / 40e9))
    assert p.host_memory_bandwidth == pytest.approx(200e9 / 8)
    assert p.gpus_per_node == 8 and p.memory_bytes == 85e9 and p.reserved_bytes == 6e8
    assert p.inter_node_bandwidth == h100.inter_node_bandwidth  # one node: nothing to measure
    # GPU launches are asynchronous: the measured host time is noted, the profile keeps 0
    assert p.op_overhead == p.backward_op_overhead == p.dtensor_op_overhead == 0
    assert p.tp_module_overhead == p.optimizer_op_overhead == p.selective_op_overhead == 0
    assert p.fsdp_unit_overhead == p.tp_gather_overhead == 0
    assert "6 us forward" in res.comments["op_overhead_s"]
    if nproc == 1:
        assert p.intra_node_bandwidth == h100.intra_node_bandwidth
        assert "not measured" in res.comments["intra_node_latency_s"]
    else:
        assert p.intra_node_latency == pytest.approx(5e-6)
        assert p.intra_node_bandwidth * p.collective_efficiency == pytest.approx(3.6e11)
        assert p.collective_sync == 0 and res.comments["collective_sync_s"] == "not measured"


@pytest.mark.parametrize("half", [0.0, 12.5, 40.0])
def test_inner_dimension_fit_recovers_exact_data(half):
    from planner.calibrate.profile import fit_half_inner_dim

    ks = [32, 64, 128, 512, 1024]
    rates = [90e9 * k / (k + half) for k in ks]
    assert fit_half_inner_dim(ks, rates) == pytest.approx(half, abs=1e-6)
    assert fit_half_inner_dim([128, 128], [1e9, 2e9]) == 0.0  # one K says nothing


def test_rounding_keeps_capacities_exact():
    """Rates are written to four digits, but a capacity rounded up (an H100's 85,017,493,504
    bytes to 85.02e9) would let a plan count on memory the device does not have."""
    from dataclasses import replace

    p = replace(
        load_profile("h100-sxm"),
        memory_bytes=85_017_493_504.0,
        host_memory_bytes=135_123_456_789.0,
        memory_bandwidth=3_081_234_567_890.0,
    )
    r = calibrate_mod.rounded(p)
    assert r.memory_bytes == 85_017_493_504.0
    assert r.host_memory_bytes == 135_123_456_789.0
    assert r.memory_bandwidth == 3.081e12
