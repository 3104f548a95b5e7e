#!/usr/bin/env bash
# On a device machine with two GPUs (kind nvidia-h200-x2), from the
# repository root, after
#   scripts/device/bundle.sh BUILD_DIR moesh moesh_router moesh_prefill_worker moesh_decode_worker \
#     moesh_expert_worker libmoesh_cuda_backends.so transport_test
# here and `run` with carry [".device"]: the cluster with attention on GPU 0
# and the expert workers on GPU 1 against `moesh generate --device cuda` (the
# single-GPU colocated run) on golden checkpoints, then `moesh bench
# --serving` on one GPU (colocated, cluster) and on two (cluster, experts on
# GPU 1), then the same at DeepSeek-V2-Lite's real shapes with random
# weights made on the GPUs (`--load-format dummy`, config.json only).
# MOESH_ONLY_REAL=1 runs the real-shape benches alone.
# On a one-GPU machine the two-GPU steps are left out.
# Logs land in $OUT; the summary and the bench tables are printed last.
set -uo pipefail
budget=${MOESH_DEVICE_BUDGET_S:-540}  # stay inside run's 600 s
source scripts/device/steps.sh || exit 1
export MOESH_SOURCE_DIR=$PWD
record_env
gpus=$(nvidia-smi -L | grep -c '^GPU')

if [[ -z ${MOESH_ONLY_REAL:-} ]]; then
# The transports' contract, the nccl kind across the two GPUs.
[[ -x $D/bin/transport_test ]] && step transport_test 120 $D/bin/transport_test
step cluster_1gpu_v2_lite 120 tests/integration/cuda_cluster_test.sh $D/bin/moesh "$PWD" v2_lite
if ((gpus >= 2)); then
  for m in v3 v2_lite; do
    step "cluster_2gpu_$m" 120 env MOESH_EXPERT_DEVICE=cuda:1 tests/integration/cuda_cluster_test.sh $D/bin/moesh "$PWD" $m
    step "cluster_2gpu_nccl_$m" 120 env MOESH_EXPERT_DEVICE=cuda:1 MOESH_TRANSPORT=nccl \
      tests/integration/cuda_cluster_test.sh $D/bin/moesh "$PWD" $m
  done
fi
model=/tmp/moesh-small-v2-lite
$D/bin/moesh mkmodel --family v2-lite --preset small --out $model --seed 1 > "$LOGS/mkmodel.log" 2>&1
bench=(--serving --model $model --requests 64 --prompt-len 64 --max-new-tokens 32 --concurrency 1,16,64)
step bench_1gpu 150 $D/bin/moesh bench "${bench[@]}" --device cuda --modes colocated,cluster
((gpus >= 2)) && step bench_2gpu 120 $D/bin/moesh bench "${bench[@]}" --device cuda --expert-device cuda:1 --modes cluster,cluster-nccl
fi
real=/tmp/moesh-v2-lite-real
$D/bin/moesh mkmodel --family v2-lite --preset real --config-only --out $real >> "$LOGS/mkmodel.log" 2>&1
breal=(--serving --model $real --load-format dummy --prompt-len 64 --max-new-tokens 32 --concurrency 32,128 --requests 128)
step bench_real_1gpu 220 $D/bin/moesh bench "${breal[@]}" --device cuda --modes colocated,cluster
((gpus >= 2)) && step bench_real_2gpu 200 $D/bin/moesh bench "${breal[@]}" --device cuda --expert-device cuda:1 \
  --modes cluster,cluster-nccl
finish
for f in transport_test cluster_2gpu_nccl_v3 cluster_2gpu_nccl_v2_lite cluster_2gpu_v3 cluster_1gpu_v2_lite bench_1gpu bench_2gpu \
         bench_real_1gpu bench_real_2gpu; do
  [[ -f $LOGS/$f.log ]] && { echo; echo "==== $f"; cat "$LOGS/$f.log"; cp "$LOGS/$f.log" "$OUT/"; }
done
