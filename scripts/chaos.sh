#!/usr/bin/env bash
# Chaos run: `moesh serve-local` (tiny random V3 model, CPU) under steady load
# while its processes are killed (SIGKILL) and restarted, one kind after
# another (expert worker, decode worker, prefill worker, router). Each
# process restarts with its own command line (the router on the same ports);
# the load is CLIENTS loops of `moesh complete` (16 greedy tokens each).
# Reports, per kill, the requests that failed until the next kill and the
# recovery time (the kill to the first success after its last failure),
# and the totals.
#   usage: scripts/chaos.sh [SECONDS=600] [BUILD_DIR=build]
#   env: CLIENTS (4), EVERY (seconds between kills, 30), DOWN (seconds a
#        killed process stays down, 2), DECODE_WORKERS (2: a killed decode
#        worker's streams continue on the other), ROUTERS (1; with 2 or more
#        every worker joins each router, the clients get every router's
#        address, each client's list rotated so the load spreads, and the
#        kills take router-0 and router-1 in turn), WORK (a work dir;
#        default a temp dir)
set -uo pipefail
cd "$(dirname "$0")/.."
DURATION=${1:-600}
BIN=$(cd "${2:-build}" && pwd)
CLIENTS=${CLIENTS:-4} EVERY=${EVERY:-30} DOWN=${DOWN:-2} DECODE_WORKERS=${DECODE_WORKERS:-2}
ROUTERS=${ROUTERS:-1}
WORK=${WORK:-$(mktemp -d /tmp/moesh-chaos-XXXXXX)}
mkdir -p "$WORK/load"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for f in "$WORK"/restarted.*; do [ -e "$f" ] && kill "$(cat "$f")" 2>/dev/null; done
  wait 2>/dev/null
}
trap cleanup EXIT

"$BIN/moesh" mkmodel --family=v3 --preset=tiny --out="$WORK/model" >/dev/null || exit 1
"$BIN/moesh" serve-local --model="$WORK/model" --port="$PORT" --bin_dir="$BIN" \
  --decode_workers="$DECODE_WORKERS" --routers="$ROUTERS" \
  --work_dir="$WORK/cluster" >"$WORK/serve-local.log" 2>&1 &
pids+=($!)
for _ in $(seq 600); do grep -q "moesh is serving" "$WORK/serve-local.log" && break; sleep 0.2; done
grep -q "moesh is serving" "$WORK/serve-local.log" || { cat "$WORK/serve-local.log"; exit 1; }
now() { date +%s.%N; }
# Every router's public address, as serve-local printed them.
IFS=, read -r -a servers <<<"$(sed -n 's/^moesh is serving on //p' "$WORK/serve-local.log")"

# The load: each line of load/<i> is "<end time> <exit status>".
for i in $(seq "$CLIENTS"); do
  # Client i tries the routers from the i-th on.
  list=$(for j in $(seq 0 $((${#servers[@]} - 1))); do
           echo "${servers[$(((i + j) % ${#servers[@]}))]}"; done | paste -sd,)
  (while true; do
     "$BIN/moesh" complete --server="$list" --prompt_ids=5,17,300 --max_new_tokens=16 \
       --ignore_eos --timeout=30 >/dev/null 2>>"$WORK/load/errors.$i"
     status=$?
     echo "$(now) $status"
   done >>"$WORK/load/$i") &
  pids+=($!)
done

# name -> pid and command line of the process serving now.
pid_of() {  # NAME: the pid of the cluster's process NAME (its log names the binary's ready file)
  local name=$1
  if [ -e "$WORK/restarted.$name" ]; then cat "$WORK/restarted.$name"; return; fi
  pgrep -f -- "--ready_file=$WORK/cluster/$name.ready" | head -1
}
kill_and_restart() {
  local name=$1 pid cmd
  pid=$(pid_of "$name")
  [ -n "$pid" ] || { echo "no process $name" >&2; return 1; }
  mapfile -d '' cmd < /proc/"$pid"/cmdline
  if [[ $name == router* ]]; then  # the same ports, so workers and clients find it again
    local listen internal http kept=()
    listen=$(sed -n 1p "$WORK/cluster/$name.ready")
    internal=$(sed -n 3p "$WORK/cluster/$name.ready")
    http=$(sed -n 4p "$WORK/cluster/$name.ready")
    for a in "${cmd[@]}"; do
      [[ $a == --listen=* || $a == --internal_listen=* || $a == --http_listen=* ]] || kept+=("$a")
    done
    cmd=("${kept[@]}" "--listen=$listen" "--internal_listen=$internal")
    [ -n "$http" ] && cmd+=("--http_listen=$http")
  fi
  kill -9 "$pid"
  sleep "$DOWN"
  "${cmd[@]}" >>"$WORK/cluster/$name.log" 2>&1 &
  echo $! >"$WORK/restarted.$name"
  disown $!
}

t0=$(now)
kills=()
names=(expert-0 decode-0 prefill-0 router expert-1)
[ "$ROUTERS" -gt 1 ] && names=(expert-0 decode-0 prefill-0 router-0 expert-1 router-1)
k=0
sleep "$EVERY"
while python3 -c "import sys; sys.exit(0 if $(now) - $t0 < $DURATION - $EVERY else 1)"; do
  name=${names[$((k % ${#names[@]}))]}
  kills+=("$(now) $name")
  echo "$(date +%T) kill -9 $name, restart after ${DOWN}s"
  kill_and_restart "$name"
  k=$((k + 1))
  sleep "$EVERY"
done
sleep 5
t_end=$(now)
printf '%s\n' "${kills[@]}" >"$WORK/kills"
python3 - "$WORK" "$t0" "$t_end" <<'PY'
import glob, sys
work, t0, t_end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
done = []
for f in glob.glob(f"{work}/load/[0-9]*"):
    for line in open(f):
        p = line.split()
        if len(p) == 2:
            done.append((float(p[0]), int(p[1])))
done.sort()
kills = [(float(l.split()[0]), l.split()[1]) for l in open(f"{work}/kills")]
print(f"{len(done)} requests in {t_end - t0:.0f} s, {sum(1 for _, s in done if s)} failed")
print("kill          failed/requests until the next kill   recovery (kill -> first success after the last failure)")
for i, (t, name) in enumerate(kills):
    nxt = kills[i + 1][0] if i + 1 < len(kills) else t_end
    window = [s for e, s in done if t <= e < nxt]
    fails = [e for e, s in done if t <= e < nxt and s]
    failed = len(fails)
    # Recovered: the first success after the window's last failure.
    first_ok = next((e for e, s in done if fails and e > fails[-1] and s == 0), None)
    rec = "no failure" if failed == 0 else (f"{first_ok - t:.1f} s" if first_ok else "not recovered")
    print(f"{name:12s}  {failed:4d}/{len(window):<4d}                              {rec}")
before = [s for e, s in done if e < kills[0][0]] if kills else [s for _, s in done]
print(f"before the first kill: {sum(1 for s in before if s)} failed of {len(before)}")
PY
