"""``plan`` on recommendation models: dispatch to the table planner, the plan file, and the
one-line errors (exit 3 for a table no cluster of this size holds)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torchrec  # noqa: F401  (no skip: the README's test command installs the recsys extra)

from meshplan.cli import main
from planner.recsys.plan import load_recplan

ROOT = Path(__file__).resolve().parent.parent
DLRM = ROOT / "examples" / "dlrm.py"

HUGE = """
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

TRAINING = {"global_batch_size": 64, "optimizer": "sgd", "dtype": "fp32", "lr": 0.1}

class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name="small", embedding_dim=16, num_embeddings=1000,
                               feature_names=["a"]),
            EmbeddingBagConfig(name="users", embedding_dim=128, num_embeddings=2_000_000_000,
                               feature_names=["u"]),
        ])
        self.head = torch.nn.Linear(144, 1)

    def forward(self, sparse):
        return self.head(self.ebc(sparse).values()).squeeze(1)

def build_model():
    return M()

def embedding_stats():
    return {"small": {"pooling_factor": 1.0, "zipf": 0.0},
            "users": {"pooling_factor": 1.0, "zipf": 1.0}}

def make_batch(batch_size, step=0):
    # planning reads the tables from the module, never a batch: a call fails the test
    raise NotImplementedError

def loss_fn(out, y):
    return torch.nn.functional.binary_cross_entropy_with_logits(out, y)
"""


def test_table_that_fits_no_rank_exits_3_naming_it_and_the_smallest_cluster(tmp_path, capsys):
    """2e9 rows x 128 fp32 = 1.02 TB: on 8 H100s (78 GiB free each) even row-wise leaves
    128 GB per rank; 16 GPUs (two nodes) hold 64 GB shards."""
    model = tmp_path / "huge.py"
    model.write_text(HUGE)
    rc = main([str(model), "--gpus", "8", "--profile", "h100-sxm", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 3, err
    line = [x for x in err.splitlines() if x.startswith("plan: error:")]
    assert len(line) == 1
    assert "'users'" in line[0] and "--gpus 16" in line[0]
    assert "Traceback" not in err


def test_on_cpu_no_cluster_holds_it(tmp_path, capsys):
    """Without row-wise sharding (CPU), 128 columns split at most 32 ways: no count of CPU
    ranks holds the table, and the message says a bigger device is needed."""
    model = tmp_path / "huge.py"
    model.write_text(HUGE)
    rc = main([str(model), "--gpus", "2", "--device", "cpu", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 3, err
    assert "'users'" in err and "more memory per device" in err


def test_dlrm_plan_file(tmp_path, capsys):
    rc = main([str(DLRM), "--gpus", "4", "--device", "cpu", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "recommendation plan: 4 tables on 4 x cpu" in out
    plan = load_recplan(tmp_path / "plan.json")
    assert [t["name"] for t in plan["tables"]] == ["t0", "t1", "t2", "t3"]
    for t in plan["tables"]:
        assert t["sharding"] in ("table_wise", "column_wise", "data_parallel")
        n = {"table_wise": 1, "data_parallel": 4}.get(t["sharding"]) or int(t["option"][2:])
        assert len(t["ranks"]) == len(set(t["ranks"])) == n
    slowest = max(r["step_s"] for r in plan["ranks"])
    assert plan["predicted"]["step_time_s"] == pytest.approx(slowest)
    assert plan["solver"]["status"] == "optimal"


def test_production_plans_on_gpus(tmp_path, capsys):
    rc = main([str(DLRM), "--model-arg", "size=production", "--gpus", "64",
               "--profile", "h100-sxm", "--global-batch-size", "65536",
               "--out", str(tmp_path)])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert len(plan["tables"]) == 120
    assert plan["model"]["embedding_params"] > 1e9
    cap = plan["predicted"]["device_capacity_bytes"]
    assert all(r["device_bytes"] <= cap for r in plan["ranks"])


def test_adamw_on_cpu_plans_dense_kernels_and_refuses_fused_ones(tmp_path, capsys):
    """fbgemm's CPU kernels fuse no Adam: an AdamW plan for CPU puts every table on TorchRec's
    dense kernel, and a plan edited to a fused kernel is refused in one line before launch."""
    rc = main([str(DLRM), "--gpus", "2", "--device", "cpu", "--optimizer", "adamw",
               "--out", str(tmp_path)])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    path = tmp_path / "plan.json"
    plan = load_recplan(path)
    assert plan["optimizer"] == "adamw"
    assert {t["kernel"] for t in plan["tables"]} == {"dense"}
    plan["tables"][0].update(sharding="table_wise", kernel="fused", ranks=[0])
    path.write_text(json.dumps(plan))
    capsys.readouterr()
    rc = main(["run", str(path), "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and "adamw needs a GPU" in err and err.count("\n") == 1


def test_run_refuses_a_changed_model_file(tmp_path, capsys):
    model = tmp_path / "dlrm.py"
    model.write_text(DLRM.read_text())
    assert main([str(model), "--gpus", "2", "--device", "cpu", "--out", str(tmp_path)]) == 0
    model.write_text(DLRM.read_text() + "\n# edited\n")
    rc = main(["run", str(tmp_path / "plan.json"), "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and "changed" in err


def test_the_recsys_runtime_reads_a_plan_without_the_solver():
    code = (
        "import runtime.recsys, sys; "
        "sys.exit(bool({'cvxpy', 'highspy', 'planner.recsys.milp'} & set(sys.modules)))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_recsys_plan_schema_loads_without_torch():
    code = "import planner.recsys.plan, sys; sys.exit('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_a_plan_needing_a_gpu_is_refused_on_cpu(tmp_path, capsys):
    assert main([str(DLRM), "--gpus", "2", "--device", "cpu", "--out", str(tmp_path)]) == 0
    path = tmp_path / "plan.json"
    plan = json.loads(path.read_text())
    plan["tables"][0].update(sharding="row_wise", kernel="fused", ranks=[0, 1])
    path.write_text(json.dumps(plan))
    rc = main(["run", str(path), "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and "needs a GPU" in err


def test_plan_show_reads_a_recommendation_plan(tmp_path, capsys):
    """`plan show` prints each table's option and ranks, each rank's memory, and the step the
    plan file predicts (the slowest rank's)."""
    assert main([str(DLRM), "--gpus", "2", "--device", "cpu", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    plan = load_recplan(tmp_path / "plan.json")
    rc = main(["show", str(tmp_path / "plan.json")])
    out = capsys.readouterr().out
    assert rc == 0
    for t in plan["tables"]:
        assert any(line.split("│")[1].strip() == t["name"] and t["option"] in line
                   for line in out.splitlines() if line.count("│") > 5)  # fmt: skip
    rank_rows = [line for line in out.splitlines() if line.strip().startswith("│    ")]
    assert len(rank_rows) >= 2
    step = plan["predicted"]["step_time_s"]
    assert f"predicted step {step * 1e3:.1f} ms" in out


def test_plan_show_refuses_a_broken_recommendation_plan_in_one_line(tmp_path, capsys):
    assert main([str(DLRM), "--gpus", "2", "--device", "cpu", "--out", str(tmp_path)]) == 0
    path = tmp_path / "plan.json"
    plan = json.loads(path.read_text())
    plan["tables"][1]["ranks"] = [7]
    path.write_text(json.dumps(plan))
    capsys.readouterr()
    rc = main(["show", str(path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and "'t1'" in err and "ranks" in err


def test_the_ranks_figure_draws_each_ranks_step_and_memory(tmp_path, capsys):
    """`plan` writes ranks.png and ranks.svg beside a recommendation plan and `plan show`
    redraws them. Each rank's bars add up to the plan's numbers: its predicted step (lookups,
    all-to-all, optimizer, then the dense part every rank runs) and its device memory (one
    segment per table shard it holds, then the dense part and buffers)."""
    from planner.report.recfigure import recplan_figure

    assert main([str(DLRM), "--gpus", "4", "--device", "cpu", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "ranks.png" in out and "report.html" in out
    for ext in ("png", "svg"):
        first = (tmp_path / f"ranks.{ext}").read_bytes()
        assert len(first) > 1000
    doc = load_recplan(tmp_path / "plan.json")
    page = (tmp_path / "report.html").read_text()
    assert 'src="data:image/png;base64,' in page and "http" not in page.split("<body>")[1]
    for t in doc["tables"]:  # each table's row: its name, option and sharding type
        assert re.search(f"<td>{t['name']}</td>.*?<td>{t['option']}</td><td>{t['sharding']}</td>",
                         page)  # fmt: skip
    (tmp_path / "ranks.png").unlink()
    assert main(["show", str(tmp_path / "plan.json"), "--quiet"]) == 0
    assert (tmp_path / "ranks.png").is_file()
    step_ax, memory_ax = recplan_figure(doc).axes[:2]
    for r in doc["ranks"]:
        steps = [p.get_width() for p in step_ax.patches if abs(p.get_y() + 0.35 - r["rank"]) < 1e-9]
        held = [p.get_width() for p in memory_ax.patches
                if abs(p.get_y() + 0.35 - r["rank"]) < 1e-9]  # fmt: skip
        shards = sum(1 for t in doc["tables"] if r["rank"] in t["ranks"])
        assert sum(steps) == pytest.approx(r["step_s"] * 1e3)
        assert len(held) == shards + 1
        assert sum(held) == pytest.approx(r["device_bytes"] / 2**30)
