# Sourced by the device-side scripts, from the repository root: opens
# .device/bundle.txz (tools/device/bundle.sh) into .device/{bin,lib} and
# points LD_LIBRARY_PATH at it and at the CUDA runtime and cuBLAS (the
# toolkit's, else the Python wheels').
D=.device
if [[ -f $D/bundle.txz ]]; then
  if command -v xz >/dev/null; then
    tar -C $D -xJf $D/bundle.txz
  else  # Python's lzma where the image has no xz
    python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" $D/bundle.txz $D
  fi || { echo "unpack: cannot open $D/bundle.txz" >&2; return 1; }
fi
[[ -d $D/bin ]] || { echo "no $D/bin: run tools/device/bundle.sh and carry .device" >&2; return 1; }
chmod +x $D/bin/* 2>/dev/null
libdirs=$D/lib
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d $d ]] && libdirs=$libdirs:$d
done
# NCCL: the system's, else PyTorch's wheel (nvidia/nccl/lib).
if ! ldconfig -p | grep -q libnccl.so.2 && [[ ! -e /usr/local/cuda/lib64/libnccl.so.2 ]]; then
  f=$(find / -xdev -name 'libnccl.so.2' -not -path '*/proc/*' 2>/dev/null | head -1)
  [[ -n $f ]] && libdirs=$libdirs:$(dirname "$f")
fi
if [[ ! -e /usr/local/cuda/lib64/libcublasLt.so.13 ]]; then
  for f in $(find / -xdev -name 'libcublasLt.so.13' -not -path '*/proc/*' 2>/dev/null | head -1) \
           $(find / -xdev -name 'libcudart.so.13' -not -path '*/proc/*' 2>/dev/null | head -1); do
    libdirs=$libdirs:$(dirname "$f")
  done
fi
export LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$PATH:/usr/local/cuda/bin
