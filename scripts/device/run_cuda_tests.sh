#!/usr/bin/env bash
# On the device machine, from the repository root, after scripts/device/bundle.sh
# here and `run` with carry [".device"]: every CUDA test binary, compute-sanitizer
# memcheck on the op tests and the SASS of the MLA kernel (bench before
# memcheck, so its numbers come back even if the sanitizer runs long).
# Logs land in $OUT; the last lines printed are the summary and the bench table.
set -uo pipefail
budget=${MOESH_DEVICE_BUDGET_S:-540}  # stay inside run's 600 s
source scripts/device/steps.sh || exit 1
export MOESH_REQUIRE_CUDA=1  # a test that finds no GPU here fails rather than skips

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  cat $D/MANIFEST
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  for b in $D/bin/*; do ldd "$b" | grep -E 'cuda|cublas|not found'; done
} > "$LOGS/env.txt" 2>&1
cat "$LOGS/env.txt"


for t in cuda_device_test cuda_ops_test cuda_routing_test cuda_mla_decode_test; do
  step "$t" 90 $D/bin/$t
done
step kernel_bench 200 $D/bin/kernel_bench "$@"
for t in cuda_ops_test cuda_routing_test cuda_mla_decode_test; do
  step "memcheck_$t" 150 compute-sanitizer --tool memcheck --error-exitcode 99 $D/bin/$t
done
# Shared-memory races and barrier misuse, on cases small enough for the tools.
small='--gtest_filter=*PaddedHeads*:*RaggedOneSplit*'
step racecheck_mla 150 compute-sanitizer --tool racecheck --error-exitcode 99 $D/bin/cuda_mla_decode_test "$small"
step synccheck_mla 100 compute-sanitizer --tool synccheck --error-exitcode 99 $D/bin/cuda_mla_decode_test "$small"
step racecheck_routing 100 compute-sanitizer --tool racecheck --error-exitcode 99 $D/bin/cuda_routing_test
if command -v cuobjdump > /dev/null; then
  cuobjdump --dump-sass $D/bin/kernel_bench > "$LOGS/sass_all.txt" 2>&1
  awk '/Function : .*MlaDecodeKernel/ {on=1} /Function : / && !/MlaDecodeKernel/ {on=0} on' "$LOGS/sass_all.txt" \
    > "$LOGS/sass_mla.txt"
  echo "MLA kernel SASS: $(grep -c HMMA "$LOGS/sass_mla.txt") HMMA, $(grep -c LDSM "$LOGS/sass_mla.txt") LDSM," \
       "$(grep -c -E 'UBLKCP|UTMALDG|BULK' "$LOGS/sass_mla.txt") bulk-copy, $(grep -c -E 'LDL|STL' "$LOGS/sass_mla.txt") local-mem" \
       "in $(grep -c "Function : " "$LOGS/sass_mla.txt") instantiations" | tee "$LOGS/sass_summary.txt"
  rm -f "$LOGS/sass_all.txt"
fi

cp "$LOGS/kernel_bench.log" "$OUT/" 2>/dev/null
finish
echo
echo "==== kernel_bench"
cat "$LOGS/kernel_bench.log"
