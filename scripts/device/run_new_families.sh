#!/usr/bin/env bash
# On the device machine, from the repository root, after
#   scripts/device/bundle.sh build-cuda cuda_ops_test cuda_backends_test cuda_model_test moesh moesh_router \
#     moesh_prefill_worker moesh_decode_worker moesh_expert_worker libmoesh_cuda_backends.so
# here and `run` with carry [".device"]: DeepSeek-V3.2's and V4's experts on
# the GPU — cuda_ops_test (the SwiGLU clamp against the CPU op),
# cuda_backends_test (CudaExpertStage against the CPU stage on the v32 and v4
# goldens), cuda_model_test (V2/V3 unchanged), and the cluster with CPU
# attention and GPU experts against the CPU engine on the v4 and v32 goldens;
# V3.2 wholly on the GPU within index_topk tokens (cuda_backends_test, and
# the GPU cluster against generate --device cuda).
set -uo pipefail
budget=${MOESH_DEVICE_BUDGET_S:-400}
source scripts/device/steps.sh || exit 1
export MOESH_REQUIRE_CUDA=1 MOESH_SOURCE_DIR=$PWD
record_env
step cuda_ops_test 60 $D/bin/cuda_ops_test
step cuda_backends_test 120 $D/bin/cuda_backends_test
step cuda_model_test 120 $D/bin/cuda_model_test
step experts_v4 120 tests/integration/cuda_experts_test.sh $D/bin/moesh "$PWD" v4
step experts_v32 120 tests/integration/cuda_experts_test.sh $D/bin/moesh "$PWD" v32
# V3.2 wholly on the GPU within index_topk (8 in the golden): the cluster
# against generate --device cuda.
MOESH_PROMPTS="5,17,300 1,2,3,4" MOESH_NEW_TOKENS=4 \
  step cluster_v32 120 tests/integration/cuda_cluster_test.sh $D/bin/moesh "$PWD" v32
for f in experts_v4 experts_v32 cluster_v32; do
  [[ -f $LOGS/$f.log ]] && { echo "== $f"; grep -E "tokens equal|PASS|FAIL" "$LOGS/$f.log"; }
done
finish
