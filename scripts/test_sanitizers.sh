#!/usr/bin/env bash
# Builds the CPU targets with AddressSanitizer + UndefinedBehaviorSanitizer
# (LeakSanitizer included) into build-asan/ and runs the tests there, the
# multi-process cluster tests too (their service binaries are instrumented).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-asan -G Ninja -DMOESH_CUDA=OFF -DMOESH_SANITIZE=address,undefined \
  -DCMAKE_BUILD_TYPE=Debug -DMOESH_BUILD_TESTS=ON >/dev/null
ninja -C build-asan
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
(cd build-asan && ctest --output-on-failure -j"$(nproc)" -E 'helm|docker|prometheus')
