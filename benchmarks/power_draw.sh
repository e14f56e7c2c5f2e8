#!/bin/bash
# Power draw of one GPU, read by nvidia-smi: idle with no process, under a bf16 GEMM loop, during
# 40 training steps of the prepared suite's Llama-1B plan (and its build, a CUDA context held
# with no kernel running), and idle again. Run on the GPU machine after
# `python benchmarks/gpu_accuracy.py prepare` here:
#
#     bash benchmarks/power_draw.sh OUTDIR [PREPARED_DIR]
#
# The energy model's busy-share rule and the H200 idle figure in profiles/pools/ come from its
# run of 2026-11-27 (reports/power/).
set -u
OUTD=$1
mkdir -p "$OUTD"
Q="--query-gpu=timestamp,power.draw,clocks.sm,utilization.gpu,temperature.gpu --format=csv,noheader,nounits"
nvidia-smi --query-gpu=name,power.limit,power.default_limit --format=csv > $OUTD/gpu.txt
nvidia-smi $Q -lms 500 > $OUTD/idle_before.csv & P=$!; sleep 6; kill $P
nvidia-smi $Q -lms 250 > $OUTD/gemm.csv & P=$!
python3 - <<'PY'
import torch, time
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
c = torch.empty_like(a)
torch.cuda.synchronize(); t0 = time.time(); n = 0
while time.time() - t0 < 12:
    for _ in range(50):
        torch.mm(a, b, out=c)
    torch.cuda.synchronize(); n += 50
dt = time.time() - t0
print(f"gemm 8192^3 bf16: {2 * 8192**3 * n / dt / 1e12:.0f} TFLOP/s over {dt:.1f} s")
PY
kill $P
sleep 3
nvidia-smi $Q -lms 250 > $OUTD/train.csv & P=$!
python3 benchmarks/gpu_accuracy.py measure --dir "${2:-.device/gpu-accuracy}" --out $OUTD/train --only "llama-1b mb8 none" --steps 40 2>&1 | grep -E "step (1|20|40)/|training"
kill $P
nvidia-smi $Q -lms 500 > $OUTD/idle_after.csv & P=$!; sleep 8; kill $P
echo done
