#!/usr/bin/env bash
# The official `openai` npm SDK (pinned in tests/deploy/deploy_tools.py,
# fetched from the npm registry into the tools cache) against the HTTP API of
# a local cluster with API keys: openai_sdk_test.cjs.
# usage: openai_sdk_test.sh PATH/TO/moesh SOURCE_DIR
set -euo pipefail
MOESH=${1:?usage: openai_sdk_test.sh PATH/TO/moesh SOURCE_DIR}
SRC=${2:?}
TMP=$(mktemp -d "${TEST_TMPDIR:-/tmp}/moesh_sdk.XXXXXX")
PID=
trap '[ -n "$PID" ] && { kill -INT $PID 2>/dev/null; wait $PID 2>/dev/null; }; rm -rf "$TMP"' EXIT
NODE_TOOLS=$(/usr/bin/python3 "$SRC/tests/deploy/deploy_tools.py" node)
"$MOESH" mkmodel --family v3 --preset tiny --out "$TMP/m" --seed 6 >/dev/null
echo sk-sdk-1 >"$TMP/keys"
"$MOESH" serve-local --model "$TMP/m" --port 0 --http_port 0 --api_keys_file "$TMP/keys" \
  --work_dir "$TMP/cluster" >"$TMP/log" 2>&1 &
PID=$!
for _ in $(seq 900); do grep -q "HTTP API on" "$TMP/log" && break; kill -0 $PID || break; sleep 0.1; done
URL=$(grep -o "HTTP API on http://[0-9.:]*" "$TMP/log" | awk '{print $4}')
[ -n "$URL" ] || { cat "$TMP/log"; echo "FAIL: the cluster did not start"; exit 1; }
node "$SRC/tests/integration/openai_sdk_test.cjs" "$NODE_TOOLS/node_modules/openai" "$URL" sk-sdk-1
echo "openai_sdk_test: OK"
