#!/usr/bin/env bash
# On a device machine, from the repository root, after
#   scripts/device/bundle.sh build-cuda cuda_model_bench moesh
# here and `run` with carry [".device"]: GPU time per kernel of one eager
# decode step of cuda_model_bench (--profile-step) on a dummy model of a real
# preset's shapes, under `ncu --metrics gpu__time_duration.sum`, summed by
# scripts/device/ncu_by_kernel.py (a markdown table, largest share first).
#
# usage: scripts/device/profile_kernels.sh FAMILY LAYERS BATCH CONTEXT
#   e.g. scripts/device/profile_kernels.sh v3.2 4 128 4096
set -uo pipefail
family=${1:?family} layers=${2:?layers} batch=${3:?batch} context=${4:?context}
source scripts/device/unpack.sh >/dev/null 2>&1 || exit 1
dir=$(mktemp -d)
"$D/bin/moesh" mkmodel --family "$family" --preset real --layers "$layers" --config-only --out "$dir" >/dev/null
csv=${OUT:-/tmp}/ncu_${family}_b${batch}.csv
ncu --csv --profile-from-start off --metrics gpu__time_duration.sum "$D/bin/cuda_model_bench" --model "$dir" \
  --load-format dummy --batch "$batch" --context "$context" --no-graphs --profile-step \
  --gpu-memory-utilization 0.95 > "$csv" 2>/dev/null
python3 scripts/device/ncu_by_kernel.py "$csv" "one decode step, $family, $layers layers, batch $batch"
