#!/usr/bin/env bash
# Lists what the Bazel build lacks compared with the CMake build (the reference):
#  1. .cc/.proto/.sh files in the tree (git-tracked or new, not ignored) that no
#     Bazel target uses, outside the CUDA folders (kernels/cuda, common/cuda_backend, tools/bench: CMake only);
#  2. with a configured CMake build directory: ctest's tests that have no Bazel
#     test of the same name (cuda_* tests excluded).
# usage: third_party/bazel/check_cmake_parity.sh [CMAKE_BUILD_DIR]
# Exits 1 if anything is missing. See DEVELOPERS.md, "Bazel".
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
missing=0

git ls-files --cached --others --exclude-standard -- '*.cc' '*.proto' '*.sh' |
  grep -v -E '^(kernels/cuda|common/cuda_backend|tools|scripts|third_party|deploy|\.ci)/|^tests/integration/cuda_' | sort -u >"$tmp/tree"
bazel query --noshow_progress 'kind("source file", deps(//...))' 2>/dev/null |
  grep '^//' | sed -e 's|^//:||' -e 's|^//\([^:]*\):|\1/|' | sort -u >"$tmp/bazel"
if comm -23 "$tmp/tree" "$tmp/bazel" | grep . >"$tmp/files"; then
  echo "Files no Bazel target uses (add them next to their CMake target in a BUILD.bazel):"
  sed 's/^/  /' "$tmp/files"
  missing=1
fi

if [ $# -ge 1 ]; then
  ctest --test-dir "$1" -N | sed -n 's/^ *Test *#[0-9]*: *//p' | grep -v -E '^(cuda_|nccl_|layering_test$|format_test$)' | sort -u >"$tmp/ctest"
  bazel query --noshow_progress 'tests(//...)' 2>/dev/null | sed 's/.*://' | sort -u >"$tmp/btests"
  if comm -23 "$tmp/ctest" "$tmp/btests" | grep . >"$tmp/tests"; then
    echo "ctest tests with no Bazel test of that name:"
    sed 's/^/  /' "$tmp/tests"
    missing=1
  fi
fi
[ "$missing" = 0 ] && echo "Bazel covers every CMake source${1:+ and test} outside the CUDA folders."
exit "$missing"
