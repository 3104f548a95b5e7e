#!/usr/bin/env bash
# On the device machine, from the repository root, after
#   scripts/device/bundle.sh build-cuda cuda_dispatch_bench cuda_backends_test moesh moesh_router \
#     moesh_prefill_worker moesh_decode_worker moesh_expert_worker libmoesh_cuda_backends.so
# here and `run` with carry [".device"]: the pipelined cuda_ipc dispatch
# (interprocess events, no host waits) — the GPU cluster over cuda_ipc
# against generate --device cuda, then under this script's own MPS daemon the
# per-layer round trip and decode steps colocated vs cuda_ipc.
set -uo pipefail
budget=${MOESH_DEVICE_BUDGET_S:-240}
source scripts/device/steps.sh || exit 1
export MOESH_REQUIRE_CUDA=1 MOESH_SOURCE_DIR=$PWD
step cuda_backends_test 90 $D/bin/cuda_backends_test
MOESH_TRANSPORT=cuda_ipc step cluster_ipc 120 tests/integration/cuda_cluster_test.sh $D/bin/moesh "$PWD"
if command -v nvidia-cuda-mps-control > /dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/moesh-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/moesh-mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  if nvidia-cuda-mps-control -d > "$LOGS/mps_start.log" 2>&1; then
    step mps_dispatch 120 $D/bin/cuda_dispatch_bench --workers 1 --batch 128,256 --reps 30 --step-batch 128,256
    echo quit | nvidia-cuda-mps-control
  fi
fi
finish
grep -E "tokens equal|PASS|FAIL|pipelined" "$LOGS"/cluster_ipc.log "$LOGS"/../moesh-logs/*.log 2>/dev/null | head -8
[[ -f $LOGS/mps_dispatch.log ]] && cat "$LOGS/mps_dispatch.log"
