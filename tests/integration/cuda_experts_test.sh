#!/usr/bin/env bash
# The expert workers of the newer families on a GPU: `moesh serve-local
# --device cpu --expert-device cuda` (attention on the CPU — the mixed
# deployment, and V3.2 beyond index_topk, which the CUDA backend refuses; the routed experts on the GPU,
# bf16) against `moesh generate` (the CPU engine, fp32, which matches
# transformers: golden_test) on a golden checkpoint: the same first tokens,
# log-probabilities within 0.05 (bf16 experts against fp32), for prompts one
# at a time; V4's experts clamp their SwiGLU, and its hash-routed layers pick
# experts from the token ids on the attention side.
#
# usage: cuda_experts_test.sh PATH/TO/moesh SOURCE_DIR [MODEL_NAME (v4)]
# Exits 77 (ctest: skipped) where no CUDA device is present, saying so.
set -euo pipefail
MOESH=${1:?usage: cuda_experts_test.sh PATH/TO/moesh SOURCE_DIR [MODEL_NAME]}
SRC=${2:?usage: cuda_experts_test.sh PATH/TO/moesh SOURCE_DIR [MODEL_NAME]}
MODEL="$SRC/tests/golden/${3:-v4}"
TMP=$(mktemp -d "${TEST_TMPDIR:-/tmp}/moesh_cuda_experts.XXXXXX")
PY=/usr/bin/python3
command -v "$PY" >/dev/null || PY=python3
pid=
cleanup() {
  if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  [ -f "$TMP/serve.log" ] && tail -20 "$TMP/serve.log" >&2
  for f in "$TMP"/cluster/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -8 "$f" >&2; }; done
  exit 1
}

port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$MOESH" serve-local --model "$MODEL" --device cpu --expert-device cuda --port "$port" --expert-workers 2 \
  --work-dir "$TMP/cluster" >"$TMP/serve.out" 2>"$TMP/serve.log" &
pid=$!
for _ in $(seq 1 600); do
  grep -q "moesh is serving" "$TMP/serve.out" 2>/dev/null && break
  if ! kill -0 "$pid" 2>/dev/null; then
    if grep -q -E "no CUDA device|no CUDA backend" "$TMP/serve.log" "$TMP"/cluster/*.log 2>/dev/null; then
      echo "SKIPPED: no CUDA device here"
      exit 77
    fi
    fail "serve-local --expert-device cuda exited"
  fi
  sleep 0.2
done
grep -q "moesh is serving" "$TMP/serve.out" || fail "the cluster did not come up"
grep -q "(cuda:" "$TMP"/cluster/expert-*.log || fail "the expert workers do not report a CUDA device"
grep -h -E "worker (for|serving)" "$TMP"/cluster/*.log | sed 's/^/  /' || true
for prompt in 5,17,300,42,9 1,2,3 400,7,7,7,100,250,3,4,60,61,62,63,64,65,66,67,68,69,70,71,72; do
  args=(--prompt-ids "$prompt" --max-new-tokens 8 --ignore-eos --top-logprobs 1 --json)
  cluster=$("$MOESH" complete --server "127.0.0.1:$port" "${args[@]}") || fail "complete: $cluster"
  cpu=$("$MOESH" generate --model "$MODEL" "${args[@]}") || fail "generate: $cpu"
  "$PY" - "$cluster" "$cpu" "prompt $prompt" <<'PYEOF' || fail "GPU experts left the CPU engine"
import json, sys
a, b, what = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
n = 4
assert a["output_ids"][:n] == b["output_ids"][:n], f"{what}: {a['output_ids']} vs {b['output_ids']}"
worst = max(abs(x[0]["logprob"] - y[0]["logprob"]) for x, y in zip(a["top_logprobs"][:n], b["top_logprobs"][:n]))
assert worst <= 0.05, f"{what}: logprobs differ by {worst}"
print(f"{what}: first {n} tokens equal, max logprob diff {worst:.2e}")
PYEOF
done
echo "PASS"
