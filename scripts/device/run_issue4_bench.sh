#!/usr/bin/env bash
# On the device machine, from the repository root, after
#   scripts/device/bundle.sh build-cuda kernel_bench cuda_model_bench
# here and `run` with carry [".device"]: issue 4's measurements in one call —
#  * kernel_bench: the ceilings, MLA decode (16 heads at 2048/4096/8192, 128
#    heads at 4096), the GEMMs, the small ops and the GPU sampler;
#  * cuda_model_bench at DeepSeek-V2-Lite's shapes (dummy weights): decode at
#    batch 1/32/128/256 with 2048 tokens of context against the floor, a
#    sampled decode row, the grouped GEMM alone, prefill of 8 x 2048;
#  * the same model config through transformers 5.17 (bf16, eager) at batch
#    1 and 32, 2048 tokens of context (scripts/device/hf_baseline.py);
#  * Nsight Compute on the grouped GEMM and on cuBLAS at prefill size
#    (16384 tokens x top-6), the profile behind the gap.
# Logs land in $OUT; the tables are printed last.
set -uo pipefail
budget=${MOESH_DEVICE_BUDGET_S:-570}
source scripts/device/steps.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem --format=csv \
  > "$LOGS/env.txt" 2>&1
cat "$D/MANIFEST" >> "$LOGS/env.txt"
cat "$LOGS/env.txt"
step kernel_bench 120 $D/bin/kernel_bench
step cuda_model_bench 170 $D/bin/cuda_model_bench --device cuda --load-format dummy --shape v2-lite \
  --batch 1,32,128,256 --context 2048
step hf_baseline 150 python3 scripts/device/hf_baseline.py --batch 1,32 --context 2048 --out "$OUT/hf_baseline.json"
if command -v ncu > /dev/null; then
  # Launch order in --grouped-gemm-only: 256 tokens (23 launches per k slice,
  # two k slices), then 16384 tokens with 64-wide k slices: launch 46.
  sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats
            --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats)
  step ncu_grouped_prefill 80 ncu --clock-control none -k regex:GroupedGemmKernel --launch-skip 46 --launch-count 1 \
    "${sections[@]}" $D/bin/cuda_model_bench --load-format dummy --shape v2-lite --batch 1 --grouped-gemm-only
  # The dense cuBLAS GEMM of the same FLOPs: the 24th GEMM-named launch (after 23 at 256 tokens).
  step ncu_dense_prefill 80 ncu --clock-control none -k regex:'nvjet|sm90|gemm|Gemm' --launch-skip 23 \
    --launch-count 1 "${sections[@]}" $D/bin/cuda_model_bench --load-format dummy --shape v2-lite --batch 1 \
    --grouped-gemm-only
fi
cp "$LOGS"/kernel_bench.log "$LOGS"/cuda_model_bench.log "$LOGS"/hf_baseline.log "$OUT/" 2>/dev/null
finish
echo
echo "==== ncu (grouped, then dense)"
for f in ncu_grouped_prefill ncu_dense_prefill; do
  grep -E "Kernel|GroupedGemm|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Grid Size|Block Size|Executed Ipc|Issue Slots Busy|Tensor|Stall|No Eligible|One or More" \
    "$LOGS/$f.log" 2>/dev/null | head -40
done
echo "==== hf_baseline"
tail -n 15 "$LOGS/hf_baseline.log"
echo "==== kernel_bench"
cat "$LOGS/kernel_bench.log"
echo "==== cuda_model_bench"
cat "$LOGS/cuda_model_bench.log"
