#!/usr/bin/env bash
# On the device machine, from the repository root, after
#   scripts/device/bundle.sh BUILD_DIR cuda_backends_test transport_test moesh moesh_router \
#     moesh_prefill_worker moesh_decode_worker moesh_expert_worker libmoesh_cuda_backends.so
# here and `run` with carry [".device"]: the cuda_ipc transport on one GPU —
# the device-resident dispatch against the host path (cuda_backends_test),
# the transport contract (transport_test), the whole cluster over cuda_ipc
# against `moesh generate --device cuda` (cuda_cluster_test.sh, attention and
# expert processes sharing the GPU), then `moesh bench --serving` at
# DeepSeek-V2-Lite's shapes (dummy weights): colocated against the cluster
# over grpc and over cuda_ipc. MOESH_ONLY_BENCH=1 skips the tests.
# Logs land in $OUT; the summary and the bench table are printed last.
set -uo pipefail
budget=${MOESH_DEVICE_BUDGET_S:-560}
source scripts/device/steps.sh || exit 1
export MOESH_REQUIRE_CUDA=1
export MOESH_SOURCE_DIR=$PWD
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv > "$LOGS/env.txt" 2>&1
cat "$D/MANIFEST" >> "$LOGS/env.txt"
cat "$LOGS/env.txt"

if [[ -z ${MOESH_ONLY_BENCH:-} ]]; then
  step cuda_backends_test 150 $D/bin/cuda_backends_test
  step transport_test 90 $D/bin/transport_test
  MOESH_TRANSPORT=cuda_ipc step cuda_cluster_ipc 200 tests/integration/cuda_cluster_test.sh $D/bin/moesh "$PWD"
fi
real=/tmp/v2-lite-real
$D/bin/moesh mkmodel --family v2-lite --preset real --config-only --out $real > "$LOGS/mkmodel.log" 2>&1
breal=(--serving --model $real --load-format dummy --prompt-len 64 --max-new-tokens 32 --requests 128
       --concurrency ${MOESH_CONCURRENCY:-32,128})
step bench_real_ipc 300 $D/bin/moesh bench "${breal[@]}" --device cuda --modes ${MOESH_MODES:-colocated,cluster-ipc,cluster}
cp "$LOGS/bench_real_ipc.log" "$OUT/" 2>/dev/null
finish
echo
echo "==== cuda_cluster_ipc"
tail -8 "$LOGS/cuda_cluster_ipc.log" 2>/dev/null
echo "==== bench (V2-Lite shapes, one GPU)"
cat "$LOGS/bench_real_ipc.log"
