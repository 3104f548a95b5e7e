#!/usr/bin/env bash
# On a device machine (nvidia-h200), from the repository root, after
#   scripts/device/bundle.sh build-cuda cuda_model_test cuda_backends_test cuda_model_bench moesh moesh_router \
#     moesh_prefill_worker moesh_decode_worker moesh_expert_worker libmoesh_cuda_backends.so
# here and `run` with carry [".device"]: DeepSeek-V4 on the CUDA model —
#  * cuda_model_test (the v4 and v4_legacy goldens against transformers and
#    the CPU engine: teacher-forced, chunked prefill, free-running with graphs),
#    and the v4 golden under compute-sanitizer memcheck;
#  * the GPU cluster (prefill, decode and expert workers) on the v4 golden
#    against generate --device cuda;
#  * cuda_backends_test (nothing else moved);
#  * cuda_model_bench on V4-Flash's shapes at MOESH_V4_LAYERS (8) layers,
#    dummy weights.
# Logs land in $OUT; the summary is printed last.
set -uo pipefail
budget=${MOESH_DEVICE_BUDGET_S:-560}
source scripts/device/steps.sh || exit 1
export MOESH_REQUIRE_CUDA=1 MOESH_SOURCE_DIR=$PWD
record_env
step cuda_model_test 150 $D/bin/cuda_model_test
step memcheck_v4 120 compute-sanitizer --tool memcheck --error-exitcode 1 $D/bin/cuda_model_test \
  --gtest_filter='*CudaGoldenTest*/4'
step cluster_v4 90 tests/integration/cuda_cluster_test.sh $D/bin/moesh "$PWD" v4
step cuda_backends_test 90 $D/bin/cuda_backends_test
dir=$(mktemp -d)
$D/bin/moesh mkmodel --family v4 --preset real --layers "${MOESH_V4_LAYERS:-8}" --config-only --out "$dir" >/dev/null
step bench_v4_flash 240 $D/bin/cuda_model_bench --model "$dir" --load-format dummy --batch 1,32,128 --context 2048 \
  --steps 10 --warmup 2 --prefill-seqs 2 --prefill-len 2048 --gpu-memory-utilization 0.95
for f in cuda_model_test; do
  [[ -f $LOGS/$f.log ]] && grep -E "^v4|max \|logprob|FAILED|Failure" "$LOGS/$f.log" | head -20
done
[[ -f $LOGS/cluster_v4.log ]] && grep -E "tokens equal|PASS|FAIL" "$LOGS/cluster_v4.log"
[[ -f $LOGS/bench_v4_flash.log ]] && grep -v "^\s*$" "$LOGS/bench_v4_flash.log" | head -60
finish
