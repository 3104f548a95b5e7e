#!/usr/bin/env bash
# On the device machine, from the repository root, after
#   scripts/device/bundle.sh BUILD_DIR cuda_grouped_gemm_test cuda_model_test cuda_model_bench [cuda_ops_test]
# here and `run` with carry [".device"]: the CUDA model's tests (goldens
# against the CPU engine and transformers), then `cuda_model_bench` at
# DeepSeek-V2-Lite's shapes, then compute-sanitizer memcheck on the grouped
# GEMM test and Nsight Compute's counters of the grouped GEMM. Extra
# arguments go to the bench. Logs land in $OUT; the summary
# and the bench's tables are printed last.
set -uo pipefail
budget=${MOESH_DEVICE_BUDGET_S:-280}  # stay inside run's 600 s
source scripts/device/steps.sh || exit 1
export MOESH_REQUIRE_CUDA=1
export MOESH_SOURCE_DIR=$PWD  # the goldens, in this checkout
record_env


for t in cuda_grouped_gemm_test cuda_model_test cuda_ops_test; do
  [[ -x $D/bin/$t ]] && step "$t" 120 $D/bin/$t
done
step cuda_model_bench 150 $D/bin/cuda_model_bench --device cuda --load-format dummy --shape v2-lite "$@"
# What the graphs buy: the same decode steps launched one kernel at a time.
step cuda_model_bench_nographs 60 $D/bin/cuda_model_bench --device cuda --load-format dummy --shape v2-lite \
  --batch 1,32 --no-graphs --prefill-seqs 0
if [[ -x $D/bin/cuda_grouped_gemm_test ]]; then
  step memcheck_grouped_gemm 90 compute-sanitizer --tool memcheck --error-exitcode 99 $D/bin/cuda_grouped_gemm_test
  step memcheck_model_v2_lite 90 compute-sanitizer --tool memcheck --error-exitcode 99 $D/bin/cuda_model_test \
    '--gtest_filter=*Golden*/0:*RejectsBadSteps*'
  # Hardware counters of the first four grouped GEMM launches of the test (V2-Lite shapes).
  command -v ncu > /dev/null && step ncu_grouped_gemm 120 ncu --clock-control none -k regex:GroupedGemmKernel -c 4 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    $D/bin/cuda_grouped_gemm_test
fi

cp "$LOGS/cuda_model_bench.log" "$LOGS/cuda_model_test.log" "$LOGS/ncu_grouped_gemm.log" "$OUT/" 2>/dev/null
finish
echo
echo "==== cuda_model_test"
grep -E '^(v2|v3|real widths)|OK \]|FAILED \]' "$LOGS/cuda_model_test.log"
echo
echo "==== cuda_model_bench --no-graphs"
grep -E '^\| (1|32) \|' "$LOGS/cuda_model_bench_nographs.log" | head -2
echo
echo "==== cuda_model_bench"
cat "$LOGS/cuda_model_bench.log"
