#!/usr/bin/env bash
# On the device machine, from the repository root, after
#   scripts/device/bundle.sh BUILD_DIR cuda_backends_test transport_test cuda_dispatch_bench moesh \
#     moesh_router moesh_prefill_worker moesh_decode_worker moesh_expert_worker libmoesh_cuda_backends.so
# here and `run` with carry [".device"]: the cuda_ipc transport —
#  * tests: the device-resident dispatch against the host path
#    (cuda_backends_test), the transport contract (transport_test), the
#    whole cluster over cuda_ipc against `moesh generate --device cuda`
#    (cuda_cluster_test.sh) with the expert workers on the attention GPU and,
#    where there are two GPUs, on the second;
#  * cuda_dispatch_bench: one MoE layer's round trip per transport, against
#    the experts alone and an empty call (experts on GPU 0, then GPU 1);
#  * `moesh bench --serving` at DeepSeek-V2-Lite's shapes (dummy weights):
#    colocated against the cluster over cuda_ipc, one expert worker on the
#    attention GPU, then one and two on the second GPU;
#  * MOESH_TRY_MPS=1: the same-GPU dispatch bench and serving row again under
#    an MPS daemon of this script's own (pipe directory in /tmp; stopped at
#    the end), which lets the processes' kernels share the GPU without
#    context switches.
#  * the rebalancer over time: a CPU cluster (this machine's cores) with a
#    skewed expert placement, `moesh bench --serving --rebalance-timeline`.
# MOESH_ONLY_BENCH=1 skips the tests, MOESH_SKIP_GPU_BENCH=1 the GPU benches. Logs land in $OUT; the summary and the
# tables are printed last.
set -uo pipefail
budget=${MOESH_DEVICE_BUDGET_S:-560}
source scripts/device/steps.sh || exit 1
export MOESH_REQUIRE_CUDA=1
export MOESH_SOURCE_DIR=$PWD
record_env
gpus=$(nvidia-smi --list-gpus | wc -l)

if [[ -z ${MOESH_ONLY_BENCH:-} ]]; then
  step cuda_backends_test 150 $D/bin/cuda_backends_test
  step transport_test 90 $D/bin/transport_test
  MOESH_TRANSPORT=cuda_ipc step cluster_ipc 150 tests/integration/cuda_cluster_test.sh $D/bin/moesh "$PWD"
  ((gpus >= 2)) && MOESH_TRANSPORT=cuda_ipc MOESH_EXPERT_DEVICE=cuda:1 \
    step cluster_ipc_2gpu 150 tests/integration/cuda_cluster_test.sh $D/bin/moesh "$PWD"
fi
if [[ -z ${MOESH_SKIP_GPU_BENCH:-} ]]; then
  step dispatch_gpu0 100 $D/bin/cuda_dispatch_bench --workers 1,2 --batch 1,32,128,256 --reps 30
  ((gpus >= 2)) && step dispatch_gpu1 100 $D/bin/cuda_dispatch_bench --workers 1,2 --batch 1,32,128,256 --reps 30 \
    --server-device 1
  real=/tmp/v2-lite-real
  $D/bin/moesh mkmodel --family v2-lite --preset real --config-only --out $real > "$LOGS/mkmodel.log" 2>&1
  breal=(--serving --model $real --load-format dummy --prompt-len 64 --max-new-tokens 32 --requests 128
         --concurrency ${MOESH_CONCURRENCY:-32,128} --device cuda)
  step serve_gpu0 120 $D/bin/moesh bench "${breal[@]}" --modes colocated,cluster-ipc --expert-workers 1
  if ((gpus >= 2)); then
    step serve_gpu1_w1 90 $D/bin/moesh bench "${breal[@]}" --modes cluster-ipc --expert-device cuda:1 --expert-workers 1
    step serve_gpu1_w2 90 $D/bin/moesh bench "${breal[@]}" --modes cluster-ipc --expert-device cuda:1 --expert-workers 2
  fi
  if [[ -n ${MOESH_TRY_MPS:-} ]] && command -v nvidia-cuda-mps-control > /dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/moesh-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/moesh-mps-log
    mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
    if nvidia-cuda-mps-control -d > "$LOGS/mps_start.log" 2>&1; then
      step mps_dispatch_gpu0 100 $D/bin/cuda_dispatch_bench --workers 1 --batch 1,128,256 --reps 30
      step mps_serve_gpu0 120 $D/bin/moesh bench "${breal[@]}" --modes colocated,cluster-ipc --expert-workers 1
      echo quit | nvidia-cuda-mps-control
    fi
    cp $CUDA_MPS_LOG_DIRECTORY/control.log "$LOGS/mps_control.log" 2>/dev/null
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
fi
# The rebalancer over time (CPU cluster, this machine's cores): a skewed
# placement, tokens/s and the expert workers' balance per second.
small=/tmp/v2-lite-small
$D/bin/moesh mkmodel --family v2-lite --preset small --out $small --seed 1 >> "$LOGS/mkmodel.log" 2>&1
step rebalance_timeline 60 $D/bin/moesh bench --serving --model $small --rebalance-timeline 30 --rebalance-interval 5 \
  --concurrency 32 --prompt-len 32 --max-new-tokens 64
finish
for f in cluster_ipc cluster_ipc_2gpu; do
  [[ -f $LOGS/$f.log ]] && { echo "==== $f"; tail -5 "$LOGS/$f.log"; }
done
for f in dispatch_gpu0 dispatch_gpu1 mps_dispatch_gpu0 serve_gpu0 serve_gpu1_w1 serve_gpu1_w2 mps_serve_gpu0 \
         rebalance_timeline; do
  [[ -f $LOGS/$f.log ]] && { echo "==== $f"; grep -v "attached device buffers" "$LOGS/$f.log"; }
done
