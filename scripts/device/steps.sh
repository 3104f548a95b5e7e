# Sourced first by the device-side run scripts (set `budget` before): makes
# $OUT (what comes back) and a fresh $LOGS, opens the bundle (unpack.sh), sets
# the loopback-only network variables, and defines:
#   step NAME LIMIT_S CMD...  runs CMD under a time limit (within $budget
#       seconds of the script's start), logs to $LOGS/NAME.log and adds a line
#       to `summary` (rc, seconds, gtest counts, compute-sanitizer's error
#       summary); a failing step prints its telling lines;
#   finish  packs the logs into $OUT/logs.tgz ($OUT brings back at most 8
#       files) and prints the summary;
#   record_env  writes the GPUs and the bundle's manifest to $LOGS/env.txt
#       and prints them.
OUT=${OUT:-/tmp/moesh-out}
LOGS=/tmp/moesh-logs
rm -rf "$LOGS"
mkdir -p "$OUT" "$LOGS"
source scripts/device/unpack.sh || return 1
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
  tar czf "$OUT/logs.tgz" -C "$LOGS" .
  echo
  echo "==== summary"
  printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
}
record_env() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv \
    > "$LOGS/env.txt" 2>&1
  cat "$D/MANIFEST" >> "$LOGS/env.txt"
  cat "$LOGS/env.txt"
}
