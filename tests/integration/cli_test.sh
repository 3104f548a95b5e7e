#!/usr/bin/env bash
# Black-box test of the `moesh` command: mkmodel, generate (--json and text),
# complete --prompt_logprobs against a serve-local CPU cluster, seeded
# sampling, its Abseil flags (--name=value and --name value, one snake_case
# spelling, each subcommand's own), and one-line errors with a non-zero exit.
# usage: cli_test.sh PATH/TO/moesh SOURCE_DIR (the service binaries beside moesh)
set -euo pipefail
MOESH=${1:?usage: cli_test.sh PATH/TO/moesh SOURCE_DIR}
SRC=${2:?usage: cli_test.sh PATH/TO/moesh SOURCE_DIR}
. "$SRC/tests/integration/serve_local_lib.sh"
serve_local_setup moesh_cli

"$MOESH" mkmodel --family v3 --preset tiny --out "$TMP/v3" --seed 3 >/dev/null
"$MOESH" mkmodel --family v2-lite --preset tiny --out "$TMP/v2l" --shards 2 --rope_parameters >/dev/null
[ -f "$TMP/v2l/model.safetensors.index.json" ] || fail "sharded checkpoint has no index"
grep -q rope_parameters "$TMP/v2l/config.json" || fail "--rope_parameters not honoured"

out=$("$MOESH" generate --model "$TMP/v3" --prompt_ids 5,17,300 --max_new_tokens 6 --ignore_eos \
      --top_logprobs 3 --json)
n=$(printf '%s' "$out" | python3 -c 'import json,sys; j=json.load(sys.stdin); \
assert j["finish_reason"]=="length"; assert len(j["top_logprobs"])==6; \
assert all(len(s)==3 and s[0]["logprob"]>=s[1]["logprob"] for s in j["top_logprobs"]); \
assert all(s[0]["id"]==t for s,t in zip(j["top_logprobs"], j["output_ids"])); print(len(j["output_ids"]))') \
  || fail "generate --json output malformed: $out"
[ "$n" = 6 ] || fail "expected 6 tokens, got $n"

# --logprobs, --prompt_logprobs, --n: each token's own log-probability (greedy:
# its best alternative's), the prompt's 1..n-1, n sibling lines by index.
out=$("$MOESH" generate --model "$TMP/v3" --prompt_ids 5,17,300,9 --max_new_tokens 4 --ignore_eos \
      --logprobs 1 --prompt_logprobs 2 --json)
printf '%s' "$out" | python3 -c 'import json,sys; j=json.load(sys.stdin); \
assert len(j["logprobs"])==4 and all(x<=0 for x in j["logprobs"]); \
assert all(abs(x-s[0]["logprob"])<1e-6 for x,s in zip(j["logprobs"], j["top_logprobs"])); \
p=j["prompt_logprobs"]; assert len(p["logprobs"])==3 and all(len(r)==2 for r in p["top_logprobs"]); \
assert all(r[0]["logprob"]>=x-1e-6 for x,r in zip(p["logprobs"], p["top_logprobs"]))' \
  || fail "generate --logprobs --prompt_logprobs: $out"
out=$("$MOESH" generate --model "$TMP/v3" --prompt_ids 5,17,300 --max_new_tokens 6 --ignore_eos \
      --temperature 1 --seed 8 --n 3 --json)
printf '%s\n' "$out" | python3 -c 'import json,sys; js=[json.loads(l) for l in sys.stdin if l.strip()]; \
assert [j["index"] for j in js]==[0,1,2]; assert len({tuple(j["output_ids"]) for j in js})==3; \
assert [j["usage"]["prompt_tokens"] for j in js]==[3,0,0]' || fail "generate --n 3: $out"
one=$("$MOESH" generate --model "$TMP/v3" --prompt_ids 5,17,300 --max_new_tokens 6 --ignore_eos \
      --temperature 1 --seed 9 --json)
[ "$(printf '%s\n' "$out" | sed -n 2p | python3 -c 'import json,sys; print(json.load(sys.stdin)["output_ids"])')" \
  = "$(printf '%s' "$one" | python3 -c 'import json,sys; print(json.load(sys.stdin)["output_ids"])')" ] \
  || fail "generate --n: sibling 1 is not the run seeded seed + 1"

# complete --prompt_logprobs against a CPU cluster (serve-local) of the same
# model: one finite log-probability <= 0 per prompt token after the first,
# each row's 2 alternatives ordered and at least as likely, and the values of
# `generate --prompt_logprobs` in one process.
start_serve_local --model "$TMP/v3" --expert_workers 1
server=127.0.0.1:$port
args=(--prompt_ids 5,17,300,9,42 --max_new_tokens 2 --ignore_eos --prompt_logprobs 2 --json)
cluster=$("$MOESH" complete --server "$server" "${args[@]}") || fail "complete --prompt_logprobs: $cluster"
single=$("$MOESH" generate --model "$TMP/v3" "${args[@]}") || fail "generate --prompt_logprobs: $single"
python3 - "$cluster" "$single" <<'PYEOF' || fail "complete --prompt_logprobs: $cluster (generate: $single)"
import json, math, sys
c, g = (json.loads(a.splitlines()[0])["prompt_logprobs"] for a in sys.argv[1:3])
assert len(c["logprobs"]) == 4, c
assert all(math.isfinite(x) and x <= 0 for x in c["logprobs"]), c
assert len(c["top_logprobs"]) == 4 and all(len(r) == 2 for r in c["top_logprobs"]), c
assert all(r[0]["logprob"] >= r[1]["logprob"] and r[0]["logprob"] >= x - 1e-6
           for x, r in zip(c["logprobs"], c["top_logprobs"])), c
assert max(abs(a - b) for a, b in zip(c["logprobs"], g["logprobs"])) <= 1e-3, (c, g)
PYEOF
kill -TERM "$pid" && wait "$pid" || fail "serve-local did not stop cleanly"
pid=

# Greedy is deterministic; seeded sampling reproduces; the sharded model runs.
a=$("$MOESH" generate --model "$TMP/v3" --prompt_ids 5,17,300 --max_new_tokens 6 --ignore_eos --json)
[ "$a" = "$("$MOESH" generate --model "$TMP/v3" --prompt_ids 5,17,300 --max_new_tokens 6 --ignore_eos --json)" ] \
  || fail "greedy generation is not deterministic"
s1=$("$MOESH" generate --model "$TMP/v3" --prompt_ids 9,8 --max_new_tokens 8 --temperature 1.0 --top_p 0.9 --seed 7 --json)
s2=$("$MOESH" generate --model "$TMP/v3" --prompt_ids 9,8 --max_new_tokens 8 --temperature 1.0 --top_p 0.9 --seed 7 --json)
[ "$s1" = "$s2" ] || fail "seeded sampling differs: $s1 vs $s2"
"$MOESH" generate --model "$TMP/v2l" --prompt_ids 1,2,3 --max_new_tokens 3 | grep -q "finish reason" \
  || fail "text output lacks the finish reason"

# A stop id ends generation with finish_reason "stop".
first=$(printf '%s' "$a" | python3 -c 'import json,sys; print(json.load(sys.stdin)["output_ids"][0])')
stop=$("$MOESH" generate --model "$TMP/v3" --prompt_ids 5,17,300 --max_new_tokens 6 --stop_token_ids "$first" --json)
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
expect_error "no such file" generate --model "$TMP/missing" --prompt_ids 1
expect_error "vocabulary" generate --model "$TMP/v3" --prompt_ids 1,99999
expect_error "unknown flag --bogus" generate --model "$TMP/v3" --prompt_ids 1 --bogus
expect_error "temperature" generate --model "$TMP/v3" --prompt_ids 1 --temperature -1
expect_error "top_p" generate --model "$TMP/v3" --prompt_ids 1 --temperature 1 --top_p 0
expect_error "prompt_ids" generate --model "$TMP/v3"
expect_error "not an integer" generate --model "$TMP/v3" --prompt_ids 1,x
expect_error "unknown family" mkmodel --family v9 --out "$TMP/x"
expect_error "--device must be cpu, cuda or cuda:N" generate --model "$TMP/v3" --prompt_ids 1 --device tpu
expect_error "the prefill share above the decode share" serve-local --model "$TMP/v3" \
  --decode_gpu_memory_utilization 0.9 --prefill_gpu_memory_utilization 0.5
expect_error "--max_local_prefill_tokens must be >= 0" serve-local --model "$TMP/v3" \
  --max_local_prefill_tokens -1
# Without a GPU (or without the CUDA backend in this build) --device cuda says
# which; with one it generates (tests/integration/cuda_cluster_test.sh).
if ! err=$("$MOESH" generate --model "$TMP/v3" --prompt_ids 1 --device cuda:7 2>&1 >/dev/null); then
  [ "$(printf '%s\n' "$err" | wc -l)" = 1 ] || fail "--device cuda:7 error is not one line: $err"
  printf '%s' "$err" | grep -q -E "no CUDA device|no CUDA backend|CUDA device 7 does not exist" \
    || fail "--device cuda:7 error unclear: $err"
fi
head -c 100 "$TMP/v3/model.safetensors" > "$TMP/trunc" && mv "$TMP/trunc" "$TMP/v3/model.safetensors"
expect_error "model.safetensors" generate --model "$TMP/v3" --prompt_ids 1
if "$MOESH" nosuch >/dev/null 2>&1; then fail "unknown command accepted"; fi

# Flags: --name=value as well as --name value; booleans bare or =false.
[ "$("$MOESH" generate --model="$TMP/v2l" --prompt_ids=5,17,300 --max_new_tokens=6 --ignore_eos=true \
      --json)" = "$("$MOESH" generate --model "$TMP/v2l" --prompt_ids 5,17,300 --max_new_tokens 6 --ignore_eos \
      --json)" ] || fail "--name=value and --name value differ"
"$MOESH" generate --model "$TMP/v2l" --prompt_ids 1 --max_new_tokens 1 --json=false | grep -q "finish reason" \
  || fail "--json=false still printed JSON"
# The old kebab-case spellings are refused, naming the new one.
expect_error "--max-new-tokens is spelled --max_new_tokens" generate --model "$TMP/v2l" --prompt_ids 1 \
  --max-new-tokens 3
expect_error "--rope-parameters is spelled --rope_parameters" mkmodel --family v3 --out "$TMP/y" --rope-parameters
expect_error "--load-format is spelled --load_format" bench --device cuda --load-format dummy
# A flag of another subcommand is refused, naming the one it belongs to.
expect_error "--server is a flag of moesh bench and moesh complete, not of moesh generate" generate --model "$TMP/v2l" \
  --prompt_ids 1 --server 127.0.0.1:1
expect_error "--decode_workers is a flag of moesh serve-local, not of moesh bench" bench --model "$TMP/v2l" \
  --decode_workers 2
expect_error "--family is a flag of moesh mkmodel, not of moesh complete" complete --server 127.0.0.1:1 --family v3
expect_error "--transport is a flag of moesh serve-local, not of moesh generate" generate --model "$TMP/v2l" \
  --transport ucx
expect_error "--dispatch_dtype 'fp16': expected fp32, bf16 or fp8" serve-local --model "$TMP/v3" \
  --dispatch_dtype fp16
# --kv_cache_dtype fp8 reaches the engine: FP8 rows of V2/V3/V3.2 models, refused for V4's
# compressed entries.
"$MOESH" generate --model "$TMP/v2l" --prompt_ids 5,17,300 --max_new_tokens 3 --kv_cache_dtype fp8 >/dev/null \
  || fail "generate --kv_cache_dtype fp8"
"$MOESH" mkmodel --family v3.2 --preset tiny --out "$TMP/v32" --seed 3 >/dev/null
"$MOESH" generate --model "$TMP/v32" --prompt_ids 5,17,300 --max_new_tokens 3 --kv_cache_dtype fp8 >/dev/null \
  || fail "generate --kv_cache_dtype fp8 on V3.2"
"$MOESH" mkmodel --family v4 --preset tiny --out "$TMP/v4" --seed 3 >/dev/null
expect_error "DeepSeek-V4's compressed entries" generate --model "$TMP/v4" --prompt_ids 1 --kv_cache_dtype fp8
expect_error "--kv_cache_dtype must be auto or fp8" generate --model "$TMP/v2l" --prompt_ids 1 --kv_cache_dtype fp16
expect_error "--transports: 'carrier' (grpc or ucx" bench --dispatch --transports carrier
# bench --dispatch: one row per encoding, fp32 exact, fp8 a quarter of fp32's bytes (plus scales).
out=$("$MOESH" bench --dispatch --batch 2 --hidden 256 --reps 1 --transports grpc)
printf '%s\n' "$out" | python3 -c 'import sys; rows=[l.split() for l in sys.stdin if l.startswith("grpc")]; \
assert [r[1] for r in rows]==["fp32","bf16","fp8"], rows; \
assert [int(r[3]) for r in rows]==[1024,512,264], rows; assert float(rows[0][7])==0, rows' \
  || fail "bench --dispatch: $out"
# ... and the fp8 codec's row: encode and decode ns per value.
printf '%s\n' "$out" | python3 -c 'import sys; l=sys.stdin.read().split("fp8 codec alone")[1].splitlines(); \
r=l[2].split(); assert r[0]=="2" and float(r[1])>0 and float(r[2])>0, l' \
  || fail "bench --dispatch codec row: $out"
expect_error "--flagfile is not a flag of moesh mkmodel" mkmodel --family v3 --out "$TMP/y" --flagfile /dev/null
expect_error "unexpected argument" generate --model "$TMP/v2l" --prompt_ids 1 stray
expect_error "--top_k needs a value" generate --model "$TMP/v2l" --prompt_ids 1 --top_k
# --help lists the subcommand's flags (and exits 0).
help=$("$MOESH" complete --help) || fail "complete --help failed"
printf '%s' "$help" | grep -q -- "--request_id" || fail "complete --help lacks --request_id: $help"
if printf '%s' "$help" | grep -q -- "--family"; then fail "complete --help lists mkmodel's --family"; fi
echo "cli_test: OK"
