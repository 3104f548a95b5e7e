#!/usr/bin/env bash
# Installs every Debian 12 package moesh's CPU build and tests need.
# Run as root (or with sudo available). Safe to re-run.
set -euo pipefail
PACKAGES=(
  build-essential cmake ninja-build pkg-config python3 git clang-format clang-14 openssl
  libabsl-dev nlohmann-json3-dev libopenblas-dev libicu-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler prometheus-cpp-dev
  libcivetweb-dev curl
  python3-grpcio python3-protobuf
  libucx-dev
  libgtest-dev libgmock-dev
  bazel-bootstrap
  prometheus python3-yaml
)
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all packages present"
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
