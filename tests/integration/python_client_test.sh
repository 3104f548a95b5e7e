#!/usr/bin/env bash
# The Python example client (examples/python/generate.py) against a real local
# cluster: its streamed ids equal `moesh generate`'s (through a router list
# whose first router is down), and a bad request comes back as INVALID_ARGUMENT.
# usage: python_client_test.sh PATH/TO/moesh SOURCE_DIR
set -euo pipefail
MOESH=${1:?usage: python_client_test.sh PATH/TO/moesh SOURCE_DIR}
SRC=${2:?}
TMP=$(mktemp -d "${TEST_TMPDIR:-/tmp}/moesh_py.XXXXXX")
"$MOESH" mkmodel --family v2 --preset tiny --out "$TMP/m" --seed 4 >/dev/null
"$MOESH" serve-local --model "$TMP/m" --port 0 --work_dir "$TMP/cluster" >"$TMP/log" 2>&1 &
PID=$!
trap 'kill -INT $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 600); do grep -q "serving on" "$TMP/log" && break; sleep 0.1; done
SERVER=$(grep -o "serving on [0-9.:]*" "$TMP/log" | awk '{print $3}')
[ -n "$SERVER" ] || { cat "$TMP/log"; echo "FAIL: cluster did not start"; exit 1; }
# A router list whose first entry is down (nothing listens on port 1): the request goes to the next.
got=$(/usr/bin/python3 "$SRC/examples/python/generate.py" --server "127.0.0.1:1,$SERVER" --prompt_ids 7,8,9 --max_new_tokens 10 \
      | grep '^ids:' | tr -d 'ids:[] ')
want=$("$MOESH" generate --model "$TMP/m" --prompt_ids 7,8,9 --max_new_tokens 10 --json \
       | /usr/bin/python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["output_ids"])))')
[ "$got" = "$want" ] || { echo "FAIL: python client got $got, moesh generate $want"; exit 1; }
if err=$(/usr/bin/python3 "$SRC/examples/python/generate.py" --server "$SERVER" --prompt_ids 1,100000 2>&1); then
  echo "FAIL: bad request succeeded"; exit 1
fi
echo "$err" | grep -q INVALID_ARGUMENT || { echo "FAIL: $err"; exit 1; }
echo "python_client_test: OK"
