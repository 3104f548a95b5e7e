#!/usr/bin/env bash
# On the device machine, from the repository root, after
#   scripts/device/bundle.sh build-cuda kernel_bench cuda_model_bench cuda_sample_test cuda_grouped_gemm_test \
#     cuda_routing_test
# here and `run` with carry [".device"]: issue 4's measurements in one call —
#  * kernel_bench: the ceilings, MLA decode (16 heads at 2048/4096/8192, 128
#    heads at 4096), the GEMMs, the small ops and the GPU sampler;
#  * cuda_model_bench at DeepSeek-V2-Lite's shapes (dummy weights): decode at
#    batch 1/32/128/256 with 2048 tokens of context against the floor, a
#    sampled decode row, the grouped GEMM alone, prefill of 8 x 2048;
#  * the same model config through transformers 5.17 (bf16, eager) at batch
#    1 and 32, 2048 tokens of context (scripts/device/hf_baseline.py; not
#    with MOESH_SKIP_HF=1);
#  * Nsight Compute on the grouped GEMM at prefill size (16384 tokens x
#    top-6), the profile behind its gap to cuBLAS; on MLA decode at batch
#    128 x 4096 with 16 and 128 heads (bytes from DRAM and L2).
# Logs land in $OUT; the tables are printed last.
set -uo pipefail
budget=${MOESH_DEVICE_BUDGET_S:-570}
source scripts/device/steps.sh || exit 1
record_env
export MOESH_REQUIRE_CUDA=1
if [[ -x $D/bin/cuda_routing_test ]]; then  # greedy + top-k log-probabilities, the MoE gate
  step cuda_routing_test 60 $D/bin/cuda_routing_test
  step memcheck_routing 90 compute-sanitizer --tool memcheck --print-limit 5 --error-exitcode 99 $D/bin/cuda_routing_test
fi
if [[ -x $D/bin/cuda_sample_test ]]; then
  step cuda_sample_test 60 $D/bin/cuda_sample_test
  step memcheck_sample 90 compute-sanitizer --tool memcheck --print-limit 5 --error-exitcode 99 $D/bin/cuda_sample_test
  # The sampler's SASS, where a sanitizer report needs it.
  if [[ $(grep -c 'rc=0 ' <<< "${summary[-1]}") == 0 ]] && command -v cuobjdump > /dev/null; then
    cuobjdump -sass $D/bin/cuda_sample_test | awk '/Function : .*SampleKernel/,/^[[:space:]]*\.{10}/' \
      > "$OUT/sample_kernel.sass" 2>&1
  fi
fi
if [[ -x $D/bin/cuda_grouped_gemm_test ]]; then  # the grouped kernel and the expert MLP's two paths
  step cuda_grouped_gemm_test 60 $D/bin/cuda_grouped_gemm_test
  step memcheck_grouped_gemm 120 compute-sanitizer --tool memcheck --print-limit 5 --error-exitcode 99 \
    $D/bin/cuda_grouped_gemm_test
fi
step kernel_bench 120 $D/bin/kernel_bench
step cuda_model_bench 170 $D/bin/cuda_model_bench --device cuda --load-format dummy --shape v2-lite \
  --batch 1,32,128,256 --context 2048
[[ -z ${MOESH_SKIP_HF:-} ]] && step hf_baseline 150 python3 scripts/device/hf_baseline.py --batch 1,32 --context 2048 --out "$OUT/hf_baseline.json"
if command -v ncu > /dev/null; then
  # Launch order in --grouped-gemm-only: at 256 tokens 23 launches per k slice
  # (two k slices), then 23 MLP calls of two launches; then 16384 tokens
  # with 64-wide k slices: launch 92.
  sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats
            --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats)
  step ncu_grouped_prefill 80 ncu --clock-control none -k regex:GroupedGemmKernel --launch-skip 92 --launch-count 1 \
    "${sections[@]}" $D/bin/cuda_model_bench --load-format dummy --shape v2-lite --batch 1 --grouped-gemm-only
  # Every kernel of one eager decode step at batch 256 (2048 tokens of context), by name.
  step ncu_decode_step 150 ncu --csv --print-units base --profile-from-start off --metrics gpu__time_duration.sum \
    $D/bin/cuda_model_bench --load-format dummy --shape v2-lite --batch 256 --context 2048 --no-graphs \
    --prefill-seqs 0 --profile-step
  python3 scripts/device/ncu_by_kernel.py "$LOGS/ncu_decode_step.log" > "$OUT/decode_step_kernels.md" 2>&1
  # MLA decode at batch 128 x 4096: 16 heads (memory-bound) and 128 heads (DRAM and L2 bytes per launch).
  for heads in 16 128; do
    step ncu_mla_$heads 60 ncu --clock-control none -k regex:MlaDecodeKernel --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      --metrics dram__bytes_read.sum,lts__t_bytes.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
      $D/bin/kernel_bench --mla $heads,128,4096
  done
fi
cp "$LOGS"/kernel_bench.log "$LOGS"/cuda_model_bench.log "$LOGS"/hf_baseline.log "$OUT/" 2>/dev/null
finish
echo
echo "==== ncu (grouped GEMM, prefill size)"
for f in ncu_grouped_prefill ncu_mla_16 ncu_mla_128; do
  echo "== $f"
  grep -E "Kernel|GroupedGemm|dram__bytes|lts__t_bytes|hmma|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Grid Size|Block Size|Executed Ipc|Issue Slots Busy|Tensor|Stall|No Eligible|One or More" \
    "$LOGS/$f.log" 2>/dev/null | head -40
done
echo "==== one decode step at batch 256, by kernel"
cat "$OUT/decode_step_kernels.md" 2>/dev/null | head -40
echo "==== hf_baseline"
tail -n 15 "$LOGS/hf_baseline.log"
echo "==== kernel_bench"
cat "$LOGS/kernel_bench.log"
echo "==== cuda_model_bench"
cat "$LOGS/cuda_model_bench.log"
