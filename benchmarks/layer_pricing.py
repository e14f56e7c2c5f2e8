"""How meshplan prices one transformer layer across weight layouts and attention forms.

GPT-2 (transformers' Conv1D: weight stored [in, out], fused QKV) and OPT (nn.Linear) layers of
the same shape should cost the same at every TP degree; an OPT layer with eager attention
(matmul-softmax-matmul with masks) should cost the SDPA layer plus the time its explicit score
tensors take: on every rank where the plan runs attention replicated, else split by heads.
Each configuration is planned with the layer count, TP degree and recompute pinned on
A100-80GB (one TP group, no pipeline, no data parallelism), and the first layer's priced time
per micro-batch is read from plan.json.

    python benchmarks/layer_pricing.py        # writes reports/benchmarks/layer_pricing.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.api import plan  # noqa: E402
from planner.search import Pins  # noqa: E402

MODEL = ROOT / "benchmarks" / "models" / "hf_shapes.py"
OUT = ROOT / "reports" / "benchmarks" / "layer_pricing.json"
DEGREES = (1, 2, 4, 8)


def layer_time(kind: str, attn: str, tp: int) -> tuple[float, dict]:
    result = plan(
        MODEL,
        tp,
        model_args={"kind": kind, "attn": attn, "layers": 2},
        profile="a100-80g",
        pins=Pins(tp=tp, pp=1, dp=1, recompute="none", micro_batch_size=1),
    )
    layer = next(b for b in result.plan.blocks if b.block_class in ("GPT2Block", "OPTDecoderLayer"))
    return layer.time_per_microbatch_s, dict(layer.tp_plan)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.strip().splitlines()[0]).parse_args()
    rows = []
    for tp in DEGREES:
        row = {"tp": tp}
        for kind, attn in (("gpt2", "sdpa"), ("opt", "sdpa"), ("opt", "eager")):
            seconds, styles = layer_time(kind, attn, tp)
            row[f"{kind}_{attn}_ms"] = round(seconds * 1e3, 4)
            row[f"{kind}_{attn}_styles"] = styles
        row["gpt2_vs_opt"] = round(row["gpt2_sdpa_ms"] / row["opt_sdpa_ms"] - 1, 4)
        rows.append(row)
        print(
            f"tp {tp}: gpt2 {row['gpt2_sdpa_ms']:.3f} ms, opt {row['opt_sdpa_ms']:.3f} ms "
            f"({row['gpt2_vs_opt']:+.1%}), opt eager {row['opt_eager_ms']:.3f} ms",
            flush=True,
        )
    extra1 = rows[0]["opt_eager_ms"] - rows[0]["opt_sdpa_ms"]
    for row in rows:
        # the eager path's extra time at TP 1, on every rank (attention run replicated, as
        # where the planner gathers OPT's projections) or split by heads
        for how, share in (("replicated", 1), ("sharded", row["tp"])):
            want = row["opt_sdpa_ms"] + extra1 / share
            row[f"eager_vs_sdpa_plus_extra_{how}"] = round(row["opt_eager_ms"] / want - 1, 4)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(rows, indent=1) + "\n")
    for row in rows:
        rep = row["eager_vs_sdpa_plus_extra_replicated"]
        shard = row["eager_vs_sdpa_plus_extra_sharded"]
        print(
            f"tp {row['tp']}: eager vs sdpa + extra on every rank {rep:+.1%}, "
            f"+ extra/tp {shard:+.1%}"
        )
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
