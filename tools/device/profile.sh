#!/usr/bin/env bash
# Nsight Compute on the device machine, from the repository root.
#
# usage: tools/device/profile.sh FAMILY LAYERS BATCH CONTEXT [cuda_model_bench ARGS...]
#   GPU time per kernel of one eager decode step of cuda_model_bench (--profile-step) on a
#   dummy model of a real preset's shapes (`moesh mkmodel --family FAMILY --preset real
#   --layers LAYERS --config_only`), under `ncu --metrics gpu__time_duration.sum` (kernels
#   one at a time), summed by tools/device/ncu_by_kernel.py: a markdown table, largest
#   share first (also $OUT/kernels_FAMILY_bBATCH.md; ncu's CSV in $OUT/ncu_FAMILY_bBATCH.csv).
#   Extra arguments go to cuda_model_bench.
#   e.g. tools/device/profile.sh v3.2 4 128 4096
# usage: tools/device/profile.sh --counters WHAT...
#   Nsight Compute's sections for single kernels (a summary of the telling lines printed,
#   the whole reports in $OUT/logs-profile.tgz):
#     grouped-gemm     the first four GroupedGemmKernel launches of cuda_grouped_gemm_test
#                      (V2-Lite shapes): SpeedOfLight, Occupancy, LaunchStats, MemoryWorkloadAnalysis
#     grouped-mxfp4    the MXFP4 GroupedGemmKernel at V4-Flash's gate_up, 256 tokens x top-6
#                      (cuda_model_bench --grouped-gemm-only): every section, the SASS page summed
#                      ($OUT/grouped_mxfp4.md)
#     grouped-fp8      the FP8 GroupedGemmKernel at V2-Lite's gate_up, 256 tokens x top-6, 32-row
#                      tiles (cuda_model_bench --shape v2-lite --grouped-gemm-only): every section,
#                      the SASS page summed ($OUT/grouped_fp8.md)
#     grouped-prefill  GroupedGemmKernel at prefill size (16384 tokens x top-6; launch 92 of
#                      cuda_model_bench --shape v2-lite --grouped-gemm-only), with compute,
#                      warp-state and scheduler sections
#     mla              the MLA decode kernel at batch 128 x 4096 with 16 and 128 heads (kernel_bench
#                      --mla H,128,4096; 128: the 64-head wgmma kernel): DRAM and L2 bytes,
#                      tensor-pipe use, warp stalls
#     mla-fp8          the same over FP8 rows, 16 heads (kernel_bench --mla-fp8 16,128,4096:
#                      MlaDecodeFp8Kernel), with instruction and occupancy sections
#     mla-wide         the 64-head kernel at batch 128 x 4096, 128 heads, over FP8 and bf16 rows
#                      (kernel_bench --mla-fp8 / --mla 128,128,4096) with source counters, the
#                      SASS page summed by setmaxnreg region (warpgroup 0, 1, the producer:
#                      tools/device/sass_by_region.py; $OUT/mla_wide_{fp8,bf16}.md)
#     decode-step      every kernel of one eager decode step at V2-Lite's shapes, batch 256,
#                      2048 tokens of context (cuda_model_bench --shape v2-lite --prefill-seqs 0
#                      --profile-step), by name ($OUT/decode_step_kernels.md)
# MOESH_DEVICE_BUDGET_S (540) bounds the call.
#
# bundle: cuda_model_bench and moesh (FAMILY form); for --counters: cuda_grouped_gemm_test
#   (grouped-gemm), cuda_model_bench (grouped-prefill, grouped-fp8, decode-step; grouped-mxfp4 with moesh),
#   kernel_bench (mla, mla-fp8,
#   mla-wide).
# e.g.
#   tools/device/bundle.sh build-cuda cuda_model_bench moesh
#   run: command "bash tools/device/profile.sh v3.2 4 128 4096", carry [".device"]
#   run: command "bash tools/device/profile.sh --counters grouped-prefill mla decode-step", carry [".device"]
set -uo pipefail
usage() { sed -n '2,/^set /p' "$0" | sed 's/^# \{0,1\}//' | head -n -1; }
(($# > 0)) || { usage; exit 2; }
[[ $1 == -h || $1 == --help ]] && { usage; exit 0; }
budget=${MOESH_DEVICE_BUDGET_S:-540}
source tools/device/steps.sh > /dev/null || exit 1
export MOESH_REQUIRE_CUDA=1
command -v ncu > /dev/null || { echo "profile.sh: no ncu on this machine" >&2; exit 1; }

if [[ $1 != --counters ]]; then
  family=${1:?family} layers=${2:?layers} batch=${3:?batch} context=${4:?context}
  shift 4
  dir=$(mktemp -d)
  $D/bin/moesh mkmodel --family "$family" --preset real --layers "$layers" --config_only --out "$dir" >/dev/null
  name=ncu_${family}_b${batch}
  step "$name" "$budget" ncu --csv --profile-from-start off --metrics gpu__time_duration.sum \
    $D/bin/cuda_model_bench --model "$dir" --load-format dummy --batch "$batch" --context "$context" --no-graphs \
    --profile-step --gpu-memory-utilization 0.95 "$@"
  cp "$LOGS/$name.log" "$OUT/$name.csv"
  python3 tools/device/ncu_by_kernel.py "$LOGS/$name.log" "one decode step, $family, $layers layers, batch $batch" \
    | tee "$OUT/kernels_${family}_b${batch}.md"
  finish > /dev/null
  exit 0
fi

# grouped_full NAME SKIP TITLE BENCH_ARGS...: one GroupedGemmKernel launch of
# `cuda_model_bench --grouped-gemm-only BENCH_ARGS` (SKIP launches in) with every section and
# source counters; its details in $LOGS/ncu_grouped_NAME_details.log and the SASS page summed
# by region ($OUT/grouped_NAME.md: stall reasons, opcodes by executed instructions).
grouped_full() {
  local name=$1 skip=$2 title=$3
  shift 3
  step ncu_grouped_$name 180 ncu --clock-control none -k regex:GroupedGemmKernel --launch-skip "$skip" \
    --launch-count 1 --set full --import-source yes -o "$LOGS/grouped_$name" \
    $D/bin/cuda_model_bench --load-format dummy --batch 1 --grouped-gemm-only "$@"
  ncu -i "$LOGS/grouped_$name.ncu-rep" --print-units base > "$LOGS/ncu_grouped_${name}_details.log" 2>&1
  ncu -i "$LOGS/grouped_$name.ncu-rep" --page source --csv --print-source sass > "$LOGS/sass_$name.csv" 2>&1
  python3 tools/device/sass_by_region.py "$LOGS/sass_$name.csv" "$title" | tee "$OUT/grouped_$name.md"
}

shift
record_env > /dev/null
for what in "$@"; do
  case $what in
    grouped-gemm)
      # Hardware counters of the first four grouped GEMM launches of the test (V2-Lite shapes).
      step ncu_grouped_gemm 120 ncu --clock-control none -k regex:GroupedGemmKernel -c 4 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
        $D/bin/cuda_grouped_gemm_test ;;
    grouped-prefill)
      # Launch order in --grouped-gemm-only: at 256 tokens 23 launches per k slice
      # (two k slices), then 23 MLP calls of two launches; then 16384 tokens
      # with 64-wide k slices: launch 92.
      sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats
                --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats)
      step ncu_grouped_prefill 80 ncu --clock-control none -k regex:GroupedGemmKernel --launch-skip 92 --launch-count 1 \
        "${sections[@]}" $D/bin/cuda_model_bench --load-format dummy --shape v2-lite --batch 1 --grouped-gemm-only ;;
    grouped-mxfp4)
      # The MXFP4 grouped GEMM at V4-Flash's gate_up (n 4096, k 4096, 256 experts), 256 tokens x
      # top-6 (16-row tiles, 256-wide slices). Launch order: at 256 tokens 23 launches a row
      # (3 warm-ups + 20), the MXFP4 row after four others (bf16 at 64 and 32 wide, FP8 at 128
      # and 64; the FP8-activation row's kernel is GroupedGemmFp8Kernel): launch 92 + 3.
      dir=$(mktemp -d)
      $D/bin/moesh mkmodel --family v4 --preset real --layers 2 --config_only --out "$dir" > /dev/null
      grouped_full mxfp4 95 "MXFP4 grouped GEMM, V4-Flash gate_up, 256 x 6" \
        --model "$dir" --quantization mxfp4 ;;
    grouped-fp8)
      # The FP8 grouped GEMM at V2-Lite's gate_up (n 2816, k 2048, 64 experts), 256 tokens x
      # top-6 (32-row tiles, 128-wide slices, four CTAs an SM): the "FP8 weights" row at 128,
      # the third GroupedGemmKernel row: launch 46 + 3.
      grouped_full fp8 49 "FP8 grouped GEMM, V2-Lite gate_up, 256 x 6" \
        --shape v2-lite --quantization fp8 ;;
    mla)
      # MLA decode at batch 128 x 4096: 16 heads (memory-bound) and 128 heads (the 64-head
      # wgmma kernel, MlaDecodeWideKernel): DRAM and L2 bytes per launch, warp stalls.
      for heads in 16 128; do
        step ncu_mla_$heads 60 ncu --clock-control none -k 'regex:MlaDecode(Wide)?Kernel' --launch-skip 3 --launch-count 1 \
          --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
          --section WarpStateStats --section SchedulerStats \
          --metrics dram__bytes_read.sum,lts__t_bytes.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
          $D/bin/kernel_bench --mla $heads,128,4096
      done ;;
    mla-fp8)
      # The same over FP8 rows (KvCacheDtype::kFp8, MlaDecodeFp8Kernel): 16 heads.
      step ncu_mla_fp8_16 60 ncu --clock-control none -k 'regex:MlaDecodeFp8Kernel' --launch-skip 3 --launch-count 1 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section SchedulerStats --section InstructionStats --section Occupancy \
        --metrics dram__bytes_read.sum,lts__t_bytes.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
        $D/bin/kernel_bench --mla-fp8 16,128,4096 ;;
    mla-wide)
      # Where each role's time goes: stall samples and instructions by setmaxnreg region.
      for kv in fp8 bf16; do
        flag=--mla-fp8; [[ $kv == bf16 ]] && flag=--mla
        step ncu_mla_wide_$kv 90 ncu --clock-control none -k 'regex:MlaDecodeWide' --launch-skip 3 \
          --launch-count 1 --set full --import-source yes -o "$LOGS/mla_wide_$kv" \
          $D/bin/kernel_bench $flag 128,128,4096
        ncu -i "$LOGS/mla_wide_$kv.ncu-rep" --page source --csv --print-source sass > "$LOGS/sass_$kv.csv" 2>&1
        python3 tools/device/sass_by_region.py "$LOGS/sass_$kv.csv" "MLA decode 128 x 4096, 128 heads, $kv rows" \
          | tee "$OUT/mla_wide_$kv.md"
      done ;;
    decode-step)
      # Every kernel of one eager decode step at batch 256 (2048 tokens of context), by name.
      step ncu_decode_step 150 ncu --csv --print-units base --profile-from-start off --metrics gpu__time_duration.sum \
        $D/bin/cuda_model_bench --load-format dummy --shape v2-lite --batch 256 --context 2048 --no-graphs \
        --prefill-seqs 0 --profile-step
      python3 tools/device/ncu_by_kernel.py "$LOGS/ncu_decode_step.log" > "$OUT/decode_step_kernels.md" 2>&1 ;;
    *) echo "profile.sh: unknown counters $what (grouped-gemm grouped-mxfp4 grouped-prefill mla mla-fp8 mla-wide decode-step)" >&2 ;;
  esac
done
finish
for f in ncu_grouped_gemm ncu_grouped_mxfp4_details ncu_grouped_fp8_details ncu_grouped_prefill ncu_mla_16 ncu_mla_128 ncu_mla_fp8_16; do
  show "$f" "Kernel|GroupedGemm|dram__bytes|lts__t_bytes|hmma|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Grid Size|Block Size|Executed Ipc|Issue Slots Busy|Tensor|Stall|No Eligible|One or More" \
    | head -40
done
[[ -f $OUT/decode_step_kernels.md ]] && { echo; echo "==== one decode step at batch 256, by kernel"; head -40 "$OUT/decode_step_kernels.md"; }
