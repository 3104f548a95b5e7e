#!/usr/bin/env bash
# The serving benchmarks on the device machine, from the repository root:
# `moesh bench --serving` (the client against the cluster and the colocated
# router it starts) and cuda_dispatch_bench (one MoE layer's round trip and
# whole decode steps per transport), on dummy models of real DeepSeek shapes.
#
# usage: tools/device/serving_bench.sh SCENARIO... [--dispatch VARIANT]...
# Serving (`moesh bench --serving --load_format dummy --device cuda`, V2-Lite's real shapes
# unless said; steps with the experts on GPU 1 run where there are two GPUs):
#   steady     long generations, the steady decode state: --prompt_len 64 --max_new_tokens
#              $MOESH_NEW_TOKENS (256) --requests 128 --concurrency 128; the expert worker on
#              GPU 1 (--modes $MOESH_MODES, default colocated,cluster-ipc, e.g.
#              colocated,cluster-nccl,cluster-ipc), then on GPU 0 under MPS (colocated,cluster-ipc;
#              not with MOESH_SKIP_MPS=1).
#   kv         the KV handoff: --prompt_len $MOESH_PROMPT_LEN (512) --max_new_tokens 32
#              --requests 128 --concurrency 128 --expert_workers 1; under MPS on GPU 0 (--modes
#              $MOESH_MPS_MODES, default colocated,cluster-ipc-hostkv,cluster-ipc), then the
#              expert worker on GPU 1 without MPS (cluster-ipc-hostkv,cluster-ipc; not with
#              MOESH_SKIP_GPU1=1).
#   ipc        the cluster over cuda_ipc: --prompt_len 64 --max_new_tokens 32 --requests 128
#              --concurrency $MOESH_CONCURRENCY (32,128): colocated,cluster-ipc with one expert
#              worker on GPU 0, cluster-ipc with one and two on GPU 1; MOESH_TRY_MPS=1 adds
#              colocated,cluster-ipc on GPU 0 under MPS.
#   multi      the cluster over grpc and nccl: the small v2-lite model (mkmodel --preset small
#              --seed 1; --requests 64 --prompt_len 64 --max_new_tokens 32 --concurrency 1,16,64)
#              colocated,cluster on one GPU and cluster,cluster-nccl with the experts on GPU 1;
#              then the real shapes (--concurrency 32,128 --requests 128) the same way.
#              MOESH_ONLY_REAL=1: the real shapes alone.
#   largest    DeepSeek-V3's layer shapes at $MOESH_LAYERS (8) layers (3 dense + 5 MoE, 113 GB
#              of bf16 experts): --prompt_len 64 --max_new_tokens $MOESH_NEW_TOKENS (128)
#              --requests 64 --concurrency 64 --expert_device cuda:1 --expert_workers 1
#              --modes $MOESH_MODES (colocated,cluster-nccl); nvidia-h200-x2.
#   chunked    chunked prefill in a GPU colocated router (moesh_router --colocated --device cuda,
#              V2-Lite's real shapes, dummy weights) at --max_num_batched_tokens
#              $MOESH_BUDGETS (0,256,2048; 0: no chunking), each under the same open-loop client:
#              `moesh bench --serving --server` --dataset random --length_sigma 0 --prompt_len
#              $MOESH_PROMPT_LEN (512) --max_new_tokens 128 --requests 256 --concurrency 64
#              --request_rate $MOESH_RATE (inf: closed loop); ITL p50/p99 and TTFT per budget.
#   prefix     the prefix cache on the GPU: a colocated router (moesh_router --colocated --device
#              cuda, V2-Lite's real shapes, dummy weights) with --enable_prefix_caching on, then
#              off, each under the same open-loop client: `moesh bench --serving --server`
#              --dataset multiturn --turns 4 --system_prompts 4 --system_prompt_len
#              $MOESH_SYSTEM_LEN (1024) --prompt_len 128 --max_new_tokens 64 --requests 256
#              --concurrency $MOESH_CONCURRENCY (32); TTFT, ITL and the cache's hit rate per row.
#   swap       preemption by recompute against swap on the GPU: a colocated router
#              (moesh_router --colocated --device cuda, V2-Lite's real shapes, dummy weights)
#              with a small KV pool (--gpu_memory_utilization $MOESH_GPU_UTIL, default 0.3:
#              the weights take ~0.22 of an H200; --max_model_len 4096) and --max_batch 256, once per
#              --preemption_mode ($MOESH_PREEMPTION_MODES, default recompute,swap), each under
#              the same open-loop client: `moesh bench --serving --server` --dataset random
#              --length_sigma 0 --prompt_len $MOESH_PROMPT_LEN (512) --max_new_tokens
#              $MOESH_NEW_TOKENS (1024) --requests 256 --concurrency 256; then the router's
#              moesh_decode_preemptions_total / _swap_* / kv_cache lines (swap_metrics_MODE):
#              a row with no preemptions says the pool was not small enough (lower MOESH_GPU_UTIL).
#   rate       steady serving against the kernel-level decode rate: a colocated GPU router under
#              128 closed-loop streams of 64-token prompts and lognormal answers (mean
#              $MOESH_NEW_TOKENS, 512; $MOESH_REQUESTS, 1024, requests), the same load against the
#              cluster over cuda_ipc under MPS (serve-local; not with MOESH_SKIP_CLUSTER=1), then
#              that cluster again with --max_local_prefill_tokens $MOESH_LOCAL_PREFILL (512; empty:
#              not run: the decode worker computes the short prompts), then
#              cuda_model_bench's decode step at the same batch at 256 and 512 tokens of context
#              (not with MOESH_SKIP_KERNEL=1); MOESH_SKIP_COLOCATED=1 leaves out the colocated row.
#              After each serving row, the decode engine's (and expert worker's) step-time and
#              batch-size histogram sums from its /metrics.
#   admission  64 x 2000 new tokens on a colocated GPU router with a small KV cache
#              (--gpu_memory_utilization $MOESH_GPU_UTIL, 0.25): refusals, preemptions, the pool.
#   http       the OpenAI HTTP front against gRPC: on this machine's CPUs (tiny v3 CPU cluster,
#              cluster,cluster-http twice, 32 and 128 streams; not with MOESH_HTTP_GPU_ONLY=1),
#              then on the GPU (a colocated router on the small v2-lite model,
#              colocated,colocated-http three times, 128 streams, 3072 requests a row).
#   latency_cluster  issue 20's latency bounds on the cluster over cuda_ipc under MPS, with every
#              prompt on the prefill worker and with --max_local_prefill_tokens (see the function):
#              the closed-loop maximum, Poisson at 80% of it, the multi-turn chats with the cache.
#   routing    the prefix-cache hit rate per --routing_policy ($MOESH_POLICIES, default
#              kv_aware,load,round_robin): a CPU cluster of two prefill workers (serve-local, the small
#              v2-lite model) under multi-turn chats whose histories outweigh their shared system
#              prompts (64-token system prompts, turns of ~192 + ~16 tokens).
#   routing_gpu  the same on the GPU: the cluster over cuda_ipc under MPS (serve-local
#              --prefill_workers 2, V2-Lite's real shapes, dummy weights).
#   fullsize   issue 22's run, arguments through the environment: DeepSeek-V3 at its real
#              shapes in FP8 as shipped (`mkmodel --family v3 --preset real --dtype fp8
#              --config_only`, $MOESH_LAYERS layers, default all 61; dummy weights made on
#              the GPUs); the router, prefill and decode workers on GPU 0, one expert worker
#              per other GPU (--expert_device cuda:1,...), dispatches over NCCL
#              (cluster-nccl); 1K-in/1K-out and 4K-in/512-out ($MOESH_WORKLOADS, PROMPT:NEW
#              pairs) at --concurrency $MOESH_CONCURRENCY (64,128,256), $MOESH_REQUESTS
#              (2 x the largest concurrency) requests a row; then the expert-GPU scaling
#              (1 .. gpus - 1 expert GPUs, the first workload, concurrency 128) and the
#              resident bytes per GPU (nvidia-smi after each row). MOESH_FAMILY=v2: DeepSeek-V2
#              at 236B (60 layers, bf16 config, --quantization fp8 at load), its expert workers
#              over every GPU, GPU 0 included. On one GPU (the rehearsal) it runs colocated at
#              the layer count given (V3 FP8: 13 layers fit; 61 need eight GPUs), or
#              $MOESH_ONE_GPU_MODE (cluster-ipc: router, prefill, decode and expert worker on the
#              GPU under MPS, issue 17's "served through the cluster" at the largest depth; the
#              attention workers' shares of the GPU $MOESH_DECODE_UTIL / $MOESH_PREFILL_UTIL,
#              0.6 / 0.8 unless set; on an H200 13 layers at 0.9 / 0.97 did not fit — the prefill
#              worker's KV got 0 blocks: each attention worker holds its own 8.06 GB of weights
#              there, beside the expert worker's 113 GB — so 12 is the next to try).
#   rebalance  the rebalancer over time on a CPU cluster (this machine's cores), the small
#              v2-lite model with a skewed placement: --rebalance_timeline 30
#              --rebalance_interval 5 --concurrency 32 --prompt_len 32 --max_new_tokens 64.
# cuda_dispatch_bench (--dispatch VARIANT, or the scenario dispatch-VARIANT):
#   ipc        --workers 1,2 --batch 1,32,128,256 --reps 30, experts on GPU 0, then on GPU 1
#              (--server-device 1); MOESH_TRY_MPS=1 adds --workers 1 --batch 1,128,256 under MPS.
#   mps        under MPS on one GPU: --workers 1 --batch 128,256 --reps 30 --step-batch 128,256
#              (the round trip and decode steps, colocated vs cuda_ipc).
#   nccl       experts on GPU 1, --transport nccl then cuda_ipc: --workers 1 --batch
#              1,32,128,256 --reps 30 --server-device 1 --step-batch 1,32,128,256 --context 2048
#              (the round trip beside a bare NCCL exchange, decode steps 1 GPU vs 2).
#   overlap    --overlap --workers 1 --batch 128 --reps 10 --step-batch 32,128,256 --context
#              2048: over nccl with the experts on GPU 1, then over cuda_ipc on GPU 0 under MPS
#              (decode batches whole vs as two half-batches stepped at once).
# The correctness runs the old per-topic scripts made beside these (the cluster tests over
# each transport, cuda_backends_test, transport_test, nccl_link_test) are
# tools/device/tests.sh's (services, multi). MPS runs use a daemon of this script's own
# (pipe directory in /tmp, stopped after its steps). Logs land in
# $OUT/logs-serving_bench.tgz; the summary and the tables are printed last.
# MOESH_DEVICE_BUDGET_S (560) bounds the call.
#
# bundle: moesh moesh_router moesh_prefill_worker moesh_decode_worker moesh_expert_worker
#   libmoesh_cuda_backends.so for the serving scenarios (and cuda_model_bench for rate); cuda_dispatch_bench
#   libmoesh_cuda_backends.so for --dispatch.
# e.g.
#   tools/device/bundle.sh build-cuda moesh moesh_router moesh_prefill_worker moesh_decode_worker \
#     moesh_expert_worker libmoesh_cuda_backends.so cuda_dispatch_bench
#   run: kind nvidia-h200-x2, command "MOESH_MODES=colocated,cluster-nccl,cluster-ipc MOESH_SKIP_MPS=1
#        bash tools/device/serving_bench.sh steady", carry [".device"]
#   run: kind nvidia-h200-x2, command "bash tools/device/serving_bench.sh --dispatch nccl", carry [".device"]
set -uo pipefail
usage() { sed -n '2,/^set /p' "$0" | sed 's/^# \{0,1\}//' | head -n -1; }
scenarios=()
while (($# > 0)); do
  case $1 in
    steady|kv|ipc|multi|largest|chunked|prefix|swap|rate|admission|http|routing|routing_gpu|fullsize|\
    rebalance|latency_cluster)
      scenarios+=("$1"); shift ;;
    dispatch-ipc|dispatch-mps|dispatch-nccl|dispatch-overlap) scenarios+=("${1/-/_}"); shift ;;
    --dispatch)
      case ${2:-} in
        ipc|mps|nccl|overlap) scenarios+=("dispatch_$2"); shift 2 ;;
        *) echo "serving_bench.sh: --dispatch ipc|mps|nccl|overlap" >&2; exit 2 ;;
      esac ;;
    -h|--help) usage; exit 0 ;;
    *) echo "serving_bench.sh: unknown scenario $1" >&2; usage >&2; exit 2 ;;
  esac
done
((${#scenarios[@]} > 0)) || { usage; exit 2; }
budget=${MOESH_DEVICE_BUDGET_S:-560}
source tools/device/steps.sh || exit 1
export MOESH_REQUIRE_CUDA=1 MOESH_SOURCE_DIR=$PWD
record_env

# DeepSeek-V2-Lite's config.json (the weights are made on the GPUs: --load_format dummy),
# and the small v2-lite model with real random weights.
moesh=$D/bin/moesh real=/tmp/v2-lite-real small=/tmp/v2-lite-small
made=()  # once per call: the config follows this build's mkmodel
real_model() {
  [[ " ${made[*]} " == *" real "* ]] && return 0
  made+=(real)
  $moesh mkmodel --family v2-lite --preset real --config_only --out $real >> "$LOGS/mkmodel.log" 2>&1
}
small_model() {
  [[ " ${made[*]} " == *" small "* ]] && return 0
  made+=(small)
  $moesh mkmodel --family v2-lite --preset small --out $small --seed 1 >> "$LOGS/mkmodel.log" 2>&1
}
shown=()
# A colocated router on the GPU (moesh_router --colocated --device cuda, V2-Lite's real shapes,
# dummy weights): start_router NAME [FLAG...] sets $port (gRPC), $mport (metrics) and $rpid,
# logs to router_NAME.log and waits for it to serve; stop_router ends it (SIGTERM: it drains).
start_router() {
  local name=$1 ready=/tmp/moesh-router-$1.ready
  shift
  real_model
  port=$((23000 + RANDOM % 20000)) mport=$((43000 + RANDOM % 10000))
  rm -f "$ready"
  $D/bin/moesh_router --model $real --colocated --device cuda --load_format dummy "$@" \
    --listen 127.0.0.1:$port --metrics_listen 127.0.0.1:$mport --ready_file "$ready" \
    > "$LOGS/router_$name.log" 2>&1 &
  rpid=$!
  for _ in $(seq 1 300); do [[ -f $ready ]] && break; sleep 0.5; done
}
stop_router() { kill -TERM $rpid 2> /dev/null; wait $rpid 2> /dev/null; }
# serve_local NAME SERVE_LOCAL_FLAG...: `moesh serve-local` in the background (its gRPC port in
# $port, its pid in $cpid, its log cluster_NAME.log); returns 0 once it serves, 1 if it exits
# or does not come up within 300 s. stop_serve_local ends it.
serve_local() {
  local name=$1
  shift
  port=$((23000 + RANDOM % 20000))
  $moesh serve-local --port $port --http_port -1 --work_dir /tmp/moesh-cluster-$name "$@" \
    > "$LOGS/cluster_$name.log" 2>&1 &
  cpid=$!
  for _ in $(seq 1 600); do
    grep -q "moesh is serving" "$LOGS/cluster_$name.log" && return 0
    kill -0 $cpid 2> /dev/null || break
    sleep 0.5
  done
  return 1
}
stop_serve_local() { kill -INT $cpid 2> /dev/null; wait $cpid 2> /dev/null; }
# The cluster on this one GPU over cuda_ipc under MPS (serve_local with --device cuda
# --load_format dummy --transport cuda_ipc --expert_workers 1: router, prefill, decode and expert
# workers as processes, V2-Lite's real shapes): start_cluster NAME [SERVE_LOCAL_FLAG...]; returns
# 1 where MPS does not start. stop_cluster ends it and MPS.
start_cluster() {
  local name=$1
  shift
  real_model
  mps_start || return 1
  serve_local "$name" --model $real --device cuda --load_format dummy --transport cuda_ipc \
    --expert_workers 1 "$@"
}
stop_cluster() { stop_serve_local; mps_stop; }
# proc_metrics_port NAME PROC: the metrics port of serve-local NAME's process PROC (decode-0,
# expert-0, router) from its log.
proc_metrics_port() {
  sed -n -E "s|^  $2 .*metrics http://[^ ]*:([0-9]+)/metrics.*|\1|p" "$LOGS/cluster_$1.log" | head -1
}
# metrics_step NAME PORT ERE: the lines of 127.0.0.1:PORT/metrics matching ERE, as a step.
metrics_step() {
  step "$1" 10 bash -c "exec 3<>/dev/tcp/127.0.0.1/$2 && \
    printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 && grep -E '$3' <&3"
}

steady() {
  real_model
  local b=(--serving --model $real --load_format dummy --prompt_len 64 --max_new_tokens ${MOESH_NEW_TOKENS:-256}
           --requests 128 --concurrency 128 --device cuda)
  ((gpus >= 2)) && step steady_gpu1 240 $moesh bench "${b[@]}" --modes ${MOESH_MODES:-colocated,cluster-ipc} \
    --expert_device cuda:1 --expert_workers 1
  if [[ -z ${MOESH_SKIP_MPS:-} ]] && mps_start; then
    step steady_mps_gpu0 150 $moesh bench "${b[@]}" --modes colocated,cluster-ipc --expert_workers 1
    mps_stop
  fi
  shown+=(steady_gpu1 steady_mps_gpu0)
}

kv() {
  real_model
  local b=(--serving --model $real --load_format dummy --prompt_len ${MOESH_PROMPT_LEN:-512} --max_new_tokens 32
           --requests 128 --concurrency 128 --device cuda --expert_workers 1)
  if mps_start; then
    step kv_mps_gpu0 240 $moesh bench "${b[@]}" --modes ${MOESH_MPS_MODES:-colocated,cluster-ipc-hostkv,cluster-ipc}
    mps_stop
  fi
  ((gpus >= 2)) && [[ -z ${MOESH_SKIP_GPU1:-} ]] &&
    step kv_gpu1 200 $moesh bench "${b[@]}" --modes cluster-ipc-hostkv,cluster-ipc --expert_device cuda:1
  shown+=(kv_mps_gpu0 kv_gpu1)
}

ipc() {
  real_model
  local b=(--serving --model $real --load_format dummy --prompt_len 64 --max_new_tokens 32 --requests 128
           --concurrency ${MOESH_CONCURRENCY:-32,128} --device cuda)
  step serve_gpu0 120 $moesh bench "${b[@]}" --modes colocated,cluster-ipc --expert_workers 1
  if ((gpus >= 2)); then
    step serve_gpu1_w1 90 $moesh bench "${b[@]}" --modes cluster-ipc --expert_device cuda:1 --expert_workers 1
    step serve_gpu1_w2 90 $moesh bench "${b[@]}" --modes cluster-ipc --expert_device cuda:1 --expert_workers 2
  fi
  if [[ -n ${MOESH_TRY_MPS:-} ]] && mps_start; then
    step mps_serve_gpu0 120 $moesh bench "${b[@]}" --modes colocated,cluster-ipc --expert_workers 1
    mps_stop
  fi
  shown+=(serve_gpu0 serve_gpu1_w1 serve_gpu1_w2 mps_serve_gpu0)
}

multi() {
  if [[ -z ${MOESH_ONLY_REAL:-} ]]; then
    small_model
    local bs=(--serving --model $small --requests 64 --prompt_len 64 --max_new_tokens 32 --concurrency 1,16,64)
    step bench_1gpu 150 $moesh bench "${bs[@]}" --device cuda --modes colocated,cluster
    ((gpus >= 2)) && step bench_2gpu 120 $moesh bench "${bs[@]}" --device cuda --expert_device cuda:1 \
      --modes cluster,cluster-nccl
  fi
  real_model
  local br=(--serving --model $real --load_format dummy --prompt_len 64 --max_new_tokens 32 --concurrency 32,128
            --requests 128)
  step bench_real_1gpu 220 $moesh bench "${br[@]}" --device cuda --modes colocated,cluster
  ((gpus >= 2)) && step bench_real_2gpu 200 $moesh bench "${br[@]}" --device cuda --expert_device cuda:1 \
    --modes cluster,cluster-nccl
  shown+=(bench_1gpu bench_2gpu bench_real_1gpu bench_real_2gpu)
}

largest() {
  local layers=${MOESH_LAYERS:-8}
  local v3=/tmp/v3-real-$layers
  $moesh mkmodel --family v3 --preset real --config_only --layers $layers --out $v3 >> "$LOGS/mkmodel.log" 2>&1
  step v3_serving 300 $moesh bench --serving --model $v3 --load_format dummy --prompt_len 64 \
    --max_new_tokens ${MOESH_NEW_TOKENS:-128} --requests 64 --concurrency 64 --device cuda --expert_device cuda:1 \
    --expert_workers 1 --modes ${MOESH_MODES:-colocated,cluster-nccl}
  nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv >> "$LOGS/env.txt"
  shown+=(v3_serving)
}

chunked() {
  local b
  IFS=, read -ra budgets <<< "${MOESH_BUDGETS:-0,256,2048}"
  for b in "${budgets[@]}"; do
    start_router "chunked_$b" --max_num_batched_tokens "$b"
    step "chunked_budget_$b" 150 $moesh bench --serving --server 127.0.0.1:$port --dataset random \
      --length_sigma 0 --prompt_len ${MOESH_PROMPT_LEN:-512} --max_new_tokens 128 --requests 256 \
      --concurrency 64 --request_rate ${MOESH_RATE:-inf}
    stop_router
    shown+=("chunked_budget_$b")
  done
}

prefix() {
  local on
  for on in true false; do
    start_router "prefix_$on" --enable_prefix_caching=$on
    step "prefix_cache_$on" 200 $moesh bench --serving --server 127.0.0.1:$port --dataset multiturn \
      --turns 4 --system_prompts 4 --system_prompt_len ${MOESH_SYSTEM_LEN:-1024} --prompt_len 128 \
      --max_new_tokens 64 --requests 256 --concurrency ${MOESH_CONCURRENCY:-32}
    stop_router
    shown+=("prefix_cache_$on")
  done
}

swap() {
  local mode
  IFS=, read -ra modes <<< "${MOESH_PREEMPTION_MODES:-recompute,swap}"
  for mode in "${modes[@]}"; do
    start_router "swap_$mode" --gpu_memory_utilization ${MOESH_GPU_UTIL:-0.3} --max_model_len 4096 \
      --max_batch 256 --preemption_mode "$mode"
    step "swap_$mode" 240 $moesh bench --serving --server 127.0.0.1:$port --dataset random \
      --length_sigma 0 --prompt_len ${MOESH_PROMPT_LEN:-512} --max_new_tokens ${MOESH_NEW_TOKENS:-1024} \
      --requests 256 --concurrency 256 --request_rate inf
    metrics_step "swap_metrics_$mode" $mport '^moesh_(decode_(preempt|swap)|kv_cache)'
    stop_router
    shown+=("swap_$mode" "swap_metrics_$mode")
  done
}

# Steady serving against the kernel-level decode rate (issue 20): a colocated router under
# a closed loop of $MOESH_CONCURRENCY (128) streams, --requests $MOESH_REQUESTS (1024) of 64-token
# prompts and lognormal (sigma 0.5) answers of mean $MOESH_NEW_TOKENS (512) tokens, so the
# streams end and refill at different steps; then cuda_model_bench's decode step at the same
# batch at 256 and 512 tokens of context (what a stream holds on average lies between), in the
# same call.
rate() {
  local conc=${MOESH_CONCURRENCY:-128}
  local load=(--dataset random --length_sigma 0.5 --prompt_len 64 --max_new_tokens ${MOESH_NEW_TOKENS:-512}
              --requests ${MOESH_REQUESTS:-1024} --concurrency $conc --request_rate inf)
  # The decode engine's step times beside the client's rate: time inside steps against the run's
  # wall time, and the mean step against cuda_model_bench's below.
  local steps='^moesh_(decode_(step_seconds|batch_size|step_tokens)|expert_[a-z_]*seconds)_(sum|count)'
  local p mp
  if [[ -z ${MOESH_SKIP_COLOCATED:-} ]]; then
    start_router rate --max_batch 256
    step "rate_serving" 300 $moesh bench --serving --server 127.0.0.1:$port "${load[@]}"
    metrics_step rate_serving_steps $mport "$steps"
    stop_router
    shown+=(rate_serving rate_serving_steps)
  fi
  if [[ -z ${MOESH_SKIP_CLUSTER:-} ]] && start_cluster rate; then
    step "rate_serving_cluster_ipc" 300 $moesh bench --serving --server 127.0.0.1:$port "${load[@]}"
    for p in decode-0 expert-0; do
      mp=$(proc_metrics_port rate $p)
      [[ -n $mp ]] && metrics_step "rate_cluster_steps_$p" "$mp" "$steps"
      shown+=("rate_cluster_steps_$p")
    done
    stop_cluster
    shown+=(rate_serving_cluster_ipc)
  fi
  # The same cluster with short prompts computed by the decode worker (conditional
  # disaggregation: --max_local_prefill_tokens $MOESH_LOCAL_PREFILL, default 512).
  if [[ -z ${MOESH_SKIP_CLUSTER:-} && -n ${MOESH_LOCAL_PREFILL-512} ]] &&
     start_cluster rate_local --max_local_prefill_tokens ${MOESH_LOCAL_PREFILL:-512}; then
    step "rate_serving_cluster_ipc_local" 300 $moesh bench --serving --server 127.0.0.1:$port \
      "${load[@]}"
    metrics_step rate_cluster_local_router "$(proc_metrics_port rate_local router)" \
      '^moesh_local_prefills_total'
    mp=$(proc_metrics_port rate_local decode-0)
    [[ -n $mp ]] && metrics_step rate_cluster_local_decode "$mp" "$steps"
    stop_cluster
    shown+=(rate_serving_cluster_ipc_local rate_cluster_local_router rate_cluster_local_decode)
  fi
  local ctx
  [[ -n ${MOESH_SKIP_KERNEL:-} ]] && return
  for ctx in 256 512; do
    step "rate_kernel_$ctx" 120 $D/bin/cuda_model_bench --device cuda --load-format dummy --shape v2-lite \
      --batch $conc --context $ctx --prefill-seqs 0
    shown+=("rate_kernel_$ctx")
  done
}

# Admission on a small pool (issue 20): 64 requests x 2000 new tokens (32-token prompts) on a
# colocated router whose KV cache holds fewer tokens than they need together
# (--gpu_memory_utilization $MOESH_GPU_UTIL, default 0.25: ~3 GB of cache beside the weights'
# ~31 GB; --max_model_len 4096); the refusals (none expected), the preemptions and the pool.
admission() {
  start_router admission --gpu_memory_utilization ${MOESH_GPU_UTIL:-0.25} --max_model_len 4096
  step "admission" 240 $moesh bench --serving --server 127.0.0.1:$port --dataset random \
    --length_sigma 0 --prompt_len 32 --max_new_tokens 2000 --requests 64 --concurrency 64 \
    --request_rate inf
  metrics_step admission_metrics $mport '^moesh_(decode_preempt|kv_cache)'
  stop_router
  shown+=(admission admission_metrics)
}

# The OpenAI HTTP front against the gRPC API on this machine's CPU cores (issue 19: the 2-core
# VM is too loaded to settle ITL p99 differences of a millisecond): a CPU cluster on the tiny
# v3 model, cluster and cluster-http interleaved twice, 128 streams.
http() {
  local tiny=/tmp/v3-tiny
  $moesh mkmodel --family v3 --preset tiny --out $tiny >> "$LOGS/mkmodel.log" 2>&1
  # --logprobs 0: the gRPC rows ask each token's log-probability too, as the HTTP rows must (they
  # time tokens by id: logprobs 0 with return_tokens_as_token_ids), so both do the same work.
  if [[ -z ${MOESH_HTTP_GPU_ONLY:-} ]]; then
    step http_vs_grpc 300 $moesh bench --serving --model $tiny --modes cluster,cluster-http,cluster,cluster-http \
      --concurrency 32,128 --requests 384 --max_new_tokens 64 --prompt_len 32 --logprobs 0
    shown+=(http_vs_grpc)
  fi
  # On the GPU: a colocated router on the small v2-lite model (its 8192-token vocabulary is the
  # tokenizer's, so every sampled token has text and each SSE chunk carries one); 3072 requests a
  # row (a row of 384 lasts ~0.5 s at 128 streams and swung 0.70-1.01x on one build), three pairs.
  small_model
  step http_vs_grpc_gpu 200 $moesh bench --serving --model $small --device cuda \
    --modes colocated,colocated-http,colocated,colocated-http,colocated,colocated-http \
    --concurrency 128 --requests 3072 --max_new_tokens 64 --prompt_len 32 --logprobs 0
  shown+=(http_vs_grpc_gpu)
}

# Hit rate per routing policy (issue 20): multi-turn chats whose histories (a prefill worker holds
# a conversation's earlier prompts only where they ran) outweigh the shared system prompts (every
# worker soon holds those), against a cluster of two prefill workers (`moesh serve-local
# --prefill_workers 2 --routing_policy P`), once per policy in $MOESH_POLICIES
# (kv_aware,load,round_robin). routing_rows START STOP NAME [SERVE_LOCAL_FLAG...]: START/STOP
# are serve_local/stop_serve_local or start_cluster/stop_cluster; the steps are NAME_<policy>.
routing_rows() {
  local start=$1 stop=$2 name=$3 policy
  shift 3
  IFS=, read -ra policies <<< "${MOESH_POLICIES:-kv_aware,load,round_robin}"
  for policy in "${policies[@]}"; do
    if $start "${name}_$policy" "$@" --prefill_workers 2 --routing_policy $policy; then
      step "${name}_$policy" 200 $moesh bench --serving --server 127.0.0.1:$port --dataset multiturn \
        --turns 4 --system_prompts 4 --system_prompt_len 64 --prompt_len 192 --max_new_tokens 16 \
        --requests 192 --concurrency 16
    fi
    $stop
    shown+=("${name}_$policy")
  done
}
# A CPU cluster on this machine's cores: the small v2-lite model, one decode and one expert worker.
routing() {
  small_model
  routing_rows serve_local stop_serve_local routing --model $small --expert_workers 1
}
# The same on the GPU: the cluster over cuda_ipc under MPS (V2-Lite's real shapes, dummy
# weights; the two prefill workers split the prefill share of the GPU's memory).
routing_gpu() { routing_rows start_cluster stop_cluster routing_gpu; }

# Issue 20's latency bounds on the cluster over cuda_ipc under MPS, once per configuration in
# $MOESH_CLUSTER_CONFIGS (remote,local,remote-nocache,local-nocache; local:
# --max_local_prefill_tokens $MOESH_LOCAL_PREFILL, 512; nocache: --enable_prefix_caching=false and
# only the multi-turn row): the closed-loop maximum of 512 + 128-token requests at 64 in flight,
# then Poisson arrivals at 80% of that rate (ITL p99 against p50; other prompts: --seed), then the
# multi-turn chats of `prefix` (hit rate and TTFT) at $MOESH_PREFIX_CONCURRENCY (32).
latency_cluster() {
  local cfg max rate
  local load=(--dataset random --length_sigma 0 --prompt_len ${MOESH_PROMPT_LEN:-512} --max_new_tokens 128
              --requests 256 --concurrency 64)
  local turns=(--dataset multiturn --turns 4 --system_prompts 4 --system_prompt_len ${MOESH_SYSTEM_LEN:-1024}
               --prompt_len 128 --max_new_tokens 64 --requests 256
               --concurrency ${MOESH_PREFIX_CONCURRENCY:-32} --seed 2001)
  IFS=, read -ra cfgs <<< "${MOESH_CLUSTER_CONFIGS:-remote,local,remote-nocache,local-nocache}"
  for cfg in "${cfgs[@]}"; do
    local extra=()
    [[ $cfg == local* ]] && extra+=(--max_local_prefill_tokens ${MOESH_LOCAL_PREFILL:-512})
    [[ $cfg == *nocache ]] && extra+=(--enable_prefix_caching=false)
    start_cluster "lat_$cfg" "${extra[@]}" || continue
    if [[ $cfg == *nocache ]]; then  # the multi-turn rows' baseline alone
      step "lat_${cfg}_multiturn" 200 $moesh bench --serving --server 127.0.0.1:$port "${turns[@]}"
      stop_cluster
      shown+=("lat_${cfg}_multiturn")
      continue
    fi
    step "lat_${cfg}_max" 150 $moesh bench --serving --server 127.0.0.1:$port "${load[@]}" \
      --request_rate inf
    # req/s is the table's eighth column.
    max=$(awk -F'|' '$2 ~ /inf/ {gsub(/ /, "", $9); print $9}' "$LOGS/lat_${cfg}_max.log" | tail -1)
    rate=$(awk -v m="${max:-0}" 'BEGIN {printf "%.2f", 0.8 * m}')
    if [[ $rate != 0.00 ]]; then
      step "lat_${cfg}_poisson" 150 $moesh bench --serving --server 127.0.0.1:$port "${load[@]}" \
        --request_rate "$rate" --seed 1001
    fi
    step "lat_${cfg}_multiturn" 200 $moesh bench --serving --server 127.0.0.1:$port "${turns[@]}"
    stop_cluster
    shown+=("lat_${cfg}_max" "lat_${cfg}_poisson" "lat_${cfg}_multiturn")
  done
}

fullsize() {
  local family=${MOESH_FAMILY:-v3} conc=${MOESH_CONCURRENCY:-64,128,256}
  local layers=${MOESH_LAYERS:-} dir=/tmp/fullsize-${MOESH_FAMILY:-v3} extra=() experts=() mode
  local largest=${conc##*,}
  local requests=${MOESH_REQUESTS:-$((2 * largest))}
  local mk=(mkmodel --family "$family" --preset real --config_only --out "$dir")
  [[ -n $layers ]] && mk+=(--layers "$layers")
  if [[ $family == v3 ]]; then mk+=(--dtype fp8); else extra=(--quantization fp8); fi
  $moesh "${mk[@]}" >> "$LOGS/mkmodel.log" 2>&1 || { echo "fullsize: mkmodel failed" >&2; return; }
  # The expert workers' GPUs: 1 .. gpus - 1 (V2: 0 .. gpus - 1); one GPU: colocated.
  local first=1
  [[ $family != v3 ]] && first=0
  for ((g = first; g < gpus; g++)); do experts+=("cuda:$g"); done
  if ((gpus < 2)); then
    mode=${MOESH_ONE_GPU_MODE:-colocated} experts=(cuda:0)
    # The cluster on one GPU: its processes share it under MPS.
    if [[ $mode != colocated ]] && ! mps_start; then
      echo "fullsize: MPS did not start" >&2
      return
    fi
  else
    mode=cluster-nccl
  fi
  local list
  list=$(IFS=,; echo "${experts[*]}")
  # The attention workers' shares of GPU 0 (serve-local's 0.6 / 0.8 unless set).
  [[ -n ${MOESH_DECODE_UTIL:-} ]] && extra+=(--decode_gpu_memory_utilization "$MOESH_DECODE_UTIL")
  [[ -n ${MOESH_PREFILL_UTIL:-} ]] && extra+=(--prefill_gpu_memory_utilization "$MOESH_PREFILL_UTIL")
  IFS=, read -ra workloads <<< "${MOESH_WORKLOADS:-1024:1024,4096:512}"
  for wl in "${workloads[@]}"; do
    # Resident bytes per GPU: sampled every second while the row runs, the most kept.
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 1000 \
      > "$LOGS/fullsize_smi.txt" 2> /dev/null &
    local smi=$!
    step "fullsize_${wl/:/_}" 590 $moesh bench --serving --model "$dir" --load_format dummy --device cuda:0 \
      "${extra[@]}" --expert_device "$list" --expert_workers ${#experts[@]} --modes $mode \
      --prompt_len "${wl%%:*}" --max_new_tokens "${wl##*:}" --requests "$requests" --concurrency "$conc"
    kill $smi 2> /dev/null; wait $smi 2> /dev/null
    awk -F', *' -v wl="$wl" '{ if ($2 > m[$1]) m[$1] = $2 }
      END { for (g in m) printf "%s: GPU %s at most %d MiB resident\n", wl, g, m[g] }' \
      "$LOGS/fullsize_smi.txt" | sort >> "$LOGS/fullsize_memory.txt"
    shown+=("fullsize_${wl/:/_}")
  done
  # Expert-GPU scaling at the first workload, concurrency 128.
  if ((gpus > 2)); then
    local wl=${workloads[0]}
    for ((k = 1; k <= ${#experts[@]}; k++)); do
      local some
      some=$(IFS=,; echo "${experts[*]:0:k}")
      step "fullsize_scaling_$k" 590 $moesh bench --serving --model "$dir" --load_format dummy \
        --device cuda:0 "${extra[@]}" --expert_device "$some" --expert_workers "$k" --modes $mode \
        --prompt_len "${wl%%:*}" --max_new_tokens "${wl##*:}" --requests 256 --concurrency 128
      shown+=("fullsize_scaling_$k")
    done
  fi
  shown+=(fullsize_memory)
  cp "$LOGS/fullsize_memory.txt" "$LOGS/fullsize_memory.log" 2> /dev/null
  if ((gpus < 2)) && [[ $mode != colocated ]]; then mps_stop; fi
}

rebalance() {
  # The rebalancer over time (CPU cluster, this machine's cores): a skewed
  # placement, tokens/s and the expert workers' balance per second.
  small_model
  step rebalance_timeline 60 $moesh bench --serving --model $small --rebalance_timeline 30 --rebalance_interval 5 \
    --concurrency 32 --prompt_len 32 --max_new_tokens 64
  shown+=(rebalance_timeline)
}

dispatch_ipc() {
  step dispatch_gpu0 100 $D/bin/cuda_dispatch_bench --workers 1,2 --batch 1,32,128,256 --reps 30
  ((gpus >= 2)) && step dispatch_gpu1 100 $D/bin/cuda_dispatch_bench --workers 1,2 --batch 1,32,128,256 --reps 30 \
    --server-device 1
  if [[ -n ${MOESH_TRY_MPS:-} ]] && mps_start; then
    step mps_dispatch_gpu0 100 $D/bin/cuda_dispatch_bench --workers 1 --batch 1,128,256 --reps 30
    mps_stop
  fi
  shown+=(dispatch_gpu0 dispatch_gpu1 mps_dispatch_gpu0)
}

dispatch_mps() {
  if mps_start; then
    step mps_dispatch 120 $D/bin/cuda_dispatch_bench --workers 1 --batch 128,256 --reps 30 --step-batch 128,256
    mps_stop
  fi
  shown+=(mps_dispatch)
}

dispatch_nccl() {
  local b=(--workers 1 --batch 1,32,128,256 --reps 30 --server-device 1 --step-batch 1,32,128,256 --context 2048)
  step dispatch_nccl 120 $D/bin/cuda_dispatch_bench --transport nccl "${b[@]}"
  step dispatch_ipc 100 $D/bin/cuda_dispatch_bench --transport cuda_ipc "${b[@]}"
  shown+=(dispatch_nccl dispatch_ipc)
}

dispatch_overlap() {
  local common=(--overlap --workers 1 --batch 128 --reps 10 --step-batch 32,128,256 --context 2048)
  step overlap_nccl 120 $D/bin/cuda_dispatch_bench --transport nccl --server-device 1 "${common[@]}"
  if mps_start; then
    step overlap_ipc_mps 120 $D/bin/cuda_dispatch_bench --transport cuda_ipc "${common[@]}"
    mps_stop
  fi
  shown+=(overlap_nccl overlap_ipc_mps)
}

for s in "${scenarios[@]}"; do
  "$s"
done
finish
for f in "${shown[@]}"; do
  show "$f"
done
