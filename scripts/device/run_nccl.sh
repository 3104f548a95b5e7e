#!/usr/bin/env bash
# On a two-GPU device machine (nvidia-h200-x2), from the repository root, after
#   scripts/device/bundle.sh build-cuda cuda_backends_test nccl_link_test transport_test cuda_dispatch_bench \
#     moesh moesh_router moesh_prefill_worker moesh_decode_worker moesh_expert_worker libmoesh_cuda_backends.so
# here and `run` with carry [".device"]: the nccl transport's device-resident
# expert dispatch (attention on GPU 0, experts on GPU 1) —
#  * cuda_backends_test (the device-resident dispatch over cuda_ipc and nccl
#    against the host path; nccl's after-the-fact answers, a refused
#    dispatch, a server that goes away), nccl_link_test, transport_test;
#  * the GPU cluster over nccl with the experts on GPU 1 against
#    generate --device cuda (greedy and sampled);
#  * cuda_dispatch_bench over nccl and over cuda_ipc, experts on GPU 1: the
#    per-layer round trip beside a bare NCCL exchange of the same bytes and
#    NCCL's bandwidth, and decode steps colocated (1 GPU) vs split (2 GPUs).
# Logs land in $OUT; the summary is printed last.
set -uo pipefail
budget=${MOESH_DEVICE_BUDGET_S:-560}
source scripts/device/steps.sh || exit 1
export MOESH_REQUIRE_CUDA=1 MOESH_SOURCE_DIR=$PWD
record_env
step cuda_backends_test 100 $D/bin/cuda_backends_test
step nccl_link_test 60 $D/bin/nccl_link_test
step transport_test 90 $D/bin/transport_test
MOESH_TRANSPORT=nccl MOESH_EXPERT_DEVICE=cuda:1 \
  step cluster_nccl_2gpu 100 tests/integration/cuda_cluster_test.sh $D/bin/moesh "$PWD"
bench=(--workers 1 --batch 1,32,128,256 --reps 30 --server-device 1 --step-batch 1,32,128,256 --context 2048)
step dispatch_nccl 120 $D/bin/cuda_dispatch_bench --transport nccl "${bench[@]}"
step dispatch_ipc 100 $D/bin/cuda_dispatch_bench --transport cuda_ipc "${bench[@]}"
for f in cluster_nccl_2gpu; do
  [[ -f $LOGS/$f.log ]] && { echo "== $f"; grep -E "tokens equal|PASS|FAIL" "$LOGS/$f.log"; }
done
for f in dispatch_nccl dispatch_ipc; do
  [[ -f $LOGS/$f.log ]] && { echo "== $f"; grep -v "^\s*$" "$LOGS/$f.log" | grep -E "^\||NCCL|GPU|decode|round"; }
done
finish
