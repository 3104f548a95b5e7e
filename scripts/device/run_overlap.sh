#!/usr/bin/env bash
# On a two-GPU device machine, from the repository root, after
#   scripts/device/bundle.sh build-cuda cuda_dispatch_bench libmoesh_cuda_backends.so
# here and `run` with carry [".device"]: what ping-pong micro-batching can
# gain on the GPU path — decode steps colocated, split whole, and split as two
# half-batches stepped at once (cuda_dispatch_bench --overlap): over nccl with
# the experts on GPU 1, then over cuda_ipc with attention and experts sharing
# GPU 0 under this script's own MPS daemon.
set -uo pipefail
budget=${MOESH_DEVICE_BUDGET_S:-300}
source scripts/device/steps.sh || exit 1
record_env
common=(--overlap --workers 1 --batch 128 --reps 10 --step-batch 32,128,256 --context 2048)
step overlap_nccl 120 $D/bin/cuda_dispatch_bench --transport nccl --server-device 1 "${common[@]}"
if command -v nvidia-cuda-mps-control > /dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/moesh-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/moesh-mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  if nvidia-cuda-mps-control -d > "$LOGS/mps_start.log" 2>&1; then
    step overlap_ipc_mps 120 $D/bin/cuda_dispatch_bench --transport cuda_ipc "${common[@]}"
    echo quit | nvidia-cuda-mps-control
  fi
fi
finish
for f in overlap_nccl overlap_ipc_mps; do
  [[ -f $LOGS/$f.log ]] && { echo "== $f"; grep -E "^\||decode|half" "$LOGS/$f.log" | grep -v "^| workers\|^| 1 |"; }
done
