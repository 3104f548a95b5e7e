#!/usr/bin/env bash
# The embedded default: install dependencies, build, make a tiny DeepSeek-V3
# style model, and generate from it on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
MODEL=${MODEL:-models/tiny-v3}
[ -f "$MODEL/config.json" ] || ./build/moesh mkmodel --family v3 --preset tiny --out "$MODEL"
./build/moesh generate --model "$MODEL" --prompt-ids 5,17,300 --max-new-tokens 12 --top-logprobs 2
