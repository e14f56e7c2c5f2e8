"""A linear layer's forward and backward GEMMs on a GPU against the cost model's rates by shape.

    python benchmarks/linear_shapes.py measure --out DIR                 # on the GPU machine
    python benchmarks/linear_shapes.py report --measured DIR --profile measured/h100-x1

The cost model prices a product over inner dimension K at ``matmul_efficiency`` of the peak
times K / (K + ``matmul_half_inner_dim``), and a weight's backward as two GEMMs of the forward's
FLOPs, one over N (the input's gradient) and one over the tokens M (the weight's)
(``cost.compute.inner_dim_slowdowns``). ``plan calibrate`` fits both from square products and
short-K ones; this measures what a training step's own shapes reach: ``F.linear`` forward, then
its backward through autograd (both GEMMs), each timed with CUDA events (median of repeats after
a warm-up), in bf16, on fresh random data. ``report`` sets each against the model's time for
the same shape on the given profile.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpu_accuracy import median_seconds  # noqa: E402 - beside this script

# (tokens M, in K, out N): Llama-3.2-1B and 3B projections at 4,096 and 16,384 tokens, the
# 128,256-word head, GPT-1.3B's fused QKV and MLP
SHAPES = [
    (m, k, n)
    for m in (4096, 16384)
    for k, n in (
        (2048, 2048),
        (2048, 512),
        (2048, 8192),
        (8192, 2048),
        (3072, 3072),
        (3072, 1024),
        (3072, 8192),
        (8192, 3072),
        (2048, 6144),
        (2048, 128256),
    )
]


def _one_shape(m: int, k: int, n: int, reps: int) -> dict:
    import torch
    import torch.nn.functional as F

    opts = {"device": "cuda", "dtype": torch.bfloat16}
    x = torch.randn(m, k, **opts, requires_grad=True)
    w = torch.randn(n, k, **opts, requires_grad=True)
    dy = torch.randn(m, n, **opts)
    fwd = median_seconds(lambda: F.linear(x, w), reps)
    y = F.linear(x, w)

    def backward() -> None:
        x.grad = w.grad = None
        y.backward(dy, retain_graph=True)

    flops = 2.0 * m * k * n
    bwd = median_seconds(backward, reps)
    return {
        "m": m, "k": k, "n": n, "fwd_s": fwd, "bwd_s": bwd,
        "dgrad_s": median_seconds(lambda: dy @ w, reps),  # [M, N] x [N, K]: over N
        "wgrad_s": median_seconds(lambda: dy.t() @ x, reps),  # [N, M] x [M, K]: over M
        "fwd_tflops": flops / fwd / 1e12, "bwd_tflops": 2 * flops / bwd / 1e12,
    }  # fmt: skip


def measure(args: argparse.Namespace) -> int:
    import torch

    rows = []
    for m, k, n in SHAPES:
        r = _one_shape(m, k, n, args.reps)
        rows.append(r)
        print(
            f"M {m:6d} K {k:5d} N {n:6d}: fwd {r['fwd_s'] * 1e3:7.3f} ms "
            f"({r['fwd_tflops']:4.0f} TFLOP/s)  bwd {r['bwd_s'] * 1e3:7.3f} ms "
            f"({r['bwd_tflops']:4.0f})  dgrad {r['dgrad_s'] * 1e3:7.3f}  wgrad "
            f"{r['wgrad_s'] * 1e3:7.3f}",
            flush=True,
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "reps": args.reps}
    (out / "linear_shapes.json").write_text(json.dumps({"info": info, "rows": rows}, indent=1))
    return 0


def model_times(m: int, k: int, n: int, profile: str) -> tuple[float, float]:
    """(forward, backward) seconds the cost model gives a bf16 linear of this shape."""
    from planner.cost.compute import achievable_peak, inner_dim_slowdowns
    from planner.hardware.cluster import make_cluster

    cluster, _ = make_cluster(1, profile, None, None)
    f, b = inner_dim_slowdowns([k, n, m, False], 1.0, cluster.profile.matmul_half_inner_dim)
    flops = 2.0 * m * k * n
    rate = achievable_peak(cluster, "bf16")
    return flops * f / rate, 2 * flops * b / rate


def report(args: argparse.Namespace) -> int:
    data = json.loads((Path(args.measured) / "linear_shapes.json").read_text())
    print(f"{data['info']['gpu']}, torch {data['info']['torch']}; model: {args.profile}")
    print(
        f"{'M':>6s} {'K':>6s} {'N':>7s} {'fwd ms':>8s} {'model':>8s} {'bwd ms':>8s} {'model':>8s}"
    )
    errs_f, errs_b = [], []
    for r in data["rows"]:
        mf, mb = model_times(r["m"], r["k"], r["n"], args.profile)
        errs_f.append(mf / r["fwd_s"] - 1)
        errs_b.append(mb / r["bwd_s"] - 1)
        print(
            f"{r['m']:6d} {r['k']:6d} {r['n']:7d} {r['fwd_s'] * 1e3:8.3f} {mf * 1e3:8.3f} "
            f"{r['bwd_s'] * 1e3:8.3f} {mb * 1e3:8.3f}  ({errs_f[-1]:+.1%}, {errs_b[-1]:+.1%})"
        )
    print(
        f"model over measured, median: forward {statistics.median(errs_f):+.1%}, "
        f"backward {statistics.median(errs_b):+.1%}"
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="phase", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", required=True)
    m.add_argument("--reps", type=int, default=20)
    r = sub.add_parser("report")
    r.add_argument("--measured", required=True)
    r.add_argument("--profile", default="measured/h100-x1")
    args = ap.parse_args()
    return measure(args) if args.phase == "measure" else report(args)


if __name__ == "__main__":
    sys.exit(main())
