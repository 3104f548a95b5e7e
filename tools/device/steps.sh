# Sourced first by the device-side run scripts (set `budget` before): makes
# $OUT (what comes back) and a fresh $LOGS, opens the bundle (unpack.sh), sets
# the loopback-only network variables, and defines:
#   step NAME LIMIT_S CMD...  runs CMD under a time limit (within $budget
#       seconds of the script's start), logs to $LOGS/NAME.log and adds a line
#       to `summary` (rc, seconds, gtest counts, compute-sanitizer's error
#       summary); a failing step prints its telling lines;
#   finish  packs the logs into $OUT/logs-SCRIPT.tgz and the summary into
#       $OUT/summary-SCRIPT.txt (SCRIPT: tests, model_bench, ...; so that two
#       scripts can run in one call; $OUT brings back at most 8 files) and
#       prints the summary;
#   record_env  writes the GPUs and the bundle's manifest to $LOGS/env.txt
#       and prints them;
#   show NAME [ERE]  prints a step's log (only the lines matching ERE, else
#       all but the services' chatter), if the step ran;
#   has BINARY  whether the bundle holds BINARY;
#   mps_start / mps_stop  start and stop an MPS daemon of the script's own
#       (pipe and log directories in /tmp), under which the processes on one
#       GPU share it without context switches; mps_start fails where
#       nvidia-cuda-mps-control is missing or the daemon does not start.
# and sets `gpus` to the number of GPUs.
# The scripts built on it: tests.sh, model_bench.sh, serving_bench.sh, profile.sh.
OUT=${OUT:-/tmp/moesh-out}
LOGS=/tmp/moesh-logs
rm -rf "$LOGS"
mkdir -p "$OUT" "$LOGS"
source tools/device/unpack.sh || return 1
# Loopback only; NVLink multicast off (KINDS.md) for anything NCCL starts.
export UCX_NET_DEVICES=lo UCX_TLS=${UCX_TLS:-tcp} NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0
summary=()
budget=${MOESH_DEVICE_BUDGET_S:-${budget:-540}}
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((budget - SECONDS))
  if ((left < 10)); then
    summary+=("$(printf '%-32s not run: out of time' "$name")")
    return
  fi
  ((limit > left)) && limit=$left
  local t0=$SECONDS
  timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  local tests
  tests=$(sed -n -E 's/^\[  (PASSED|SKIPPED|FAILED)  \] ([0-9]+) tests?[,.].*/\2 \1/p' "$LOGS/$name.log" | tr '\n' ' ')
  summary+=("$(printf '%-32s rc=%-3s %4ss  %s%s' "$name" "$rc" "$((SECONDS - t0))" "$tests" \
                "$(grep -o 'ERROR SUMMARY.*' "$LOGS/$name.log")")")
  if [[ $rc -ne 0 ]]; then
    echo "---- $name failed (rc=$rc); its last lines:"
    grep -E 'Failure|error|Expected|Which is|argmax|actual|FAILED|skipped' "$LOGS/$name.log" | head -n 40
    tail -n 15 "$LOGS/$name.log"
  fi
}
finish() {
  local script
  script=$(basename "$0" .sh)
  tar czf "$OUT/logs-$script.tgz" -C "$LOGS" .
  echo
  echo "==== summary"
  printf '%s\n' "${summary[@]}" | tee "$OUT/summary-$script.txt"
}
record_env() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv \
    > "$LOGS/env.txt" 2>&1
  cat "$D/MANIFEST" >> "$LOGS/env.txt"
  cat "$LOGS/env.txt"
}
show() {
  local f=$LOGS/$1.log
  [[ -f $f ]] || return 0
  echo
  echo "==== $1"
  if [[ -n ${2:-} ]]; then
    grep -E "$2" "$f"
  else
    grep -v "attached device buffers\|note: the client" "$f"
  fi
}
has() { [[ -x $D/bin/$1 ]]; }
mps_start() {
  command -v nvidia-cuda-mps-control > /dev/null || return 1
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/moesh-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/moesh-mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d >> "$LOGS/mps_start.log" 2>&1 && return 0
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  return 1
}
mps_stop() {
  echo quit | nvidia-cuda-mps-control
  cp "$CUDA_MPS_LOG_DIRECTORY/control.log" "$LOGS/mps_control.log" 2>/dev/null
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
gpus=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)
