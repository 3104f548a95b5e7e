#!/usr/bin/env bash
# Copies the CUDA test and bench binaries, and the shared libraries they need
# that the device machine lacks, into .device/ (git-ignored) for `run` with
# carry [".device"]. The device image brings the NVIDIA driver (libcuda), the
# CUDA 13.0 runtime and cuBLAS; glibc and libstdc++ there are newer than here.
#
# Usage: scripts/device/bundle.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
build=${1:-build}
bins=(cuda_device_test cuda_ops_test cuda_routing_test cuda_mla_decode_test kernel_bench)
# Libraries taken from the device machine itself.
system_re='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libstdc\+\+|libgcc_s|libcuda\.|libcudart\.|libcublas\.|libcublasLt\.|libnvidia)'

rm -rf .device
mkdir -p .device/bin .device/lib
for b in "${bins[@]}"; do
  path=$(find "$build" -name "$b" -type f -perm -u+x | head -1)
  if [[ -z "$path" ]]; then
    echo "bundle: $b not built in $build (ninja -C $build $b)" >&2
    exit 1
  fi
  cp "$path" .device/bin/
done
for b in .device/bin/*; do
  if ldd "$b" | grep -v -E 'libcuda\.so' | grep -q 'not found'; then
    echo "bundle: unresolved libraries for $b:" >&2
    ldd "$b" | grep 'not found' >&2
    exit 1
  fi
  ldd "$b" | awk '/=>/ { print $1, $3 }' | while read -r name file; do
    if [[ ! "$name" =~ $system_re ]] && [[ ! -e ".device/lib/$name" ]]; then
      cp -L "$file" ".device/lib/$name"
    fi
  done
done
# Debug info stays here; the travelling copies carry symbols only (64 MiB limit).
strip --strip-debug .device/bin/* .device/lib/*
{
  echo "built $(date -u +%FT%TZ) from $(git rev-parse --short HEAD) (+ working tree)"
  echo "needed from the device: $(ldd .device/bin/* | awk '/=>/ {print $1}' | grep -E 'libcudart|libcublas' | sort -u | tr '\n' ' ')"
} > .device/MANIFEST
du -sh .device
ls .device/bin .device/lib
