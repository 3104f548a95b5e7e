// The router's command line: its options, read from its flags (flags.cc, the
// router binary's only flag definitions besides common/service's groups),
// and rendered back into flags (flag_args.cc) for whoever starts a router.
#ifndef MOESH_ROUTER_FLAGS_H_
#define MOESH_ROUTER_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/backends.h"
#include "common/service/kv_flags.h"
#include "common/service/server_flags.h"
#include "router/routing_policy.h"

namespace moesh {

// The defaults are the flags' defaults.
struct RouterOptions {
  ServerOptions server;  // --listen: the public plane (moesh.v1.Generation, health)
  // --internal_listen: the internal plane, moesh.v1.Cluster (where workers
  // register and heartbeat; cluster mode only), apart from the public port.
  std::string internal_listen = "127.0.0.1:0";
  // --public_tls: TLS on the public port with server.tls's certificate (no
  // client certificate asked for). REQUIRES server.tls.
  bool public_tls = false;
  // --http_listen: the OpenAI-compatible HTTP API (router/http_front.h) on
  // host:port (port 0: any free one); empty: off.
  std::string http_listen;
  int http_max_body_mb = 8;  // larger request bodies are refused (413)
  int http_threads = 128;    // HTTP connections served at once
  // How long an idle HTTP/1.1 connection stays open for its client's next
  // request (it holds one of the http_threads meanwhile); 0: a connection a
  // request.
  int http_keep_alive_ms = 2000;
  // The model's name in the HTTP API (empty: the --model directory's last
  // component); requests may also name the --model path.
  std::string served_model_name;
  // One API key per line; empty: no key needed. With keys, the HTTP API and
  // moesh.v1.Generation need "Authorization: Bearer <key>".
  std::string api_keys_file;
  int heartbeat_interval_ms = 500;
  int heartbeat_timeout_ms = 3000;
  int default_max_new_tokens = 256;
  int max_new_tokens_limit = 4096;
  int max_context_tokens = 0;  // 0: the model's max_position_embeddings
  // Cluster mode: the automatic rebalancing (interval 0: only on
  // Cluster.Rebalance).
  int rebalance_interval_s = 0;
  double rebalance_min_ratio = 1.25;
  int rebalance_slots = 0;
  // Cluster mode: how a request's prefill and decode workers are picked.
  RoutingPolicy routing_policy = RoutingPolicy::kKvAware;
  // Cluster mode: a stream whose decode worker (or the prefill before it)
  // fails mid-request is continued on another prefill/decode pair, at most
  // this many times per request (0: never; the stream fails UNAVAILABLE).
  int max_stream_migrations = 2;
  // Cluster mode: a prompt of at most this many tokens not cached on the
  // decode worker picked for it (by the block hashes it reports) is computed
  // by that decode worker, in chunks mixed into its decode steps, instead of
  // a prefill worker (conditional disaggregation, as Dynamo's
  // max_local_prefill_length): a short prompt then shares the decode step's
  // weight reads instead of costing a pass of its own. 0: every prompt goes
  // to a prefill worker.
  int max_local_prefill_tokens = 0;
  // --colocated: prefill, decode and experts in this process, on `device`
  // (read only with --colocated) with the KV cache and batch of `kv`.
  bool colocated = false;
  KvOptions kv;
  DeviceOptions device;
};

// INVALID_ARGUMENT for a missing --model, bad rebalance settings, an unknown
// --routing_policy, --public_tls
// without the TLS files, or (with
// --colocated) bad device flags.
absl::StatusOr<RouterOptions> RouterOptionsFromFlags();
// The command line that gives moesh_router `o` (flags at their defaults left
// out).
std::vector<std::string> ToArgs(const RouterOptions& o);

}  // namespace moesh

#endif  // MOESH_ROUTER_FLAGS_H_
