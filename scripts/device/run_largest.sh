#!/usr/bin/env bash
# On a two-GPU device machine (nvidia-h200-x2), from the repository root, after
#   scripts/device/bundle.sh build-cuda moesh moesh_router moesh_prefill_worker moesh_decode_worker \
#     moesh_expert_worker libmoesh_cuda_backends.so
# here and `run` with carry [".device"]: the largest DeepSeek shape whose
# experts fit one H200 — DeepSeek-V3's layer shapes (hidden 7168, 256 routed
# experts top-8, moe_intermediate 2048; 22.5 GB of bf16 experts per MoE
# layer) at MOESH_LAYERS layers (default 8: 3 dense + 5 MoE, 113 GB of
# experts), random weights — served colocated on GPU 0 and as a cluster with
# the expert worker on GPU 1 over nccl; then the GPU cluster test over nccl
# (token-exact against generate, the KV handed over device to device).
set -uo pipefail
budget=${MOESH_DEVICE_BUDGET_S:-480}
source scripts/device/steps.sh || exit 1
export MOESH_REQUIRE_CUDA=1 MOESH_SOURCE_DIR=$PWD
record_env
MOESH_TRANSPORT=nccl MOESH_EXPERT_DEVICE=cuda:1 \
  step cluster_nccl_2gpu 100 tests/integration/cuda_cluster_test.sh $D/bin/moesh "$PWD"
layers=${MOESH_LAYERS:-8}
v3=/tmp/v3-real-$layers
$D/bin/moesh mkmodel --family v3 --preset real --config-only --layers $layers --out $v3 > "$LOGS/mkmodel.log" 2>&1
step v3_serving 300 $D/bin/moesh bench --serving --model $v3 --load-format dummy --prompt-len 64 \
  --max-new-tokens ${MOESH_NEW_TOKENS:-128} --requests 64 --concurrency 64 --device cuda --expert-device cuda:1 \
  --expert-workers 1 --modes ${MOESH_MODES:-colocated,cluster-nccl}
nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv >> "$LOGS/env.txt"
finish
[[ -f $LOGS/cluster_nccl_2gpu.log ]] && { echo "== cluster_nccl_2gpu"; grep -E "tokens equal|PASS|FAIL" "$LOGS/cluster_nccl_2gpu.log"; }
[[ -f $LOGS/v3_serving.log ]] && { echo "== v3_serving"; grep -v "^\s*$" "$LOGS/v3_serving.log" | tail -12; }
