#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with Debian's clang-14 and
# -fsanitize=fuzzer,address into build-fuzz/ (override with BUILD_DIR), then
# runs each for SECONDS (default 60) from a copy of its seed corpus
# (tests/fuzz/corpus/<name>; what it finds stays in build-fuzz/corpus/<name>).
# A crash stops the run with the target's report and the input in
# build-fuzz/crashes/<name>/; fix it, then add the input to the seed corpus
# (the <name>_fuzz_replay tests replay it in every build).
#   usage: scripts/fuzz.sh [SECONDS] [TARGET...]   (targets: the names below)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-60}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(safetensors config tokenizer chat_template request openai_request wire)
BUILD_DIR=${BUILD_DIR:-build-fuzz}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOESH_CUDA=OFF -DMOESH_BUILD_TESTS=OFF -DMOESH_FUZZ=ON \
  >/dev/null
ninja -C "$BUILD_DIR" $(printf '%s_fuzzer ' "${TARGETS[@]}")
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
status=0
for t in "${TARGETS[@]}"; do
  corpus="$BUILD_DIR/corpus/$t" crashes="$BUILD_DIR/crashes/$t"
  mkdir -p "$corpus" "$crashes"
  cp -n tests/fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null || true
  log="$BUILD_DIR/fuzz-$t.log"
  echo "== $t: ${SECONDS_EACH}s (log $log)"
  if "$BUILD_DIR/fuzz/${t}_fuzzer" -max_total_time="$SECONDS_EACH" -rss_limit_mb=4096 -timeout=10 \
      -artifact_prefix="$crashes/" -print_final_stats=1 "$corpus" >"$log" 2>&1; then
    grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb)|^#[0-9]+.*DONE' "$log" | tail -3
    echo "   corpus: $(ls "$corpus" | wc -l) inputs"
  else
    status=1
    echo "   FAILED: the report ends"
    grep -v '^#[0-9]' "$log" | tail -40
    ls "$crashes"
  fi
done
exit $status
