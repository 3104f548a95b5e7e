#!/usr/bin/env bash
# On the device machine, from the repository root, after
#   scripts/device/bundle.sh build-cuda cuda_sample_test cuda_routing_test cuda_backends_test transport_test \
#     moesh moesh_router moesh_prefill_worker moesh_decode_worker moesh_expert_worker libmoesh_cuda_backends.so
# here and `run` with carry [".device"] (two GPUs for the last step): the
# GPU sampler and everything it touches —
#  * cuda_sample_test (the sampler against Sampler::SampleWithDraw) and
#    compute-sanitizer memcheck/racecheck on it, cuda_routing_test;
#  * cuda_backends_test (ForwardSample against Sampler on Forward's logits,
#    the device-resident dispatch), transport_test;
#  * the GPU cluster against generate --device cuda, greedy and sampled,
#    over grpc and cuda_ipc (experts on the attention GPU, then on GPU 1).
# Logs land in $OUT; the summary is printed last.
set -uo pipefail
budget=${MOESH_DEVICE_BUDGET_S:-560}
source scripts/device/steps.sh || exit 1
export MOESH_REQUIRE_CUDA=1
export MOESH_SOURCE_DIR=$PWD
record_env
gpus=$(nvidia-smi --list-gpus | wc -l)

step cuda_sample_test 60 $D/bin/cuda_sample_test
step cuda_routing_test 60 $D/bin/cuda_routing_test
step memcheck_sample 90 compute-sanitizer --tool memcheck --error-exitcode 99 $D/bin/cuda_sample_test
step racecheck_sample 120 compute-sanitizer --tool racecheck --error-exitcode 99 $D/bin/cuda_sample_test
step cuda_backends_test 150 $D/bin/cuda_backends_test
[[ -x $D/bin/cuda_model_test ]] && step cuda_model_test 120 $D/bin/cuda_model_test
step cluster_grpc 150 tests/integration/cuda_cluster_test.sh $D/bin/moesh "$PWD"
MOESH_TRANSPORT=cuda_ipc step cluster_ipc 150 tests/integration/cuda_cluster_test.sh $D/bin/moesh "$PWD"
((gpus >= 2)) && MOESH_TRANSPORT=cuda_ipc MOESH_EXPERT_DEVICE=cuda:1 \
  step cluster_ipc_2gpu 150 tests/integration/cuda_cluster_test.sh $D/bin/moesh "$PWD"
step transport_test 90 $D/bin/transport_test
grep -h "boundary cases" "$LOGS/cuda_sample_test.log"
for f in cluster_grpc cluster_ipc cluster_ipc_2gpu; do
  [[ -f $LOGS/$f.log ]] && { echo "== $f"; grep -E "tokens equal|PASS|FAIL" "$LOGS/$f.log"; }
done
finish
