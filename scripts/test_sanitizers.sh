#!/usr/bin/env bash
# Builds the CPU targets with AddressSanitizer + UndefinedBehaviorSanitizer
# (LeakSanitizer included) under Bazel (.bazelrc, --config=asan) and runs their
# tests, the multi-process cluster tests too (they start the instrumented service
# binaries of the same build), all but the deploy tests, as ctest -LE deploy.
#   usage: scripts/test_sanitizers.sh [TARGET...]   (default //...)
# The CMake equivalent, for a debugger or one test under ctest:
#   cmake -S . -B build-asan -G Ninja -DMOESH_CUDA=OFF -DMOESH_SANITIZE=address,undefined \
#     -DCMAKE_BUILD_TYPE=Debug && ninja -C build-asan
#   ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
#     ctest --test-dir build-asan -LE deploy
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- //...
bazel test --config=asan --jobs="$(nproc)" --test_output=errors "$@"
