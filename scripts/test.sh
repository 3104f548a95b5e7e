#!/usr/bin/env bash
# Builds and runs every test: the CMake build under ctest, then the CPU targets
# under Bazel with AddressSanitizer + UndefinedBehaviorSanitizer
# (scripts/test_sanitizers.sh: --config=asan), so that the second build system's
# one build is also the sanitizer run. Set MOESH_SKIP_BAZEL=1 to skip it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
(cd "${BUILD_DIR:-build}" && ctest --output-on-failure -j"$(nproc)")
if [ "${MOESH_SKIP_BAZEL:-0}" != 1 ]; then
  bash scripts/test_sanitizers.sh
fi
