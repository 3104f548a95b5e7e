#!/usr/bin/env bash
# On the device machine (two GPUs), from the repository root, after
#   scripts/device/bundle.sh BUILD_DIR moesh moesh_router moesh_prefill_worker moesh_decode_worker \
#     moesh_expert_worker libmoesh_cuda_backends.so
# here and `run` with carry [".device"]: serving at DeepSeek-V2-Lite's shapes
# (dummy weights) with long generations, so the steady decode state outweighs
# the arrival wave: colocated against the cluster over cuda_ipc (the expert
# worker on the attention GPU under MPS, then on the second GPU).
# MOESH_MODES (default colocated,cluster-ipc) picks the modes of the
# second-GPU run (e.g. colocated,cluster-nccl,cluster-ipc); MOESH_SKIP_MPS=1
# skips the MPS run.
set -uo pipefail
budget=${MOESH_DEVICE_BUDGET_S:-400}
source scripts/device/steps.sh || exit 1
real=/tmp/v2-lite-real
$D/bin/moesh mkmodel --family v2-lite --preset real --config-only --out $real > "$LOGS/mkmodel.log" 2>&1
b=(--serving --model $real --load-format dummy --prompt-len 64 --max-new-tokens ${MOESH_NEW_TOKENS:-256}
   --requests 128 --concurrency 128 --device cuda)
step steady_gpu1 240 $D/bin/moesh bench "${b[@]}" --modes ${MOESH_MODES:-colocated,cluster-ipc} --expert-device cuda:1 \
  --expert-workers 1
if [[ -z ${MOESH_SKIP_MPS:-} ]] && command -v nvidia-cuda-mps-control > /dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/moesh-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/moesh-mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  if nvidia-cuda-mps-control -d > "$LOGS/mps_start.log" 2>&1; then
    step steady_mps_gpu0 150 $D/bin/moesh bench "${b[@]}" --modes colocated,cluster-ipc --expert-workers 1
    echo quit | nvidia-cuda-mps-control
  fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi
finish
for f in steady_gpu1 steady_mps_gpu0; do
  [[ -f $LOGS/$f.log ]] && { echo "==== $f"; grep -v "attached device buffers\|note: the client" "$LOGS/$f.log"; }
done
