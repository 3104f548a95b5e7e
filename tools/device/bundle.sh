#!/usr/bin/env bash
# Packs the CUDA test and bench binaries, and the shared libraries they need
# that the device machine lacks, into .device/bundle.txz (git-ignored) for
# `run` with carry [".device"]; tools/device/unpack.sh opens it there. The
# device image brings the NVIDIA driver (libcuda), the CUDA 13.0 runtime and
# cuBLAS; glibc and libstdc++ there are newer than here. Compressed because
# the working tree plus carried paths must stay under 64 MiB (libopenblas
# alone is 36 MB).
#
# Usage: tools/device/bundle.sh [BUILD_DIR [BINARY...]]   (default: build, all below)
# The header of each device script (tests.sh, model_bench.sh, serving_bench.sh,
# profile.sh) names the binaries it needs.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
build=${1:-build}
shift || true
bins=("$@")
if ((${#bins[@]} == 0)); then
  bins=(cuda_device_test cuda_ops_test cuda_routing_test cuda_mla_decode_test kernel_bench
        cuda_grouped_gemm_test cuda_model_test cuda_model_bench)
fi
# Libraries taken from the device machine itself.
system_re='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libstdc\+\+|libgcc_s|libcuda\.|libcudart\.|libcublas\.|libcublasLt\.|libnccl\.|libnvidia)'

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
for b in "${bins[@]}"; do
  path=$(find "$build" -name "$b" -type f -perm -u+x | head -1)
  if [[ -z "$path" ]]; then
    echo "bundle: $b not built in $build (ninja -C $build $b)" >&2
    exit 1
  fi
  cp "$path" "$stage/bin/"
done
for b in "$stage"/bin/*; do
  if ldd "$b" | grep -v -E 'libcuda\.so' | grep -q 'not found'; then
    echo "bundle: unresolved libraries for $b:" >&2
    ldd "$b" | grep 'not found' >&2
    exit 1
  fi
  ldd "$b" | awk '/=>/ { print $1, $3 }' | while read -r name file; do
    if [[ ! "$name" =~ $system_re ]] && [[ ! -e "$stage/lib/$name" ]]; then
      cp -L "$file" "$stage/lib/$name"
    fi
  done
done
# Debug info stays here; the travelling copies carry symbols only.
strip --strip-debug "$stage"/bin/* "$stage"/lib/*
{
  echo "built $(date -u +%FT%TZ) from $(git rev-parse --short HEAD) (+ working tree), $build"
  echo "needed from the device: $(ldd "$stage"/bin/* | awk '/=>/ {print $1}' | grep -E 'libcudart|libcublas' | sort -u | tr '\n' ' ')"
} > "$stage/MANIFEST"
# The bundle's own files are replaced; anything else in .device (a call's
# script, extra binaries packed beside) stays, and travels with the carry.
rm -rf .device/bin .device/lib .device/bundle.txz .device/MANIFEST
mkdir -p .device
cp "$stage/MANIFEST" .device/
# xz: about half gzip's size (libopenblas and libicudata are most of it).
tar -C "$stage" -cf - bin lib MANIFEST | xz -9 -T2 > .device/bundle.txz
du -sh .device/bundle.txz
ls "$stage/bin" "$stage/lib"
