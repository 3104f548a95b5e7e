#!/usr/bin/env bash
# Configures and builds moesh with CMake into build/ (override with BUILD_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DMOESH_BUILD_TESTS=ON "$@" >/dev/null
ninja -C "$BUILD_DIR"
