#!/usr/bin/env bash
# On the device machine, from the repository root, after
#   scripts/device/bundle.sh BUILD_DIR cuda_backends_test cuda_model_test moesh moesh_router \
#     moesh_prefill_worker moesh_decode_worker moesh_expert_worker libmoesh_cuda_backends.so
# here and `run` with carry [".device"]: the CUDA backends the services run on
# (cuda_backends_test: expert shards and the attention backend against their
# references, the KV handoff), the whole cluster on the GPU against `moesh
# generate --device cuda` (tests/integration/cuda_cluster_test.sh), the CUDA
# model's goldens, and compute-sanitizer memcheck on the backends test.
# Logs land in $OUT; the summary is printed last.
set -uo pipefail
budget=${MOESH_DEVICE_BUDGET_S:-540}  # stay inside run's 600 s
source scripts/device/steps.sh || exit 1
export MOESH_REQUIRE_CUDA=1
export MOESH_SOURCE_DIR=$PWD
record_env

step cuda_backends_test 120 $D/bin/cuda_backends_test
step cuda_cluster_test 240 tests/integration/cuda_cluster_test.sh $D/bin/moesh "$PWD"
[[ -x $D/bin/cuda_model_test ]] && step cuda_model_test 120 $D/bin/cuda_model_test
step memcheck_backends 150 compute-sanitizer --tool memcheck --error-exitcode 99 $D/bin/cuda_backends_test \
  '--gtest_filter=*ExpertStage*:*KvHandoff*'
finish
echo
echo "==== cuda_cluster_test"
cat "$LOGS/cuda_cluster_test.log"
