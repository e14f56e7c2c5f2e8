"""Tests written for mutmut's generated mutants of planner/recsys/command.py (``plan MODEL.py``
for a recommendation model: the device, the plan written, what is printed and where;
benchmarks/generated_mutants.py). A two-table model file is written here and planned for real
(a second each); the summary's lines are worked by hand from a plan dict written here.
docs/mutation.md names the mutants each test kills."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import highspy
import pytest
import torch
import torchrec  # noqa: F401  (no skip: the README's test command installs the recsys extra)

from planner.errors import InfeasibleError, UserInputError
from planner.modelfile import load_model_file
from planner.recsys.command import GIB, plan_device, print_summary, run
from planner.recsys.plan import load_recplan
from planner.training import Training


@pytest.fixture(autouse=True)
def _own_highs_scheduler():
    """mutmut forks a child per mutant from the process that ran the clean tests; HiGHS's task
    scheduler's threads do not come with a fork (planner/search/overlap.py), and the recsys
    MILP (cvxpy's HiGHS) would wait on them forever: each test starts it afresh."""
    highspy.Highs.resetGlobalScheduler(False)


MODEL = """
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

TRAINING = {"global_batch_size": 8, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name="a", embedding_dim=4, num_embeddings=10, feature_names=["a"]),
            EmbeddingBagConfig(name="b", embedding_dim=8, num_embeddings=20, feature_names=["b"]),
        ])
        self.head = torch.nn.Linear(12, 1)

    def forward(self, sparse):
        return self.head(self.ebc(sparse).values()).squeeze(1)


def build_model():
    return M()


def embedding_stats():
    return {"a": {"pooling_factor": 1.0}, "b": {"pooling_factor": 2.0}}


def make_batch(batch_size, step=0):
    lengths = torch.tensor([1] * batch_size + [2] * batch_size)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b"], values=torch.zeros(int(lengths.sum()), dtype=torch.long),
        lengths=lengths)
    return kjt, torch.zeros(batch_size)


def loss_fn(out, y):
    return torch.nn.functional.binary_cross_entropy_with_logits(out, y)
"""
TRAIN = Training(8, dtype="fp32", optimizer="sgd")


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "tworec.py"
    path.write_text(MODEL)
    return load_model_file(path)


def args(**kw) -> argparse.Namespace:
    """The flags run reads, at the command line's defaults."""
    base = dict(graph=False, gpus=2, nodes=None, profile="h100-sxm", gpus_per_node=None)
    base.update(memory_fraction=1.0, out=None, json=False, quiet=False, run=False, device=None)
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize(
    "kw, cuda, device",
    [
        (dict(device="cpu", profile="h100-sxm"), True, "cpu"),
        (dict(profile="cpu"), True, "cpu"),
        (dict(profile="cpu", device="cuda"), True, "cpu"),  # the cpu profile wins
        (dict(device="cuda", run=True), False, "cuda"),  # asked for: no GPU needed to plan
        (dict(run=True), False, "cpu"),  # --run with no GPU: the plan is for this CPU
        (dict(run=True), True, "cuda"),
        (dict(), False, "cuda"),  # planning only: for GPUs, whatever this host has
        (dict(profile=None), False, "cuda"),
    ],
)
def test_the_plan_is_for_cpu_when_asked_or_when_it_runs_here_without_a_gpu(
    kw, cuda, device, monkeypatch
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert plan_device(args(**kw)) == device


def test_a_namespace_without_a_device_flag_reads_as_none(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ns = args(run=True)
    del ns.device
    assert plan_device(ns) == "cpu"
    ns.run = False
    assert plan_device(ns) == "cuda"


GRAPH = {
    "tables": [
        {"name": "a", "module": "ebc", "features": ["a"], "rows": 10, "dim": 4,
         "pooling_factor": 1.0, "zipf": 0.0},
        {"name": "b", "module": "ebc", "features": ["b"], "rows": 20, "dim": 8,
         "pooling_factor": 2.0, "zipf": 0.0},
    ],
    "dense_params": 13,  # 12 x 1 + 1
}  # fmt: skip


def test_graph_prints_the_tables_and_the_dense_part_and_plans_nothing(
    model_file, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert run(args(graph=True, gpus=None), model_file, TRAIN) == 0
    assert capsys.readouterr().out == json.dumps(GRAPH, indent=2) + "\n"
    assert not (tmp_path / "reports").exists()


def test_no_device_count_is_refused_in_one_line(model_file):
    with pytest.raises(UserInputError) as info:
        run(args(gpus=None, nodes=None), model_file, TRAIN)
    assert str(info.value) == "say how many devices to plan for: --gpus N"


def test_a_plan_is_written_drawn_summarised_and_run(model_file, tmp_path, capsys):
    """On CPU without a profile: the cpu profile and its note; the plan file where --out says,
    the summary of the plan written, the figures' paths, and the run's exit code returned."""
    seen = {}

    def draw(doc, out):
        seen["draw"] = (doc, out)
        return [out / "one.png", out / "two.svg"]

    def train(path, a):
        seen["run"] = (path, a)
        return 7

    out = tmp_path / "out"
    ns = args(device="cpu", profile=None, run=True, out=str(out))
    assert run(ns, model_file, TRAIN, draw=draw, run=train) == 7
    path = out / "plan.json"
    doc = load_recplan(path)
    assert ns.profile == "cpu"
    assert (doc["device"], doc["cluster"]["profile"], doc["cluster"]["gpus"]) == ("cpu", "cpu", 2)
    assert seen["draw"] == (doc, out)
    assert seen["run"] == (path, ns)
    got = capsys.readouterr()
    assert got.err.splitlines()[0] == "note: profile cpu: the plan is for CPU ranks (gloo)"
    assert got.err.splitlines()[1:] == [f"note: {n}" for n in doc["notes"]]
    print_summary(doc, path)
    summary = capsys.readouterr().out
    assert got.out == summary + f"wrote {out / 'one.png'}\nwrote {out / 'two.svg'}\n"


def test_json_prints_the_file_as_written_and_no_notes(model_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "j"
    assert run(args(json=True, out=str(out), run=True), model_file, TRAIN) == 0  # no runner
    got = capsys.readouterr()
    assert got.out == (out / "plan.json").read_text()
    assert got.err == ""
    assert json.loads(got.out)["device"] == "cpu"  # --run, and no GPU here


def test_quiet_prints_nothing_and_the_default_folder_is_reports_and_the_stem(
    model_file, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert run(args(quiet=True, gpus=None, nodes=1), model_file, TRAIN) == 0
    got = capsys.readouterr()
    assert (got.out, got.err) == ("", "")
    doc = load_recplan(tmp_path / "reports" / "tworec" / "plan.json")
    assert doc["cluster"]["nodes"] == 1
    assert doc["cluster"]["gpus"] == 8  # one whole h100-sxm node
    assert doc["cluster"]["profile"] == "h100-sxm"


def summary_doc() -> dict:
    return {
        "cluster": {"gpus": 4, "profile": "h100-sxm"},
        "device": "cuda",
        "global_batch_size": 64,
        "tables": [{"option": "table_wise"}, {"option": "row_wise"}, {"option": "table_wise"}],
        "predicted": {
            "step_time_s": 0.0123456,
            "samples_per_s": 5184.03,
            "peak_device_bytes": 3.5 * GIB,
            "device_capacity_bytes": 80 * GIB,
        },
        "dense": {
            "strategy": "fsdp",
            "params": 1234567,
            "compute_s": 0.0234567,
            "allreduce_exposed_s": 0.0345678,
            "collective_latency_s": 0.0456789,
        },
        "ranks": [
            {"rank": 0, "step_s": 0.002, "lookup_s": 0.0001, "comm_s": 0.0002},
            {"rank": 1, "step_s": 0.0025, "lookup_s": 0.0567891, "comm_s": 0.0678912},
            {"rank": 2, "step_s": 0.001, "lookup_s": 0.0005, "comm_s": 0.0006},
        ],
        "solver": {
            "status": "optimal",
            "gap": 0.0123456,
            "solve_time_s": 1.234,
            "variables": 12345,
        },
    }


def test_the_summary_line_by_line(capsys):
    """Each figure by hand (to five digits, so a factor of 1.001 shows): 12.346 ms; 3.5 of 80
    GiB; the options counted and sorted; the dense part's label and its times in ms; the
    slowest rank (1, not the last); the gap in percent."""
    print_summary(summary_doc(), Path("r/plan.json"))
    assert capsys.readouterr().out.splitlines() == [
        "recommendation plan: 3 tables on 4 x h100-sxm (cuda), global batch 64",
        "  step 12.346 ms (5,184 samples/s); peak device memory 3.50 GiB of 80 GiB",
        "  tables: row_wise 1, table_wise 2",
        "  dense part: ZeRO-3 (FSDP2), 1,234,567 params, 23.457 ms compute, "
        "34.568 ms exposed gradient collectives, 45.679 ms collectives' latency",
        "  slowest rank 1: lookups 56.789 ms, all-to-all 67.891 ms",
        "  solver: optimal, gap 1.235%, 1.23 s, 12,345 variables",
        "wrote r/plan.json",
    ]
    assert GIB == 2**30


def test_a_gpu_plan_without_a_profile_keeps_the_default_and_the_flags_reach_the_planner(
    model_file, tmp_path, capsys
):
    """On a GPU (the default device) no profile stays no profile (plan_recsys's default, not
    the cpu one, and no cpu note); --gpus-per-node and --memory-fraction reach the planner:
    4 GPUs in nodes of 2, and a hundredth of the memory fits nothing."""
    from planner.recsys.planning import plan_recsys

    docs = {}
    for fraction in (1.0, 0.5):
        out = tmp_path / str(fraction)
        ns = args(profile=None, gpus=4, gpus_per_node=2, memory_fraction=fraction, out=str(out))
        assert run(ns, model_file, TRAIN) == 0
        assert ns.profile is None
        docs[fraction] = load_recplan(out / "plan.json")
        assert not any("profile cpu" in line for line in capsys.readouterr().err.splitlines())
    want, _ = plan_recsys(model_file, 4, gpus_per_node=2, training=TRAIN, memory_fraction=0.5)
    got = docs[0.5]
    assert got["cluster"] == want["cluster"]
    assert got["cluster"]["gpus_per_node"] == 2 and got["cluster"]["nodes"] == 2
    assert got["device"] == "cuda"
    assert got["predicted"] == want["predicted"]
    # a hundredth of an H100 is less than its reserve: nothing fits
    with pytest.raises(InfeasibleError):
        run(args(profile=None, memory_fraction=0.01, out=str(tmp_path / "x")), model_file, TRAIN)
