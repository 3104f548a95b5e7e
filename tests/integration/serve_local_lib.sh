# Sourced by the integration tests that start a local cluster (cli_test.sh,
# bench_serving_test.sh, cuda_cluster_test.sh, ...), after they set MOESH:
#   serve_local_setup NAME   a fresh $TMP (removed on exit, with the cluster
#                            stopped), $PY (Debian's python3 first);
#   fail MESSAGE             prints it and the cluster's last log lines, exits 1;
#   compare_outputs A B WHAT two `--json` outputs (--top_logprobs 1): the same
#                            tokens, log-probabilities within 1e-3; fails if not;
#   require_cuda_generate M  `moesh generate --device cuda` runs on model M;
#                            exits 77 (ctest: skipped) saying so where no CUDA
#                            device is present, fails on any other error;
#   start_serve_local ARGS   `moesh serve-local ARGS` on a free port ($port,
#                            $pid), until it serves; exits 77 (ctest: skipped)
#                            saying so where a worker finds no CUDA device.
serve_local_setup() {
  TMP=$(mktemp -d "${TEST_TMPDIR:-/tmp}/$1.XXXXXX")
  PY=/usr/bin/python3
  command -v "$PY" >/dev/null || PY=python3
  pid=
  trap serve_local_cleanup EXIT
}

serve_local_cleanup() {
  if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$TMP"
}

fail() {
  echo "FAIL: $*" >&2
  [ -f "$TMP/serve.log" ] && tail -20 "$TMP/serve.log" >&2
  for f in "$TMP"/cluster/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -8 "$f" >&2; }; done
  exit 1
}

compare_outputs() {
  "$PY" - "$1" "$2" "$3" <<'PYEOF' || fail "$3: the outputs differ"
import json, sys
a, b, what = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
assert a["output_ids"] == b["output_ids"], f"{what}: {a['output_ids']} != {b['output_ids']}"
worst = max(abs(x[0]["logprob"] - y[0]["logprob"]) for x, y in zip(a["top_logprobs"], b["top_logprobs"]))
assert worst <= 1e-3, f"{what}: logprobs differ by {worst}"
print(f"{what}: {len(a['output_ids'])} tokens equal, max logprob diff {worst:.2e}")
PYEOF
}
require_cuda_generate() {
  local probe
  if ! probe=$("$MOESH" generate --model "$1" --prompt_ids 1 --max_new_tokens 1 --device cuda 2>&1); then
    if grep -q -E "no CUDA device|no CUDA backend" <<<"$probe"; then
      echo "SKIPPED: no CUDA device here ($probe)"
      exit 77
    fi
    fail "generate --device cuda: $probe"
  fi
}
start_serve_local() {
  port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$MOESH" serve-local --port "$port" --work_dir "$TMP/cluster" "$@" >"$TMP/serve.out" 2>"$TMP/serve.log" &
  pid=$!
  for _ in $(seq 1 600); do
    grep -q "moesh is serving" "$TMP/serve.out" 2>/dev/null && break
    if ! kill -0 "$pid" 2>/dev/null; then
      if grep -q -E "no CUDA device|no CUDA backend" "$TMP/serve.log" "$TMP"/cluster/*.log 2>/dev/null; then
        echo "SKIPPED: no CUDA device here"
        exit 77
      fi
      fail "serve-local $* exited"
    fi
    sleep 0.2
  done
  grep -q "moesh is serving" "$TMP/serve.out" || fail "the cluster did not come up"
}
