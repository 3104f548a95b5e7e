#!/usr/bin/env bash
# On the device machine (one or two GPUs), from the repository root, after
#   scripts/device/bundle.sh BUILD_DIR moesh moesh_router moesh_prefill_worker moesh_decode_worker \
#     moesh_expert_worker libmoesh_cuda_backends.so
# here and `run` with carry [".device"]: the KV handoff over cuda_ipc —
# serving at DeepSeek-V2-Lite's shapes (dummy weights) with 512-token prompts
# and short generations, so the arrival wave (prefill + KV handoff) sets the
# time to first token: colocated, the cluster over cuda_ipc with the KV
# through the host (cluster-ipc-hostkv), and with the decode worker copying it
# from the prefill worker's GPU memory (cluster-ipc). Under this script's own
# MPS daemon on GPU 0 (the processes share the GPU without context switches),
# then, with two GPUs, the expert worker on GPU 1 without MPS.
set -uo pipefail
budget=${MOESH_DEVICE_BUDGET_S:-560}
source scripts/device/steps.sh || exit 1
gpus=$(nvidia-smi --list-gpus | wc -l)
real=/tmp/v2-lite-real
$D/bin/moesh mkmodel --family v2-lite --preset real --config-only --out $real > "$LOGS/mkmodel.log" 2>&1
b=(--serving --model $real --load-format dummy --prompt-len ${MOESH_PROMPT_LEN:-512} --max-new-tokens 32
   --requests 128 --concurrency 128 --device cuda --expert-workers 1)
if command -v nvidia-cuda-mps-control > /dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/moesh-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/moesh-mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  if nvidia-cuda-mps-control -d > "$LOGS/mps_start.log" 2>&1; then
    step kv_mps_gpu0 240 $D/bin/moesh bench "${b[@]}" --modes colocated,cluster-ipc-hostkv,cluster-ipc
    echo quit | nvidia-cuda-mps-control
  fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi
((gpus >= 2)) && step kv_gpu1 200 $D/bin/moesh bench "${b[@]}" --modes cluster-ipc-hostkv,cluster-ipc --expert-device cuda:1
finish
for f in kv_mps_gpu0 kv_gpu1; do
  [[ -f $LOGS/$f.log ]] && { echo "==== $f"; grep -v "attached device buffers\|note: the client" "$LOGS/$f.log"; }
done
