#!/usr/bin/env bash
# Interleaved A/B of cuda_model_bench decode steps on the device: every
# variant once a round, ROUNDS rounds, the same bench arguments, then one
# table: a row per batch, a column per variant with each round's step (ms)
# and the mean of the rounds against the first variant's. A variant is
# NAME:ENV:FLAGS — ENV space-separated assignments for an environment switch
# (e.g. MOESH_EXP_GG_PREFETCH=65536), FLAGS extra bench flags (e.g.
# --shared-stream on); either may be empty. A variant whose name ends in
# @old runs .device/old/cuda_model_bench (a baseline binary unpacked there)
# instead of the bundle's.
#
# Usage (sourced helpers: unpack.sh; run from the repository root):
#   tools/device/ab.sh [--tag ab] [--rounds 2] [--budget 240] [--timeout 45] \
#     --args "BENCH ARGS" VARIANT [VARIANT...]
# e.g.
#   tools/device/ab.sh --args "--load-format dummy --shape v2-lite --batch 1,8 --context 2048 \
#     --prefill-seqs 0 --steps 10 --warmup 3 --quantization fp8" off:: \
#     "stream::--shared-stream on" "prefetch:MOESH_EXP_GG_PREFETCH=65536:"
# Logs land in $OUT/TAG/NAME.ROUND.log; the table is printed and written to
# $OUT/TAG.txt. A round is skipped once --budget seconds are spent.
set -uo pipefail
tag=ab rounds=2 budget=240 timeout=45 args=""
variants=()
while (($# > 0)); do
  case $1 in
    --tag) tag=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --args) args=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set /p' "$0" | sed 's/^# \{0,1\}//' | head -n -1; exit 0 ;;
    *) variants+=("$1"); shift ;;
  esac
done
if ((${#variants[@]} == 0)) || [[ -z $args ]]; then
  echo "ab.sh: need --args and at least one NAME:ENV:FLAGS variant (--help)" >&2
  exit 2
fi
OUT=${OUT:-/tmp/moesh-out}
logs=$OUT/$tag
mkdir -p "$logs"
[[ -d .device/bin ]] || source tools/device/unpack.sh || exit 1
start=$SECONDS
names=()
for ((r = 1; r <= rounds; ++r)); do
  if ((SECONDS - start >= budget)); then
    echo "ab.sh: round $r not run (budget ${budget}s spent)" >&2
    break
  fi
  for v in "${variants[@]}"; do
    IFS=: read -r name env flags <<< "$v"
    ((r == 1)) && names+=("$name")
    bin=.device/bin/cuda_model_bench
    [[ $name == *@old ]] && bin=.device/old/cuda_model_bench
    # shellcheck disable=SC2086  # ENV and the arguments split on purpose
    env $env timeout "$timeout" "$bin" $args $flags > "$logs/$name.$r.log" 2>&1
    echo "rc=$?" >> "$logs/$name.$r.log"
  done
done
# batch -> variant -> the rounds' step ms, from the bench's "| batch | step ms |" table
# (its plain batch rows; the labelled ones, sampled or at forced tiles, are left out).
for name in "${names[@]}"; do
  for f in "$logs/$name".*.log; do
    [[ -e $f ]] || continue
    # The decode table only: from its header to the blank line after it.
    awk -v n="$name" -F'|' '/^\| batch \| step ms \|/ { on = 1; next } /^$/ { on = 0 }
      on && /^\| [0-9]+ \| [0-9.]+ \|/ { gsub(/ /, "", $2); gsub(/ /, "", $3); print $2, n, $3 }' "$f"
  done
done | awk -v order="${names[*]}" '
  { key = $1 SUBSEP $2; vals[key] = (cnt[key] > 0 ? vals[key] " / " : "") $3; sum[key] += $3;
    cnt[key]++; if (!($1 in seen)) { seen[$1] = 1; batches[nb++] = $1 } }
  END {
    nv = split(order, v, " ");
    printf "| batch |"; for (i = 1; i <= nv; ++i) printf " %s |", v[i]; printf "\n|---|";
    for (i = 1; i <= nv; ++i) printf "---|"; printf "\n";
    for (b = 0; b < nb; ++b) {
      printf "| %s |", batches[b];
      base = batches[b] SUBSEP v[1];
      for (i = 1; i <= nv; ++i) {
        k = batches[b] SUBSEP v[i];
        if (!(k in vals)) { printf " — |"; continue }
        printf " %s", vals[k];
        if (i > 1 && (base in cnt)) printf " (%.3f×)", (sum[k] / cnt[k]) / (sum[base] / cnt[base]);
        printf " |";
      }
      printf "\n";
    }
  }' | tee "$OUT/$tag.txt"
