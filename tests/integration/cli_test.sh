#!/usr/bin/env bash
# Black-box test of the `moesh` command: mkmodel, generate (--json and text),
# seeded sampling, and one-line errors with a non-zero exit.
# usage: cli_test.sh PATH/TO/moesh
set -euo pipefail
MOESH=${1:?usage: cli_test.sh PATH/TO/moesh}
TMP=$(mktemp -d "${TEST_TMPDIR:-/tmp}/moesh_cli.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$MOESH" mkmodel --family v3 --preset tiny --out "$TMP/v3" --seed 3 >/dev/null
"$MOESH" mkmodel --family v2-lite --preset tiny --out "$TMP/v2l" --shards 2 --rope-parameters >/dev/null
[ -f "$TMP/v2l/model.safetensors.index.json" ] || fail "sharded checkpoint has no index"
grep -q rope_parameters "$TMP/v2l/config.json" || fail "--rope-parameters not honoured"

out=$("$MOESH" generate --model "$TMP/v3" --prompt-ids 5,17,300 --max-new-tokens 6 --ignore-eos \
      --top-logprobs 3 --json)
n=$(printf '%s' "$out" | python3 -c 'import json,sys; j=json.load(sys.stdin); \
assert j["finish_reason"]=="length"; assert len(j["top_logprobs"])==6; \
assert all(len(s)==3 and s[0]["logprob"]>=s[1]["logprob"] for s in j["top_logprobs"]); \
assert all(s[0]["id"]==t for s,t in zip(j["top_logprobs"], j["output_ids"])); print(len(j["output_ids"]))') \
  || fail "generate --json output malformed: $out"
[ "$n" = 6 ] || fail "expected 6 tokens, got $n"

# Greedy is deterministic; seeded sampling reproduces; the sharded model runs.
a=$("$MOESH" generate --model "$TMP/v3" --prompt-ids 5,17,300 --max-new-tokens 6 --ignore-eos --json)
[ "$a" = "$("$MOESH" generate --model "$TMP/v3" --prompt-ids 5,17,300 --max-new-tokens 6 --ignore-eos --json)" ] \
  || fail "greedy generation is not deterministic"
s1=$("$MOESH" generate --model "$TMP/v3" --prompt-ids 9,8 --max-new-tokens 8 --temperature 1.0 --top-p 0.9 --seed 7 --json)
s2=$("$MOESH" generate --model "$TMP/v3" --prompt-ids 9,8 --max-new-tokens 8 --temperature 1.0 --top-p 0.9 --seed 7 --json)
[ "$s1" = "$s2" ] || fail "seeded sampling differs: $s1 vs $s2"
"$MOESH" generate --model "$TMP/v2l" --prompt-ids 1,2,3 --max-new-tokens 3 | grep -q "finish reason" \
  || fail "text output lacks the finish reason"

# A stop id ends generation with finish_reason "stop".
first=$(printf '%s' "$a" | python3 -c 'import json,sys; print(json.load(sys.stdin)["output_ids"][0])')
stop=$("$MOESH" generate --model "$TMP/v3" --prompt-ids 5,17,300 --max-new-tokens 6 --stop-token-ids "$first" --json)
printf '%s' "$stop" | python3 -c 'import json,sys; j=json.load(sys.stdin); \
assert j["finish_reason"]=="stop" and len(j["output_ids"])==1, j' || fail "stop id ignored: $stop"

# Errors: exit 1 and one line naming the problem.
expect_error() {  # expect_error PATTERN ARGS...
  local pattern=$1; shift
  local err
  if err=$("$MOESH" "$@" 2>&1 >/dev/null); then fail "expected failure: $*"; fi
  [ "$(printf '%s\n' "$err" | wc -l)" = 1 ] || fail "error is not one line: $err"
  printf '%s' "$err" | grep -q -- "$pattern" || fail "error '$err' lacks '$pattern'"
}
expect_error "no such file" generate --model "$TMP/missing" --prompt-ids 1
expect_error "vocabulary" generate --model "$TMP/v3" --prompt-ids 1,99999
expect_error "unknown flag --bogus" generate --model "$TMP/v3" --prompt-ids 1 --bogus
expect_error "temperature" generate --model "$TMP/v3" --prompt-ids 1 --temperature -1
expect_error "top_p" generate --model "$TMP/v3" --prompt-ids 1 --temperature 1 --top-p 0
expect_error "prompt-ids" generate --model "$TMP/v3"
expect_error "not an integer" generate --model "$TMP/v3" --prompt-ids 1,x
expect_error "unknown family" mkmodel --family v9 --out "$TMP/x"
expect_error "--device must be cpu, cuda or cuda:N" generate --model "$TMP/v3" --prompt-ids 1 --device tpu
# Without a GPU (or without the CUDA backend in this build) --device cuda says
# which; with one it generates (tests/integration/cuda_cluster_test.sh).
if ! err=$("$MOESH" generate --model "$TMP/v3" --prompt-ids 1 --device cuda:7 2>&1 >/dev/null); then
  [ "$(printf '%s\n' "$err" | wc -l)" = 1 ] || fail "--device cuda:7 error is not one line: $err"
  printf '%s' "$err" | grep -q -E "no CUDA device|no CUDA backend|CUDA device 7 does not exist" \
    || fail "--device cuda:7 error unclear: $err"
fi
head -c 100 "$TMP/v3/model.safetensors" > "$TMP/trunc" && mv "$TMP/trunc" "$TMP/v3/model.safetensors"
expect_error "model.safetensors" generate --model "$TMP/v3" --prompt-ids 1
if "$MOESH" nosuch >/dev/null 2>&1; then fail "unknown command accepted"; fi
echo "cli_test: OK"
