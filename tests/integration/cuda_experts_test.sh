#!/usr/bin/env bash
# The expert workers of the newer families on a GPU: `moesh serve-local
# --device cpu --expert_device cuda` (attention on the CPU, the routed experts
# on the GPU, bf16) against `moesh generate` (the CPU engine, fp32, which matches
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
source "$SRC/tests/integration/serve_local_lib.sh"
serve_local_setup moesh_cuda_experts
start_serve_local --model "$MODEL" --device cpu --expert_device cuda --expert_workers 2
grep -q "(cuda:" "$TMP"/cluster/expert-*.log || fail "the expert workers do not report a CUDA device"
grep -h -E "worker (for|serving)" "$TMP"/cluster/*.log | sed 's/^/  /' || true
for prompt in 5,17,300,42,9 1,2,3 400,7,7,7,100,250,3,4,60,61,62,63,64,65,66,67,68,69,70,71,72; do
  args=(--prompt_ids "$prompt" --max_new_tokens 8 --ignore_eos --top_logprobs 1 --json)
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
