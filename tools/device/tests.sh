#!/usr/bin/env bash
# The GPU test suites, on the device machine, from the repository root.
#
# usage: tools/device/tests.sh GROUP...     GROUP: kernels model services multi all
#   kernels   the kernel tests (cuda_device_test, cuda_ops_test, cuda_routing_test,
#             cuda_mla_decode_test, cuda_mla_prefill_test: the expanded MLA prefill
#             against its reference, cuda_grouped_gemm_test (and the FP8 x FP8 kernels), cuda_dsa_ops_test,
#             cuda_sample_test: the GPU sampler and greedy + top-k log-probabilities,
#             cuda_fp8_test: block-scaled FP8 quantization and GEMM, cuda_fp8_kv_test: the
#             FP8 KV cache's write and generic-kernel read against the CPU's packing,
#             cuda_mxfp4_test: MXFP4
#             quantization bit for bit the CPU's, cuda_v4_ops_test: V4's mHC mapping
#             against kernels/cpu/mhc and the slice copy, cuda_wgmma_test: the
#             wgmma wrappers and SW128 descriptors), then
#             compute-sanitizer memcheck on the op, routing, MLA, grouped GEMM and sampler
#             tests, racecheck/synccheck on the MLA kernel's small cases, racecheck on the
#             routing and sampler tests, and a summary of the MLA kernel's SASS (HMMA, LDSM,
#             bulk copies, local memory); the sampler's SASS comes back in $OUT when its
#             memcheck fails.
#   model     cuda_model_test (the CUDA model's goldens against the CPU engine and
#             transformers: v2, v3, v4, v4_legacy, v3.2 within index_topk; teacher-forced,
#             chunked prefill, free-running with graphs), memcheck on the V2-Lite golden and
#             the bad-steps case, memcheck on the v4 golden; cuda_fp8_model_test (the FP8
#             linears against the CPU engine on an FP8 checkpoint and under
#             --quantization fp8, teacher-forced, next to the bf16 path); cuda_kv_fp8_test
#             (the FP8 KV cache against the CPU engine's, the host and device handoffs);
#             cuda_mla_prefill_model_test (the expanded MLA prefill in the model against the
#             CPU engine, next to the absorbed prefill).
#   services  cuda_expert_stage_test (expert shards against the CPU stage, lanes),
#             cuda_backends_test (the attention backend against its references, the KV
#             handoff, the device-resident dispatch, ForwardSample), the
#             cluster on the GPU against `moesh generate --device cuda`
#             (tests/integration/cuda_cluster_test.sh) over grpc on the v3 and v2_lite goldens,
#             over cuda_ipc (and with --kv_cache_dtype fp8), on the v4 golden, on the v32 golden within index_topk (bf16 and FP8 KV); the
#             experts of V4 and V3.2 on the GPU behind CPU attention against the CPU engine
#             (tests/integration/cuda_experts_test.sh v4, v32), chunked prefill in a GPU
#             colocated router (tests/integration/cuda_chunked_test.sh); cuda_prefix_cache_test
#             (the device pool's prefix cache against prompts computed whole) and a second turn
#             through each cluster; cuda_prompt_logprobs_test (prompt log-probabilities, the
#             lm_head over every position, against the CPU engine on the v3, v2_lite, v32 and v4
#             goldens; the cluster tests ask for them too); memcheck on the backends' expert
#             stage and KV handoff, on the all-positions head.
#   multi     the two-GPU things (nvidia-h200-x2): transport_test (its nccl kind between the
#             GPUs), nccl_link_test, cuda_backends_test (its nccl and second-GPU cases; not
#             again if `services` ran it), and the cluster with the expert workers on GPU 1
#             (MOESH_EXPERT_DEVICE=cuda:1) over grpc and nccl on the v3 and v2_lite goldens
#             and over cuda_ipc. On a one-GPU machine only transport_test runs.
#   all       kernels model services multi (more than one 600 s call's worth: split it).
# MOESH_SKIP_SANITIZERS=1 leaves out the compute-sanitizer steps. Every test runs with
# MOESH_REQUIRE_CUDA=1 (a test that finds no GPU fails rather than skips) and
# MOESH_SOURCE_DIR=$PWD (the goldens of this checkout). Logs land in $OUT/logs-tests.tgz; the
# summary is printed last. MOESH_DEVICE_BUDGET_S (540) bounds the whole call.
#
# bundle (here, before `run`), the binaries of the groups wanted:
#   kernels:  cuda_device_test cuda_ops_test cuda_routing_test cuda_mla_decode_test
#             cuda_mla_prefill_test cuda_grouped_gemm_test cuda_dsa_ops_test cuda_sample_test cuda_fp8_test
#             cuda_fp8_kv_test cuda_mxfp4_test cuda_v4_ops_test cuda_wgmma_test [kernel_bench, for the SASS]
#   model:    cuda_model_test cuda_fp8_model_test cuda_kv_fp8_test cuda_mla_prefill_model_test
#   services: cuda_expert_stage_test cuda_backends_test cuda_prefix_cache_test cuda_prompt_logprobs_test moesh moesh_router moesh_prefill_worker moesh_decode_worker
#             moesh_expert_worker libmoesh_cuda_backends.so
#   multi:    transport_test nccl_link_test cuda_backends_test and the services' binaries
# A test binary missing from the bundle is left out (said in the summary).
# e.g.
#   tools/device/bundle.sh build-cuda cuda_device_test cuda_ops_test cuda_routing_test \
#     cuda_mla_decode_test cuda_grouped_gemm_test cuda_dsa_ops_test cuda_sample_test cuda_fp8_test \
#     cuda_fp8_kv_test cuda_mxfp4_test cuda_v4_ops_test cuda_wgmma_test
#   run: command "bash tools/device/tests.sh kernels", carry [".device"]
#   run: kind nvidia-h200-x2, command "bash tools/device/tests.sh services multi", carry [".device"]
set -uo pipefail
(($# > 0)) || { sed -n '2,/^set /p' "$0" | sed 's/^# \{0,1\}//' | head -n -1; exit 2; }
groups=()
for g in "$@"; do
  case $g in
    kernels|model|services|multi) groups+=("$g") ;;
    all) groups+=(kernels model services multi) ;;
    *) echo "tests.sh: unknown group $g (kernels model services multi all)" >&2; exit 2 ;;
  esac
done
budget=${MOESH_DEVICE_BUDGET_S:-540}  # stay inside run's 600 s
source tools/device/steps.sh || exit 1
export MOESH_REQUIRE_CUDA=1 MOESH_SOURCE_DIR=$PWD
record_env
{
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  for b in $D/bin/*; do ldd "$b" | grep -E 'cuda|cublas|nccl|not found'; done
} >> "$LOGS/env.txt" 2>&1

declare -A ran=()
# test_bin NAME LIMIT BINARY [ARGS...]: a gtest binary of the bundle, once per call.
test_bin() {
  local name=$1 limit=$2 bin=$3
  shift 3
  [[ -n ${ran[$name]:-} ]] && return 0
  ran[$name]=1
  if ! has "$bin"; then
    summary+=("$(printf '%-32s not run: %s not in the bundle' "$name" "$bin")")
    return 0
  fi
  step "$name" "$limit" $D/bin/$bin "$@"
}
# sanitize NAME LIMIT TOOL BINARY [ARGS...]: compute-sanitizer --tool TOOL on a bundled binary.
sanitize() {
  local name=$1 limit=$2 tool=$3 bin=$4
  shift 4
  [[ -n ${MOESH_SKIP_SANITIZERS:-} ]] && return 0
  has "$bin" || return 0
  # shellcheck disable=SC2086  # MOESH_SANITIZER_ARGS: extra compute-sanitizer words
  step "$name" "$limit" compute-sanitizer --tool "$tool" --error-exitcode 99 ${MOESH_SANITIZER_ARGS:-} \
    $D/bin/$bin "$@"
}
# cluster NAME LIMIT [ENV=VALUE...] [GOLDEN]: the GPU cluster against generate --device cuda.
cluster() {
  local name=$1 limit=$2
  shift 2
  local envs=()
  while [[ ${1:-} == *=* ]]; do envs+=("$1"); shift; done
  step "$name" "$limit" env "${envs[@]}" tests/integration/cuda_cluster_test.sh $D/bin/moesh "$PWD" "$@"
}

kernels() {
  for t in cuda_device_test cuda_ops_test cuda_routing_test cuda_mla_decode_test cuda_mla_prefill_test \
           cuda_grouped_gemm_test cuda_dsa_ops_test cuda_sample_test cuda_fp8_test cuda_fp8_kv_test \
           cuda_mxfp4_test cuda_v4_ops_test cuda_wgmma_test; do
    # The grouped GEMM test's plain C++ references take ~100 s of host CPU (H100 host).
    test_bin "$t" "$([[ $t == cuda_grouped_gemm_test ]] && echo 200 || echo 90)" "$t"
  done
  local prefill_small='--gtest_filter=*OneTile*:*PaddedTile*:*ManyRanges*:*NoKey*:*StackLayoutTwo*:*Args*'
  sanitize memcheck_indexer 120 memcheck cuda_dsa_ops_test '--gtest_filter=*IndexerCache*'
  sanitize racecheck_indexer 150 racecheck cuda_dsa_ops_test '--gtest_filter=*IndexerCache*/1'
  sanitize memcheck_mla_prefill 120 memcheck cuda_mla_prefill_test "$prefill_small"
  sanitize racecheck_mla_prefill 150 racecheck cuda_mla_prefill_test "$prefill_small"
  sanitize synccheck_mla_prefill 100 synccheck cuda_mla_prefill_test "$prefill_small"
  for t in cuda_ops_test cuda_routing_test cuda_mla_decode_test; do
    sanitize "memcheck_$t" 150 memcheck "$t"
  done
  sanitize memcheck_grouped_gemm 150 memcheck cuda_grouped_gemm_test '--gtest_filter=-GroupedGemmFp8*'
  sanitize memcheck_grouped_gemm_fp8 120 memcheck cuda_grouped_gemm_test '--gtest_filter=GroupedGemmFp8*'
  sanitize memcheck_sample 90 memcheck cuda_sample_test
  sanitize memcheck_fp8 120 memcheck cuda_fp8_test
  sanitize memcheck_fp8_kv 90 memcheck cuda_fp8_kv_test
  sanitize memcheck_mla_fp8 150 memcheck cuda_mla_decode_test '--gtest_filter=*Fp8*'
  sanitize memcheck_mxfp4 90 memcheck cuda_mxfp4_test
  # The sampler's SASS, where a sanitizer report needs it.
  if [[ -f $LOGS/memcheck_sample.log ]] && [[ $(grep -c 'rc=0 ' <<< "${summary[-1]}") == 0 ]] &&
     command -v cuobjdump > /dev/null; then
    cuobjdump -sass $D/bin/cuda_sample_test | awk '/Function : .*SampleKernel/,/^[[:space:]]*\.{10}/' \
      > "$OUT/sample_kernel.sass" 2>&1
  fi
  # Shared-memory races and barrier misuse, on cases small enough for the tools.
  # racecheck: the 16-head kernel only (it reports the wide kernel's named-barrier hand-offs,
  # which it does not model: mla_decode_wide.cu); synccheck: both.
  local small='--gtest_filter=*PaddedHeads*:*RaggedOneSplit*'
  sanitize racecheck_mla 150 racecheck cuda_mla_decode_test "$small:-*Wide*"
  sanitize synccheck_mla 100 synccheck cuda_mla_decode_test "$small"
  sanitize racecheck_routing 100 racecheck cuda_routing_test
  sanitize racecheck_sample 120 racecheck cuda_sample_test
  # The MLA kernel's SASS (from kernel_bench where bundled, else from its test).
  local sass_bin=kernel_bench
  has $sass_bin || sass_bin=cuda_mla_decode_test
  if has $sass_bin && command -v cuobjdump > /dev/null; then
    cuobjdump --dump-sass $D/bin/$sass_bin > "$LOGS/sass_all.txt" 2>&1
    local k
    for k in MlaDecodeKernel MlaDecodeFp8Kernel MlaPrefillKernel MlaPrefillWgmmaKernel; do
      awk -v k="$k" '/Function : / {on = index($0, k) > 0} on' "$LOGS/sass_all.txt" > "$LOGS/sass_$k.txt"
      echo "$k SASS ($sass_bin): $(grep -c HMMA "$LOGS/sass_$k.txt") HMMA, $(grep -c LDSM "$LOGS/sass_$k.txt") LDSM," \
           "$(grep -c F2FP "$LOGS/sass_$k.txt") F2FP, $(grep -c -E 'UBLKCP|UTMALDG|BULK' "$LOGS/sass_$k.txt") bulk-copy," \
           "$(grep -c -E 'LDL|STL' "$LOGS/sass_$k.txt") local-mem in $(grep -c "Function : " "$LOGS/sass_$k.txt")" \
           "instantiations" | tee -a "$LOGS/sass_summary.txt"
    done
    rm -f "$LOGS/sass_all.txt"
  fi
}

model() {
  test_bin cuda_model_test 150 cuda_model_test
  test_bin cuda_fp8_model_test 90 cuda_fp8_model_test
  test_bin cuda_kv_fp8_test 90 cuda_kv_fp8_test
  test_bin cuda_mla_prefill_model_test 90 cuda_mla_prefill_model_test
  sanitize memcheck_model_v2_lite 90 memcheck cuda_model_test '--gtest_filter=*Golden*/0:*RejectsBadSteps*'
  [[ -z ${MOESH_SKIP_SANITIZERS:-} ]] && has cuda_model_test &&
    step memcheck_v4 120 compute-sanitizer --tool memcheck --error-exitcode 1 $D/bin/cuda_model_test \
      --gtest_filter='*CudaGoldenTest*/4'
}

services() {
  test_bin cuda_expert_stage_test 90 cuda_expert_stage_test
  test_bin cuda_backends_test 150 cuda_backends_test
  cluster cluster_grpc 240
  cluster cluster_grpc_v2_lite 120 v2_lite
  cluster cluster_ipc 150 MOESH_TRANSPORT=cuda_ipc
  cluster cluster_ipc_fp8_kv 150 MOESH_TRANSPORT=cuda_ipc MOESH_KV_CACHE_DTYPE=fp8
  cluster cluster_v4 90 v4
  # V3.2 wholly on the GPU within index_topk (8 in the golden).
  cluster cluster_v32 120 "MOESH_PROMPTS=5,17,300 1,2,3,4" MOESH_NEW_TOKENS=4 MOESH_MULTI_TURN=0 v32
  # ... and with its FP8 KV cache (the index key after the FP8 row's rope part).
  cluster cluster_v32_fp8_kv 120 "MOESH_PROMPTS=5,17,300 1,2,3,4" MOESH_NEW_TOKENS=4 \
    MOESH_MULTI_TURN=0 MOESH_KV_CACHE_DTYPE=fp8 v32
  test_bin cuda_prefix_cache_test 90 cuda_prefix_cache_test
  test_bin cuda_prompt_logprobs_test 90 cuda_prompt_logprobs_test
  step chunked_v3 120 tests/integration/cuda_chunked_test.sh $D/bin/moesh "$PWD" v3
  step experts_v4 120 tests/integration/cuda_experts_test.sh $D/bin/moesh "$PWD" v4
  step experts_v32 120 tests/integration/cuda_experts_test.sh $D/bin/moesh "$PWD" v32
  # API errors are not reported here: the KV handoff test forges a pool handle on purpose, which
  # cudaIpcOpenMemHandle refuses (the test asserts FAILED_PRECONDITION); memory errors still fail it.
  MOESH_SANITIZER_ARGS='--report-api-errors no' \
    sanitize memcheck_backends 150 memcheck cuda_backends_test '--gtest_filter=*KvHandoff*'
  sanitize memcheck_expert_stage 120 memcheck cuda_expert_stage_test
  sanitize memcheck_prefix_cache 60 memcheck cuda_prefix_cache_test
  sanitize memcheck_prompt_logprobs 90 memcheck cuda_prompt_logprobs_test '--gtest_filter=*/0:*Chunks*'
}

multi() {
  test_bin transport_test 120 transport_test
  if ((gpus < 2)); then
    summary+=("$(printf '%-32s not run: %s GPU(s), needs 2' "multi (two-GPU steps)" "$gpus")")
    return 0
  fi
  test_bin nccl_link_test 60 nccl_link_test
  test_bin cuda_backends_test 150 cuda_backends_test
  for m in v3 v2_lite; do
    cluster "cluster_2gpu_$m" 120 MOESH_EXPERT_DEVICE=cuda:1 $m
    cluster "cluster_2gpu_nccl_$m" 120 MOESH_EXPERT_DEVICE=cuda:1 MOESH_TRANSPORT=nccl $m
  done
  cluster cluster_ipc_2gpu 150 MOESH_TRANSPORT=cuda_ipc MOESH_EXPERT_DEVICE=cuda:1
}

for g in "${groups[@]}"; do
  "$g"
done

grep -h "boundary cases" "$LOGS/cuda_sample_test.log" 2>/dev/null
[[ -f $LOGS/cuda_model_test.log ]] &&
  { echo; echo "==== cuda_model_test"; grep -E '^(v2|v3|v4|real widths)|max \|logprob|OK \]|FAILED \]|Failure' "$LOGS/cuda_model_test.log" | head -60; }
[[ -f $LOGS/cuda_fp8_model_test.log ]] &&
  { echo; echo "==== cuda_fp8_model_test"; grep -E 'vs the CPU|GPU |OK \]|FAILED \]|Failure|Expected|Which is' "$LOGS/cuda_fp8_model_test.log" | head -40; }
[[ -f $LOGS/cuda_prefix_cache_test.log ]] &&
  { echo; echo "==== cuda_prefix_cache_test"; grep -E 'cached vs whole|handoff into|OK \]|FAILED \]|Failure' "$LOGS/cuda_prefix_cache_test.log" | head -20; }
[[ -f $LOGS/cuda_prompt_logprobs_test.log ]] &&
  { echo; echo "==== cuda_prompt_logprobs_test"; grep -E 'prompt logprobs over|last rows vs|lm_head chunks|OK \]|FAILED \]|Failure' "$LOGS/cuda_prompt_logprobs_test.log" | head -30; }
for f in cluster_grpc cluster_grpc_v2_lite cluster_ipc cluster_v4 cluster_v32 cluster_v32_fp8_kv \
  experts_v4 experts_v32 \
         cluster_2gpu_v3 cluster_2gpu_nccl_v3 cluster_2gpu_v2_lite cluster_2gpu_nccl_v2_lite cluster_ipc_2gpu; do
  show "$f" "tokens equal|PASS|FAIL|pipelined"
done
finish
