"""The recommendation cost model against TorchRec runs on this CPU machine.

    python benchmarks/recsys_cpu.py [--ranks 2] [--steps 60] [--warmup 10]
        # writes reports/benchmarks/recsys_cpu.json

The tiny DLRM (examples/dlrm.py, global batch 256, SGD) is planned on the cpu profile, and the
planner's plan and three forced ones (every table table-wise; every table data-parallel; two
tables table-wise and two column-wise: two sharding types) are priced by the planner's own
functions (``planner.recsys.milp.step_time`` on each plan's options and ranks), then trained by
``runtime.recsys`` under torchrun, all in one launch. The measured figure is the median step
time after the warm-up steps, as ``runtime.recsys`` records it (the batch's making, TorchRec's
step and the loss's all-reduce).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.hardware.cluster import make_cluster  # noqa: E402
from planner.modelfile import load_model_file  # noqa: E402
from planner.recsys.cost import price  # noqa: E402
from planner.recsys.milp import step_time  # noqa: E402
from planner.recsys.planning import plan_recsys  # noqa: E402
from planner.recsys.tables import read_model, with_dense_ops  # noqa: E402
from planner.training import training_from  # noqa: E402
from runtime.launch import worker_env  # noqa: E402

TRAINING = {"global_batch_size": 256, "optimizer": "sgd", "dtype": "fp32", "lr": 0.5}
DLRM = ROOT / "examples" / "dlrm.py"


def variants(base: dict, world: int) -> dict[str, dict]:
    """The planner's plan and three forced ones on the same tables."""
    out = {"planner": base}
    for kind in ("table-wise", "data-parallel", "two types"):
        plan = copy.deepcopy(base)
        for i, t in enumerate(plan["tables"]):
            if kind == "data-parallel":
                t.update(sharding="data_parallel", kernel="dense", ranks=list(range(world)))
            elif kind == "two types" and t["dim"] % 8 == 0 and i % 2 == 0:
                t.update(sharding="column_wise", kernel="fused", ranks=[0, 1])
            else:
                t.update(sharding="table_wise", kernel="fused", ranks=[i % world])
        out[kind] = plan
    return out


def predicted(plan: dict, world: int) -> float:
    """The planner's step time for this plan's options and ranks."""
    mf = load_model_file(plan["model"]["file"], plan["model"].get("args", {}))
    cluster, _ = make_cluster(world, "cpu", None, None)
    rec = with_dense_ops(mf, read_model(mf))
    costed = price(rec, cluster, plan["global_batch_size"], plan["optimizer"], plan["dtype"], "cpu")
    choice, ranks = {}, {}
    for t in plan["tables"]:
        label = {"table_wise": "tw", "data_parallel": "dp"}.get(t["sharding"])
        label = label or f"cw{len(t['ranks'])}"
        choice[t["name"]] = next(o for o in costed.options[t["name"]] if o.label == label)
        ranks[t["name"]] = t["ranks"]
    return step_time(costed, choice, ranks)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--out", default=str(ROOT / "reports" / "benchmarks" / "recsys_cpu.json"))
    args = ap.parse_args()
    mf = load_model_file(DLRM, {"size": "tiny"})
    base, _ = plan_recsys(
        mf, args.ranks, profile="cpu", training=training_from(TRAINING, "recsys_cpu"), device="cpu"
    )
    plans = variants(base, args.ranks)
    work = Path(tempfile.mkdtemp(prefix="meshplan-recsys-cpu-"))
    paths, dirs = [], []
    for k, plan in enumerate(plans.values()):
        (work / str(k)).mkdir()
        paths.append(work / str(k) / "plan.json")
        paths[-1].write_text(json.dumps(plan))
        dirs.append(work / str(k))
    worker = ["--plans", *map(str, paths), "--run-dirs", *map(str, dirs)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={args.ranks}", "-m", "runtime.recsys", *worker,
           "--steps", str(args.steps)]  # fmt: skip
    proc = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        print(proc.stdout[-2000:] + proc.stderr[-4000:], file=sys.stderr)
        return 1
    rows = []
    for (name, plan), d in zip(plans.items(), dirs):
        records = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        measured = statistics.median(r["step_time_s"] for r in records[args.warmup :])
        pred = predicted(plan, args.ranks)
        types = sorted({t["sharding"] for t in plan["tables"]})
        rows.append({"plan": name, "shardings": types, "predicted_s": pred,
                     "measured_s": measured, "error": pred / measured - 1})  # fmt: skip
        print(f"{name:14} {'+'.join(types):40} predicted {pred * 1e3:6.2f} ms  measured "
              f"{measured * 1e3:6.2f} ms  {100 * (pred / measured - 1):+6.1f}%")  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"ranks": args.ranks, "steps": args.steps, "warmup": args.warmup,
                               "training": TRAINING, "rows": rows}, indent=1) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
