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
#              the layer count given (V3 FP8: 13 layers fit; 61 need eight GPUs).
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
#   libmoesh_cuda_backends.so for the serving scenarios; cuda_dispatch_bench
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
    steady|kv|ipc|multi|largest|chunked|prefix|swap|fullsize|rebalance) scenarios+=("$1"); shift ;;
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
  real_model
  local b port ready
  IFS=, read -ra budgets <<< "${MOESH_BUDGETS:-0,256,2048}"
  for b in "${budgets[@]}"; do
    port=$((23000 + RANDOM % 20000)) ready=/tmp/moesh-chunked-$b.ready
    rm -f "$ready"
    $D/bin/moesh_router --model $real --colocated --device cuda --load_format dummy \
      --max_num_batched_tokens "$b" --listen 127.0.0.1:$port --ready_file "$ready" \
      > "$LOGS/chunked_router_$b.log" 2>&1 &
    local rpid=$!
    for _ in $(seq 1 300); do [[ -f $ready ]] && break; sleep 0.5; done
    step "chunked_budget_$b" 150 $moesh bench --serving --server 127.0.0.1:$port --dataset random \
      --length_sigma 0 --prompt_len ${MOESH_PROMPT_LEN:-512} --max_new_tokens 128 --requests 256 \
      --concurrency 64 --request_rate ${MOESH_RATE:-inf}
    kill -TERM $rpid 2> /dev/null; wait $rpid 2> /dev/null
    shown+=("chunked_budget_$b")
  done
}

prefix() {
  real_model
  local on port ready
  for on in true false; do
    port=$((23000 + RANDOM % 20000)) ready=/tmp/moesh-prefix-$on.ready
    rm -f "$ready"
    $D/bin/moesh_router --model $real --colocated --device cuda --load_format dummy \
      --enable_prefix_caching=$on --listen 127.0.0.1:$port --ready_file "$ready" \
      > "$LOGS/prefix_router_$on.log" 2>&1 &
    local rpid=$!
    for _ in $(seq 1 300); do [[ -f $ready ]] && break; sleep 0.5; done
    step "prefix_cache_$on" 200 $moesh bench --serving --server 127.0.0.1:$port --dataset multiturn \
      --turns 4 --system_prompts 4 --system_prompt_len ${MOESH_SYSTEM_LEN:-1024} --prompt_len 128 \
      --max_new_tokens 64 --requests 256 --concurrency ${MOESH_CONCURRENCY:-32}
    kill -TERM $rpid 2> /dev/null; wait $rpid 2> /dev/null
    shown+=("prefix_cache_$on")
  done
}

swap() {
  real_model
  local mode port mport ready
  IFS=, read -ra modes <<< "${MOESH_PREEMPTION_MODES:-recompute,swap}"
  for mode in "${modes[@]}"; do
    port=$((23000 + RANDOM % 20000)) mport=$((43000 + RANDOM % 10000)) ready=/tmp/moesh-swap-$mode.ready
    rm -f "$ready"
    $D/bin/moesh_router --model $real --colocated --device cuda --load_format dummy \
      --gpu_memory_utilization ${MOESH_GPU_UTIL:-0.3} --max_model_len 4096 --max_batch 256 \
      --preemption_mode "$mode" \
      --listen 127.0.0.1:$port --metrics_listen 127.0.0.1:$mport --ready_file "$ready" \
      > "$LOGS/swap_router_$mode.log" 2>&1 &
    local rpid=$!
    for _ in $(seq 1 300); do [[ -f $ready ]] && break; sleep 0.5; done
    step "swap_$mode" 240 $moesh bench --serving --server 127.0.0.1:$port --dataset random \
      --length_sigma 0 --prompt_len ${MOESH_PROMPT_LEN:-512} --max_new_tokens ${MOESH_NEW_TOKENS:-1024} \
      --requests 256 --concurrency 256 --request_rate inf
    step "swap_metrics_$mode" 10 bash -c "exec 3<>/dev/tcp/127.0.0.1/$mport && \
      printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 && grep -E '^moesh_(decode_(preempt|swap)|kv_cache)' <&3"
    kill -TERM $rpid 2> /dev/null; wait $rpid 2> /dev/null
    shown+=("swap_$mode" "swap_metrics_$mode")
  done
}

fullsize() {
  local family=${MOESH_FAMILY:-v3} conc=${MOESH_CONCURRENCY:-64,128,256}
  local layers=${MOESH_LAYERS:-} dir=/tmp/fullsize-${MOESH_FAMILY:-v3} quant=() experts=() mode
  local largest=${conc##*,}
  local requests=${MOESH_REQUESTS:-$((2 * largest))}
  local mk=(mkmodel --family "$family" --preset real --config_only --out "$dir")
  [[ -n $layers ]] && mk+=(--layers "$layers")
  if [[ $family == v3 ]]; then mk+=(--dtype fp8); else quant=(--quantization fp8); fi
  $moesh "${mk[@]}" >> "$LOGS/mkmodel.log" 2>&1 || { echo "fullsize: mkmodel failed" >&2; return; }
  # The expert workers' GPUs: 1 .. gpus - 1 (V2: 0 .. gpus - 1); one GPU: colocated.
  local first=1
  [[ $family != v3 ]] && first=0
  for ((g = first; g < gpus; g++)); do experts+=("cuda:$g"); done
  if ((gpus < 2)); then
    mode=colocated experts=(cuda:0)
  else
    mode=cluster-nccl
  fi
  local list
  list=$(IFS=,; echo "${experts[*]}")
  IFS=, read -ra workloads <<< "${MOESH_WORKLOADS:-1024:1024,4096:512}"
  for wl in "${workloads[@]}"; do
    # Resident bytes per GPU: sampled every second while the row runs, the most kept.
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 1000 \
      > "$LOGS/fullsize_smi.txt" 2> /dev/null &
    local smi=$!
    step "fullsize_${wl/:/_}" 590 $moesh bench --serving --model "$dir" --load_format dummy --device cuda:0 \
      "${quant[@]}" --expert_device "$list" --expert_workers ${#experts[@]} --modes $mode \
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
        --device cuda:0 "${quant[@]}" --expert_device "$some" --expert_workers "$k" --modes $mode \
        --prompt_len "${wl%%:*}" --max_new_tokens "${wl##*:}" --requests 256 --concurrency 128
      shown+=("fullsize_scaling_$k")
    done
  fi
  shown+=(fullsize_memory)
  cp "$LOGS/fullsize_memory.txt" "$LOGS/fullsize_memory.log" 2> /dev/null
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
