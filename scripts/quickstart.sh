#!/usr/bin/env bash
# The embedded default, end to end: install dependencies, build, make a tiny
# DeepSeek-V3-style model, start the whole cluster on loopback (router,
# prefill, decode and two expert workers as separate processes), stream a
# completion through it, compare with the single-process engine, and stop.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
MODEL=${MODEL:-models/tiny-v3}
[ -f "$MODEL/config.json" ] || ./build/moesh mkmodel --family v3 --preset tiny --out "$MODEL"

LOG=$(mktemp)
./build/moesh serve-local --model "$MODEL" --port 0 >"$LOG" 2>&1 &
CLUSTER=$!
trap 'kill -INT $CLUSTER 2>/dev/null; wait $CLUSTER 2>/dev/null; rm -f "$LOG"' EXIT
for _ in $(seq 600); do
  grep -q "serving on" "$LOG" && break
  kill -0 $CLUSTER 2>/dev/null || { cat "$LOG"; exit 1; }
  sleep 0.1
done
cat "$LOG"
SERVER=$(grep -o "serving on [0-9.:]*" "$LOG" | awk '{print $3}')

echo "--- streamed through the cluster:"
./build/moesh complete --server "$SERVER" --prompt_ids 5,17,300 --max_new_tokens 12
if [ -f "$MODEL/tokenizer.json" ]; then
  echo "--- text in, text out (a random tiny model writes gibberish, through a real tokenizer):"
  ./build/moesh complete --server "$SERVER" --prompt "Hello, moesh!" --max_new_tokens 12
fi
echo "--- the same request on the single-process engine:"
./build/moesh generate --model "$MODEL" --prompt_ids 5,17,300 --max_new_tokens 12
