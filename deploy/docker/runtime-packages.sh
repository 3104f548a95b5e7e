#!/bin/sh
# Prints the Debian/Ubuntu packages that provide the shared libraries the given
# binaries link directly (their DT_NEEDED entries), one per line, sorted:
# what a runtime image must install. Run where the binaries were built.
#
#   deploy/docker/runtime-packages.sh build/moesh build/moesh_router ...
#
# Dockerfile.cuda runs it in its build stage; tests/deploy/dockerfile_test.py
# runs it on the built binaries and compares with Dockerfile's runtime stage.
#
# Libraries of the CUDA toolkit (CUDA runtime, cuBLAS, NCCL under
# /usr/local/cuda*, or named libcudart/libcublas*/libnccl) are not listed:
# binaries built with the CUDA backend get them from the nvidia/cuda runtime
# image (Dockerfile.cuda), and the CPU image builds with MOESH_CUDA=OFF.
set -eu
[ $# -gt 0 ] || { echo "usage: $0 BINARY..." >&2; exit 64; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: > "$tmp/resolved"
for bin in "$@"; do
  # "libfoo.so.1 => /lib/x86_64-linux-gnu/libfoo.so.1 (0x...)" for every library, needed directly or not.
  ldd "$bin" > "$tmp/ldd" || { echo "$0: ldd $bin failed" >&2; exit 1; }
  for soname in $(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    # The dynamic loader is listed without "=>" (its path is its name); it comes with libc6.
    case "$soname" in ld-linux*|libcudart.so*|libcublas.so*|libcublasLt.so*|libnccl.so*) continue ;; esac
    path=$(awk -v l="$soname" '$1 == l && $2 == "=>" { print $3; exit }' "$tmp/ldd")
    if [ -z "$path" ] || [ "$path" = "not" ]; then
      echo "$0: $bin: $soname not found" >&2
      exit 1
    fi
    real=$(readlink -f "$path")
    case "$real" in /usr/local/cuda*) continue ;; esac
    echo "$soname $path $real" >> "$tmp/resolved"
  done
done
# dpkg knows a file under the path its package installed it at: the path, its
# target (alternatives, /lib -> /usr/lib) or the other side of the /usr merge.
sort -u "$tmp/resolved" | awk '{ for (i = 2; i <= 3; i++) { p = $i; print p; if (p ~ /^\/usr\//) print substr(p, 5); else print "/usr" p } }' \
  | sort -u > "$tmp/candidates"
xargs dpkg-query -S < "$tmp/candidates" > "$tmp/owners" 2>/dev/null || true
sort -u "$tmp/resolved" | awk -v owners="$tmp/owners" '
  BEGIN {
    while ((getline line < owners) > 0) {
      if (line ~ /^diversion/) continue
      n = index(line, ": ")
      pkgs = substr(line, 1, n - 1); path = substr(line, n + 2)
      split(pkgs, first, ", "); sub(/:.*/, "", first[1])
      owner[path] = first[1]
    }
  }
  function find(p) {
    if (p in owner) return owner[p]
    q = (p ~ /^\/usr\//) ? substr(p, 5) : "/usr" p
    return (q in owner) ? owner[q] : ""
  }
  {
    pkg = find($2); if (pkg == "") pkg = find($3)
    if (pkg == "") { printf "runtime-packages.sh: no package owns %s (%s)\n", $2, $1 > "/dev/stderr"; bad = 1; next }
    print pkg
  }
  END { exit bad }' > "$tmp/packages"
sort -u "$tmp/packages"
