#!/usr/bin/env bash
# Chunked prefill on the GPU: a colocated router on --device cuda with a
# budget of --max_num_batched_tokens 4 (every prompt computed in chunks of at
# most 4 tokens, in the same steps as the running decodes, which the CUDA
# backend runs eagerly: its decode graphs replay one-token steps only) against
# `moesh generate --device cuda` (each prompt whole): the same greedy tokens
# and log-probabilities within 1e-3, with the prompts sent at once so chunks
# and decodes share steps.
#
# usage: cuda_chunked_test.sh PATH/TO/moesh SOURCE_DIR [MODEL_NAME]
# (moesh_router beside moesh). Exits 77 (ctest: skipped) where no CUDA device
# is present, saying so.
set -euo pipefail
MOESH=${1:?usage: cuda_chunked_test.sh PATH/TO/moesh SOURCE_DIR}
SRC=${2:?usage: cuda_chunked_test.sh PATH/TO/moesh SOURCE_DIR}
MODEL="$SRC/tests/golden/${3:-v3}"
ROUTER="$(dirname "$MOESH")/moesh_router"
source "$SRC/tests/integration/serve_local_lib.sh"
serve_local_setup moesh_cuda_chunked
require_cuda_generate "$MODEL"
port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$ROUTER" --model "$MODEL" --colocated --device cuda --max_num_batched_tokens 4 \
  --listen "127.0.0.1:$port" --ready_file "$TMP/ready" >"$TMP/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  [ -f "$TMP/ready" ] && break
  kill -0 "$pid" 2>/dev/null || fail "the colocated router exited"
  sleep 0.2
done
[ -f "$TMP/ready" ] || fail "the colocated router did not come up"
PROMPTS=${MOESH_PROMPTS:-5,17,300,42,9 1,2,3 400,7,7,7,100,250,3,4,60,61,62,63,64,65,66,67,68}
args=(--max_new_tokens "${MOESH_NEW_TOKENS:-12}" --ignore_eos --top_logprobs 1 --json)
i=0
for prompt in $PROMPTS; do  # all at once: chunks of some share steps with others' decodes
  "$MOESH" complete --server "127.0.0.1:$port" --prompt_ids "$prompt" "${args[@]}" >"$TMP/c$i.json" \
    2>"$TMP/c$i.err" &
  i=$((i + 1))
done
wait $(jobs -p | grep -v "^$pid$") 2>/dev/null || true
i=0
for prompt in $PROMPTS; do
  [ -s "$TMP/c$i.json" ] || fail "complete $prompt: $(cat "$TMP/c$i.err")"
  single=$("$MOESH" generate --model "$MODEL" --device cuda --prompt_ids "$prompt" "${args[@]}") ||
    fail "generate: $single"
  compare_outputs "$(cat "$TMP/c$i.json")" "$single" "prompt $prompt (chunked vs whole)"
  i=$((i + 1))
done
echo "PASS: chunked prefill on the GPU equals whole prompts"
