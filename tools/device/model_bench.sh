#!/usr/bin/env bash
# The engine-level benchmarks on the device machine, from the repository root:
# cuda_model_bench (decode steps against the HBM floor measured in the same run,
# a sampled row, the phase profile of an eager step, the grouped GEMM alone, prefill)
# on a dummy model of a real DeepSeek shape, and optionally kernel_bench (the
# ceilings, MLA decode, the GEMMs, the small ops, the GPU sampler) and the same
# V2-Lite shapes through transformers (hf_baseline.py) for the side-by-side ratio.
#
# usage: tools/device/model_bench.sh [MODEL] [OPTIONS] [cuda_model_bench ARGS...]
#   MODEL (one of):
#     --shape S            cuda_model_bench --device cuda --load-format dummy --shape S
#                          (default: --shape v2-lite, DeepSeek-V2-Lite's shapes)
#     --family F [--preset P] [--layers L]
#                          `moesh mkmodel --family F --preset P (real) [--layers L]
#                          --config_only` into a scratch directory, then
#                          cuda_model_bench --model DIR --load-format dummy (weights made on
#                          the GPU from config.json; F: v2-lite v3 v3.2 v4 ...)
#   OPTIONS:
#     --nographs           also the same decode at batch 1,32 with --no-graphs
#                          --prefill-seqs 0 (what the CUDA graphs buy)
#     --kernels            also kernel_bench, first; --kernel-args 'ARGS' passes ARGS to
#                          it (--quick, or --mla HEADS,BATCH,CONTEXT)
#     --no-model           leave out cuda_model_bench (with --kernels / --hf)
#     --hf                 also tools/device/hf_baseline.py (transformers, V2-Lite shapes,
#                          bf16 eager; needs torch + transformers on the device) with
#                          --batch 1,32 --context 2048; --hf-args 'ARGS' replaces those
#   every other argument goes to cuda_model_bench (--batch, --context, --steps, --warmup,
#   --prefill-seqs, --prefill-len, --gpu-memory-utilization, --no-graphs, --seed,
#   --grouped-gemm-only, --profile-step, --mla-prefill, --mla-prefill-impl, --sparse-mla,
#   --indexer, --mla-kernel, --kv-cache-dtype, --fp8-gemv, --fp8-expert-act).
# The tests the old per-topic scripts ran beside their benches are tools/device/tests.sh's
# (kernels, model); the Nsight Compute runs are tools/device/profile.sh's.
# Logs land in $OUT (cuda_model_bench.log, kernel_bench.log, hf_baseline.log and .json,
# logs-model_bench.tgz); the tables are printed last. MOESH_DEVICE_BUDGET_S (560) bounds the call.
#
# bundle: cuda_model_bench; moesh with --family; kernel_bench with --kernels.
# The runs in BENCHMARKS.md:
#   V2-Lite decode 1..256 + transformers + kernels (issue 4):
#     model_bench.sh --kernels --hf --batch 1,32,128,256 --context 2048
#   decode after a change, no prefill:  model_bench.sh --batch 1,128,256 --context 2048 --prefill-seqs 0
#   V4-Flash, 8 of 43 layers:  model_bench.sh --family v4 --layers 8 --batch 1,32,128 --context 2048 \
#     --steps 10 --warmup 2 --prefill-seqs 2 --prefill-len 2048 --gpu-memory-utilization 0.95
#   V3.2-Exp, 6 layers:  model_bench.sh --family v3.2 --layers 6 --batch 1,32,128 --context 4096 \
#     --steps 5 --warmup 1 --prefill-seqs 1 --prefill-len 4096 --gpu-memory-utilization 0.95
#   MLA prefill, absorbed against expanded (issue 18 item 3; run each, same machine):
#     model_bench.sh --kernels --kernel-args --mla-prefill-table --batch 1 --context 0 --steps 2 \
#       --prefill-seqs 4 --prefill-len 4096 --mla-prefill absorbed
#     model_bench.sh --batch 1 --context 0 --steps 2 --prefill-seqs 4 --prefill-len 4096 \
#       --mla-prefill expanded     (and --family v3 --layers 4 for V3's 128 heads)
#   V3.2 sparse attention, the gathered copy against the direct read (issue 18 item 4):
#     model_bench.sh --family v3.2 --layers 6 --batch 1,32,128 --context 16384 --steps 5 \
#       --warmup 1 --prefill-seqs 1 --prefill-len 16384 --sparse-mla gather   (then direct, the
#       default; and --indexer cuda-cores against the tensor-core default)
#   FP8 weights, the experts on FP8 activations and the decode-size GEMV against the widening
#   path and cuBLASLt (issue 17; the expert-GEMM table has the FP8 x FP8 rows either way):
#     model_bench.sh --quantization fp8 --batch 1,32,256 --context 2048 --prefill-seqs 2 \
#       --prefill-len 2048 [--fp8-gemv on --fp8-expert-act on]
# e.g.
#   tools/device/bundle.sh build-cuda cuda_model_bench kernel_bench moesh
#   run: command "bash tools/device/model_bench.sh --kernels --batch 1,32,128,256 --context 2048",
#        carry [".device"]
set -uo pipefail
budget=${MOESH_DEVICE_BUDGET_S:-560}
shape=v2-lite family='' preset=real layers='' nographs='' kernels='' kernel_args='' model=1 hf='' \
  hf_args='--batch 1,32 --context 2048'
args=()
while (($# > 0)); do
  case $1 in
    --shape) shape=${2:?--shape S}; shift 2 ;;
    --family) family=${2:?--family F}; shift 2 ;;
    --preset) preset=${2:?--preset P}; shift 2 ;;
    --layers) layers=${2:?--layers L}; shift 2 ;;
    --nographs) nographs=1; shift ;;
    --kernels) kernels=1; shift ;;
    --kernel-args) kernels=1; kernel_args=${2?--kernel-args ARGS}; shift 2 ;;
    --no-model) model=''; shift ;;
    --hf) hf=1; shift ;;
    --hf-args) hf=1; hf_args=${2?--hf-args ARGS}; shift 2 ;;
    -h|--help) sed -n '2,/^set /p' "$0" | sed 's/^# \{0,1\}//' | head -n -1; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
source tools/device/steps.sh || exit 1
export MOESH_REQUIRE_CUDA=1
record_env

if [[ -n $family ]]; then
  dir=$(mktemp -d)
  $D/bin/moesh mkmodel --family "$family" --preset "$preset" ${layers:+--layers "$layers"} --config_only \
    --out "$dir" > "$LOGS/mkmodel.log" 2>&1 || { cat "$LOGS/mkmodel.log"; exit 1; }
  what=(--model "$dir" --load-format dummy)
else
  what=(--device cuda --load-format dummy --shape "$shape")
fi
[[ -n $kernels ]] && step kernel_bench 200 $D/bin/kernel_bench $kernel_args
[[ -n $model ]] && step cuda_model_bench 300 $D/bin/cuda_model_bench "${what[@]}" "${args[@]}"
# What the graphs buy: the same decode steps launched one kernel at a time.
[[ -n $nographs ]] && step cuda_model_bench_nographs 60 $D/bin/cuda_model_bench "${what[@]}" \
  --batch 1,32 --no-graphs --prefill-seqs 0
[[ -n $hf ]] && step hf_baseline 150 python3 tools/device/hf_baseline.py $hf_args --out "$OUT/hf_baseline.json"

cp "$LOGS"/kernel_bench.log "$LOGS"/cuda_model_bench.log "$LOGS"/hf_baseline.log "$OUT/" 2>/dev/null
finish
[[ -f $LOGS/hf_baseline.log ]] && { echo; echo "==== hf_baseline"; tail -n 15 "$LOGS/hf_baseline.log"; }
show kernel_bench
show cuda_model_bench_nographs '^\| (1|32) \|'
show cuda_model_bench
