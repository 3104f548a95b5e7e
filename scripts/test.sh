#!/usr/bin/env bash
# Builds and runs every test: the CMake build under ctest, then the same CPU
# targets under Bazel (set MOESH_SKIP_BAZEL=1 to skip the second build).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
(cd "${BUILD_DIR:-build}" && ctest --output-on-failure -j"$(nproc)")
if [ "${MOESH_SKIP_BAZEL:-0}" != 1 ]; then
  bazel test --jobs="$(nproc)" --test_output=errors //...
fi
