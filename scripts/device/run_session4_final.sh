#!/usr/bin/env bash
# On the device machine, from the repository root, after
#   scripts/device/bundle.sh build-cuda cuda_grouped_gemm_test cuda_model_bench cuda_dispatch_bench moesh \
#     moesh_router moesh_prefill_worker moesh_decode_worker moesh_expert_worker libmoesh_cuda_backends.so
# here and `run` with carry [".device"]: the checks and numbers after the
# fourth session's last changes — the grouped GEMM test (the 16-byte combine),
# decode steps at batch 128/256 (the combine and fp32 RMSNorm rewrites), and
# under this script's own MPS daemon: decode steps colocated vs over cuda_ipc
# (cuda_dispatch_bench) and serving with 512-token prompts, colocated (KV moved
# block to block in its own pool) vs the cluster over cuda_ipc.
set -uo pipefail
budget=${MOESH_DEVICE_BUDGET_S:-540}
source scripts/device/steps.sh || exit 1
export MOESH_REQUIRE_CUDA=1 MOESH_SOURCE_DIR=$PWD
step cuda_grouped_gemm_test 60 $D/bin/cuda_grouped_gemm_test
step decode_bench 120 $D/bin/cuda_model_bench --device cuda --load-format dummy --shape v2-lite --batch 1,128,256 \
  --context 2048 --prefill-seqs 0
real=/tmp/v2-lite-real
$D/bin/moesh mkmodel --family v2-lite --preset real --config-only --out $real > "$LOGS/mkmodel.log" 2>&1
if command -v nvidia-cuda-mps-control > /dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/moesh-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/moesh-mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  if nvidia-cuda-mps-control -d > "$LOGS/mps_start.log" 2>&1; then
    step mps_dispatch 120 $D/bin/cuda_dispatch_bench --workers 1 --batch 128,256 --reps 30 --step-batch 128,256
    step mps_serve_512 150 $D/bin/moesh bench --serving --model $real --load-format dummy --prompt-len 512 \
      --max-new-tokens 32 --requests 128 --concurrency 128 --device cuda --expert-workers 1 --modes colocated,cluster-ipc
    echo quit | nvidia-cuda-mps-control
  fi
fi
finish
for f in decode_bench mps_dispatch mps_serve_512; do
  [[ -f $LOGS/$f.log ]] && { echo "==== $f"; grep -v "attached device buffers\|note: the client\|^| 256 (expert\|^one decode\|phase" "$LOGS/$f.log" | head -40; }
done
