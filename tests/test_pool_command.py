"""The pool choice as a new user runs it, in a fresh process with COLUMNS=80 and stderr a pipe
(not a terminal, so no bars): at most 40 lines, none wider than 80 columns, no per-candidate
lines, and a resources.json beside plan.json that says what the table says. Its run costs are
recomputed here from the pool file's own figures (planner/resources/energy.py's formulas)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
POOL = ROOT / "profiles" / "pools" / "onprem.toml"


@pytest.mark.long
@pytest.mark.distributed
def test_the_pool_choice_prints_40_lines_and_writes_resources_json(tmp_path):
    out = tmp_path / "mlp"
    command = [sys.executable, "-m", "meshplan", "examples/mlp.py", "--resources", str(POOL)]
    command += ["--tokens", "1e9", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    env.pop("CI", None)  # the pipe alone must turn the bars off
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = (proc.stdout + proc.stderr).splitlines()
    assert len(lines) <= 40, "\n".join(lines)
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert not any(line.startswith("planning ") for line in lines)

    doc = json.loads((out / "resources.json").read_text())
    assert (out / "plan.json").is_file() and doc["plan"] == "plan.json"
    chosen = [o for o in doc["options"] if o["chosen"]]
    assert len(chosen) == 1 and chosen[0]["label"] == doc["chosen"]
    assert chosen[0]["label"] in proc.stdout
    plan = json.loads((out / "plan.json").read_text())
    assert plan["predicted"]["step_time_s"] == pytest.approx(chosen[0]["step_time_s"])
    from planner.hardware.profiles import read_toml  # tomllib is 3.11+

    pool = read_toml(POOL, "pool")
    frac = pool.get("effective_time_fraction", 0.9)
    kinds = {n["name"]: n for n in pool["node"]}
    for o in doc["options"]:
        if not o["fits"] or o["mixed"]:
            continue
        node = kinds[o["kinds"][0]]
        steps = math.ceil(1e9 / o["tokens_per_step"])
        wall_s = steps * o["step_time_s"] / frac
        idle = node.get("gpu_idle_watts", node["gpu_busy_watts"])
        gpu_w = idle + (node["gpu_busy_watts"] - idle) * o["busy_share"]
        kwh = (o["gpus"] * gpu_w + o["nodes"] * node["node_watts"]) * wall_s * node["pue"] / 3.6e6
        assert o["steps"] == steps
        assert o["wall_h"] == pytest.approx(wall_s / 3600)
        assert o["cost_usd"] == pytest.approx(
            o["gpus"] * wall_s / 3600 * node["price_per_gpu_hour"]
        )
        assert o["energy_kwh"] == pytest.approx(kwh)
        assert o["carbon_kg"] == pytest.approx(kwh * node["carbon_g_per_kwh"] / 1000)
    assert set(doc["pareto"]) <= {o["label"] for o in doc["options"]}
    text = POOL.read_text().splitlines()
    cited = [f for f in doc["figures"] if f["line"] is not None]
    assert cited
    for f in cited:
        key, value = text[f["line"] - 1].split("#")[0].split("=")
        assert key.strip() == f["figure"] and float(value) == pytest.approx(f["value"])
