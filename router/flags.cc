#include "router/flags.h"

#include "absl/flags/flag.h"
#include "base/status.h"
#include "common/service/device_flags.h"

ABSL_FLAG(bool, colocated, moesh::RouterOptions().colocated,
          "Serve from prefill, decode and experts in this process (no workers register).");
ABSL_FLAG(std::string, internal_listen, moesh::RouterOptions().internal_listen,
          "host:port of the internal plane: moesh.v1.Cluster, where workers register and "
          "heartbeat (and grpc.health.v1); keep it inside the cluster network. The public "
          "--listen port serves moesh.v1.Generation and health only (port 0: any free one; "
          "unused with --colocated).");
ABSL_FLAG(bool, public_tls, moesh::RouterOptions().public_tls,
          "Serve the public --listen port over TLS with --tls_cert and --tls_key (clients check "
          "it against --tls_ca; no client certificate is asked for).");
ABSL_FLAG(std::string, http_listen, moesh::RouterOptions().http_listen,
          "host:port of the OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, "
          "/v1/models, /health; port 0: any free one); empty: no HTTP API.");
ABSL_FLAG(int, http_max_body_mb, moesh::RouterOptions().http_max_body_mb,
          "The HTTP API refuses request bodies larger than this (413).");
ABSL_FLAG(int, http_threads, moesh::RouterOptions().http_threads,
          "HTTP connections served at once (a streaming request holds one).");
ABSL_FLAG(int, http_keep_alive_ms, moesh::RouterOptions().http_keep_alive_ms,
          "How long an idle HTTP/1.1 connection stays open for its client's next request (it "
          "holds one of --http_threads meanwhile); 0: every response closes its connection.");
ABSL_FLAG(std::string, served_model_name, moesh::RouterOptions().served_model_name,
          "The model's name in the HTTP API (default: the --model directory's last component).");
ABSL_FLAG(std::string, api_keys_file, moesh::RouterOptions().api_keys_file,
          "A file of API keys, one per line: the HTTP API and moesh.v1.Generation then need "
          "'Authorization: Bearer <key>' (gRPC metadata 'authorization'). Empty: no key needed.");
ABSL_FLAG(int, heartbeat_interval_ms, moesh::RouterOptions().heartbeat_interval_ms,
          "How often workers heartbeat.");
ABSL_FLAG(int, heartbeat_timeout_ms, moesh::RouterOptions().heartbeat_timeout_ms,
          "Drop a worker silent for this long.");
ABSL_FLAG(int, default_max_new_tokens, moesh::RouterOptions().default_max_new_tokens,
          "max_new_tokens when a request does not set it.");
ABSL_FLAG(int, max_new_tokens_limit, moesh::RouterOptions().max_new_tokens_limit,
          "Largest max_new_tokens a request may ask for.");
ABSL_FLAG(int, max_context_tokens, moesh::RouterOptions().max_context_tokens,
          "Prompt + output limit (0: the model's max_position_embeddings).");
ABSL_FLAG(int, rebalance_interval_s, moesh::RouterOptions().rebalance_interval_s,
          "Check the expert workers' balance this often and rebalance when skewed (0: only on "
          "Cluster.Rebalance).");
ABSL_FLAG(double, rebalance_min_ratio, moesh::RouterOptions().rebalance_min_ratio,
          "Rebalance automatically when the balance ratio exceeds this.");
ABSL_FLAG(std::string, routing_policy,
          std::string(moesh::RoutingPolicyName(moesh::RouterOptions().routing_policy)),
          "Cluster mode: how each request's prefill and decode workers are picked. kv_aware: "
          "the prefill worker with the least work before the prompt's first token (its queued "
          "prompt tokens plus the prompt tokens its prefix cache lacks, from the block hashes "
          "workers report), the decode worker with the longest cached prefix among those within "
          "0.1 of the least KV usage; load: the fewest queued prompt tokens, the least KV usage; "
          "round_robin: the workers in turn.");
ABSL_FLAG(int, max_stream_migrations, moesh::RouterOptions().max_stream_migrations,
          "Cluster mode: continue a stream whose decode worker (or the prefill before it) failed "
          "on another prefill/decode pair, re-prefilling prompt + tokens so far, at most this "
          "many times per request (0: the stream fails UNAVAILABLE).");
ABSL_FLAG(int, max_local_prefill_tokens, moesh::RouterOptions().max_local_prefill_tokens,
          "Cluster mode: a prompt with at most this many tokens not cached on a decode worker is "
          "computed by that decode worker, in chunks mixed into its decode steps "
          "(--max_num_batched_tokens there), instead of a prefill worker (0: every prompt goes "
          "to a prefill worker). Only decode workers that say they compute prompts (this "
          "version's) are asked.");
ABSL_FLAG(int, rebalance_slots, moesh::RouterOptions().rebalance_slots,
          "Experts an expert worker may host after an automatic rebalance (0: as many as the "
          "busiest hosts now).");

namespace moesh {

absl::StatusOr<RouterOptions> RouterOptionsFromFlags() {
  RouterOptions o;
  ASSIGN_OR_RETURN(o.server, ServerOptionsFromFlags());
  o.internal_listen = absl::GetFlag(FLAGS_internal_listen);
  o.public_tls = absl::GetFlag(FLAGS_public_tls);
  if (o.public_tls && !o.server.tls.enabled()) {
    return absl::InvalidArgumentError("--public_tls needs --tls_cert, --tls_key and --tls_ca");
  }
  o.http_listen = absl::GetFlag(FLAGS_http_listen);
  o.http_max_body_mb = absl::GetFlag(FLAGS_http_max_body_mb);
  o.http_threads = absl::GetFlag(FLAGS_http_threads);
  o.http_keep_alive_ms = absl::GetFlag(FLAGS_http_keep_alive_ms);
  if (o.http_max_body_mb < 1 || o.http_threads < 1) {
    return absl::InvalidArgumentError("--http_max_body_mb and --http_threads must be >= 1");
  }
  if (o.http_keep_alive_ms < 0 || o.http_keep_alive_ms > 600000) {
    return absl::InvalidArgumentError("--http_keep_alive_ms must be in [0, 600000]");
  }
  o.served_model_name = absl::GetFlag(FLAGS_served_model_name);
  o.api_keys_file = absl::GetFlag(FLAGS_api_keys_file);
  o.heartbeat_interval_ms = absl::GetFlag(FLAGS_heartbeat_interval_ms);
  o.heartbeat_timeout_ms = absl::GetFlag(FLAGS_heartbeat_timeout_ms);
  o.default_max_new_tokens = absl::GetFlag(FLAGS_default_max_new_tokens);
  o.max_new_tokens_limit = absl::GetFlag(FLAGS_max_new_tokens_limit);
  o.max_context_tokens = absl::GetFlag(FLAGS_max_context_tokens);
  o.rebalance_interval_s = absl::GetFlag(FLAGS_rebalance_interval_s);
  o.rebalance_min_ratio = absl::GetFlag(FLAGS_rebalance_min_ratio);
  o.rebalance_slots = absl::GetFlag(FLAGS_rebalance_slots);
  ASSIGN_OR_RETURN(o.routing_policy, ParseRoutingPolicy(absl::GetFlag(FLAGS_routing_policy)));
  o.max_stream_migrations = absl::GetFlag(FLAGS_max_stream_migrations);
  if (o.max_stream_migrations < 0) {
    return absl::InvalidArgumentError("--max_stream_migrations must be >= 0");
  }
  o.max_local_prefill_tokens = absl::GetFlag(FLAGS_max_local_prefill_tokens);
  if (o.max_local_prefill_tokens < 0) {
    return absl::InvalidArgumentError("--max_local_prefill_tokens must be >= 0");
  }
  if (o.rebalance_interval_s < 0 || o.rebalance_min_ratio < 1.0 || o.rebalance_slots < 0) {
    return absl::InvalidArgumentError(
        "--rebalance_interval_s and --rebalance_slots must be >= 0, --rebalance_min_ratio >= 1");
  }
  o.colocated = absl::GetFlag(FLAGS_colocated);
  ASSIGN_OR_RETURN(o.kv, KvOptionsFromFlags());
  if (o.colocated) {
    ASSIGN_OR_RETURN(o.device, DeviceOptionsFromFlags());
  }
  return o;
}

}  // namespace moesh
