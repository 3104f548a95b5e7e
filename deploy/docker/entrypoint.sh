#!/bin/sh
# moesh-entrypoint: the image's entrypoint. Runs one moesh service, picked by
# the first argument; the rest are its flags (Abseil flags; --helpfull lists them).
#
#   router   moesh_router            the public Generation API, cluster membership
#   prefill  moesh_prefill_worker    prompts, KV handoff to decode workers
#   decode   moesh_decode_worker     continuous batching over the paged KV cache
#   expert   moesh_expert_worker     a shard of the routed experts
#   moesh    moesh                   the command line: mkmodel, generate, complete, serve-local, bench
#
# e.g. docker run moesh router --model=/models/m --listen=0.0.0.0:50051 --metrics_listen=0.0.0.0:9400
# MOESH_BIN_DIR overrides where the binaries are (default: this script's directory).
set -eu
bin=${MOESH_BIN_DIR:-$(dirname "$0")}
usage() {
  sed -n '2,11s/^# \{0,1\}//p' "$0" >&2
}
if [ $# -eq 0 ]; then
  usage
  exit 64
fi
service=$1
shift
case "$service" in
  router | moesh_router) exec "$bin/moesh_router" "$@" ;;
  prefill | moesh_prefill_worker) exec "$bin/moesh_prefill_worker" "$@" ;;
  decode | moesh_decode_worker) exec "$bin/moesh_decode_worker" "$@" ;;
  expert | moesh_expert_worker) exec "$bin/moesh_expert_worker" "$@" ;;
  moesh) exec "$bin/moesh" "$@" ;;
  help | -h | --help)
    usage
    exit 0
    ;;
  *)
    echo "moesh-entrypoint: unknown service '$service'" >&2
    usage
    exit 64
    ;;
esac
