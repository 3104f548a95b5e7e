#!/usr/bin/env bash
# The cluster on a GPU: `moesh serve-local --device cuda` (prefill and decode
# workers with attention on the GPU, two expert workers with their shards on
# the GPU, experts exchanged over the data plane) against `moesh generate
# --device cuda` (the whole model on the GPU in one process) on a golden
# checkpoint: the same greedy tokens and log-probabilities within 1e-3 (the
# two shards' partial sums add in another order), for prompts one at a time.
# Then the same through the CPU cluster's reference, `moesh generate`: the
# first tokens agree (bf16 against fp32; cuda_model_test owns the full rule).
#
# usage: cuda_cluster_test.sh PATH/TO/moesh SOURCE_DIR [MODEL_NAME]
# MOESH_EXPERT_DEVICE=cuda:1 puts the expert workers on a second GPU (a list,
# cuda:0,cuda:1, one on each);
# MOESH_TRANSPORT=nccl (with it) sends the expert dispatch over NCCL, GPU to GPU
# (the KV handoff device to device too);
# MOESH_TRANSPORT=cuda_ipc keeps it in device memory (same GPU or another).
# MOESH_KV_CACHE_DTYPE=fp8 runs every attention worker and both references
# with --kv_cache_dtype fp8 (the GPU's FP8 pool against the CPU engine's FP8
# cache).
# MOESH_PROMPTS (space-separated id lists) and MOESH_NEW_TOKENS replace the
# prompts and lengths; MOESH_MULTI_TURN=0 leaves out the second-turn (prefix
# cache) check.
# Exits 77 (ctest: skipped) where no CUDA device is present, saying so.
set -euo pipefail
MOESH=${1:?usage: cuda_cluster_test.sh PATH/TO/moesh SOURCE_DIR}
SRC=${2:?usage: cuda_cluster_test.sh PATH/TO/moesh SOURCE_DIR}
MODEL="$SRC/tests/golden/${3:-v3}"
EXPERT_DEVICE=${MOESH_EXPERT_DEVICE:-cuda}
TRANSPORT=${MOESH_TRANSPORT:-grpc}
KV=(--kv_cache_dtype "${MOESH_KV_CACHE_DTYPE:-auto}")
source "$SRC/tests/integration/serve_local_lib.sh"
serve_local_setup moesh_cuda_cluster

require_cuda_generate "$MODEL"

start_serve_local --model "$MODEL" --device cuda --expert_device "$EXPERT_DEVICE" --transport "$TRANSPORT" \
  --expert_workers 2 "${KV[@]}"
grep -q "cuda:" "$TMP"/cluster/*.log || fail "no worker reports a CUDA device in its log"
grep -h -E "worker (for|serving)" "$TMP"/cluster/*.log | sed 's/^/  /' || true
if [ "$EXPERT_DEVICE" != cuda ]; then
  for d in ${EXPERT_DEVICE//,/ }; do  # a list: one expert worker on each in turn
    grep -q "($d, data plane $TRANSPORT" "$TMP"/cluster/expert-*.log \
      || fail "no expert worker is on $d with $TRANSPORT"
  done
fi

check_ipc() {  # the device paths, not the host ones, carried the experts and the KV
  case "$TRANSPORT" in
    cuda_ipc) grep -q "attached device buffers" "$TMP"/cluster/expert-*.log \
                || fail "transport cuda_ipc: no expert worker had device buffers attached" ;;
    nccl) grep -q "dispatches device-resident" "$TMP"/cluster/expert-*.log \
            || fail "transport nccl: no expert worker was dispatched to GPU to GPU" ;;
    *) return 0 ;;
  esac
  grep -q "KV handoff copied device to device" "$TMP"/cluster/decode-*.log \
    || fail "transport $TRANSPORT: the decode worker took no KV from the prefill worker's device memory"
}

PROMPTS=${MOESH_PROMPTS:-5,17,300,42,9 1,2,3 400,7,7,7,100,250,3,4,60,61,62,63,64,65,66,67,68}
for prompt in $PROMPTS; do
  args=(--prompt_ids "$prompt" --max_new_tokens "${MOESH_NEW_TOKENS:-12}" --ignore_eos --top_logprobs 1 --json)
  cluster=$("$MOESH" complete --server "127.0.0.1:$port" "${args[@]}") || fail "complete: $cluster"
  single=$("$MOESH" generate --model "$MODEL" --device cuda "${KV[@]}" "${args[@]}") || fail "generate: $single"
  compare_outputs "$cluster" "$single" "prompt $prompt (the GPU cluster vs generate --device cuda)"
  cpu=$("$MOESH" generate --model "$MODEL" "${KV[@]}" "${args[@]}" --top_logprobs 5)
  # The first 4 tokens are the CPU engine's, but for a near-tie: where the GPU
  # takes another token first, the CPU's own margin between its pick and the
  # GPU's must be within the cache's error (bf16 rows: 1e-2; FP8 rows round
  # near-ties apart: 6e-2, twice the teacher-forced worst at tiny widths in
  # cuda_kv_fp8_test), and the histories part there.
  "$PY" - "$single" "$cpu" "${MOESH_KV_CACHE_DTYPE:-auto}" <<'PYEOF' || fail "generate --device cuda left the CPU engine within its first 4 tokens"
import json, sys
g, c = json.loads(sys.argv[1]), json.loads(sys.argv[2])
tol = 6e-2 if sys.argv[3] == "fp8" else 1e-2
a, b = g["output_ids"], c["output_ids"]
for i in range(4):
    if a[i] == b[i]:
        continue
    alts = {e["id"]: e["logprob"] for e in c["top_logprobs"][i]}
    margin = c["logprobs"][i] - alts.get(a[i], float("-inf"))
    print("greedy flip at token %d: GPU %d, CPU %d, the CPU's margin there %.2e" % (i, a[i], b[i], margin))
    assert margin <= tol, (a, b, margin)
    break
PYEOF
done
# Prompt log-probabilities on the GPU (the prefill pass's lm_head over every
# position): generate --device cuda as the cluster's CUDA prefill worker (the
# same kernels: within 1e-3) and as the CPU engine within bf16's bound (max
# 0.3 at an indexer near-tie, mean 2.5e-2; cuda_prompt_logprobs_test owns the
# tight rule).
args=(--prompt_ids "400,7,7,7,100,250,3,4" --max_new_tokens 2 --ignore_eos --prompt_logprobs 2 --json)
cluster=$("$MOESH" complete --server "127.0.0.1:$port" "${args[@]}") || fail "complete --prompt_logprobs: $cluster"
single=$("$MOESH" generate --model "$MODEL" --device cuda "${KV[@]}" "${args[@]}") || fail "generate --device cuda --prompt_logprobs: $single"
cpu=$("$MOESH" generate --model "$MODEL" "${KV[@]}" "${args[@]}") || fail "generate --prompt_logprobs: $cpu"
"$PY" - "$cluster" "$single" "$cpu" <<'PYEOF' || fail "prompt log-probabilities on the GPU"
import json, sys
c, g, w = (json.loads(a.splitlines()[0])["prompt_logprobs"] for a in sys.argv[1:4])
assert len(g["logprobs"]) == 7 and all(len(r) == 2 for r in g["top_logprobs"]), g
for x in (c, w):
    assert len(x["logprobs"]) == len(g["logprobs"]), (x, g)
assert max(abs(a - b) for a, b in zip(c["logprobs"], g["logprobs"])) <= 1e-3, (c, g)
d = [abs(a - b) for a, b in zip(g["logprobs"], w["logprobs"])]
print("prompt logprobs, generate --device cuda vs the CPU engine: mean |d| %.3e, max %.3e" %
      (sum(d) / len(d), max(d)))
assert max(d) <= 0.3 and sum(d) / len(d) <= 2.5e-2, d
PYEOF
# A second turn: the prefix cache (on by default) in the workers' device pools.
# Turn 1 sends a 100-token history; turn 2 the history and 6 more tokens: the
# prefill worker computes only what its cache lacks (usage.cached_tokens: the
# history's full 64-token block; none for V4, whose GPU pool does not share
# blocks), the decode worker starts from its own cached block and takes only
# the rest in the KV handoff. Against generate --device cuda computing turn 2
# whole: the same tokens and log-probabilities within 1e-3 (bit for bit on
# the H200: the kernels compute each row independently of the pass's others).
if [ "${MOESH_MULTI_TURN:-1}" = 1 ]; then
  history=$("$PY" -c 'print(",".join(str((i * 37 + 11) % 500) for i in range(100)))')
  args=(--max_new_tokens 12 --ignore_eos --top_logprobs 1 --json)
  "$MOESH" complete --server "127.0.0.1:$port" --prompt_ids "$history" "${args[@]}" >/dev/null ||
    fail "complete (turn 1)"
  turn2="$history,3,1,4,1,5,9"
  cluster=$("$MOESH" complete --server "127.0.0.1:$port" --prompt_ids "$turn2" "${args[@]}") ||
    fail "complete (turn 2): $cluster"
  single=$("$MOESH" generate --model "$MODEL" --device cuda "${KV[@]}" --prompt_ids "$turn2" "${args[@]}") ||
    fail "generate (turn 2): $single"
  want_cached=64
  grep -q '"deepseek_v4"' "$MODEL/config.json" && want_cached=0
  cached=$("$PY" -c 'import json, sys; print(json.loads(sys.argv[1])["usage"]["cached_tokens"])' "$cluster")
  [ "$cached" = "$want_cached" ] || fail "turn 2: $cached cached tokens, want $want_cached"
  compare_outputs "$cluster" "$single" "turn 2 with $cached cached tokens (the GPU cluster vs generate whole)"
fi
# A seeded sampled request with every cut and penalty: the cluster samples on
# the GPU (prefill worker: the first token, decode worker: the rest) exactly
# as generate --device cuda does.
args=(--prompt_ids "${PROMPTS%% *}" --max_new_tokens "${MOESH_NEW_TOKENS:-16}" --ignore_eos --top_logprobs 1 --json --temperature 0.9
      --top_k 40 --top_p 0.9 --min_p 0.02 --seed 7 --repetition_penalty 1.2 --presence_penalty 0.3
      --frequency_penalty 0.1)
cluster=$("$MOESH" complete --server "127.0.0.1:$port" "${args[@]}") || fail "complete (sampled): $cluster"
single=$("$MOESH" generate --model "$MODEL" --device cuda "${KV[@]}" "${args[@]}") || fail "generate (sampled): $single"
compare_outputs "$cluster" "$single" "sampled (the GPU cluster vs generate --device cuda)"
check_ipc
echo "PASS"
